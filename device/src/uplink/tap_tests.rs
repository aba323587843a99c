//! Tests of the tap uplink. Those on real taps need CAP_NET_ADMIN (and
//! `ip` from iproute2), so they are ignored by default; as root run them
//! with `cargo test -p vt3d --lib uplink::tap::tests -- --ignored`.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;

#[test]
fn rejects_overlong_name() {
    let err = TapUplink::open("0123456789abcdefg").unwrap_err();
    assert!(matches!(
        err.kind(),
        io::ErrorKind::InvalidInput | io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
    ));
}

/// Needs CAP_NET_ADMIN: the interface appears while the uplink is open
/// and reading it without traffic does not block.
#[test]
#[ignore = "needs CAP_NET_ADMIN"]
fn creates_the_interface() {
    let name = format!("vt3t{}", std::process::id() % 100_000);
    let tap = TapUplink::open(&name).unwrap();
    assert!(std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
    let mut batch = crate::uplink::RecvBatch::default();
    assert_eq!(batch.next_frame(&tap).unwrap(), None);
    drop(tap);
    assert!(!std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
}

use crate::uplink::tso::tests::{frame, refs, segments, tcp_checksum_ok, V4, V6};
use crate::uplink::tso::{F_NEEDS_CSUM, TCP_ACK, TCP_PSH};
use std::process::Command;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A Linux bridge with taps in it, removed on drop (the taps go with
/// their uplinks' file descriptors).
struct Bridge {
    name: String,
}

static BRIDGES: AtomicUsize = AtomicUsize::new(0);

impl Bridge {
    fn new() -> Self {
        let n = BRIDGES.fetch_add(1, Ordering::Relaxed);
        let name = format!("vt3br{}x{n}", std::process::id() % 100_000);
        ip(&["link", "add", &name, "type", "bridge"]);
        ip(&["link", "set", &name, "up"]);
        Self { name }
    }

    /// Opens tap `suffix` of this bridge (with or without vnet header),
    /// puts it in the bridge, brings it up and waits until it forwards.
    fn port(&self, suffix: &str, vnet: bool) -> TapUplink {
        let tap_name = format!("{}{suffix}", self.name);
        let tap = if vnet { TapUplink::open(&tap_name) } else { TapUplink::open_plain(&tap_name) }.unwrap();
        // IPv6 autoconfiguration would put its own frames on the bridge.
        std::fs::write(format!("/proc/sys/net/ipv6/conf/{tap_name}/disable_ipv6"), "1").ok();
        ip(&["link", "set", &tap_name, "master", &self.name]);
        ip(&["link", "set", &tap_name, "up"]);
        let state = format!("/sys/class/net/{tap_name}/brport/state");
        let until = Instant::now() + Duration::from_secs(5);
        while std::fs::read_to_string(&state).map(|s| s.trim() != "3").unwrap_or(true) {
            assert!(Instant::now() < until, "{tap_name} never forwards");
            std::thread::sleep(Duration::from_millis(10));
        }
        tap
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.name]).status();
    }
}

fn counter(tap: &TapUplink, name: &str) -> u64 {
    tap.counters().into_iter().find(|(k, _)| *k == name).map(|(_, v)| v).unwrap()
}

/// The TCP frames of port 4000 `tap` receives until `want` arrived or 5 s
/// passed (the bridge may add frames of its own).
fn receive_tcp(tap: &TapUplink, want: usize) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut batch = crate::uplink::RecvBatch::default();
    let until = Instant::now() + Duration::from_secs(5);
    while got.len() < want && Instant::now() < until {
        match batch.next_frame(tap).unwrap() {
            Some(f) if f.len() > 54 && (f[12..14] == [8, 0] || f[12..14] == [0x86, 0xdd]) => {
                let tcp = if f[12] == 8 { 34 } else { 54 };
                if f[tcp..tcp + 2] == 4000u16.to_be_bytes() {
                    got.push(f.to_vec());
                }
            }
            Some(_) => {}
            None => {
                let mut pfd = libc::pollfd { fd: tap.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one live pollfd, its count and a timeout.
                unsafe { libc::poll(&mut pfd, 1, 50) };
            }
        }
    }
    got
}

/// Needs CAP_NET_ADMIN and `ip`: A and B with vnet headers and a plain
/// tap C in one bridge. A's 40 segments of one flow leave in one write;
/// B (TSO on) gets the super-frame and cuts it back into the very frames
/// A was given; C (no offloads) gets them cut by the kernel.
#[test]
#[ignore = "needs CAP_NET_ADMIN"]
fn coalesced_segments_arrive_as_the_frames_sent() {
    let bridge = Bridge::new();
    let (a, b, c) = (bridge.port("a", true), bridge.port("b", true), bridge.port("c", false));
    for tap in [&a, &b] {
        assert_eq!(counter(tap, "vnet_hdr"), 12);
        assert_eq!(counter(tap, "offloads"), 1);
    }
    assert_eq!(counter(&c, "vnet_hdr"), 0);
    let frames = segments(V4, 40, 1448, 700);
    assert_eq!(a.send_batch(&refs(&frames)).unwrap(), 40);
    assert_eq!((counter(&a, "tso_sends"), counter(&a, "tso_frames")), (1, 40));
    let at_b = receive_tcp(&b, 40);
    assert_eq!(at_b.len(), 40);
    assert!(at_b == frames, "B's frames differ from those sent");
    assert_eq!((counter(&b, "gso_receives"), counter(&b, "segmented_frames")), (1, 40));
    let at_c = receive_tcp(&c, 40);
    assert_eq!(at_c.len(), 40);
    assert!(at_c == frames, "C's frames differ from those sent");

    // IPv6, and frames that do not coalesce (a gap in seq) go one by one.
    let v6 = segments(V6, 10, 1000, 1000);
    let mut loose = segments(V4, 3, 500, 500);
    loose[1][38..42].copy_from_slice(&7u32.to_be_bytes());
    let loose: Vec<Vec<u8>> = loose
        .iter()
        .map(|f| frame(V4, u32::from_be_bytes(f[38..42].try_into().unwrap()), 1, TCP_ACK, &f[66..]))
        .collect();
    let batch: Vec<Vec<u8>> = v6.iter().chain(&loose).cloned().collect();
    assert_eq!(a.send_batch(&refs(&batch)).unwrap(), 13);
    assert_eq!((counter(&a, "tso_sends"), counter(&a, "tso_frames")), (2, 50));
    for tap in [&b, &c] {
        let got = receive_tcp(tap, 13);
        assert_eq!(got.len(), 13);
        assert!(got == batch, "IPv6 and single frames differ");
    }
    assert_eq!((counter(&b, "gso_receives"), counter(&b, "segmented_frames")), (2, 50));
    assert_eq!(counter(&b, "bad_gso"), 0);
}

/// Needs CAP_NET_ADMIN and `ip`: a frame written with a partial
/// checksum (NEEDS_CSUM) reaches B with it still partial (checksum
/// offload on): B completes it; C gets it completed by the kernel.
#[test]
#[ignore = "needs CAP_NET_ADMIN"]
fn partial_checksums_are_completed_on_receive() {
    let bridge = Bridge::new();
    let (a, b, c) = (bridge.port("a", true), bridge.port("b", true), bridge.port("c", false));
    let good = frame(V4, 5, 9, TCP_ACK | TCP_PSH, &[0x5a; 333]);
    let mut partial = good.clone();
    let pseudo = !crate::uplink::tso::tests::naive_csum(&[&crate::uplink::tso::tests::pseudo(&good)]);
    partial[50..52].copy_from_slice(&pseudo.to_be_bytes());
    assert!(!tcp_checksum_ok(&partial));
    let hdr = VnetHdr { flags: F_NEEDS_CSUM, csum_start: 34, csum_offset: 16, ..VnetHdr::default() };
    a.writev(&[iovec(&hdr.to_bytes()), iovec(&partial)]).unwrap();
    assert_eq!(receive_tcp(&b, 1), std::slice::from_ref(&good));
    assert_eq!(counter(&b, "csum_completed"), 1);
    assert_eq!(receive_tcp(&c, 1), [good]);
}
