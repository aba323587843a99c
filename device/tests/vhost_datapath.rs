//! vt3d's datapath end to end without QEMU: a vhost-user frontend written
//! with the `vhost` crate sets up guest memory (a shared file, as QEMU's
//! memfd) and both virtqueues, then frames cross between the rings and a
//! unix-dgram peer standing in for the network.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::os::fd::AsFd;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_bindings::bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use vt3d::abi;
use vt3d::control::{build_frame, DriverEnd, Key, Refusal};
use vt3d::t3::{Device, T3};
use vt3d::uplink::UplinkSpec;
use vt3d::vhost::relay::RelayEnd;
use vt3d::vhost::serve_frontend;

const MEM_SIZE: usize = 16 << 20;
const QSIZE: u16 = 64;
const RX_RING: u64 = 0x0;
const TX_RING: u64 = 0x1_0000;
const RX_BUFS: u64 = 0x10_0000;
const TX_DATA: u64 = 0x40_0000;
const HDR: usize = 12;

struct Guest {
    frontend: Frontend,
    kicks: [EventFd; 2],
    calls: [EventFd; 2],
}

fn frame(len: usize, seed: u8) -> Vec<u8> {
    let mut f: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    f[..6].copy_from_slice(&[0x52, 0x54, 0, 0, 0, 1]); // to the guest's MAC
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(10), "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

impl Guest {
    /// Negotiates like QEMU and sets up both rings from the mocks.
    fn boot(
        sock: UnixStream,
        rx: &MockSplitQueue<GuestMemoryMmap>,
        tx: &MockSplitQueue<GuestMemoryMmap>,
        mem: GuestMemoryMmap,
    ) -> Self {
        let mut frontend = Frontend::from_stream(sock, 2);
        frontend.set_owner().unwrap();
        let features = frontend.get_features().unwrap();
        let wanted =
            1 << VIRTIO_F_VERSION_1 | 1 << VIRTIO_NET_F_MRG_RXBUF | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        assert_eq!(features & wanted, wanted);
        let protocol = frontend.get_protocol_features().unwrap();
        frontend.set_protocol_features(protocol & VhostUserProtocolFeatures::REPLY_ACK).unwrap();
        frontend.set_features(wanted).unwrap();

        let region = mem.iter().next().unwrap();
        let info = VhostUserMemoryRegionInfo::from_guest_region(region).unwrap();
        let host = info.userspace_addr;
        frontend.set_mem_table(&[info]).unwrap();

        let kicks = [EventFd::new(0).unwrap(), EventFd::new(0).unwrap()];
        let calls = [EventFd::new(0).unwrap(), EventFd::new(0).unwrap()];
        for (i, q) in [rx, tx].into_iter().enumerate() {
            frontend.set_vring_num(i, QSIZE).unwrap();
            let config = VringConfigData {
                queue_max_size: QSIZE,
                queue_size: QSIZE,
                flags: 0,
                desc_table_addr: host + q.desc_table_addr().0,
                used_ring_addr: host + q.used_addr().0,
                avail_ring_addr: host + q.avail_addr().0,
                log_addr: None,
            };
            frontend.set_vring_addr(i, &config).unwrap();
            frontend.set_vring_base(i, 0).unwrap();
            frontend.set_vring_call(i, &calls[i]).unwrap();
            frontend.set_vring_kick(i, &kicks[i]).unwrap();
            frontend.set_vring_enable(i, true).unwrap();
        }
        Self { frontend, kicks, calls }
    }
}

#[test]
fn frames_cross_between_rings_and_uplink() {
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempfile::tempdir().unwrap();
    let peer_path = dir.path().join("peer");
    let peer = UnixDatagram::bind(&peer_path).unwrap();
    let up_path = dir.path().join("up");
    let spec: UplinkSpec = format!("unix-dgram:{},{}", up_path.display(), peer_path.display()).parse().unwrap();
    let nic = Arc::new(T3::new(spec.open().unwrap(), Some([0x52, 0x54, 0, 0, 0, 1]), 9000).with_control_key(KEY));

    // Guest RAM: a shared file, as QEMU's memory-backend-memfd.
    let file = tempfile::tempfile().unwrap();
    file.set_len(MEM_SIZE as u64).unwrap();
    let mem = GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(0), MEM_SIZE, Some(FileOffset::new(file, 0)))])
        .unwrap();
    let rx = MockSplitQueue::create(&mem, GuestAddress(RX_RING), QSIZE);
    let tx = MockSplitQueue::create(&mem, GuestAddress(TX_RING), QSIZE);
    // 8 RX buffers of 1526 bytes, as virtio_net posts with MRG_RXBUF.
    let bufs: Vec<_> = (0..8u64)
        .map(|i| RawDescriptor::from(SplitDescriptor::new(RX_BUFS + i * 0x1000, 1526, VRING_DESC_F_WRITE as u16, 0)))
        .collect();
    rx.add_desc_chains(&bufs, 0).unwrap();

    let (qemu, vt3d_end) = UnixStream::pair().unwrap();
    let (stop, _stop_writer) = UnixStream::pair().unwrap();
    let server_nic = Arc::clone(&nic);
    let server = thread::spawn(move || serve_frontend(&vt3d_end, &server_nic, stop.as_fd()).unwrap());
    let guest = Guest::boot(qemu, &rx, &tx, mem.clone());

    // Network → guest: a 4000-byte frame lands in three merged buffers.
    let inbound = frame(4000, 7);
    peer.send_to(&inbound, &up_path).unwrap();
    wait_for("the RX used ring", || rx.used().idx().load() == 3);
    assert_eq!(guest.calls[0].read().unwrap(), 1, "one interrupt for the frame");
    let mut got = Vec::new();
    for i in 0..3u16 {
        let e = rx.used().ring().ref_at(usize::from(i)).unwrap().load();
        let mut part = vec![0u8; e.len() as usize];
        mem.read_slice(&mut part, GuestAddress(RX_BUFS + u64::from(e.id()) * 0x1000)).unwrap();
        got.extend_from_slice(&part);
    }
    assert_eq!(u16::from_le_bytes([got[10], got[11]]), 3, "num_buffers");
    assert_eq!(&got[HDR..], &inbound[..]);

    // Frames for another MAC are filtered, not delivered.
    let mut stranger = frame(100, 1);
    stranger[5] = 9;
    peer.send_to(&stranger, &up_path).unwrap();

    // Guest → network: a jumbo frame split over two descriptors.
    let outbound = frame(9014, 3);
    let mut with_hdr = vec![0u8; HDR];
    with_hdr.extend_from_slice(&outbound);
    mem.write_slice(&with_hdr, GuestAddress(TX_DATA)).unwrap();
    let chain = [
        RawDescriptor::from(SplitDescriptor::new(TX_DATA, HDR as u32, 1, 1)),
        RawDescriptor::from(SplitDescriptor::new(TX_DATA + HDR as u64, outbound.len() as u32, 0, 0)),
    ];
    tx.add_desc_chains(&chain, 0).unwrap();
    guest.kicks[1].write(1).unwrap();
    let mut buf = vec![0u8; 65536];
    peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let n = peer.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], &outbound[..]);
    wait_for("the TX used ring", || tx.used().idx().load() == 1);

    // A HELLO under another key is refused without an answer; the
    // driver's (the provisioned key) gets a challenge, its PROVE a session.
    let forged = with_vnet_hdr(&build_frame(GUEST_MAC, GUEST_MAC, &DriverEnd::new([9, 9]).hello()));
    let mut driver = DriverEnd::new(KEY);
    let hello = with_vnet_hdr(&build_frame(GUEST_MAC, GUEST_MAC, &driver.hello()));
    let mut ctrl = ControlPath { mem: &mem, tx: &tx, rx: &rx, kick: &guest.kicks[1], next_tx: 2, next_rx: 3 };
    ctrl.send(&[forged, hello]);
    let challenge = ctrl.answer();
    assert_eq!(nic.control_stats.refused(Refusal::Hello), 1, "the forged HELLO");
    let (_, prove) = driver.prove(&challenge[HDR + 14..]).unwrap();
    ctrl.send(&[with_vnet_hdr(&build_frame(GUEST_MAC, GUEST_MAC, &prove))]);
    let proven = ctrl.answer();
    assert_eq!(driver.open(&proven[HDR + 14..]).unwrap().hdr.status.to_native(), 0);
    // A control command on TX is answered on RX and never leaves vt3d.
    let (seq, query) = driver.command(abi::Cmd::QueryDevice as u16, &[]);
    ctrl.send(&[with_vnet_hdr(&build_frame(GUEST_MAC, GUEST_MAC, &query))]);
    let resp = ctrl.answer();
    let opened = driver.open(&resp[HDR + 14..]).unwrap();
    assert_eq!(opened.hdr.r#type, abi::MsgType::Resp as u8);
    assert_eq!((opened.hdr.seq.to_native(), opened.hdr.status.to_native()), (seq, 0));
    let attr: abi::DeviceAttr = abi::read_struct(opened.payload).unwrap();
    assert_eq!(attr.vendor_id.to_native(), abi::VT3_VENDOR_ID);
    peer.set_nonblocking(true).unwrap();
    assert!(peer.recv(&mut buf).is_err(), "a control frame reached the uplink");

    wait_for("the filtered frame to be counted", || {
        nic.eth().stats.rx_filtered.load(std::sync::atomic::Ordering::Relaxed) == 1
    });
    assert_eq!(rx.used().idx().load(), 6, "filtered frame must not reach the guest");

    drop(guest.frontend);
    assert_eq!(server.join().unwrap(), RelayEnd::FrontendClosed);
}

const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const PEER_MAC: [u8; 6] = [0x52, 0x54, 0, 0, 0, 2];
const GUEST_IP: [u8; 4] = [10, 0, 0, 1];
const PEER_IP: [u8; 4] = [10, 0, 0, 2];

fn checksum(data: &[u8], mut sum: u32) -> u16 {
    for pair in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// A TCP SYN from the peer to the guest's `port`.
fn syn(port: u16) -> Vec<u8> {
    let mut tcp = vec![0u8; 20];
    tcp[0..2].copy_from_slice(&5555u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&port.to_be_bytes());
    tcp[4..8].copy_from_slice(&1000u32.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = 0x02; // SYN
    tcp[14..16].copy_from_slice(&8192u16.to_be_bytes());
    let mut pseudo = Vec::new();
    pseudo.extend_from_slice(&PEER_IP);
    pseudo.extend_from_slice(&GUEST_IP);
    pseudo.extend_from_slice(&[0, 6, 0, 20]);
    pseudo.extend_from_slice(&tcp);
    let c = checksum(&pseudo, 0);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    let mut ip = vec![0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0];
    ip.extend_from_slice(&PEER_IP);
    ip.extend_from_slice(&GUEST_IP);
    let c = checksum(&ip, 0);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&GUEST_MAC);
    f.extend_from_slice(&PEER_MAC);
    f.extend_from_slice(&0x0800u16.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&tcp);
    f
}

/// The provisioned key of the tests' NIC.
const KEY: Key = [1, 2];

/// The guest's control frames over the rings: each sent in TX descriptor
/// `next_tx` onwards, each answer read from RX used entry `next_rx` on.
struct ControlPath<'a> {
    mem: &'a GuestMemoryMmap,
    tx: &'a MockSplitQueue<'a, GuestMemoryMmap>,
    rx: &'a MockSplitQueue<'a, GuestMemoryMmap>,
    kick: &'a EventFd,
    next_tx: u16,
    next_rx: u16,
}

impl ControlPath<'_> {
    /// Frames (virtio-net header included) in one kick.
    fn send(&mut self, frames: &[Vec<u8>]) {
        for f in frames {
            let at = TX_DATA + 0x4000 + u64::from(self.next_tx) * 0x1000;
            self.mem.write_slice(f, GuestAddress(at)).unwrap();
            let d = RawDescriptor::from(SplitDescriptor::new(at, f.len() as u32, 0, 0));
            self.tx.add_desc_chains(std::slice::from_ref(&d), self.next_tx).unwrap();
            self.next_tx += 1;
        }
        self.kick.write(1).unwrap();
    }

    /// The next frame vt3d gave the guest (virtio-net header included).
    fn answer(&mut self) -> Vec<u8> {
        let i = self.next_rx;
        wait_for("a control answer", || self.rx.used().idx().load() > i);
        self.next_rx += 1;
        let e = self.rx.used().ring().ref_at(usize::from(i)).unwrap().load();
        let mut resp = vec![0u8; e.len() as usize];
        self.mem.read_slice(&mut resp, GuestAddress(RX_BUFS + u64::from(e.id()) * 0x1000)).unwrap();
        resp
    }
}

fn with_vnet_hdr(frame: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; HDR];
    f.extend_from_slice(frame);
    f
}

fn command(driver: &mut DriverEnd, cmd: abi::Cmd, payload: &[u8]) -> Vec<u8> {
    with_vnet_hdr(&build_frame(GUEST_MAC, GUEST_MAC, &driver.command(cmd as u16, payload).1))
}

/// The backend's demux and timer: once the driver set the guest's address
/// and a listening port, a SYN for that port is the engine's (answered on
/// the uplink, retransmitted by the engine's timer), while other traffic
/// still reaches the guest.
#[test]
fn offloaded_tcp_goes_to_the_engine() {
    use vm_memory::ByteValued;
    let _ = env_logger::builder().is_test(true).try_init();
    let dir = tempfile::tempdir().unwrap();
    let peer_path = dir.path().join("peer");
    let peer = UnixDatagram::bind(&peer_path).unwrap();
    let up_path = dir.path().join("up");
    let spec: UplinkSpec = format!("unix-dgram:{},{}", up_path.display(), peer_path.display()).parse().unwrap();
    let nic = Arc::new(T3::new(spec.open().unwrap(), Some(GUEST_MAC), 1500).with_control_key(KEY));
    let file = tempfile::tempfile().unwrap();
    file.set_len(MEM_SIZE as u64).unwrap();
    let mem = GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(0), MEM_SIZE, Some(FileOffset::new(file, 0)))])
        .unwrap();
    let rx = MockSplitQueue::create(&mem, GuestAddress(RX_RING), QSIZE);
    let tx = MockSplitQueue::create(&mem, GuestAddress(TX_RING), QSIZE);
    let bufs: Vec<_> = (0..8u64)
        .map(|i| RawDescriptor::from(SplitDescriptor::new(RX_BUFS + i * 0x1000, 1526, VRING_DESC_F_WRITE as u16, 0)))
        .collect();
    rx.add_desc_chains(&bufs, 0).unwrap();
    let (qemu, vt3d_end) = UnixStream::pair().unwrap();
    let (stop, _stop_writer) = UnixStream::pair().unwrap();
    let server_nic = Arc::clone(&nic);
    let server = thread::spawn(move || serve_frontend(&vt3d_end, &server_nic, stop.as_fd()).unwrap());
    let guest = Guest::boot(qemu, &rx, &tx, mem.clone());

    let set_addr = abi::CmdSetAddr { mac: GUEST_MAC, prefix_len: 24, reserved: 0, ipv4: GUEST_IP };
    let listen = abi::CmdListen {
        local: abi::SockAddr { ipv4: [0; 4], port: 7174u16.to_be_bytes(), reserved: 0.into() },
        backlog: 4.into(),
        reserved: 0.into(),
    };
    let mut driver = DriverEnd::new(KEY);
    let mut ctrl = ControlPath { mem: &mem, tx: &tx, rx: &rx, kick: &guest.kicks[1], next_tx: 0, next_rx: 0 };
    ctrl.send(&[with_vnet_hdr(&build_frame(GUEST_MAC, GUEST_MAC, &driver.hello()))]);
    let challenge = ctrl.answer();
    let (_, prove) = driver.prove(&challenge[HDR + 14..]).unwrap();
    ctrl.send(&[
        with_vnet_hdr(&build_frame(GUEST_MAC, GUEST_MAC, &prove)),
        command(&mut driver, abi::Cmd::SetAddr, set_addr.as_slice()),
        command(&mut driver, abi::Cmd::Listen, listen.as_slice()),
    ]);
    // PROVE, SET_ADDR and LISTEN (seqs 2, 3, 4) answered in order.
    for seq in 2..5u32 {
        let resp = ctrl.answer();
        let hdr = driver.open(&resp[HDR + 14..]).unwrap().hdr;
        assert_eq!((hdr.seq.to_native(), hdr.status.to_native()), (seq, 0));
    }

    // The SYN is the engine's: a SYN-ACK comes back, nothing for the guest.
    peer.send_to(&syn(7174), &up_path).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 2048];
    let syn_ack = |buf: &mut [u8]| {
        let n = peer.recv(buf).unwrap();
        assert!(n >= 54, "{n} octets");
        assert_eq!((&buf[..6], &buf[6..12]), (&PEER_MAC[..], &GUEST_MAC[..]));
        assert_eq!((&buf[26..30], &buf[30..34]), (&GUEST_IP[..], &PEER_IP[..]));
        assert_eq!(buf[47] & 0x12, 0x12, "SYN and ACK");
        assert_eq!(u32::from_be_bytes(buf[42..46].try_into().unwrap()), 1001, "acknowledges the SYN");
    };
    syn_ack(&mut buf);
    // Unanswered, the engine's timer retransmits it.
    let start = Instant::now();
    syn_ack(&mut buf);
    assert!(start.elapsed() > Duration::from_millis(100), "a retransmission, not a duplicate");
    assert_eq!(rx.used().idx().load(), 4);
    let counted = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
    wait_for("the counters", || {
        counted(&nic.eth().stats.toe_rx_frames) == 1 && counted(&nic.eth().stats.toe_tx_frames) == 2
    });
    // A SYN for a port nobody listens on is the guest kernel's.
    peer.send_to(&syn(7175), &up_path).unwrap();
    wait_for("the SYN in the guest", || rx.used().idx().load() == 5);

    drop(guest.frontend);
    assert_eq!(server.join().unwrap(), RelayEnd::FrontendClosed);
}
