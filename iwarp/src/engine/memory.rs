//! What the engine needs from the device to move data: the TPT (STag
//! lookup with PD, rights and bounds checks and page-list translation) and
//! guest memory. The device implements both (`crate::tpt::Tpt`
//! and vm-memory); tests use [`crate::mock`].

use thiserror::Error;

use super::window::{BindError, MwBind, Owner};
use super::wr::FastReg;

/// Access rights, the bit values of `enum vt3_access` (and of the device's
/// `rnic::tpt::Access`).
pub type Access = u32;
/// The local side may write (receive buffers, READ sinks).
pub const LOCAL_WRITE: Access = 1;
/// The peer may RDMA WRITE into the region.
pub const REMOTE_WRITE: Access = 2;
/// The peer may RDMA READ from the region.
pub const REMOTE_READ: Access = 4;
/// Reading our own memory to send it needs no right.
pub const LOCAL_READ: Access = 0;
/// Memory windows may be bound to the region.
pub const MW_BIND: Access = 8;
/// Every right a registration may grant (`enum vt3_access`, MW_BIND included).
pub const ALL_ACCESS: Access = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | MW_BIND;
/// Page size of page lists (`VT3_PAGE_SIZE`).
pub const PAGE_SIZE: u64 = 4096;

/// Why the TPT refused an access; the engine maps it to TERMINATE codes
/// (remote accesses) or completion statuses (local ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum AccessError {
    #[error("invalid STag")]
    InvalidStag,
    #[error("STag belongs to another protection domain")]
    WrongPd,
    #[error("access rights violation")]
    Rights,
    #[error("base or bounds violation")]
    Bounds,
    /// A type 2 memory window bound on another QP.
    #[error("STag is bound to another queue pair")]
    WrongQp,
}

/// The TPT. `crate::tpt::Tpt::translate` has this signature
/// already (its `AccessError` maps one to one).
pub trait MemoryRegions {
    /// Checks an access of `len` octets at `iova` through `stag` by
    /// `owner` (its PD; its QP for a type 2 window) with rights `access`,
    /// then calls
    /// `segment(guest_phys, len)` for each physically contiguous piece, in
    /// order. A zero-length access checks the STag, PD and rights only.
    fn translate(
        &self,
        stag: u32,
        owner: Owner,
        iova: u64,
        len: u64,
        access: Access,
        segment: &mut dyn FnMut(u64, u64),
    ) -> Result<(), AccessError>;

    /// Send with Invalidate (RFC 5040 §6.10 as the verbs restrict it):
    /// invalidates `stag`, which must name a fast-reg MR or a type 2
    /// memory window of protection domain `pdn` with its current key. An
    /// STag naming nothing is `InvalidStag`, another PD's `WrongPd`, an
    /// ordinary MR or a type 1 window (which the peer may never
    /// invalidate) `Rights`. Invalidating an invalid
    /// fast-reg MR succeeds (the verbs allow it; siw does the same). After
    /// it, every access through `stag` fails with `InvalidStag` until a
    /// REG_MR validates the MR again, under a new key.
    fn invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError>;

    /// LOCAL_INV from the QP's own SQ: the same rules as [`Self::invalidate`].
    fn local_invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError>;

    /// Whether [`Self::local_invalidate`] of `stag` would succeed now
    /// (checked before a READ_INV goes out); changes nothing.
    fn invalidatable(&self, stag: u32, pdn: u32) -> Result<(), AccessError>;

    /// REG_MR from the SQ of a QP of `pdn`: the fast-reg MR named by
    /// `reg.stag`'s index, invalid and of `pdn`, takes `reg.stag`'s key
    /// (a different one: key rotation) and the registration, its page list
    /// read from `memory` now (the driver may reuse it afterwards). On
    /// any error the MR is left as it was.
    fn fast_register(&mut self, pdn: u32, reg: &FastReg, memory: &dyn GuestMemory) -> Result<(), FastRegError>;

    /// BIND_MW from the SQ of `owner`'s QP, executed in SQ order: the
    /// rules of [`super::window::check_bind`]; on success the window takes
    /// `bind.mw_stag`'s key and the binding, on error it is left as it was.
    fn bind_window(&mut self, owner: Owner, bind: &MwBind) -> Result<(), BindError>;
}

/// Why a REG_MR was refused (its WQE completes with LOC_QP_OP_ERR, as siw
/// and rxe complete theirs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Error)]
pub enum FastRegError {
    #[error("STag {0:#x} names no fast-reg MR")]
    NoSuchMr(u32),
    #[error("the MR belongs to another protection domain")]
    WrongPd,
    #[error("the MR is valid: invalidate it first")]
    StillValid,
    #[error("key {0:#04x} is the MR's current key: a registration must rotate it")]
    SameKey(u8),
    #[error("{npages} pages is more than the MR's {max_pages} (or none)")]
    TooManyPages { npages: u32, max_pages: u32 },
    #[error("{length} octets at page offset {offset} do not fit in {npages} pages")]
    Length { length: u64, offset: u64, npages: u32 },
    #[error("unknown access bits {0:#x}")]
    Access(Access),
    #[error("page list entry {index} ({page:#x}) is not an aligned page of guest RAM")]
    BadPage { index: u32, page: u64 },
    #[error("the page list at {0:#x} is not readable guest RAM")]
    PageList(u64),
}

/// Checks a registration against an MR of `max_pages` pages, before any
/// state changes: page count, length and offset, access bits.
pub fn check_fast_reg(reg: &FastReg, max_pages: u32) -> Result<(), FastRegError> {
    if reg.npages == 0 || reg.npages > max_pages {
        return Err(FastRegError::TooManyPages { npages: reg.npages, max_pages });
    }
    if reg.access & !ALL_ACCESS != 0 {
        return Err(FastRegError::Access(reg.access));
    }
    let offset = reg.iova % PAGE_SIZE;
    let capacity = u64::from(reg.npages) * PAGE_SIZE;
    let fits =
        offset.checked_add(reg.length).is_some_and(|end| end <= capacity) && reg.iova.checked_add(reg.length).is_some();
    if !fits {
        return Err(FastRegError::Length { length: reg.length, offset, npages: reg.npages });
    }
    Ok(())
}

/// Reads a REG_MR's page list into `pages` (cleared first; it never holds
/// more than `reg.npages` entries, which [`check_fast_reg`] bounded): each
/// entry a page-aligned page of guest RAM.
pub fn read_page_list(memory: &dyn GuestMemory, reg: &FastReg, pages: &mut Vec<u64>) -> Result<(), FastRegError> {
    pages.clear();
    pages.reserve_exact(reg.npages as usize);
    let mut chunk = [0u8; 8 * 64];
    let mut index = 0u32;
    while index < reg.npages {
        let count = (reg.npages - index).min(64);
        let bytes = chunk.get_mut(..count as usize * 8).ok_or(FastRegError::PageList(reg.pbl_addr))?;
        let at = reg.pbl_addr.checked_add(u64::from(index) * 8).ok_or(FastRegError::PageList(reg.pbl_addr))?;
        memory.read(at, bytes).map_err(|_| FastRegError::PageList(reg.pbl_addr))?;
        for raw in bytes.chunks_exact(8) {
            let page = u64::from_le_bytes(raw.try_into().unwrap_or([0xff; 8]));
            let mut probe = [0u8; 1];
            let in_ram = page % PAGE_SIZE == 0
                && memory.read(page, &mut probe).is_ok()
                && memory.read(page | (PAGE_SIZE - 1), &mut probe).is_ok();
            if !in_ram {
                return Err(FastRegError::BadPage { index, page });
            }
            pages.push(page);
            index += 1;
        }
    }
    Ok(())
}

/// A guest-physical access outside guest RAM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("guest-physical range {addr:#x}+{len:#x} is not backed by guest RAM")]
pub struct MemoryError {
    pub addr: u64,
    pub len: usize,
}

/// Guest RAM by guest-physical address (vm-memory's `GuestMemoryMmap` in vt3d).
pub trait GuestMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError>;
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryError>;
}

/// Reads `out.len()` octets at `iova` of region `stag` into `out`.
pub(crate) fn read_region(
    regions: &dyn MemoryRegions,
    memory: &dyn GuestMemory,
    stag: u32,
    owner: Owner,
    iova: u64,
    access: Access,
    out: &mut [u8],
) -> Result<(), PlacementError> {
    let mut at = 0usize;
    let mut failed = None;
    regions.translate(stag, owner, iova, out.len() as u64, access, &mut |addr, len| {
        if failed.is_some() {
            return;
        }
        let Ok(len) = usize::try_from(len) else {
            failed = Some(MemoryError { addr, len: usize::MAX });
            return;
        };
        let Some(target) = at.checked_add(len).and_then(|end| out.get_mut(at..end)) else {
            failed = Some(MemoryError { addr, len });
            return;
        };
        if let Err(error) = memory.read(addr, target) {
            failed = Some(error);
        }
        at += len;
    })?;
    if let Some(error) = failed {
        return Err(PlacementError::Memory(error));
    }
    if at != out.len() {
        return Err(PlacementError::Memory(MemoryError { addr: iova, len: out.len() }));
    }
    Ok(())
}

/// Writes `data` at `iova` of region `stag`.
pub(crate) fn write_region(
    regions: &dyn MemoryRegions,
    memory: &mut dyn GuestMemory,
    stag: u32,
    owner: Owner,
    iova: u64,
    access: Access,
    data: &[u8],
) -> Result<(), PlacementError> {
    let mut at = 0usize;
    let mut failed = None;
    regions.translate(stag, owner, iova, data.len() as u64, access, &mut |addr, len| {
        if failed.is_some() {
            return;
        }
        let Ok(len) = usize::try_from(len) else {
            failed = Some(MemoryError { addr, len: usize::MAX });
            return;
        };
        let Some(source) = at.checked_add(len).and_then(|end| data.get(at..end)) else {
            failed = Some(MemoryError { addr, len });
            return;
        };
        if let Err(error) = memory.write(addr, source) {
            failed = Some(error);
        }
        at += len;
    })?;
    if let Some(error) = failed {
        return Err(PlacementError::Memory(error));
    }
    if at != data.len() {
        return Err(PlacementError::Memory(MemoryError { addr: iova, len: data.len() }));
    }
    Ok(())
}

/// A failed placement or fetch: refused by the TPT, or the translated
/// address is not guest RAM (a device-side inconsistency).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PlacementError {
    #[error(transparent)]
    Access(#[from] AccessError),
    #[error(transparent)]
    Memory(#[from] MemoryError),
}
