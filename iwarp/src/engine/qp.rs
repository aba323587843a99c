//! Queue-pair state and its changes (Linux siw: siw_qp.c): the verbs state
//! machine and `modify_qp`, the work queues, the outstanding READ queues
//! and the per-connection stream state; TERMINATE (ours or the peer's),
//! the ends of a connection (close, reset, timeout, a failed connect), and
//! the retiring and flushing of WQEs as the QP changes state.

use core::fmt;
use std::collections::VecDeque;

use super::event::{ConnectFailure, EventKind, ProtocolError};
use super::rx;
use super::wr::{Completion, RecvWr, SendWr, WcOpcode, WcStatus, WorkQueue};
use super::{woken, Engine, EngineError, Outputs, QpConfig};
use crate::negotiation::{Initiator, Negotiated};
use crate::stream::FpduDeframer;
use crate::toe::{CloseReason, Duration, FourTuple, Instant, LinkStatus, SocketId, Transport};
use crate::wire::mpa::RtrKind;
use crate::wire::rdmap::Opcode;
use crate::wire::terminate::TermCode;

/// iWARP verbs QP states, with the values of `enum vt3_qp_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpState {
    /// Created, or back after a clean close; no connection carries data.
    Idle = 0,
    /// Connected: work requests flow.
    Rts = 1,
    /// Graceful close in progress (ours or the peer's FIN).
    Closing = 2,
    /// A TERMINATE was sent or received; the connection is being torn down.
    Terminate = 3,
    /// Dead: no more completions; the provider or driver flushes.
    Error = 4,
}

/// The state names, indexed by value (`VT3_QPS_*` without the prefix).
pub const QP_STATE_NAMES: [(QpState, &str); 5] = [
    (QpState::Idle, "IDLE"),
    (QpState::Rts, "RTS"),
    (QpState::Closing, "CLOSING"),
    (QpState::Terminate, "TERMINATE"),
    (QpState::Error, "ERROR"),
];

impl QpState {
    pub const ALL: [QpState; 5] = [QpState::Idle, QpState::Rts, QpState::Closing, QpState::Terminate, QpState::Error];

    pub fn name(self) -> &'static str {
        QP_STATE_NAMES.iter().find(|(state, _)| *state == self).map_or("?", |(_, name)| name)
    }

    pub fn from_wire(value: u32) -> Option<QpState> {
        QpState::ALL.into_iter().find(|&state| state as u32 == value)
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A posted send WR and its progress.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SqEntry {
    pub wr: SendWr,
    pub seq: u64,
    /// Octets transmitted so far (SEND/WRITE).
    pub sent: u32,
    /// Validated (on first transmission).
    pub checked: bool,
    /// Done, with this status and byte count: retire in order.
    pub result: Option<(WcStatus, u32)>,
    /// The device could not parse the WQE: it fails with this status
    /// when transmission reaches it.
    pub refused: Option<WcStatus>,
}

/// A receive WQE the device could not parse. It sits after every receive
/// WR posted before it and completes with `status` once they all have;
/// nothing is posted after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RefusedRecv {
    pub wr_id: u64,
    pub status: WcStatus,
}

/// An RDMA READ we issued, waiting for its response.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OrqEntry {
    /// The SQ entry to complete; `None` for the internal RTR read.
    pub seq: Option<u64>,
    pub sink_stag: u32,
    pub sink_to: u64,
    pub len: u32,
    pub received: u32,
}

/// Length of the copy of a Read Request kept for TERMINATE reporting:
/// its untagged DDP header and the RDMAP Read Request header.
pub(crate) const READ_REQUEST_COPY: usize = 18 + 28;

/// An inbound RDMA Read Request we answer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IrqEntry {
    pub sink_stag: u32,
    pub sink_to: u64,
    pub source_stag: u32,
    pub source_to: u64,
    pub len: u32,
    pub sent: u32,
    /// The request as received (for a TERMINATE about it).
    pub request: [u8; READ_REQUEST_COPY],
    pub request_len: u32,
}

/// Connection phases before FPDU mode.
#[derive(Debug)]
pub(crate) enum Phase {
    /// Active open: TCP handshake in progress.
    TcpConnecting { initiator: Box<Initiator>, private_data: Vec<u8> },
    /// MPA request sent, waiting for the reply.
    AwaitReply { initiator: Box<Initiator> },
    /// FPDUs.
    Streaming,
}

/// The message being transmitted (never interleaved with another).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TxCurrent {
    Idle,
    /// The SQ entry `issued` (index from the front).
    Sq,
    /// The IRQ front.
    ReadResponse,
}

/// An untagged Send being received into the RQ front.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxSend {
    pub opcode: Opcode,
    pub placed: u32,
    pub capacity: u64,
    pub invalidate_stag: u32,
}

/// A tagged message (RDMA WRITE) whose last segment has not arrived.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxTagged {
    pub stag: u32,
    pub next_to: u64,
}

/// A TERMINATE ULPDU ready to go (untagged DDP header + Terminate header
/// + copied headers: at most 18 + 4 + 2 + 18 + 28 octets).
#[derive(Clone, Copy)]
pub(crate) struct TermMessage {
    pub code: TermCode,
    pub ulpdu: [u8; 72],
    pub len: usize,
}

impl fmt::Debug for TermMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TermMessage({}, {} octets)", self.code, self.len)
    }
}

/// FPDU-mode state of a connection.
#[derive(Debug)]
pub(crate) struct Stream {
    pub negotiated: Negotiated,
    /// Largest ULPDU we send: MULPDU of the effective MSS.
    pub mulpdu: u16,
    /// The responder sends nothing before the initiator's first FPDU.
    pub tx_ready: bool,
    /// The initiator sends nothing before this (`EngineConfig::rtr_hold`).
    pub tx_hold: Option<Instant>,
    /// RTR message we still have to send (initiator) …
    pub rtr_out: Option<RtrKind>,
    /// … or expect as the first FPDU (responder).
    pub rtr_in: Option<RtrKind>,
    /// Next MSN to send on queues 0, 1, 2.
    pub tx_msn: [u32; 3],
    pub tx_current: TxCurrent,
    /// After a read response, serve the SQ before the next one (no starvation).
    pub prefer_sq: bool,
    /// Next MSN expected on queues 0, 1, 2.
    pub rx_msn: [u32; 3],
    pub rx_send: Option<RxSend>,
    pub rx_tagged: Option<RxTagged>,
    /// Set once RX hit an error or a TERMINATE: later bytes are dropped.
    pub rx_stopped: bool,
    pub terminate_out: Option<TermMessage>,
    /// Fault injection: corrupt the CRC of the next FPDU.
    pub corrupt_crc: bool,
    /// For FPDUs that do not fit the contiguous part of the send ring.
    pub scratch: Vec<u8>,
}

/// A TCP connection owned by a QP.
#[derive(Debug)]
pub(crate) struct Conn {
    pub sock: SocketId,
    pub tuple: Option<FourTuple>,
    pub phase: Phase,
    /// MPA reply timeout, or the TERMINATE linger.
    pub deadline: Option<Instant>,
    pub fin_sent: bool,
    pub deframer: Option<FpduDeframer>,
    pub stream: Option<Stream>,
}

/// Work queues and read queues.
#[derive(Debug, Default)]
pub(crate) struct Queues {
    pub sq: VecDeque<SqEntry>,
    /// Entries at the front of `sq` already (at least partly) transmitted.
    pub issued: usize,
    pub next_seq: u64,
    pub rq: VecDeque<RecvWr>,
    /// A refused receive WQE after `rq`.
    pub rq_refused: Option<RefusedRecv>,
    /// The SRQ index of the WR at the front of `rq` (or of `rq_refused`),
    /// taken from the QP's SRQ: only one at a time, for the Send being
    /// received.
    pub srq_taken: Option<u32>,
    pub orq: VecDeque<OrqEntry>,
    pub irq: VecDeque<IrqEntry>,
}

impl Queues {
    pub fn sq_entry_mut(&mut self, seq: u64) -> Option<&mut SqEntry> {
        let front = self.sq.front()?.seq;
        let index = usize::try_from(seq.checked_sub(front)?).ok()?;
        self.sq.get_mut(index)
    }

    /// Forgets every WQE: the provider or driver flushes them.
    pub fn clear(&mut self) {
        self.sq.clear();
        self.issued = 0;
        self.rq.clear();
        self.rq_refused = None;
        self.srq_taken = None;
        self.orq.clear();
        self.irq.clear();
    }
}

/// One queue pair.
#[derive(Debug)]
pub(crate) struct Qp {
    pub qpn: u32,
    pub config: QpConfig,
    pub state: QpState,
    pub queues: Queues,
    pub conn: Option<Conn>,
    /// The end of the current connection was reported (one event per connection).
    pub end_reported: bool,
}

impl Qp {
    pub fn new(qpn: u32, config: QpConfig) -> Qp {
        // The queues grow as WQEs are posted (to the ring's depth at most)
        // and keep their room: an idle QP holds no WQE slots.
        Qp { qpn, config, state: QpState::Idle, queues: Queues::default(), conn: None, end_reported: false }
    }
}

impl<T: Transport> Engine<T> {
    /// Verbs modify_qp state changes:
    /// RTS → CLOSING (graceful disconnect: FIN), any → ERROR (abortive:
    /// RST if connected), RTS → TERMINATE (TERMINATE "local catastrophic"),
    /// ERROR → IDLE (reuse the QP).
    pub fn modify_qp(&mut self, now: Instant, qpn: u32, to: QpState) -> Result<(), EngineError> {
        let linger = self.config.terminate_linger;
        let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        let from = qp.state;
        if from == to {
            return Ok(());
        }
        let invalid = EngineError::InvalidState { qpn, state: from, what: "transition not allowed" };
        match (from, to) {
            (QpState::Rts, QpState::Closing) => {
                let conn = qp.conn.as_mut().ok_or(invalid)?;
                self.toe.close(conn.sock);
                conn.fin_sent = true;
                set_state(qp, &mut self.out, QpState::Closing);
            }
            (_, QpState::Error) => {
                if let Some(conn) = qp.conn.take() {
                    self.toe.abort(conn.sock);
                    self.toe.release(conn.sock);
                    if !qp.end_reported && matches!(from, QpState::Rts | QpState::Closing) {
                        qp.end_reported = true;
                        self.out.qp_event(qpn, EventKind::Aborted);
                    }
                }
                set_state(qp, &mut self.out, QpState::Error);
            }
            (QpState::Rts, QpState::Terminate) => {
                local_terminate(qp, &mut self.toe, &mut self.out, now, linger, TermCode::RdmapLocalCatastrophic);
            }
            (QpState::Error, QpState::Idle) => {
                if qp.conn.is_some() {
                    return Err(invalid);
                }
                qp.queues.clear();
                qp.end_reported = false;
                set_state(qp, &mut self.out, QpState::Idle);
            }
            _ => return Err(invalid),
        }
        Ok(())
    }
}

/// Changes state with an event; ERROR and IDLE-after-close drop the WQEs
/// (retired ones are completed first).
pub(super) fn set_state(qp: &mut Qp, out: &mut Outputs, to: QpState) {
    let from = qp.state;
    if from == to {
        return;
    }
    retire_sq(qp, out);
    qp.state = to;
    if to == QpState::Error || (to == QpState::Idle && from != QpState::Error) {
        flush_taken_srq_wr(qp, out);
        qp.queues.clear();
    }
    out.qp_event(qp.qpn, EventKind::StateChanged { from, to });
}

/// The SRQ WR a QP took for a Send it will not finish: it is this QP's
/// (no other may take it again, the buffer is half written), so it
/// completes here, flushed, before the state change is reported. The WRs
/// still in the SRQ are left for the other QPs (siw and rxe do the same).
pub(super) fn flush_taken_srq_wr(qp: &mut Qp, out: &mut Outputs) {
    let Some(index) = qp.queues.srq_taken.take() else {
        return;
    };
    let wr_id = match (qp.queues.rq.front(), qp.queues.rq_refused) {
        (Some(wr), _) => wr.wr_id,
        (None, Some(refused)) => refused.wr_id,
        (None, None) => return,
    };
    out.completions.push_back(Completion {
        qpn: qp.qpn,
        queue: WorkQueue::Recv,
        wr_id,
        opcode: WcOpcode::Recv,
        status: WcStatus::WrFlushErr,
        byte_len: 0,
        invalidated_stag: None,
        solicited: false,
        signaled: true,
        srq_idx: Some(index),
    });
}

/// A refused send WR at the front of an unconnected QP's SQ: it completes
/// with its status and the QP goes to ERROR.
pub(super) fn fail_refused_send(qp: &mut Qp, out: &mut Outputs) {
    let Some(front) = qp.queues.sq.front_mut() else {
        return;
    };
    let Some(status) = front.refused else { return };
    let wr_id = front.wr.wr_id;
    front.result = Some((status, 0));
    out.stats.wqe_errors += 1;
    retire_sq(qp, out);
    if !qp.end_reported {
        qp.end_reported = true;
        out.qp_event(qp.qpn, EventKind::WqeError { wr_id, status });
    }
    set_state(qp, out, QpState::Error);
}

/// Fails a refused receive WR whose turn came: every receive WR before it
/// completed and no Send is being placed. Connected, the QP enters
/// TERMINATE (ours: RDMAP local catastrophic); otherwise ERROR.
pub(super) fn fail_due_recv_refusal<T: Transport>(
    qp: &mut Qp,
    toe: &mut T,
    out: &mut Outputs,
    now: Instant,
    linger: Duration,
) {
    let Some(refused) = qp.queues.rq_refused else {
        return;
    };
    if !qp.queues.rq.is_empty() || matches!(qp.state, QpState::Terminate | QpState::Error) {
        return;
    }
    let connected = match qp.conn.as_mut() {
        None => false,
        Some(conn) => match conn.stream.as_mut() {
            // Still connecting: its turn comes in RTS.
            None => return,
            Some(stream) if stream.rx_send.is_some() => return,
            Some(stream) => {
                stream.rx_stopped = true;
                stream.terminate_out =
                    Some(rx::terminate_message(stream.tx_msn[2], TermCode::RdmapLocalCatastrophic, None));
                true
            }
        },
    };
    qp.queues.rq_refused = None;
    out.completions.push_back(Completion {
        qpn: qp.qpn,
        queue: WorkQueue::Recv,
        wr_id: refused.wr_id,
        opcode: WcOpcode::Recv,
        status: refused.status,
        byte_len: 0,
        invalidated_stag: None,
        solicited: false,
        signaled: true,
        srq_idx: qp.queues.srq_taken.take(),
    });
    out.stats.wqe_errors += 1;
    let kind = EventKind::WqeError { wr_id: refused.wr_id, status: refused.status };
    if connected {
        enter_terminate(qp, toe, out, now, linger, kind);
    } else {
        if !qp.end_reported {
            qp.end_reported = true;
            out.qp_event(qp.qpn, kind);
        }
        set_state(qp, out, QpState::Error);
    }
}

/// Completes finished send WQEs in posting order (none once in ERROR).
pub(super) fn retire_sq(qp: &mut Qp, out: &mut Outputs) {
    if qp.state == QpState::Error {
        return;
    }
    while let Some(front) = qp.queues.sq.front() {
        let Some((status, byte_len)) = front.result else {
            break;
        };
        out.completions.push_back(Completion {
            qpn: qp.qpn,
            queue: WorkQueue::Send,
            wr_id: front.wr.wr_id,
            opcode: front.wr.opcode.wc_opcode(),
            status,
            byte_len,
            invalidated_stag: None,
            solicited: false,
            signaled: front.wr.signaled || status != WcStatus::Success,
            srq_idx: None,
        });
        qp.queues.sq.pop_front();
        qp.queues.issued = qp.queues.issued.saturating_sub(1);
    }
}

/// A TERMINATE of our own (fault injection, modify to TERMINATE).
pub(super) fn local_terminate<T: Transport>(
    qp: &mut Qp,
    toe: &mut T,
    out: &mut Outputs,
    now: Instant,
    linger: Duration,
    code: TermCode,
) {
    let Some(conn) = qp.conn.as_mut() else { return };
    if let Some(stream) = conn.stream.as_mut() {
        stream.rx_stopped = true;
        stream.terminate_out = Some(rx::terminate_message(stream.tx_msn[2], code, None));
    } else {
        toe.close(conn.sock);
        conn.fin_sent = true;
    }
    conn.deadline = Some(now + linger);
    if !qp.end_reported {
        qp.end_reported = true;
        out.stats.protocol_errors += 1;
        out.qp_event(qp.qpn, EventKind::LocalError { error: ProtocolError::Injected, sent: code });
    }
    set_state(qp, out, QpState::Terminate);
}

/// Moves a QP with an RX or TX failure into TERMINATE.
pub(super) fn enter_terminate<T: Transport>(
    qp: &mut Qp,
    toe: &mut T,
    out: &mut Outputs,
    now: Instant,
    linger: Duration,
    kind: EventKind,
) {
    if let Some(conn) = qp.conn.as_mut() {
        conn.deadline = Some(now + linger);
        let term_pending = conn.stream.as_ref().is_some_and(|s| s.terminate_out.is_some());
        if !term_pending && !conn.fin_sent {
            toe.close(conn.sock);
            conn.fin_sent = true;
        }
    }
    if !qp.end_reported {
        qp.end_reported = true;
        out.qp_event(qp.qpn, kind);
    }
    set_state(qp, out, QpState::Terminate);
}

/// The connection is gone (or given up): report, pick the final state,
/// release the socket.
pub(super) fn connection_ended<T: Transport>(qp: &mut Qp, toe: &mut T, out: &mut Outputs, reason: CloseReason) {
    let Some(conn) = qp.conn.take() else { return };
    toe.release(conn.sock);
    let connecting = !matches!(conn.phase, Phase::Streaming);
    if qp.end_reported {
        set_state(qp, out, QpState::Error);
        return;
    }
    qp.end_reported = true;
    if connecting {
        out.qp_event(qp.qpn, EventKind::ConnectFailed(ConnectFailure::Tcp(reason)));
        set_state(qp, out, QpState::Error);
        return;
    }
    match reason {
        CloseReason::Graceful => {
            if qp.state == QpState::Rts {
                out.qp_event(qp.qpn, EventKind::PeerClose);
                set_state(qp, out, QpState::Closing);
            }
            retire_sq(qp, out);
            let outstanding = !qp.queues.sq.is_empty() || !qp.queues.orq.is_empty();
            out.qp_event(qp.qpn, EventKind::CloseComplete { sq_outstanding: outstanding });
            let to = if outstanding { QpState::Error } else { QpState::Idle };
            set_state(qp, out, to);
        }
        CloseReason::Reset => {
            out.qp_event(qp.qpn, EventKind::Reset);
            set_state(qp, out, QpState::Error);
        }
        CloseReason::Timeout => {
            out.qp_event(qp.qpn, EventKind::Timeout);
            set_state(qp, out, QpState::Error);
        }
        CloseReason::Aborted => {
            out.qp_event(qp.qpn, EventKind::Aborted);
            set_state(qp, out, QpState::Error);
        }
    }
}

pub(super) fn connect_failed<T: Transport>(
    qp: &mut Qp,
    toe: &mut T,
    out: &mut Outputs,
    failure: ConnectFailure,
    abort: bool,
) {
    if let Some(conn) = qp.conn.take() {
        if abort {
            toe.abort(conn.sock);
        } else {
            toe.close(conn.sock);
        }
        toe.release(conn.sock);
    }
    if !qp.end_reported {
        qp.end_reported = true;
        out.qp_event(qp.qpn, EventKind::ConnectFailed(failure));
    }
    set_state(qp, out, QpState::Error);
}

/// Reacts to TCP: the peer's FIN, resets, timeouts, the end of a close.
pub(super) fn handle_status<T: Transport>(qp: &mut Qp, toe: &mut T, out: &mut Outputs) {
    let Some(conn) = qp.conn.as_mut() else { return };
    let sock = conn.sock;
    match toe.status(sock) {
        Some(LinkStatus::Connecting | LinkStatus::Established | LinkStatus::Closing) => {}
        Some(LinkStatus::PeerClosed) => match qp.state {
            QpState::Rts => {
                if !conn.fin_sent {
                    toe.close(sock);
                    conn.fin_sent = true;
                }
                if !qp.end_reported {
                    out.qp_event(qp.qpn, EventKind::PeerClose);
                }
                set_state(qp, out, QpState::Closing);
            }
            QpState::Idle => {
                // The peer hung up during the MPA exchange.
                connect_failed(qp, toe, out, ConnectFailure::PeerClosed, false);
            }
            QpState::Closing | QpState::Terminate => {
                if !conn.fin_sent && conn.stream.as_ref().is_none_or(|s| s.terminate_out.is_none()) {
                    toe.close(sock);
                    conn.fin_sent = true;
                }
            }
            QpState::Error => {}
        },
        Some(LinkStatus::Closed(reason)) => connection_ended(qp, toe, out, reason),
        None => connection_ended(qp, toe, out, CloseReason::Aborted),
    }
}

#[cfg(test)]
#[allow(clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn state_names_match_the_abi_values() {
        for (value, (state, name)) in QP_STATE_NAMES.iter().enumerate() {
            assert_eq!(*state as usize, value);
            assert_eq!(state.name(), *name);
            assert_eq!(QpState::from_wire(value as u32), Some(*state));
        }
        assert_eq!(QpState::from_wire(5), None);
        assert_eq!(QpState::Terminate.to_string(), "TERMINATE");
    }
}
