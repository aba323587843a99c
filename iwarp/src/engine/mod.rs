//! The iWARP engine of vt3d: queue pairs over the TOE.
//!
//! ```text
//!   device (vt3d)                               Engine<T: Transport>
//!   ─────────────                               ─────────────────────────────────────────
//!   uplink frame ─ wants()? ─ receive() ───────▶ TOE ingress (TCP)
//!   doorbell: SQ/RQ WQEs ─── post_send/recv() ─▶ SQ / RQ per QP
//!   timer / after a batch ── poll(now, io) ────▶ TCP timers, accept, MPA, RX: FPDU → DDP/RDMAP
//!                                                → placement via MemoryRegions + GuestMemory,
//!                                                TX: WQEs/READ responses → FPDUs in TCP buffers,
//!                                                TOE egress → io.uplink(frame)
//!   guest CQ ◀──── pop_completion() ◀────────── completions, in order per queue
//!   driver  ◀──── pop_event() ◀─────────────── connection and QP events (docs/architecture.md §5)
//! ```
//!
//! Time is injected: every call that can start or run timers takes `now`,
//! and [`Engine::poll_at`] says when to call [`Engine::poll`] next.
//!
//! QP states follow the iWARP verbs ([`QpState`]); every transition is
//! reported ([`EventKind::StateChanged`]), and every connection end is
//! reported exactly once with its cause. Once a QP is in ERROR the engine
//! writes no completion for it and forgets its WQEs: the provider or
//! driver flushes them.
//!
//! The modules follow Linux siw's split: this one holds the [`Engine`], its
//! public types and verbs (QPs, work requests, SRQs) and the poll loop that
//! runs each QP's steps; `cm` manages connections and MPA (siw_cm.c), `qp`
//! the QP state machine, TERMINATE and teardown (siw_qp.c), `rx` and `tx`
//! the FPDU paths (siw_qp_rx.c, siw_qp_tx.c), and `faults` fault injection.

mod cm;
mod event;
mod faults;
mod memory;
mod qp;
mod rereg;
mod rx;
mod srq;
#[cfg(test)]
mod tests;
mod tx;
mod window;
mod wr;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use thiserror::Error;

pub use cm::ConnectParams;
pub use event::{ConnectFailure, ConnectRequest, Event, EventKind, ProtocolError};
pub use faults::Fault;
pub use memory::{
    check_fast_reg, read_page_list, Access, AccessError, FastRegError, GuestMemory, MemoryError, MemoryRegions,
    ALL_ACCESS, LOCAL_READ, LOCAL_WRITE, MW_BIND, PAGE_SIZE, REMOTE_READ, REMOTE_WRITE,
};
pub use qp::{QpState, QP_STATE_NAMES};
pub use rereg::{
    check_rereg, reregistered, RegionKind, Registration, Rereg, ReregError, REREG_ACCESS, REREG_PD, REREG_TRANSLATION,
};
pub use window::{
    bound_state, check_bind, check_window_access, check_window_invalidate, BindError, MwBind, MwType, Owner,
    RegionView, Window, WindowView, WINDOW_ACCESS,
};
pub use wr::{
    Completion, FastReg, InlineData, RecvWr, SendOpcode, SendWr, Sge, SgeList, WcOpcode, WcStatus, WorkQueue,
    MAX_INLINE, MAX_MESSAGE, MAX_SGE,
};

use crate::negotiation::{self, Negotiated};
use crate::toe::{CloseReason, Duration, FourTuple, Instant, Link, LinkStatus, SocketId, TcbInfo, TcpError, Transport};
use crate::wire::mpa;
use cm::Pending;
use qp::{
    connect_failed, connection_ended, fail_due_recv_refusal, fail_refused_send, flush_taken_srq_wr, handle_status,
    Phase, Qp,
};
use srq::{Srq, SrqWr};

/// Engine-wide limits and timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    pub max_qps: usize,
    /// Accepted TCP connections waiting for their MPA request or for the
    /// ULP's accept/reject. Further ones wait in the TOE backlog.
    pub max_pending: usize,
    /// How long the MPA request or reply may take.
    pub mpa_timeout: Duration,
    /// How long a QP in TERMINATE waits for the TCP close before aborting.
    pub terminate_linger: Duration,
    /// Largest ULPDU accepted from a peer (bounds the reassembly buffer).
    pub max_rx_ulpdu: u16,
    /// MPA settings for parsing requests on listening ports (the accepting
    /// QP's own settings decide the reply).
    pub listen_mpa: negotiation::Config,
    /// How long the initiator holds its RTR after the MPA reply. Linux siw
    /// (6.1) as responder installs the socket upcall that reads the RTR only
    /// after its MPA reply went out: an RTR arriving in between sits unread
    /// in its socket until more data comes, so a peer that waits for the
    /// responder to speak first (perftest, rping) hangs. A short hold lets
    /// siw get there first.
    pub rtr_hold: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_qps: 1024,
            max_pending: 64,
            mpa_timeout: Duration::from_secs(10),
            terminate_linger: Duration::from_secs(2),
            max_rx_ulpdu: u16::MAX,
            listen_mpa: negotiation::Config::default(),
            rtr_hold: Duration::from_millis(20),
        }
    }
}

/// Per-QP parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpConfig {
    /// Protection domain: every access goes through the TPT with it.
    pub pdn: u32,
    pub sq_depth: u32,
    pub rq_depth: u32,
    /// The SRQ receives take their WRs from (no RQ of its own then).
    pub srq: Option<u32>,
    /// MPA revision, CRC, IRD/ORD and RTR preferences.
    pub mpa: negotiation::Config,
}

impl QpConfig {
    pub fn new(pdn: u32) -> Self {
        QpConfig { pdn, sq_depth: 256, rq_depth: 256, srq: None, mpa: negotiation::Config::default() }
    }
}

/// A connection accepted by TCP and not yet bound to a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub SocketId);

impl core::fmt::Display for ConnId {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "conn {}", self.0)
    }
}

/// Engine errors (caller mistakes and resource limits; never network input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum EngineError {
    #[error("no QP {0}")]
    NoSuchQp(u32),
    #[error("QP {0} exists")]
    QpExists(u32),
    #[error("QP limit reached")]
    TooManyQps,
    #[error("no SRQ {0}")]
    NoSuchSrq(u32),
    #[error("SRQ {0} exists")]
    SrqExists(u32),
    #[error("SRQ {0} still has QPs")]
    SrqBusy(u32),
    #[error("no such pending connection")]
    NoSuchConnection,
    #[error("QP {qpn} is {state}: {what}")]
    InvalidState { qpn: u32, state: QpState, what: &'static str },
    #[error("queue full")]
    QueueFull,
    #[error("private data of {0} octets is too long")]
    PrivateDataTooLong(usize),
    #[error("invalid QP configuration: {0}")]
    Config(&'static str),
    #[error("TCP: {0}")]
    Transport(#[from] TcpError),
    #[error("MPA: {0}")]
    Negotiation(#[from] negotiation::Error),
    /// A fault that cannot apply to this QP now (e.g. no CRC to corrupt).
    #[error("QP {qpn}: {what}")]
    FaultNotApplicable { qpn: u32, what: &'static str },
}

/// What [`Engine::poll`] needs from the device: guest memory, the TPT and
/// the uplink.
pub struct Io<'a> {
    pub memory: &'a mut dyn GuestMemory,
    pub regions: &'a mut dyn MemoryRegions,
    pub uplink: &'a mut dyn FnMut(&[u8]),
}

impl core::fmt::Debug for Io<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("Io")
    }
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineStats {
    pub fpdus_tx: u64,
    pub fpdus_rx: u64,
    /// Payload octets sent (SEND, WRITE, READ response data).
    pub bytes_sent: u64,
    /// Payload octets placed into guest memory.
    pub bytes_placed: u64,
    pub read_requests_rx: u64,
    pub terminates_tx: u64,
    pub terminates_rx: u64,
    pub protocol_errors: u64,
    pub wqe_errors: u64,
    pub connections_established: u64,
    pub connections_refused: u64,
}

/// A QP as `vt3d ctl` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    pub qpn: u32,
    pub state: QpState,
    pub pdn: u32,
    pub socket: Option<SocketId>,
    pub tuple: Option<FourTuple>,
    pub negotiated: Option<Negotiated>,
    pub sq_outstanding: usize,
    pub rq_posted: usize,
    pub reads_outstanding: usize,
    pub reads_inbound: usize,
    /// Next MSN to send / expected, queues 0 (Send), 1 (Read Request), 2 (Terminate).
    pub tx_msn: [u32; 3],
    pub rx_msn: [u32; 3],
}

/// Completions, events and counters: what polling produces.
#[derive(Debug, Default)]
struct Outputs {
    completions: VecDeque<Completion>,
    events: VecDeque<Event>,
    stats: EngineStats,
}

impl Outputs {
    fn qp_event(&mut self, qpn: u32, kind: EventKind) {
        self.events.push_back(Event { qpn: Some(qpn), conn: None, kind });
    }

    fn conn_event(&mut self, conn: ConnId, kind: EventKind) {
        self.events.push_back(Event { qpn: None, conn: Some(conn), kind });
    }
}

/// The engine: QPs and listening ports over a TOE.
pub struct Engine<T: Transport> {
    /// The TCP behind the link that loops our own frames back and
    /// injects faults (`toe/link.rs`).
    toe: Link<T>,
    config: EngineConfig,
    qps: BTreeMap<u32, Qp>,
    srqs: BTreeMap<u32, Srq>,
    pending: BTreeMap<ConnId, Pending>,
    listeners: BTreeMap<u16, usize>,
    out: Outputs,
    /// The last poll left looped-back frames untaken.
    loopback_behind: bool,
    /// QPs a poll services: those with work, or woken since (an API call
    /// on them, their socket ready). The others are `quiescent` and cost
    /// nothing, so a poll's work follows the connections that have some.
    active: BTreeSet<u32>,
    /// Whose socket each connection is, for the TOE's ready sockets (an
    /// entry outlives its connection until the socket is ready once more,
    /// which its release makes it).
    by_sock: HashMap<SocketId, u32>,
}

/// Passes of one poll over frames that came back in (loopback).
const LOOPBACK_PASSES: usize = 8;

impl<T: Transport> core::fmt::Debug for Engine<T> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Engine")
            .field("qps", &self.qps.len())
            .field("pending", &self.pending.len())
            .field("stats", &self.out.stats)
            .finish_non_exhaustive()
    }
}

impl<T: Transport> Engine<T> {
    pub fn new(toe: T, config: EngineConfig) -> Self {
        Engine {
            toe: Link::new(toe),
            config,
            qps: BTreeMap::new(),
            srqs: BTreeMap::new(),
            pending: BTreeMap::new(),
            listeners: BTreeMap::new(),
            out: Outputs::default(),
            loopback_behind: false,
            active: BTreeSet::new(),
            by_sock: HashMap::new(),
        }
    }

    pub fn toe(&self) -> &Link<T> {
        &self.toe
    }

    pub fn toe_mut(&mut self) -> &mut Link<T> {
        &mut self.toe
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn stats(&self) -> EngineStats {
        self.out.stats
    }

    /// QPs the next poll services (the others have nothing to do).
    pub fn active_qps(&self) -> usize {
        self.active.len()
    }

    /// Demux: should this uplink frame go to the engine (else: the guest)?
    pub fn wants(&self, frame: &[u8]) -> bool {
        self.toe.wants(frame)
    }

    /// One frame from the uplink (that [`Engine::wants`]). TCP processes it
    /// now; the engine reads the data at the next [`Engine::poll`].
    pub fn receive(&mut self, now: Instant, frame: &[u8], uplink: &mut dyn FnMut(&[u8])) {
        self.toe.ingress(now, frame, uplink);
        self.wake_ready();
    }

    /// The QPs whose sockets the TOE saw something happen to join the
    /// active ones.
    fn wake_ready(&mut self) {
        let Engine { toe, active, by_sock, qps, .. } = self;
        toe.take_ready(&mut |sock| {
            let Some(&qpn) = by_sock.get(&sock) else {
                return;
            };
            if qps.get(&qpn).and_then(|qp| qp.conn.as_ref()).is_some_and(|conn| conn.sock == sock) {
                active.insert(qpn);
            } else {
                by_sock.remove(&sock);
            }
        });
    }

    /// The uplink takes at most `frames` more frames from the polls that
    /// follow (see [`Transport::set_egress_room`]).
    pub fn set_egress_room(&mut self, frames: usize) {
        self.toe.set_egress_room(frames);
    }

    /// When to call [`Engine::poll`] at the latest.
    pub fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        if self.loopback_behind {
            return Some(now);
        }
        let mut at = self.toe.poll_at(now);
        let mut consider = |deadline: Option<Instant>| {
            if let Some(deadline) = deadline {
                at = Some(at.map_or(deadline, |at| at.min(deadline)));
            }
        };
        // Deadlines and held transmissions keep a QP active.
        for qp in self.active.iter().filter_map(|qpn| self.qps.get(qpn)) {
            consider(qp.conn.as_ref().and_then(|conn| conn.deadline));
            consider(qp.conn.as_ref().and_then(|conn| conn.stream.as_ref()?.tx_hold));
        }
        for pending in self.pending.values() {
            consider((!pending.requested).then_some(pending.deadline));
        }
        at
    }

    /// Runs everything: TCP timers, new connections, MPA, receive and
    /// transmit of every QP, and sends the resulting frames. Frames of a
    /// loopback connection come back in while they are sent: what they
    /// brought is taken at once, for a few passes (then `poll_at` says now).
    pub fn poll(&mut self, now: Instant, io: &mut Io<'_>) {
        self.toe.egress(now, io.uplink);
        self.loopback_behind = true;
        for _ in 0..LOOPBACK_PASSES {
            let looped = self.toe.looped_in();
            self.accept_connections(now);
            self.service_pending(now);
            self.wake_ready();
            let Engine { toe, config, qps, srqs, out, active, .. } = self;
            let woken: Vec<u32> = active.iter().copied().collect();
            for qpn in woken {
                let Some(qp) = qps.get_mut(&qpn) else {
                    active.remove(&qpn);
                    continue;
                };
                let srq = qp.config.srq.and_then(|srqn| srqs.get_mut(&srqn));
                service_qp(qp, srq, toe, out, io, now, config);
                if quiescent(qp, toe) {
                    active.remove(&qpn);
                }
            }
            self.toe.egress(now, io.uplink);
            self.wake_ready();
            if self.toe.looped_in() == looped {
                self.loopback_behind = false;
                break;
            }
        }
    }

    pub fn pop_completion(&mut self) -> Option<Completion> {
        self.out.completions.pop_front()
    }

    pub fn pop_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
    }

    // ---- QPs ----

    pub fn create_qp(&mut self, qpn: u32, config: QpConfig) -> Result<(), EngineError> {
        if self.qps.contains_key(&qpn) {
            return Err(EngineError::QpExists(qpn));
        }
        if self.qps.len() >= self.config.max_qps {
            return Err(EngineError::TooManyQps);
        }
        if config.sq_depth == 0 || config.rq_depth == 0 || config.sq_depth > 1 << 16 || config.rq_depth > 1 << 16 {
            return Err(EngineError::Config("queue depths must be within 1..=65536"));
        }
        if config.mpa.ird > mpa::IRD_ORD_MAX || config.mpa.ord > mpa::IRD_ORD_MAX {
            return Err(EngineError::Config("IRD/ORD above 16383"));
        }
        if let Some(srqn) = config.srq {
            self.srqs.get_mut(&srqn).ok_or(EngineError::NoSuchSrq(srqn))?.qps += 1;
        }
        self.qps.insert(qpn, Qp::new(qpn, config));
        Ok(())
    }

    /// Destroys a QP at once (RST on a live connection); no event.
    pub fn destroy_qp(&mut self, qpn: u32) -> Result<(), EngineError> {
        let qp = self.qps.remove(&qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        // A WR it had taken from its SRQ goes with it: a destroyed QP's
        // completions are never delivered.
        if let Some(srq) = qp.config.srq.and_then(|srqn| self.srqs.get_mut(&srqn)) {
            srq.qps = srq.qps.saturating_sub(1);
        }
        if let Some(conn) = qp.conn {
            self.toe.abort(conn.sock);
            self.toe.release(conn.sock);
        }
        Ok(())
    }

    /// QPs with received data waiting whose receive WQEs may not cover
    /// it: the device reads their receive rings before the next
    /// [`Engine::poll`], which would otherwise answer a SEND with a
    /// TERMINATE for want of a buffer the guest may have posted already
    /// (its doorbell still on the way, or left for later by a fetch
    /// budget). A receive queue is read whenever data waits, not only once
    /// it is empty: one poll places every SEND waiting, and an RQ or SRQ
    /// that runs out in mid-poll must not refuse a SEND whose receive is in
    /// the ring (the soak met it for RQs, several QPs at once behind late
    /// doorbells; the chaos case for an SRQ of 16 QPs).
    pub fn starved_receive_queues(&self) -> impl Iterator<Item = u32> + '_ {
        // Data waiting keeps a QP active.
        self.active.iter().filter_map(|qpn| self.qps.get(qpn)).filter_map(|qp| {
            let conn = qp.conn.as_ref()?;
            let receiving = matches!(qp.state, QpState::Rts | QpState::Closing)
                && conn.stream.as_ref().is_some_and(|s| !s.rx_stopped);
            // An SRQ's pool too: it may hold fewer WRs than the SENDs
            // waiting (the SRQ's other QPs, or several on this one).
            (receiving && self.toe.recv_queue(conn.sock) > 0).then_some(qp.qpn)
        })
    }

    pub fn qp_state(&self, qpn: u32) -> Option<QpState> {
        self.qps.get(&qpn).map(|qp| qp.state)
    }

    pub fn qp_info(&self, qpn: u32) -> Option<QpInfo> {
        let qp = self.qps.get(&qpn)?;
        let stream = qp.conn.as_ref().and_then(|conn| conn.stream.as_ref());
        Some(QpInfo {
            qpn,
            state: qp.state,
            pdn: qp.config.pdn,
            socket: qp.conn.as_ref().map(|conn| conn.sock),
            tuple: qp.conn.as_ref().and_then(|conn| conn.tuple),
            negotiated: stream.map(|s| s.negotiated),
            sq_outstanding: qp.queues.sq.len(),
            rq_posted: qp.queues.rq.len(),
            reads_outstanding: qp.queues.orq.len(),
            reads_inbound: qp.queues.irq.len(),
            tx_msn: stream.map_or([0; 3], |s| s.tx_msn),
            rx_msn: stream.map_or([0; 3], |s| s.rx_msn),
        })
    }

    /// Every QP number.
    pub fn qpns(&self) -> impl Iterator<Item = u32> + '_ {
        self.qps.keys().copied()
    }

    /// The TCB of a QP's connection.
    pub fn tcb(&self, qpn: u32) -> Option<TcbInfo> {
        let sock = self.qps.get(&qpn)?.conn.as_ref()?.sock;
        self.toe.tcb(sock)
    }

    /// Sets IRD/ORD (IDLE only: they are negotiated at connection setup).
    pub fn set_ird_ord(&mut self, qpn: u32, ird: u16, ord: u16) -> Result<(), EngineError> {
        let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        if qp.state != QpState::Idle || qp.conn.is_some() {
            return Err(EngineError::InvalidState { qpn, state: qp.state, what: "IRD/ORD change outside IDLE" });
        }
        if ird > mpa::IRD_ORD_MAX || ord > mpa::IRD_ORD_MAX {
            return Err(EngineError::Config("IRD/ORD above 16383"));
        }
        qp.config.mpa.ird = ird;
        qp.config.mpa.ord = ord;
        Ok(())
    }

    // ---- work requests ----

    /// Queues a send WR (IDLE or RTS; an IDLE QP sends once connected).
    pub fn post_send(&mut self, qpn: u32, wr: SendWr) -> Result<(), EngineError> {
        let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        if !matches!(qp.state, QpState::Idle | QpState::Rts) {
            return Err(EngineError::InvalidState { qpn, state: qp.state, what: "post_send" });
        }
        let queues = &mut qp.queues;
        if queues.sq.len() >= qp.config.sq_depth as usize {
            return Err(EngineError::QueueFull);
        }
        let seq = queues.next_seq;
        queues.next_seq += 1;
        queues.sq.push_back(qp::SqEntry { wr, seq, sent: 0, checked: false, result: None, refused: None });
        Ok(())
    }

    /// A WQE the device could not parse (bad opcode, flags, SGE count,
    /// inline length: docs/events.md, "bad local WQE"). It takes
    /// its place in the queue and, when the queue reaches it, completes with
    /// `status` (never SUCCESS: that becomes LOC_QP_OP_ERR); the QP goes
    /// to ERROR, through TERMINATE when connected: the peer gets a
    /// TERMINATE "RDMAP local catastrophic", the error being ours. Nothing
    /// after it completes; nothing is posted after a refused receive.
    pub fn post_refused(
        &mut self,
        qpn: u32,
        queue: WorkQueue,
        wr_id: u64,
        status: WcStatus,
    ) -> Result<(), EngineError> {
        let status = if status == WcStatus::Success { WcStatus::LocQpOpErr } else { status };
        match queue {
            WorkQueue::Send => {
                self.post_send(qpn, SendWr::new(wr_id, SendOpcode::Send))?;
                let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
                if let Some(entry) = qp.queues.sq.back_mut() {
                    entry.refused = Some(status);
                }
                // Not connected and nothing ahead of it: its turn is now.
                if qp.conn.is_none() && qp.queues.sq.len() == 1 {
                    fail_refused_send(qp, &mut self.out);
                }
            }
            WorkQueue::Recv => {
                let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
                check_recv_post(qp)?;
                qp.queues.rq_refused = Some(qp::RefusedRecv { wr_id, status });
                if qp.conn.is_none() {
                    let linger = self.config.terminate_linger;
                    fail_due_recv_refusal(qp, &mut self.toe, &mut self.out, Instant::ZERO, linger);
                }
            }
        }
        Ok(())
    }

    /// Queues a receive WR (IDLE, RTS or CLOSING).
    pub fn post_recv(&mut self, qpn: u32, wr: RecvWr) -> Result<(), EngineError> {
        let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        check_recv_post(qp)?;
        qp.queues.rq.push_back(wr);
        Ok(())
    }

    // ---- shared receive queues ----

    /// An SRQ of at most `depth` pooled WRs whose indices start at `start`.
    pub fn create_srq(&mut self, srqn: u32, depth: u32, start: u32) -> Result<(), EngineError> {
        if self.srqs.contains_key(&srqn) {
            return Err(EngineError::SrqExists(srqn));
        }
        if depth == 0 || depth > 1 << 16 {
            return Err(EngineError::Config("SRQ depth must be within 1..=65536"));
        }
        self.srqs.insert(srqn, Srq::new(depth, start));
        Ok(())
    }

    /// Lets SRQ `srqn` pool up to `depth` WRs (a resized ring): never
    /// fewer than it holds or than before. The pooled WRs, their indices
    /// and the one each QP took stay as they are.
    pub fn resize_srq(&mut self, srqn: u32, depth: u32) -> Result<(), EngineError> {
        let srq = self.srqs.get_mut(&srqn).ok_or(EngineError::NoSuchSrq(srqn))?;
        if depth < srq.depth || depth > 1 << 16 {
            return Err(EngineError::Config("an SRQ grows, within 65536"));
        }
        srq.depth = depth;
        Ok(())
    }

    /// Destroys an SRQ no QP uses; the WRs still pooled complete nowhere.
    pub fn destroy_srq(&mut self, srqn: u32) -> Result<(), EngineError> {
        let srq = self.srqs.get(&srqn).ok_or(EngineError::NoSuchSrq(srqn))?;
        if srq.qps > 0 {
            return Err(EngineError::SrqBusy(srqn));
        }
        self.srqs.remove(&srqn);
        Ok(())
    }

    /// Pools a receive WR (the next index) for the QPs of `srqn`.
    pub fn post_srq_recv(&mut self, srqn: u32, wr: RecvWr) -> Result<(), EngineError> {
        self.push_srq(srqn, SrqWr::Posted(wr))
    }

    /// A receive WQE of the SRQ the device could not parse: it takes its
    /// index, and the QP that takes it fails with `status` (never
    /// SUCCESS), as with [`Engine::post_refused`] on an RQ.
    pub fn post_srq_refused(&mut self, srqn: u32, wr_id: u64, status: WcStatus) -> Result<(), EngineError> {
        let status = if status == WcStatus::Success { WcStatus::LocQpOpErr } else { status };
        self.push_srq(srqn, SrqWr::Refused { wr_id, status })
    }

    fn push_srq(&mut self, srqn: u32, wr: SrqWr) -> Result<(), EngineError> {
        let srq = self.srqs.get_mut(&srqn).ok_or(EngineError::NoSuchSrq(srqn))?;
        if srq.is_full() {
            return Err(EngineError::QueueFull);
        }
        srq.push(wr);
        Ok(())
    }

    /// Completes, flushed, the SRQ WR QP `qpn` holds for a message not
    /// finished, as an error would: for a QP whose engine is dropped under
    /// it (the device's address changed), so the WR is not lost.
    pub fn flush_srq_wr(&mut self, qpn: u32) {
        if let Some(qp) = woken(&mut self.qps, &mut self.active, qpn) {
            flush_taken_srq_wr(qp, &mut self.out);
            qp.queues.rq.clear();
            qp.queues.rq_refused = None;
        }
    }

    /// The index after the last WR a QP took from `srqn` (free running).
    pub fn srq_taken(&self, srqn: u32) -> Option<u32> {
        self.srqs.get(&srqn).map(Srq::taken)
    }

    /// WRs pooled in `srqn` and not taken yet.
    pub fn srq_pooled(&self, srqn: u32) -> Option<usize> {
        self.srqs.get(&srqn).map(Srq::len)
    }

    /// Every TCB (`vt3d ctl tcb`).
    pub fn for_each_tcb(&self, f: &mut dyn FnMut(&TcbInfo)) {
        self.toe.for_each_tcb(f);
    }
}

/// Whether a receive WR may be posted to `qp` now.
fn check_recv_post(qp: &Qp) -> Result<(), EngineError> {
    let qpn = qp.qpn;
    if qp.config.srq.is_some() {
        return Err(EngineError::InvalidState { qpn, state: qp.state, what: "post_recv on a QP of an SRQ" });
    }
    if !matches!(qp.state, QpState::Idle | QpState::Rts | QpState::Closing) {
        return Err(EngineError::InvalidState { qpn, state: qp.state, what: "post_recv" });
    }
    if qp.queues.rq_refused.is_some() {
        return Err(EngineError::InvalidState { qpn, state: qp.state, what: "post_recv after a refused receive WQE" });
    }
    // The refused one (if any) takes a slot too.
    if qp.queues.rq.len() >= qp.config.rq_depth as usize {
        return Err(EngineError::QueueFull);
    }
    Ok(())
}

/// A QP an API call wakes, and the QP.
fn woken<'a>(qps: &'a mut BTreeMap<u32, Qp>, active: &mut BTreeSet<u32>, qpn: u32) -> Option<&'a mut Qp> {
    let qp = qps.get_mut(&qpn)?;
    active.insert(qpn);
    Some(qp)
}

/// Nothing for the QP to do until an API call or its socket wakes it: no
/// connection, or one streaming with nothing queued either way, no timer
/// and no data waiting. Anything else is serviced at every poll.
fn quiescent<T: Transport>(qp: &Qp, toe: &T) -> bool {
    let Some(conn) = qp.conn.as_ref() else {
        return true;
    };
    let Some(stream) = conn.stream.as_ref() else {
        return false;
    };
    let queues = &qp.queues;
    qp.state == QpState::Rts
        && matches!(conn.phase, Phase::Streaming)
        && conn.deadline.is_none()
        && !conn.fin_sent
        && stream.tx_hold.is_none()
        && stream.rtr_out.is_none()
        && stream.terminate_out.is_none()
        && queues.sq.is_empty()
        && queues.orq.is_empty()
        && queues.irq.is_empty()
        && queues.rq_refused.is_none()
        && toe.recv_queue(conn.sock) == 0
        && toe.status(conn.sock) == Some(LinkStatus::Established)
}

/// One QP's share of a poll: the MPA exchange, receive, TCP's news,
/// transmit, then the deadlines.
fn service_qp<T: Transport>(
    qp: &mut Qp,
    srq: Option<&mut Srq>,
    toe: &mut T,
    out: &mut Outputs,
    io: &mut Io<'_>,
    now: Instant,
    config: &EngineConfig,
) {
    // Active open: TCP up → MPA request.
    if !cm::send_mpa_request(qp, toe, out, now, config) {
        return;
    }
    fail_due_recv_refusal(qp, toe, out, now, config.terminate_linger);
    // The MPA reply, then FPDUs.
    if cm::receive_mpa_reply(qp, toe, out, now, config) {
        rx::receive_qp(qp, srq, toe, out, io, now, config);
    }
    fail_due_recv_refusal(qp, toe, out, now, config.terminate_linger);
    handle_status(qp, toe, out);
    tx::transmit_qp(qp, toe, out, io, now, config);
    // Deadlines: the MPA reply, the TERMINATE linger.
    let Some(conn) = qp.conn.as_mut() else { return };
    if conn.deadline.is_some_and(|deadline| now >= deadline) {
        conn.deadline = None;
        match conn.phase {
            Phase::AwaitReply { .. } => {
                connect_failed(qp, toe, out, ConnectFailure::MpaTimeout, true);
            }
            _ => {
                toe.abort(conn.sock);
                connection_ended(qp, toe, out, CloseReason::Aborted);
            }
        }
    }
}
