//! The T3 behind the trait: the demux between its two functions, the
//! bounded hand-over of events, and the end of a session.

use std::sync::atomic::Ordering;

use vm_memory::GuestAddress;

use super::*;
use crate::abi;
use crate::control::{build_frame, DriverEnd, Refusal};
use crate::uplink::UplinkSpec;

const KEY: Key = [7, 9];
const GUEST_MAC: MacAddr = [0x52, 0x54, 0, 0, 0, 1];

struct Bench {
    device: T3,
    mem: Memory,
    _peer: std::os::unix::net::UnixDatagram,
    _dir: tempfile::TempDir,
}

fn bench() -> Bench {
    let dir = tempfile::tempdir().unwrap();
    let peer = std::os::unix::net::UnixDatagram::bind(dir.path().join("p")).unwrap();
    let spec: UplinkSpec =
        format!("unix-dgram:{},{}", dir.path().join("u").display(), dir.path().join("p").display()).parse().unwrap();
    let device = T3::new(spec.open().unwrap(), None, 1500).with_control_key(KEY);
    let mem = Memory::from_ranges(&[(GuestAddress(0), 0x10_0000)]).unwrap();
    Bench { device, mem, _peer: peer, _dir: dir }
}

impl Bench {
    /// Sends one frame from the guest; returns what became of it and the
    /// device's answers.
    fn send(&self, frame: &[u8]) -> (FromGuest, VecDeque<Vec<u8>>) {
        let mut out = VecDeque::new();
        let what = self.device.guest_frame(&self.mem, self.device.now(), frame, &mut out);
        (what, out)
    }

    /// A driver that made its first contact through `guest_frame`.
    fn driver(&self) -> DriverEnd {
        let mut driver = DriverEnd::new(KEY);
        driver
            .handshake(|ctrl| {
                let (what, mut out) = self.send(&build_frame(GUEST_MAC, GUEST_MAC, &ctrl));
                assert_eq!(what, FromGuest::Command);
                out.pop_front().map(|f| f[14..].to_vec())
            })
            .unwrap();
        driver
    }
}

fn query_device(driver: &mut DriverEnd) -> Vec<u8> {
    build_frame(GUEST_MAC, GUEST_MAC, &driver.command(abi::Cmd::QueryDevice as u16, &[]).1)
}

#[test]
fn control_frames_are_commands_and_traffic_goes_to_the_uplink() {
    let b = bench();
    let mut ip = vec![0u8; 60];
    ip[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let (what, out) = b.send(&ip);
    assert_eq!((what, out.len()), (FromGuest::Forwarded, 0));
    assert_eq!(b.device.eth().stats.tx_frames.load(Ordering::Relaxed), 1);
    let mut driver = b.driver();
    let (what, out) = b.send(&query_device(&mut driver));
    assert_eq!((what, out.len()), (FromGuest::Command, 1), "QUERY_DEVICE is answered");
    assert_eq!(b.device.eth().stats.tx_frames.load(Ordering::Relaxed), 1, "a command never leaves");
}

#[test]
fn uplink_frames_for_the_guest_pass_and_control_frames_do_not() {
    let b = bench();
    let now = b.device.now();
    let mut arp = vec![0xffu8; 60];
    arp[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_eq!(b.device.uplink_frame(now, &arp), FromUplink::Guest);
    let mut control = arp.clone();
    control[12..14].copy_from_slice(&abi::VT3_ETHERTYPE.to_be_bytes());
    assert_eq!(b.device.uplink_frame(now, &control), FromUplink::Dropped);
    assert_eq!(b.device.eth().stats.rx_dropped_control.load(Ordering::Relaxed), 1);
}

#[test]
fn events_beyond_the_guests_room_wait_in_the_rnic() {
    let b = bench();
    let _driver = b.driver();
    for _ in 0..10 {
        b.device.rnic().queue_event(abi::EventType::Qp, vec![0u8; 16]);
    }
    let mut out = VecDeque::new();
    b.device.run(&b.mem, b.device.now(), &mut out, 4);
    assert_eq!((out.len(), b.device.rnic().pending_events()), (4, 6), "four sealed, six kept, none dropped");
    b.device.run(&b.mem, b.device.now(), &mut out, 100);
    assert_eq!((out.len(), b.device.rnic().pending_events()), (10, 0));
}

#[test]
fn the_end_of_a_session_ends_the_drivers_session() {
    let b = bench();
    let mut driver = b.driver();
    assert_eq!(b.device.control_stats.sessions.load(Ordering::Relaxed), 1);
    b.device.end_session();
    let (what, out) = b.send(&query_device(&mut driver));
    assert_eq!((what, out.len()), (FromGuest::Command, 0), "refused without an answer");
    assert_eq!(b.device.control_stats.refused(Refusal::NoSession), 1);
    // A new driver proves itself again and is served.
    let mut again = b.driver();
    assert_eq!(b.send(&query_device(&mut again)).1.len(), 1);
    assert_eq!(b.device.control_stats.sessions.load(Ordering::Relaxed), 2, "the counters outlive sessions");
}
