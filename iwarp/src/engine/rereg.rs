//! Re-registration of a memory region (`ibv_rereg_mr`, VT3_CMD_REREG_MR):
//! the rules every TPT applies (the device's `rnic::tpt::Tpt` and
//! [`crate::mock`]), so both refuse the same requests. The entry keeps its
//! index and its key: the STag the application holds names the region
//! with its new translation, PD or rights from then on.

use thiserror::Error;

use super::memory::{Access, ALL_ACCESS, PAGE_SIZE};

/// `enum vt3_rereg_change`: what a re-registration changes.
pub const REREG_TRANSLATION: u32 = 1 << 0;
pub const REREG_PD: u32 = 1 << 1;
pub const REREG_ACCESS: u32 = 1 << 2;
const REREG_ALL: u32 = REREG_TRANSLATION | REREG_PD | REREG_ACCESS;

/// What a region's registration says (the fields a rereg may change; the
/// pages come with a translation change).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    pub pdn: u32,
    pub access: Access,
    pub iova: u64,
    pub length: u64,
}

/// A re-registration request: `change` says which parts of `new` apply;
/// with [`REREG_TRANSLATION`], `npages` pages starting `page_offset` into
/// the first hold `new.length` octets from `new.iova`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rereg {
    pub change: u32,
    pub new: Registration,
    pub npages: u32,
    pub page_offset: u64,
}

/// The kind of the entry a rereg names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// A user or kernel MR over a page list: the only kind re-registered.
    Pages,
    /// A kernel DMA MR (all guest memory).
    Dma,
    /// A fast-reg MR: the SQ's REG_MR registers it again.
    FastReg,
    /// A memory window (no region of its own).
    Window,
}

/// Why a re-registration was refused; the entry is left as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum ReregError {
    #[error("STag {0:#x} names no memory region")]
    NoSuchMr(u32),
    #[error("a {0} region is not re-registered")]
    Kind(&'static str),
    #[error("change mask {0:#x}: none, or unknown bits")]
    Change(u32),
    /// The verbs refuse to re-register an MR with windows bound to it.
    #[error("{0} memory window(s) bound to the region")]
    WindowsBound(usize),
    #[error("unknown access bits {0:#x}")]
    Access(Access),
    #[error("{length} octets at page offset {offset} do not fit in {npages} pages")]
    Translation { length: u64, offset: u64, npages: u32 },
}

/// Checks `rereg` against an entry of `kind` with `windows_bound` valid
/// windows bound to it, before anything changes: the change mask, the
/// kind, the windows, then the new rights and translation.
pub fn check_rereg(kind: RegionKind, windows_bound: usize, rereg: &Rereg) -> Result<(), ReregError> {
    if rereg.change == 0 || rereg.change & !REREG_ALL != 0 {
        return Err(ReregError::Change(rereg.change));
    }
    match kind {
        RegionKind::Pages => {}
        RegionKind::Dma => return Err(ReregError::Kind("DMA")),
        RegionKind::FastReg => return Err(ReregError::Kind("fast-reg")),
        RegionKind::Window => return Err(ReregError::Kind("window")),
    }
    if windows_bound > 0 {
        return Err(ReregError::WindowsBound(windows_bound));
    }
    if rereg.change & REREG_ACCESS != 0 && rereg.new.access & !ALL_ACCESS != 0 {
        return Err(ReregError::Access(rereg.new.access));
    }
    if rereg.change & REREG_TRANSLATION != 0 {
        let Rereg { new, npages, page_offset, .. } = *rereg;
        let fits = new.length > 0
            && page_offset < PAGE_SIZE
            && new.iova.checked_add(new.length).is_some()
            && page_offset.checked_add(new.length).is_some_and(|end| end <= u64::from(npages) * PAGE_SIZE);
        if !fits {
            return Err(ReregError::Translation { length: new.length, offset: page_offset, npages });
        }
    }
    Ok(())
}

/// The registration after `rereg` (checked by [`check_rereg`]): the parts
/// it changes from `rereg.new`, the others from `current`.
pub fn reregistered(current: Registration, rereg: &Rereg) -> Registration {
    let mut next = current;
    if rereg.change & REREG_TRANSLATION != 0 {
        next.iova = rereg.new.iova;
        next.length = rereg.new.length;
    }
    if rereg.change & REREG_PD != 0 {
        next.pdn = rereg.new.pdn;
    }
    if rereg.change & REREG_ACCESS != 0 {
        next.access = rereg.new.access;
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{LOCAL_WRITE, MW_BIND, REMOTE_READ, REMOTE_WRITE};

    const CURRENT: Registration = Registration { pdn: 1, access: LOCAL_WRITE, iova: 0x1000, length: 4096 };

    fn rereg(change: u32) -> Rereg {
        Rereg {
            change,
            new: Registration { pdn: 2, access: LOCAL_WRITE | REMOTE_WRITE, iova: 0x7f00_0100, length: 8192 },
            npages: 3,
            page_offset: 0x100,
        }
    }

    #[test]
    fn each_change_takes_its_own_fields_only() {
        let all = rereg(REREG_TRANSLATION | REREG_PD | REREG_ACCESS);
        assert_eq!(reregistered(CURRENT, &all), all.new);
        let t = reregistered(CURRENT, &rereg(REREG_TRANSLATION));
        assert_eq!(t, Registration { iova: 0x7f00_0100, length: 8192, ..CURRENT });
        assert_eq!(reregistered(CURRENT, &rereg(REREG_PD)), Registration { pdn: 2, ..CURRENT });
        let a = reregistered(CURRENT, &rereg(REREG_ACCESS));
        assert_eq!(a, Registration { access: LOCAL_WRITE | REMOTE_WRITE, ..CURRENT });
    }

    #[test]
    fn refusals_in_order() {
        for change in [0, 1 << 3, REREG_PD | 1 << 7] {
            assert_eq!(check_rereg(RegionKind::Window, 1, &rereg(change)), Err(ReregError::Change(change)));
        }
        assert_eq!(check_rereg(RegionKind::Dma, 0, &rereg(REREG_PD)), Err(ReregError::Kind("DMA")));
        assert_eq!(check_rereg(RegionKind::FastReg, 0, &rereg(REREG_PD)), Err(ReregError::Kind("fast-reg")));
        assert_eq!(check_rereg(RegionKind::Window, 0, &rereg(REREG_PD)), Err(ReregError::Kind("window")));
        // Bound windows refuse every change, the access one included.
        assert_eq!(check_rereg(RegionKind::Pages, 2, &rereg(REREG_ACCESS)), Err(ReregError::WindowsBound(2)));
        let atomic = Rereg { new: Registration { access: 1 << 4, ..rereg(0).new }, ..rereg(REREG_ACCESS) };
        assert_eq!(check_rereg(RegionKind::Pages, 0, &atomic), Err(ReregError::Access(1 << 4)));
        // Unknown rights matter only when the rights change.
        assert_eq!(check_rereg(RegionKind::Pages, 0, &Rereg { change: REREG_PD, ..atomic }), Ok(()));
        let ok = Rereg { new: Registration { access: REMOTE_READ | MW_BIND, ..rereg(0).new }, ..rereg(REREG_ACCESS) };
        assert_eq!(check_rereg(RegionKind::Pages, 0, &ok), Ok(()));
    }

    #[test]
    fn a_new_translation_fits_its_pages() {
        let t = rereg(REREG_TRANSLATION);
        assert_eq!(check_rereg(RegionKind::Pages, 0, &t), Ok(()));
        let bad = |r: Rereg| {
            assert_eq!(
                check_rereg(RegionKind::Pages, 0, &r),
                Err(ReregError::Translation { length: r.new.length, offset: r.page_offset, npages: r.npages })
            );
        };
        bad(Rereg { npages: 2, ..t });
        bad(Rereg { page_offset: PAGE_SIZE, ..t });
        bad(Rereg { new: Registration { length: 0, ..t.new }, ..t });
        bad(Rereg { new: Registration { iova: u64::MAX - 10, ..t.new }, ..t });
        bad(Rereg { new: Registration { length: u64::MAX, ..t.new }, npages: u32::MAX, ..t });
        // Without a translation change the pages are not looked at.
        assert_eq!(check_rereg(RegionKind::Pages, 0, &Rereg { npages: 0, ..rereg(REREG_PD) }), Ok(()));
    }
}
