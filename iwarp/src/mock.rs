//! In-memory guest RAM for tests, fuzzing and benchmarks, behaving like
//! vt3d's (`vm-memory`), and the shortcuts tests take to fill the TPT
//! (the device's own [`Tpt`]).
#![allow(clippy::indexing_slicing)] // test support: indexes it just checked

use crate::engine::{Access, GuestMemory, MemoryError, MwType, Rereg, ReregError};
use crate::tpt::{Backing, Mr, Tpt};

/// Guest RAM: one flat buffer at guest-physical address 0.
#[derive(Clone)]
pub struct MockMemory {
    bytes: Vec<u8>,
    /// Octets written through [`GuestMemory::write`].
    pub written: u64,
}

impl core::fmt::Debug for MockMemory {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MockMemory({} octets)", self.bytes.len())
    }
}

impl MockMemory {
    /// `size` octets filled with a recognisable pattern (so that stray
    /// writes of zeros show).
    pub fn new(size: usize) -> Self {
        let bytes = (0..size).map(|i| i.to_le_bytes()[0] ^ 0xa5).collect();
        MockMemory { bytes, written: 0 }
    }

    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes
    }

    /// The octets at `addr`; empty if out of range.
    pub fn slice(&self, addr: u64, len: usize) -> &[u8] {
        usize::try_from(addr).ok().and_then(|start| self.bytes.get(start..start.checked_add(len)?)).unwrap_or(&[])
    }

    /// Test setup: writes without counting.
    pub fn fill(&mut self, addr: u64, data: &[u8]) {
        if let Some(target) =
            usize::try_from(addr).ok().and_then(|start| self.bytes.get_mut(start..start.checked_add(data.len())?))
        {
            target.copy_from_slice(data);
        }
    }

    /// Ranges `[start, end)` where this memory differs from `before`.
    pub fn changed_ranges(&self, before: &MockMemory) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (index, (a, b)) in self.bytes.iter().zip(&before.bytes).enumerate() {
            if a != b {
                let at = index as u64;
                match ranges.last_mut() {
                    Some(last) if last.1 == at => last.1 = at + 1,
                    _ => ranges.push((at, at + 1)),
                }
            }
        }
        ranges
    }
}

impl GuestMemory for MockMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let source = usize::try_from(addr)
            .ok()
            .and_then(|start| self.bytes.get(start..start.checked_add(buf.len())?))
            .ok_or(MemoryError { addr, len: buf.len() })?;
        buf.copy_from_slice(source);
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        let target = usize::try_from(addr)
            .ok()
            .and_then(|start| self.bytes.get_mut(start..start.checked_add(data.len())?))
            .ok_or(MemoryError { addr, len: data.len() })?;
        target.copy_from_slice(data);
        self.written += data.len() as u64;
        Ok(())
    }
}

/// Page size of page lists (`VT3_PAGE_SIZE`).
pub use crate::engine::PAGE_SIZE;

/// More regions than any test registers.
const MAX_REGIONS: u32 = 1 << 16;

/// The device's TPT, with the shortcuts tests take to fill it (what
/// VT3_CMD_REG_MR, ALLOC_MR, ALLOC_MW and REREG_MR do in vt3d).
impl Tpt {
    /// A TPT as large as any test needs.
    pub fn for_tests() -> Self {
        Tpt::new(MAX_REGIONS)
    }

    /// Registers `mr`; its STag.
    pub fn register(&mut self, mr: Mr) -> u32 {
        self.insert(mr).expect("the test TPT is full")
    }

    /// A region over `pages` (each a 4 KiB guest page), starting
    /// `page_offset` into the first.
    pub fn register_pages(
        &mut self,
        pdn: u32,
        access: Access,
        iova: u64,
        length: u64,
        pages: Vec<u64>,
        page_offset: u64,
    ) -> u32 {
        self.register(Mr {
            pdn,
            access,
            iova,
            length,
            backing: Backing::Pages { pages, page_offset },
            valid: true,
            fast_reg: None,
            window: None,
        })
    }

    /// A region over guest-physically contiguous memory at `guest`.
    pub fn register_contiguous(&mut self, pdn: u32, access: Access, iova: u64, guest: u64, length: u64) -> u32 {
        let page_offset = guest % PAGE_SIZE;
        let first = guest - page_offset;
        let count = (page_offset + length).div_ceil(PAGE_SIZE).max(1);
        let pages = (0..count).map(|i| first + i * PAGE_SIZE).collect();
        self.register_pages(pdn, access, iova, length, pages, page_offset)
    }

    /// An empty fast-reg MR of `pdn` for up to `max_pages` pages, invalid
    /// until a REG_MR fills it (VT3_CMD_ALLOC_MR).
    pub fn alloc_fast_reg(&mut self, pdn: u32, max_pages: u32) -> u32 {
        self.register(Mr::fast_reg(pdn, max_pages))
    }

    /// An unbound memory window of `pdn` (VT3_CMD_ALLOC_MW).
    pub fn alloc_window(&mut self, pdn: u32, mw_type: MwType) -> u32 {
        self.register(Mr::unbound_window(pdn, mw_type))
    }

    /// VT3_CMD_REREG_MR with a translation change over `pages`.
    pub fn rereg_pages(&mut self, stag: u32, rereg: &Rereg, pages: Vec<u64>) -> Result<(), ReregError> {
        let backing = Backing::Pages { pages, page_offset: rereg.page_offset };
        self.rereg(stag, rereg, Some(backing)).map(|_| ())
    }

    /// Marks an invalidated region valid again.
    pub fn revalidate(&mut self, stag: u32) {
        if let Some(mr) = self.get_mut(stag) {
            mr.valid = true;
        }
    }
}

impl Mr {
    /// The guest-physical ranges of `[iova, iova + len)`, as the TPT
    /// translates them (no checks).
    pub fn ranges(&self, iova: u64, len: u64) -> Vec<(u64, u64)> {
        let Backing::Pages { pages, page_offset } = &self.backing else {
            return vec![(iova, len)];
        };
        let mut out = Vec::new();
        let mut pos = iova - self.iova + page_offset;
        let stop = pos + len;
        while pos < stop {
            let page = pages[(pos / PAGE_SIZE) as usize];
            let in_page = pos % PAGE_SIZE;
            let take = (PAGE_SIZE - in_page).min(stop - pos);
            out.push((page + in_page, take));
            pos += take;
        }
        out
    }
}
