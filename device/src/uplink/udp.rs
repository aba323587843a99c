//! `udp:LOCAL,REMOTE`: one frame per datagram, as QEMU's
//! `-netdev socket,udp=REMOTE,localaddr=LOCAL` sends them. Runs of
//! same-size frames leave in one send and same-size datagrams may arrive
//! in one receive (UDP GSO/GRO, `gso.rs`); the wire is unchanged.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::gso::{self, Run};
use super::{grow_socket_buffers, Received, Uplink, SEND_BATCH, SOCKET_BUFFER};

/// A lowered GSO limit goes back to the largest after this long: the
/// route (its MTU, its device's offloads) may have changed since the
/// refusal, and one refused send every so often costs little.
const GSO_REPROBE: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct UdpUplink {
    socket: UdpSocket,
    /// The largest frame sent with UDP_SEGMENT (0: none). Lowered when the
    /// kernel refuses a segment size: frames over the path MTU must go as
    /// single datagrams, which IP fragments (DF is never set here).
    gso_segment_limit: AtomicUsize,
    /// The socket takes UDP_SEGMENT at all (else the limit stays 0).
    gso: bool,
    /// When the limit was last lowered (`None`: it is the largest).
    gso_lowered_at: Mutex<Option<Instant>>,
    /// [`GSO_REPROBE`], shorter in tests.
    gso_reprobe_after: Duration,
    /// Times the limit went back to the largest.
    gso_reprobes: AtomicU64,
    /// UDP_GRO is on: a receive may hold several frames.
    gro: bool,
    /// Sends that carried several frames (UDP_SEGMENT), and those frames.
    segmented_sends: AtomicU64,
    segmented_frames: AtomicU64,
    /// Receives that held several frames (UDP_GRO).
    coalesced_receives: AtomicU64,
}

impl UdpUplink {
    pub fn open(local: SocketAddr, remote: SocketAddr) -> io::Result<Self> {
        let socket = UdpSocket::bind(local)?;
        // Connecting filters what we receive to the configured peer.
        socket.connect(remote)?;
        socket.set_nonblocking(true)?;
        let fd = socket.as_raw_fd();
        grow_socket_buffers(fd, SOCKET_BUFFER);
        let gso = gso::gso_supported(fd);
        let gro = gso::enable_gro(fd).map_err(|e| log::info!("udp uplink: no UDP_GRO: {e}")).is_ok();
        if !gso {
            log::info!("udp uplink: no UDP_SEGMENT, one datagram per send");
        }
        Ok(Self {
            socket,
            gso_segment_limit: AtomicUsize::new(if gso { gso::MAX_UDP_PAYLOAD } else { 0 }),
            gso,
            gso_lowered_at: Mutex::new(None),
            gso_reprobe_after: GSO_REPROBE,
            gso_reprobes: AtomicU64::new(0),
            gro,
            segmented_sends: AtomicU64::new(0),
            segmented_frames: AtomicU64::new(0),
            coalesced_receives: AtomicU64::new(0),
        })
    }

    /// Sends that carried several frames so far.
    pub fn segmented_sends(&self) -> u64 {
        self.segmented_sends.load(Ordering::Relaxed)
    }

    /// Raises a lowered GSO limit back to the largest once it has been low
    /// for `gso_reprobe_after` (the common case, a limit at the largest,
    /// costs one atomic load).
    fn reprobe_gso(&self) {
        if !self.gso || self.gso_segment_limit.load(Ordering::Relaxed) == gso::MAX_UDP_PAYLOAD {
            return;
        }
        let mut lowered_at = self.gso_lowered_at.lock().unwrap_or_else(PoisonError::into_inner);
        if lowered_at.is_some_and(|at| at.elapsed() >= self.gso_reprobe_after) {
            *lowered_at = None;
            self.gso_segment_limit.store(gso::MAX_UDP_PAYLOAD, Ordering::Relaxed);
            self.gso_reprobes.fetch_add(1, Ordering::Relaxed);
            log::info!("udp uplink: trying UDP_SEGMENT for every frame size again");
        }
    }
}

impl Uplink for UdpUplink {
    fn send(&self, frame: &[u8]) -> io::Result<()> {
        self.socket.send(frame).map(drop)
    }

    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let frames = frames.get(..frames.len().min(SEND_BATCH)).unwrap_or_default();
        let mut runs: Vec<Run> = Vec::with_capacity(frames.len());
        self.reprobe_gso();
        loop {
            gso::plan(frames, self.gso_segment_limit.load(Ordering::Relaxed), &mut runs);
            match gso::sendmmsg_runs(self.socket.as_raw_fd(), frames, &runs) {
                Ok(messages) => {
                    let sent = runs.get(..messages).unwrap_or(&runs);
                    for run in sent.iter().filter(|r| r.segment != 0) {
                        self.segmented_sends.fetch_add(1, Ordering::Relaxed);
                        self.segmented_frames.fetch_add(run.count as u64, Ordering::Relaxed);
                    }
                    return Ok(sent.iter().map(|r| r.count).sum());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
                Err(e) => {
                    // The first run was refused. If GSO was why, frames of
                    // its size go one by one from now on (the limit only
                    // falls, so this loop ends); else the frame is at fault.
                    let first = runs.first().copied().unwrap_or(Run { count: 0, segment: 0 });
                    let limit = (first.segment != 0).then(|| gso::refused_segment(&e, first.segment)).flatten();
                    let Some(limit) = limit else { return Err(e) };
                    log::info!(
                        "udp uplink: {}-octet frames refused with UDP_SEGMENT ({e}): sent one by one",
                        first.segment
                    );
                    self.gso_segment_limit.fetch_min(limit, Ordering::Relaxed);
                    *self.gso_lowered_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
                }
            }
        }
    }

    fn recv_batch(&self, bufs: &mut [Vec<u8>], received: &mut [Received]) -> io::Result<usize> {
        loop {
            match super::batch::recvmmsg(self.socket.as_raw_fd(), bufs, received, None, self.gro) {
                // An ICMP port-unreachable from a peer that is not up yet
                // surfaces here; it is not a frame, so skip it.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Ok(n) => {
                    let coalesced = received.iter().take(n).filter(|r| r.segment < r.len).count();
                    self.coalesced_receives.fetch_add(coalesced as u64, Ordering::Relaxed);
                    return Ok(n);
                }
                other => return other,
            }
        }
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let limit = self.gso_segment_limit.load(Ordering::Relaxed);
        vec![
            ("segmented_sends", get(&self.segmented_sends)),
            ("segmented_frames", get(&self.segmented_frames)),
            ("coalesced_receives", get(&self.coalesced_receives)),
            // The largest frame still sent with GSO (0: none).
            ("gso_segment_limit", limit as u64),
            ("gso_reprobes", get(&self.gso_reprobes)),
        ]
    }
}

impl AsRawFd for UdpUplink {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::uplink::RecvBatch;
    use std::time::{Duration, Instant};

    /// A peer as QEMU's `-netdev socket,udp=`/`dgram` is: a plain UDP
    /// socket, one frame per datagram.
    fn plain_peer(addr: &str) -> UdpSocket {
        let peer = UdpSocket::bind(addr).unwrap();
        peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        peer
    }

    /// Distinct frames: `count` of `len` octets each, numbered.
    fn frames(count: usize, len: usize, tag: u8) -> Vec<Vec<u8>> {
        (0..count).map(|i| (0..len).map(|j| (i * 7 + j) as u8 ^ tag).collect()).collect()
    }

    fn refs(frames: &[Vec<u8>]) -> Vec<&[u8]> {
        frames.iter().map(Vec::as_slice).collect()
    }

    /// Every frame the uplink hands out until `want` arrived (5 s at most).
    fn receive_frames(up: &UdpUplink, want: usize) -> Vec<Vec<u8>> {
        let mut batch = RecvBatch::default();
        let mut got = Vec::new();
        let start = Instant::now();
        while got.len() < want && start.elapsed() < Duration::from_secs(5) {
            match batch.next_frame(up).unwrap() {
                Some(frame) => got.push(frame.to_vec()),
                None => std::thread::sleep(Duration::from_millis(1)),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
        while let Some(frame) = batch.next_frame(up).unwrap() {
            got.push(frame.to_vec()); // none expected: counted by the caller
        }
        got
    }

    #[test]
    fn frames_cross_as_single_datagrams() {
        let peer = plain_peer("127.0.0.1:0");
        let up = UdpUplink::open("127.0.0.1:0".parse().unwrap(), peer.local_addr().unwrap()).unwrap();
        let up_addr = up.socket.local_addr().unwrap();

        let frame: Vec<u8> = (0..9014).map(|i| i as u8).collect();
        up.send(&frame).unwrap();
        let mut buf = vec![0u8; 65536];
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&frame[..], up_addr));

        let mut batch = RecvBatch::default();
        assert_eq!(batch.next_frame(&up).unwrap(), None);
        peer.send_to(&frame[..60], up_addr).unwrap();
        assert_eq!(receive_frames(&up, 1), [frame[..60].to_vec()]);
    }

    /// What QEMU's `-netdev dgram`/`socket,udp=` exchanges with vt3d: a
    /// batch vt3d sends with UDP_SEGMENT arrives as one datagram per
    /// frame, and the peer's single datagrams arrive as frames.
    #[test]
    fn segmented_sends_reach_a_plain_peer_as_single_datagrams() {
        let peer = plain_peer("127.0.0.1:0");
        let up = UdpUplink::open("127.0.0.1:0".parse().unwrap(), peer.local_addr().unwrap()).unwrap();
        let up_addr = up.socket.local_addr().unwrap();

        // Three small frames, then 40 full ones and a short one: two sends
        // (a longer frame never joins a run: the kernel would cut it).
        let mut sent = frames(3, 60, 3);
        sent.extend(frames(40, 1514, 1));
        sent.extend(frames(1, 100, 2));
        assert_eq!(up.send_batch(&refs(&sent)).unwrap(), 44);
        assert_eq!(up.segmented_sends(), 2);
        let mut buf = vec![0u8; 65536];
        for (i, frame) in sent.iter().enumerate() {
            let (n, from) = peer.recv_from(&mut buf).unwrap();
            assert_eq!((&buf[..n], from), (&frame[..], up_addr), "datagram {i}");
        }
        peer.set_nonblocking(true).unwrap();
        assert!(peer.recv_from(&mut buf).is_err(), "no datagram beyond the frames");

        // The peer's datagrams, one frame each, sent one by one.
        let theirs = frames(30, 1514, 4);
        for frame in &theirs {
            peer.send_to(frame, up_addr).unwrap();
        }
        assert_eq!(receive_frames(&up, theirs.len()), theirs);
    }

    /// vt3d to vt3d on loopback: a segmented send stays one buffer up to
    /// the receiver (UDP_GRO), which cuts it at the reported size.
    #[test]
    fn coalesced_receives_are_cut_into_the_frames_sent() {
        let a_socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let a_addr = a_socket.local_addr().unwrap();
        drop(a_socket);
        let b = UdpUplink::open("127.0.0.1:0".parse().unwrap(), a_addr).unwrap();
        let a = UdpUplink::open(a_addr, b.socket.local_addr().unwrap()).unwrap();

        let mut sent = frames(40, 1514, 5);
        sent.extend(frames(1, 700, 6));
        assert_eq!(a.send_batch(&refs(&sent)).unwrap(), 41);
        assert_eq!(a.segmented_sends(), 1);
        let mut bufs = vec![vec![0u8; crate::uplink::RECV_BUF_LEN]; 4];
        let mut received = vec![Received::default(); 4];
        let start = Instant::now();
        let mut n = 0;
        while n == 0 && start.elapsed() < Duration::from_secs(5) {
            n = b.recv_batch(&mut bufs, &mut received).unwrap();
        }
        assert_eq!(received[0], Received { len: 40 * 1514 + 700, segment: 1514 }, "one coalesced receive");
        let got: Vec<Vec<u8>> =
            received[..n].iter().zip(&bufs).flat_map(|(r, buf)| r.frames(buf)).map(<[u8]>::to_vec).collect();
        assert_eq!(got, sent);

        // The same through the datapath's batch.
        assert_eq!(a.send_batch(&refs(&sent)).unwrap(), 41);
        assert_eq!(receive_frames(&b, sent.len()), sent);
        let counters = |u: &UdpUplink| u.counters().into_iter().collect::<std::collections::HashMap<_, _>>();
        assert_eq!(counters(&a)["segmented_sends"], 2);
        assert_eq!(counters(&a)["segmented_frames"], 82);
        assert_eq!(counters(&b)["coalesced_receives"], 2, "one coalesced receive per send");
    }

    /// A path whose MTU is below a frame plus headers refuses UDP_SEGMENT
    /// (EINVAL): those frames go one by one (fragmented, DF clear) and
    /// smaller ones keep GSO. IPV6_MTU gives loopback such a path.
    #[test]
    fn frames_over_the_path_mtu_fall_back_to_single_datagrams() {
        let peer = plain_peer("[::1]:0");
        let up = UdpUplink::open("[::1]:0".parse().unwrap(), peer.local_addr().unwrap()).unwrap();
        crate::uplink::set_int_option(up.as_raw_fd(), libc::IPPROTO_IPV6, libc::IPV6_MTU, 1280).unwrap();

        let big = frames(10, 1514, 7);
        assert_eq!(up.send_batch(&refs(&big)).unwrap(), 10);
        assert_eq!(up.segmented_sends(), 0);
        assert_eq!(up.gso_segment_limit.load(Ordering::Relaxed), 1513);
        let small = frames(5, 60, 8);
        assert_eq!(up.send_batch(&refs(&small)).unwrap(), 5);
        assert_eq!(up.segmented_sends(), 1, "smaller frames still share a send");
        let mut buf = vec![0u8; 65536];
        for (i, frame) in big.iter().chain(&small).enumerate() {
            let n = peer.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &frame[..], "datagram {i}");
        }
    }

    /// A limit lowered by a small path MTU goes back up once the path
    /// takes large frames again, but not before `gso_reprobe_after`.
    #[test]
    fn a_lowered_gso_limit_is_tried_again_after_a_while() {
        let peer = plain_peer("[::1]:0");
        let mut up = UdpUplink::open("[::1]:0".parse().unwrap(), peer.local_addr().unwrap()).unwrap();
        up.gso_reprobe_after = Duration::from_millis(200);
        let fd = up.as_raw_fd();
        crate::uplink::set_int_option(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU, 1280).unwrap();
        let big = frames(10, 1514, 9);
        assert_eq!(up.send_batch(&refs(&big)).unwrap(), 10);
        assert_eq!(up.gso_segment_limit.load(Ordering::Relaxed), 1513);

        // The path is wide again (0: the route's own MTU), but the limit
        // holds until the interval is over.
        crate::uplink::set_int_option(fd, libc::IPPROTO_IPV6, libc::IPV6_MTU, 0).unwrap();
        assert_eq!(up.send_batch(&refs(&big)).unwrap(), 10);
        assert_eq!((up.segmented_sends(), up.gso_reprobes.load(Ordering::Relaxed)), (0, 0));
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(up.send_batch(&refs(&big)).unwrap(), 10);
        assert_eq!(up.gso_segment_limit.load(Ordering::Relaxed), gso::MAX_UDP_PAYLOAD);
        assert_eq!((up.segmented_sends(), up.gso_reprobes.load(Ordering::Relaxed)), (1, 1));
        let mut buf = vec![0u8; 65536];
        for (i, frame) in big.iter().cycle().take(30).enumerate() {
            let n = peer.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &frame[..], "datagram {i}");
        }
    }

    #[test]
    fn datagrams_from_strangers_are_ignored() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let up = UdpUplink::open("127.0.0.1:0".parse().unwrap(), peer.local_addr().unwrap()).unwrap();
        stranger.send_to(b"not for you", up.socket.local_addr().unwrap()).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(RecvBatch::default().next_frame(&up).unwrap(), None);
    }
}
