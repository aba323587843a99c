//! The device bench's path from the synthetic guest (`vt3d::testing`) to
//! a vt3d process: what QEMU and virtio_net do. Guest RAM is a memfd
//! shared with vt3d over vhost-user (the `vhost` crate's `Frontend`, as
//! QEMU); the virtqueues are driven as virtio_net drives them; control
//! commands are sealed with `vt3d::control::DriverEnd` as vt3.ko seals
//! them. The rings, WQEs and CQEs are the synthetic guest's.

use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{ByteValued, Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use vt3d::abi::*;
use vt3d::control::{build_frame, DriverEnd};
use vt3d::testing::{self, DriverPath, Events, GuestRam, Layout};

use crate::vring::Vring;

const VNET_HDR: usize = 12;
const ETH_HDR: usize = 14;
const QUEUE_SIZE: u16 = 256;
const RX_RING: u64 = 0x0;
const TX_RING: u64 = 0x4000;
/// The rings end below this.
const RINGS_END: u64 = 0x8000;
const RX_BUFS: u64 = 0x10_0000;
const TX_BUFS: u64 = 0x20_0000;
const BUF_LEN: u32 = 4096;
/// A command unanswered this long means vt3d is wedged: the bench stops.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// A guest of one vt3d process.
pub type Guest = testing::Guest<Vhost>;

/// The synthetic guest's layout around the virtqueues and their buffers:
/// status pages, then page lists, then rings and buffers.
fn layout(size: u64) -> Layout {
    Layout { size, status: 0x1_0000..0x10_0000, pbl: 0x40_0000..0x80_0000, pages: 0x80_0000..size, wrap: false }
}

/// The virtio-net device of one guest, as QEMU and virtio_net drive it.
pub struct Vhost {
    _frontend: Frontend,
    kicks: [EventFd; 2],
    _calls: [EventFd; 2],
    rx: Vring,
    tx: Vring,
    driver: DriverEnd,
    mac: [u8; 6],
    responses: std::collections::VecDeque<(u32, u16, Vec<u8>)>,
    /// Plain (non-control) frames vt3d delivered, and the sequence number
    /// of the last (octets 14..22): the forwarding anchor's.
    pub plain_rx: u64,
    pub plain_last: u64,
}

impl std::fmt::Debug for Vhost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vhost").field("mac", &self.mac).finish_non_exhaustive()
    }
}

/// Guest RAM as QEMU's memory-backend-memfd: a shared memfd.
fn guest_ram(size: usize) -> GuestMemoryMmap {
    // SAFETY: memfd_create takes a NUL-terminated name and flags; it
    // returns a new descriptor or -1, touching no memory of ours.
    let fd = unsafe { libc::memfd_create(c"vt3-bench-guest".as_ptr(), libc::MFD_CLOEXEC) };
    assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just created above and is owned by nothing else.
    let file = unsafe { File::from_raw_fd(fd) };
    file.set_len(size as u64).expect("size the guest RAM");
    GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(0), size, Some(FileOffset::new(file, 0)))])
        .expect("map the guest RAM")
}

fn connect(socket: &Path) -> UnixStream {
    let start = Instant::now();
    loop {
        match UnixStream::connect(socket) {
            Ok(s) => return s,
            Err(e) if start.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("vt3d socket {}: {e}", socket.display()),
        }
    }
}

/// Boots a guest against the vt3d serving `socket`: negotiates as QEMU,
/// sets up both virtqueues, posts RX buffers, and starts a driver session
/// (HELLO naming the virtqueues it gave vt3d).
pub fn boot(socket: &Path, mac: [u8; 6], ip: [u8; 4], mem_size: usize, key: [u64; 2]) -> Guest {
    let mem = guest_ram(mem_size);
    let mut frontend = Frontend::from_stream(connect(socket), 2);
    frontend.set_owner().expect("SET_OWNER");
    let features = frontend.get_features().expect("GET_FEATURES");
    let wanted = 1 << virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1
        | 1 << virtio_bindings::bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF
        | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    assert_eq!(features & wanted, wanted, "vt3d offers {features:#x}");
    let protocol = frontend.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
    frontend.set_protocol_features(protocol & VhostUserProtocolFeatures::REPLY_ACK).expect("SET_PROTOCOL_FEATURES");
    frontend.set_features(wanted).expect("SET_FEATURES");
    let region = mem.iter().next().expect("one region");
    let info = VhostUserMemoryRegionInfo::from_guest_region(region).expect("a file-backed region");
    let host = info.userspace_addr;
    frontend.set_mem_table(&[info]).expect("SET_MEM_TABLE");

    let rx = Vring::new(RX_RING, QUEUE_SIZE, RX_BUFS, BUF_LEN);
    let tx = Vring::new(TX_RING, QUEUE_SIZE, TX_BUFS, BUF_LEN);
    assert!(rx.end() <= TX_RING && tx.end() <= RINGS_END);
    let kicks = [EventFd::new(0).expect("eventfd"), EventFd::new(0).expect("eventfd")];
    let calls = [EventFd::new(0).expect("eventfd"), EventFd::new(0).expect("eventfd")];
    for (i, q) in [&rx, &tx].into_iter().enumerate() {
        frontend.set_vring_num(i, q.size).expect("SET_VRING_NUM");
        let config = VringConfigData {
            queue_max_size: q.size,
            queue_size: q.size,
            flags: 0,
            desc_table_addr: host + q.desc,
            used_ring_addr: host + q.used,
            avail_ring_addr: host + q.avail,
            log_addr: None,
        };
        frontend.set_vring_addr(i, &config).expect("SET_VRING_ADDR");
        frontend.set_vring_base(i, 0).expect("SET_VRING_BASE");
        frontend.set_vring_call(i, &calls[i]).expect("SET_VRING_CALL");
        frontend.set_vring_kick(i, &kicks[i]).expect("SET_VRING_KICK");
        frontend.set_vring_enable(i, true).expect("SET_VRING_ENABLE");
    }
    let mut nic = Vhost {
        _frontend: frontend,
        kicks,
        _calls: calls,
        rx,
        tx,
        driver: DriverEnd::new(key),
        mac,
        responses: std::collections::VecDeque::new(),
        plain_rx: 0,
        plain_last: 0,
    };
    for id in 0..QUEUE_SIZE {
        nic.rx.push(&mem, id, BUF_LEN, true);
    }
    if nic.rx.publish(&mem) {
        nic.kick(0);
    }
    let ram = GuestRam::new(mem, layout(mem_size as u64));
    nic.first_contact(&ram);
    let mut guest = Guest::new(ram, nic, mac);
    guest.ip = ip;
    guest
}

impl Vhost {
    /// HELLO, vt3d's challenge (under the provisioned key, not yet a
    /// session's frame), PROVE and its answer.
    fn first_contact(&mut self, ram: &GuestRam) {
        let hello = self.driver.hello();
        self.send_ctrl(ram, &hello);
        let start = Instant::now();
        let challenge = loop {
            if let Some(c) = self.take_raw_ctrl(ram) {
                break c;
            }
            assert!(start.elapsed() < COMMAND_TIMEOUT, "HELLO not answered");
            std::thread::yield_now();
        };
        let (seq, prove) = self.driver.prove(&challenge).expect("a challenge under the provisioned key");
        self.send_ctrl(ram, &prove);
        let (status, _) = self.wait_response(ram, &mut Events::default(), seq);
        assert_eq!(status, Status::Ok as u16, "PROVE refused");
    }

    /// The control part of the next control frame on RX, unopened.
    fn take_raw_ctrl(&mut self, ram: &GuestRam) -> Option<Vec<u8>> {
        let (id, len) = self.rx.pop_used(&ram.mem)?;
        let mut frame = vec![0u8; (len as usize).min(BUF_LEN as usize)];
        ram.mem.read_slice(&mut frame, GuestAddress(self.rx.buffer(id))).expect("RX buffer");
        self.rx.push(&ram.mem, id, BUF_LEN, true);
        if self.rx.publish(&ram.mem) {
            self.kick(0);
        }
        frame.get(VNET_HDR + ETH_HDR..).map(<[u8]>::to_vec)
    }

    fn kick(&self, queue: usize) {
        if let Some(k) = self.kicks.get(queue) {
            k.write(1).expect("kick");
        }
    }

    /// Sends one control frame on the TX ring.
    fn send_ctrl(&mut self, ram: &GuestRam, ctrl: &[u8]) {
        let frame = build_frame(self.mac, self.mac, ctrl);
        self.send_frame(ram, &mut Events::default(), &frame);
    }

    /// Puts `frame` into TX buffer `id` (not yet published).
    fn push_frame(&mut self, ram: &GuestRam, id: u16, frame: &[u8]) {
        let at = self.tx.buffer(id);
        let len = VNET_HDR + frame.len();
        assert!(len <= self.tx.buf_len() as usize, "frame of {len} octets");
        ram.mem.write_slice(&[0u8; VNET_HDR], GuestAddress(at)).expect("vnet header");
        ram.mem.write_slice(frame, GuestAddress(at + VNET_HDR as u64)).expect("frame");
        self.tx.push(&ram.mem, id, u32::try_from(len).unwrap_or(u32::MAX), false);
    }

    /// Sends one Ethernet frame on the TX ring, waiting for a free buffer
    /// (and taking what arrives meanwhile).
    pub fn send_frame(&mut self, ram: &GuestRam, events: &mut Events, frame: &[u8]) {
        let id = loop {
            self.reclaim_tx(ram);
            if let Some(id) = self.tx.take_free() {
                break id;
            }
            self.poll_rx(ram, events);
            std::thread::yield_now();
        };
        self.push_frame(ram, id, frame);
        if self.tx.publish(&ram.mem) {
            self.kick(1);
        }
    }

    /// Sends up to `n` copies of `frame` (sequence numbers from `seq` in
    /// octets 14..22) in the TX buffers free now, with one publish and at
    /// most one kick, as a driver does with a burst; returns how many.
    pub fn send_burst(&mut self, ram: &GuestRam, frame: &mut [u8], seq: u64, n: usize) -> usize {
        self.reclaim_tx(ram);
        let mut sent = 0;
        while sent < n {
            let Some(id) = self.tx.take_free() else { break };
            if let Some(at) = frame.get_mut(14..22) {
                at.copy_from_slice(&(seq + sent as u64).to_be_bytes());
            }
            self.push_frame(ram, id, frame);
            sent += 1;
        }
        if sent > 0 && self.tx.publish(&ram.mem) {
            self.kick(1);
        }
        sent
    }

    fn reclaim_tx(&mut self, ram: &GuestRam) {
        while let Some((id, _)) = self.tx.pop_used(&ram.mem) {
            self.tx.release(id);
        }
    }

    /// Takes every frame vt3d delivered: responses and events (opened
    /// with the session key), then gives the buffers back. Returns
    /// whether anything arrived.
    pub fn poll_rx(&mut self, ram: &GuestRam, events: &mut Events) -> bool {
        let mut any = false;
        let mut frame = vec![0u8; BUF_LEN as usize];
        while let Some((id, len)) = self.rx.pop_used(&ram.mem) {
            any = true;
            let len = (len as usize).min(frame.len());
            let buf = &mut frame[..len];
            ram.mem.read_slice(buf, GuestAddress(self.rx.buffer(id))).expect("RX buffer");
            self.take_frame(events, len, &frame);
            self.rx.push(&ram.mem, id, BUF_LEN, true);
        }
        if any && self.rx.publish(&ram.mem) {
            self.kick(0);
        }
        any
    }

    fn take_frame(&mut self, events: &mut Events, len: usize, buf: &[u8]) {
        let Some(frame) = buf.get(VNET_HDR..len) else { return };
        if frame.get(12..14) != Some(&VT3_ETHERTYPE.to_be_bytes()[..]) {
            // The forwarding anchor's traffic.
            self.plain_rx += 1;
            if let Some(seq) = frame.get(14..22) {
                self.plain_last = u64::from_be_bytes(seq.try_into().unwrap_or_default());
            }
            return;
        }
        let Some(ctrl) = frame.get(ETH_HDR..) else { return };
        let opened = self.driver.open(ctrl).expect("a frame sealed for this driver");
        let hdr = opened.hdr;
        if hdr.r#type == MsgType::Resp as u8 {
            self.responses.push_back((hdr.seq.to_native(), hdr.status.to_native(), opened.payload.to_vec()));
        } else if let Ok(kind) = EventType::try_from(hdr.opcode.to_native()) {
            events.push(kind, opened.payload.to_vec());
        }
    }

    fn wait_response(&mut self, ram: &GuestRam, events: &mut Events, seq: u32) -> (u16, Vec<u8>) {
        let start = Instant::now();
        loop {
            if let Some(at) = self.responses.iter().position(|r| r.0 == seq) {
                let (_, status, payload) = self.responses.remove(at).expect("found above");
                return (status, payload);
            }
            if !self.poll_rx(ram, events) {
                assert!(start.elapsed() < COMMAND_TIMEOUT, "no response to command {seq}");
                std::thread::yield_now();
            }
        }
    }
}

impl DriverPath for Vhost {
    fn command(&mut self, ram: &GuestRam, events: &mut Events, cmd: Cmd, args: &[u8]) -> Result<Vec<u8>, Status> {
        let (seq, ctrl) = self.driver.command(cmd as u16, args);
        let frame = build_frame(self.mac, self.mac, &ctrl);
        self.send_frame(ram, events, &frame);
        let (status, payload) = self.wait_response(ram, events, seq);
        match Status::try_from(status) {
            Ok(Status::Ok) => Ok(payload),
            Ok(s) => Err(s),
            Err(_) => Err(Status::Invalid),
        }
    }

    /// A doorbell that went well is not answered: nothing to wait for.
    fn doorbell(&mut self, ram: &GuestRam, events: &mut Events, db: &CmdDoorbell) {
        let (_, ctrl) = self.driver.command(Cmd::Doorbell as u16, db.as_slice());
        let frame = build_frame(self.mac, self.mac, &ctrl);
        self.send_frame(ram, events, &frame);
    }
}

/// The frames side of a bench guest, for the forwarding anchor and for
/// taking what vt3d delivered.
pub trait Frames {
    fn poll_rx(&mut self) -> bool;
    fn send_burst(&mut self, frame: &mut [u8], seq: u64, n: usize) -> usize;
}

impl Frames for Guest {
    fn poll_rx(&mut self) -> bool {
        self.dev.poll_rx(&self.ram, &mut self.events)
    }

    fn send_burst(&mut self, frame: &mut [u8], seq: u64, n: usize) -> usize {
        self.dev.send_burst(&self.ram, frame, seq, n)
    }
}

/// An SQ WQE of one SGE, signaled.
pub fn sq_wqe(wr_id: u64, opcode: WrOpcode, local: &testing::Mr, offset: u64, len: u32) -> SqWqe {
    testing::send_wqe(wr_id, opcode, true, &[(*local, offset, len)])
}
