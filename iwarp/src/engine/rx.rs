//! The receive path: FPDUs out of the TCP stream, DDP/RDMAP checks, and
//! placement into guest memory through the TPT.
//!
//! Every check happens before any octet of a segment is placed, except
//! that a multi-page placement may stop half way if the TPT changes its
//! mind between pages (it cannot: translation runs under one borrow).
//! Nothing is ever written outside a region the TPT approved.
//!
//! [`receive_qp`] is a QP's receive step in the engine's poll: what TCP
//! received goes through [`receive`], and a stop (a TERMINATE received, a
//! protocol error) takes the QP to TERMINATE (Linux siw: siw_qp_rx.c).

use std::collections::VecDeque;

use super::event::{EventKind, ProtocolError};
use super::memory::{
    write_region, AccessError, GuestMemory, MemoryRegions, PlacementError, LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE,
};
use super::qp::{
    enter_terminate, retire_sq, IrqEntry, Qp, QpState, Queues, RefusedRecv, RxSend, RxTagged, Stream, TermMessage,
    READ_REQUEST_COPY,
};
use super::srq::{Srq, SrqWr};
use super::window::Owner;
use super::wr::{Completion, SendOpcode, WcOpcode, WcStatus, WorkQueue};
use super::{EngineConfig, EngineStats, Io, Outputs};
use crate::stream::FpduDeframer;
use crate::toe::{Instant, Transport};
use crate::wire::ddp;
use crate::wire::mpa::{self, RtrKind};
use crate::wire::rdmap::{self, Opcode, Placement, ReadRequestPacket, ReadRequestRepr};
use crate::wire::terminate::{self, layer, TermCode};

/// What the receive path needs besides the QP.
struct RxEnv<'a> {
    /// This QP and its PD: whose accesses the TPT checks.
    pub owner: Owner,
    pub memory: &'a mut dyn GuestMemory,
    pub regions: &'a mut dyn MemoryRegions,
    pub completions: &'a mut VecDeque<Completion>,
    pub stats: &'a mut EngineStats,
    /// The QP's SRQ, if it has one.
    pub srq: Option<&'a mut Srq>,
}

impl RxEnv<'_> {
    fn complete_recv(
        &mut self,
        wr_id: u64,
        status: WcStatus,
        byte_len: u32,
        invalidated_stag: Option<u32>,
        solicited: bool,
        srq_idx: Option<u32>,
    ) {
        self.completions.push_back(Completion {
            qpn: self.owner.qpn,
            queue: WorkQueue::Recv,
            wr_id,
            opcode: WcOpcode::Recv,
            status,
            byte_len,
            invalidated_stag,
            solicited,
            signaled: true,
            srq_idx,
        });
    }
}

/// Why receiving stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RxStop {
    /// The peer sent a TERMINATE.
    Terminated(TermCode),
    /// We found an error; the TERMINATE is in `stream.terminate_out`.
    Failed(ProtocolError),
    /// A Send arrived when a refused receive WQE's turn had come: the
    /// caller fails that WQE (a local error, not the peer's).
    RefusedRecvDue,
}

/// Consumes FPDU-mode bytes from `input` until it is empty or something
/// stops the stream.
fn receive(
    queues: &mut Queues,
    deframer: &mut FpduDeframer,
    stream: &mut Stream,
    env: &mut RxEnv<'_>,
    input: &mut &[u8],
) -> Result<(), RxStop> {
    loop {
        match deframer.next_ulpdu(input) {
            Ok(Some(ulpdu)) => {
                env.stats.fpdus_rx += 1;
                handle_ulpdu(queues, stream, env, ulpdu)?;
            }
            Ok(None) => return Ok(()),
            Err(error) => {
                let error = match error {
                    mpa::Error::Crc { .. } => ProtocolError::Crc,
                    other => ProtocolError::Framing(other),
                };
                return Err(fail(stream, error, None));
            }
        }
    }
}

/// Prepares the TERMINATE for `error` about `offending` and stops RX.
fn fail(stream: &mut Stream, error: ProtocolError, offending: Option<&[u8]>) -> RxStop {
    stream.rx_stopped = true;
    stream.terminate_out = Some(terminate_message(stream.tx_msn[2], error.term_code(), offending));
    RxStop::Failed(error)
}

/// Builds a TERMINATE ULPDU. What it carries follows RFC 5040 §4.8 as siw
/// reads it: nothing for LLP errors, catastrophic errors and version or
/// opcode errors (the header layout is unknown); the offending DDP header
/// (M, D) for other DDP and RDMAP remote operation errors; DDP and RDMAP
/// headers (M, D, R) for RDMAP remote protection errors. The DDP segment
/// length is the offending ULPDU's length.
pub(crate) fn terminate_message(msn: u32, code: TermCode, offending: Option<&[u8]>) -> TermMessage {
    let (layer_value, etype, _) = code.fields();
    let headers_known = !matches!(
        code,
        TermCode::DdpTaggedInvalidVersion
            | TermCode::DdpUntaggedInvalidVersion
            | TermCode::RdmapInvalidVersion
            | TermCode::RdmapUnexpectedOpcode
    );
    let (with_ddp, with_rdmap) = match (layer_value, etype) {
        (layer::DDP, 1 | 2) => (headers_known, false),
        (layer::RDMAP, 1) => (true, true),
        (layer::RDMAP, 2) => (headers_known, false),
        _ => (false, false),
    };
    let mut message = TermMessage { code, ulpdu: [0; 72], len: 0 };
    let header = rdmap::Repr {
        opcode: Opcode::Terminate,
        last: true,
        placement: Placement::Untagged { msn, offset: 0, invalidate_stag: 0 },
    };
    if header.emit(&mut ddp::Packet::new_unchecked(&mut message.ulpdu[..])).is_err() {
        return message;
    }
    let ddp_len = ddp::UNTAGGED_HEADER_LEN;
    let (ddp_header, rdmap_header, segment_len) = match offending.filter(|_| with_ddp) {
        Some(segment) => {
            let packet = ddp::Packet::new_unchecked(segment);
            let ddp_header = segment.get(..packet.header_len());
            let rdmap_header = with_rdmap.then(|| {
                // Only a Read Request has an RDMAP header of its own.
                let is_read_request = !packet.tagged() && packet.ulp_control() & 0x0f == Opcode::RdmaReadRequest as u8;
                let payload = packet.payload();
                if is_read_request {
                    payload.get(..rdmap::READ_REQUEST_LEN).unwrap_or(&[])
                } else {
                    &[][..]
                }
            });
            let len = u16::try_from(segment.len()).ok();
            (ddp_header, rdmap_header.filter(|_| ddp_header.is_some()), len)
        }
        None => (None, None, None),
    };
    let repr = terminate::Repr { code, ddp_segment_length: ddp_header.and(segment_len), ddp_header, rdmap_header };
    let body = message.ulpdu.get_mut(ddp_len..).unwrap_or(&mut []);
    let repr = if repr.buffer_len() <= body.len() { repr } else { terminate::Repr::new(code) };
    if repr.emit(&mut terminate::Packet::new_unchecked(&mut *body)).is_ok() {
        message.len = ddp_len + repr.buffer_len();
    } else if terminate::Repr::new(code).emit(&mut terminate::Packet::new_unchecked(body)).is_ok() {
        message.len = ddp_len + terminate::CONTROL_LEN;
    }
    message
}

fn handle_ulpdu(queues: &mut Queues, stream: &mut Stream, env: &mut RxEnv<'_>, ulpdu: &[u8]) -> Result<(), RxStop> {
    let packet = ddp::Packet::new_unchecked(ulpdu);
    let header = match rdmap::Repr::parse(&packet) {
        Ok(header) => header,
        Err(error) => return Err(fail(stream, ProtocolError::Header(error), Some(ulpdu))),
    };
    let payload = packet.payload();
    if !stream.tx_ready {
        // The responder's first FPDU from the initiator: now we may send.
        stream.tx_ready = true;
        let rtr = stream.rtr_in.take();
        let is_send_rtr = rtr == Some(RtrKind::Send)
            && header.opcode == Opcode::Send
            && header.last
            && payload.is_empty()
            && matches!(header.placement, Placement::Untagged { msn, offset: 0, .. } if msn == stream.rx_msn[0]);
        if is_send_rtr {
            // A zero-length Send as RTR consumes no receive WQE.
            stream.rx_msn[0] = stream.rx_msn[0].wrapping_add(1);
            return Ok(());
        }
    }
    stream.rtr_in = None;
    let result = match header.opcode {
        Opcode::RdmaWrite => write(stream, env, &header, payload),
        Opcode::RdmaReadResponse => read_response(queues, env, &header, payload),
        Opcode::Send | Opcode::SendInvalidate | Opcode::SendSolicited | Opcode::SendSolicitedInvalidate => {
            take_srq_wr(queues, stream, env, &header);
            if queues.rq.is_empty() && queues.rq_refused.is_some() && stream.rx_send.is_none() {
                return Err(RxStop::RefusedRecvDue);
            }
            send(queues, stream, env, &header, payload)
        }
        Opcode::RdmaReadRequest => read_request(queues, stream, env, &header, payload, ulpdu),
        Opcode::Terminate => {
            let term = terminate::Packet::new_unchecked(payload);
            env.stats.terminates_rx += 1;
            stream.rx_stopped = true;
            return Err(RxStop::Terminated(term.code()));
        }
    };
    result.map_err(|error| fail(stream, error, Some(ulpdu)))
}

/// The first segment of a Send for a QP of an SRQ: the QP takes the SRQ's
/// next WR now (iWARP consumes a receive WQE when a message starts), if
/// the segment starts the expected message; otherwise `send` refuses the
/// segment without consuming anything.
fn take_srq_wr(queues: &mut Queues, stream: &Stream, env: &mut RxEnv<'_>, header: &rdmap::Repr) {
    let starts = matches!(header.placement,
        Placement::Untagged { msn, offset: 0, .. } if msn == stream.rx_msn[0]);
    let idle = stream.rx_send.is_none() && queues.rq.is_empty() && queues.rq_refused.is_none();
    let Some(srq) = env.srq.as_deref_mut() else {
        return;
    };
    if !(starts && idle) {
        return;
    }
    match srq.take() {
        None => {}
        Some((index, SrqWr::Posted(wr))) => {
            queues.rq.push_back(wr);
            queues.srq_taken = Some(index);
        }
        Some((index, SrqWr::Refused { wr_id, status })) => {
            queues.rq_refused = Some(RefusedRecv { wr_id, status });
            queues.srq_taken = Some(index);
        }
    }
}

fn placement_error(error: PlacementError, access: fn(AccessError) -> ProtocolError) -> ProtocolError {
    match error {
        PlacementError::Access(error) => access(error),
        PlacementError::Memory(_) => ProtocolError::GuestMemory,
    }
}

fn write(stream: &mut Stream, env: &mut RxEnv<'_>, header: &rdmap::Repr, payload: &[u8]) -> Result<(), ProtocolError> {
    let Placement::Tagged { stag, offset } = header.placement else {
        return Err(ProtocolError::TaggedDiscontinuity { stag_changed: true });
    };
    if let Some(previous) = stream.rx_tagged {
        if previous.stag != stag {
            return Err(ProtocolError::TaggedDiscontinuity { stag_changed: true });
        }
        if previous.next_to != offset {
            return Err(ProtocolError::TaggedDiscontinuity { stag_changed: false });
        }
    }
    let end = offset.checked_add(payload.len() as u64).ok_or(ProtocolError::TaggedOffsetWrap)?;
    // A zero-length RDMA Write (an RTR, or a ULP's) names no buffer: siw
    // does not check its STag either.
    if !payload.is_empty() {
        write_region(&*env.regions, env.memory, stag, env.owner, offset, REMOTE_WRITE, payload)
            .map_err(|error| placement_error(error, ProtocolError::WriteAccess))?;
        env.stats.bytes_placed += payload.len() as u64;
    }
    stream.rx_tagged = (!header.last).then_some(RxTagged { stag, next_to: end });
    Ok(())
}

fn read_response(
    queues: &mut Queues,
    env: &mut RxEnv<'_>,
    header: &rdmap::Repr,
    payload: &[u8],
) -> Result<(), ProtocolError> {
    let Placement::Tagged { stag, offset } = header.placement else {
        return Err(ProtocolError::UnexpectedReadResponse);
    };
    let Some(entry) = queues.orq.front_mut() else {
        return Err(ProtocolError::UnexpectedReadResponse);
    };
    if stag != entry.sink_stag {
        return Err(ProtocolError::ReadResponseMismatch { stag_mismatch: true });
    }
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let received = entry.received;
    let mismatch = ProtocolError::ReadResponseMismatch { stag_mismatch: false };
    if Some(offset) != entry.sink_to.checked_add(u64::from(received)) {
        return Err(mismatch);
    }
    let total = received.checked_add(len).ok_or(mismatch)?;
    if total > entry.len || (header.last && total != entry.len) {
        return Err(mismatch);
    }
    let seq = entry.seq;
    if !payload.is_empty() {
        let placed = write_region(&*env.regions, env.memory, stag, env.owner, offset, LOCAL_WRITE, payload);
        if let Err(error) = placed {
            if let Some(sq) = seq.and_then(|seq| queues.sq_entry_mut(seq)) {
                let status = match error {
                    PlacementError::Access(_) => WcStatus::LocProtErr,
                    PlacementError::Memory(_) => WcStatus::GeneralErr,
                };
                sq.result = Some((status, received));
            }
            return Err(placement_error(error, ProtocolError::ReadSinkAccess));
        }
        env.stats.bytes_placed += payload.len() as u64;
    }
    entry.received = total;
    if header.last {
        let done = queues.orq.pop_front();
        if let (Some(done), Some(seq)) = (done, seq) {
            if let Some(sq) = queues.sq_entry_mut(seq) {
                if sq.wr.opcode == SendOpcode::ReadInvalidate {
                    // Checked before the READ went out; only a region
                    // deregistered meanwhile fails here.
                    let invalidated = env.regions.local_invalidate(sq.wr.invalidate_stag, env.owner.pdn);
                    if let Err(error) = invalidated {
                        sq.result = Some((WcStatus::LocProtErr, done.len));
                        return Err(ProtocolError::ReadSinkAccess(error));
                    }
                }
                sq.result = Some((WcStatus::Success, done.len));
            }
        }
    }
    Ok(())
}

fn send(
    queues: &mut Queues,
    stream: &mut Stream,
    env: &mut RxEnv<'_>,
    header: &rdmap::Repr,
    payload: &[u8],
) -> Result<(), ProtocolError> {
    let Placement::Untagged { msn, offset, invalidate_stag } = header.placement else {
        return Err(ProtocolError::NoRecvWqe);
    };
    let expected = stream.rx_msn[0];
    if msn != expected {
        return Err(ProtocolError::MsnGap { queue: rdmap::queue::SEND, expected, got: msn });
    }
    let mut current = match stream.rx_send {
        Some(current) => {
            if offset != current.placed {
                return Err(ProtocolError::MoMismatch { expected: current.placed, got: offset });
            }
            current
        }
        None => {
            if offset != 0 {
                return Err(ProtocolError::MoMismatch { expected: 0, got: offset });
            }
            let wqe = queues.rq.front().ok_or(ProtocolError::NoRecvWqe)?;
            RxSend { opcode: header.opcode, placed: 0, capacity: wqe.sges.total_len(), invalidate_stag }
        }
    };
    let Some(wqe) = queues.rq.front().copied() else {
        return Err(ProtocolError::NoRecvWqe);
    };
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let fits = current.placed.checked_add(len).is_some_and(|end| u64::from(end) <= current.capacity);
    if !fits {
        queues.rq.pop_front();
        stream.rx_send = None;
        let srq_idx = queues.srq_taken.take();
        env.complete_recv(wqe.wr_id, WcStatus::LocLenErr, current.placed, None, false, srq_idx);
        return Err(ProtocolError::MessageTooLong);
    }
    // Scatter the payload over the SGEs, starting at message offset `placed`.
    let mut skip = u64::from(current.placed);
    let mut rest = payload;
    for sge in wqe.sges.as_slice() {
        if rest.is_empty() {
            break;
        }
        let sge_len = u64::from(sge.length);
        if skip >= sge_len {
            skip -= sge_len;
            continue;
        }
        let room = usize::try_from(sge_len - skip).unwrap_or(usize::MAX);
        let (piece, tail) = rest.split_at(room.min(rest.len()));
        let placed = write_region(
            &*env.regions,
            env.memory,
            sge.lkey,
            env.owner,
            sge.addr.wrapping_add(skip),
            LOCAL_WRITE,
            piece,
        );
        if let Err(error) = placed {
            queues.rq.pop_front();
            stream.rx_send = None;
            let status = match error {
                PlacementError::Access(_) => WcStatus::LocProtErr,
                PlacementError::Memory(_) => WcStatus::GeneralErr,
            };
            let srq_idx = queues.srq_taken.take();
            env.complete_recv(wqe.wr_id, status, current.placed, None, false, srq_idx);
            return Err(placement_error(error, ProtocolError::RecvBufferAccess));
        }
        skip = 0;
        rest = tail;
    }
    current.placed += len;
    env.stats.bytes_placed += u64::from(len);
    if !header.last {
        stream.rx_send = Some(current);
        return Ok(());
    }
    stream.rx_send = None;
    stream.rx_msn[0] = expected.wrapping_add(1);
    queues.rq.pop_front();
    let srq_idx = queues.srq_taken.take();
    let solicited = current.opcode.solicited_event();
    if current.opcode.carries_invalidate_stag() {
        let stag = current.invalidate_stag;
        if let Err(error) = env.regions.invalidate(stag, env.owner.pdn) {
            env.complete_recv(wqe.wr_id, WcStatus::RemInvReqErr, current.placed, None, solicited, srq_idx);
            return Err(ProtocolError::CannotInvalidate(error));
        }
        env.complete_recv(wqe.wr_id, WcStatus::Success, current.placed, Some(stag), solicited, srq_idx);
    } else {
        env.complete_recv(wqe.wr_id, WcStatus::Success, current.placed, None, solicited, srq_idx);
    }
    Ok(())
}

fn read_request(
    queues: &mut Queues,
    stream: &mut Stream,
    env: &mut RxEnv<'_>,
    header: &rdmap::Repr,
    payload: &[u8],
    ulpdu: &[u8],
) -> Result<(), ProtocolError> {
    let Placement::Untagged { msn, offset, .. } = header.placement else {
        return Err(ProtocolError::ReadRequestLength(payload.len()));
    };
    let expected = stream.rx_msn[1];
    if msn != expected {
        return Err(ProtocolError::MsnGap { queue: rdmap::queue::READ_REQUEST, expected, got: msn });
    }
    if offset != 0 {
        return Err(ProtocolError::MoMismatch { expected: 0, got: offset });
    }
    if payload.len() != rdmap::READ_REQUEST_LEN || !header.last {
        return Err(ProtocolError::ReadRequestLength(payload.len()));
    }
    let request = ReadRequestRepr::parse(&ReadRequestPacket::new_unchecked(payload))
        .map_err(|_| ProtocolError::ReadRequestLength(payload.len()))?;
    stream.rx_msn[1] = expected.wrapping_add(1);
    let ird = stream.negotiated.ird;
    if queues.irq.len() >= usize::from(ird) {
        return Err(ProtocolError::ReadBeyondIrd { ird });
    }
    if request.size > 0 {
        request.source_offset.checked_add(u64::from(request.size)).ok_or(ProtocolError::ReadSourceWrap)?;
        env.regions
            .translate(
                request.source_stag,
                env.owner,
                request.source_offset,
                u64::from(request.size),
                REMOTE_READ,
                &mut |_, _| {},
            )
            .map_err(ProtocolError::ReadSourceAccess)?;
    }
    let mut copy = [0u8; READ_REQUEST_COPY];
    let kept = ulpdu.len().min(READ_REQUEST_COPY);
    if let (Some(target), Some(source)) = (copy.get_mut(..kept), ulpdu.get(..kept)) {
        target.copy_from_slice(source);
    }
    queues.irq.push_back(IrqEntry {
        sink_stag: request.sink_stag,
        sink_to: request.sink_offset,
        source_stag: request.source_stag,
        source_to: request.source_offset,
        len: request.size,
        sent: 0,
        request: copy,
        request_len: u32::try_from(kept).unwrap_or(0),
    });
    env.stats.read_requests_rx += 1;
    Ok(())
}

/// Reads the FPDUs TCP received.
pub(super) fn receive_qp<T: Transport>(
    qp: &mut Qp,
    srq: Option<&mut Srq>,
    toe: &mut T,
    out: &mut Outputs,
    io: &mut Io<'_>,
    now: Instant,
    config: &EngineConfig,
) {
    let Qp { qpn, config: qp_config, state, queues, conn, .. } = qp;
    let Some(conn) = conn.as_mut() else { return };
    let sock = conn.sock;
    let (Some(stream), Some(deframer)) = (conn.stream.as_mut(), conn.deframer.as_mut()) else {
        return;
    };
    if stream.rx_stopped || !matches!(state, QpState::Rts | QpState::Closing) {
        // Drain and drop: nothing after an error or a TERMINATE counts.
        let _ = toe.recv(sock, &mut |data| data.len());
        return;
    }
    let mut env = RxEnv {
        owner: Owner { pdn: qp_config.pdn, qpn: *qpn },
        memory: &mut *io.memory,
        regions: &mut *io.regions,
        completions: &mut out.completions,
        stats: &mut out.stats,
        srq,
    };
    let mut stop = None;
    let _ = toe.recv(sock, &mut |data| {
        if stop.is_none() {
            let mut input = data;
            if let Err(reason) = receive(queues, deframer, stream, &mut env, &mut input) {
                stop = Some(reason);
            }
        }
        data.len()
    });
    retire_sq(qp, out);
    match stop {
        None => {}
        Some(RxStop::Terminated(code)) => {
            let kind = EventKind::TerminateReceived { code, class: code.etype_class() };
            enter_terminate(qp, toe, out, now, config.terminate_linger, kind);
        }
        // Failed right after `receive`, in `service_qp`.
        Some(RxStop::RefusedRecvDue) => {}
        Some(RxStop::Failed(error)) => {
            out.stats.protocol_errors += 1;
            let kind = EventKind::LocalError { error, sent: error.term_code() };
            enter_terminate(qp, toe, out, now, config.terminate_linger, kind);
        }
    }
}
