//! The TOE: TCP offload for the iWARP engine.
//!
//! The device hands the TOE whole Ethernet frames from the uplink
//! ([`Transport::ingress`], after asking [`Transport::wants`] during demux)
//! and sends whatever frames the TOE emits ([`Transport::egress`]). The TOE
//! owns the TCP state of every offloaded connection (a TCB table that can be
//! dumped, [`TcbInfo`]) and exposes byte streams to the engine.
//!
//! [`Transport`] is our own trait so that the stack can be replaced;
//! [`SmolToe`] implements it with smoltcp. The engine drives it through a
//! [`Link`], which loops frames for our own MAC back in and injects faults
//! on a connection's frames. Time is always injected by the caller
//! ([`Instant`]), so tests are deterministic.
//!
//! What the TOE does **not** do: answer ARP for the guest's address (the
//! guest kernel does), route (every peer is reached through the L2 next hop
//! the driver gives with [`Transport::connect`], or the source MAC of the
//! peer's SYN for passive connections), or carry anything but TCP.

use core::fmt;
use std::net::SocketAddrV4;

use thiserror::Error;

// mmap, madvise and mincore: the crate's only unsafe code (see lib.rs).
#[allow(unsafe_code)]
mod buffer;
pub mod frame;
mod link;
mod observed;
mod port;
mod smol;

pub use buffer::BufferError;
pub use link::{FaultCounters, Link, LinkFault, MAX_DELAYED_FRAMES, MAX_LOOPED_FRAMES};
pub use smol::{SmolToe, MAX_BACKLOG};
pub use smoltcp::time::{Duration, Instant};

/// An Ethernet MAC address.
pub type MacAddr = [u8; 6];

/// A TOE socket: a listening slot or a connection. Ids are never reused
/// while the engine may still hold them (the generation changes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SocketId {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl SocketId {
    /// A compact number for logs and tables (`index`, `generation` in the high bits).
    pub fn as_u64(self) -> u64 {
        u64::from(self.generation) << 32 | u64::from(self.index)
    }
}

impl fmt::Display for SocketId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "s{}.{}", self.index, self.generation)
    }
}

/// The connection 4-tuple, seen from the guest (local) side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FourTuple {
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
}

impl fmt::Display for FourTuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} <-> {}", self.local, self.remote)
    }
}

/// RFC 793 connection states, with their names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TcpState {
    Closed,
    Listen,
    SynSent,
    SynReceived,
    Established,
    FinWait1,
    FinWait2,
    CloseWait,
    Closing,
    LastAck,
    TimeWait,
}

impl TcpState {
    pub const ALL: [TcpState; 11] = [
        TcpState::Closed,
        TcpState::Listen,
        TcpState::SynSent,
        TcpState::SynReceived,
        TcpState::Established,
        TcpState::FinWait1,
        TcpState::FinWait2,
        TcpState::CloseWait,
        TcpState::Closing,
        TcpState::LastAck,
        TcpState::TimeWait,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            TcpState::Closed => "CLOSED",
            TcpState::Listen => "LISTEN",
            TcpState::SynSent => "SYN-SENT",
            TcpState::SynReceived => "SYN-RECEIVED",
            TcpState::Established => "ESTABLISHED",
            TcpState::FinWait1 => "FIN-WAIT-1",
            TcpState::FinWait2 => "FIN-WAIT-2",
            TcpState::CloseWait => "CLOSE-WAIT",
            TcpState::Closing => "CLOSING",
            TcpState::LastAck => "LAST-ACK",
            TcpState::TimeWait => "TIME-WAIT",
        }
    }
}

impl fmt::Display for TcpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a connection ended: the distinct outcomes docs/architecture.md §5
/// reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    /// FIN sent and acknowledged, FIN received (or TIME-WAIT reached).
    Graceful,
    /// The peer sent an acceptable RST (including a refused SYN).
    Reset,
    /// Retransmissions or keep-alive probes went unanswered for the socket
    /// timeout ([`TcpConfig::timeout`]), or the handshake never completed.
    Timeout,
    /// We aborted it ([`Transport::abort`]): an RST went out.
    Aborted,
}

impl CloseReason {
    pub const fn name(self) -> &'static str {
        match self {
            CloseReason::Graceful => "graceful",
            CloseReason::Reset => "reset",
            CloseReason::Timeout => "timeout",
            CloseReason::Aborted => "aborted",
        }
    }
}

/// What the engine needs to know about a connection, in one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkStatus {
    /// Handshake in progress.
    Connecting,
    /// Both directions open.
    Established,
    /// The peer's FIN arrived (all data before it is readable); we may still send.
    PeerClosed,
    /// Our FIN is queued or sent; the peer may still send.
    Closing,
    /// Gone, for this reason. TIME-WAIT already counts as `Closed(Graceful)`.
    Closed(CloseReason),
}

/// One TCB as the management interface dumps it (`cxgbtool`-style).
///
/// Sequence numbers, windows and the RTT estimate are observed on the
/// frames the TOE receives and sends (smoltcp keeps its own private
/// copies); `None` until the relevant segment has been seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcbInfo {
    pub id: SocketId,
    pub state: TcpState,
    /// `None` for a socket still listening.
    pub tuple: Option<FourTuple>,
    /// The listening port this connection arrived on, for passive ones.
    pub listen_port: Option<u16>,
    /// Oldest unacknowledged sequence number (highest ACK from the peer).
    pub snd_una: Option<u32>,
    /// Next sequence number we will send (highest sent).
    pub snd_nxt: Option<u32>,
    /// Next sequence number we expect (last ACK we sent).
    pub rcv_nxt: Option<u32>,
    /// The peer's advertised receive window, scaled, in octets.
    pub snd_wnd: Option<u32>,
    /// Our last advertised receive window, scaled, in octets.
    pub rcv_wnd: Option<u32>,
    /// Window scale shifts (ours, peer's) once negotiated.
    pub rcv_wscale: u8,
    pub snd_wscale: u8,
    /// MSS we announced and MSS the peer announced.
    pub local_mss: u16,
    pub peer_mss: Option<u16>,
    /// Smoothed RTT and its variance (RFC 6298, Karn's rule).
    pub srtt: Option<Duration>,
    pub rttvar: Option<Duration>,
    /// Segments sent again (sequence space below the highest already sent).
    pub retransmits: u64,
    pub segs_in: u64,
    pub segs_out: u64,
    /// TCP payload octets received and sent on the wire (retransmissions included in `bytes_out_wire`).
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub bytes_out_wire: u64,
    /// Octets waiting in the socket buffers.
    pub send_queue: usize,
    pub recv_queue: usize,
    pub close_reason: Option<CloseReason>,
    pub blackholed: bool,
    /// Fault injection: percentage of frames dropped both ways (0: none).
    pub drop_percent: u8,
    /// Fault injection: every frame we send is held this long.
    pub delay: Option<Duration>,
    /// Fault injection: data segments we send are cut in two.
    pub split: Option<Split>,
}

/// Fault injection ([`LinkFault::Split`]): each data segment a
/// connection sends leaves as two, the last `tail` octets of its payload
/// `hold` after the rest, as a sender that segments differently would
/// send them. With a `tail` of 1 to 3, an FPDU's CRC, which ends a
/// segment, reaches the peer in two segments that its receive path does
/// not coalesce: its MPA reassembly of a split trailer is exercised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    pub tail: u16,
    pub hold: Duration,
}

/// Static TOE parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpConfig {
    /// The guest's MAC and IPv4 address: the TOE sends from them and accepts frames to them.
    pub mac: MacAddr,
    pub ip: std::net::Ipv4Addr,
    /// IP MTU of the uplink (1500 for Ethernet); MSS = MTU - 40.
    pub mtu: usize,
    /// Per-connection socket buffers at most. The receive buffer decides
    /// the window scale; the send buffer bounds what the engine queues ahead.
    pub rx_buffer: usize,
    pub tx_buffer: usize,
    /// Octets of socket buffers (receive and send together) all sockets
    /// share: a new socket gets an equal share among the sockets that
    /// exist, no more than is left, between [`TcpConfig::buffer_floor`]
    /// and the two maxima above. So what the TOE allocates is at most
    /// `buffer_budget + max_sockets × 2 × buffer_floor`, however many
    /// connections a guest opens, and few connections keep full windows.
    pub buffer_budget: usize,
    /// A socket whose buffers have both stayed empty this long gives
    /// their pages back to the kernel (they are faulted in again when
    /// data comes), so an idle connection holds no buffer page; `None`:
    /// pages stay once touched.
    pub buffer_release: Option<Duration>,
    /// Abort after this long without hearing from the peer (smoltcp's
    /// socket timeout counts from the last segment received, idle or not,
    /// so keep it well above `keep_alive`); `None`: never.
    pub timeout: Option<Duration>,
    /// Send a keep-alive probe after this long without traffic, so an idle
    /// but healthy connection never reaches `timeout`.
    pub keep_alive: Option<Duration>,
    /// Delayed-ACK time (smoltcp default 10 ms); `None` acks at once.
    pub ack_delay: Option<Duration>,
    /// Nagle's algorithm (off: iWARP sends whole FPDUs and wants latency).
    pub nagle: bool,
    /// Reno congestion control (RFC 5681): a datagram uplink drops what its
    /// queue cannot hold, and without it a loss costs the whole window again
    /// and again; off, smoltcp sends as much as the peer's window allows.
    /// (smoltcp's CUBIC needs floating point from `std` or `libm`.)
    pub congestion_control: bool,
    /// Sockets of all kinds, listening slots included.
    pub max_sockets: usize,
    /// Frames emitted per [`Transport::egress`] call at most (pacing, so a
    /// datagram uplink's socket buffer does not overflow); 0: unlimited.
    pub max_burst: usize,
    /// Seed for initial sequence numbers and ports.
    pub seed: u64,
}

impl TcpConfig {
    pub fn new(mac: MacAddr, ip: std::net::Ipv4Addr) -> Self {
        TcpConfig {
            mac,
            ip,
            mtu: 1500,
            rx_buffer: 256 * 1024,
            tx_buffer: 256 * 1024,
            buffer_budget: usize::MAX,
            buffer_release: Some(Duration::from_millis(100)),
            timeout: Some(Duration::from_secs(60)),
            keep_alive: Some(Duration::from_secs(15)),
            ack_delay: Some(Duration::from_millis(10)),
            nagle: false,
            congestion_control: true,
            max_sockets: 1024,
            max_burst: 0,
            seed: 0x7633_746f_6521,
        }
    }

    /// A user timeout: a connection that hears nothing from its peer for
    /// `timeout` closes as timed out ([`CloseReason::Timeout`]), whether
    /// data is outstanding (retransmissions unanswered) or not; keep-alive
    /// probes go out after `timeout / 3` of silence, so a healthy idle
    /// connection never reaches it. A blackholed connection therefore ends
    /// between `2/3 · timeout` and `timeout` after its last received
    /// segment.
    pub fn set_user_timeout(&mut self, timeout: Duration) {
        let timeout = timeout.max(Duration::from_millis(300));
        self.timeout = Some(timeout);
        self.keep_alive = Some(timeout / 3);
    }

    /// The MSS we announce: MTU minus IPv4 and TCP headers.
    pub fn mss(&self) -> u16 {
        u16::try_from(self.mtu.saturating_sub(40)).unwrap_or(u16::MAX)
    }

    /// The smallest buffer of a socket, each way, once the budget is
    /// spent: 64 KiB (the window of every connection before windows
    /// followed the MTU; more than any segment). Measured: with two
    /// segments (2920 octets at MTU 1500) connection setup failed past
    /// the budget (docs/performance.md, round 3).
    pub fn buffer_floor(&self) -> usize {
        (64 * 1024).min(self.rx_buffer).min(self.tx_buffer)
    }

    /// Receive and send buffer sizes of a new socket when `sockets` hold
    /// `reserved` octets of buffers already ([`TcpConfig::buffer_budget`]).
    pub fn buffer_sizes(&self, sockets: usize, reserved: usize) -> (usize, usize) {
        let share = self.buffer_budget / sockets.saturating_add(1);
        let left = self.buffer_budget.saturating_sub(reserved);
        let each_way = share.min(left) / 2;
        let floor = self.buffer_floor();
        (each_way.clamp(floor, self.rx_buffer.max(floor)), each_way.clamp(floor, self.tx_buffer.max(floor)))
    }
}

/// TOE errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum TcpError {
    #[error("no such socket")]
    NoSocket,
    #[error("socket table full")]
    NoResources,
    #[error("port {0} is already in use")]
    PortInUse(u16),
    #[error("invalid address or port")]
    Unaddressable,
    #[error("invalid configuration: {0}")]
    Config(&'static str),
    #[error("the connection cannot carry data now")]
    InvalidState,
}

/// The TCP stack as the engine sees it. Everything is driven by the
/// caller: frames in, frames out, time injected.
pub trait Transport {
    /// Our MAC address: frames to it come back in ([`Link`]).
    fn mac(&self) -> MacAddr;

    /// Should the device hand this uplink frame to the TOE? True only for
    /// IPv4/TCP to our MAC and IP on an offloaded 4-tuple or a listening port.
    fn wants(&self, frame: &[u8]) -> bool;

    /// Processes one frame (call only if [`Transport::wants`] said so; other
    /// frames are dropped). Replies (e.g. an RST) go to `uplink` at once.
    fn ingress(&mut self, now: Instant, frame: &[u8], uplink: &mut dyn FnMut(&[u8]));

    /// Emits what the sockets have to send and runs their timers.
    fn egress(&mut self, now: Instant, uplink: &mut dyn FnMut(&[u8]));

    /// When [`Transport::egress`] must run next at the latest (`None`: no timer).
    fn poll_at(&mut self, now: Instant) -> Option<Instant>;

    /// Hands `f` every socket something happened to since the last call
    /// (a frame in or out, a timer, a call of the engine's), each once, and
    /// forgets them: the engine looks at those connections only.
    fn take_ready(&mut self, f: &mut dyn FnMut(SocketId));

    /// The uplink takes at most `frames` more frames from the egress calls
    /// that follow, until this is called again: segments beyond it stay in
    /// their socket buffers instead of being lost in a full queue (which
    /// costs a retransmission timeout and the congestion window).
    fn set_egress_room(&mut self, frames: usize);

    /// Listens on `port` with room for `backlog` connections not yet
    /// accepted (half-open included); SYNs beyond are answered with RST.
    fn listen(&mut self, port: u16, backlog: usize) -> Result<(), TcpError>;

    /// Stops listening: closes the idle listening slots and aborts
    /// connections not yet accepted.
    fn unlisten(&mut self, port: u16);

    /// Takes the next established connection from `port`'s backlog.
    fn accept(&mut self, port: u16) -> Option<SocketId>;

    /// Active open from our IP, `local_port`, to `remote`, through the L2
    /// next hop `next_hop` (the peer itself or the gateway).
    fn connect(
        &mut self,
        now: Instant,
        local_port: u16,
        remote: SocketAddrV4,
        next_hop: MacAddr,
    ) -> Result<SocketId, TcpError>;

    /// The connection's state for the engine; `None` for an unknown id.
    fn status(&self, id: SocketId) -> Option<LinkStatus>;

    /// Hands the received bytes to `f` (in up to two contiguous pieces);
    /// `f` returns how many it consumed. Returns the total consumed.
    fn recv(&mut self, id: SocketId, f: &mut dyn FnMut(&[u8]) -> usize) -> Result<usize, TcpError>;

    /// Octets received in order and not read yet (0 for an unknown id).
    fn recv_queue(&self, id: SocketId) -> usize;

    /// Free octets in the send buffer (0 once our FIN is queued).
    fn send_space(&self, id: SocketId) -> usize;

    /// Lends `f` the contiguous free part of the send buffer (possibly less
    /// than [`Transport::send_space`] when the ring wraps); `f` returns how
    /// many octets it wrote at the front. This is the zero-copy path.
    fn send_with(&mut self, id: SocketId, f: &mut dyn FnMut(&mut [u8]) -> usize) -> Result<usize, TcpError>;

    /// Copies `data` into the send buffer; returns how much fitted.
    fn send_slice(&mut self, id: SocketId, data: &[u8]) -> Result<usize, TcpError>;

    /// Graceful close: FIN after the queued data.
    fn close(&mut self, id: SocketId);

    /// Abortive close: RST now.
    fn abort(&mut self, id: SocketId);

    /// The engine is done with `id`: the TOE frees it once TCP is done with
    /// it (after TIME-WAIT). The id must not be used again.
    fn release(&mut self, id: SocketId);

    /// The effective send MSS (the smaller of ours and the peer's).
    fn mss(&self, id: SocketId) -> u16;

    /// One TCB.
    fn tcb(&self, id: SocketId) -> Option<TcbInfo>;

    /// Every TCB, listening slots included.
    fn for_each_tcb(&self, f: &mut dyn FnMut(&TcbInfo));
}

#[cfg(test)]
mod tests;
