//! The Ethernet function of the T3: frames between the guest's virtqueues
//! and the uplink, the MAC filter, the EtherType classification that lets
//! the device ([`crate::t3`]) hand the RDMA function its share, and the
//! counters.

pub mod guest_frames;
pub mod virtio;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::uplink::{self, Uplink};

/// EtherType of the driver↔device control channel (IEEE local
/// experimental). Never forwarded to or accepted from the uplink.
pub const VT3_CONTROL_ETHERTYPE: u16 = 0x88b5;
/// Ethernet header plus one VLAN tag.
pub const L2_OVERHEAD: usize = 18;
/// Shortest frame we pass on (destination, source, EtherType).
const MIN_FRAME: usize = 14;

pub type MacAddr = [u8; 6];

/// Where a frame from the guest goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestFrame {
    /// Ordinary traffic for the uplink.
    Uplink,
    /// A control frame for the device (consumed, never forwarded).
    Control,
    /// A control frame under VLAN tags: dropped (counted), never forwarded.
    TaggedControl,
    /// Too short to be Ethernet.
    Runt,
}

/// Classifies a frame the guest transmitted. Control frames carry no VLAN
/// tag (vt3_hw.h): a tagged one is not the driver's and never leaves.
pub fn classify_from_guest(frame: &[u8]) -> GuestFrame {
    let Some(outer) = be16_at(frame, 12) else {
        return GuestFrame::Runt;
    };
    match outer {
        VT3_CONTROL_ETHERTYPE => GuestFrame::Control,
        _ if inner_ethertype(frame) == Some(VT3_CONTROL_ETHERTYPE) => GuestFrame::TaggedControl,
        _ => GuestFrame::Uplink,
    }
}

fn be16_at(frame: &[u8], at: usize) -> Option<u16> {
    frame.get(at..at + 2).and_then(|b| b.try_into().ok()).map(u16::from_be_bytes)
}

/// EtherType of a frame under all its VLAN tags (802.1Q, 802.1ad and the
/// old 0x9100 QinQ), however many.
pub fn inner_ethertype(frame: &[u8]) -> Option<u16> {
    let mut at = 12;
    loop {
        match be16_at(frame, at)? {
            0x8100 | 0x88a8 | 0x9100 => at += 4,
            t => return Some(t),
        }
    }
}

/// Counters of the Ethernet function; read by logs now and by `vt3d ctl`.
#[derive(Debug, Default)]
pub struct NicStats {
    pub tx_frames: AtomicU64,
    pub tx_bytes: AtomicU64,
    pub tx_malformed_chains: AtomicU64,
    pub tx_uplink_errors: AtomicU64,
    /// Frames that found the uplink full and waited for writability.
    pub tx_uplink_queued: AtomicU64,
    /// Frames dropped because the uplink's send queue was full too.
    pub tx_uplink_dropped: AtomicU64,
    pub tx_runts: AtomicU64,
    /// Frames from the guest longer than the uplink's MTU allows: never
    /// sent (a bridge or VXLAN device past the uplink would drop them
    /// without a trace); the first, second, fourth, … are logged.
    pub tx_dropped_oversize: AtomicU64,
    /// Control frames from the guest under VLAN tags (not the driver's).
    pub tx_dropped_tagged_control: AtomicU64,
    pub control_frames: AtomicU64,
    pub rx_frames: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub rx_malformed_chains: AtomicU64,
    pub rx_dropped_no_room: AtomicU64,
    pub rx_dropped_oversize: AtomicU64,
    pub rx_dropped_control: AtomicU64,
    /// Frames for the guest dropped, oldest first, while the RX ring had
    /// no buffers and the held-frame queue was full.
    pub rx_dropped_backlog: AtomicU64,
    pub rx_filtered: AtomicU64,
    /// Times a virtqueue was found broken (an impossible available index,
    /// ring memory gone) and left alone until the frontend resets it.
    pub tx_queue_broken: AtomicU64,
    pub rx_queue_broken: AtomicU64,
    /// Times a wake-up spent its budget with work left (it resumes on its
    /// own; a steady count means a guest or peer keeps vt3d saturated).
    pub tx_budget_yields: AtomicU64,
    pub rx_budget_yields: AtomicU64,
    /// Times the TX ring was left unread because the guest's replies and
    /// events were at their cap (the guest takes no RX frames), or because
    /// the uplink was congested; times delivery found the RX ring empty.
    pub tx_paused_replies: AtomicU64,
    pub tx_paused_uplink: AtomicU64,
    pub rx_ring_empty: AtomicU64,
    /// RX passes that found the ring not ready, disabled or broken.
    pub rx_ring_unusable: AtomicU64,
    /// TX kicks from the guest; TX passes that found the ring not ready
    /// or disabled; the TX ring's avail index and the device's next index
    /// after the last pass (levels: equal when nothing waits).
    pub tx_kicks: AtomicU64,
    /// Times the ring watchdog found TX chains waiting and read them; of
    /// those, times no kick came by its next look (a lost kick).
    pub tx_watchdog_reads: AtomicU64,
    pub tx_kicks_missed: AtomicU64,
    pub tx_ring_unusable: AtomicU64,
    pub tx_ring_avail: AtomicU64,
    pub tx_ring_next: AtomicU64,
    /// Frames of the device (replies, events) waiting for RX buffers, as
    /// of the last RX pass (a level, not a count).
    pub device_frames_waiting: AtomicU64,
    /// Frames of offloaded connections, from and to the uplink.
    pub toe_rx_frames: AtomicU64,
    pub toe_tx_frames: AtomicU64,
    /// Wake-ups of the worker (every event it handled): one that stops
    /// moving while the timer runs means the worker is stuck.
    pub worker_wakeups: AtomicU64,
    /// Uplink frames dropped while no guest was connected (between
    /// frontend sessions), as a NIC without a driver drops them.
    pub rx_dropped_no_guest: AtomicU64,
}

impl NicStats {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn rows(&self) -> [(&'static str, u64); 37] {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("tx_frames", g(&self.tx_frames)),
            ("tx_bytes", g(&self.tx_bytes)),
            ("tx_malformed_chains", g(&self.tx_malformed_chains)),
            ("tx_uplink_errors", g(&self.tx_uplink_errors)),
            ("tx_uplink_queued", g(&self.tx_uplink_queued)),
            ("tx_uplink_dropped", g(&self.tx_uplink_dropped)),
            ("tx_runts", g(&self.tx_runts)),
            ("tx_dropped_oversize", g(&self.tx_dropped_oversize)),
            ("tx_dropped_tagged_control", g(&self.tx_dropped_tagged_control)),
            ("control_frames", g(&self.control_frames)),
            ("rx_frames", g(&self.rx_frames)),
            ("rx_bytes", g(&self.rx_bytes)),
            ("rx_malformed_chains", g(&self.rx_malformed_chains)),
            ("rx_dropped_no_room", g(&self.rx_dropped_no_room)),
            ("rx_dropped_oversize", g(&self.rx_dropped_oversize)),
            ("rx_dropped_control", g(&self.rx_dropped_control)),
            ("rx_dropped_backlog", g(&self.rx_dropped_backlog)),
            ("rx_filtered", g(&self.rx_filtered)),
            ("tx_queue_broken", g(&self.tx_queue_broken)),
            ("rx_queue_broken", g(&self.rx_queue_broken)),
            ("tx_budget_yields", g(&self.tx_budget_yields)),
            ("rx_budget_yields", g(&self.rx_budget_yields)),
            ("tx_paused_replies", g(&self.tx_paused_replies)),
            ("tx_paused_uplink", g(&self.tx_paused_uplink)),
            ("rx_ring_empty", g(&self.rx_ring_empty)),
            ("rx_ring_unusable", g(&self.rx_ring_unusable)),
            ("tx_kicks", g(&self.tx_kicks)),
            ("tx_watchdog_reads", g(&self.tx_watchdog_reads)),
            ("tx_kicks_missed", g(&self.tx_kicks_missed)),
            ("tx_ring_unusable", g(&self.tx_ring_unusable)),
            ("tx_ring_avail", g(&self.tx_ring_avail)),
            ("tx_ring_next", g(&self.tx_ring_next)),
            ("device_frames_waiting", g(&self.device_frames_waiting)),
            ("toe_rx_frames", g(&self.toe_rx_frames)),
            ("toe_tx_frames", g(&self.toe_tx_frames)),
            ("worker_wakeups", g(&self.worker_wakeups)),
            ("rx_dropped_no_guest", g(&self.rx_dropped_no_guest)),
        ]
    }
}

impl fmt::Display for NicStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        for (name, value) in self.rows() {
            write!(f, "{sep}{name}={value}")?;
            sep = " ";
        }
        Ok(())
    }
}

/// The NIC as it outlives frontend connections: the uplink and counters.
#[derive(Debug)]
pub struct Nic {
    uplink: Box<dyn Uplink>,
    /// Frames waiting for the uplink to become writable.
    send_queue: Mutex<uplink::SendQueue>,
    /// Unicast frames for other MACs are filtered when set.
    mac: Option<MacAddr>,
    mtu: usize,
    pub stats: NicStats,
    /// The pcapng capture of the uplink (`--pcap`, `vt3d ctl capture`):
    /// `uplink` records into it.
    pub capture: std::sync::Arc<crate::capture::Capture>,
}

impl Nic {
    pub fn new(uplink: Box<dyn Uplink>, mac: Option<MacAddr>, mtu: usize) -> Self {
        let capture = std::sync::Arc::new(crate::capture::Capture::default());
        let uplink = Box::new(crate::capture::TappedUplink::new(uplink, std::sync::Arc::clone(&capture)));
        Self {
            uplink,
            capture,
            send_queue: Mutex::new(uplink::SendQueue::default()),
            mac,
            mtu,
            stats: NicStats::default(),
        }
    }

    pub fn uplink(&self) -> &dyn Uplink {
        self.uplink.as_ref()
    }

    /// Largest frame (without virtio-net header) carried either way.
    pub fn max_frame(&self) -> usize {
        self.mtu + L2_OVERHEAD
    }

    /// Takes a frame the guest transmitted: uplink traffic is sent, and
    /// the caller hands control frames to the RNIC (never forwarded).
    pub fn from_guest(&self, frame: &[u8]) -> GuestFrame {
        let class = classify_from_guest(frame);
        match class {
            GuestFrame::Runt => NicStats::add(&self.stats.tx_runts, 1),
            GuestFrame::Control => NicStats::add(&self.stats.control_frames, 1),
            GuestFrame::TaggedControl => NicStats::add(&self.stats.tx_dropped_tagged_control, 1),
            GuestFrame::Uplink => match self.send_uplink(frame) {
                Ok(()) => {
                    NicStats::add(&self.stats.tx_frames, 1);
                    NicStats::add(&self.stats.tx_bytes, frame.len() as u64);
                }
                Err(e) => {
                    log::trace!("uplink send: {e}");
                    NicStats::add(&self.stats.tx_uplink_errors, 1);
                }
            },
        }
        class
    }

    /// Queues a frame the TOE built; [`Nic::flush_uplink`] sends what an
    /// engine pass produced in batches (one `sendmmsg` each).
    pub fn offload_to_uplink(&self, frame: &[u8]) {
        let sent = self.send_queue().defer(self.uplink.as_ref(), frame);
        let sent = match sent {
            uplink::Sent::Dropped => {
                NicStats::add(&self.stats.tx_uplink_dropped, 1);
                Err(std::io::ErrorKind::WouldBlock.into())
            }
            uplink::Sent::Failed(e) => Err(e),
            uplink::Sent::Now | uplink::Sent::Queued => Ok(()),
        };
        match sent {
            Ok(()) => NicStats::add(&self.stats.toe_tx_frames, 1),
            Err(e) => {
                log::trace!("uplink send (offload): {e}");
                NicStats::add(&self.stats.tx_uplink_errors, 1);
            }
        }
    }

    /// Sends a frame, or holds it while the uplink is full (never waits).
    fn send_uplink(&self, frame: &[u8]) -> std::io::Result<()> {
        let sent = self.send_queue().send(self.uplink.as_ref(), frame);
        match sent {
            uplink::Sent::Now => Ok(()),
            uplink::Sent::Queued => {
                NicStats::add(&self.stats.tx_uplink_queued, 1);
                Ok(())
            }
            uplink::Sent::Dropped => {
                NicStats::add(&self.stats.tx_uplink_dropped, 1);
                Err(std::io::ErrorKind::WouldBlock.into())
            }
            uplink::Sent::Failed(e) => Err(e),
        }
    }

    fn send_queue(&self) -> MutexGuard<'_, uplink::SendQueue> {
        self.send_queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends held frames while the uplink takes them (it polled writable);
    /// returns whether none is left.
    pub fn flush_uplink(&self) -> bool {
        let mut queue = self.send_queue();
        if queue.is_empty() {
            return true;
        }
        let empty = queue.flush(self.uplink.as_ref());
        NicStats::add(&self.stats.tx_uplink_errors, std::mem::take(&mut queue.flush_failures));
        empty
    }

    /// Frames wait for the uplink.
    pub fn uplink_backlog(&self) -> usize {
        self.send_queue().len()
    }

    /// Frames the uplink's send queue still holds before it drops.
    pub fn uplink_room(&self) -> usize {
        uplink::MAX_PENDING_SENDS.saturating_sub(self.uplink_backlog())
    }

    /// So many frames wait for the uplink that the guest's TX ring should
    /// be left unread until it drains (backpressure to the guest).
    pub fn uplink_congested(&self) -> bool {
        self.uplink_backlog() >= uplink::TX_PAUSE_PENDING
    }

    /// Forgets frames held for the uplink (the guest went away).
    pub fn drop_uplink_backlog(&self) {
        self.send_queue().clear();
    }

    pub fn count_offload_rx(&self) {
        NicStats::add(&self.stats.toe_rx_frames, 1);
    }

    /// Decides whether a frame from the uplink may reach the guest.
    pub fn accept_from_uplink(&self, frame: &[u8]) -> bool {
        if frame.len() > self.max_frame() {
            NicStats::add(&self.stats.rx_dropped_oversize, 1);
            return false;
        }
        if frame.len() < MIN_FRAME {
            NicStats::add(&self.stats.rx_filtered, 1);
            return false;
        }
        if inner_ethertype(frame) == Some(VT3_CONTROL_ETHERTYPE) {
            NicStats::add(&self.stats.rx_dropped_control, 1);
            return false;
        }
        if let (Some(mac), Some(dst)) = (self.mac, frame.get(..6)) {
            let group = dst.first().is_some_and(|b| b & 1 == 1);
            if !group && dst != mac {
                NicStats::add(&self.stats.rx_filtered, 1);
                return false;
            }
        }
        true
    }

    pub fn count_rx(&self, chains: &virtio::ChainStats) {
        NicStats::add(&self.stats.rx_frames, chains.frames);
        NicStats::add(&self.stats.rx_bytes, chains.bytes);
        NicStats::add(&self.stats.rx_malformed_chains, chains.malformed);
        NicStats::add(&self.stats.rx_ring_empty, chains.ring_empty);
    }

    /// Counts the guest frames a TX pass refused for the uplink's MTU
    /// (`last_len` bytes the last), and says why when the count passes a
    /// power of two (1, 2, 4, 8, …: a guest cannot flood the log).
    pub fn count_tx_oversize(&self, n: u64, last_len: usize) {
        if n == 0 {
            return;
        }
        let before = self.stats.tx_dropped_oversize.fetch_add(n, Ordering::Relaxed);
        let after = before + n;
        if before == 0 || after.ilog2() > before.ilog2() {
            log::warn!(
                "dropped a {last_len}-byte frame from the guest: over the uplink's MTU {} (frames up to {} \
                 bytes); the guest's MTU must not exceed vt3d's --mtu ({after} such frames so far)",
                self.mtu,
                self.max_frame()
            );
        }
    }

    pub fn count_tx_malformed(&self, n: u64) {
        NicStats::add(&self.stats.tx_malformed_chains, n);
    }

    pub fn count_rx_dropped(&self) {
        NicStats::add(&self.stats.rx_dropped_no_room, 1);
    }

    pub fn count_rx_dropped_backlog(&self, n: u64) {
        NicStats::add(&self.stats.rx_dropped_backlog, n);
    }

    /// Counts a virtqueue found broken (`tx`: the TX queue, else RX).
    pub fn count_queue_broken(&self, tx: bool) {
        NicStats::add(if tx { &self.stats.tx_queue_broken } else { &self.stats.rx_queue_broken }, 1);
    }

    /// Counts a wake-up that spent its budget with work left.
    pub fn count_budget_yield(&self, tx: bool) {
        NicStats::add(if tx { &self.stats.tx_budget_yields } else { &self.stats.rx_budget_yields }, 1);
    }

    /// What an RX pass left: whether the ring was usable, and how many of
    /// the device's frames still wait for buffers.
    pub fn note_rx_pass(&self, usable: bool, waiting: usize) {
        if !usable {
            NicStats::add(&self.stats.rx_ring_unusable, 1);
        }
        self.stats.device_frames_waiting.store(waiting as u64, Ordering::Relaxed);
    }

    /// No guest is connected: reads and drops every frame waiting on the
    /// uplink, so the peer is never held up by a socket nobody reads
    /// (a unix-dgram or UDP peer blocks once our receive queue is full).
    /// Returns how many were dropped.
    pub fn discard_uplink(&self, batch: &mut uplink::RecvBatch) -> u64 {
        let mut dropped = 0;
        loop {
            match batch.next_frame(self.uplink.as_ref()) {
                Ok(Some(_)) => dropped += 1,
                Ok(None) => break,
                Err(e) => {
                    log::debug!("uplink receive (no guest): {e}");
                    break;
                }
            }
        }
        NicStats::add(&self.stats.rx_dropped_no_guest, dropped);
        dropped
    }

    /// The worker woke up for an event.
    pub fn count_wakeup(&self) {
        NicStats::add(&self.stats.worker_wakeups, 1);
    }

    /// A guest TX kick.
    pub fn count_tx_kick(&self) {
        NicStats::add(&self.stats.tx_kicks, 1);
    }

    /// TX chains the ring watchdog found without a kick.
    pub fn count_missed_kick(&self) {
        NicStats::add(&self.stats.tx_kicks_missed, 1);
    }

    /// TX chains the ring watchdog read.
    pub fn count_watchdog_read(&self) {
        NicStats::add(&self.stats.tx_watchdog_reads, 1);
    }

    /// What a TX pass left: whether the ring was usable, and its indices.
    pub fn note_tx_pass(&self, usable: bool, avail: Option<u16>, next: u16) {
        if !usable {
            NicStats::add(&self.stats.tx_ring_unusable, 1);
        }
        if let Some(avail) = avail {
            self.stats.tx_ring_avail.store(u64::from(avail), Ordering::Relaxed);
        }
        self.stats.tx_ring_next.store(u64::from(next), Ordering::Relaxed);
    }

    /// Counts a TX ring left unread: replies at their cap, or the uplink.
    pub fn count_tx_paused(&self, by_replies: bool) {
        NicStats::add(if by_replies { &self.stats.tx_paused_replies } else { &self.stats.tx_paused_uplink }, 1);
    }
}

/// Parses `52:54:00:12:34:56`.
pub fn parse_mac(s: &str) -> Option<MacAddr> {
    let mut mac = [0u8; 6];
    let mut parts = s.split(':');
    for byte in &mut mac {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use std::io;
    use std::os::fd::{AsRawFd, RawFd};
    use std::sync::Mutex;

    /// An uplink that records what is sent.
    #[derive(Debug, Default)]
    struct Recorder(Mutex<Vec<Vec<u8>>>);

    impl Uplink for Recorder {
        fn send(&self, frame: &[u8]) -> io::Result<()> {
            self.0.lock().unwrap().push(frame.to_vec());
            Ok(())
        }
        fn recv_batch(&self, _: &mut [Vec<u8>], _: &mut [crate::uplink::Received]) -> io::Result<usize> {
            Ok(0)
        }
    }

    impl AsRawFd for Recorder {
        fn as_raw_fd(&self) -> RawFd {
            -1
        }
    }

    const MAC: MacAddr = [0x52, 0x54, 0, 0, 0, 1];

    fn eth(dst: MacAddr, ethertype: u16, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&dst);
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f
    }

    fn nic() -> Nic {
        Nic::new(Box::<Recorder>::default(), Some(MAC), 1500)
    }

    fn sent(nic: &Nic) -> usize {
        nic.stats.tx_frames.load(Ordering::Relaxed) as usize
    }

    #[test]
    fn control_frames_never_reach_the_uplink() {
        let nic = nic();
        nic.from_guest(&eth(MAC, VT3_CONTROL_ETHERTYPE, 64));
        for tags in [&[0x8100u16][..], &[0x88a8, 0x8100], &[0x9100, 0x8100, 0x8100, 0x8100]] {
            assert_eq!(nic.from_guest(&tagged_control(tags)), GuestFrame::TaggedControl, "{tags:x?}");
        }
        // A VLAN-tagged IPv4 frame is ordinary traffic.
        let mut vlan_ip = eth(MAC, 0x8100, 64);
        vlan_ip[16..18].copy_from_slice(&0x0800u16.to_be_bytes());
        nic.from_guest(&vlan_ip);
        nic.from_guest(&eth(MAC, 0x0800, 64));
        nic.from_guest(&[0u8; 13]);
        assert_eq!(sent(&nic), 2);
        assert_eq!(nic.stats.control_frames.load(Ordering::Relaxed), 1);
        assert_eq!(nic.stats.tx_dropped_tagged_control.load(Ordering::Relaxed), 3);
        assert_eq!(nic.stats.tx_runts.load(Ordering::Relaxed), 1);
    }

    /// A control frame under `tags` (outermost first).
    fn tagged_control(tags: &[u16]) -> Vec<u8> {
        let mut f = eth(MAC, tags[0], 64);
        let mut at = 16;
        for t in tags.iter().skip(1).copied().chain([VT3_CONTROL_ETHERTYPE]) {
            f[at..at + 2].copy_from_slice(&t.to_be_bytes());
            at += 4;
        }
        f
    }

    #[test]
    fn uplink_control_frames_are_dropped_under_any_number_of_tags() {
        let nic = nic();
        assert!(!nic.accept_from_uplink(&eth(MAC, VT3_CONTROL_ETHERTYPE, 64)));
        let tag_lists: [&[u16]; 4] = [&[0x8100], &[0x88a8, 0x8100], &[0x8100, 0x8100, 0x8100], &[0x9100; 10]];
        for tags in tag_lists {
            assert!(!nic.accept_from_uplink(&tagged_control(tags)), "{tags:x?}");
        }
        assert_eq!(nic.stats.rx_dropped_control.load(Ordering::Relaxed), 5);
        // Tags to the frame's very end: no EtherType, nothing read past it.
        assert_eq!(inner_ethertype(&[0x81, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x81, 0, 0, 1]), None);
    }

    #[test]
    fn mac_filter_passes_ours_and_group_frames_only() {
        let nic = nic();
        assert!(nic.accept_from_uplink(&eth(MAC, 0x0800, 64)));
        assert!(nic.accept_from_uplink(&eth([0xff; 6], 0x0806, 64)));
        assert!(nic.accept_from_uplink(&eth([0x33, 0x33, 0, 0, 0, 1], 0x86dd, 64)));
        assert!(!nic.accept_from_uplink(&eth([0x52, 0x54, 0, 0, 0, 2], 0x0800, 64)));
        let open = Nic::new(Box::<Recorder>::default(), None, 1500);
        assert!(open.accept_from_uplink(&eth([0x52, 0x54, 0, 0, 0, 2], 0x0800, 64)));
    }

    #[test]
    fn frames_over_the_mtu_are_dropped() {
        let nic = Nic::new(Box::<Recorder>::default(), None, 9000);
        assert!(nic.accept_from_uplink(&eth(MAC, 0x0800, 9018)));
        assert!(!nic.accept_from_uplink(&eth(MAC, 0x0800, 9019)));
        assert!(!nic.accept_from_uplink(&[0u8; 10]));
    }

    #[test]
    fn oversize_guest_frames_are_counted() {
        let nic = nic();
        let row = |name| nic.stats.rows().iter().find(|(n, _)| *n == name).unwrap().1;
        nic.count_tx_oversize(0, 0);
        nic.count_tx_oversize(1, 1514);
        nic.count_tx_oversize(2, 1514);
        assert_eq!(row("tx_dropped_oversize"), 3);
        assert_eq!(row("tx_malformed_chains"), 0);
    }

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("52:54:00:ab:CD:ef"), Some([0x52, 0x54, 0, 0xab, 0xcd, 0xef]));
        for bad in ["", "52:54:00:ab:cd", "52:54:00:ab:cd:ef:01", "5:54:00:ab:cd:ef", "zz:54:00:ab:cd:ef"] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }
}
