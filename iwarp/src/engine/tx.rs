//! The transmit path: SQ work requests and inbound READs become FPDUs,
//! written straight into the TCP send buffer.
//!
//! Each FPDU is built in place in the contiguous free part of the TOE's
//! send ring ([`Transport::send_with`]): the DDP/RDMAP header, then the
//! payload read from guest memory through the TPT, then
//! [`seal_fpdu`](crate::stream::seal_fpdu) adds length, pad and CRC. Only
//! when the ring wraps under the FPDU is it built in a per-connection
//! scratch buffer and copied. FPDUs are never split: the stream is at an
//! FPDU boundary whenever the engine is not inside `transmit`, so a
//! TERMINATE can always follow.
//!
//! [`transmit_qp`] is a QP's transmit step in the engine's poll: it runs
//! [`transmit`] in the states that send, retires what completed, and
//! turns a failed WQE or a protocol error into TERMINATE (Linux siw:
//! siw_qp_tx.c).

use super::event::{EventKind, ProtocolError};
use super::memory::{read_region, GuestMemory, MemoryRegions, PlacementError, LOCAL_READ, LOCAL_WRITE, REMOTE_READ};
use super::qp::{enter_terminate, retire_sq, OrqEntry, Qp, QpState, Queues, Stream, TermMessage, TxCurrent};
use super::rx::terminate_message;
use super::window::Owner;
use super::wr::{SendOpcode, SendWr, WcStatus, MAX_MESSAGE};
use super::{EngineConfig, EngineStats, Io, Outputs};
use crate::stream::{seal_fpdu, ULPDU_OFFSET};
use crate::toe::{Instant, SocketId, Transport};
use crate::wire::ddp::{self, TAGGED_HEADER_LEN, UNTAGGED_HEADER_LEN};
use crate::wire::mpa::{fpdu_len, RtrKind};
use crate::wire::rdmap::{self, Opcode, Placement, ReadRequestPacket, ReadRequestRepr};
use crate::wire::terminate::TermCode;

struct TxEnv<'a> {
    pub owner: Owner,
    pub memory: &'a dyn GuestMemory,
    /// Mutable for the SQ's own REG_MR, LOCAL_INV and BIND_MW.
    pub regions: &'a mut dyn MemoryRegions,
    pub stats: &'a mut EngineStats,
}

/// Why transmission stopped short of "nothing left to send".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxStop {
    /// A bad local WQE: complete it with `status`, then QP → ERROR.
    WqeError { seq: u64, wr_id: u64, status: WcStatus },
    /// A protocol error (a READ source gone bad); the TERMINATE is queued.
    Protocol(ProtocolError),
}

/// What a call achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxProgress {
    /// Sent what could be sent.
    Idle,
    /// The queued TERMINATE went out: close the connection.
    TerminateSent,
}

enum Built {
    Sent,
    NoRoom,
}

/// Writes one FPDU of `total` octets, built by `build` (which must write
/// the whole FPDU, header to CRC), into the send buffer.
fn put_fpdu<T: Transport>(
    toe: &mut T,
    sock: SocketId,
    scratch: &mut Vec<u8>,
    total: usize,
    build: &mut dyn FnMut(&mut [u8]) -> Result<(), PlacementError>,
) -> Result<Built, PlacementError> {
    if toe.send_space(sock) < total {
        return Ok(Built::NoRoom);
    }
    let mut fault = None;
    let mut done = false;
    let _ = toe.send_with(sock, &mut |buffer| {
        let Some(target) = buffer.get_mut(..total) else {
            return 0;
        };
        match build(target) {
            Ok(()) => {
                done = true;
                total
            }
            Err(error) => {
                fault = Some(error);
                0
            }
        }
    });
    if let Some(error) = fault {
        return Err(error);
    }
    if done {
        return Ok(Built::Sent);
    }
    // The ring wraps under this FPDU: build it aside and copy it in.
    if scratch.len() < total {
        scratch.resize(total, 0);
    }
    let Some(target) = scratch.get_mut(..total) else {
        return Ok(Built::NoRoom);
    };
    build(target)?;
    match toe.send_slice(sock, target) {
        Ok(written) if written == total => Ok(Built::Sent),
        // Not reachable: the space was checked. A partial FPDU would
        // corrupt the stream, so report it as a local failure.
        _ => Err(PlacementError::Memory(super::memory::MemoryError { addr: 0, len: total })),
    }
}

/// Seals an FPDU whose ULPDU is `ulpdu_len` octets, optionally corrupting its CRC.
fn seal(fpdu: &mut [u8], ulpdu_len: usize, crc: bool, corrupt: bool) {
    let Ok(len) = u16::try_from(ulpdu_len) else {
        return;
    };
    if seal_fpdu(fpdu, len, crc).is_ok() && corrupt {
        if let Some(last) = fpdu.last_mut() {
            *last ^= 0x5a;
        }
    }
}

/// Copies `out.len()` octets of `wr`'s data at message offset `offset`.
fn gather(
    wr: &SendWr,
    offset: u64,
    out: &mut [u8],
    owner: Owner,
    memory: &dyn GuestMemory,
    regions: &dyn MemoryRegions,
) -> Result<(), PlacementError> {
    if let Some(inline) = &wr.inline {
        let data = inline.as_slice();
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        if let Some(source) = start.checked_add(out.len()).and_then(|end| data.get(start..end)) {
            out.copy_from_slice(source);
        }
        return Ok(());
    }
    let mut skip = offset;
    let mut rest = out;
    for sge in wr.sges.as_slice() {
        if rest.is_empty() {
            break;
        }
        let len = u64::from(sge.length);
        if skip >= len {
            skip -= len;
            continue;
        }
        let room = usize::try_from(len - skip).unwrap_or(usize::MAX);
        let (piece, tail) = rest.split_at_mut(room.min(rest.len()));
        read_region(regions, memory, sge.lkey, owner, sge.addr.wrapping_add(skip), LOCAL_READ, piece)?;
        skip = 0;
        rest = tail;
    }
    Ok(())
}

/// Checks a WQE before its first octet goes out.
fn validate(wr: &SendWr, owner: Owner, regions: &dyn MemoryRegions, ord: u16) -> Result<(), WcStatus> {
    let opcode = wr.opcode;
    if wr.inline.is_some() && !(opcode.is_send() || opcode == SendOpcode::Write) {
        return Err(WcStatus::LocQpOpErr);
    }
    if opcode.is_read() && (wr.sges.len() > 1 || ord == 0) {
        return Err(WcStatus::LocQpOpErr);
    }
    // What a READ_INV will invalidate must be ours to invalidate: found
    // now, not after the data came.
    if opcode == SendOpcode::ReadInvalidate && regions.invalidatable(wr.invalidate_stag, owner.pdn).is_err() {
        return Err(WcStatus::LocQpOpErr);
    }
    if wr.length() > MAX_MESSAGE {
        return Err(WcStatus::LocLenErr);
    }
    if wr.inline.is_none() {
        let access = if opcode.is_read() { LOCAL_WRITE } else { LOCAL_READ };
        for sge in wr.sges.as_slice().iter().filter(|sge| sge.length > 0) {
            regions
                .translate(sge.lkey, owner, sge.addr, u64::from(sge.length), access, &mut |_, _| {})
                .map_err(|_| WcStatus::LocProtErr)?;
        }
    }
    Ok(())
}

fn rdmap_opcode(opcode: SendOpcode) -> Opcode {
    match opcode {
        SendOpcode::Send => Opcode::Send,
        SendOpcode::SendInvalidate => Opcode::SendInvalidate,
        SendOpcode::SendSolicited => Opcode::SendSolicited,
        SendOpcode::SendSolicitedInvalidate => Opcode::SendSolicitedInvalidate,
        SendOpcode::Write => Opcode::RdmaWrite,
        // Local operations never reach the wire (`local_operation`).
        SendOpcode::Read
        | SendOpcode::ReadInvalidate
        | SendOpcode::RegMr
        | SendOpcode::LocalInv
        | SendOpcode::BindMw => Opcode::RdmaReadRequest,
    }
}

/// Executes a REG_MR, LOCAL_INV or BIND_MW at its turn in the SQ (after every
/// earlier WQE went out, so a later SEND advertising the STag cannot
/// overtake it; with FENCE also after every earlier READ completed).
/// Refusals are local errors: LOC_QP_OP_ERR, as siw and rxe report them
/// (MW_BIND_ERR for a bind, as the verbs say).
fn local_operation(wr: &SendWr, env: &mut TxEnv<'_>) -> Result<(), WcStatus> {
    match wr.opcode {
        SendOpcode::RegMr => {
            env.regions.fast_register(env.owner.pdn, &wr.fast_reg, env.memory).map_err(|_| WcStatus::LocQpOpErr)
        }
        SendOpcode::LocalInv => {
            env.regions.local_invalidate(wr.invalidate_stag, env.owner.pdn).map_err(|_| WcStatus::LocQpOpErr)
        }
        SendOpcode::BindMw => env.regions.bind_window(env.owner, &wr.bind).map_err(|_| WcStatus::MwBindErr),
        _ => Err(WcStatus::LocQpOpErr),
    }
}

/// Sends what can be sent: a queued TERMINATE first (and nothing after
/// it), the RTR message, then read responses and SQ messages, one whole
/// message at a time. `allow_sq`: start new SQ work (RTS only).
fn transmit<T: Transport>(
    toe: &mut T,
    sock: SocketId,
    queues: &mut Queues,
    stream: &mut Stream,
    env: &mut TxEnv<'_>,
    allow_sq: bool,
) -> Result<TxProgress, TxStop> {
    let crc = stream.negotiated.crc;
    if let Some(term) = stream.terminate_out {
        return send_terminate(toe, sock, stream, env, term);
    }
    if !stream.tx_ready {
        return Ok(TxProgress::Idle);
    }
    loop {
        match stream.tx_current {
            TxCurrent::Idle => {
                if let Some(kind) = stream.rtr_out {
                    if !send_rtr(toe, sock, queues, stream, env, kind) {
                        return Ok(TxProgress::Idle);
                    }
                    stream.rtr_out = None;
                    continue;
                }
                let sq_ready = allow_sq && next_sq_ready(queues, stream);
                let serve_sq_first = sq_ready && stream.prefer_sq;
                if !queues.irq.is_empty() && !serve_sq_first {
                    stream.tx_current = TxCurrent::ReadResponse;
                    continue;
                }
                if !sq_ready {
                    return Ok(TxProgress::Idle);
                }
                let ord = stream.negotiated.ord;
                let Some(entry) = queues.sq.get_mut(queues.issued) else {
                    return Ok(TxProgress::Idle);
                };
                if !entry.checked {
                    let checked = match entry.refused {
                        Some(status) => Err(status),
                        None => validate(&entry.wr, env.owner, &*env.regions, ord),
                    };
                    if let Err(status) = checked {
                        return Err(TxStop::WqeError { seq: entry.seq, wr_id: entry.wr.wr_id, status });
                    }
                    entry.checked = true;
                }
                if entry.wr.opcode.is_local() {
                    if let Err(status) = local_operation(&entry.wr, env) {
                        return Err(TxStop::WqeError { seq: entry.seq, wr_id: entry.wr.wr_id, status });
                    }
                    entry.result = Some((WcStatus::Success, 0));
                    queues.issued += 1;
                    continue;
                }
                stream.tx_current = TxCurrent::Sq;
            }
            TxCurrent::Sq => match sq_fpdu(toe, sock, queues, stream, env, crc)? {
                Step::Blocked => return Ok(TxProgress::Idle),
                Step::More => {}
                Step::MessageDone => {
                    stream.tx_current = TxCurrent::Idle;
                    stream.prefer_sq = false;
                }
            },
            TxCurrent::ReadResponse => match read_response_fpdu(toe, sock, queues, stream, env, crc)? {
                Step::Blocked => return Ok(TxProgress::Idle),
                Step::More => {}
                Step::MessageDone => {
                    stream.tx_current = TxCurrent::Idle;
                    stream.prefer_sq = true;
                }
            },
        }
    }
}

/// The next SQ WQE may start: not fenced behind READs, ORD not exhausted.
fn next_sq_ready(queues: &Queues, stream: &Stream) -> bool {
    let Some(entry) = queues.sq.get(queues.issued) else {
        return false;
    };
    if entry.wr.fence && !queues.orq.is_empty() {
        return false;
    }
    if entry.wr.opcode.is_read() {
        let ord = usize::from(stream.negotiated.ord);
        // ORD 0 is caught by validation (an error completion).
        return ord == 0 || queues.orq.len() < ord;
    }
    true
}

enum Step {
    Blocked,
    More,
    MessageDone,
}

fn send_terminate<T: Transport>(
    toe: &mut T,
    sock: SocketId,
    stream: &mut Stream,
    env: &mut TxEnv<'_>,
    term: TermMessage,
) -> Result<TxProgress, TxStop> {
    let crc = stream.negotiated.crc;
    let Some(ulpdu) = term.ulpdu.get(..term.len) else {
        stream.terminate_out = None;
        return Ok(TxProgress::TerminateSent);
    };
    let total = fpdu_len(u16::try_from(ulpdu.len()).unwrap_or(0));
    let mut build = |fpdu: &mut [u8]| {
        if let Some(target) = fpdu.get_mut(ULPDU_OFFSET..ULPDU_OFFSET + ulpdu.len()) {
            target.copy_from_slice(ulpdu);
        }
        seal(fpdu, ulpdu.len(), crc, false);
        Ok(())
    };
    match put_fpdu(toe, sock, &mut stream.scratch, total, &mut build) {
        Ok(Built::Sent) => {
            stream.terminate_out = None;
            stream.tx_msn[2] = stream.tx_msn[2].wrapping_add(1);
            env.stats.terminates_tx += 1;
            env.stats.fpdus_tx += 1;
            Ok(TxProgress::TerminateSent)
        }
        // No room (a peer that stopped reading): the linger timer aborts.
        Ok(Built::NoRoom) | Err(_) => Ok(TxProgress::Idle),
    }
}

/// Sends the RTR message of peer-to-peer mode; false if no room yet.
fn send_rtr<T: Transport>(
    toe: &mut T,
    sock: SocketId,
    queues: &mut Queues,
    stream: &mut Stream,
    env: &mut TxEnv<'_>,
    kind: RtrKind,
) -> bool {
    let crc = stream.negotiated.crc;
    let (header, payload_len) = match kind {
        RtrKind::Write => (
            rdmap::Repr { opcode: Opcode::RdmaWrite, last: true, placement: Placement::Tagged { stag: 0, offset: 0 } },
            0,
        ),
        RtrKind::Read => (
            rdmap::Repr {
                opcode: Opcode::RdmaReadRequest,
                last: true,
                placement: Placement::Untagged { msn: stream.tx_msn[1], offset: 0, invalidate_stag: 0 },
            },
            rdmap::READ_REQUEST_LEN,
        ),
        RtrKind::Send => (
            rdmap::Repr {
                opcode: Opcode::Send,
                last: true,
                placement: Placement::Untagged { msn: stream.tx_msn[0], offset: 0, invalidate_stag: 0 },
            },
            0,
        ),
    };
    let ulpdu_len = header.buffer_len() + payload_len;
    let total = fpdu_len(u16::try_from(ulpdu_len).unwrap_or(0));
    let mut build = |fpdu: &mut [u8]| {
        fill(fpdu, &header, &mut |payload| {
            if !payload.is_empty() {
                let request =
                    ReadRequestRepr { sink_stag: 0, sink_offset: 0, size: 0, source_stag: 0, source_offset: 0 };
                let _ = request.emit(&mut ReadRequestPacket::new_unchecked(payload));
            }
            Ok(())
        })?;
        seal(fpdu, ulpdu_len, crc, false);
        Ok(())
    };
    match put_fpdu(toe, sock, &mut stream.scratch, total, &mut build) {
        Ok(Built::Sent) => {}
        _ => return false,
    }
    env.stats.fpdus_tx += 1;
    match kind {
        RtrKind::Read => {
            stream.tx_msn[1] = stream.tx_msn[1].wrapping_add(1);
            queues.orq.push_back(OrqEntry { seq: None, sink_stag: 0, sink_to: 0, len: 0, received: 0 });
        }
        RtrKind::Send => stream.tx_msn[0] = stream.tx_msn[0].wrapping_add(1),
        RtrKind::Write => {}
    }
    true
}

/// Emits the DDP/RDMAP header at the ULPDU offset and lets `payload` fill
/// what follows (exactly the payload: the caller sized `fpdu`).
fn fill(
    fpdu: &mut [u8],
    header: &rdmap::Repr,
    payload: &mut dyn FnMut(&mut [u8]) -> Result<(), PlacementError>,
) -> Result<(), PlacementError> {
    let header_len = header.buffer_len();
    let Some(ulpdu) = fpdu.get_mut(ULPDU_OFFSET..) else {
        return Ok(());
    };
    let _ = header.emit(&mut ddp::Packet::new_unchecked(&mut *ulpdu));
    payload(ulpdu.get_mut(header_len..).unwrap_or(&mut []))
}

fn sq_fpdu<T: Transport>(
    toe: &mut T,
    sock: SocketId,
    queues: &mut Queues,
    stream: &mut Stream,
    env: &mut TxEnv<'_>,
    crc: bool,
) -> Result<Step, TxStop> {
    let issued = queues.issued;
    let Some(entry) = queues.sq.get(issued).copied() else {
        stream.tx_current = TxCurrent::Idle;
        return Ok(Step::Blocked);
    };
    let wr = entry.wr;
    let corrupt = stream.corrupt_crc;
    if wr.opcode.is_read() {
        let sink = wr.sges.as_slice().first().copied().unwrap_or_default();
        let len = u32::try_from(wr.length()).unwrap_or(u32::MAX);
        let header = rdmap::Repr {
            opcode: Opcode::RdmaReadRequest,
            last: true,
            placement: Placement::Untagged { msn: stream.tx_msn[1], offset: 0, invalidate_stag: 0 },
        };
        let request = ReadRequestRepr {
            sink_stag: sink.lkey,
            sink_offset: sink.addr,
            size: len,
            source_stag: wr.remote_stag,
            source_offset: wr.remote_addr,
        };
        let ulpdu_len = UNTAGGED_HEADER_LEN + rdmap::READ_REQUEST_LEN;
        let total = fpdu_len(u16::try_from(ulpdu_len).unwrap_or(u16::MAX));
        let mut build = |fpdu: &mut [u8]| {
            fill(fpdu, &header, &mut |payload| {
                let _ = request.emit(&mut ReadRequestPacket::new_unchecked(payload));
                Ok(())
            })?;
            seal(fpdu, ulpdu_len, crc, corrupt);
            Ok(())
        };
        match put_fpdu(toe, sock, &mut stream.scratch, total, &mut build) {
            Ok(Built::Sent) => {}
            Ok(Built::NoRoom) => return Ok(Step::Blocked),
            Err(_) => return Err(TxStop::WqeError { seq: entry.seq, wr_id: wr.wr_id, status: WcStatus::LocProtErr }),
        }
        stream.corrupt_crc = false;
        env.stats.fpdus_tx += 1;
        stream.tx_msn[1] = stream.tx_msn[1].wrapping_add(1);
        queues.orq.push_back(OrqEntry {
            seq: Some(entry.seq),
            sink_stag: sink.lkey,
            sink_to: sink.addr,
            len,
            received: 0,
        });
        queues.issued += 1;
        return Ok(Step::MessageDone);
    }

    let total_len = u32::try_from(wr.length()).unwrap_or(u32::MAX);
    let sent = entry.sent;
    let opcode = rdmap_opcode(wr.opcode);
    let header_len = if wr.opcode == SendOpcode::Write { TAGGED_HEADER_LEN } else { UNTAGGED_HEADER_LEN };
    let max_payload = usize::from(stream.mulpdu).saturating_sub(header_len).max(1);
    let chunk = usize::try_from(total_len - sent).unwrap_or(usize::MAX).min(max_payload);
    let chunk_u32 = u32::try_from(chunk).unwrap_or(u32::MAX);
    let last = sent + chunk_u32 == total_len;
    let placement = if wr.opcode == SendOpcode::Write {
        Placement::Tagged { stag: wr.remote_stag, offset: wr.remote_addr.wrapping_add(u64::from(sent)) }
    } else {
        Placement::Untagged { msn: stream.tx_msn[0], offset: sent, invalidate_stag: wr.invalidate_stag }
    };
    let header = rdmap::Repr { opcode, last, placement };
    let ulpdu_len = header_len + chunk;
    let total = fpdu_len(u16::try_from(ulpdu_len).unwrap_or(u16::MAX));
    let (owner, memory, regions) = (env.owner, env.memory, &*env.regions);
    let mut build = |fpdu: &mut [u8]| {
        fill(fpdu, &header, &mut |payload| {
            let data = payload.get_mut(..chunk).unwrap_or(&mut []);
            gather(&wr, u64::from(sent), data, owner, memory, regions)
        })?;
        seal(fpdu, ulpdu_len, crc, corrupt);
        Ok(())
    };
    match put_fpdu(toe, sock, &mut stream.scratch, total, &mut build) {
        Ok(Built::Sent) => {}
        Ok(Built::NoRoom) => return Ok(Step::Blocked),
        Err(error) => {
            let status = match error {
                PlacementError::Access(_) => WcStatus::LocProtErr,
                PlacementError::Memory(_) => WcStatus::GeneralErr,
            };
            return Err(TxStop::WqeError { seq: entry.seq, wr_id: wr.wr_id, status });
        }
    }
    stream.corrupt_crc = false;
    env.stats.fpdus_tx += 1;
    env.stats.bytes_sent += chunk as u64;
    let Some(entry) = queues.sq.get_mut(issued) else {
        return Ok(Step::MessageDone);
    };
    entry.sent = sent + chunk_u32;
    if !last {
        return Ok(Step::More);
    }
    if wr.opcode.is_send() {
        stream.tx_msn[0] = stream.tx_msn[0].wrapping_add(1);
    }
    entry.result = Some((WcStatus::Success, total_len));
    queues.issued += 1;
    Ok(Step::MessageDone)
}

fn read_response_fpdu<T: Transport>(
    toe: &mut T,
    sock: SocketId,
    queues: &mut Queues,
    stream: &mut Stream,
    env: &mut TxEnv<'_>,
    crc: bool,
) -> Result<Step, TxStop> {
    let Some(entry) = queues.irq.front().copied() else {
        stream.tx_current = TxCurrent::Idle;
        return Ok(Step::Blocked);
    };
    let max_payload = usize::from(stream.mulpdu).saturating_sub(TAGGED_HEADER_LEN).max(1);
    let chunk = usize::try_from(entry.len - entry.sent).unwrap_or(usize::MAX).min(max_payload);
    let chunk_u32 = u32::try_from(chunk).unwrap_or(u32::MAX);
    let last = entry.sent + chunk_u32 == entry.len;
    let header = rdmap::Repr {
        opcode: Opcode::RdmaReadResponse,
        last,
        placement: Placement::Tagged {
            stag: entry.sink_stag,
            offset: entry.sink_to.wrapping_add(u64::from(entry.sent)),
        },
    };
    let ulpdu_len = TAGGED_HEADER_LEN + chunk;
    let total = fpdu_len(u16::try_from(ulpdu_len).unwrap_or(u16::MAX));
    let corrupt = stream.corrupt_crc;
    let (owner, memory, regions) = (env.owner, env.memory, &*env.regions);
    let mut build = |fpdu: &mut [u8]| {
        fill(fpdu, &header, &mut |payload| {
            let data = payload.get_mut(..chunk).unwrap_or(&mut []);
            if data.is_empty() {
                return Ok(());
            }
            read_region(
                regions,
                memory,
                entry.source_stag,
                owner,
                entry.source_to.wrapping_add(u64::from(entry.sent)),
                REMOTE_READ,
                data,
            )
        })?;
        seal(fpdu, ulpdu_len, crc, corrupt);
        Ok(())
    };
    match put_fpdu(toe, sock, &mut stream.scratch, total, &mut build) {
        Ok(Built::Sent) => {}
        Ok(Built::NoRoom) => return Ok(Step::Blocked),
        Err(error) => {
            let error = match error {
                PlacementError::Access(error) => ProtocolError::ReadSourceAccess(error),
                PlacementError::Memory(_) => ProtocolError::GuestMemory,
            };
            let request = entry.request.get(..entry.request_len as usize);
            stream.terminate_out = Some(terminate_message(stream.tx_msn[2], error.term_code(), request));
            return Err(TxStop::Protocol(error));
        }
    }
    stream.corrupt_crc = false;
    env.stats.fpdus_tx += 1;
    env.stats.bytes_sent += chunk as u64;
    if let Some(front) = queues.irq.front_mut() {
        front.sent += chunk_u32;
    }
    if !last {
        return Ok(Step::More);
    }
    queues.irq.pop_front();
    Ok(Step::MessageDone)
}

/// Sends what the QP has to send.
pub(super) fn transmit_qp<T: Transport>(
    qp: &mut Qp,
    toe: &mut T,
    out: &mut Outputs,
    io: &mut Io<'_>,
    now: Instant,
    config: &EngineConfig,
) {
    let state = qp.state;
    if !matches!(state, QpState::Rts | QpState::Closing | QpState::Terminate) {
        return;
    }
    let Qp { qpn, config: qp_config, queues, conn, .. } = qp;
    let Some(conn) = conn.as_mut() else { return };
    let sock = conn.sock;
    let Some(stream) = conn.stream.as_mut() else {
        return;
    };
    if state == QpState::Terminate && stream.terminate_out.is_none() {
        return;
    }
    if stream.terminate_out.is_none() && stream.tx_hold.is_some_and(|until| now < until) {
        return;
    }
    stream.tx_hold = None;
    let mut env = TxEnv {
        owner: Owner { pdn: qp_config.pdn, qpn: *qpn },
        memory: &*io.memory,
        regions: &mut *io.regions,
        stats: &mut out.stats,
    };
    let result = transmit(toe, sock, queues, stream, &mut env, state == QpState::Rts);
    match result {
        Ok(TxProgress::Idle) => retire_sq(qp, out),
        Ok(TxProgress::TerminateSent) => {
            if !conn.fin_sent {
                toe.close(sock);
                conn.fin_sent = true;
            }
        }
        Err(TxStop::WqeError { seq, wr_id, status }) => {
            if let Some(entry) = queues.sq_entry_mut(seq) {
                entry.result = Some((status, 0));
            }
            stream.rx_stopped = true;
            stream.terminate_out = Some(terminate_message(stream.tx_msn[2], TermCode::RdmapLocalCatastrophic, None));
            out.stats.wqe_errors += 1;
            retire_sq(qp, out);
            enter_terminate(qp, toe, out, now, config.terminate_linger, EventKind::WqeError { wr_id, status });
            // Send the TERMINATE right away if there is room.
            transmit_qp(qp, toe, out, io, now, config);
        }
        Err(TxStop::Protocol(error)) => {
            out.stats.protocol_errors += 1;
            retire_sq(qp, out);
            let kind = EventKind::LocalError { error, sent: error.term_code() };
            enter_terminate(qp, toe, out, now, config.terminate_linger, kind);
            transmit_qp(qp, toe, out, io, now, config);
        }
    }
}
