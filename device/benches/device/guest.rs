//! A synthetic guest: what QEMU, virtio_net, vt3.ko and libvt3 do for vt3d,
//! from the host. Guest RAM is a memfd shared with vt3d over vhost-user
//! (the `vhost` crate's `Frontend`, as QEMU); the virtqueues are driven as
//! virtio_net drives them; control commands are sealed with
//! `vt3d::control::DriverEnd` as vt3.ko seals them; WQEs, CQEs and status
//! pages follow vt3_hw.h as libvt3 does (provider/qp.c, provider/cq.c).

use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{fence, Ordering};
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use vm_memory::{ByteValued, Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;
use vt3d::abi::*;
use vt3d::control::{build_frame, DriverEnd};

use crate::vring::Vring;

const VNET_HDR: usize = 12;
const ETH_HDR: usize = 14;
const QUEUE_SIZE: u16 = 256;
const RX_RING: u64 = 0x0;
const TX_RING: u64 = 0x4000;
/// The rings end below this.
const RINGS_END: u64 = 0x8000;
const STATUS_AREA: u64 = 0x1_0000;
const STATUS_AREA_END: u64 = 0x10_0000;
const RX_BUFS: u64 = 0x10_0000;
const TX_BUFS: u64 = 0x20_0000;
const BUF_LEN: u32 = 4096;
/// Page lists, rings and buffers are allocated from here up.
const HEAP: u64 = 0x40_0000;
const PAGE: u64 = VT3_PAGE_SIZE;
const CQE_LEN: u64 = 32;
const WQE_LEN: u64 = VT3_WQE_SIZE as u64;
/// A command unanswered this long means vt3d is wedged: the bench stops.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(10);

/// A CQ as the provider sees it.
#[derive(Debug, Clone, Copy)]
pub struct CqRing {
    pub cqn: u32,
    ring: u64,
    status: u64,
    depth: u32,
    cons: u32,
}

/// A QP as the provider sees it.
#[derive(Debug, Clone, Copy)]
pub struct QpRings {
    pub qpn: u32,
    status: u64,
    sq: u64,
    rq: u64,
    depth: u32,
    sq_prod: u32,
    rq_prod: u32,
}

impl QpRings {
    /// WQEs posted to the SQ and not yet retired by vt3d.
    pub fn sq_outstanding(&self, guest: &Guest) -> u32 {
        self.sq_prod.wrapping_sub(guest.qp_status(self).sq_cons.to_native())
    }
}

/// A registered buffer: its STag and the IOVA it was registered at.
#[derive(Debug, Clone, Copy)]
pub struct Mr {
    pub stag: u32,
    pub iova: u64,
}

/// One guest of one vt3d.
pub struct Guest {
    pub mem: GuestMemoryMmap,
    _frontend: Frontend,
    kicks: [EventFd; 2],
    _calls: [EventFd; 2],
    rx: Vring,
    tx: Vring,
    driver: DriverEnd,
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    events: VecDeque<(EventType, Vec<u8>)>,
    responses: VecDeque<(u32, u16, Vec<u8>)>,
    heap: u64,
    status_next: u64,
    /// Doorbell commands sent (the status page said the queue was idle).
    pub doorbells: u64,
    /// Plain (non-control) frames vt3d delivered, and the sequence number
    /// of the last (octets 14..22): the forwarding anchor's.
    pub plain_rx: u64,
    pub plain_last: u64,
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

impl Guest {
    /// Boots a guest against the vt3d serving `socket`: negotiates as QEMU,
    /// sets up both virtqueues, posts RX buffers, and starts a driver
    /// session (HELLO naming the virtqueues it gave vt3d).
    pub fn boot(socket: &Path, mac: [u8; 6], ip: [u8; 4], mem_size: usize, key: [u64; 2]) -> Self {
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
        let mut guest = Self {
            mem,
            _frontend: frontend,
            kicks,
            _calls: calls,
            rx,
            tx,
            driver: DriverEnd::new(key),
            mac,
            ip,
            events: VecDeque::new(),
            responses: VecDeque::new(),
            heap: HEAP,
            status_next: STATUS_AREA,
            doorbells: 0,
            plain_rx: 0,
            plain_last: 0,
        };
        for id in 0..QUEUE_SIZE {
            guest.rx.push(&guest.mem, id, BUF_LEN, true);
        }
        if guest.rx.publish(&guest.mem) {
            guest.kick(0);
        }
        guest.first_contact();
        guest
    }

    /// HELLO, vt3d's challenge (under the provisioned key, not yet a
    /// session's frame), PROVE and its answer.
    fn first_contact(&mut self) {
        let hello = self.driver.hello();
        self.send_ctrl(&hello);
        let start = Instant::now();
        let challenge = loop {
            if let Some(c) = self.take_raw_ctrl() {
                break c;
            }
            assert!(start.elapsed() < COMMAND_TIMEOUT, "HELLO not answered");
            std::thread::yield_now();
        };
        let (seq, prove) = self.driver.prove(&challenge).expect("a challenge under the provisioned key");
        self.send_ctrl(&prove);
        let (status, _) = self.wait_response(seq);
        assert_eq!(status, Status::Ok as u16, "PROVE refused");
    }

    /// The control part of the next control frame on RX, unopened.
    fn take_raw_ctrl(&mut self) -> Option<Vec<u8>> {
        let (id, len) = self.rx.pop_used(&self.mem)?;
        let mut frame = vec![0u8; (len as usize).min(BUF_LEN as usize)];
        self.mem.read_slice(&mut frame, GuestAddress(self.rx.buffer(id))).expect("RX buffer");
        self.rx.push(&self.mem, id, BUF_LEN, true);
        if self.rx.publish(&self.mem) {
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
    fn send_ctrl(&mut self, ctrl: &[u8]) {
        let frame = build_frame(self.mac, self.mac, ctrl);
        self.send_frame(&frame);
    }

    /// Puts `frame` into TX buffer `id` (not yet published).
    fn push_frame(&mut self, id: u16, frame: &[u8]) {
        let at = self.tx.buffer(id);
        let len = VNET_HDR + frame.len();
        assert!(len <= self.tx.buf_len() as usize, "frame of {len} octets");
        self.mem.write_slice(&[0u8; VNET_HDR], GuestAddress(at)).expect("vnet header");
        self.mem.write_slice(frame, GuestAddress(at + VNET_HDR as u64)).expect("frame");
        self.tx.push(&self.mem, id, u32::try_from(len).unwrap_or(u32::MAX), false);
    }

    /// Sends one Ethernet frame on the TX ring, waiting for a free buffer.
    pub fn send_frame(&mut self, frame: &[u8]) {
        let id = loop {
            self.reclaim_tx();
            if let Some(id) = self.tx.take_free() {
                break id;
            }
            self.poll_rx();
            std::thread::yield_now();
        };
        self.push_frame(id, frame);
        if self.tx.publish(&self.mem) {
            self.kick(1);
        }
    }

    /// Sends up to `n` copies of `frame` (sequence numbers from `seq` in
    /// octets 14..22) in the TX buffers free now, with one publish and at
    /// most one kick, as a driver does with a burst; returns how many.
    pub fn send_burst(&mut self, frame: &mut [u8], seq: u64, n: usize) -> usize {
        self.reclaim_tx();
        let mut sent = 0;
        while sent < n {
            let Some(id) = self.tx.take_free() else { break };
            if let Some(at) = frame.get_mut(14..22) {
                at.copy_from_slice(&(seq + sent as u64).to_be_bytes());
            }
            self.push_frame(id, frame);
            sent += 1;
        }
        if sent > 0 && self.tx.publish(&self.mem) {
            self.kick(1);
        }
        sent
    }

    fn reclaim_tx(&mut self) {
        while let Some((id, _)) = self.tx.pop_used(&self.mem) {
            self.tx.release(id);
        }
    }

    /// Takes every frame vt3d delivered: responses and events (opened
    /// with the session key), then gives the buffers back. Returns
    /// whether anything arrived.
    pub fn poll_rx(&mut self) -> bool {
        let mut any = false;
        let mut frame = vec![0u8; BUF_LEN as usize];
        while let Some((id, len)) = self.rx.pop_used(&self.mem) {
            any = true;
            let len = (len as usize).min(frame.len());
            let buf = &mut frame[..len];
            self.mem.read_slice(buf, GuestAddress(self.rx.buffer(id))).expect("RX buffer");
            self.take_frame(id, len, &frame);
            self.rx.push(&self.mem, id, BUF_LEN, true);
        }
        if any && self.rx.publish(&self.mem) {
            self.kick(0);
        }
        any
    }

    fn take_frame(&mut self, _id: u16, len: usize, buf: &[u8]) {
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
            self.events.push_back((kind, opened.payload.to_vec()));
        }
    }

    fn wait_response(&mut self, seq: u32) -> (u16, Vec<u8>) {
        let start = Instant::now();
        loop {
            if let Some(at) = self.responses.iter().position(|r| r.0 == seq) {
                let (_, status, payload) = self.responses.remove(at).expect("found above");
                return (status, payload);
            }
            if !self.poll_rx() {
                assert!(start.elapsed() < COMMAND_TIMEOUT, "no response to command {seq}");
                std::thread::yield_now();
            }
        }
    }

    /// A command as vt3.ko sends it; its response payload.
    pub fn cmd(&mut self, cmd: Cmd, args: &[u8]) -> Result<Vec<u8>, Status> {
        let (seq, ctrl) = self.driver.command(cmd as u16, args);
        self.send_ctrl(&ctrl);
        let (status, payload) = self.wait_response(seq);
        match Status::try_from(status) {
            Ok(Status::Ok) => Ok(payload),
            Ok(s) => Err(s),
            Err(_) => Err(Status::Invalid),
        }
    }

    pub fn handle<T: ByteValued>(&mut self, cmd: Cmd, args: &T) -> u32 {
        let body = self.cmd(cmd, args.as_slice()).unwrap_or_else(|s| panic!("{} failed: {}", cmd.name(), s.name()));
        read_struct::<RespHandle>(&body).expect("a handle").handle.to_native()
    }

    /// The first event of `kind` received, removed.
    pub fn take_event(&mut self, kind: EventType) -> Option<Vec<u8>> {
        let at = self.events.iter().position(|(k, _)| *k == kind)?;
        self.events.remove(at).map(|(_, body)| body)
    }

    /// The QP events received so far, as (qpn, code, detail): an error
    /// report's first line.
    pub fn qp_events(&self) -> Vec<(u32, u32, u32)> {
        self.events
            .iter()
            .filter(|(k, _)| *k == EventType::Qp)
            .filter_map(|(_, body)| read_struct::<Event>(body))
            .map(|e| (e.handle.to_native(), e.code.to_native(), e.detail.to_native()))
            .collect()
    }

    /// `len` octets of fresh guest memory, page aligned.
    pub fn alloc(&mut self, len: u64) -> u64 {
        let at = self.heap;
        self.heap = (self.heap + len).next_multiple_of(PAGE);
        assert!(self.heap <= self.mem.last_addr().0, "guest RAM exhausted");
        at
    }

    /// `n` contiguous fresh pages and their page list.
    fn pages(&mut self, n: u64) -> (u64, u64) {
        let pbl = self.alloc(n * 8);
        let first = self.alloc(n * PAGE);
        for i in 0..n {
            self.mem.write_obj((first + i * PAGE).to_le(), GuestAddress(pbl + i * 8)).expect("page list");
        }
        (pbl, first)
    }

    fn status_page(&mut self) -> u64 {
        let at = self.status_next;
        self.status_next += 64;
        assert!(self.status_next <= STATUS_AREA_END, "status area exhausted");
        at
    }

    pub fn set_addr(&mut self) {
        let a = CmdSetAddr { mac: self.mac, prefix_len: 24, reserved: 0, ipv4: self.ip };
        self.cmd(Cmd::SetAddr, a.as_slice()).expect("SET_ADDR");
    }

    pub fn pd(&mut self) -> u32 {
        self.handle(Cmd::AllocPd, &CmdHandle::default())
    }

    pub fn cq(&mut self, depth: u32) -> CqRing {
        let npages = (u64::from(depth) * CQE_LEN).div_ceil(PAGE);
        let (pbl, ring) = self.pages(npages);
        let status = self.status_page();
        let a = CmdCreateCq {
            ring_pbl_addr: pbl.into(),
            status_addr: status.into(),
            ring_npages: u32::try_from(npages).unwrap_or(u32::MAX).into(),
            depth: depth.into(),
        };
        let cqn = self.handle(Cmd::CreateCq, &a);
        CqRing { cqn, ring, status, depth, cons: 0 }
    }

    pub fn qp(&mut self, pdn: u32, scq: &CqRing, rcq: &CqRing, depth: u32) -> QpRings {
        let npages = (u64::from(depth) * WQE_LEN).div_ceil(PAGE);
        let (sq_pbl, sq) = self.pages(npages);
        let (rq_pbl, rq) = self.pages(npages);
        let status = self.status_page();
        let npages = u32::try_from(npages).unwrap_or(u32::MAX);
        let a = CmdCreateQp {
            sq_pbl_addr: sq_pbl.into(),
            rq_pbl_addr: rq_pbl.into(),
            status_addr: status.into(),
            sq_npages: npages.into(),
            rq_npages: npages.into(),
            sq_depth: depth.into(),
            rq_depth: depth.into(),
            pdn: pdn.into(),
            send_cqn: scq.cqn.into(),
            recv_cqn: rcq.cqn.into(),
            max_send_sge: 1.into(),
            max_recv_sge: 1.into(),
            max_inline: 64.into(),
            flags: 0.into(),
            srqn: 0.into(),
        };
        let qpn = self.handle(Cmd::CreateQp, &a);
        QpRings { qpn, status, sq, rq, depth, sq_prod: 0, rq_prod: 0 }
    }

    pub fn mr(&mut self, pdn: u32, len: u64, access: u32) -> Mr {
        let npages = len.div_ceil(PAGE);
        let (pbl, guest) = self.pages(npages);
        let iova = 0x7f00_0000_0000 + guest;
        let a = CmdRegMr {
            iova: iova.into(),
            length: len.into(),
            pbl_addr: pbl.into(),
            npages: u32::try_from(npages).unwrap_or(u32::MAX).into(),
            pdn: pdn.into(),
            access: access.into(),
            flags: 0.into(),
            page_offset: 0.into(),
            reserved: 0.into(),
        };
        let stag = self.handle(Cmd::RegMr, &a);
        Mr { stag, iova }
    }

    pub fn qp_status(&self, qp: &QpRings) -> QpStatus {
        self.mem.read_obj(GuestAddress(qp.status)).expect("QP status page")
    }

    /// libvt3's doorbell rule (docs/architecture.md §3.2): publish the producer
    /// index, full barrier, ring only if vt3d said the queue is idle.
    fn ring_doorbell(&mut self, qp: &QpRings, queue: DoorbellQueue) {
        let (field, prod, idle) = match queue {
            DoorbellQueue::Sq => (0, qp.sq_prod, QpStatusFlag::SqIdle),
            DoorbellQueue::Rq => (4, qp.rq_prod, QpStatusFlag::RqIdle),
            DoorbellQueue::Srq => unreachable!("no SRQs here"),
        };
        self.mem.store(prod.to_le(), GuestAddress(qp.status + field), Ordering::Release).expect("producer index");
        fence(Ordering::SeqCst);
        if self.qp_status(qp).flags.to_native() & idle as u32 != 0 {
            self.doorbells += 1;
            let db = CmdDoorbell { qpn: qp.qpn.into(), queues: (queue as u32).into() };
            // A doorbell that went well is not answered.
            let (_, ctrl) = self.driver.command(Cmd::Doorbell as u16, db.as_slice());
            self.send_ctrl(&ctrl);
        }
    }

    pub fn post_send(&mut self, qp: &mut QpRings, wqe: &SqWqe) {
        let slot = u64::from(qp.sq_prod & (qp.depth - 1));
        self.mem.write_obj(*wqe, GuestAddress(qp.sq + slot * WQE_LEN)).expect("SQ slot");
        qp.sq_prod = qp.sq_prod.wrapping_add(1);
        self.ring_doorbell(qp, DoorbellQueue::Sq);
    }

    pub fn post_recv(&mut self, qp: &mut QpRings, wr_id: u64, mr: &Mr, offset: u64, len: u32) {
        let mut wqe = RqWqe { wr_id: wr_id.into(), num_sge: 1, ..Default::default() };
        wqe.sge[0] = Sge { addr: (mr.iova + offset).into(), length: len.into(), lkey: mr.stag.into() };
        let slot = u64::from(qp.rq_prod & (qp.depth - 1));
        self.mem.write_obj(wqe, GuestAddress(qp.rq + slot * WQE_LEN)).expect("RQ slot");
        qp.rq_prod = qp.rq_prod.wrapping_add(1);
        self.ring_doorbell(qp, DoorbellQueue::Rq);
    }

    /// Reaps every CQE vt3d wrote (libvt3's poll_cq) into `out`.
    pub fn poll_cq(&self, cq: &mut CqRing, out: &mut Vec<Cqe>) -> usize {
        let prod: u32 = self.mem.load(GuestAddress(cq.status), Ordering::Acquire).expect("CQ producer index");
        let prod = u32::from_le(prod);
        let mut n = 0;
        while cq.cons != prod {
            let slot = u64::from(cq.cons & (cq.depth - 1));
            out.push(self.mem.read_obj(GuestAddress(cq.ring + slot * CQE_LEN)).expect("CQE"));
            cq.cons = cq.cons.wrapping_add(1);
            n += 1;
        }
        if n > 0 {
            self.mem.store(cq.cons.to_le(), GuestAddress(cq.status + 4), Ordering::Release).expect("CQ consumer index");
        }
        n
    }
}

fn sockaddr(ip: [u8; 4], port: u16) -> SockAddr {
    SockAddr { ipv4: ip, port: port.to_be_bytes(), reserved: 0.into() }
}

pub fn listen_args(port: u16) -> CmdListen {
    CmdListen { local: sockaddr([0; 4], port), backlog: 128.into(), reserved: 0.into() }
}

pub fn connect_args(qpn: u32, local_port: u16, remote: &Guest, port: u16) -> CmdConnect {
    CmdConnect {
        local: sockaddr([0; 4], local_port),
        remote: sockaddr(remote.ip, port),
        next_hop: remote.mac,
        pd_len: 0.into(),
        qpn: qpn.into(),
        ird: 8.into(),
        ord: 8.into(),
        reserved: 0.into(),
        private_data: PrivateData::default(),
    }
}

pub fn accept_args(conn_id: u32, qpn: u32) -> CmdAccept {
    CmdAccept {
        conn_id: conn_id.into(),
        qpn: qpn.into(),
        ird: 8.into(),
        ord: 8.into(),
        pd_len: 0.into(),
        reserved0: 0.into(),
        reserved1: 0.into(),
        private_data: PrivateData::default(),
    }
}

/// An SQ WQE with one SGE.
pub fn sq_wqe(wr_id: u64, opcode: WrOpcode, local: &Mr, offset: u64, len: u32) -> SqWqe {
    let mut w = SqWqe {
        wr_id: wr_id.into(),
        opcode: opcode as u8,
        flags: WqeFlag::Signaled as u8,
        num_sge: 1,
        ..Default::default()
    };
    let sge = Sge { addr: (local.iova + offset).into(), length: len.into(), lkey: local.stag.into() };
    // sge[0] shares the last 64 octets with inline_data (a C union).
    let at = std::mem::offset_of!(SqWqe, inline_data);
    if let Some(dst) = w.as_mut_slice().get_mut(at..at + std::mem::size_of::<Sge>()) {
        dst.copy_from_slice(sge.as_slice());
    }
    w
}

/// An RDMA WRITE or READ WQE between `local` and `remote`.
pub fn rdma_wqe(
    wr_id: u64,
    opcode: WrOpcode,
    local: &Mr,
    offset: u64,
    len: u32,
    remote: &Mr,
    remote_offset: u64,
) -> SqWqe {
    SqWqe {
        remote_addr: (remote.iova + remote_offset).into(),
        remote_stag: remote.stag.into(),
        ..sq_wqe(wr_id, opcode, local, offset, len)
    }
}
