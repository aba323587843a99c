//! A simulated Ethernet between two endpoints, with injected time and
//! seeded loss, duplication, reordering and latency, plus the endpoints
//! tests need: a full [`Node`] (engine + mock guest memory + mock TPT) and
//! a [`RawPeer`] (TCP + MPA by hand, then any bytes: the hostile peer).
//!
//! Used by the integration tests, the fuzz harness and the benchmark; the
//! device can use it to test its own glue.
#![allow(clippy::indexing_slicing)] // test support

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::engine::{Completion, ConnId, ConnectParams, Engine, EngineConfig, Event, EventKind, Io, QpConfig, QpState};
use crate::mock::MockMemory;
use crate::negotiation::{self, Initiator, InitiatorEvent, Negotiated};
use crate::stream::{emit_fpdu, FpduDeframer};
use crate::toe::{Duration, Instant, LinkStatus, MacAddr, SmolToe, SocketId, TcpConfig, Transport};
use crate::tpt::Tpt;
use crate::wire::mpa::{fpdu_len, MAX_FRAME_LEN};

/// SplitMix64: small, seeded, good enough for fault injection.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }

    /// True with probability `ppm` per million.
    pub fn chance(&mut self, ppm: u32) -> bool {
        ppm > 0 && self.below(1_000_000) < u64::from(ppm)
    }

    pub fn fill(&mut self, out: &mut [u8]) {
        for chunk in out.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// Wire impairments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireConfig {
    pub latency: Duration,
    /// Extra random delay up to this much (order kept: a frame never
    /// overtakes an earlier one unless it is picked for reordering).
    pub jitter: Duration,
    /// Per-frame probabilities, per million.
    pub loss_ppm: u32,
    pub duplicate_ppm: u32,
    /// Delay this fraction of frames by up to `reorder_window` more.
    pub reorder_ppm: u32,
    pub reorder_window: Duration,
    pub seed: u64,
}

impl Default for WireConfig {
    fn default() -> Self {
        WireConfig {
            latency: Duration::from_micros(20),
            jitter: Duration::ZERO,
            loss_ppm: 0,
            duplicate_ppm: 0,
            reorder_ppm: 0,
            reorder_window: Duration::from_micros(500),
            seed: 1,
        }
    }
}

impl WireConfig {
    /// Loss, duplication and reordering, a few percent each.
    pub fn lossy(seed: u64) -> Self {
        WireConfig {
            latency: Duration::from_micros(50),
            jitter: Duration::from_micros(20),
            loss_ppm: 10_000,
            duplicate_ppm: 10_000,
            reorder_ppm: 20_000,
            reorder_window: Duration::from_micros(400),
            seed,
        }
    }
}

#[derive(Debug)]
struct InFlight {
    at: Instant,
    seq: u64,
    to: usize,
    frame: Vec<u8>,
}

impl PartialEq for InFlight {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for InFlight {}

impl PartialOrd for InFlight {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for InFlight {
    /// Reversed: the earliest frame is the heap's maximum.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// Counters of the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireStats {
    pub sent: u64,
    pub delivered: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub cut: u64,
}

/// Frames in flight between endpoint 0 and endpoint 1.
#[derive(Debug)]
pub struct Wire {
    pub config: WireConfig,
    rng: Rng,
    heap: BinaryHeap<InFlight>,
    seq: u64,
    /// Latest in-order arrival time per direction.
    last_at: [Instant; 2],
    /// Drop everything sent towards endpoint 0 / 1 (a blackhole).
    pub cut: [bool; 2],
    pub stats: WireStats,
    /// Recycled frame buffers.
    pool: Vec<Vec<u8>>,
}

impl Wire {
    pub fn new(config: WireConfig) -> Self {
        Wire {
            config,
            rng: Rng::new(config.seed),
            heap: BinaryHeap::new(),
            seq: 0,
            last_at: [Instant::from_micros(0); 2],
            cut: [false; 2],
            stats: WireStats::default(),
            pool: Vec::new(),
        }
    }

    /// Sends `frame` towards endpoint `to`.
    pub fn send(&mut self, now: Instant, to: usize, frame: &[u8]) {
        self.stats.sent += 1;
        if self.cut[to & 1] {
            self.stats.cut += 1;
            return;
        }
        let config = self.config;
        if self.rng.chance(config.loss_ppm) {
            self.stats.lost += 1;
            return;
        }
        let copies = if self.rng.chance(config.duplicate_ppm) {
            self.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut delay = config.latency.total_micros();
            if config.jitter.total_micros() > 0 {
                delay += self.rng.below(config.jitter.total_micros());
            }
            let mut at = now + Duration::from_micros(delay);
            if self.rng.chance(config.reorder_ppm) {
                // Held back: later frames overtake it.
                self.stats.reordered += 1;
                at += Duration::from_micros(1 + self.rng.below(config.reorder_window.total_micros().max(1)));
            } else {
                at = at.max(self.last_at[to & 1]);
                self.last_at[to & 1] = at;
            }
            let mut buffer = self.pool.pop().unwrap_or_default();
            buffer.clear();
            buffer.extend_from_slice(frame);
            self.seq += 1;
            self.heap.push(InFlight { at, seq: self.seq, to: to & 1, frame: buffer });
        }
    }

    /// When the next frame arrives.
    pub fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|f| f.at)
    }

    pub fn in_flight(&self) -> usize {
        self.heap.len()
    }

    fn pop_due(&mut self, now: Instant) -> Option<(usize, Vec<u8>)> {
        if self.heap.peek()?.at > now {
            return None;
        }
        let frame = self.heap.pop()?;
        self.stats.delivered += 1;
        Some((frame.to, frame.frame))
    }

    fn recycle(&mut self, frame: Vec<u8>) {
        if self.pool.len() < 4096 {
            self.pool.push(frame);
        }
    }
}

/// Something attached to the wire.
pub trait Endpoint {
    fn wants(&self, frame: &[u8]) -> bool;
    fn receive(&mut self, now: Instant, frame: &[u8], tx: &mut dyn FnMut(&[u8]));
    fn poll(&mut self, now: Instant, tx: &mut dyn FnMut(&[u8]));
    fn poll_at(&mut self, now: Instant) -> Option<Instant>;
}

/// The addresses of endpoint 0 and 1.
pub const MACS: [MacAddr; 2] = [[0x52, 0x54, 0, 0x76, 0x33, 1], [0x52, 0x54, 0, 0x76, 0x33, 2]];
pub const IPS: [Ipv4Addr; 2] = [Ipv4Addr::new(10, 33, 0, 1), Ipv4Addr::new(10, 33, 0, 2)];
/// The port the helpers listen on (iWARP has no well-known port; this is rping's).
pub const PORT: u16 = 7174;

/// An engine with its guest: what vt3d is, minus virtio.
pub struct Node {
    pub engine: Engine<SmolToe>,
    pub memory: MockMemory,
    pub regions: Tpt,
    pub index: usize,
    /// Everything the engine produced, in order.
    pub completions: Vec<Completion>,
    pub events: Vec<Event>,
    /// Frames the engine did not want (they would go to the guest netdev).
    pub strays: u64,
}

impl core::fmt::Debug for Node {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Node").field("index", &self.index).field("engine", &self.engine).finish()
    }
}

/// How to build a [`Node`].
#[derive(Debug, Clone, Copy)]
pub struct NodeConfig {
    pub tcp: TcpConfig,
    pub engine: EngineConfig,
    pub memory: usize,
}

impl NodeConfig {
    pub fn new(index: usize) -> Self {
        let mut tcp = TcpConfig::new(MACS[index & 1], IPS[index & 1]);
        tcp.seed = 0x5eed + index as u64;
        NodeConfig { tcp, engine: EngineConfig::default(), memory: 1 << 20 }
    }
}

impl Node {
    pub fn new(index: usize, config: NodeConfig, now: Instant) -> Self {
        let toe = match SmolToe::new(config.tcp, now) {
            Ok(toe) => toe,
            Err(error) => panic!("sim node {index}: {error}"),
        };
        Node {
            engine: Engine::new(toe, config.engine),
            memory: MockMemory::new(config.memory),
            regions: Tpt::for_tests(),
            index,
            completions: Vec::new(),
            events: Vec::new(),
            strays: 0,
        }
    }

    /// Takes the events recorded so far.
    pub fn take_events(&mut self) -> Vec<Event> {
        core::mem::take(&mut self.events)
    }

    pub fn take_completions(&mut self) -> Vec<Completion> {
        core::mem::take(&mut self.completions)
    }

    /// Events about QP `qpn` recorded so far (not taken).
    pub fn qp_events(&self, qpn: u32) -> Vec<EventKind> {
        self.events.iter().filter(|e| e.qpn == Some(qpn)).map(|e| e.kind.clone()).collect()
    }

    /// The first pending connection request, if one arrived.
    pub fn connect_request(&self) -> Option<ConnId> {
        self.events.iter().find_map(|e| match e.kind {
            EventKind::ConnectRequest(_) => e.conn,
            _ => None,
        })
    }

    pub fn state(&self, qpn: u32) -> Option<QpState> {
        self.engine.qp_state(qpn)
    }

    fn drain(&mut self) {
        while let Some(c) = self.engine.pop_completion() {
            self.completions.push(c);
        }
        while let Some(e) = self.engine.pop_event() {
            self.events.push(e);
        }
    }
}

impl Endpoint for Node {
    fn wants(&self, frame: &[u8]) -> bool {
        self.engine.wants(frame)
    }

    fn receive(&mut self, now: Instant, frame: &[u8], tx: &mut dyn FnMut(&[u8])) {
        if self.engine.wants(frame) {
            self.engine.receive(now, frame, tx);
        } else {
            self.strays += 1;
        }
    }

    fn poll(&mut self, now: Instant, tx: &mut dyn FnMut(&[u8])) {
        let mut io = Io { memory: &mut self.memory, regions: &mut self.regions, uplink: tx };
        self.engine.poll(now, &mut io);
        self.drain();
    }

    fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        self.engine.poll_at(now)
    }
}

/// A peer that speaks TCP and MPA (as initiator) by hand and then sends
/// whatever bytes it is told to: the hostile peer, and the fuzz driver.
pub struct RawPeer {
    pub toe: SmolToe,
    pub sock: Option<SocketId>,
    initiator: Option<Initiator>,
    private_data: Vec<u8>,
    request_sent: bool,
    /// No MPA: every received octet goes to `received`.
    raw: bool,
    pub negotiated: Option<Negotiated>,
    pub rejected: bool,
    pub mpa_error: Option<negotiation::Error>,
    /// Stream bytes received after the MPA reply.
    pub received: Vec<u8>,
    outbox: VecDeque<u8>,
    pub strays: u64,
}

impl core::fmt::Debug for RawPeer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("RawPeer").field("sock", &self.sock).field("negotiated", &self.negotiated).finish()
    }
}

impl RawPeer {
    pub fn new(tcp: TcpConfig, now: Instant) -> Self {
        let toe = match SmolToe::new(tcp, now) {
            Ok(toe) => toe,
            Err(error) => panic!("raw peer: {error}"),
        };
        RawPeer {
            toe,
            sock: None,
            initiator: None,
            private_data: Vec::new(),
            request_sent: false,
            raw: false,
            negotiated: None,
            rejected: false,
            mpa_error: None,
            received: Vec::new(),
            outbox: VecDeque::new(),
            strays: 0,
        }
    }

    /// Opens TCP to `remote` and sends an MPA request with `config` once connected.
    pub fn connect(
        &mut self,
        now: Instant,
        local_port: u16,
        remote: SocketAddrV4,
        next_hop: MacAddr,
        config: negotiation::Config,
        private_data: &[u8],
    ) {
        let sock = match self.toe.connect(now, local_port, remote, next_hop) {
            Ok(sock) => sock,
            Err(error) => panic!("raw peer connect: {error}"),
        };
        self.sock = Some(sock);
        self.initiator = Initiator::new(config).ok();
        self.private_data = private_data.to_vec();
    }

    /// Stops speaking MPA: send your own request bytes, read the reply in
    /// [`RawPeer::raw_received`].
    pub fn disable_mpa(&mut self) {
        self.raw = true;
        self.request_sent = true;
        self.initiator = None;
    }

    /// Every octet received in raw mode, or after the MPA reply.
    pub fn raw_received(&self) -> &[u8] {
        &self.received
    }

    /// Queues raw stream bytes.
    pub fn send(&mut self, bytes: &[u8]) {
        self.outbox.extend(bytes);
    }

    /// Queues one FPDU around `ulpdu`, CRC as negotiated (or `crc`).
    pub fn send_ulpdu(&mut self, ulpdu: &[u8], crc: Option<bool>) {
        let crc = crc.unwrap_or(self.negotiated.is_some_and(|n| n.crc));
        let mut fpdu = vec![0u8; fpdu_len(u16::try_from(ulpdu.len()).unwrap_or(u16::MAX))];
        if emit_fpdu(ulpdu, crc, &mut fpdu).is_ok() {
            self.send(&fpdu);
        }
    }

    /// The ULPDUs received so far (stops at a framing error).
    pub fn ulpdus(&self) -> Vec<Vec<u8>> {
        let crc = self.negotiated.is_some_and(|n| n.crc);
        let mut deframer = FpduDeframer::new(u16::MAX, crc);
        let mut input = &self.received[..];
        let mut out = Vec::new();
        while let Ok(Some(ulpdu)) = deframer.next_ulpdu(&mut input) {
            out.push(ulpdu.to_vec());
        }
        out
    }

    pub fn status(&self) -> Option<LinkStatus> {
        self.sock.and_then(|sock| self.toe.status(sock))
    }

    pub fn outbox_len(&self) -> usize {
        self.outbox.len()
    }
}

impl Endpoint for RawPeer {
    fn wants(&self, frame: &[u8]) -> bool {
        self.toe.wants(frame)
    }

    fn receive(&mut self, now: Instant, frame: &[u8], tx: &mut dyn FnMut(&[u8])) {
        if self.toe.wants(frame) {
            self.toe.ingress(now, frame, tx);
        } else {
            self.strays += 1;
        }
    }

    fn poll(&mut self, now: Instant, tx: &mut dyn FnMut(&[u8])) {
        self.toe.egress(now, tx);
        let Some(sock) = self.sock else { return };
        let established = matches!(self.toe.status(sock), Some(LinkStatus::Established | LinkStatus::PeerClosed));
        if established && !self.request_sent {
            if let Some(initiator) = self.initiator.as_mut() {
                let mut request = [0u8; MAX_FRAME_LEN];
                if let Ok(len) = initiator.write_request(&self.private_data, &mut request) {
                    let _ = self.toe.send_slice(sock, &request[..len]);
                }
            }
            self.request_sent = true;
        }
        let RawPeer { toe, initiator, negotiated, rejected, mpa_error, received, raw, .. } = self;
        let _ = toe.recv(sock, &mut |data| {
            let mut input = data;
            if negotiated.is_none() && !*rejected && mpa_error.is_none() {
                if let Some(initiator) = initiator.as_mut() {
                    match initiator.receive(&mut input) {
                        Ok(InitiatorEvent::Established { negotiated: n, .. }) => *negotiated = Some(n),
                        Ok(InitiatorEvent::Rejected { .. }) => *rejected = true,
                        Ok(InitiatorEvent::Pending) => {}
                        Err(error) => *mpa_error = Some(error),
                    }
                }
            }
            if negotiated.is_some() || *raw {
                received.extend_from_slice(input);
                input = &[];
            }
            data.len() - input.len()
        });
        while !self.outbox.is_empty() {
            let space = self.toe.send_space(sock);
            if space == 0 {
                break;
            }
            let (front, _) = self.outbox.as_slices();
            let take = front.len().min(space);
            let written = self.toe.send_slice(sock, &front[..take]).unwrap_or(0);
            self.outbox.drain(..written);
            if written == 0 {
                break;
            }
        }
        self.toe.egress(now, tx);
    }

    fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        let at = self.toe.poll_at(now);
        let can_send = self.sock.is_some_and(|sock| self.toe.send_space(sock) > 0);
        if self.outbox.is_empty() || !can_send {
            at
        } else {
            Some(at.map_or(now, |at| at.min(now + Duration::from_millis(1))))
        }
    }
}

/// Two endpoints on one wire, in virtual time.
pub struct Sim<A: Endpoint, B: Endpoint> {
    pub a: A,
    pub b: B,
    pub wire: Wire,
    pub now: Instant,
    /// Loop iterations run (a cost measure for tests).
    pub steps: u64,
}

impl<A: Endpoint, B: Endpoint> core::fmt::Debug for Sim<A, B> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Sim").field("now", &self.now).field("wire", &self.wire.stats).finish()
    }
}

/// The time every simulation starts at.
pub const START: Instant = Instant::from_millis_const(1_000);

impl<A: Endpoint, B: Endpoint> Sim<A, B> {
    pub fn new(a: A, b: B, wire: WireConfig) -> Self {
        Sim { a, b, wire: Wire::new(wire), now: START, steps: 0 }
    }

    fn poll_both(&mut self) {
        let now = self.now;
        let Sim { a, b, wire, .. } = self;
        a.poll(now, &mut |frame| wire.send(now, 1, frame));
        b.poll(now, &mut |frame| wire.send(now, 0, frame));
    }

    /// Delivers every frame due now; true if there was one.
    fn deliver(&mut self) -> bool {
        let now = self.now;
        let mut any = false;
        while let Some((to, frame)) = self.wire.pop_due(now) {
            any = true;
            let Sim { a, b, wire, .. } = self;
            if to == 0 {
                a.receive(now, &frame, &mut |reply| wire.send(now, 1, reply));
            } else {
                b.receive(now, &frame, &mut |reply| wire.send(now, 0, reply));
            }
            self.wire.recycle(frame);
        }
        any
    }

    /// Runs until `done` holds (checked after every poll) or `limit` of
    /// virtual time passed; returns whether `done` held.
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&mut Self) -> bool) -> bool {
        let end = self.now + limit;
        loop {
            self.steps += 1;
            self.poll_both();
            if done(self) {
                return true;
            }
            if self.deliver() {
                continue;
            }
            let now = self.now;
            let next = [self.wire.next_at(), self.a.poll_at(now), self.b.poll_at(now)].into_iter().flatten().min();
            match next {
                Some(at) if at <= end => {
                    self.now = if at > now { at } else { now + Duration::from_micros(100) };
                }
                _ => {
                    self.now = end;
                    self.poll_both();
                    return done(self);
                }
            }
        }
    }

    /// Runs for `time` of virtual time.
    pub fn run_for(&mut self, time: Duration) {
        self.run_until(time, |_| false);
    }
}

impl Sim<Node, Node> {
    /// Two engines on a wire.
    pub fn pair(a: NodeConfig, b: NodeConfig, wire: WireConfig) -> Self {
        Sim::new(Node::new(0, a, START), Node::new(1, b, START), wire)
    }

    /// Connects QP `qpn_a` on A (from `local_port`) to QP `qpn_b` on B
    /// (listening on [`PORT`] with `backlog`): creates both QPs with
    /// `config`, runs until both are RTS. The private data is `b"vt3"`.
    pub fn connect_qps(&mut self, qpn_a: u32, qpn_b: u32, local_port: u16, config: QpConfig) -> bool {
        self.start_connect(qpn_a, qpn_b, local_port, config);
        self.run_until(Duration::from_secs(30), |sim| {
            sim.accept_requests(config);
            sim.a.state(qpn_a) == Some(QpState::Rts) && sim.b.state(qpn_b) == Some(QpState::Rts)
        })
    }

    /// Creates the QPs and starts the active open; the passive side is
    /// accepted by [`Sim::accept_requests`] (QP numbers are matched by
    /// the private data `"qpn:<b>"`).
    pub fn start_connect(&mut self, qpn_a: u32, qpn_b: u32, local_port: u16, config: QpConfig) {
        let now = self.now;
        if self.b.engine.listen(PORT, 64).is_err() {
            // Already listening.
        }
        let _ = self.a.engine.create_qp(qpn_a, config);
        let _ = self.b.engine.create_qp(qpn_b, config);
        let params = ConnectParams {
            local_port,
            remote: SocketAddrV4::new(IPS[1], PORT),
            next_hop: MACS[1],
            private_data: format!("qpn:{qpn_b}").into_bytes(),
        };
        if let Err(error) = self.a.engine.connect(now, qpn_a, params) {
            panic!("connect: {error}");
        }
    }

    /// Accepts every new connection request on B with the QP named in its
    /// private data.
    pub fn accept_requests(&mut self, _config: QpConfig) {
        let now = self.now;
        let requests: Vec<(usize, ConnId, Vec<u8>)> = self
            .b
            .events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match &e.kind {
                EventKind::ConnectRequest(request) => Some((i, e.conn?, request.private_data.clone())),
                _ => None,
            })
            .collect();
        for (index, conn, private_data) in requests.into_iter().rev() {
            self.b.events.remove(index);
            let qpn = core::str::from_utf8(&private_data)
                .ok()
                .and_then(|s| s.strip_prefix("qpn:"))
                .and_then(|n| n.parse().ok());
            match qpn {
                Some(qpn) => {
                    if let Err(error) = self.b.engine.accept(now, conn, qpn, b"ok") {
                        panic!("accept {conn} on QP {qpn}: {error}");
                    }
                }
                None => {
                    let _ = self.b.engine.reject(conn, b"who?");
                }
            }
        }
    }
}

impl Sim<RawPeer, Node> {
    /// A raw peer (A) and an engine (B) listening on [`PORT`] with QP
    /// `qpn` ready to accept. The raw peer connects with `mpa`; B accepts
    /// on `qpn`. Returns after the MPA exchange (raw peer negotiated).
    pub fn raw_pair(
        raw: TcpConfig,
        node: NodeConfig,
        wire: WireConfig,
        qpn: u32,
        qp: QpConfig,
        mpa: negotiation::Config,
    ) -> Self {
        let mut sim = Sim::new(RawPeer::new(raw, START), Node::new(1, node, START), wire);
        let _ = sim.b.engine.listen(PORT, 8);
        let _ = sim.b.engine.create_qp(qpn, qp);
        let now = sim.now;
        sim.a.connect(now, 40_000, SocketAddrV4::new(IPS[1], PORT), MACS[1], mpa, b"raw");
        sim.run_until(Duration::from_secs(10), |sim| {
            if let Some(conn) = sim.b.connect_request() {
                sim.b.events.retain(|e| !matches!(e.kind, EventKind::ConnectRequest(_)));
                let now = sim.now;
                if let Err(error) = sim.b.engine.accept(now, conn, qpn, b"ok") {
                    panic!("accept: {error}");
                }
            }
            sim.a.negotiated.is_some() || sim.a.rejected || sim.a.mpa_error.is_some()
        });
        sim
    }
}
