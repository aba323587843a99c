//! The RDMA function's resources: protection domains, memory regions (the
//! TPT), completion queues and queue pairs, with the limits the device
//! advertises and enforces. Everything the guest hands over — addresses,
//! lengths, counts, handles — is validated here against guest memory and
//! these limits before anything is stored.
//!
//! Once the driver told the guest's address (VT3_CMD_SET_ADDR), the iWARP
//! engine runs behind these resources (`offload`): connections, and the
//! data path between the guest's rings and the engine (`datapath`).

pub mod conns;
mod datapath;
mod execute;
pub mod fault;
pub mod memory;
mod offload;
mod pairing;
pub mod poll;
mod rereg;
pub mod srq;
pub use vt3_iwarp::{table, tpt};
pub mod watchdog;
pub mod wqe;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use vm_memory::{Bytes, GuestAddress, GuestMemory, Le32, Permissions};
use vt3_iwarp::engine::{MwType, WorkQueue};
use vt3_iwarp::toe::FourTuple;

use crate::abi::{
    self, CmdAllocMr, CmdCreateCq, CmdCreateQp, CmdModifyQp, CmdRegMr, DeviceAttr, EventType, PortAttr, QpAttr,
    QpState, QpStatusFlag, RespHandle, Status, VT3_PAGE_SIZE,
};
use crate::control::Request;
use datapath::FETCH_BUDGET;
use memory::StatusWord;
use poll::{PollSet, PollWindow, PolledQueue, Trigger};
use srq::Srq;
use table::Table;
use tpt::{Backing, DeregError, Mr, Tpt, ALL_ACCESS};

// The TPT (vt3-iwarp's) pages its regions as the ABI does.
const _: () = assert!(VT3_PAGE_SIZE == vt3_iwarp::engine::PAGE_SIZE);
use vm_memory::ByteValued;

pub use offload::Offload;
/// Time as the engine counts it (injected by the caller).
pub use vt3_iwarp::toe::Instant;

/// Limits advertised by VT3_CMD_QUERY_DEVICE and enforced here. T3-class
/// where the T3 had a number (SGEs, inline, IRD/ORD, MR size), bounded
/// elsewhere so a guest cannot make vt3d allocate without limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_sge_rd: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_ord: u32,
    pub max_ird: u32,
    pub max_inline: u32,
    pub max_mr_size: u64,
    pub max_pbl_pages: u32,
    /// Pages a fast-reg MR may hold (VT3_CMD_ALLOC_MR max_pages).
    pub max_fast_reg_pages: u32,
    /// Page-list entries held for all MRs and rings together.
    pub pbl_budget: u64,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            // 10,000 connections and more (issue 15): a QP costs vt3d a few
            // KiB while idle; the TOE's socket buffers share one budget.
            max_qp: 16384,
            max_qp_wr: 4095,
            max_sge: u32::try_from(abi::VT3_MAX_SGE).unwrap_or(u32::MAX),
            max_sge_rd: 1,
            max_cq: 2048,
            max_cqe: 65535,
            max_mr: 16384,
            max_pd: 1024,
            max_ord: 8,
            max_ird: 8,
            max_inline: u32::try_from(abi::VT3_MAX_INLINE).unwrap_or(u32::MAX),
            max_mr_size: 4 << 30,
            max_pbl_pages: 1 << 20,
            // 2 MiB per MR: what nvme-rdma, NFS/RDMA and rdma_rw ask for
            // (they cap themselves at 256 pages or fewer).
            max_fast_reg_pages: 512,
            pbl_budget: 4 << 20,
            max_srq: 1024,
            max_srq_wr: 4095,
            max_srq_sge: u32::try_from(abi::VT3_MAX_SGE).unwrap_or(u32::MAX),
        }
    }
}

/// `VT3_PAGE_SIZE` as a length.
const PAGE_BYTES: usize = 4096;
const _: () = assert!(PAGE_BYTES as u64 == VT3_PAGE_SIZE);

/// A guest ring: `depth` fixed-size entries spread over guest pages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ring {
    pub depth: u32,
    pub entry_size: u64,
    pub pages: Vec<u64>,
}

impl Ring {
    /// Guest-physical address of entry `index` (mod depth). Entries never
    /// straddle pages: sizes are powers of two no larger than a page.
    pub fn entry_addr(&self, index: u32) -> Option<GuestAddress> {
        // Depth 0: the RQ of a QP of an SRQ, which has no entries.
        let slot = u64::from(index & self.depth.checked_sub(1)?);
        let byte = slot * self.entry_size;
        let page = self.pages.get(usize::try_from(byte / VT3_PAGE_SIZE).ok()?)?;
        Some(GuestAddress(page + byte % VT3_PAGE_SIZE))
    }
}

#[derive(Debug)]
pub struct Pd {
    /// MRs and QPs in this PD; deallocation waits until they are gone.
    pub users: u32,
}

#[derive(Debug)]
pub struct Cq {
    pub ring: Ring,
    pub status_addr: GuestAddress,
    pub arm_flags: u32,
    pub qp_users: u32,
    /// Producer index (vt3d owns it; mirrored in the status page).
    pub prod: u32,
    /// An overflow was reported (VT3_EV_CQ_ERROR goes out once).
    pub overflowed: bool,
}

/// How far vt3d got in one work queue: WQEs handed to the engine
/// (`fetched`) and WQEs retired (`consumed`, published as sq_cons/rq_cons:
/// their slots may be reused). consumed <= fetched <= producer, modulo 2^32.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct WorkProgress {
    pub fetched: u32,
    pub consumed: u32,
}

#[derive(Debug)]
pub struct Qp {
    pub pdn: u32,
    pub send_cqn: u32,
    pub recv_cqn: u32,
    pub sq: Ring,
    pub rq: Ring,
    pub status_addr: GuestAddress,
    pub state: QpState,
    pub ird: u32,
    pub ord: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
    pub flags: u32,
    pub sq_work: WorkProgress,
    pub rq_work: WorkProgress,
    /// The SRQ its receives take WQEs from (0: its own RQ; `rq` is empty).
    pub srqn: u32,
    /// CONNECT was sent and its CONNECT_REPLY is still owed to the driver.
    pub connecting: bool,
    /// The connection's addresses (for the connection events).
    pub tuple: Option<FourTuple>,
    /// The conn_id the passive side accepted (0 on the active side).
    pub conn_id: u32,
    /// The connection's sequence number while it is established
    /// ([`conns`]); taken when it ends.
    pub established: Option<u64>,
    /// A graceful DISCONNECT waits for the SQ to drain before the FIN.
    pub close_requested: bool,
    /// Back in IDLE after a connection: the engine dropped the WQEs left,
    /// which the provider flushes ([consumer, producer) of each queue), so
    /// vt3d leaves the rings alone until ERROR -> IDLE resets the QP.
    pub spent: bool,
    /// VT3_CMD_PAIR_QP asked for a connection to another QP of the device,
    /// which has not asked back yet.
    pub pair: Option<pairing::PairRequest>,
    /// Adaptive polling of the SQ and of the RQ ([`poll`]).
    pub sq_poll: PollWindow,
    pub rq_poll: PollWindow,
}

impl Qp {
    fn wqe_limits(&self) -> wqe::WqeLimits {
        wqe::WqeLimits {
            max_send_sge: self.max_send_sge,
            max_recv_sge: self.max_recv_sge,
            max_inline: self.max_inline,
            sig_all: self.flags & abi::QpFlag::SigAll as u32 != 0,
        }
    }

    fn poll_window(&self, queue: WorkQueue) -> &PollWindow {
        match queue {
            WorkQueue::Send => &self.sq_poll,
            WorkQueue::Recv => &self.rq_poll,
        }
    }
}

/// Object counts, for `vt3d ctl` and the tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub pd: usize,
    pub mr: usize,
    pub cq: usize,
    pub qp: usize,
    pub srq: usize,
}

/// Guest address the driver told us (VT3_CMD_SET_ADDR).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestAddr {
    pub mac: [u8; 6],
    pub ipv4: [u8; 4],
    pub prefix_len: u8,
}

#[derive(Debug)]
pub struct Rnic {
    limits: Limits,
    pds: Table<Pd>,
    tpt: Tpt,
    cqs: Table<Cq>,
    qps: Table<Qp>,
    srqs: Table<Srq>,
    addr: Option<GuestAddr>,
    /// Events for the driver (type, `vt3_event` or `vt3_event_cm` bytes):
    /// sent after the current command's response, or after engine work.
    events: VecDeque<(EventType, Vec<u8>)>,
    /// Where events go: the MAC that sent the last command.
    driver_mac: Option<[u8; 6]>,
    /// The iWARP engine for the guest's address (from VT3_CMD_SET_ADDR).
    offload: Option<Offload>,
    pbl_used: u64,
    mtu: u32,
    /// TCP user timeout of offloaded connections (`--tcp-timeout`).
    tcp_timeout: vt3_iwarp::toe::Duration,
    /// Octets the uplink's receive queue holds, if known: sizes TCP windows.
    uplink_queue: Option<usize>,
    /// Frames the uplink's send queue takes before it drops: the engine's
    /// egress budget ([`Rnic::set_uplink_room`]).
    uplink_room: usize,
    /// Injections done (`vt3d ctl fault`); kept across guest resets.
    fault_stats: fault::FaultStats,
    /// Faults waiting for the next connection on a port (`fault … --arm`).
    armed: Vec<fault::Armed>,
    /// `fault device-fatal` requested or done; cleared by RESET.
    fatal: Option<fault::Fatal>,
    /// `fault mute-commands`: commands are dropped unanswered until then.
    muted_until: Option<Instant>,
    /// `fault lose-reply`: the next command of this opcode loses its reply.
    lose_reply: Option<abi::Cmd>,
    /// Work queues whose producer index was impossible: their QPs go to
    /// ERROR at the next engine pass.
    ring_faults: Vec<(u32, WorkQueue)>,
    /// Work queues with WQEs left after a fetch spent its budget.
    fetch_pending: Vec<(u32, WorkQueue)>,
    /// SRQs with WQEs left after a fetch spent its budget.
    srq_fetch_pending: Vec<u32>,
    /// QPs of an SRQ that entered ERROR: VT3_QPE_LAST_WQE_REACHED is owed.
    last_wqe_owed: Vec<u32>,
    /// SRQs broken by an impossible producer index (`rnic.srq_ring_errors`).
    srq_ring_errors: u64,
    /// Connection requests refused because the driver's events were not
    /// being taken (`rnic.requests_refused_busy`).
    requests_refused_busy: u64,
    /// QPs sent to ERROR for an impossible producer index
    /// (`rnic.qp_ring_errors`).
    qp_ring_errors: u64,
    /// Work queues polled now, in their windows ([`poll`]).
    polled: PollSet,
    /// The polled set as one pass walks it (kept: no allocation per pass).
    poll_pass: Vec<PolledQueue>,
    /// Doorbell commands (`rnic.doorbells`), looks at polled queues
    /// (`rnic.poll_looks`) and those that found WQEs (`rnic.poll_finds`).
    doorbells: u64,
    poll_looks: u64,
    poll_finds: u64,
    /// Connected QPs whose work makes no progress (`rnic.stalls`).
    watchdog: watchdog::Watchdog,
    /// Connection order and recent ends (`vt3d ctl chaos`).
    conns: conns::ConnLog,
}

/// Driver events held at most before new connection requests are refused
/// (as a full backlog refuses them): every other event is bounded by the
/// objects the guest created, but a peer could open connections without
/// end while the guest takes no events.
pub const MAX_PENDING_EVENTS: usize = 4096;

/// Default of `vt3d serve --tcp-timeout`: a connection that hears nothing
/// from its peer this long (retransmissions or keep-alives unanswered,
/// e.g. a blackhole) ends with VT3_QPE_TIMEOUT.
pub const DEFAULT_TCP_TIMEOUT_SECS: u64 = 15;

type CmdResult = Result<Vec<u8>, Status>;

fn reply<T: ByteValued>(value: T) -> CmdResult {
    Ok(value.as_slice().to_vec())
}

fn handle_reply(handle: u32) -> CmdResult {
    reply(RespHandle { handle: handle.into(), reserved: 0.into() })
}

fn le(v: Le32) -> u32 {
    v.to_native()
}

/// Allowed QP state changes requested by the driver (the engine moves
/// IDLE→RTS itself when a connection is established).
fn transition_allowed(from: QpState, to: QpState) -> bool {
    use QpState::{Closing, Error, Idle, Rts, Terminate};
    matches!(
        (from, to),
        (Idle, Idle) | (_, Error) | (Rts, Closing | Terminate) | (Closing, Idle) | (Terminate, Idle) | (Error, Idle)
    )
}

impl Rnic {
    pub fn new(limits: Limits, mtu: u32) -> Self {
        Self {
            pds: Table::new(limits.max_pd),
            tpt: Tpt::new(limits.max_mr),
            cqs: Table::new(limits.max_cq),
            qps: Table::new(limits.max_qp),
            srqs: Table::new(limits.max_srq),
            addr: None,
            events: VecDeque::new(),
            driver_mac: None,
            offload: None,
            pbl_used: 0,
            limits,
            mtu,
            tcp_timeout: vt3_iwarp::toe::Duration::from_secs(DEFAULT_TCP_TIMEOUT_SECS),
            uplink_queue: None,
            uplink_room: usize::MAX,
            fault_stats: fault::FaultStats::default(),
            armed: Vec::new(),
            fatal: None,
            muted_until: None,
            lose_reply: None,
            ring_faults: Vec::new(),
            fetch_pending: Vec::new(),
            srq_fetch_pending: Vec::new(),
            last_wqe_owed: Vec::new(),
            srq_ring_errors: 0,
            requests_refused_busy: 0,
            qp_ring_errors: 0,
            polled: PollSet::default(),
            poll_pass: Vec::new(),
            doorbells: 0,
            poll_looks: 0,
            poll_finds: 0,
            watchdog: watchdog::Watchdog::default(),
            conns: conns::ConnLog::default(),
        }
    }

    pub fn counts(&self) -> Counts {
        Counts { pd: self.pds.len(), mr: self.tpt.len(), cq: self.cqs.len(), qp: self.qps.len(), srq: self.srqs.len() }
    }

    /// Forgets every resource (the guest went away or asked for a reset).
    pub fn reset(&mut self) {
        self.pds.clear();
        self.tpt.clear();
        self.cqs.clear();
        self.qps.clear();
        self.srqs.clear();
        self.addr = None;
        self.events.clear();
        self.driver_mac = None;
        self.offload = None;
        self.pbl_used = 0;
        self.fatal = None;
        self.ring_faults.clear();
        self.fetch_pending.clear();
        self.srq_fetch_pending.clear();
        self.last_wqe_owed.clear();
        self.polled.clear();
    }

    /// Counters of the ring handling, for `vt3d ctl stats` (`rnic.NAME`).
    pub fn ring_stats(&self) -> [(&'static str, u64); 9] {
        [
            ("qp_ring_errors", self.qp_ring_errors),
            ("requests_refused_busy", self.requests_refused_busy),
            ("srq_ring_errors", self.srq_ring_errors),
            ("doorbells", self.doorbells),
            ("poll_looks", self.poll_looks),
            ("poll_finds", self.poll_finds),
            ("polled_queues", self.polled.len() as u64),
            ("poll_pauses", self.polled.pauses()),
            ("stalls", self.watchdog.stalls()),
        ]
    }

    /// The progress watchdog's look, when one is due: each connected QP's
    /// progress; a stall is logged once with the QP's whole state.
    pub fn watch_progress<M: GuestMemory>(&mut self, mem: &M, now: Instant) {
        if !self.watchdog.due(now) {
            return;
        }
        let Some(engine) = self.offload.as_ref().map(Offload::engine) else { return };
        let mut looked = Vec::new();
        for (qpn, qp) in self.qps.iter() {
            let Some(info) = engine.qp_info(qpn).filter(|i| i.state == vt3_iwarp::engine::QpState::Rts) else {
                continue;
            };
            let sq_prod = memory::StatusWord::at(qp.status_addr, std::mem::offset_of!(abi::QpStatus, sq_prod))
                .load(mem, Ordering::Acquire)
                .unwrap_or(qp.sq_work.fetched);
            let tcb = engine.tcb(qpn);
            looked.push((
                qpn,
                watchdog::QpProgress {
                    sq_prod,
                    sq_fetched: qp.sq_work.fetched,
                    sq_consumed: qp.sq_work.consumed,
                    rq_fetched: qp.rq_work.fetched,
                    rq_consumed: qp.rq_work.consumed,
                    sq_outstanding: info.sq_outstanding,
                    reads_outstanding: info.reads_outstanding,
                    tcp: tcb.as_ref().map(watchdog::TcpProgress::of),
                },
            ));
        }
        let progress: std::collections::BTreeMap<u32, watchdog::QpProgress> = looked.iter().copied().collect();
        for stall in self.watchdog.look(now, looked) {
            // What decides who moves next: the IDLE flags the guest reads
            // before it rings, and vt3d's own polling of the queues.
            let qp = self.qps.get(stall.qpn);
            let flags = qp.and_then(|qp| {
                memory::StatusWord::at(qp.status_addr, std::mem::offset_of!(abi::QpStatus, flags))
                    .load(mem, Ordering::Acquire)
            });
            let polled: Vec<_> =
                self.polled.queues().iter().filter(|q| matches!(q, PolledQueue::Qp(n, _) if *n == stall.qpn)).collect();
            log::warn!(
                "stall: QP {} has waited {} ms for {}, nothing moved: {:?}; engine {:?}; TCB {:?}; \
                 status flags {:?}; polled {:?}; sq window {:?}; rq window {:?}; doorbells {}",
                stall.qpn,
                stall.for_ms,
                stall.waiting_for,
                progress.get(&stall.qpn),
                engine.qp_info(stall.qpn),
                engine.tcb(stall.qpn),
                flags.map(|f| format!("{f:#x}")),
                polled,
                qp.map(|qp| qp.sq_poll),
                qp.map(|qp| qp.rq_poll),
                self.doorbells,
            );
        }
    }

    /// The engine, once the guest's address is known.
    pub fn offload(&self) -> Option<&Offload> {
        self.offload.as_ref()
    }

    /// The iWARP engine's counters (zero before the guest's address).
    pub fn engine_stats(&self) -> vt3_iwarp::engine::EngineStats {
        self.offload.as_ref().map(|o| o.engine().stats()).unwrap_or_default()
    }

    /// What the TOE's fault injection did (dropped, delayed, split).
    pub fn toe_fault_counters(&self) -> vt3_iwarp::toe::FaultCounters {
        self.offload.as_ref().map(|o| o.engine().toe().fault_counters()).unwrap_or_default()
    }

    /// Each TCB of the TOE (`vt3d ctl tcb`).
    pub fn for_each_tcb(&self, f: &mut dyn FnMut(&vt3_iwarp::toe::TcbInfo)) {
        if let Some(offload) = &self.offload {
            offload.engine().for_each_tcb(f);
        }
    }

    /// The engine's view of QP `qpn` (connection, MPA, counters).
    pub fn qp_info(&self, qpn: u32) -> Option<vt3_iwarp::engine::QpInfo> {
        self.offload.as_ref().and_then(|o| o.engine().qp_info(qpn))
    }

    fn push_event<T: ByteValued>(&mut self, event: EventType, body: &T) {
        self.events.push_back((event, body.as_slice().to_vec()));
    }

    /// Events waiting for the driver.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    /// Takes up to `max` events for the driver, oldest first; the rest
    /// wait (the guest has no room for them yet).
    pub fn take_events(&mut self, max: usize) -> std::collections::vec_deque::Drain<'_, (EventType, Vec<u8>)> {
        let n = max.min(self.events.len());
        self.events.drain(..n)
    }

    /// Forgets the events (no driver session to send them to).
    pub fn drop_events(&mut self) {
        self.events.clear();
    }

    /// Queues a raw event, as the engine would (tests).
    #[cfg(test)]
    pub(crate) fn queue_event(&mut self, event: EventType, body: Vec<u8>) {
        self.events.push_back((event, body));
    }

    /// The MAC of the driver that sent the last command: where events go.
    pub fn driver_mac(&self) -> Option<[u8; 6]> {
        self.driver_mac
    }

    pub fn set_driver_mac(&mut self, mac: [u8; 6]) {
        self.driver_mac = Some(mac);
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    pub fn qps(&self) -> &Table<Qp> {
        &self.qps
    }

    pub fn cqs(&self) -> &Table<Cq> {
        &self.cqs
    }

    pub fn tpt(&self) -> &Tpt {
        &self.tpt
    }

    pub fn device_attr(&self) -> DeviceAttr {
        let l = &self.limits;
        DeviceAttr {
            fw_ver: (1u64 << 32).into(),
            max_mr_size: l.max_mr_size.into(),
            page_size_cap: VT3_PAGE_SIZE.into(),
            vendor_id: abi::VT3_VENDOR_ID.into(),
            vendor_part_id: abi::VT3_VENDOR_PART_ID.into(),
            hw_ver: 3.into(),
            max_qp: l.max_qp.into(),
            max_qp_wr: l.max_qp_wr.into(),
            max_sge: l.max_sge.into(),
            max_sge_rd: l.max_sge_rd.into(),
            max_cq: l.max_cq.into(),
            max_cqe: l.max_cqe.into(),
            max_mr: l.max_mr.into(),
            max_pd: l.max_pd.into(),
            max_qp_rd_atom: l.max_ord.into(),
            max_qp_init_rd_atom: l.max_ird.into(),
            max_inline: l.max_inline.into(),
            max_pbl_pages: l.max_pbl_pages.into(),
            max_fast_reg_pages: l.max_fast_reg_pages.into(),
            max_srq: l.max_srq.into(),
            max_srq_wr: l.max_srq_wr.into(),
            max_srq_sge: l.max_srq_sge.into(),
            max_mw: l.max_mr.into(),
        }
    }

    fn pd_users(&mut self, pdn: u32, add: bool) {
        if let Some(pd) = self.pds.get_mut(pdn) {
            if add {
                pd.users += 1;
            } else {
                pd.users -= 1;
            }
        }
    }

    fn release_pages(&mut self, backing: &Backing) {
        if let Backing::Pages { pages, .. } = backing {
            self.pbl_used -= pages.len() as u64;
        }
    }

    /// Reads and validates a page list: every entry a page-aligned guest
    /// page; the total counted against the PBL budget.
    fn read_pbl<M: GuestMemory>(&mut self, mem: &M, pbl_addr: u64, npages: u32) -> Result<Vec<u64>, Status> {
        if npages == 0 || npages > self.limits.max_pbl_pages {
            return Err(Status::Invalid);
        }
        if self.pbl_used + u64::from(npages) > self.limits.pbl_budget {
            return Err(Status::NoResource);
        }
        let bytes = usize::try_from(npages).map_err(|_| Status::Invalid)? * 8;
        let addr = GuestAddress(pbl_addr);
        if !mem.check_range(addr, bytes, Permissions::Read) {
            return Err(Status::BadAddress);
        }
        let mut raw = vec![0u8; bytes];
        mem.read_slice(&mut raw, addr).map_err(|_| Status::BadAddress)?;
        let pages: Vec<u64> =
            raw.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default())).collect();
        for &page in &pages {
            if page % VT3_PAGE_SIZE != 0 {
                return Err(Status::Invalid);
            }
            if !mem.check_range(GuestAddress(page), PAGE_BYTES, Permissions::ReadWrite) {
                return Err(Status::BadAddress);
            }
        }
        self.pbl_used += u64::from(npages);
        Ok(pages)
    }

    fn reg_mr<M: GuestMemory>(&mut self, mem: &M, a: &CmdRegMr) -> CmdResult {
        let pdn = le(a.pdn);
        let access = le(a.access);
        let length = a.length.to_native();
        let iova = a.iova.to_native();
        if self.pds.get(pdn).is_none() {
            return Err(Status::NotFound);
        }
        if access & !ALL_ACCESS != 0 || length == 0 || iova.checked_add(length).is_none() {
            return Err(Status::Invalid);
        }
        const DMA: u32 = abi::MrFlag::Dma as u32;
        const UNSAFE_GLOBAL_RKEY: u32 = abi::MrFlag::UnsafeGlobalRkey as u32;
        // Remote rights over all of guest memory only when a kernel ULP
        // asked for an unsafe global rkey, as the kernel gates them
        // (IB_PD_UNSAFE_GLOBAL_RKEY).
        const REMOTE: u32 =
            abi::Access::RemoteRead as u32 | abi::Access::RemoteWrite as u32 | abi::Access::MwBind as u32;
        let backing = match le(a.flags) {
            DMA if access & REMOTE == 0 => Backing::Dma,
            f if f == DMA | UNSAFE_GLOBAL_RKEY => Backing::Dma,
            0 => {
                if length > self.limits.max_mr_size {
                    return Err(Status::Invalid);
                }
                let page_offset = u64::from(le(a.page_offset));
                let npages = le(a.npages);
                if page_offset >= VT3_PAGE_SIZE || u64::from(npages) * VT3_PAGE_SIZE < page_offset + length {
                    return Err(Status::Invalid);
                }
                let pages = self.read_pbl(mem, a.pbl_addr.to_native(), npages)?;
                Backing::Pages { pages, page_offset }
            }
            _ => return Err(Status::Invalid),
        };
        let mr = Mr { pdn, access, iova, length, backing, valid: true, fast_reg: None, window: None };
        let release = mr.backing.clone();
        match self.tpt.insert(mr) {
            Some(stag) => {
                self.pd_users(pdn, true);
                handle_reply(stag)
            }
            None => {
                self.release_pages(&release);
                Err(Status::NoResource)
            }
        }
    }

    /// An empty fast-reg MR: its max_pages page-list entries are counted
    /// against the PBL budget now, so a REG_MR never needs more.
    fn alloc_mr(&mut self, a: &CmdAllocMr) -> CmdResult {
        let (pdn, max_pages) = (le(a.pdn), le(a.max_pages));
        if self.pds.get(pdn).is_none() {
            return Err(Status::NotFound);
        }
        if max_pages == 0 || max_pages > self.limits.max_fast_reg_pages {
            return Err(Status::Invalid);
        }
        if self.pbl_used + u64::from(max_pages) > self.limits.pbl_budget {
            return Err(Status::NoResource);
        }
        let stag = self.tpt.insert(Mr::fast_reg(pdn, max_pages)).ok_or(Status::NoResource)?;
        self.pbl_used += u64::from(max_pages);
        self.pd_users(pdn, true);
        handle_reply(stag)
    }

    /// Validates a ring: power-of-two depth within `max`, enough pages.
    fn read_ring<M: GuestMemory>(
        &mut self,
        mem: &M,
        depth: u32,
        max_depth: u32,
        entry_size: u64,
        pbl_addr: u64,
        npages: u32,
    ) -> Result<Ring, Status> {
        if depth < 2 || !depth.is_power_of_two() || depth > max_depth {
            return Err(Status::Invalid);
        }
        if u64::from(npages) * VT3_PAGE_SIZE < u64::from(depth) * entry_size {
            return Err(Status::Invalid);
        }
        let pages = self.read_pbl(mem, pbl_addr, npages)?;
        Ok(Ring { depth, entry_size, pages })
    }

    fn status_page<M: GuestMemory>(mem: &M, addr: u64, len: usize) -> Result<GuestAddress, Status> {
        let addr = GuestAddress(addr);
        if !addr.0.is_multiple_of(8) || !mem.check_range(addr, len, Permissions::ReadWrite) {
            return Err(Status::BadAddress);
        }
        Ok(addr)
    }

    fn create_cq<M: GuestMemory>(&mut self, mem: &M, a: &CmdCreateCq) -> CmdResult {
        let status_addr = Self::status_page(mem, a.status_addr.to_native(), std::mem::size_of::<abi::CqStatus>())?;
        let max_depth = (self.limits.max_cqe + 1).next_power_of_two();
        let ring = self.read_ring(
            mem,
            le(a.depth),
            max_depth,
            std::mem::size_of::<abi::Cqe>() as u64,
            a.ring_pbl_addr.to_native(),
            le(a.ring_npages),
        )?;
        let npages = ring.pages.len() as u64;
        // Indices are free running: start where the page says.
        let prod = StatusWord::at(status_addr, std::mem::offset_of!(abi::CqStatus, prod))
            .load(mem, Ordering::Acquire)
            .unwrap_or(0);
        let cq = Cq { ring, status_addr, arm_flags: 0, qp_users: 0, prod, overflowed: false };
        match self.cqs.insert(cq) {
            Some(cqn) => handle_reply(cqn),
            None => {
                self.pbl_used -= npages;
                Err(Status::NoResource)
            }
        }
    }

    fn create_qp<M: GuestMemory>(&mut self, mem: &M, a: &CmdCreateQp) -> CmdResult {
        let pdn = le(a.pdn);
        let (send_cqn, recv_cqn) = (le(a.send_cqn), le(a.recv_cqn));
        if self.pds.get(pdn).is_none() || self.cqs.get(send_cqn).is_none() || self.cqs.get(recv_cqn).is_none() {
            return Err(Status::NotFound);
        }
        let l = self.limits;
        let (max_send_sge, max_recv_sge, max_inline) = (le(a.max_send_sge), le(a.max_recv_sge), le(a.max_inline));
        let shared = srq::check_qp_srq(self, a)?;
        let flags = le(a.flags);
        let known_flags = abi::QpFlag::Kernel as u32 | abi::QpFlag::SigAll as u32;
        if max_send_sge > l.max_sge
            || max_recv_sge > l.max_sge
            || max_inline > l.max_inline
            || flags & !known_flags != 0
        {
            return Err(Status::Invalid);
        }
        let status_addr = Self::status_page(mem, a.status_addr.to_native(), std::mem::size_of::<abi::QpStatus>())?;
        let max_depth = (l.max_qp_wr + 1).next_power_of_two();
        let wqe = abi::VT3_WQE_SIZE as u64;
        let sq = self.read_ring(mem, le(a.sq_depth), max_depth, wqe, a.sq_pbl_addr.to_native(), le(a.sq_npages))?;
        let (srqn, rq) = match shared {
            Some((srqn, rq)) => (srqn, rq),
            None => {
                match self.read_ring(mem, le(a.rq_depth), max_depth, wqe, a.rq_pbl_addr.to_native(), le(a.rq_npages)) {
                    Ok(rq) => (0, rq),
                    Err(e) => {
                        self.pbl_used -= sq.pages.len() as u64;
                        return Err(e);
                    }
                }
            }
        };
        let npages = (sq.pages.len() + rq.pages.len()) as u64;
        // Indices are free running: start where the page says.
        let progress = |field: usize| {
            let consumed = StatusWord::at(status_addr, field).load(mem, Ordering::Acquire).unwrap_or(0);
            WorkProgress { fetched: consumed, consumed }
        };
        let qp = Qp {
            pdn,
            send_cqn,
            recv_cqn,
            sq,
            rq,
            status_addr,
            state: QpState::Idle,
            ird: l.max_ird,
            ord: l.max_ord,
            max_send_sge,
            max_recv_sge,
            max_inline,
            flags,
            sq_work: progress(std::mem::offset_of!(abi::QpStatus, sq_cons)),
            rq_work: progress(std::mem::offset_of!(abi::QpStatus, rq_cons)),
            srqn,
            connecting: false,
            tuple: None,
            conn_id: 0,
            established: None,
            close_requested: false,
            spent: false,
            pair: None,
            sq_poll: PollWindow::default(),
            rq_poll: PollWindow::default(),
        };
        let Some(qpn) = self.qps.insert(qp) else {
            self.pbl_used -= npages;
            return Err(Status::NoResource);
        };
        if let Err(e) = self.attach_qp(qpn) {
            log::warn!("QP {qpn}: the engine refused it: {e}");
            self.qps.remove(qpn);
            self.pbl_used -= npages;
            return Err(Status::NoResource);
        }
        self.pd_users(pdn, true);
        for cqn in [send_cqn, recv_cqn] {
            if let Some(cq) = self.cqs.get_mut(cqn) {
                cq.qp_users += 1;
            }
        }
        if let Some(srq) = self.srqs.get_mut(srqn) {
            srq.qp_users += 1;
        }
        datapath::publish_state(mem, status_addr, QpState::Idle);
        // vt3d is idle on both queues: the first WQEs need a doorbell.
        let idle = QpStatusFlag::SqIdle as u32 | QpStatusFlag::RqIdle as u32;
        StatusWord::at(status_addr, std::mem::offset_of!(abi::QpStatus, flags)).fetch_or(mem, idle);
        handle_reply(qpn)
    }

    fn modify_qp<M: GuestMemory>(&mut self, mem: &M, now: Instant, a: &CmdModifyQp) -> CmdResult {
        let l = self.limits;
        let mask = le(a.mask);
        let known = abi::ModifyMask::State as u32 | abi::ModifyMask::Ird as u32 | abi::ModifyMask::Ord as u32;
        if mask & !known != 0 {
            return Err(Status::Invalid);
        }
        let qpn = le(a.qpn);
        let qp = self.qps.get_mut(qpn).ok_or(Status::NotFound)?;
        let new_state = if mask & abi::ModifyMask::State as u32 != 0 {
            let to = QpState::try_from(le(a.state)).map_err(|_| Status::Invalid)?;
            if !transition_allowed(qp.state, to) {
                return Err(Status::State);
            }
            // A pairing request holds while the QP stays as it was.
            qp.pair = None;
            Some(to)
        } else {
            None
        };
        let ird = (mask & abi::ModifyMask::Ird as u32 != 0).then(|| le(a.ird));
        let ord = (mask & abi::ModifyMask::Ord as u32 != 0).then(|| le(a.ord));
        if ird.is_some_and(|v| v > l.max_ird) || ord.is_some_and(|v| v > l.max_ord) {
            return Err(Status::Invalid);
        }
        let (ird, ord) = (ird.unwrap_or(qp.ird), ord.unwrap_or(qp.ord));
        let Some(offload) = self.offload.as_mut() else {
            (qp.ird, qp.ord) = (ird, ord);
            if let Some(to) = new_state {
                self.set_qp_state(mem, qpn, to);
                self.report_last_wqe();
            }
            return Ok(Vec::new());
        };
        // The engine has the last word: IRD/ORD are negotiated, so they
        // change only in IDLE, and it knows which states a connection allows.
        if (ird, ord) != (qp.ird, qp.ord) {
            offload.set_ird_ord(qpn, ird, ord)?;
            (qp.ird, qp.ord) = (ird, ord);
        }
        if let Some(to) = new_state {
            offload.engine.modify_qp(now, qpn, offload::engine_state(to)).map_err(offload::status)?;
        }
        // The state change (and what it retired) reaches the status page
        // before the response.
        self.pump(now, mem);
        Ok(Vec::new())
    }
}
