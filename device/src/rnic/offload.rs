//! The iWARP engine behind the RNIC: one per guest address (it is the TOE
//! for that IPv4 address and MAC), its connection commands (LISTEN …
//! DISCONNECT), and its events turned into driver events
//! (docs/architecture.md §5).

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddrV4};

use vm_memory::GuestMemory;
use vt3_iwarp::engine::{
    self, ConnId, ConnectFailure, ConnectParams, ConnectRequest, Engine, EngineConfig, EngineError, Event, EventKind,
    Io, QpConfig, WcStatus, WorkQueue,
};
use vt3_iwarp::toe::{self, CloseReason, Duration, FourTuple, SmolToe, TcpConfig, TcpError};
use vt3_iwarp::wire::terminate::TermCode;

use super::memory::GuestRam;
use super::pairing::PendingPair;
use super::poll::{PolledQueue, Trigger};
use super::{le, CmdResult, GuestAddr, Instant, Rnic};
use crate::abi::{
    CmdAccept, CmdConnect, CmdDisconnect, CmdListen, CmdReject, Event as AbiEvent, EventCm, EventType, PrivateData,
    QpEvent, QpState, SockAddr, Status, VT3_MAX_PRIVATE_DATA,
};

/// Listening ports per guest (each holds up to a backlog of sockets).
const MAX_LISTENERS: usize = 32;
/// Smallest TCP socket buffer (so window) of an offloaded connection.
const MIN_WINDOW: usize = 64 * 1024;
/// Largest: beyond it a datagram uplink's queue overflows long before
/// the window is used.
const MAX_WINDOW: usize = 1024 * 1024;
/// Full-size segments a window holds at least, whatever the MTU: with
/// fewer, a jumbo-frame connection waits for an ACK after every segment.
const MIN_WINDOW_SEGMENTS: usize = 4;
/// Full windows (each way) the socket buffers of all connections add up
/// to: this many busy connections keep full windows; beyond, a new one
/// gets an equal share of the budget, then two segments each way once it
/// is spent (`TcpConfig::buffer_sizes`). A window past the uplink's
/// queue only queues (docs/architecture.md §8), so the aggregate, not the
/// count of connections, is what the budget follows.
const BUDGET_WINDOWS: usize = 64;
/// Frames the TOE sends per engine poll: a budget per wake-up so the
/// guest's rings get their turn, not pacing — work left over resumes at
/// once (vhost/backend.rs), and the uplink's send queue holds a burst the
/// socket cannot take yet.
const TOE_BURST: usize = 64;
/// Delayed-ACK time: a lone segment at the end of a window is acknowledged
/// within it (smoltcp's 10 ms default stalls a window-limited flow), long
/// enough for a ping-pong's answer to carry the ACK. Two full segments are
/// acknowledged at once anyway.
const ACK_DELAY: Duration = Duration::from_millis(1);
/// Engine polls per service call when handling its output gave it new
/// work (WQEs fetched on RTS, a deferred close).
const MAX_POLL_ROUNDS: usize = 4;

/// `detail` of VT3_QPE_RESET: the peer's RST ended the connection …
const RESET_RECEIVED: u32 = 0;
/// … or an RST vt3d sent on its own (fault injection).
const RESET_SENT: u32 = 1;

/// A connection request reported to the driver and not yet answered.
#[derive(Debug, Clone, Copy)]
struct Request {
    conn: ConnId,
    tuple: FourTuple,
}

/// The engine for one guest address.
#[derive(Debug)]
pub struct Offload {
    pub(super) engine: Engine<SmolToe>,
    mac: [u8; 6],
    ip: Ipv4Addr,
    /// conn_id (as the driver knows it) → the engine's pending connection.
    requests: BTreeMap<u32, Request>,
    last_conn_id: u32,
    listening: BTreeSet<u16>,
    /// Pairs of QPs being connected by modify_qp, by listening port.
    pub(super) pairs: BTreeMap<u16, PendingPair>,
}

impl Offload {
    fn new(
        addr: &GuestAddr,
        mtu: u32,
        window: usize,
        max_qp: u32,
        now: Instant,
        timeout: Duration,
    ) -> Result<Self, TcpError> {
        let ip = Ipv4Addr::from(addr.ipv4);
        let mut tcp = TcpConfig::new(addr.mac, ip);
        // A dead peer (or a blackhole) is noticed within `timeout`.
        tcp.set_user_timeout(timeout);
        tcp.mtu = usize::try_from(mtu).unwrap_or(usize::MAX);
        // See toe_window: the peer's datagram queue drops what it cannot
        // hold, congestion control backs off when it does.
        tcp.rx_buffer = window;
        tcp.tx_buffer = window;
        tcp.buffer_budget = 2 * BUDGET_WINDOWS * window;
        let max_qps = usize::try_from(max_qp).unwrap_or(usize::MAX);
        // A connection per QP, and on every listening port its backlog.
        tcp.max_sockets = max_qps.saturating_add(MAX_LISTENERS * toe::MAX_BACKLOG);
        tcp.max_burst = TOE_BURST;
        tcp.ack_delay = Some(ACK_DELAY);
        // Initial sequence numbers and ports differ from run to run.
        tcp.seed = RandomState::new().build_hasher().finish();
        let toe = SmolToe::new(tcp, now)?;
        Ok(Self {
            engine: Engine::new(toe, EngineConfig { max_qps, ..EngineConfig::default() }),
            mac: addr.mac,
            ip,
            requests: BTreeMap::new(),
            last_conn_id: 0,
            listening: BTreeSet::new(),
            pairs: BTreeMap::new(),
        })
    }

    pub fn engine(&self) -> &Engine<SmolToe> {
        &self.engine
    }

    pub fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    pub(super) fn mac(&self) -> [u8; 6] {
        self.mac
    }

    fn new_conn_id(&mut self) -> u32 {
        // At most max_pending requests are open, so this ends quickly.
        loop {
            self.last_conn_id = self.last_conn_id.wrapping_add(1).max(1);
            if !self.requests.contains_key(&self.last_conn_id) {
                return self.last_conn_id;
            }
        }
    }

    /// A local address of ours: our IP (or 0) and a non-zero port.
    fn local_port(&self, local: &SockAddr) -> Result<u16, Status> {
        let ip = Ipv4Addr::from(local.ipv4);
        let port = u16::from_be_bytes(local.port);
        if port == 0 || !(ip.is_unspecified() || ip == self.ip) {
            return Err(Status::Invalid);
        }
        Ok(port)
    }

    /// A peer: a unicast address and a non-zero port, other than the
    /// local end itself. Our own address is a loopback connection.
    fn remote(&self, remote: &SockAddr, local_port: u16) -> Result<SocketAddrV4, Status> {
        let ip = Ipv4Addr::from(remote.ipv4);
        let port = u16::from_be_bytes(remote.port);
        if port == 0 || ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(Status::Invalid);
        }
        if ip == self.ip && port == local_port {
            return Err(Status::Invalid);
        }
        Ok(SocketAddrV4::new(ip, port))
    }

    /// Device fatal: every QP to ERROR (RST on live connections), every
    /// listener and unanswered request dropped, and whatever the engine
    /// reported about it discarded (VT3_EV_DEVICE_FATAL says it all).
    pub(super) fn abandon_all(&mut self, now: Instant) {
        let qpns: Vec<u32> = self.engine.qpns().collect();
        for qpn in qpns {
            let _ = self.engine.modify_qp(now, qpn, engine::QpState::Error);
        }
        for port in std::mem::take(&mut self.listening) {
            self.engine.unlisten(port);
        }
        for port in std::mem::take(&mut self.pairs).into_keys() {
            self.engine.unlisten(port);
        }
        self.requests.clear();
        while self.engine.pop_completion().is_some() {}
        while self.engine.pop_event().is_some() {}
    }

    pub(super) fn set_ird_ord(&mut self, qpn: u32, ird: u32, ord: u32) -> Result<(), Status> {
        let narrow = |v: u32| u16::try_from(v).map_err(|_| Status::Invalid);
        self.engine.set_ird_ord(qpn, narrow(ird)?, narrow(ord)?).map_err(status)
    }
}

/// The response status for an engine refusal.
/// The TCP window (socket buffers) of offloaded connections at `mtu` on an
/// uplink whose receive queue holds `queue` octets: half of it, as the peer
/// is assumed to run the same uplink (a window past the peer's queue only
/// turns into drops), at least [`MIN_WINDOW_SEGMENTS`] full segments and
/// [`MIN_WINDOW`], at most [`MAX_WINDOW`]. Buffers are allocated zeroed, so
/// an idle connection's pages stay untouched (not resident).
pub(super) fn toe_window(mtu: u32, queue: Option<usize>) -> usize {
    let mss = usize::try_from(mtu).unwrap_or(usize::MAX).saturating_sub(40);
    let from_queue = queue.map_or(MIN_WINDOW, |q| q / 2);
    from_queue.clamp(MIN_WINDOW, MAX_WINDOW).max(mss.saturating_mul(MIN_WINDOW_SEGMENTS)).min(MAX_WINDOW)
}

pub(super) fn status(e: EngineError) -> Status {
    match e {
        EngineError::NoSuchQp(_) | EngineError::NoSuchSrq(_) | EngineError::NoSuchConnection => Status::NotFound,
        EngineError::QpExists(_)
        | EngineError::SrqExists(_)
        | EngineError::SrqBusy(_)
        | EngineError::Transport(TcpError::PortInUse(_)) => Status::Busy,
        EngineError::TooManyQps | EngineError::QueueFull | EngineError::Transport(TcpError::NoResources) => {
            Status::NoResource
        }
        EngineError::InvalidState { .. }
        | EngineError::FaultNotApplicable { .. }
        | EngineError::Transport(TcpError::InvalidState) => Status::State,
        EngineError::PrivateDataTooLong(_)
        | EngineError::Config(_)
        | EngineError::Transport(_)
        | EngineError::Negotiation(_) => Status::Invalid,
    }
}

/// The same states, as the engine names them (values are `VT3_QPS_*`).
pub(super) fn engine_state(s: QpState) -> engine::QpState {
    match s {
        QpState::Idle => engine::QpState::Idle,
        QpState::Rts => engine::QpState::Rts,
        QpState::Closing => engine::QpState::Closing,
        QpState::Terminate => engine::QpState::Terminate,
        QpState::Error => engine::QpState::Error,
    }
}

fn device_state(s: engine::QpState) -> QpState {
    match s {
        engine::QpState::Idle => QpState::Idle,
        engine::QpState::Rts => QpState::Rts,
        engine::QpState::Closing => QpState::Closing,
        engine::QpState::Terminate => QpState::Terminate,
        engine::QpState::Error => QpState::Error,
    }
}

fn errno(e: i32) -> u32 {
    e.unsigned_abs()
}

/// CONNECT_REPLY status for a failed active open (a positive errno).
fn connect_errno(failure: &ConnectFailure) -> u32 {
    errno(match failure {
        ConnectFailure::Rejected { .. } => libc::ECONNREFUSED,
        ConnectFailure::Tcp(CloseReason::Timeout) | ConnectFailure::MpaTimeout => libc::ETIMEDOUT,
        ConnectFailure::Tcp(CloseReason::Aborted) => libc::ECONNABORTED,
        ConnectFailure::Tcp(CloseReason::Reset | CloseReason::Graceful) | ConnectFailure::PeerClosed => {
            libc::ECONNRESET
        }
        ConnectFailure::Mpa(_) => libc::EPROTO,
    })
}

/// `detail` of the TERMINATE events: layer << 12 | etype << 8 | ecode.
fn term_detail(code: TermCode) -> u32 {
    let (layer, etype, ecode) = code.fields();
    u32::from(layer & 0xf) << 12 | u32::from(etype & 0xf) << 8 | u32::from(ecode)
}

fn sockaddr(a: SocketAddrV4) -> SockAddr {
    SockAddr { ipv4: a.ip().octets(), port: a.port().to_be_bytes(), reserved: 0.into() }
}

/// The used part of a command's private data.
fn private_data(pd: &PrivateData, len: u16) -> Result<&[u8], Status> {
    if usize::from(len) > VT3_MAX_PRIVATE_DATA {
        return Err(Status::Invalid);
    }
    Ok(pd.get(len))
}

/// Fields of a connection event.
struct Cm<'a> {
    conn_id: u32,
    qpn: u32,
    status: u32,
    ird: u32,
    ord: u32,
    tuple: Option<FourTuple>,
    private_data: &'a [u8],
}

impl Cm<'_> {
    fn body(&self) -> EventCm {
        let mut pd = PrivateData::default();
        let len = self.private_data.len().min(VT3_MAX_PRIVATE_DATA);
        if let (Some(dst), Some(src)) = (pd.0.get_mut(..len), self.private_data.get(..len)) {
            dst.copy_from_slice(src);
        }
        EventCm {
            conn_id: self.conn_id.into(),
            qpn: self.qpn.into(),
            status: self.status.into(),
            ird: self.ird.into(),
            ord: self.ord.into(),
            pd_len: u16::try_from(len).unwrap_or(0).into(),
            reserved: 0.into(),
            local: self.tuple.map(|t| sockaddr(t.local)).unwrap_or_default(),
            remote: self.tuple.map(|t| sockaddr(t.remote)).unwrap_or_default(),
            private_data: pd,
        }
    }
}

impl Rnic {
    /// How many octets the uplink's receive queue holds (`None`: unknown):
    /// sizes the TCP windows of engines started from now on ([`toe_window`]).
    pub fn set_uplink_queue(&mut self, octets: Option<usize>) {
        self.uplink_queue = octets;
    }

    /// How many frames the uplink's send queue takes now: the next
    /// [`Rnic::service`] sends no more (TCP keeps the rest in its buffers
    /// rather than lose it to a full queue).
    pub fn set_uplink_room(&mut self, frames: usize) {
        self.uplink_room = frames;
    }

    /// VT3_CMD_SET_ADDR: starts the engine for the address, or a new one if
    /// the address changed (connections of the old one are lost: their QPs
    /// go to ERROR). IPv4 0.0.0.0 stops the engine.
    pub(super) fn set_addr<M: GuestMemory>(&mut self, mem: &M, now: Instant, addr: GuestAddr) -> Result<(), Status> {
        let ip = Ipv4Addr::from(addr.ipv4);
        let unchanged = match &self.offload {
            Some(o) => o.mac == addr.mac && o.ip == ip,
            None => ip.is_unspecified(),
        };
        if !unchanged {
            let offload = if ip.is_unspecified() {
                None
            } else {
                let window = toe_window(self.mtu, self.uplink_queue);
                let o =
                    Offload::new(&addr, self.mtu, window, self.limits.max_qp, now, self.tcp_timeout).map_err(|e| {
                        log::warn!("no TCP offload for {ip}: {e}");
                        Status::Invalid
                    })?;
                Some(o)
            };
            self.replace_offload(mem, now, offload);
        }
        self.addr = Some(addr);
        Ok(())
    }

    fn replace_offload<M: GuestMemory>(&mut self, mem: &M, now: Instant, offload: Option<Offload>) {
        // Whatever the old engine produced still reaches the guest, and so
        // does the SRQ WQE a QP had taken for a message it will not finish.
        if let Some(old) = self.offload.as_mut() {
            for (qpn, _) in self.qps.iter().filter(|(_, qp)| qp.srqn != 0) {
                old.engine.flush_srq_wr(qpn);
            }
        }
        self.pump(now, mem);
        let pair_listeners = self.pair_listeners();
        self.offload = offload;
        // SRQs first: QPs attach to them.
        let srqns: Vec<u32> = self.srqs.iter().map(|(srqn, _)| srqn).collect();
        for &srqn in &srqns {
            if let Err(e) = self.attach_srq(srqn) {
                log::warn!("SRQ {srqn}: the new engine refused it: {e}");
            }
        }
        let qpns: Vec<u32> = self.qps.iter().map(|(qpn, _)| qpn).collect();
        for &qpn in &qpns {
            let Some(qp) = self.qps.get_mut(qpn) else { continue };
            let (state, connecting) = (qp.state, qp.connecting);
            // A pair's listener, whose connection had not come in yet.
            let waiting = pair_listeners.contains(&qpn);
            qp.tuple = None;
            qp.conn_id = 0;
            // WQEs not yet retired are still in the ring: fetch them again.
            qp.sq_work.fetched = qp.sq_work.consumed;
            qp.rq_work.fetched = qp.rq_work.consumed;
            if let Err(e) = self.attach_qp(qpn) {
                log::warn!("QP {qpn}: the new engine refused it: {e}");
            }
            if connecting {
                self.connect_reply(qpn, errno(libc::ECONNABORTED), &[]);
            } else if waiting || matches!(state, QpState::Rts | QpState::Closing | QpState::Terminate) {
                self.qp_event(qpn, QpEvent::Reset, 0);
            }
            // Like any failed connection, an interrupted one leaves ERROR.
            if state != QpState::Idle || connecting || waiting {
                match self.offload.as_mut() {
                    Some(o) => {
                        let _ = o.engine.modify_qp(now, qpn, engine::QpState::Error);
                    }
                    None => self.set_qp_state(mem, qpn, QpState::Error),
                }
            }
        }
        self.pump(now, mem);
        for srqn in srqns {
            self.fetch_srq(mem, now, srqn, Trigger::Device);
        }
        for qpn in qpns {
            self.fetch(mem, now, qpn, WorkQueue::Recv, Trigger::Device);
            self.fetch(mem, now, qpn, WorkQueue::Send, Trigger::Device);
        }
    }

    /// Creates the engine's side of QP `qpn` (nothing without an engine).
    pub(super) fn attach_qp(&mut self, qpn: u32) -> Result<(), EngineError> {
        let (Some(offload), Some(qp)) = (self.offload.as_mut(), self.qps.get(qpn)) else {
            return Ok(());
        };
        let mut config = QpConfig::new(qp.pdn);
        config.sq_depth = qp.sq.depth;
        // A QP of an SRQ has no RQ: the engine wants a depth all the same.
        config.rq_depth = qp.rq.depth.max(1);
        config.srq = (qp.srqn != 0).then_some(qp.srqn);
        config.mpa.ird = u16::try_from(qp.ird).unwrap_or(u16::MAX);
        config.mpa.ord = u16::try_from(qp.ord).unwrap_or(u16::MAX);
        offload.engine.create_qp(qpn, config)
    }

    fn check_ird_ord(&self, ird: u32, ord: u32) -> Result<(u32, u32), Status> {
        if ird > self.limits.max_ird || ord > self.limits.max_ord {
            return Err(Status::Invalid);
        }
        Ok((ird, ord))
    }

    pub(super) fn listen(&mut self, a: &CmdListen) -> CmdResult {
        let offload = self.offload.as_mut().ok_or(Status::State)?;
        let port = offload.local_port(&a.local)?;
        if offload.listening.contains(&port) {
            return Err(Status::Busy);
        }
        if offload.listening.len() >= MAX_LISTENERS {
            return Err(Status::NoResource);
        }
        let backlog = usize::try_from(le(a.backlog)).unwrap_or(toe::MAX_BACKLOG).clamp(1, toe::MAX_BACKLOG);
        offload.engine.listen(port, backlog).map_err(status)?;
        offload.listening.insert(port);
        Ok(Vec::new())
    }

    pub(super) fn unlisten(&mut self, a: &CmdListen) -> CmdResult {
        let offload = self.offload.as_mut().ok_or(Status::State)?;
        let port = offload.local_port(&a.local)?;
        if !offload.listening.remove(&port) {
            return Err(Status::NotFound);
        }
        // Unanswered requests on the port are withdrawn (events follow).
        offload.engine.unlisten(port);
        Ok(Vec::new())
    }

    pub(super) fn connect(&mut self, now: Instant, a: &CmdConnect) -> CmdResult {
        let qpn = le(a.qpn);
        let (ird, ord) = self.check_ird_ord(le(a.ird), le(a.ord))?;
        let pd = private_data(&a.private_data, a.pd_len.to_native())?;
        let offload = self.offload.as_mut().ok_or(Status::State)?;
        let qp = self.qps.get_mut(qpn).ok_or(Status::NotFound)?;
        if qp.state != QpState::Idle || qp.connecting || qp.spent {
            return Err(Status::State);
        }
        let local_port = offload.local_port(&a.local)?;
        let remote = offload.remote(&a.remote, local_port)?;
        if !vt3_iwarp::toe::frame::is_unicast(a.next_hop) {
            return Err(Status::Invalid);
        }
        // To our own address the TOE loops the connection back inside
        // (as a T3 does): its frames go to our own MAC, whatever the
        // driver's route said.
        let next_hop = if *remote.ip() == offload.ip { offload.mac } else { a.next_hop };
        offload.set_ird_ord(qpn, ird, ord)?;
        (qp.ird, qp.ord) = (ird, ord);
        let params = ConnectParams { local_port, remote, next_hop, private_data: pd.to_vec() };
        offload.engine.connect(now, qpn, params).map_err(status)?;
        qp.connecting = true;
        qp.conn_id = 0;
        qp.tuple = Some(FourTuple { local: SocketAddrV4::new(offload.ip, local_port), remote });
        Ok(Vec::new())
    }

    pub(super) fn accept<M: GuestMemory>(&mut self, mem: &M, now: Instant, a: &CmdAccept) -> CmdResult {
        let (conn_id, qpn) = (le(a.conn_id), le(a.qpn));
        let (ird, ord) = self.check_ird_ord(le(a.ird), le(a.ord))?;
        let pd = private_data(&a.private_data, a.pd_len.to_native())?;
        let offload = self.offload.as_mut().ok_or(Status::State)?;
        let request = *offload.requests.get(&conn_id).ok_or(Status::NotFound)?;
        let qp = self.qps.get_mut(qpn).ok_or(Status::NotFound)?;
        if qp.state != QpState::Idle || qp.connecting || qp.spent {
            return Err(Status::State);
        }
        offload.set_ird_ord(qpn, ird, ord)?;
        (qp.ird, qp.ord) = (ird, ord);
        match offload.engine.accept(now, request.conn, qpn, pd) {
            Ok(()) => {}
            Err(EngineError::NoSuchConnection) => {
                offload.requests.remove(&conn_id);
                return Err(Status::NotFound);
            }
            Err(e) => return Err(status(e)),
        }
        offload.requests.remove(&conn_id);
        qp.conn_id = conn_id;
        qp.tuple = Some(request.tuple);
        // ESTABLISHED follows the response.
        self.pump(now, mem);
        Ok(Vec::new())
    }

    pub(super) fn reject(&mut self, a: &CmdReject) -> CmdResult {
        let conn_id = le(a.conn_id);
        let pd = private_data(&a.private_data, a.pd_len.to_native())?;
        let offload = self.offload.as_mut().ok_or(Status::State)?;
        let request = *offload.requests.get(&conn_id).ok_or(Status::NotFound)?;
        let result = offload.engine.reject(request.conn, pd);
        if matches!(result, Ok(()) | Err(EngineError::NoSuchConnection)) {
            offload.requests.remove(&conn_id);
        }
        result.map_err(status)?;
        Ok(Vec::new())
    }

    /// DISCONNECT: abortive (RST, QP → ERROR) or graceful: the FIN goes
    /// out once every send WQE posted so far has completed.
    pub(super) fn disconnect<M: GuestMemory>(&mut self, mem: &M, now: Instant, a: &CmdDisconnect) -> CmdResult {
        let qpn = le(a.qpn);
        let abort = match le(a.abort) {
            0 => false,
            1 => true,
            _ => return Err(Status::Invalid),
        };
        let offload = self.offload.as_mut().ok_or(Status::State)?;
        let qp = self.qps.get(qpn).ok_or(Status::NotFound)?;
        let (state, spent) = (qp.state, qp.spent);
        if abort {
            offload.engine.modify_qp(now, qpn, engine::QpState::Error).map_err(status)?;
        } else {
            match state {
                QpState::Rts => {}
                // The connection is ending already, or is over: the peer's
                // close completed before the driver heard of it (librdmacm's
                // rdma_disconnect() after the peer's FIN). Nothing to do.
                QpState::Closing | QpState::Terminate | QpState::Error => return Ok(Vec::new()),
                QpState::Idle if spent => return Ok(Vec::new()),
                QpState::Idle => return Err(Status::State),
            }
            self.fetch(mem, now, qpn, WorkQueue::Send, Trigger::Device);
            let qp = self.qps.get_mut(qpn).ok_or(Status::NotFound)?;
            if qp.sq_work.fetched == qp.sq_work.consumed {
                self.start_close(now, qpn);
            } else {
                qp.close_requested = true;
            }
        }
        self.pump(now, mem);
        Ok(Vec::new())
    }

    /// The graceful close (FIN); true if the engine started it.
    pub(super) fn start_close(&mut self, now: Instant, qpn: u32) -> bool {
        let Some(offload) = self.offload.as_mut() else { return false };
        match offload.engine.modify_qp(now, qpn, engine::QpState::Closing) {
            Ok(()) => true,
            Err(e) => {
                log::debug!("QP {qpn}: no graceful close: {e}");
                false
            }
        }
    }

    /// The guest is gone: every connection is reset (so peers learn it at
    /// once instead of timing out) and the RSTs are sent. Guest memory is
    /// no longer mapped, so the engine runs over none; QPs in ERROR touch
    /// none.
    pub fn abort_connections(&mut self, now: Instant, uplink: &mut dyn FnMut(&[u8])) {
        let Some(offload) = self.offload.as_mut() else { return };
        let qpns: Vec<u32> = offload.engine.qpns().collect();
        for qpn in qpns {
            let _ = offload.engine.modify_qp(now, qpn, engine::QpState::Error);
        }
        let ports: Vec<u16> = offload.listening.iter().copied().collect();
        for port in ports {
            offload.engine.unlisten(port);
        }
        let none = vm_memory::GuestMemoryMmap::<()>::new();
        let mut ram = GuestRam(&none);
        offload.engine.poll(now, &mut Io { memory: &mut ram, regions: &mut self.tpt, uplink });
    }

    // ---- the engine at work ----

    /// Demux: does this uplink frame belong to an offloaded connection or
    /// a listening port?
    pub fn wants(&self, frame: &[u8]) -> bool {
        self.offload.as_ref().is_some_and(|o| o.engine.wants(frame))
    }

    /// One uplink frame the engine [`Rnic::wants`]; replies go to `uplink`.
    pub fn receive(&mut self, now: Instant, frame: &[u8], uplink: &mut dyn FnMut(&[u8])) {
        if let Some(o) = self.offload.as_mut() {
            o.engine.receive(now, frame, uplink);
        }
    }

    /// Runs the engine (timers, received data, transmission; frames go to
    /// `uplink`) and delivers its output: CQEs, status pages, events.
    /// Returns when to run it again at the latest.
    pub fn service<M: GuestMemory>(&mut self, now: Instant, mem: &M, uplink: &mut dyn FnMut(&[u8])) -> Option<Instant> {
        self.device_fatal(mem, now);
        if let Some(offload) = self.offload.as_mut() {
            offload.engine.set_egress_room(self.uplink_room);
        }
        self.service_rings(now, mem);
        self.poll_queues(now, mem);
        for _ in 0..MAX_POLL_ROUNDS {
            self.fetch_starved_receives(mem, now);
            let offload = self.offload.as_mut()?;
            let mut ram = GuestRam(mem);
            offload.engine.poll(now, &mut Io { memory: &mut ram, regions: &mut self.tpt, uplink: &mut *uplink });
            if !self.pump(now, mem) {
                break;
            }
        }
        let next = self.offload.as_mut()?.engine.poll_at(now);
        // WQEs left by a fetch budget, or a ring gone bad: run again soon.
        if !self.fetch_pending.is_empty() || !self.ring_faults.is_empty() || !self.srq_fetch_pending.is_empty() {
            return Some(now);
        }
        next
    }

    /// How many work queues may be polled at once (`--poll-queues`; 0:
    /// none, every post to an idle queue rings its doorbell).
    pub fn set_poll_queues(&mut self, n: usize) {
        self.polled.set_capacity(n);
    }

    /// A look that found nothing gave the core away and got it back late
    /// (`poll::CONTENDED_YIELD`): polling pauses (`PollSet::pause`).
    pub fn polling_contended(&mut self, now: Instant) {
        self.polled.pause(now);
    }

    /// Whether vt3d polls some queue now: its worker should come back at
    /// once to [`Rnic::poll_queues`] instead of sleeping.
    pub fn polling(&self) -> bool {
        !self.polled.is_empty()
    }

    /// Looks once at every polled queue: takes the WQEs the guest posted
    /// since (it rang no doorbell: the IDLE flag was clear), and hands the
    /// queues whose window ended back to the doorbells. Returns whether it
    /// took any (the engine has work).
    pub fn poll_queues<M: GuestMemory>(&mut self, now: Instant, mem: &M) -> bool {
        let mut pass = std::mem::take(&mut self.poll_pass);
        pass.clear();
        pass.extend_from_slice(self.polled.queues());
        let mut found = false;
        for &queue in &pass {
            self.poll_looks += 1;
            let took = match queue {
                PolledQueue::Qp(qpn, wq) => self.fetch(mem, now, qpn, wq, Trigger::Poll),
                PolledQueue::Srq(srqn) => self.fetch_srq(mem, now, srqn, Trigger::Poll),
            };
            if took {
                self.poll_finds += 1;
                found = true;
            }
        }
        self.poll_pass = pass;
        found
    }

    /// When the first polling window ends (a look then hands its queue
    /// back to the doorbells; the worker looks after every pass while
    /// [`Rnic::polling`]).
    pub fn poll_deadline(&self) -> Option<Instant> {
        let until = |queue: &PolledQueue| match *queue {
            PolledQueue::Qp(qpn, wq) => self.qps.get(qpn).and_then(|qp| qp.poll_window(wq).until()),
            PolledQueue::Srq(srqn) => self.srqs.get(srqn).and_then(|srq| srq.poll.until()),
        };
        self.polled.queues().iter().filter_map(until).min()
    }

    /// Reads the receive ring of every QP with data waiting and no receive
    /// WQE: a SEND is refused for want of a buffer only if the guest has
    /// posted none by the time it is placed, not because the doorbell for
    /// one was still in the TX queue behind the peer's data, or left for
    /// the next pass by a fetch budget.
    fn fetch_starved_receives<M: GuestMemory>(&mut self, mem: &M, now: Instant) {
        let Some(offload) = self.offload.as_ref() else { return };
        let starved: Vec<u32> = offload.engine.starved_receive_queues().collect();
        let mut srqs_read = Vec::new();
        for qpn in starved {
            // An SRQ once per pass, however many of its QPs wait.
            let srqn = self.qps.get(qpn).map_or(0, |qp| qp.srqn);
            if srqn != 0 {
                if srqs_read.contains(&srqn) {
                    continue;
                }
                srqs_read.push(srqn);
            }
            self.fetch(mem, now, qpn, WorkQueue::Recv, Trigger::Device);
        }
    }

    /// Continues fetches that spent their budget, and sends the QPs whose
    /// producer index was impossible to ERROR (the guest broke its ring:
    /// nothing in it can be trusted, so nothing more is read from it).
    fn service_rings<M: GuestMemory>(&mut self, now: Instant, mem: &M) {
        for (qpn, queue) in std::mem::take(&mut self.fetch_pending) {
            self.fetch(mem, now, qpn, queue, Trigger::Device);
        }
        self.service_srq_rings(mem, now);
        for (qpn, _queue) in std::mem::take(&mut self.ring_faults) {
            let Some(offload) = self.offload.as_mut() else { continue };
            if self.qps.get(qpn).is_none() {
                continue;
            }
            self.qp_ring_errors += 1;
            if offload.engine.qp_state(qpn) == Some(engine::QpState::Error) {
                continue;
            }
            let _ = offload.engine.modify_qp(now, qpn, engine::QpState::Error);
            // Reported as a bad WQE (QP_REQ_ERR): the queue's contents are
            // what is malformed.
            self.qp_event(qpn, QpEvent::BadWqe, WcStatus::LocQpOpErr as u32);
        }
        self.pump(now, mem);
    }

    /// Delivers what the engine produced, completions first (they precede
    /// any state change reported with them). Returns whether the engine
    /// got new work meanwhile.
    pub(super) fn pump<M: GuestMemory>(&mut self, now: Instant, mem: &M) -> bool {
        let mut more = false;
        loop {
            while let Some(offload) = self.offload.as_mut() {
                if let Some(c) = offload.engine.pop_completion() {
                    more |= self.complete(mem, now, &c);
                    continue;
                }
                let Some(event) = offload.engine.pop_event() else { break };
                more |= self.engine_event(mem, now, event);
            }
            // Ending a pair makes events of its own.
            if !self.end_broken_pairs(now) {
                break;
            }
        }
        self.sync_srqs(mem);
        self.report_last_wqe();
        more
    }

    fn engine_event<M: GuestMemory>(&mut self, mem: &M, now: Instant, event: Event) -> bool {
        match (event.qpn, event.conn, event.kind) {
            (_, Some(conn), EventKind::ConnectRequest(request)) => {
                if !self.pair_request(now, conn, &request) {
                    self.connect_request(conn, &request);
                }
            }
            (_, Some(conn), EventKind::ConnectWithdrawn) => {
                // The driver learns it when it answers (NOT_FOUND).
                if let Some(o) = self.offload.as_mut() {
                    o.requests.retain(|_, r| r.conn != conn);
                }
            }
            (_, _, EventKind::ConnectRefused { tuple, refusal }) => {
                log::info!("connection {tuple:?} refused by the engine: {refusal:?}");
            }
            (Some(qpn), _, kind) => return self.qp_engine_event(mem, now, qpn, kind),
            (None, _, kind) => log::debug!("engine event without a QP: {kind:?}"),
        }
        false
    }

    /// VT3_EV_CONNECT_REQUEST. IRD/ORD are from the listener's side, capped
    /// by the device (as siw reports them): ours to offer = the peer's
    /// ORD/IRD; an MPA revision 1 peer sends none, so the device maximum.
    fn connect_request(&mut self, conn: ConnId, request: &ConnectRequest) {
        let limits = self.limits;
        let busy = self.events.len() >= super::MAX_PENDING_EVENTS;
        let Some(offload) = self.offload.as_mut() else { return };
        if busy {
            // The driver is not taking events: refuse, as a full backlog
            // would, rather than queue events without end.
            self.requests_refused_busy += 1;
            log::debug!("connection request {:?} refused: {} driver events pending", request.tuple, self.events.len());
            let _ = offload.engine.reject(conn, &[]);
            return;
        }
        let conn_id = offload.new_conn_id();
        offload.requests.insert(conn_id, Request { conn, tuple: request.tuple });
        let cap = |v: Option<u16>, max: u32| v.map_or(max, |v| u32::from(v).min(max));
        let cm = Cm {
            conn_id,
            qpn: 0,
            status: 0,
            ird: cap(request.ord, limits.max_ird),
            ord: cap(request.ird, limits.max_ord),
            tuple: Some(request.tuple),
            private_data: &request.private_data,
        };
        self.push_event(EventType::ConnectRequest, &cm.body());
    }

    fn qp_engine_event<M: GuestMemory>(&mut self, mem: &M, now: Instant, qpn: u32, kind: EventKind) -> bool {
        match kind {
            EventKind::StateChanged { to, .. } => {
                let to = device_state(to);
                // An active open cut short by the host still gets its reply.
                if to == QpState::Error && self.qps.get(qpn).is_some_and(|qp| qp.connecting) {
                    self.connect_reply(qpn, errno(libc::ECONNABORTED), &[]);
                }
                self.set_qp_state(mem, qpn, to);
                if to == QpState::Rts {
                    let recv = self.fetch(mem, now, qpn, WorkQueue::Recv, Trigger::Device);
                    return self.fetch(mem, now, qpn, WorkQueue::Send, Trigger::Device) || recv;
                }
            }
            EventKind::Established { negotiated, private_data } => {
                let Some(qp) = self.qps.get_mut(qpn) else { return false };
                (qp.ird, qp.ord) = (negotiated.ird.into(), negotiated.ord.into());
                qp.established = Some(self.conns.next_seq());
                if qp.connecting {
                    self.connect_reply(qpn, 0, &private_data);
                } else {
                    let cm = Cm {
                        conn_id: qp.conn_id,
                        qpn,
                        status: 0,
                        ird: qp.ird,
                        ord: qp.ord,
                        tuple: qp.tuple,
                        private_data: &private_data,
                    };
                    self.push_event(EventType::Established, &cm.body());
                }
                self.fire_armed(now, qpn);
            }
            EventKind::ConnectFailed(failure) => {
                let pd = match &failure {
                    ConnectFailure::Rejected { private_data } => private_data.as_slice(),
                    _ => &[],
                };
                self.connect_reply(qpn, connect_errno(&failure), pd);
            }
            EventKind::PeerClose => self.qp_event(qpn, QpEvent::PeerClose, 0),
            EventKind::CloseComplete { sq_outstanding } => {
                self.qp_event(qpn, QpEvent::CloseComplete, u32::from(sq_outstanding));
            }
            EventKind::Reset => self.qp_event(qpn, QpEvent::Reset, RESET_RECEIVED),
            // `vt3d ctl fault rst`: reported as a reset (QP_FATAL,
            // -ECONNRESET), detail 1: this end sent it.
            EventKind::ResetSent => self.qp_event(qpn, QpEvent::Reset, RESET_SENT),
            EventKind::Timeout => self.qp_event(qpn, QpEvent::Timeout, 0),
            EventKind::TerminateReceived { code, .. } => {
                log::info!("QP {qpn}: TERMINATE received ({code:?})");
                self.qp_event(qpn, QpEvent::TerminateReceived, term_detail(code));
            }
            EventKind::LocalError { error, sent } => {
                // Rare, and what a TERMINATE's peer needs explained.
                log::info!("QP {qpn}: {error}: TERMINATE sent ({sent:?})");
                self.qp_event(qpn, QpEvent::TerminateSent, term_detail(sent));
            }
            EventKind::WqeError { status, .. } => self.qp_event(qpn, QpEvent::BadWqe, status as u32),
            // The host's abortive close (DISCONNECT abort, MODIFY to ERROR)
            // finished: the QP is in ERROR and its WQEs are flushed. The ABI
            // has no code of its own for it yet.
            EventKind::Aborted => {
                let outstanding = self.qps.get(qpn).is_some_and(|qp| qp.sq_work.fetched != qp.sq_work.consumed);
                self.qp_event(qpn, QpEvent::CloseComplete, u32::from(outstanding));
            }
            EventKind::ConnectRequest(_) | EventKind::ConnectRefused { .. } | EventKind::ConnectWithdrawn => {}
        }
        false
    }

    /// VT3_EV_CONNECT_REPLY for an active open: status 0 or an errno.
    fn connect_reply(&mut self, qpn: u32, status: u32, private_data: &[u8]) {
        let Some(qp) = self.qps.get_mut(qpn) else { return };
        if !qp.connecting {
            log::debug!("QP {qpn}: connect outcome {status} without a CONNECT");
            return;
        }
        qp.connecting = false;
        let cm = Cm { conn_id: 0, qpn, status, ird: qp.ird, ord: qp.ord, tuple: qp.tuple, private_data };
        self.push_event(EventType::ConnectReply, &cm.body());
    }

    pub(super) fn qp_event(&mut self, qpn: u32, code: QpEvent, detail: u32) {
        let body =
            AbiEvent { handle: qpn.into(), code: (code as u32).into(), detail: detail.into(), reserved: 0.into() };
        self.push_event(EventType::Qp, &body);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_the_mtu_and_the_uplink_queue() {
        // UDP's default queue (rmem 212992, reported doubled): half of it.
        assert_eq!(toe_window(1500, Some(425_984)), 212_992);
        // No queue to go by (tap): the floor; a tiny queue: the floor too.
        assert_eq!(toe_window(1500, None), MIN_WINDOW);
        assert_eq!(toe_window(1500, Some(4096)), MIN_WINDOW);
        // Jumbo frames: four segments at least, the ceiling at most.
        assert_eq!(toe_window(65_000, Some(425_984)), 4 * 64_960);
        assert_eq!(toe_window(65_000, Some(64 << 20)), MAX_WINDOW);
    }

    #[test]
    fn terminate_detail_is_the_rfc_5040_layout() {
        assert_eq!(term_detail(TermCode::from_fields(1, 2, 0x05)), 0x1205);
        assert_eq!(term_detail(TermCode::from_fields(2, 0, 0x02)), 0x2002);
        assert_eq!(term_detail(TermCode::from_fields(0, 1, 0xff)), 0x01ff);
    }

    #[test]
    fn connect_failures_have_the_errno_iw_cm_expects() {
        assert_eq!(connect_errno(&ConnectFailure::Rejected { private_data: vec![] }), 111);
        assert_eq!(connect_errno(&ConnectFailure::Tcp(CloseReason::Reset)), 104);
        assert_eq!(connect_errno(&ConnectFailure::Tcp(CloseReason::Timeout)), 110);
        assert_eq!(connect_errno(&ConnectFailure::MpaTimeout), 110);
    }
}
