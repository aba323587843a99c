//! In-memory guest RAM and TPT for tests, fuzzing and benchmarks. They
//! behave like the device's (`vm-memory` and `rnic::tpt::Tpt`): STag =
//! index << 8 | key, checks in the order STag, PD, rights, bounds, 4 KiB
//! page lists.
#![allow(clippy::indexing_slicing)] // test support: indexes it just checked

use crate::engine::{
    bound_state, check_bind, check_fast_reg, check_rereg, check_window_access, check_window_invalidate, read_page_list,
    reregistered, Access, AccessError, BindError, FastReg, FastRegError, GuestMemory, MemoryError, MemoryRegions,
    MwBind, MwType, Owner, RegionKind, RegionView, Registration, Rereg, ReregError, Window, WindowView,
    REREG_TRANSLATION,
};

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

/// Page size of the mock page lists (`VT3_PAGE_SIZE`).
pub const PAGE_SIZE: u64 = 4096;

/// One memory region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MockMr {
    pub pdn: u32,
    pub access: Access,
    pub iova: u64,
    pub length: u64,
    /// `pages[i]` backs region octets `[i * PAGE - page_offset, …)`.
    pub pages: Vec<u64>,
    pub page_offset: u64,
    /// Cleared by a Send with Invalidate.
    pub valid: bool,
    /// A fast-reg MR of at most this many pages (filled by REG_MR,
    /// invalidated by LOCAL_INV and the peer); `None`: an ordinary MR.
    pub fast_reg: Option<u32>,
    /// A memory window (no pages of its own: it reaches memory through
    /// the region it is bound to); `None`: a region.
    pub window: Option<Window>,
}

impl MockMr {
    fn window_view(&self, window: Window, key: u8) -> WindowView {
        WindowView {
            window,
            pdn: self.pdn,
            key,
            valid: self.valid,
            access: self.access,
            iova: self.iova,
            length: self.length,
        }
    }

    /// Bounds of `[iova, iova + len)` in this region, then its pieces.
    fn place(&self, iova: u64, len: u64, segment: &mut dyn FnMut(u64, u64)) -> Result<(), AccessError> {
        let offset = iova.checked_sub(self.iova).ok_or(AccessError::Bounds)?;
        let end = offset.checked_add(len).ok_or(AccessError::Bounds)?;
        if end > self.length {
            return Err(AccessError::Bounds);
        }
        let mut pos = offset + self.page_offset;
        let stop = end + self.page_offset;
        while pos < stop {
            let page = self
                .pages
                .get(usize::try_from(pos / PAGE_SIZE).map_err(|_| AccessError::Bounds)?)
                .ok_or(AccessError::Bounds)?;
            let in_page = pos % PAGE_SIZE;
            let take = (PAGE_SIZE - in_page).min(stop - pos);
            segment(page + in_page, take);
            pos += take;
        }
        Ok(())
    }

    /// The guest-physical ranges of `[iova, iova + len)`, as the TPT
    /// translates them (no checks).
    pub fn ranges(&self, iova: u64, len: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut pos = iova - self.iova + self.page_offset;
        let stop = pos + len;
        while pos < stop {
            let page = self.pages[(pos / PAGE_SIZE) as usize];
            let in_page = pos % PAGE_SIZE;
            let take = (PAGE_SIZE - in_page).min(stop - pos);
            out.push((page + in_page, take));
            pos += take;
        }
        out
    }
}

fn stag_of(index: usize, key: u8) -> u32 {
    u32::try_from(index).unwrap_or(u32::MAX >> 8) << 8 | u32::from(key)
}

/// The TPT.
#[derive(Debug, Clone, Default)]
pub struct MockRegions {
    entries: Vec<Option<MockMr>>,
    keys: Vec<u8>,
}

impl MockRegions {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn register(&mut self, mr: MockMr) -> u32 {
        let index = match self.entries.iter().position(Option::is_none) {
            Some(index) => index,
            None => {
                self.entries.push(None);
                self.keys.push(0);
                self.entries.len() - 1
            }
        };
        self.entries[index] = Some(mr);
        self.keys[index] = self.keys[index].wrapping_add(1);
        stag_of(index, self.keys[index])
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
        self.register(MockMr {
            pdn,
            access,
            iova,
            length,
            pages,
            page_offset,
            valid: true,
            fast_reg: None,
            window: None,
        })
    }

    /// An empty fast-reg MR of `pdn` for up to `max_pages` pages, invalid
    /// until a REG_MR fills it (VT3_CMD_ALLOC_MR).
    pub fn alloc_fast_reg(&mut self, pdn: u32, max_pages: u32) -> u32 {
        self.register(MockMr {
            pdn,
            access: 0,
            iova: 0,
            length: 0,
            pages: Vec::new(),
            page_offset: 0,
            valid: false,
            fast_reg: Some(max_pages),
            window: None,
        })
    }

    /// An unbound memory window of `pdn` (VT3_CMD_ALLOC_MW).
    pub fn alloc_window(&mut self, pdn: u32, mw_type: MwType) -> u32 {
        self.register(MockMr {
            pdn,
            access: 0,
            iova: 0,
            length: 0,
            pages: Vec::new(),
            page_offset: 0,
            valid: false,
            fast_reg: None,
            window: Some(Window { mw_type, mr_stag: 0, qpn: 0 }),
        })
    }

    /// Regions with a valid window bound to them (VT3_CMD_DEREG_MR
    /// refuses to free those).
    pub fn windows_bound_to(&self, mr_stag: u32) -> usize {
        self.entries.iter().flatten().filter(|e| e.valid && e.window.is_some_and(|w| w.mr_stag == mr_stag)).count()
    }

    /// The host invalidates any region (`vt3d ctl fault invalidate-stag`),
    /// ordinary MRs included; `InvalidStag` if it is invalid already.
    /// (The peer's and the SQ's invalidations go through
    /// [`MemoryRegions`], which allows fast-reg MRs only.)
    pub fn invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError> {
        let index = self.index_of(stag).ok_or(AccessError::InvalidStag)?;
        let mr = self
            .entries
            .get_mut(index)
            .and_then(Option::as_mut)
            .filter(|mr| mr.valid)
            .ok_or(AccessError::InvalidStag)?;
        if mr.pdn != pdn {
            return Err(AccessError::WrongPd);
        }
        mr.valid = false;
        Ok(())
    }

    /// The rules of [`MemoryRegions::invalidate`]: STag, PD, kind.
    fn check_invalidatable(&self, stag: u32, pdn: u32) -> Result<usize, AccessError> {
        let index = self.index_of(stag).ok_or(AccessError::InvalidStag)?;
        let mr = self.entries.get(index).and_then(Option::as_ref).ok_or(AccessError::InvalidStag)?;
        if let Some(window) = mr.window {
            check_window_invalidate(&mr.window_view(window, (stag & 0xff) as u8), pdn)?;
            return Ok(index);
        }
        if mr.pdn != pdn {
            return Err(AccessError::WrongPd);
        }
        if mr.fast_reg.is_none() {
            return Err(AccessError::Rights);
        }
        Ok(index)
    }

    fn invalidate_fast_reg(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError> {
        let index = self.check_invalidatable(stag, pdn)?;
        if let Some(Some(mr)) = self.entries.get_mut(index) {
            mr.valid = false;
        }
        Ok(())
    }

    /// A region over guest-physically contiguous memory at `guest`.
    pub fn register_contiguous(&mut self, pdn: u32, access: Access, iova: u64, guest: u64, length: u64) -> u32 {
        let page_offset = guest % PAGE_SIZE;
        let first = guest - page_offset;
        let count = (page_offset + length).div_ceil(PAGE_SIZE).max(1);
        let pages = (0..count).map(|i| first + i * PAGE_SIZE).collect();
        self.register_pages(pdn, access, iova, length, pages, page_offset)
    }

    /// VT3_CMD_REREG_MR: the engine's rules ([`check_rereg`]), then the
    /// region named by `stag` (current key, which it keeps) takes the
    /// changes, with a translation change over `pages`.
    pub fn rereg(&mut self, stag: u32, rereg: &Rereg, pages: Vec<u64>) -> Result<(), ReregError> {
        let windows = self.windows_bound_to(stag);
        let mr = self
            .index_of(stag)
            .and_then(|index| self.entries.get_mut(index)?.as_mut())
            .ok_or(ReregError::NoSuchMr(stag))?;
        let kind = match (mr.window, mr.fast_reg) {
            (Some(_), _) => RegionKind::Window,
            (None, Some(_)) => RegionKind::FastReg,
            (None, None) => RegionKind::Pages,
        };
        check_rereg(kind, windows, rereg)?;
        let current = Registration { pdn: mr.pdn, access: mr.access, iova: mr.iova, length: mr.length };
        let next = reregistered(current, rereg);
        (mr.pdn, mr.access, mr.iova, mr.length) = (next.pdn, next.access, next.iova, next.length);
        if rereg.change & REREG_TRANSLATION != 0 {
            mr.pages = pages;
            mr.page_offset = rereg.page_offset;
        }
        Ok(())
    }

    pub fn deregister(&mut self, stag: u32) -> Option<MockMr> {
        let index = self.index_of(stag)?;
        self.entries.get_mut(index)?.take()
    }

    pub fn get(&self, stag: u32) -> Option<&MockMr> {
        self.entries.get(self.index_of(stag)?)?.as_ref()
    }

    /// Marks an invalidated region valid again.
    pub fn revalidate(&mut self, stag: u32) {
        if let Some(Some(mr)) = self.index_of(stag).and_then(|i| self.entries.get_mut(i)) {
            mr.valid = true;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &MockMr)> {
        self.entries.iter().enumerate().filter_map(|(index, mr)| {
            let mr = mr.as_ref()?;
            Some((stag_of(index, self.keys[index]), mr))
        })
    }

    fn index_of(&self, stag: u32) -> Option<usize> {
        let index = (stag >> 8) as usize;
        let key = *self.keys.get(index)?;
        (u32::from(key) == stag & 0xff).then_some(index)
    }
}

impl MemoryRegions for MockRegions {
    fn translate(
        &self,
        stag: u32,
        owner: Owner,
        iova: u64,
        len: u64,
        access: Access,
        segment: &mut dyn FnMut(u64, u64),
    ) -> Result<(), AccessError> {
        let entry = self.get(stag).ok_or(AccessError::InvalidStag)?;
        if let Some(window) = entry.window {
            let view = entry.window_view(window, (stag & 0xff) as u8);
            let mr_stag = check_window_access(&view, owner, iova, len, access)?;
            let mr = self.get(mr_stag).filter(|mr| mr.valid && mr.window.is_none()).ok_or(AccessError::InvalidStag)?;
            return mr.place(iova, len, segment);
        }
        let mr = Some(entry).filter(|mr| mr.valid).ok_or(AccessError::InvalidStag)?;
        if mr.pdn != owner.pdn {
            return Err(AccessError::WrongPd);
        }
        if mr.access & access != access {
            return Err(AccessError::Rights);
        }
        mr.place(iova, len, segment)
    }

    fn invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError> {
        self.invalidate_fast_reg(stag, pdn)
    }

    fn local_invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError> {
        self.invalidate_fast_reg(stag, pdn)
    }

    fn invalidatable(&self, stag: u32, pdn: u32) -> Result<(), AccessError> {
        self.check_invalidatable(stag, pdn).map(|_| ())
    }

    fn fast_register(&mut self, pdn: u32, reg: &FastReg, memory: &dyn GuestMemory) -> Result<(), FastRegError> {
        let index = (reg.stag >> 8) as usize;
        let no_such = FastRegError::NoSuchMr(reg.stag);
        let current_key = *self.keys.get(index).ok_or(no_such)?;
        let mr = self.entries.get_mut(index).and_then(Option::as_mut).ok_or(no_such)?;
        let max_pages = mr.fast_reg.ok_or(no_such)?;
        if mr.pdn != pdn {
            return Err(FastRegError::WrongPd);
        }
        if mr.valid {
            return Err(FastRegError::StillValid);
        }
        let key = (reg.stag & 0xff) as u8;
        if key == current_key {
            return Err(FastRegError::SameKey(key));
        }
        check_fast_reg(reg, max_pages)?;
        let mut pages = Vec::with_capacity(reg.npages as usize);
        read_page_list(memory, reg, &mut pages)?;
        mr.pages = pages;
        mr.page_offset = reg.iova % PAGE_SIZE;
        mr.iova = reg.iova;
        mr.length = reg.length;
        mr.access = reg.access;
        mr.valid = true;
        self.keys[index] = key;
        Ok(())
    }

    fn bind_window(&mut self, owner: Owner, bind: &MwBind) -> Result<(), BindError> {
        let index = (bind.mw_stag >> 8) as usize;
        let window = self
            .entries
            .get(index)
            .and_then(Option::as_ref)
            .and_then(|e| Some(e.window_view(e.window?, self.keys[index])));
        let region = self.get(bind.mr_stag).filter(|mr| mr.valid && mr.window.is_none()).map(|mr| RegionView {
            pdn: mr.pdn,
            access: mr.access,
            iova: mr.iova,
            length: mr.length,
        });
        check_bind(bind, owner, window.as_ref(), region.as_ref())?;
        let (valid, access, iova, length, window) = bound_state(bind, owner);
        if let Some(Some(entry)) = self.entries.get_mut(index) {
            entry.valid = valid;
            entry.access = access;
            entry.iova = iova;
            entry.length = length;
            entry.window = Some(window);
            self.keys[index] = (bind.mw_stag & 0xff) as u8;
        }
        Ok(())
    }
}
