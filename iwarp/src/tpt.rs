//! The Translation and Protection Table: memory regions named by STags
//! (index << 8 | key), checked on every access for state, key, PD, rights
//! and bounds, and translated through their page lists. The iWARP engine
//! reaches guest memory only through it ([`MemoryRegions`]): vt3d's RNIC
//! keeps one per device, and the engine's tests use the same one.
//!
//! Fast-reg MRs (VT3_CMD_ALLOC_MR) start empty and invalid; the SQ's
//! REG_MR fills one under a rotated key, LOCAL_INV and the peer's Send
//! with Invalidate empty it again (docs/architecture.md §3.3). Only
//! they may be invalidated by the QP or its peer.
//!
//! Memory windows (VT3_CMD_ALLOC_MW) are entries of the same index space:
//! unbound until a BIND_MW binds them over part of an MR, then reached by
//! the peer through their own STag, checked by the engine's window rules
//! (`vt3_iwarp::engine::check_bind`, `check_window_access`).

use crate::engine::{
    self, bound_state, check_bind, check_rereg, check_window_access, check_window_invalidate, reregistered, BindError,
    FastReg, FastRegError, MemoryRegions, MwBind, MwType, Owner, RegionKind, RegionView, Registration, Rereg,
    ReregError, Window, WindowView, REREG_TRANSLATION,
};

use crate::engine::PAGE_SIZE;
use crate::table::Table;

/// Access rights (the `enum vt3_access` bits) and why an access was
/// refused: the engine's own, as the TPT answers the engine.
pub use crate::engine::{Access, AccessError, ALL_ACCESS, LOCAL_WRITE, MW_BIND, REMOTE_READ, REMOTE_WRITE};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// `pages[i]` holds the guest-physical page for bytes
    /// `[i * PAGE - page_offset, ...)` of the region.
    Pages { pages: Vec<u64>, page_offset: u64 },
    /// get_dma_mr: the IOVA is the guest-physical address.
    Dma,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mr {
    pub pdn: u32,
    pub access: Access,
    pub iova: u64,
    pub length: u64,
    pub backing: Backing,
    /// Cleared by a Send with Invalidate naming this STag; every access
    /// then fails as an invalid STag. Registration makes a valid region.
    pub valid: bool,
    /// `Some(max_pages)`: a fast-reg MR for up to that many pages (its page
    /// list entries are reserved at allocation). `None`: an ordinary MR.
    pub fast_reg: Option<u32>,
    /// A memory window: the fields above describe its binding, and it
    /// reaches memory through the MR it is bound to. `None`: an MR.
    pub window: Option<Window>,
}

impl Mr {
    /// An empty fast-reg MR of `pdn` (VT3_CMD_ALLOC_MR): invalid.
    pub fn fast_reg(pdn: u32, max_pages: u32) -> Self {
        Mr {
            pdn,
            access: 0,
            iova: 0,
            length: 0,
            backing: Backing::Pages { pages: Vec::new(), page_offset: 0 },
            valid: false,
            fast_reg: Some(max_pages),
            window: None,
        }
    }

    /// An unbound memory window of `pdn` (VT3_CMD_ALLOC_MW).
    pub fn unbound_window(pdn: u32, mw_type: MwType) -> Self {
        Mr {
            pdn,
            access: 0,
            iova: 0,
            length: 0,
            backing: Backing::Pages { pages: Vec::new(), page_offset: 0 },
            valid: false,
            fast_reg: None,
            window: Some(Window { mw_type, mr_stag: 0, qpn: 0 }),
        }
    }

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

    /// Page-list entries this MR holds against the PBL budget.
    pub fn pbl_entries(&self) -> u64 {
        match (&self.backing, self.fast_reg) {
            (_, Some(max_pages)) => u64::from(max_pages),
            (Backing::Pages { pages, .. }, None) => pages.len() as u64,
            (Backing::Dma, None) => 0,
        }
    }
}

/// Why VT3_CMD_DEREG_MR refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeregError {
    #[error("no such memory region")]
    NotFound,
    /// The verbs refuse to deregister an MR with windows bound to it.
    #[error("memory windows are bound to the region")]
    WindowsBound,
}

#[derive(Debug)]
pub struct Tpt {
    entries: Table<Mr>,
    /// Key of each index; bumped on every registration so that a stale
    /// STag never names a newer region.
    keys: Vec<u8>,
}

impl Tpt {
    pub fn new(max: u32) -> Self {
        Self { entries: Table::new(max), keys: Vec::new() }
    }

    /// Registers `mr` and returns its STag, or `None` when full.
    pub fn insert(&mut self, mr: Mr) -> Option<u32> {
        let index = self.entries.insert(mr)?;
        let slot = index as usize;
        if self.keys.len() <= slot {
            self.keys.resize(slot + 1, 0);
        }
        let key = self.keys.get_mut(slot)?;
        *key = key.wrapping_add(1);
        Some(index << 8 | u32::from(*key))
    }

    fn index_of(&self, stag: u32) -> Option<u32> {
        let index = stag >> 8;
        let key = self.keys.get(index as usize)?;
        (u32::from(*key) == stag & 0xff).then_some(index)
    }

    pub fn get(&self, stag: u32) -> Option<&Mr> {
        self.entries.get(self.index_of(stag)?)
    }

    pub(crate) fn get_mut(&mut self, stag: u32) -> Option<&mut Mr> {
        let index = self.index_of(stag)?;
        self.entries.get_mut(index)
    }

    pub fn remove(&mut self, stag: u32) -> Option<Mr> {
        let index = self.index_of(stag)?;
        self.entries.remove(index)
    }

    /// VT3_CMD_DEREG_MR: `stag` with its current key, or, for a fast-reg
    /// MR, with any key. The driver cannot always know the key a fast-reg
    /// MR ended with: a REG_MR under a rotated key may be refused or
    /// flushed (never executed), unsignaled at that, and ULPs deregister
    /// such MRs (NFS/RDMA destroys every flushed MR).
    pub fn remove_for_dereg(&mut self, stag: u32) -> Result<Mr, DeregError> {
        let index = match self.index_of(stag) {
            Some(index) => index,
            None => {
                let index = stag >> 8;
                self.entries.get(index).filter(|mr| mr.fast_reg.is_some()).ok_or(DeregError::NotFound)?;
                index
            }
        };
        let mr = self.entries.get(index).ok_or(DeregError::NotFound)?;
        if mr.window.is_some() {
            return Err(DeregError::NotFound);
        }
        if self.windows_bound_to(index) > 0 {
            return Err(DeregError::WindowsBound);
        }
        self.entries.remove(index).ok_or(DeregError::NotFound)
    }

    /// Valid windows bound to the MR at `index` (under its current key).
    pub fn windows_bound_to(&self, index: u32) -> usize {
        let Some(key) = self.keys.get(index as usize) else { return 0 };
        let mr_stag = index << 8 | u32::from(*key);
        self.iter().filter(|e| e.valid && e.window.is_some_and(|w| w.mr_stag == mr_stag)).count()
    }

    /// VT3_CMD_DEALLOC_MW: the window at `stag`'s index, under any key (a
    /// type 2 window's key is rotated by binds the driver never sees).
    /// Bound or not: its STag names nothing from then on.
    pub fn remove_window(&mut self, stag: u32) -> Option<Mr> {
        let index = stag >> 8;
        self.entries.get(index).filter(|mr| mr.window.is_some())?;
        self.entries.remove(index)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Mr> {
        self.entries.iter().map(|(_, mr)| mr)
    }

    /// Every region with its STag (`vt3d ctl mrs`).
    pub fn iter_stags(&self) -> impl Iterator<Item = (u32, &Mr)> {
        self.entries.iter().map(|(index, mr)| {
            let key = self.keys.get(index as usize).copied().unwrap_or(0);
            (index << 8 | u32::from(key), mr)
        })
    }

    pub fn clear(&mut self) {
        self.entries.clear();
    }

    /// Checks an access of `len` bytes at `iova` through `stag` by
    /// `owner` and calls `segment(guest_phys, len)` for each physically
    /// contiguous piece. A window's STag is checked by the window rules,
    /// then translated through the MR it is bound to.
    pub fn translate(
        &self,
        stag: u32,
        owner: Owner,
        iova: u64,
        len: u64,
        needed: Access,
        segment: impl FnMut(u64, u64),
    ) -> Result<(), AccessError> {
        let entry = self.get(stag).ok_or(AccessError::InvalidStag)?;
        if let Some(window) = entry.window {
            let view = entry.window_view(window, (stag & 0xff) as u8);
            let mr_stag = check_window_access(&view, owner, iova, len, needed)?;
            let mr = self.get(mr_stag).filter(|mr| mr.valid && mr.window.is_none()).ok_or(AccessError::InvalidStag)?;
            return Self::place(mr, iova, len, segment);
        }
        let mr = Some(entry).filter(|mr| mr.valid).ok_or(AccessError::InvalidStag)?;
        if mr.pdn != owner.pdn {
            return Err(AccessError::WrongPd);
        }
        if mr.access & needed != needed {
            return Err(AccessError::Rights);
        }
        Self::place(mr, iova, len, segment)
    }

    /// Bounds of `[iova, iova + len)` in `mr`, then its pieces.
    fn place(mr: &Mr, iova: u64, len: u64, mut segment: impl FnMut(u64, u64)) -> Result<(), AccessError> {
        let offset = iova.checked_sub(mr.iova).ok_or(AccessError::Bounds)?;
        let end = offset.checked_add(len).ok_or(AccessError::Bounds)?;
        if end > mr.length {
            return Err(AccessError::Bounds);
        }
        match &mr.backing {
            Backing::Dma => {
                if len > 0 {
                    segment(iova, len);
                }
            }
            Backing::Pages { pages, page_offset } => {
                let mut pos = offset + page_offset;
                let stop = end + page_offset;
                while pos < stop {
                    let page = pages
                        .get(usize::try_from(pos / PAGE_SIZE).map_err(|_| AccessError::Bounds)?)
                        .ok_or(AccessError::Bounds)?;
                    let in_page = pos % PAGE_SIZE;
                    let take = (PAGE_SIZE - in_page).min(stop - pos);
                    segment(page + in_page, take);
                    pos += take;
                }
            }
        }
        Ok(())
    }

    /// The host invalidates a region (`vt3d ctl fault invalidate-stag`):
    /// `stag` must name a valid region of `pdn`, of any kind. (The peer and
    /// the SQ invalidate through [`MemoryRegions`]: fast-reg MRs only.)
    pub fn invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError> {
        let mr = self.get_mut(stag).filter(|mr| mr.valid).ok_or(AccessError::InvalidStag)?;
        if mr.pdn != pdn {
            return Err(AccessError::WrongPd);
        }
        mr.valid = false;
        Ok(())
    }
}

impl Tpt {
    /// LOCAL_INV and Send with Invalidate: `stag` names a fast-reg MR or
    /// a type 2 window of `pdn` (current key); already invalid is fine
    /// (the verbs allow it). Checked in the order STag, PD, kind (an
    /// ordinary MR, a type 1 window: `Rights`).
    pub fn invalidate_by_wr(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError> {
        self.invalidatable(stag, pdn)?;
        if let Some(mr) = self.get_mut(stag) {
            mr.valid = false;
        }
        Ok(())
    }

    /// Whether [`Self::invalidate_fast_reg`] would succeed; changes nothing.
    pub fn invalidatable(&self, stag: u32, pdn: u32) -> Result<(), AccessError> {
        let mr = self.get(stag).ok_or(AccessError::InvalidStag)?;
        if let Some(window) = mr.window {
            return check_window_invalidate(&mr.window_view(window, (stag & 0xff) as u8), pdn);
        }
        if mr.pdn != pdn {
            return Err(AccessError::WrongPd);
        }
        if mr.fast_reg.is_none() {
            return Err(AccessError::Rights);
        }
        Ok(())
    }

    /// REG_MR (see [`MemoryRegions::fast_register`]). The page list is
    /// read into the entry's own vector, whose capacity never exceeds the
    /// MR's max_pages: no allocation beyond what ALLOC_MR reserved.
    pub fn fast_register(
        &mut self,
        pdn: u32,
        reg: &FastReg,
        memory: &dyn engine::GuestMemory,
    ) -> Result<(), FastRegError> {
        let index = reg.stag >> 8;
        let no_such = FastRegError::NoSuchMr(reg.stag);
        let current_key = *self.keys.get(index as usize).ok_or(no_such)?;
        let mr = self.entries.get_mut(index).ok_or(no_such)?;
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
        engine::check_fast_reg(reg, max_pages)?;
        // The entry is invalid, so nothing reaches its old pages: they are
        // overwritten in place. A refused list leaves it invalid, empty,
        // and under its old key.
        let mut pages = match std::mem::replace(&mut mr.backing, Backing::Dma) {
            Backing::Pages { pages, .. } => pages,
            Backing::Dma => Vec::new(),
        };
        let read = engine::read_page_list(memory, reg, &mut pages);
        if let Err(e) = read {
            pages.clear();
            mr.backing = Backing::Pages { pages, page_offset: 0 };
            mr.length = 0;
            return Err(e);
        }
        mr.backing = Backing::Pages { pages, page_offset: reg.iova % PAGE_SIZE };
        mr.iova = reg.iova;
        mr.length = reg.length;
        mr.access = reg.access;
        mr.valid = true;
        if let Some(slot) = self.keys.get_mut(index as usize) {
            *slot = key;
        }
        Ok(())
    }
}

impl Tpt {
    /// Whether VT3_CMD_REREG_MR of `stag` (current key) would be taken:
    /// the engine's rules ([`check_rereg`]); changes nothing.
    pub fn check_rereg(&self, stag: u32, rereg: &Rereg) -> Result<(), ReregError> {
        let index = self.index_of(stag).ok_or(ReregError::NoSuchMr(stag))?;
        let mr = self.entries.get(index).ok_or(ReregError::NoSuchMr(stag))?;
        let kind = match (&mr.window, mr.fast_reg, &mr.backing) {
            (Some(_), _, _) => RegionKind::Window,
            (None, Some(_), _) => RegionKind::FastReg,
            (None, None, Backing::Dma) => RegionKind::Dma,
            (None, None, Backing::Pages { .. }) => RegionKind::Pages,
        };
        check_rereg(kind, self.windows_bound_to(index), rereg)
    }

    /// VT3_CMD_REREG_MR: the MR at `stag` takes the changes, keeping its
    /// index and key; with a translation change `backing` replaces its
    /// pages and the old backing is returned (to release its budget).
    pub fn rereg(&mut self, stag: u32, rereg: &Rereg, backing: Option<Backing>) -> Result<Option<Backing>, ReregError> {
        self.check_rereg(stag, rereg)?;
        let mr = self.get_mut(stag).ok_or(ReregError::NoSuchMr(stag))?;
        let current = Registration { pdn: mr.pdn, access: mr.access, iova: mr.iova, length: mr.length };
        let next = reregistered(current, rereg);
        (mr.pdn, mr.access, mr.iova, mr.length) = (next.pdn, next.access, next.iova, next.length);
        Ok(match backing {
            Some(backing) if rereg.change & REREG_TRANSLATION != 0 => Some(std::mem::replace(&mut mr.backing, backing)),
            _ => None,
        })
    }
}

impl Tpt {
    /// BIND_MW (see [`MemoryRegions::bind_window`]).
    pub fn bind_window(&mut self, owner: Owner, bind: &MwBind) -> Result<(), BindError> {
        let index = bind.mw_stag >> 8;
        let key = self.keys.get(index as usize).copied().unwrap_or(0);
        let window = self.entries.get(index).and_then(|e| Some(e.window_view(e.window?, key)));
        let region = self.get(bind.mr_stag).filter(|mr| mr.valid && mr.window.is_none()).map(|mr| RegionView {
            pdn: mr.pdn,
            access: mr.access,
            iova: mr.iova,
            length: mr.length,
        });
        check_bind(bind, owner, window.as_ref(), region.as_ref())?;
        let (valid, access, iova, length, window) = bound_state(bind, owner);
        if let Some(entry) = self.entries.get_mut(index) {
            entry.valid = valid;
            entry.access = access;
            entry.iova = iova;
            entry.length = length;
            entry.window = Some(window);
        }
        if let Some(slot) = self.keys.get_mut(index as usize) {
            *slot = (bind.mw_stag & 0xff) as u8;
        }
        Ok(())
    }
}

impl MemoryRegions for Tpt {
    fn translate(
        &self,
        stag: u32,
        owner: Owner,
        iova: u64,
        len: u64,
        access: engine::Access,
        segment: &mut dyn FnMut(u64, u64),
    ) -> Result<(), engine::AccessError> {
        Tpt::translate(self, stag, owner, iova, len, access, segment)
    }

    fn invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), engine::AccessError> {
        self.invalidate_by_wr(stag, pdn)
    }

    fn local_invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), engine::AccessError> {
        self.invalidate_by_wr(stag, pdn)
    }

    fn invalidatable(&self, stag: u32, pdn: u32) -> Result<(), engine::AccessError> {
        Tpt::invalidatable(self, stag, pdn)
    }

    fn fast_register(&mut self, pdn: u32, reg: &FastReg, memory: &dyn engine::GuestMemory) -> Result<(), FastRegError> {
        Tpt::fast_register(self, pdn, reg, memory)
    }

    fn bind_window(&mut self, owner: Owner, bind: &MwBind) -> Result<(), BindError> {
        Tpt::bind_window(self, owner, bind)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    /// QP 1 of PD 1.
    const OWNER: Owner = Owner { pdn: 1, qpn: 1 };

    fn mr(pdn: u32, access: Access) -> Mr {
        // 3 pages, region starts 0x100 into the first one: 8192 bytes.
        Mr {
            pdn,
            access,
            iova: 0x7000_0100,
            length: 8192,
            backing: Backing::Pages { pages: vec![0x10_0000, 0x20_0000, 0x30_0000], page_offset: 0x100 },
            valid: true,
            fast_reg: None,
            window: None,
        }
    }

    fn segments(tpt: &Tpt, stag: u32, iova: u64, len: u64, needed: Access) -> Result<Vec<(u64, u64)>, AccessError> {
        let mut v = Vec::new();
        tpt.translate(stag, OWNER, iova, len, needed, |a, l| v.push((a, l)))?;
        Ok(v)
    }

    #[test]
    fn translates_across_pages() {
        let mut tpt = Tpt::new(16);
        let stag = tpt.insert(mr(1, ALL_ACCESS)).unwrap();
        assert_eq!(
            segments(&tpt, stag, 0x7000_0100, 8192, REMOTE_WRITE).unwrap(),
            vec![(0x10_0100, 0xf00), (0x20_0000, 0x1000), (0x30_0000, 0x100),]
        );
        assert_eq!(segments(&tpt, stag, 0x7000_1000, 16, REMOTE_READ).unwrap(), vec![(0x20_0000, 16)]);
        assert_eq!(segments(&tpt, stag, 0x7000_0100, 0, REMOTE_READ).unwrap(), vec![]);
    }

    #[test]
    fn bounds_rights_pd_and_stag_are_checked() {
        let mut tpt = Tpt::new(16);
        let ro = tpt.insert(mr(1, REMOTE_READ)).unwrap();
        let err = |stag, iova, len, needed| segments(&tpt, stag, iova, len, needed).unwrap_err();
        assert_eq!(err(ro, 0x7000_0100, 1, REMOTE_WRITE), AccessError::Rights);
        assert_eq!(err(ro, 0x7000_00ff, 1, REMOTE_READ), AccessError::Bounds);
        assert_eq!(err(ro, 0x7000_0100, 8193, REMOTE_READ), AccessError::Bounds);
        assert_eq!(err(ro, 0x7000_2100, 1, REMOTE_READ), AccessError::Bounds);
        assert_eq!(err(ro, u64::MAX, 2, REMOTE_READ), AccessError::Bounds);
        assert_eq!(err(ro ^ 1, 0x7000_0100, 1, REMOTE_READ), AccessError::InvalidStag);
        assert_eq!(err(0, 0x7000_0100, 1, REMOTE_READ), AccessError::InvalidStag);
        let mut v = Vec::new();
        assert_eq!(
            tpt.translate(ro, Owner { pdn: 2, qpn: 1 }, 0x7000_0100, 1, REMOTE_READ, |a, l| v.push((a, l))),
            Err(AccessError::WrongPd)
        );
    }

    #[test]
    fn stale_stag_never_names_a_newer_region() {
        let mut tpt = Tpt::new(1);
        let old = tpt.insert(mr(1, ALL_ACCESS)).unwrap();
        tpt.remove(old).unwrap();
        let new = tpt.insert(mr(1, ALL_ACCESS)).unwrap();
        assert_eq!(old >> 8, new >> 8, "same index");
        assert_ne!(old, new, "key changed");
        assert!(tpt.get(old).is_none());
        assert!(tpt.remove(old).is_none());
        assert!(tpt.get(new).is_some());
    }

    #[test]
    fn invalidation_checks_pd_and_sticks() {
        let mut tpt = Tpt::new(16);
        let stag = tpt.insert(mr(1, ALL_ACCESS)).unwrap();
        assert_eq!(tpt.invalidate(stag, 2), Err(AccessError::WrongPd));
        assert_eq!(tpt.invalidate(stag ^ 1, 1), Err(AccessError::InvalidStag));
        tpt.invalidate(stag, 1).unwrap();
        assert_eq!(segments(&tpt, stag, 0x7000_0100, 1, REMOTE_READ), Err(AccessError::InvalidStag));
        assert_eq!(tpt.invalidate(stag, 1), Err(AccessError::InvalidStag), "already invalid");
        // Through the engine's trait, errors map one to one.
        let mut seen = 0;
        let r = MemoryRegions::translate(&tpt, stag, OWNER, 0x7000_0100, 1, REMOTE_READ, &mut |_, _| seen += 1);
        assert_eq!(r, Err(engine::AccessError::InvalidStag));
        assert_eq!(MemoryRegions::invalidate(&mut tpt, 0, 1), Err(engine::AccessError::InvalidStag));
        let fresh = tpt.insert(mr(1, REMOTE_READ)).unwrap();
        let r = MemoryRegions::translate(&tpt, fresh, OWNER, 0x7000_0100, 1, REMOTE_WRITE, &mut |_, _| seen += 1);
        assert_eq!((r, seen), (Err(engine::AccessError::Rights), 0));
    }

    /// Guest RAM for page lists: one flat buffer.
    struct Flat(Vec<u8>);

    impl engine::GuestMemory for Flat {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), engine::MemoryError> {
            let err = engine::MemoryError { addr, len: buf.len() };
            let start = usize::try_from(addr).map_err(|_| err)?;
            let src = self.0.get(start..start.checked_add(buf.len()).ok_or(err)?).ok_or(err)?;
            buf.copy_from_slice(src);
            Ok(())
        }

        fn write(&mut self, addr: u64, _data: &[u8]) -> Result<(), engine::MemoryError> {
            Err(engine::MemoryError { addr, len: 0 })
        }
    }

    fn ram_with_pbl(at: usize, pages: &[u64]) -> Flat {
        let mut ram = Flat(vec![0; 0x40_0000]);
        for (i, p) in pages.iter().enumerate() {
            ram.0[at + i * 8..at + i * 8 + 8].copy_from_slice(&p.to_le_bytes());
        }
        ram
    }

    fn reg(stag: u32, npages: u32) -> FastReg {
        FastReg { stag, iova: 0x9000_0200, length: 2 * 4096 - 0x200, pbl_addr: 0x1000, npages, access: ALL_ACCESS }
    }

    fn rotated(stag: u32) -> u32 {
        stag & !0xff | (stag + 1) & 0xff
    }

    #[test]
    fn fast_reg_entries() {
        let mut tpt = Tpt::new(16);
        let ram = ram_with_pbl(0x1000, &[0x20_0000, 0x10_0000]);
        let old = tpt.insert(Mr::fast_reg(1, 2)).unwrap();
        assert_eq!(tpt.get(old).unwrap().pbl_entries(), 2, "reserved at allocation");
        assert_eq!(segments(&tpt, old, 0, 1, LOCAL_WRITE), Err(AccessError::InvalidStag), "allocated invalid");
        // Refusals leave it invalid under its key.
        assert_eq!(tpt.fast_register(1, &reg(old, 2), &ram), Err(FastRegError::SameKey((old & 0xff) as u8)));
        assert_eq!(tpt.fast_register(2, &reg(rotated(old), 2), &ram), Err(FastRegError::WrongPd));
        assert!(matches!(tpt.fast_register(1, &reg(rotated(old), 3), &ram), Err(FastRegError::TooManyPages { .. })));
        assert!(matches!(
            tpt.fast_register(1, &reg(rotated(old), u32::MAX), &ram),
            Err(FastRegError::TooManyPages { .. })
        ));
        let long = FastReg { length: 2 * 4096, ..reg(rotated(old), 2) };
        assert!(matches!(tpt.fast_register(1, &long, &ram), Err(FastRegError::Length { .. })));
        let outside = FastReg { pbl_addr: 0x40_0000 - 8, ..reg(rotated(old), 2) };
        assert_eq!(tpt.fast_register(1, &outside, &ram), Err(FastRegError::PageList(0x40_0000 - 8)));
        let unaligned = ram_with_pbl(0x1000, &[0x20_0000, 0x10_0008]);
        assert_eq!(
            tpt.fast_register(1, &reg(rotated(old), 2), &unaligned),
            Err(FastRegError::BadPage { index: 1, page: 0x10_0008 })
        );
        assert!(tpt.get(old).is_some_and(|mr| !mr.valid));
        // Registered: the new STag translates through the page list.
        let stag = rotated(old);
        tpt.fast_register(1, &reg(stag, 2), &ram).unwrap();
        assert!(tpt.get(old).is_none(), "the old key names nothing");
        let mut v = Vec::new();
        tpt.translate(stag, OWNER, 0x9000_0200, 4096, REMOTE_WRITE, |a, l| v.push((a, l))).unwrap();
        assert_eq!(v, vec![(0x20_0200, 0xe00), (0x10_0000, 0x200)]);
        assert_eq!(tpt.fast_register(1, &reg(rotated(stag), 2), &ram), Err(FastRegError::StillValid));
        // Invalidation: fast-reg MRs of the PD only; an ordinary MR never.
        let plain = tpt.insert(mr(1, ALL_ACCESS)).unwrap();
        assert_eq!(MemoryRegions::invalidate(&mut tpt, plain, 1), Err(engine::AccessError::Rights));
        assert_eq!(MemoryRegions::local_invalidate(&mut tpt, plain, 1), Err(engine::AccessError::Rights));
        assert!(tpt.get(plain).unwrap().valid);
        assert_eq!(MemoryRegions::invalidate(&mut tpt, stag, 2), Err(engine::AccessError::WrongPd));
        assert_eq!(MemoryRegions::invalidate(&mut tpt, old, 1), Err(engine::AccessError::InvalidStag));
        MemoryRegions::local_invalidate(&mut tpt, stag, 1).unwrap();
        MemoryRegions::invalidate(&mut tpt, stag, 1).unwrap();
        assert_eq!(segments(&tpt, stag, 0x9000_0200, 1, REMOTE_READ), Err(AccessError::InvalidStag));
        // Registered again under the next key; the entry's vector is reused.
        let one = FastReg { length: 100, ..reg(rotated(stag), 1) };
        tpt.fast_register(1, &one, &ram).unwrap();
        assert!(
            matches!(&tpt.get(rotated(stag)).unwrap().backing, Backing::Pages { pages, .. } if pages == &[0x20_0000])
        );
        assert_eq!(tpt.get(rotated(stag)).unwrap().pbl_entries(), 2);
        assert_eq!(
            tpt.fast_register(1, &reg(plain & !0xff | 0x77, 1), &ram),
            Err(FastRegError::NoSuchMr(plain & !0xff | 0x77))
        );
        // DEREG_MR: a fast-reg MR under any key (the driver's may be one a
        // refused REG_MR never gave it); an ordinary MR under its own only.
        let current = rotated(stag);
        assert_eq!(tpt.remove_for_dereg(plain ^ 0x40).err(), Some(DeregError::NotFound));
        assert!(tpt.remove_for_dereg(current ^ 0x40).is_ok_and(|mr| mr.fast_reg == Some(2)));
        assert_eq!(tpt.remove_for_dereg(current).err(), Some(DeregError::NotFound), "gone");
        assert!(tpt.remove_for_dereg(plain).is_ok());
    }

    #[test]
    fn rereg_in_the_tpt() {
        use vt3_iwarp::engine::{REREG_ACCESS, REREG_PD};
        let mut tpt = Tpt::new(16);
        let stag = tpt.insert(mr(1, LOCAL_WRITE | REMOTE_WRITE)).unwrap();
        let new = Registration { pdn: 2, access: LOCAL_WRITE, iova: 0x9000_0000, length: 100 };
        let rereg = |change| Rereg { change, new, npages: 1, page_offset: 0x10 };
        let pages = Backing::Pages { pages: vec![0x50_0000], page_offset: 0x10 };
        let old = tpt.rereg(stag, &rereg(REREG_TRANSLATION), Some(pages)).unwrap();
        assert!(matches!(old, Some(Backing::Pages { pages, .. }) if pages.len() == 3), "the old pages come back");
        assert_eq!(segments(&tpt, stag, 0x9000_0000, 100, REMOTE_WRITE).unwrap(), vec![(0x50_0010, 100)], "same STag");
        assert_eq!(segments(&tpt, stag, 0x7000_0100, 1, REMOTE_WRITE), Err(AccessError::Bounds), "the old range");
        assert_eq!(tpt.rereg(stag, &rereg(REREG_ACCESS | REREG_PD), None), Ok(None));
        assert_eq!(segments(&tpt, stag, 0x9000_0000, 1, REMOTE_WRITE), Err(AccessError::WrongPd));
        let mut v = Vec::new();
        let pd2 = Owner { pdn: 2, qpn: 1 };
        assert_eq!(
            tpt.translate(stag, pd2, 0x9000_0000, 1, REMOTE_WRITE, |a, l| v.push((a, l))),
            Err(AccessError::Rights)
        );
        assert!(tpt.translate(stag, pd2, 0x9000_0000, 1, LOCAL_WRITE, |a, l| v.push((a, l))).is_ok());
        // Refused: stale key, DMA and fast-reg MRs, windows (as MRs and bound).
        assert_eq!(tpt.rereg(stag ^ 1, &rereg(REREG_PD), None), Err(ReregError::NoSuchMr(stag ^ 1)));
        let dma = tpt.insert(Mr { backing: Backing::Dma, ..mr(1, LOCAL_WRITE) }).unwrap();
        assert_eq!(tpt.check_rereg(dma, &rereg(REREG_PD)), Err(ReregError::Kind("DMA")));
        let fast = tpt.insert(Mr::fast_reg(1, 4)).unwrap();
        assert_eq!(tpt.check_rereg(fast, &rereg(REREG_PD)), Err(ReregError::Kind("fast-reg")));
        let bindable = tpt.insert(mr(1, LOCAL_WRITE | MW_BIND)).unwrap();
        let w = tpt.insert(Mr::unbound_window(1, MwType::One)).unwrap();
        let bind = MwBind {
            mw_stag: rotated(w),
            mr_stag: bindable,
            addr: 0x7000_1000,
            length: 16,
            access: REMOTE_READ,
            mw_type: MwType::One,
        };
        tpt.bind_window(OWNER, &bind).unwrap();
        assert_eq!(tpt.check_rereg(rotated(w), &rereg(REREG_PD)), Err(ReregError::Kind("window")));
        let before = tpt.get(bindable).cloned();
        assert_eq!(tpt.rereg(bindable, &rereg(REREG_ACCESS), None), Err(ReregError::WindowsBound(1)));
        assert_eq!(tpt.get(bindable).cloned(), before, "as it was");
    }

    #[test]
    fn windows_in_the_tpt() {
        let mut tpt = Tpt::new(16);
        let mr_stag = tpt.insert(mr(1, LOCAL_WRITE | MW_BIND)).unwrap();
        let w1 = tpt.insert(Mr::unbound_window(1, MwType::One)).unwrap();
        let w2 = tpt.insert(Mr::unbound_window(1, MwType::Two)).unwrap();
        assert_eq!(segments(&tpt, w2, 0x7000_0100, 1, REMOTE_READ), Err(AccessError::InvalidStag), "unbound");
        let bind = |mw: u32, mw_type| MwBind {
            mw_stag: rotated(mw),
            mr_stag,
            addr: 0x7000_1000,
            length: 0x800,
            access: REMOTE_READ | REMOTE_WRITE,
            mw_type,
        };
        tpt.bind_window(OWNER, &bind(w1, MwType::One)).unwrap();
        tpt.bind_window(OWNER, &bind(w2, MwType::Two)).unwrap();
        let (w1, w2) = (rotated(w1), rotated(w2));
        // Through a window: the MR's pages, the window's bounds and rights.
        assert_eq!(segments(&tpt, w2, 0x7000_1000, 0x10, REMOTE_WRITE).unwrap(), vec![(0x20_0000, 0x10)]);
        assert_eq!(segments(&tpt, w2, 0x7000_0100, 1, REMOTE_READ), Err(AccessError::Bounds));
        assert_eq!(segments(&tpt, w2, 0x7000_1000, 1, LOCAL_WRITE), Err(AccessError::InvalidStag), "never an lkey");
        let other_qp = Owner { pdn: 1, qpn: 2 };
        let mut v = Vec::new();
        assert_eq!(
            tpt.translate(w2, other_qp, 0x7000_1000, 1, REMOTE_READ, |a, l| v.push((a, l))),
            Err(AccessError::WrongQp)
        );
        assert!(
            tpt.translate(w1, other_qp, 0x7000_1000, 1, REMOTE_READ, |a, l| v.push((a, l))).is_ok(),
            "type 1: the PD's"
        );
        assert_eq!(
            MemoryRegions::translate(&tpt, w2, other_qp, 0x7000_1000, 1, REMOTE_READ, &mut |_, _| ()),
            Err(engine::AccessError::WrongQp)
        );
        // A bound MR is not deregistered; a window is not an MR to deregister.
        assert_eq!(tpt.windows_bound_to(mr_stag >> 8), 2);
        assert_eq!(tpt.remove_for_dereg(mr_stag).err(), Some(DeregError::WindowsBound));
        assert_eq!(tpt.remove_for_dereg(w1).err(), Some(DeregError::NotFound));
        // Invalidation: type 2 only, by the PD.
        assert_eq!(tpt.invalidate_by_wr(w1, 1), Err(AccessError::Rights));
        assert_eq!(tpt.invalidate_by_wr(w2, 2), Err(AccessError::WrongPd));
        tpt.invalidate_by_wr(w2, 1).unwrap();
        assert_eq!(segments(&tpt, w2, 0x7000_1000, 1, REMOTE_READ), Err(AccessError::InvalidStag));
        // DEALLOC_MW under any key; then the MR goes.
        assert!(tpt.remove_window(w2 ^ 0x55).is_some());
        assert!(tpt.remove_window(mr_stag).is_none(), "an MR is no window");
        assert_eq!(tpt.remove_for_dereg(mr_stag).err(), Some(DeregError::WindowsBound), "w1 still bound");
        assert!(tpt.remove_window(w1).is_some());
        assert!(tpt.remove_for_dereg(mr_stag).is_ok());
        assert!(tpt.is_empty());
    }
}
