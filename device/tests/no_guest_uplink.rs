//! While no guest is connected, vt3d drops what arrives on its uplink, as
//! a NIC without a driver would: a peer (QEMU's `-netdev dgram`, a siw
//! guest) is never held up by a socket nobody reads. Before, frames piled
//! up in vt3d's receive queue until the peer's sends blocked, and a peer
//! guest's TX queue stalled until vt3d's next guest came.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vt3d::t3::{Device, T3};
use vt3d::uplink::UplinkSpec;
use vt3d::vhost::{bind_frontend_socket, serve_frontends};

/// Far more than the peer's socket buffer holds (about 140 frames of this
/// size at the default 208 KiB).
const FRAMES: u64 = 3000;

#[test]
fn a_vt3d_without_a_guest_drops_uplink_frames_instead_of_blocking_the_peer() {
    let dir = tempfile::tempdir().unwrap();
    let (up, peer_path) = (dir.path().join("up"), dir.path().join("peer"));
    // The peer as QEMU's dgram netdev: bound, sending with sendto.
    let peer = UnixDatagram::bind(&peer_path).unwrap();
    peer.set_nonblocking(true).unwrap();
    let spec: UplinkSpec = format!("unix-dgram:{},{}", up.display(), peer_path.display()).parse().unwrap();
    let nic = Arc::new(T3::new(spec.open().unwrap(), None, 1500));
    // vt3d connects its uplink to the peer on its first send (as after a
    // guest's first frame).
    nic.eth().uplink().send(&[0u8; 60]).unwrap();

    let listener = bind_frontend_socket(&dir.path().join("vhost.sock")).unwrap();
    let (stop, stopper) = UnixStream::pair().unwrap();
    let served = Arc::clone(&nic);
    let server = thread::spawn(move || serve_frontends(&listener, &served, stop.as_fd()).unwrap());

    let frame = [0x5au8; 1514];
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    let mut blocked = 0u64;
    while sent < FRAMES {
        match peer.send_to(&frame, &up) {
            Ok(_) => sent += 1,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                blocked += 1;
                assert!(Instant::now() < deadline, "the peer stayed blocked: {sent} of {FRAMES} frames sent");
                thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("send: {e}"),
        }
    }
    // Every frame was taken off the socket and counted as dropped.
    let dropped = || nic.eth().stats.rx_dropped_no_guest.load(Ordering::Relaxed);
    while dropped() < FRAMES && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(dropped(), FRAMES, "frames dropped for want of a guest ({blocked} sends had to wait)");
    drop(stopper);
    server.join().unwrap();
}
