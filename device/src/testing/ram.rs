//! The synthetic guest's memory and the rings in it, as vt3.ko lays them
//! out and libvt3 writes and reads them: page lists, status pages, SQ, RQ
//! and SRQ rings of WQEs, CQ rings of CQEs, and registered buffers.

use std::ops::Range;
use std::sync::atomic::{fence, Ordering};

use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};

use crate::abi::{
    CmdCreateCq, CmdCreateQp, CmdCreateSrq, CmdRegMr, CqStatus, Cqe, DoorbellQueue, QpStatus, QpStatusFlag, RqWqe, Sge,
    SqWqe, SrqStatus, SrqStatusFlag, WqeFlag, WrOpcode, VT3_PAGE_SIZE, VT3_WQE_SIZE,
};

pub const PAGE: u64 = VT3_PAGE_SIZE;
pub const WQE_LEN: u64 = VT3_WQE_SIZE as u64;
pub const CQE_LEN: u64 = std::mem::size_of::<Cqe>() as u64;
/// A status page is 64 octets (vt3_hw.h).
const STATUS_LEN: u64 = 64;
/// Where a buffer's IOVA starts, as a process's address would.
const IOVA_BASE: u64 = 0x7f00_0000_0000;

/// Which part of guest RAM holds what. With `wrap`, an area that runs out
/// starts over (the fuzz targets' small RAM); without, running out is the
/// caller's bug and panics.
#[derive(Debug, Clone)]
pub struct Layout {
    pub size: u64,
    pub pbl: Range<u64>,
    pub status: Range<u64>,
    pub pages: Range<u64>,
    pub wrap: bool,
}

/// A CQ as the provider sees it.
#[derive(Debug, Clone, Copy)]
pub struct CqRing {
    pub cqn: u32,
    pub ring: u64,
    pub status: u64,
    pub depth: u32,
    pub cons: u32,
}

/// A QP as the provider sees it (`rq` is 0 when an SRQ feeds it).
#[derive(Debug, Clone, Copy)]
pub struct QpRings {
    pub qpn: u32,
    pub status: u64,
    pub sq: u64,
    pub rq: u64,
    pub depth: u32,
    pub sq_prod: u32,
    pub rq_prod: u32,
    pub scq: CqRing,
    pub rcq: CqRing,
}

impl QpRings {
    /// WQEs posted to the SQ and not yet retired by the device.
    pub fn sq_outstanding(&self, ram: &GuestRam) -> u32 {
        self.sq_prod.wrapping_sub(ram.qp_status(self).sq_cons.to_native())
    }
}

/// An SRQ as the provider sees it.
#[derive(Debug, Clone, Copy)]
pub struct SrqRing {
    pub srqn: u32,
    pub ring: u64,
    pub status: u64,
    pub depth: u32,
    pub prod: u32,
}

/// A registered buffer: its STag, its IOVA and where it lies in guest RAM.
#[derive(Debug, Clone, Copy)]
pub struct Mr {
    pub stag: u32,
    pub iova: u64,
    pub guest: u64,
}

/// The object sizes a QP is created with.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    pub depth: u32,
    pub max_sge: u32,
    pub max_inline: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self { depth: 16, max_sge: 4, max_inline: 64 }
    }
}

/// Guest RAM and the allocator vt3.ko and libvt3 would be.
#[derive(Debug)]
pub struct GuestRam {
    pub mem: GuestMemoryMmap,
    layout: Layout,
    next_pbl: u64,
    next_page: u64,
    next_status: u64,
}

/// Whole pages for `len` octets (at least one).
fn npages(len: u64) -> u32 {
    u32::try_from(len.div_ceil(PAGE).max(1)).unwrap_or(u32::MAX)
}

impl GuestRam {
    /// `mem` laid out as `layout` says.
    pub fn new(mem: GuestMemoryMmap, layout: Layout) -> Self {
        let (next_pbl, next_page, next_status) = (layout.pbl.start, layout.pages.start, layout.status.start);
        Self { mem, layout, next_pbl, next_page, next_status }
    }

    /// Anonymous RAM of `layout.size` octets.
    pub fn anonymous(layout: Layout) -> Self {
        let size = usize::try_from(layout.size).unwrap_or(usize::MAX);
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)]).expect("guest RAM");
        Self::new(mem, layout)
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The first page not handed out yet.
    pub fn next_page(&self) -> u64 {
        self.next_page
    }

    /// Takes `len` octets of `area` from `*next`, starting over if `wrap`.
    fn take(next: &mut u64, area: &Range<u64>, len: u64, wrap: bool, what: &str) -> u64 {
        if *next + len > area.end {
            assert!(wrap && area.start + len <= area.end, "the guest's {what} area is exhausted");
            *next = area.start;
        }
        let at = *next;
        *next += len;
        at
    }

    /// `len` octets of fresh pages, page aligned, without a page list.
    pub fn alloc(&mut self, len: u64) -> u64 {
        let len = u64::from(npages(len)) * PAGE;
        Self::take(&mut self.next_page, &self.layout.pages, len, self.layout.wrap, "page")
    }

    /// `n` contiguous fresh pages and their page list: (list, first page).
    pub fn pages(&mut self, n: u32) -> (u64, u64) {
        let n = n.max(1);
        let pbl = Self::take(&mut self.next_pbl, &self.layout.pbl, u64::from(n) * 8, self.layout.wrap, "page list");
        let first = self.alloc(u64::from(n) * PAGE);
        for i in 0..u64::from(n) {
            self.mem.write_obj((first + i * PAGE).to_le(), GuestAddress(pbl + i * 8)).expect("page list");
        }
        (pbl, first)
    }

    /// A fresh status page.
    pub fn status_page(&mut self) -> u64 {
        Self::take(&mut self.next_status, &self.layout.status, STATUS_LEN, self.layout.wrap, "status")
    }

    /// The page list at `pbl` as far as it is readable (at most 64 pages).
    pub fn read_pbl(&self, pbl: u64, npages: u32) -> Vec<u64> {
        (0..u64::from(npages.min(64)))
            .map_while(|i| self.mem.read_obj::<u64>(GuestAddress(pbl.wrapping_add(i * 8))).ok())
            .map(u64::from_le)
            .collect()
    }

    pub fn write_bytes(&self, addr: u64, data: &[u8]) {
        self.mem.write_slice(data, GuestAddress(addr)).expect("guest RAM");
    }

    pub fn read_bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).expect("guest RAM");
        v
    }

    // -- objects: the arguments of their create commands, and their rings --

    /// CREATE_CQ's arguments for a ring of `depth` CQEs; the CQ lacks its
    /// number until the device answers.
    pub fn new_cq(&mut self, depth: u32) -> (CmdCreateCq, CqRing) {
        let n = npages(u64::from(depth) * CQE_LEN);
        let (pbl, ring) = self.pages(n);
        let status = self.status_page();
        let args = CmdCreateCq {
            ring_pbl_addr: pbl.into(),
            status_addr: status.into(),
            ring_npages: n.into(),
            depth: depth.into(),
        };
        (args, CqRing { cqn: 0, ring, status, depth, cons: 0 })
    }

    /// CREATE_QP's arguments for a QP with its own SQ and RQ, or (with
    /// `srqn`) an SQ only, its receives from that SRQ.
    pub fn new_qp(&mut self, pdn: u32, scq: CqRing, rcq: CqRing, caps: QpCaps, srqn: u32) -> (CmdCreateQp, QpRings) {
        let n = npages(u64::from(caps.depth) * WQE_LEN);
        let (sq_pbl, sq) = self.pages(n);
        let (rq_pbl, rq, rq_pages, rq_depth, rq_sge) = if srqn == 0 {
            let (pbl, rq) = self.pages(n);
            (pbl, rq, n, caps.depth, caps.max_sge)
        } else {
            (0, 0, 0, 0, 0)
        };
        let status = self.status_page();
        let args = CmdCreateQp {
            sq_pbl_addr: sq_pbl.into(),
            rq_pbl_addr: rq_pbl.into(),
            status_addr: status.into(),
            sq_npages: n.into(),
            rq_npages: rq_pages.into(),
            sq_depth: caps.depth.into(),
            rq_depth: rq_depth.into(),
            pdn: pdn.into(),
            send_cqn: scq.cqn.into(),
            recv_cqn: rcq.cqn.into(),
            max_send_sge: caps.max_sge.into(),
            max_recv_sge: rq_sge.into(),
            max_inline: caps.max_inline.into(),
            flags: 0.into(),
            srqn: srqn.into(),
        };
        (args, QpRings { qpn: 0, status, sq, rq, depth: caps.depth, sq_prod: 0, rq_prod: 0, scq, rcq })
    }

    /// CREATE_SRQ's arguments for a ring of `depth` receives.
    pub fn new_srq(&mut self, pdn: u32, depth: u32, limit: u32) -> (CmdCreateSrq, SrqRing) {
        let n = npages(u64::from(depth) * WQE_LEN);
        let (pbl, ring) = self.pages(n);
        let status = self.status_page();
        let args = CmdCreateSrq {
            ring_pbl_addr: pbl.into(),
            status_addr: status.into(),
            ring_npages: n.into(),
            depth: depth.into(),
            pdn: pdn.into(),
            max_sge: 4.into(),
            limit: limit.into(),
            reserved: 0.into(),
        };
        (args, SrqRing { srqn: 0, ring, status, depth, prod: 0 })
    }

    /// REG_MR's arguments for a fresh buffer of `len` octets.
    pub fn new_mr(&mut self, pdn: u32, len: u64, access: u32) -> (CmdRegMr, Mr) {
        let n = npages(len);
        let (pbl, guest) = self.pages(n);
        let iova = IOVA_BASE + guest;
        let args = CmdRegMr {
            iova: iova.into(),
            length: len.into(),
            pbl_addr: pbl.into(),
            npages: n.into(),
            pdn: pdn.into(),
            access: access.into(),
            flags: 0.into(),
            page_offset: 0.into(),
            reserved: 0.into(),
        };
        (args, Mr { stag: 0, iova, guest })
    }

    pub fn qp_status(&self, qp: &QpRings) -> QpStatus {
        self.mem.read_obj(GuestAddress(qp.status)).expect("QP status page")
    }

    pub fn cq_status(&self, cq: &CqRing) -> CqStatus {
        self.mem.read_obj(GuestAddress(cq.status)).expect("CQ status page")
    }

    pub fn srq_status(&self, srq: &SrqRing) -> SrqStatus {
        self.mem.read_obj(GuestAddress(srq.status)).expect("SRQ status page")
    }

    /// Writes `wqe` into the SQ's next slot (not yet published).
    pub fn write_send(&self, qp: &mut QpRings, wqe: &SqWqe) {
        let slot = u64::from(qp.sq_prod & (qp.depth - 1));
        self.mem.write_obj(*wqe, GuestAddress(qp.sq + slot * WQE_LEN)).expect("SQ slot");
        qp.sq_prod = qp.sq_prod.wrapping_add(1);
    }

    /// Writes `wqe` into the RQ's next slot (not yet published).
    pub fn write_recv(&self, qp: &mut QpRings, wqe: &RqWqe) {
        let slot = u64::from(qp.rq_prod & (qp.depth - 1));
        self.mem.write_obj(*wqe, GuestAddress(qp.rq + slot * WQE_LEN)).expect("RQ slot");
        qp.rq_prod = qp.rq_prod.wrapping_add(1);
    }

    /// Writes `wqe` into the SRQ's next slot (not yet published).
    pub fn write_srq(&self, srq: &mut SrqRing, wqe: &RqWqe) {
        let slot = u64::from(srq.prod & (srq.depth - 1));
        self.mem.write_obj(*wqe, GuestAddress(srq.ring + slot * WQE_LEN)).expect("SRQ slot");
        srq.prod = srq.prod.wrapping_add(1);
    }

    /// libvt3's doorbell rule (docs/architecture.md §3.2): publish the
    /// producer index (release), a full barrier, and a doorbell is due only
    /// if vt3d said it is idle on that queue. Returns whether it is.
    pub fn publish(&self, qp: &QpRings, queue: DoorbellQueue) -> bool {
        let (field, prod, idle) = match queue {
            DoorbellQueue::Sq => (std::mem::offset_of!(QpStatus, sq_prod), qp.sq_prod, QpStatusFlag::SqIdle),
            DoorbellQueue::Rq => (std::mem::offset_of!(QpStatus, rq_prod), qp.rq_prod, QpStatusFlag::RqIdle),
            DoorbellQueue::Srq => unreachable!("an SRQ is published with publish_srq"),
        };
        self.mem
            .store(prod.to_le(), GuestAddress(qp.status + field as u64), Ordering::Release)
            .expect("producer index");
        fence(Ordering::SeqCst);
        self.qp_status(qp).flags.to_native() & idle as u32 != 0
    }

    /// [`GuestRam::publish`] for an SRQ.
    pub fn publish_srq(&self, srq: &SrqRing) -> bool {
        self.mem.store(srq.prod.to_le(), GuestAddress(srq.status), Ordering::Release).expect("producer index");
        fence(Ordering::SeqCst);
        self.srq_status(srq).flags.to_native() & SrqStatusFlag::Idle as u32 != 0
    }

    /// Reaps every CQE the device wrote into `out` (libvt3's poll_cq);
    /// returns how many.
    pub fn reap(&self, cq: &mut CqRing, out: &mut Vec<Cqe>) -> usize {
        let prod = self.mem.load::<u32>(GuestAddress(cq.status), Ordering::Acquire).expect("CQ producer index");
        let prod = u32::from_le(prod);
        let mut n = 0;
        while cq.cons != prod {
            let slot = u64::from(cq.cons & (cq.depth - 1));
            out.push(self.mem.read_obj(GuestAddress(cq.ring + slot * CQE_LEN)).expect("CQE"));
            cq.cons = cq.cons.wrapping_add(1);
            n += 1;
        }
        let cons_at = GuestAddress(cq.status + std::mem::offset_of!(CqStatus, cons) as u64);
        self.mem.store(cq.cons.to_le(), cons_at, Ordering::Release).expect("CQ consumer index");
        n
    }
}

/// A receive WQE of one SGE.
pub fn recv_wqe(wr_id: u64, mr: &Mr, offset: u64, len: u32) -> RqWqe {
    let mut wqe = RqWqe { wr_id: wr_id.into(), num_sge: 1, ..Default::default() };
    wqe.sge[0] = Sge { addr: (mr.iova + offset).into(), length: len.into(), lkey: mr.stag.into() };
    wqe
}

/// An SQ WQE with an SGE per (buffer, offset, length); the SGEs share
/// the last 64 octets with `inline_data` (a C union).
pub fn send_wqe(wr_id: u64, opcode: WrOpcode, signaled: bool, sges: &[(Mr, u64, u32)]) -> SqWqe {
    let mut w = SqWqe {
        wr_id: wr_id.into(),
        opcode: opcode as u8,
        flags: if signaled { WqeFlag::Signaled as u8 } else { 0 },
        num_sge: u8::try_from(sges.len()).unwrap_or(u8::MAX),
        ..Default::default()
    };
    let at = std::mem::offset_of!(SqWqe, inline_data);
    let size = std::mem::size_of::<Sge>();
    for (i, (mr, offset, len)) in sges.iter().enumerate() {
        let sge = Sge { addr: (mr.iova + offset).into(), length: (*len).into(), lkey: mr.stag.into() };
        if let Some(dst) = w.as_mut_slice().get_mut(at + i * size..at + (i + 1) * size) {
            dst.copy_from_slice(sge.as_slice());
        }
    }
    w
}

/// A signaled RDMA WRITE or READ between `local` and `remote`.
pub fn rdma_wqe(wr_id: u64, opcode: WrOpcode, local: (Mr, u64, u32), remote: &Mr, remote_offset: u64) -> SqWqe {
    SqWqe {
        remote_addr: (remote.iova + remote_offset).into(),
        remote_stag: remote.stag.into(),
        ..send_wqe(wr_id, opcode, true, &[local])
    }
}
