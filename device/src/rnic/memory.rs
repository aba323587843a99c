//! Guest memory as the RDMA function touches it: bulk data for the iWARP
//! engine, and the 32-bit indices and flags of the status pages, which a
//! running guest reads and writes concurrently (so they are accessed
//! atomically, with the orderings `vt3_hw.h` prescribes).
//!
//! Every access is checked by vm-memory against the memory table: a bad
//! address is an error, never a panic.

use std::sync::atomic::{AtomicU32, Ordering};

use vm_memory::guest_memory::GuestMemorySliceIterator;
use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions, VolatileMemory};
use vt3_iwarp::engine::{self, MemoryError};

/// Guest RAM for the engine: `read_slice`/`write_slice` at guest-physical
/// addresses (volatile copies; the guest may change the memory meanwhile).
#[derive(Debug)]
pub struct GuestRam<'a, M>(pub &'a M);

impl<M: GuestMemory> engine::GuestMemory for GuestRam<'_, M> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        self.0.read_slice(buf, GuestAddress(addr)).map_err(|_| MemoryError { addr, len: buf.len() })
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryError> {
        self.0.write_slice(data, GuestAddress(addr)).map_err(|_| MemoryError { addr, len: data.len() })
    }
}

/// A little-endian `__le32` of a status page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusWord(pub GuestAddress);

impl StatusWord {
    /// The field at byte `offset` of the status page at `page`.
    pub fn at(page: GuestAddress, offset: usize) -> Self {
        Self(GuestAddress(page.0.wrapping_add(offset as u64)))
    }

    pub fn load<M: GuestMemory>(self, mem: &M, order: Ordering) -> Option<u32> {
        mem.load::<u32>(self.0, order).ok().map(u32::from_le)
    }

    pub fn store<M: GuestMemory>(self, mem: &M, value: u32, order: Ordering) -> bool {
        mem.store(value.to_le(), self.0, order).is_ok()
    }

    /// Atomically sets `bits` (flags words are shared: the driver and the
    /// provider set bits of their own). Returns the previous value.
    pub fn fetch_or<M: GuestMemory>(self, mem: &M, bits: u32) -> Option<u32> {
        self.with_atomic(mem, |a| a.fetch_or(bits.to_le(), Ordering::SeqCst))
    }

    /// Atomically clears `bits`; returns the previous value.
    pub fn fetch_and_not<M: GuestMemory>(self, mem: &M, bits: u32) -> Option<u32> {
        self.with_atomic(mem, |a| a.fetch_and(!bits.to_le(), Ordering::SeqCst))
    }

    fn with_atomic<M: GuestMemory>(self, mem: &M, f: impl FnOnce(&AtomicU32) -> u32) -> Option<u32> {
        let slice = mem.get_slices(self.0, 4, Permissions::ReadWrite).ok()?.stop_on_error().ok()?.next()?;
        // get_atomic_ref checks length and alignment.
        let atomic = slice.get_atomic_ref::<AtomicU32>(0).ok()?;
        Some(u32::from_le(f(atomic)))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;
    use vt3_iwarp::engine::GuestMemory as _;

    fn mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x2000), (GuestAddress(0x10000), 0x1000)]).unwrap()
    }

    #[test]
    fn engine_accesses_are_checked() {
        let m = mem();
        let mut ram = GuestRam(&m);
        ram.write(0x1ff0, &[7; 16]).unwrap();
        let mut buf = [0u8; 16];
        ram.read(0x1ff0, &mut buf).unwrap();
        assert_eq!(buf, [7; 16]);
        // Beyond the end of a region, in a hole, and wrapping the address space.
        for addr in [0x1ff8, 0x3000, 0x10ffc, u64::MAX - 3] {
            assert_eq!(ram.read(addr, &mut buf), Err(MemoryError { addr, len: 16 }), "{addr:#x}");
            assert!(ram.write(addr, &buf).is_err(), "{addr:#x}");
        }
    }

    #[test]
    fn status_words() {
        let m = mem();
        let w = StatusWord::at(GuestAddress(0x100), 8);
        assert!(w.store(&m, 0x1234_5678, Ordering::Release));
        assert_eq!(m.read_obj::<[u8; 4]>(GuestAddress(0x108)).unwrap(), [0x78, 0x56, 0x34, 0x12], "little endian");
        assert_eq!(w.fetch_or(&m, 0x8000_0001), Some(0x1234_5678));
        assert_eq!(w.fetch_and_not(&m, 0x1234_0000), Some(0x9234_5679));
        assert_eq!(w.load(&m, Ordering::Acquire), Some(0x8000_5679));
        // Misaligned, outside RAM, straddling a region end: errors.
        for bad in [0x101, 0x3000, 0x1ffe] {
            let w = StatusWord(GuestAddress(bad));
            assert_eq!(w.fetch_or(&m, 1), None, "{bad:#x}");
        }
        assert_eq!(StatusWord(GuestAddress(0x3000)).load(&m, Ordering::Acquire), None);
        assert!(!StatusWord(GuestAddress(0x3000)).store(&m, 1, Ordering::Release));
    }
}
