//! The link under a TOE ([`Link`]): where the frames a [`Transport`]
//! sends go (back in when they are for our own MAC, a connection between
//! two of our sockets, as in a T3; else to the uplink), and fault
//! injection on them. Faults are set per connection and found by the
//! frame's 4-tuple, so the TCP under the link knows nothing of them and
//! any TCP can sit behind it (as smoltcp's `phy::FaultInjector` wraps a
//! device).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddrV4;

use super::frame::{self, Segment};
use super::{Duration, FourTuple, Instant, LinkStatus, MacAddr, SocketId, Split, TcbInfo, TcpError, Transport};

/// Frames held back by the delay fault, at most this many (beyond: dropped).
pub const MAX_DELAYED_FRAMES: usize = 4096;

/// Frames to our own address waiting to come back in. Past this many, a
/// frame is dropped and TCP sends it again.
pub const MAX_LOOPED_FRAMES: usize = 4096;

/// Looped frames taken back in per call of `ingress`/`egress`; the rest
/// waits for the next (`poll_at` says now).
const LOOPED_PER_CALL: usize = 256;

/// What fault injection did to frames.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Frames dropped by blackhole or drop-percentage faults (both ways).
    pub dropped: u64,
    /// Frames held back by the delay fault.
    pub delayed: u64,
    /// Frames dropped because the delay queue was full.
    pub delay_overflow: u64,
    /// Segments cut in two by the split fault.
    pub split: u64,
    /// Frames to our own address dropped because the loopback queue was full.
    pub loop_overflow: u64,
}

/// One fault on a connection's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkFault {
    /// Silently drop every frame of the connection, both ways (the peer
    /// and we eventually time out); `false` stops it.
    Blackhole(bool),
    /// Drop `percent` % of the connection's frames, both ways, with a PRNG
    /// seeded by `seed` (the same seed drops the same frames of the same
    /// traffic); 0 stops it.
    Drop { percent: u8, seed: u64 },
    /// Hold every frame the connection sends for this long (data and ACKs
    /// alike, so the RTT grows by it both ways); `None` stops it (frames
    /// already held still wait their time).
    Delay(Option<Duration>),
    /// Cut each data segment the connection sends in two ([`Split`]);
    /// `None` stops it.
    Split(Option<Split>),
}

/// The faults in force on one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Faults {
    blackhole: bool,
    drop_percent: u8,
    /// xorshift64* state of the drop fault (never 0).
    rng: u64,
    delay: Option<Duration>,
    split: Option<Split>,
    /// The split fault's last frame leaves then: later ones wait for it.
    split_until: Instant,
}

impl Faults {
    fn new(now: Instant) -> Self {
        Self { blackhole: false, drop_percent: 0, rng: 1, delay: None, split: None, split_until: now }
    }

    fn none(&self) -> bool {
        !self.blackhole && self.drop_percent == 0 && self.delay.is_none() && self.split.is_none()
    }

    /// Whether the next frame of the connection is dropped.
    fn drops(&mut self) -> bool {
        if self.blackhole {
            return true;
        }
        if self.drop_percent == 0 {
            return false;
        }
        // xorshift64*: deterministic for a seed, cheap, good enough.
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        let draw = x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32;
        draw % 100 < u64::from(self.drop_percent)
    }
}

/// The frames and faults of the link, apart from the TCP (borrowed
/// beside it while the TCP runs).
#[derive(Debug)]
struct Wire {
    our_mac: MacAddr,
    /// By the connection's 4-tuple as its own socket sees it.
    faults: HashMap<FourTuple, Faults>,
    /// Frames held by the delay and split faults, by release time (FIFO
    /// within a time).
    delayed: BTreeMap<(Instant, u64), Vec<u8>>,
    next_delayed: u64,
    /// Frames to our own MAC, to come back in in order.
    looped: VecDeque<Vec<u8>>,
    looped_in: u64,
    counters: FaultCounters,
}

/// A [`Transport`] behind the link: the TCP's frames pass the faults of
/// their connection, and frames for our own MAC come back in.
#[derive(Debug)]
pub struct Link<T> {
    tcp: T,
    wire: Wire,
}

impl<T: Transport> Link<T> {
    pub fn new(tcp: T) -> Self {
        let wire = Wire {
            our_mac: tcp.mac(),
            faults: HashMap::new(),
            delayed: BTreeMap::new(),
            next_delayed: 0,
            looped: VecDeque::new(),
            looped_in: 0,
            counters: FaultCounters::default(),
        };
        Self { tcp, wire }
    }

    /// The TCP behind the link.
    pub fn tcp(&self) -> &T {
        &self.tcp
    }

    /// What fault injection did so far.
    pub fn fault_counters(&self) -> FaultCounters {
        self.wire.counters
    }

    /// Frames sent to our own address and taken back in so far (a
    /// loopback connection): the engine reads what they brought.
    pub fn looped_in(&self) -> u64 {
        self.wire.looped_in
    }

    /// Sets a fault on the frames of connection `id` (from now on, both
    /// ways). Errors: no such connection, or it has no 4-tuple yet.
    pub fn set_fault(&mut self, now: Instant, id: SocketId, fault: LinkFault) -> Result<(), TcpError> {
        let tuple = self.tcp.tcb(id).and_then(|tcb| tcb.tuple).ok_or(TcpError::NoSocket)?;
        let faults = self.wire.faults.entry(tuple).or_insert_with(|| Faults::new(now));
        match fault {
            LinkFault::Blackhole(on) => faults.blackhole = on,
            LinkFault::Drop { percent, seed } => {
                faults.drop_percent = percent.min(100);
                // xorshift needs a non-zero state; mix the seed so that
                // small seeds differ from the first draw on.
                faults.rng = (seed ^ 0x9e37_79b9_7f4a_7c15).max(1);
            }
            LinkFault::Delay(delay) => faults.delay = delay.filter(|d| *d > Duration::ZERO),
            LinkFault::Split(split) => faults.split = split.filter(|s| s.tail > 0),
        }
        if faults.none() {
            self.wire.faults.remove(&tuple);
        }
        Ok(())
    }

    /// Takes back in what we sent to our own MAC, and lets TCP answer it,
    /// a bounded number of frames per call (`poll_at` says when more wait).
    fn take_looped(&mut self, now: Instant, uplink: &mut dyn FnMut(&[u8])) {
        let Link { tcp, wire } = self;
        let mut taken = 0;
        while taken < LOOPED_PER_CALL {
            let Some(frame) = wire.looped.pop_front() else { break };
            wire.looped_in += 1;
            taken += 1;
            if wire.admits(&frame) && tcp.wants(&frame) {
                tcp.ingress(now, &frame, &mut |f| wire.send(now, f, uplink));
            }
            if wire.looped.is_empty() {
                // Let TCP answer what came back in (ACKs, window updates).
                tcp.egress(now, &mut |f| wire.send(now, f, uplink));
            }
        }
    }

    /// The TCB with the faults in force on its connection.
    fn with_faults(&self, mut tcb: TcbInfo) -> TcbInfo {
        if let Some(faults) = tcb.tuple.and_then(|tuple| self.wire.faults.get(&tuple)) {
            tcb.blackholed = faults.blackhole;
            tcb.drop_percent = faults.drop_percent;
            tcb.delay = faults.delay;
            tcb.split = faults.split;
        }
        tcb
    }
}

impl Wire {
    /// Whether a frame coming in passes the faults of its connection.
    fn admits(&mut self, frame: &[u8]) -> bool {
        if self.faults.is_empty() {
            return true;
        }
        let Some(segment) = frame::parse(frame) else { return true };
        let Some(faults) = self.faults.get_mut(&segment.tuple_at_receiver()) else { return true };
        if faults.drops() {
            self.counters.dropped += 1;
            return false;
        }
        true
    }

    /// A frame the TCP sends: through the faults of its connection, then
    /// out ([`Wire::out`]) now or when its delay is over.
    fn send(&mut self, now: Instant, frame: &[u8], uplink: &mut dyn FnMut(&[u8])) {
        // No fault anywhere (the usual case): no header to parse.
        let faulted = if self.faults.is_empty() { None } else { frame::parse(frame) };
        let Some(faults) = faulted.and_then(|s| self.faults.get_mut(&sender_tuple(&s))) else {
            self.out(frame, uplink);
            return;
        };
        if faults.drops() {
            self.counters.dropped += 1;
            return;
        }
        let mut at = now + faults.delay.unwrap_or(Duration::ZERO);
        if let Some(split) = faults.split {
            // One segment at a time: a frame leaves after the rest of the
            // segment before it, so the peer sees no reordering.
            at = at.max(faults.split_until);
            let (mut head, mut rest) = (Vec::new(), Vec::new());
            if frame::split_segment(frame, usize::from(split.tail), &mut head, &mut rest) {
                self.counters.split += 1;
                faults.split_until = at + split.hold;
                let rest_at = faults.split_until;
                if at > now {
                    self.hold(at, head);
                } else {
                    self.out(&head, uplink);
                }
                self.hold(rest_at, rest);
                return;
            }
        }
        if at > now {
            self.hold(at, frame.to_vec());
        } else {
            self.out(frame, uplink);
        }
    }

    /// Where a frame leaving goes: back in when it is for our own MAC (a
    /// connection between two of our sockets), else to the uplink.
    fn out(&mut self, frame: &[u8], uplink: &mut dyn FnMut(&[u8])) {
        if frame.get(..6) != Some(&self.our_mac[..]) {
            uplink(frame);
        } else if self.looped.len() >= MAX_LOOPED_FRAMES {
            self.counters.loop_overflow += 1;
        } else {
            self.looped.push_back(frame.to_vec());
        }
    }

    /// Queues `frame` to leave at `at` (after the frames queued for the
    /// same time); a full queue drops it.
    fn hold(&mut self, at: Instant, frame: Vec<u8>) {
        if self.delayed.len() >= MAX_DELAYED_FRAMES {
            self.counters.delay_overflow += 1;
        } else {
            self.counters.delayed += 1;
            self.delayed.insert((at, self.next_delayed), frame);
            self.next_delayed = self.next_delayed.wrapping_add(1);
        }
    }

    /// Sends the held frames whose time has come.
    fn release_due(&mut self, now: Instant, uplink: &mut dyn FnMut(&[u8])) {
        while let Some(entry) = self.delayed.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let frame = entry.remove();
            self.out(&frame, uplink);
        }
    }
}

/// The connection of a frame we send, as its socket sees it.
fn sender_tuple(segment: &Segment) -> FourTuple {
    FourTuple { local: segment.src, remote: segment.dst }
}

impl<T: Transport> Transport for Link<T> {
    fn mac(&self) -> MacAddr {
        self.wire.our_mac
    }

    fn wants(&self, frame: &[u8]) -> bool {
        self.tcp.wants(frame)
    }

    fn ingress(&mut self, now: Instant, frame: &[u8], uplink: &mut dyn FnMut(&[u8])) {
        let Link { tcp, wire } = self;
        if wire.admits(frame) {
            tcp.ingress(now, frame, &mut |f| wire.send(now, f, uplink));
        }
        self.take_looped(now, uplink);
    }

    fn egress(&mut self, now: Instant, uplink: &mut dyn FnMut(&[u8])) {
        let Link { tcp, wire } = self;
        // Held frames whose time has come go first (they are older).
        wire.release_due(now, uplink);
        tcp.egress(now, &mut |f| wire.send(now, f, uplink));
        self.take_looped(now, uplink);
    }

    fn poll_at(&mut self, now: Instant) -> Option<Instant> {
        if !self.wire.looped.is_empty() {
            return Some(now);
        }
        let held = self.wire.delayed.keys().next().map(|k| k.0);
        match (self.tcp.poll_at(now), held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn take_ready(&mut self, f: &mut dyn FnMut(SocketId)) {
        self.tcp.take_ready(f)
    }

    fn set_egress_room(&mut self, frames: usize) {
        self.tcp.set_egress_room(frames)
    }

    fn listen(&mut self, port: u16, backlog: usize) -> Result<(), TcpError> {
        self.tcp.listen(port, backlog)
    }

    fn unlisten(&mut self, port: u16) {
        self.tcp.unlisten(port)
    }

    fn accept(&mut self, port: u16) -> Option<SocketId> {
        self.tcp.accept(port)
    }

    fn connect(
        &mut self,
        now: Instant,
        local_port: u16,
        remote: SocketAddrV4,
        next_hop: MacAddr,
    ) -> Result<SocketId, TcpError> {
        self.tcp.connect(now, local_port, remote, next_hop)
    }

    fn status(&self, id: SocketId) -> Option<LinkStatus> {
        self.tcp.status(id)
    }

    fn recv(&mut self, id: SocketId, f: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize, TcpError> {
        self.tcp.recv(id, f)
    }

    fn recv_queue(&self, id: SocketId) -> usize {
        self.tcp.recv_queue(id)
    }

    fn send_space(&self, id: SocketId) -> usize {
        self.tcp.send_space(id)
    }

    fn send_with(&mut self, id: SocketId, f: &mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, TcpError> {
        self.tcp.send_with(id, f)
    }

    fn send_slice(&mut self, id: SocketId, data: &[u8]) -> Result<usize, TcpError> {
        self.tcp.send_slice(id, data)
    }

    fn close(&mut self, id: SocketId) {
        self.tcp.close(id)
    }

    fn abort(&mut self, id: SocketId) {
        self.tcp.abort(id)
    }

    fn release(&mut self, id: SocketId) {
        // The engine is done with the connection: its faults end with it.
        if let Some(tuple) = self.tcp.tcb(id).and_then(|tcb| tcb.tuple) {
            self.wire.faults.remove(&tuple);
        }
        self.tcp.release(id)
    }

    fn mss(&self, id: SocketId) -> u16 {
        self.tcp.mss(id)
    }

    fn tcb(&self, id: SocketId) -> Option<TcbInfo> {
        self.tcp.tcb(id).map(|tcb| self.with_faults(tcb))
    }

    fn for_each_tcb(&self, f: &mut dyn FnMut(&TcbInfo)) {
        self.tcp.for_each_tcb(&mut |tcb| f(&self.with_faults(*tcb)))
    }
}
