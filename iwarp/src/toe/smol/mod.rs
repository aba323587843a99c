//! [`Transport`] on smoltcp.
//!
//! One smoltcp `Interface` on `Medium::Ip` with the guest's IP (as a /0
//! prefix, so every peer is "on link"), a `SocketSet` of one socket per
//! connection, and around them what smoltcp lacks:
//!
//! * **Work in proportion to the sockets that have some.** smoltcp walks
//!   every socket of the set it is given, so the TOE gives it only the
//!   set a frame is for (found by 4-tuple, or the port's listening
//!   socket) and, on egress, only the sets whose timers are due (a timer
//!   queue keyed by each socket's `poll_at`). Idle connections cost
//!   nothing until a timer of theirs comes.
//! * **Ethernet framing with driver-given next hops.** smoltcp sees bare
//!   IPv4 packets. The TOE strips the Ethernet header of frames for our MAC
//!   and IP on the way in, and on the way out writes the header in front of
//!   the packet smoltcp built (in place, no copy) with the connection's next
//!   hop: the MAC given to `connect`, or the source MAC of the SYN that
//!   opened a passive connection (an RST to a stray segment goes back to the
//!   MAC it came from). So the TOE never speaks ARP and keeps no neighbour
//!   cache that could thrash: any number of peers works.
//! * **Accept backlog.** A smoltcp socket listens for one connection. A
//!   listening port has one socket in LISTEN (armed) and its connections
//!   half-open or established but not yet accepted, up to `backlog` in
//!   all. A SYN takes the armed socket and a fresh one is armed while
//!   fewer than `backlog` wait; when one is accepted (or dies) likewise. So
//!   a burst of up to `backlog` SYNs is accepted; further SYNs are answered
//!   with RST until the engine accepts one. A duplicate SYN for a tuple we already track is
//!   dropped (the half-open socket retransmits its SYN-ACK by itself), so a
//!   duplicated SYN never creates a second connection.
//! * **TCB observation.** smoltcp keeps sequence numbers, windows and the
//!   RTT estimator private, so the TOE reads them off the frames it passes
//!   ([`Observed`]), and classifies how each connection ended
//!   ([`CloseReason`]): an RST that closed it, a close while processing a
//!   received segment (the ACK of our FIN in LAST-ACK: graceful), the end of
//!   TIME-WAIT (graceful), a local abort, or a close during a timer run
//!   (timeout).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::net::SocketAddrV4;

use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::socket::tcp;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint};

use super::buffer::PageBuffer;
use super::frame::ETHERNET_HEADER_LEN;

use super::frame::{self, flags, Segment};
use super::observed::Observed;
use super::port::{Port, TxPath};
use super::{
    CloseReason, Duration, FourTuple, Instant, LinkStatus, MacAddr, SocketId, TcbInfo, TcpConfig, TcpError, TcpState,
    Transport,
};

mod transport;

/// Largest accepted backlog per listening port.
pub const MAX_BACKLOG: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// An idle socket in LISTEN for `port`.
    Listening { port: u16 },
    /// Arrived on `port`, not yet accepted (half-open or established).
    Pending { port: u16 },
    /// An accepted or actively opened connection.
    Connection { listen_port: Option<u16> },
}

pub(super) struct Entry {
    /// The connection's own socket set: smoltcp walks every socket of the
    /// set it is given, so each socket has one and the TOE hands smoltcp
    /// only the set a frame or a timer is for.
    set: SocketSet<'static>,
    /// The socket's receive and send storage. Declared after `set`, so
    /// dropped after the socket that borrows it (`PageBuffer::storage`).
    pages: [PageBuffer; 2],
    handle: SocketHandle,
    /// When this socket must be polled, as queued in `SmolToe::timers`:
    /// smoltcp's time, or `release_at` if sooner.
    timer: Option<Instant>,
    /// Data passed through the buffers since their pages were last
    /// released: some may be resident.
    pages_used: bool,
    /// The last time data was seen in the buffers.
    busy_at: Instant,
    /// When to look whether the buffers stayed empty since `busy_at` and
    /// can give their pages back ([`TcpConfig::buffer_release`]).
    release_at: Option<Instant>,
    role: Role,
    tuple: Option<FourTuple>,
    released: bool,
    state: TcpState,
    close_reason: Option<CloseReason>,
    pub(super) observed: Observed,
    /// Where our frames for this connection go.
    pub(super) next_hop: MacAddr,
    /// Octets of its receive and send buffers (of the TOE's budget).
    buffers: usize,
}

/// A socket made by [`SmolToe::new_socket`] and not in the table yet.
struct NewSocket {
    socket: tcp::Socket<'static>,
    /// The storage `socket` borrows: declared after it, so dropped after
    /// it, should the socket never reach the table.
    pages: [PageBuffer; 2],
    /// Octets of that storage.
    buffers: usize,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("role", &self.role)
            .field("tuple", &self.tuple)
            .field("state", &self.state)
            .field("timer", &self.timer)
            .finish_non_exhaustive()
    }
}

impl Entry {
    fn socket(&self) -> &tcp::Socket<'static> {
        self.set.get::<tcp::Socket>(self.handle)
    }

    fn socket_mut(&mut self) -> &mut tcp::Socket<'static> {
        self.set.get_mut::<tcp::Socket>(self.handle)
    }

    /// Gives the buffers' pages back once they have stayed empty for
    /// `delay` (both queues empty, nothing held out of order, at every
    /// look since data was last seen in them); returns when to look again.
    fn release_idle_pages(&mut self, now: Instant, delay: Option<Duration>) -> Option<Instant> {
        let Some(delay) = delay else {
            self.release_at = None;
            return None;
        };
        let socket = self.socket();
        let empty = socket.recv_queue() == 0 && socket.send_queue() == 0 && self.observed.nothing_held_out_of_order();
        if !empty {
            self.pages_used = true;
            self.busy_at = now;
            // A queued deadline stays while data flows and moves on only
            // when it comes: a stream re-keys its timer once per `delay`,
            // not once per segment.
            if self.release_at.is_some_and(|at| at <= now) {
                self.release_at = Some(now + delay);
            }
            return self.release_at;
        }
        if !self.pages_used {
            self.release_at = None;
            return None;
        }
        let due = self.busy_at + delay;
        if due <= now {
            // Empty rings: nothing in them is read before it is written
            // again (`PageBuffer::release`).
            for pages in &self.pages {
                pages.release();
            }
            self.pages_used = false;
            self.release_at = None;
        } else if self.release_at.is_none_or(|at| at <= now) {
            self.release_at = Some(due);
        }
        self.release_at
    }
}

#[derive(Debug, Default)]
pub(super) struct Slot {
    generation: u32,
    pub(super) entry: Option<Entry>,
}

/// The entry in slot `index`, if any (whatever its generation).
fn entry_at(slots: &mut [Slot], index: u32) -> Option<&mut Entry> {
    slots.get_mut(index as usize)?.entry.as_mut()
}

#[derive(Debug, Default)]
struct Listener {
    backlog: usize,
    /// The one socket in LISTEN, which takes the next SYN (none while the
    /// backlog is full or the table is: SYNs are refused).
    armed: Option<u32>,
    /// Connections that arrived and are not accepted yet, oldest first.
    pending: VecDeque<u32>,
}

/// The smoltcp-backed TOE.
pub struct SmolToe {
    config: TcpConfig,
    iface: Interface,
    slots: Vec<Slot>,
    free: Vec<u32>,
    live: usize,
    by_tuple: HashMap<FourTuple, u32>,
    listeners: HashMap<u16, Listener>,
    /// One outgoing frame being built.
    scratch: Vec<u8>,
    /// Frames the uplink takes from egress ([`Transport::set_egress_room`]).
    egress_room: usize,
    /// Octets of socket buffers the sockets hold ([`TcpConfig::buffer_budget`]).
    reserved: usize,
    /// Sockets by the time smoltcp wants them polled (`Entry::timer`), one
    /// key per socket: egress polls only those due, so idle connections
    /// cost nothing until a timer of theirs comes.
    timers: BTreeSet<(Instant, u32)>,
    /// The latest time the TOE was given (for engine calls, which have none).
    now: Instant,
    /// Socket sets handed to smoltcp so far (one per frame in, one per due
    /// socket on egress): the work, which must follow the sockets that
    /// have some, not the sockets there are.
    socket_polls: u64,
    /// Sockets touched since the engine last asked ([`Transport::take_ready`]).
    ready: HashSet<SocketId>,
}

impl std::fmt::Debug for SmolToe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmolToe")
            .field("config", &self.config)
            .field("sockets", &self.live)
            .field("listeners", &self.listeners.len())
            .finish_non_exhaustive()
    }
}

fn map_state(state: tcp::State) -> TcpState {
    match state {
        tcp::State::Closed => TcpState::Closed,
        tcp::State::Listen => TcpState::Listen,
        tcp::State::SynSent => TcpState::SynSent,
        tcp::State::SynReceived => TcpState::SynReceived,
        tcp::State::Established => TcpState::Established,
        tcp::State::FinWait1 => TcpState::FinWait1,
        tcp::State::FinWait2 => TcpState::FinWait2,
        tcp::State::CloseWait => TcpState::CloseWait,
        tcp::State::Closing => TcpState::Closing,
        tcp::State::LastAck => TcpState::LastAck,
        tcp::State::TimeWait => TcpState::TimeWait,
    }
}

/// Closed, and the RST of an abort (if any) already went out (smoltcp
/// forgets the tuple once it sent it).
fn socket_done(socket: &tcp::Socket<'_>) -> bool {
    socket.state() == tcp::State::Closed && socket.local_endpoint().is_none()
}

fn endpoint(endpoint: IpEndpoint) -> Option<SocketAddrV4> {
    match endpoint.addr {
        IpAddress::Ipv4(addr) => Some(SocketAddrV4::new(addr, endpoint.port)),
    }
}

impl SmolToe {
    pub fn new(config: TcpConfig, now: Instant) -> Result<Self, TcpError> {
        if !frame::is_unicast(config.mac) {
            return Err(TcpError::Config("the MAC address must be unicast"));
        }
        let ip = config.ip;
        if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() {
            return Err(TcpError::Config("the IPv4 address must be unicast"));
        }
        if !(576..=65535).contains(&config.mtu) {
            return Err(TcpError::Config("the MTU must be within 576..=65535"));
        }
        let window_ok = |len: usize| (usize::from(config.mss())..=(1 << 30)).contains(&len);
        if !window_ok(config.rx_buffer) || !window_ok(config.tx_buffer) {
            return Err(TcpError::Config("socket buffers must hold one MSS and at most 1 GiB"));
        }
        if config.max_sockets == 0 {
            return Err(TcpError::Config("max_sockets must be positive"));
        }
        if config.buffer_release == Some(Duration::ZERO) {
            // A deadline of now for a busy socket would be due forever.
            return Err(TcpError::Config("buffer_release must be positive"));
        }
        let mut scratch = vec![0; config.mtu + ETHERNET_HEADER_LEN];
        let mut iface_config = Config::new(HardwareAddress::Ip);
        iface_config.random_seed = config.seed;
        let mut slots = Vec::new();
        let by_tuple = HashMap::new();
        let mut sink = |_: &[u8]| {};
        let mut port = Port {
            rx: None,
            tx: TxPath {
                scratch: &mut scratch,
                uplink: &mut sink,
                slots: &mut slots,
                by_tuple: &by_tuple,
                budget: 0,
                mtu: config.mtu,
                our_mac: config.mac,
                reply_to: None,
                now,
            },
        };
        let mut iface = Interface::new(iface_config, &mut port, now);
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(ip), 0));
        });
        Ok(SmolToe {
            config,
            iface,
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            by_tuple,
            listeners: HashMap::new(),
            scratch,
            egress_room: usize::MAX,
            reserved: 0,
            timers: BTreeSet::new(),
            now,
            socket_polls: 0,
            ready: HashSet::new(),
        })
    }

    pub fn config(&self) -> &TcpConfig {
        &self.config
    }

    /// Sockets in the table, listening slots included.
    pub fn socket_count(&self) -> usize {
        self.live
    }

    fn entry(&self, id: SocketId) -> Option<&Entry> {
        let slot = self.slots.get(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        slot.entry.as_ref()
    }

    fn entry_mut(&mut self, id: SocketId) -> Option<&mut Entry> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        slot.entry.as_mut()
    }

    fn id_of(&self, index: u32) -> SocketId {
        let generation = self.slots.get(index as usize).map_or(0, |slot| slot.generation);
        SocketId { index, generation }
    }

    fn socket(&self, id: SocketId) -> Option<&tcp::Socket<'static>> {
        Some(self.entry(id)?.socket())
    }

    fn socket_mut(&mut self, id: SocketId) -> Option<&mut tcp::Socket<'static>> {
        Some(self.entry_mut(id)?.socket_mut())
    }

    /// Socket sets smoltcp was run on so far (see `SmolToe::socket_polls`).
    pub fn socket_polls(&self) -> u64 {
        self.socket_polls
    }

    /// Pages of socket buffers resident now, all sockets together
    /// (`mincore`): what idle connections must not hold.
    pub fn resident_buffer_pages(&self) -> usize {
        self.slots
            .iter()
            .filter_map(|slot| slot.entry.as_ref())
            .flat_map(|entry| &entry.pages)
            .map(PageBuffer::resident_pages)
            .sum()
    }

    /// Octets of socket buffers the sockets hold now.
    pub fn buffers_reserved(&self) -> usize {
        self.reserved
    }

    /// A socket with buffers sized from what the others hold
    /// ([`TcpConfig::buffer_sizes`]), and their octets. Each buffer is a
    /// mapping of its own: pages stay untouched until data passes, and go
    /// back once the socket idles (`Entry::release_idle_pages`).
    // The socket borrows its storage for 'static; the entry keeps the two
    // together and drops the socket first (see `Entry::pages`).
    #[allow(unsafe_code)]
    fn new_socket(&self) -> Result<NewSocket, TcpError> {
        let config = &self.config;
        let (rx, tx) = config.buffer_sizes(self.live, self.reserved);
        let mut pages = [
            PageBuffer::new(rx).map_err(|_| TcpError::NoResources)?,
            PageBuffer::new(tx).map_err(|_| TcpError::NoResources)?,
        ];
        let [rx_pages, tx_pages] = &mut pages;
        // SAFETY: one borrower each (this socket). `insert` puts it
        // in the same entry as `pages`, in a field dropped before them, and
        // `run` lends the set out only while the entry stays (smoltcp's
        // transmit path cannot remove entries); until then both are in one
        // `NewSocket`, whose fields drop socket first.
        let rx_storage = unsafe { rx_pages.storage() };
        // SAFETY: as for the receive storage just above.
        let tx_storage = unsafe { tx_pages.storage() };
        let mut socket = tcp::Socket::new(tcp::SocketBuffer::new(rx_storage), tcp::SocketBuffer::new(tx_storage));
        socket.set_nagle_enabled(config.nagle);
        socket.set_ack_delay(config.ack_delay);
        socket.set_congestion_control(if config.congestion_control {
            tcp::CongestionControl::Reno
        } else {
            tcp::CongestionControl::None
        });
        socket.set_timeout(config.timeout);
        socket.set_keep_alive(config.keep_alive);
        Ok(NewSocket { socket, pages, buffers: rx + tx })
    }

    /// Adds a socket to the table; `None` when full.
    fn insert(&mut self, new: NewSocket, role: Role, next_hop: MacAddr) -> Option<u32> {
        if self.live >= self.config.max_sockets {
            return None;
        }
        let NewSocket { socket, pages, buffers } = new;
        let state = map_state(socket.state());
        let mut set = SocketSet::new(Vec::with_capacity(1));
        let handle = set.add(socket);
        let entry = Entry {
            set,
            pages,
            handle,
            timer: None,
            pages_used: false,
            busy_at: self.now,
            release_at: None,
            role,
            tuple: None,
            released: false,
            state,
            close_reason: None,
            observed: Observed::default(),
            next_hop,
            buffers,
        };
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                self.slots.push(Slot::default());
                u32::try_from(self.slots.len() - 1).ok()?
            }
        };
        let slot = self.slots.get_mut(index as usize)?;
        slot.entry = Some(entry);
        self.live += 1;
        self.reserved += buffers;
        Some(index)
    }

    fn remove(&mut self, index: u32) {
        let entry = {
            let Some(slot) = self.slots.get_mut(index as usize) else {
                return;
            };
            let Some(entry) = slot.entry.take() else {
                return;
            };
            slot.generation = slot.generation.wrapping_add(1);
            entry
        };
        if let Some(at) = entry.timer {
            self.timers.remove(&(at, index));
        }
        self.ready.remove(&SocketId {
            index,
            generation: self.slots.get(index as usize).map_or(0, |slot| slot.generation.wrapping_sub(1)),
        });
        if let Some(tuple) = entry.tuple {
            if self.by_tuple.get(&tuple) == Some(&index) {
                self.by_tuple.remove(&tuple);
            }
        }
        match entry.role {
            Role::Listening { port } | Role::Pending { port } => {
                if let Some(listener) = self.listeners.get_mut(&port) {
                    if listener.armed == Some(index) {
                        listener.armed = None;
                    }
                    listener.pending.retain(|&pending| pending != index);
                }
            }
            Role::Connection { .. } => {}
        }
        self.free.push(index);
        self.live -= 1;
        self.reserved -= entry.buffers;
    }

    fn arm_listener(&mut self, port: u16) -> Result<(), TcpError> {
        let mut new = self.new_socket()?;
        new.socket
            .listen(IpEndpoint::new(IpAddress::Ipv4(self.config.ip), port))
            .map_err(|_| TcpError::Unaddressable)?;
        let index = self.insert(new, Role::Listening { port }, [0; 6]).ok_or(TcpError::NoResources)?;
        if let Some(listener) = self.listeners.get_mut(&port) {
            listener.armed = Some(index);
        }
        Ok(())
    }

    /// Keeps one socket listening on `port` while fewer than its backlog
    /// wait to be accepted. One, not a backlog of them: its buffers are
    /// sized when it is armed (the SYN before took the previous one), from
    /// the budget the connections of that moment leave.
    fn rearm(&mut self, port: u16) {
        let Some(listener) = self.listeners.get(&port) else {
            return;
        };
        if listener.armed.is_none() && listener.pending.len() < listener.backlog {
            // Out of sockets: SYNs are refused (RST) until one is freed.
            let _ = self.arm_listener(port);
        }
    }

    /// Runs smoltcp on the socket set of slot `target` (none: an empty
    /// set, so smoltcp refuses the segment with RST): one received IPv4
    /// packet (`rx`, with the MAC it came from), or its egress with up to
    /// `budget` frames. Returns the frames sent.
    fn run(
        &mut self,
        now: Instant,
        target: Option<u32>,
        rx: Option<(&[u8], MacAddr)>,
        uplink: &mut dyn FnMut(&[u8]),
        budget: usize,
    ) -> usize {
        self.now = now;
        self.socket_polls += 1;
        let mtu = self.config.mtu;
        let our_mac = self.config.mac;
        // Lent out of its entry while smoltcp runs (the transmit path
        // needs the entries); moving a set keeps its handles valid.
        let mut set = match target.and_then(|index| entry_at(&mut self.slots, index)) {
            Some(entry) => std::mem::replace(&mut entry.set, SocketSet::new(Vec::new())),
            None => SocketSet::new(Vec::new()),
        };
        let SmolToe { iface, slots, by_tuple, scratch, .. } = self;
        let mut port = Port {
            rx: rx.map(|(packet, _)| packet),
            tx: TxPath {
                scratch,
                uplink,
                slots,
                by_tuple,
                budget,
                mtu,
                our_mac,
                reply_to: rx.map(|(_, mac)| mac),
                now,
            },
        };
        if port.rx.is_some() {
            // Immediate replies (an RST to a stray segment) use the token
            // that comes with the received packet, whatever the budget.
            iface.poll_ingress_single(now, &mut port, &mut set);
        } else {
            while port.tx.budget > 0 {
                if iface.poll_egress(now, &mut port, &mut set) == smoltcp::iface::PollResult::None {
                    break;
                }
            }
        }
        let sent = budget.saturating_sub(port.tx.budget);
        if let Some(entry) = target.and_then(|index| entry_at(&mut self.slots, index)) {
            entry.set = set;
        }
        sent
    }

    /// Polls the sockets whose timers are due, oldest first, with up to
    /// `budget` frames; those the budget does not reach stay due.
    fn poll_due(&mut self, now: Instant, uplink: &mut dyn FnMut(&[u8]), budget: usize) -> usize {
        let mut due = Vec::new();
        let mut sent = 0;
        while let Some(&(at, index)) = self.timers.first() {
            if at > now || sent >= budget {
                break;
            }
            self.timers.pop_first();
            if let Some(entry) = entry_at(&mut self.slots, index) {
                entry.timer = None;
            }
            sent += self.run(now, Some(index), None, uplink, budget - sent);
            due.push(index);
        }
        for index in due {
            self.touch(index);
        }
        sent
    }

    /// After anything happened to the socket of slot `index`: queues its
    /// next timer and settles its entry.
    fn touch(&mut self, index: u32) {
        let now = self.now;
        let id = self.id_of(index);
        let Some(entry) = entry_at(&mut self.slots, index) else {
            return;
        };
        let release_at = entry.release_idle_pages(now, self.config.buffer_release);
        let at = match (self.iface.poll_at(now, &entry.set), release_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if entry.timer != at {
            if let Some(old) = entry.timer {
                self.timers.remove(&(old, index));
            }
            if let Some(at) = at {
                self.timers.insert((at, index));
            }
            entry.timer = at;
        }
        self.ready.insert(id);
        self.settle(index);
    }

    /// One received frame (from the uplink, or looped back): to the set of
    /// its connection, or of the port's listening socket.
    fn take_in(&mut self, now: Instant, frame: &[u8], uplink: &mut dyn FnMut(&[u8])) {
        let Some(segment) = frame::parse(frame) else {
            return;
        };
        if !self.wants_segment(&segment) {
            return;
        }
        let tuple = segment.tuple_at_receiver();
        let target = if let Some(&index) = self.by_tuple.get(&tuple) {
            let id = self.id_of(index);
            let Some(entry) = self.entry_mut(id) else {
                return;
            };
            // A SYN (no ACK) for a tuple we track is a duplicate or a
            // reuse during TIME-WAIT: never let a second listener take it.
            if segment.has(flags::SYN) && !segment.has(flags::ACK) && entry.state != TcpState::SynSent {
                return;
            }
            entry.observed.incoming(&segment, now);
            Some(index)
        } else {
            self.listeners.get(&segment.dst.port()).and_then(|l| l.armed)
        };
        let Some(packet) = frame.get(ETHERNET_HEADER_LEN..) else {
            return;
        };
        self.run(now, target, Some((packet, segment.src_mac)), uplink, 1);
        self.after_ingress(&segment, target);
        if let Some(index) = target {
            self.touch(index);
        }
    }

    fn burst(&self) -> usize {
        if self.config.max_burst == 0 {
            usize::MAX
        } else {
            self.config.max_burst
        }
    }

    fn wants_segment(&self, segment: &Segment) -> bool {
        segment.dst_mac == self.config.mac
            && *segment.dst.ip() == self.config.ip
            && (self.by_tuple.contains_key(&segment.tuple_at_receiver())
                || self.listeners.contains_key(&segment.dst.port()))
    }

    /// After smoltcp processed `segment` on the set of `target`: registers
    /// a new half-open connection, notices resets and closes.
    fn after_ingress(&mut self, segment: &Segment, target: Option<u32>) {
        let Some(index) = target else {
            return;
        };
        let tuple = segment.tuple_at_receiver();
        let id = self.id_of(index);
        let SmolToe { slots, by_tuple, listeners, .. } = self;
        let Some(entry) = slots.get_mut(id.index as usize).and_then(|slot| slot.entry.as_mut()) else {
            return;
        };
        let state = map_state(entry.socket().state());
        if entry.tuple == Some(tuple) {
            let is_rst = segment.has(flags::RST);
            let previous = entry.state;
            entry.state = state;
            if state == TcpState::Listen {
                // RST in SYN-RECEIVED: smoltcp returns the socket to LISTEN.
                // It listens again unless another socket does already.
                entry.tuple = None;
                entry.observed = Observed::default();
                by_tuple.remove(&tuple);
                if let Role::Pending { port } = entry.role {
                    entry.role = Role::Listening { port };
                    match listeners.get_mut(&port) {
                        Some(listener) if listener.armed.is_none() => {
                            listener.pending.retain(|&pending| pending != index);
                            listener.armed = Some(index);
                        }
                        _ => self.remove(index),
                    }
                }
            } else if state == TcpState::Closed && previous != TcpState::Closed {
                entry.close_reason.get_or_insert(if is_rst { CloseReason::Reset } else { CloseReason::Graceful });
            }
            return;
        }
        // The port's listening socket: did it take the SYN?
        let Role::Listening { port } = entry.role else {
            return;
        };
        let socket = entry.socket();
        let took = socket.local_endpoint().and_then(endpoint).zip(socket.remote_endpoint().and_then(endpoint));
        if took != Some((tuple.local, tuple.remote)) {
            return;
        }
        entry.role = Role::Pending { port };
        entry.tuple = Some(tuple);
        entry.next_hop = segment.src_mac;
        entry.state = state;
        entry.observed.incoming(segment, Instant::from_micros(0));
        entry.observed.segs_in = 1;
        by_tuple.insert(tuple, index);
        if let Some(listener) = listeners.get_mut(&port) {
            listener.armed = None;
            listener.pending.push_back(index);
        }
        self.rearm(port);
    }

    /// After a socket changed: closes discovered here are timeouts, except
    /// the end of TIME-WAIT. Frees it if released and done, or if it was
    /// half-open (or listening) and died.
    fn settle(&mut self, index: u32) {
        let Some(entry) = entry_at(&mut self.slots, index) else {
            return;
        };
        let state = map_state(entry.socket().state());
        if state == TcpState::Closed && entry.state != TcpState::Closed {
            entry.close_reason.get_or_insert(match entry.state {
                TcpState::TimeWait => CloseReason::Graceful,
                _ => CloseReason::Timeout,
            });
        }
        entry.state = state;
        let done = socket_done(entry.socket());
        match entry.role {
            Role::Pending { port } | Role::Listening { port } if done => {
                self.remove(index);
                self.rearm(port);
            }
            Role::Connection { .. } if done && entry.released => self.remove(index),
            _ => {}
        }
    }
}
