//! Helpers for engine tests: memory regions with scattered pages, data
//! checks, WR builders.
#![allow(dead_code, clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use vt3_iwarp::engine::{Access, RecvWr, SendOpcode, SendWr, Sge, SgeList};
use vt3_iwarp::mock::PAGE_SIZE;
use vt3_iwarp::sim::{Node, Rng};
use vt3_iwarp::tpt::Tpt;

pub const PD: u32 = 7;

/// A registered buffer: `len` octets at `iova` through `stag`.
#[derive(Debug, Clone, Copy)]
pub struct Buf {
    pub stag: u32,
    pub iova: u64,
    pub len: u64,
}

impl Buf {
    pub fn sge(&self, offset: u64, len: u64) -> Sge {
        Sge { addr: self.iova + offset, length: len as u32, lkey: self.stag }
    }
}

/// Allocates guest pages from a bump pointer per node.
pub struct Arena {
    next: u64,
    end: u64,
}

impl Arena {
    pub fn new(start: u64, end: u64) -> Self {
        Arena { next: start, end }
    }

    /// Registers `len` octets with `access`; with `scatter`, the pages are
    /// shuffled so the region is not guest-physically contiguous, and it
    /// starts `offset` (< 4096) into its first page.
    pub fn register(
        &mut self,
        node: &mut Node,
        access: Access,
        len: u64,
        scatter: Option<&mut Rng>,
        offset: u64,
    ) -> Buf {
        let pages = (offset + len).div_ceil(PAGE_SIZE).max(1);
        let first = self.next;
        self.next += pages * PAGE_SIZE;
        assert!(self.next <= self.end, "arena exhausted");
        let mut list: Vec<u64> = (0..pages).map(|i| first + i * PAGE_SIZE).collect();
        if let Some(rng) = scatter {
            for i in (1..list.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                list.swap(i, j);
            }
        }
        let iova = 0x7f00_0000_0000 + first + offset;
        let stag = node.regions.register_pages(PD, access, iova, len, list, offset);
        Buf { stag, iova, len }
    }
}

pub fn read_buf(node: &Node, buf: &Buf, offset: u64, len: u64) -> Vec<u8> {
    read_mr(&node.regions, &node.memory, buf.stag, buf.iova + offset, len)
}

pub fn read_mr(regions: &Tpt, memory: &vt3_iwarp::mock::MockMemory, stag: u32, iova: u64, len: u64) -> Vec<u8> {
    let mr = regions.get(stag).unwrap();
    let mut out = Vec::with_capacity(len as usize);
    for (addr, n) in mr.ranges(iova, len) {
        out.extend_from_slice(memory.slice(addr, n as usize));
    }
    out
}

pub fn fill_buf(node: &mut Node, buf: &Buf, offset: u64, data: &[u8]) {
    let mr = node.regions.get(buf.stag).unwrap().clone();
    let mut at = 0usize;
    for (addr, n) in mr.ranges(buf.iova + offset, data.len() as u64) {
        node.memory.fill(addr, &data[at..at + n as usize]);
        at += n as usize;
    }
}

pub fn random_bytes(rng: &mut Rng, len: usize) -> Vec<u8> {
    let mut data = vec![0u8; len];
    rng.fill(&mut data);
    data
}

pub fn send_wr(wr_id: u64, opcode: SendOpcode, sges: &[Sge]) -> SendWr {
    let mut wr = SendWr::new(wr_id, opcode);
    wr.sges = SgeList::new(sges).unwrap();
    wr
}

pub fn rdma_wr(wr_id: u64, opcode: SendOpcode, local: &[Sge], remote: &Buf, offset: u64) -> SendWr {
    let mut wr = send_wr(wr_id, opcode, local);
    wr.remote_stag = remote.stag;
    wr.remote_addr = remote.iova + offset;
    wr
}

pub fn recv_wr(wr_id: u64, sges: &[Sge]) -> RecvWr {
    RecvWr { wr_id, sges: SgeList::new(sges).unwrap() }
}
