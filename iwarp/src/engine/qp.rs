//! Queue-pair state: the verbs state machine, the work queues, the
//! outstanding READ queues and the per-connection stream state.

use core::fmt;
use std::collections::VecDeque;

use super::wr::{RecvWr, SendWr, WcStatus};
use super::QpConfig;
use crate::negotiation::{Initiator, Negotiated};
use crate::stream::FpduDeframer;
use crate::toe::{FourTuple, Instant, SocketId};
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
