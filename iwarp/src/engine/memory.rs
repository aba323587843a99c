//! What the engine needs from the device to move data: the TPT (STag
//! lookup with PD, rights and bounds checks and page-list translation) and
//! guest memory. The device implements both (`device/src/rnic/tpt.rs::Tpt`
//! and vm-memory); tests use [`crate::mock`].

use thiserror::Error;

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
}

/// The TPT. `device/src/rnic/tpt.rs::Tpt::translate` has this signature
/// already (its `AccessError` maps one to one).
pub trait MemoryRegions {
    /// Checks an access of `len` octets at `iova` through `stag` for
    /// protection domain `pdn` with rights `access`, then calls
    /// `segment(guest_phys, len)` for each physically contiguous piece, in
    /// order. A zero-length access checks the STag, PD and rights only.
    fn translate(
        &self,
        stag: u32,
        pdn: u32,
        iova: u64,
        len: u64,
        access: Access,
        segment: &mut dyn FnMut(u64, u64),
    ) -> Result<(), AccessError>;

    /// Send with Invalidate: invalidates `stag` (an MR of protection domain
    /// `pdn`). After it, every access through `stag` fails with
    /// `InvalidStag` until the owner re-validates it.
    fn invalidate(&mut self, stag: u32, pdn: u32) -> Result<(), AccessError>;
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
    pdn: u32,
    iova: u64,
    access: Access,
    out: &mut [u8],
) -> Result<(), PlacementError> {
    let mut at = 0usize;
    let mut failed = None;
    regions.translate(
        stag,
        pdn,
        iova,
        out.len() as u64,
        access,
        &mut |addr, len| {
            if failed.is_some() {
                return;
            }
            let Ok(len) = usize::try_from(len) else {
                failed = Some(MemoryError {
                    addr,
                    len: usize::MAX,
                });
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
        },
    )?;
    if let Some(error) = failed {
        return Err(PlacementError::Memory(error));
    }
    if at != out.len() {
        return Err(PlacementError::Memory(MemoryError {
            addr: iova,
            len: out.len(),
        }));
    }
    Ok(())
}

/// Writes `data` at `iova` of region `stag`.
pub(crate) fn write_region(
    regions: &dyn MemoryRegions,
    memory: &mut dyn GuestMemory,
    stag: u32,
    pdn: u32,
    iova: u64,
    access: Access,
    data: &[u8],
) -> Result<(), PlacementError> {
    let mut at = 0usize;
    let mut failed = None;
    regions.translate(
        stag,
        pdn,
        iova,
        data.len() as u64,
        access,
        &mut |addr, len| {
            if failed.is_some() {
                return;
            }
            let Ok(len) = usize::try_from(len) else {
                failed = Some(MemoryError {
                    addr,
                    len: usize::MAX,
                });
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
        },
    )?;
    if let Some(error) = failed {
        return Err(PlacementError::Memory(error));
    }
    if at != data.len() {
        return Err(PlacementError::Memory(MemoryError {
            addr: iova,
            len: data.len(),
        }));
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
