//! The synthetic guest: vt3.ko's commands and events and libvt3's posts
//! and polls over a [`GuestRam`], whatever carries the commands to the
//! device ([`DriverPath`]: the device in this process, or a vt3d process
//! over vhost-user).

use std::collections::VecDeque;

use vm_memory::ByteValued;

use super::ram::{recv_wqe, CqRing, GuestRam, Mr, QpCaps, QpRings, SrqRing};
use crate::abi::{
    read_struct, Cmd, CmdAccept, CmdConnect, CmdDoorbell, CmdHandle, CmdListen, CmdSetAddr, CqStatus, Cqe,
    DoorbellQueue, Event, EventCm, EventType, PrivateData, QpStatus, RespHandle, SockAddr, SqWqe, SrqStatus, Status,
};

/// What carries the driver's commands to the device and its events back.
pub trait DriverPath {
    /// Sends one command as vt3.ko does and returns its response payload
    /// or the device's status; events that arrive meanwhile go to `events`.
    fn command(&mut self, ram: &GuestRam, events: &mut Events, cmd: Cmd, args: &[u8]) -> Result<Vec<u8>, Status>;

    /// Rings a doorbell: a command whose success is not answered.
    fn doorbell(&mut self, ram: &GuestRam, events: &mut Events, db: &CmdDoorbell) {
        if let Err(s) = self.command(ram, events, Cmd::Doorbell, db.as_slice()) {
            panic!("DOORBELL refused: {}", s.name());
        }
    }
}

/// The events the driver received, oldest first: (type, payload).
#[derive(Debug, Default)]
pub struct Events(VecDeque<(EventType, Vec<u8>)>);

impl Events {
    pub fn push(&mut self, kind: EventType, body: Vec<u8>) {
        self.0.push_back((kind, body));
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The `i`th event received and not yet taken.
    pub fn get(&self, i: usize) -> Option<&(EventType, Vec<u8>)> {
        self.0.get(i)
    }

    pub fn iter(&self) -> impl Iterator<Item = &(EventType, Vec<u8>)> {
        self.0.iter()
    }

    pub fn has(&self, kind: EventType) -> bool {
        self.0.iter().any(|(k, _)| *k == kind)
    }

    /// The first CM event of `kind`, left in place.
    pub fn cm(&self, kind: EventType) -> Option<EventCm> {
        self.0.iter().find(|(k, _)| *k == kind).and_then(|(_, b)| read_struct(b))
    }

    /// The first event of `kind`, removed.
    pub fn take(&mut self, kind: EventType) -> Option<Vec<u8>> {
        let at = self.0.iter().position(|(k, _)| *k == kind)?;
        self.0.remove(at).map(|(_, body)| body)
    }

    pub fn take_all(&mut self) -> Vec<(EventType, Vec<u8>)> {
        self.0.drain(..).collect()
    }

    /// The handles named by the events of `kind` (a QP's, a CQ's, an SRQ's).
    pub fn handles(&self, kind: EventType) -> Vec<u32> {
        self.0
            .iter()
            .filter(|(k, _)| *k == kind)
            .filter_map(|(_, b)| read_struct::<Event>(b))
            .map(|e| e.handle.to_native())
            .collect()
    }

    /// The QP events, as (qpn, code, detail).
    pub fn qp(&self) -> Vec<(u32, u32, u32)> {
        self.0
            .iter()
            .filter(|(k, _)| *k == EventType::Qp)
            .filter_map(|(_, b)| read_struct::<Event>(b))
            .map(|e| (e.handle.to_native(), e.code.to_native(), e.detail.to_native()))
            .collect()
    }
}

/// One guest: its RAM, its address, the events its driver received, and
/// the path to its device.
#[derive(Debug)]
pub struct Guest<P> {
    pub ram: GuestRam,
    pub dev: P,
    pub events: Events,
    pub mac: [u8; 6],
    pub ip: [u8; 4],
    /// Doorbell commands sent (the status page said the queue was idle).
    pub doorbells: u64,
}

impl<P: DriverPath> Guest<P> {
    pub fn new(ram: GuestRam, dev: P, mac: [u8; 6]) -> Self {
        Self { ram, dev, events: Events::default(), mac, ip: [0; 4], doorbells: 0 }
    }

    /// A command as vt3.ko sends it; its response payload.
    pub fn cmd<T: ByteValued>(&mut self, cmd: Cmd, args: &T) -> Result<Vec<u8>, Status> {
        self.raw(cmd, args.as_slice())
    }

    /// A command with arguments of any length.
    pub fn raw(&mut self, cmd: Cmd, args: &[u8]) -> Result<Vec<u8>, Status> {
        self.dev.command(&self.ram, &mut self.events, cmd, args)
    }

    /// A command that must succeed and answer with a handle.
    pub fn handle<T: ByteValued>(&mut self, cmd: Cmd, args: &T) -> u32 {
        let body = self.cmd(cmd, args).unwrap_or_else(|s| panic!("{} failed: {}", cmd.name(), s.name()));
        read_struct::<RespHandle>(&body).expect("a handle").handle.to_native()
    }

    /// SET_ADDR: this guest's MAC and `ip`/24.
    pub fn set_addr(&mut self, ip: [u8; 4]) -> Result<Vec<u8>, Status> {
        self.ip = ip;
        let a = CmdSetAddr { mac: self.mac, prefix_len: 24, reserved: 0, ipv4: ip };
        self.cmd(Cmd::SetAddr, &a)
    }

    pub fn pd(&mut self) -> u32 {
        self.handle(Cmd::AllocPd, &CmdHandle::default())
    }

    pub fn cq(&mut self, depth: u32) -> CqRing {
        let (args, cq) = self.ram.new_cq(depth);
        CqRing { cqn: self.handle(Cmd::CreateCq, &args), ..cq }
    }

    /// A QP of `depth` SQ and RQ entries, four SGEs and 64 inline octets.
    pub fn qp(&mut self, pdn: u32, scq: CqRing, rcq: CqRing, depth: u32) -> QpRings {
        self.qp_with(pdn, scq, rcq, QpCaps { depth, ..QpCaps::default() }, 0)
    }

    /// A QP with `caps`; with `srqn`, its receives come from that SRQ.
    pub fn qp_with(&mut self, pdn: u32, scq: CqRing, rcq: CqRing, caps: QpCaps, srqn: u32) -> QpRings {
        let (args, qp) = self.ram.new_qp(pdn, scq, rcq, caps, srqn);
        QpRings { qpn: self.handle(Cmd::CreateQp, &args), ..qp }
    }

    pub fn srq(&mut self, pdn: u32, depth: u32, limit: u32) -> SrqRing {
        let (args, srq) = self.ram.new_srq(pdn, depth, limit);
        SrqRing { srqn: self.handle(Cmd::CreateSrq, &args), ..srq }
    }

    pub fn mr(&mut self, pdn: u32, len: u64, access: u32) -> Mr {
        let (args, mr) = self.ram.new_mr(pdn, len, access);
        Mr { stag: self.handle(Cmd::RegMr, &args), ..mr }
    }

    pub fn qp_status(&self, qp: &QpRings) -> QpStatus {
        self.ram.qp_status(qp)
    }

    pub fn cq_status(&self, cq: &CqRing) -> CqStatus {
        self.ram.cq_status(cq)
    }

    pub fn srq_status(&self, srq: &SrqRing) -> SrqStatus {
        self.ram.srq_status(srq)
    }

    /// Publishes the queue's producer index and rings if vt3d is idle on it.
    pub fn ring_doorbell(&mut self, qp: &QpRings, queue: DoorbellQueue) {
        if self.ram.publish(qp, queue) {
            self.doorbells += 1;
            let db = CmdDoorbell { qpn: qp.qpn.into(), queues: (queue as u32).into() };
            self.dev.doorbell(&self.ram, &mut self.events, &db);
        }
    }

    /// [`Guest::ring_doorbell`] for an SRQ.
    pub fn srq_doorbell(&mut self, srq: &SrqRing) {
        if self.ram.publish_srq(srq) {
            self.doorbells += 1;
            let db = CmdDoorbell { qpn: srq.srqn.into(), queues: (DoorbellQueue::Srq as u32).into() };
            self.dev.doorbell(&self.ram, &mut self.events, &db);
        }
    }

    /// Posts a send WQE as libvt3 does.
    pub fn post_send(&mut self, qp: &mut QpRings, wqe: &SqWqe) {
        self.ram.write_send(qp, wqe);
        self.ring_doorbell(qp, DoorbellQueue::Sq);
    }

    /// Posts a receive of one SGE as libvt3 does.
    pub fn post_recv(&mut self, qp: &mut QpRings, wr_id: u64, mr: &Mr, offset: u64, len: u32) {
        self.ram.write_recv(qp, &recv_wqe(wr_id, mr, offset, len));
        self.ring_doorbell(qp, DoorbellQueue::Rq);
    }

    /// Posts a receive to an SRQ as libvt3 does.
    pub fn post_srq(&mut self, srq: &mut SrqRing, wqe: &crate::abi::RqWqe) {
        self.ram.write_srq(srq, wqe);
        self.srq_doorbell(srq);
    }

    /// Reaps every CQE the device wrote (libvt3's poll_cq).
    pub fn poll_cq(&mut self, cq: &mut CqRing) -> Vec<Cqe> {
        let mut out = Vec::new();
        self.ram.reap(cq, &mut out);
        out
    }

    pub fn take_events(&mut self) -> Vec<(EventType, Vec<u8>)> {
        self.events.take_all()
    }

    pub fn has_event(&self, kind: EventType) -> bool {
        self.events.has(kind)
    }

    pub fn cm_event(&self, kind: EventType) -> Option<EventCm> {
        self.events.cm(kind)
    }

    pub fn qp_events(&self) -> Vec<(u32, u32, u32)> {
        self.events.qp()
    }
}

pub fn sockaddr(ip: [u8; 4], port: u16) -> SockAddr {
    SockAddr { ipv4: ip, port: port.to_be_bytes(), reserved: 0.into() }
}

/// MPA private data holding `data` (at most its 512 octets).
pub fn private_data(data: &[u8]) -> PrivateData {
    let mut pd = PrivateData::default();
    let n = data.len().min(pd.0.len());
    if let (Some(dst), Some(src)) = (pd.0.get_mut(..n), data.get(..n)) {
        dst.copy_from_slice(src);
    }
    pd
}

fn pd_len(data: &[u8]) -> u16 {
    u16::try_from(data.len()).unwrap_or(u16::MAX)
}

pub fn listen_args(port: u16, backlog: u32) -> CmdListen {
    CmdListen { local: sockaddr([0; 4], port), backlog: backlog.into(), reserved: 0.into() }
}

/// CONNECT from `local_port` to `remote` through `next_hop`, IRD/ORD 8.
pub fn connect_args(qpn: u32, local_port: u16, remote: SockAddr, next_hop: [u8; 6], pd: &[u8]) -> CmdConnect {
    CmdConnect {
        local: sockaddr([0; 4], local_port),
        remote,
        next_hop,
        pd_len: pd_len(pd).into(),
        qpn: qpn.into(),
        ird: 8.into(),
        ord: 8.into(),
        reserved: 0.into(),
        private_data: private_data(pd),
    }
}

/// ACCEPT of connection `conn_id` onto `qpn`, IRD/ORD 8.
pub fn accept_args(conn_id: u32, qpn: u32, pd: &[u8]) -> CmdAccept {
    CmdAccept {
        conn_id: conn_id.into(),
        qpn: qpn.into(),
        ird: 8.into(),
        ord: 8.into(),
        pd_len: pd_len(pd).into(),
        reserved0: 0.into(),
        reserved1: 0.into(),
        private_data: private_data(pd),
    }
}
