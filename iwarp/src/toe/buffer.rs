//! Socket buffer storage whose idle pages cost nothing.
//!
//! smoltcp fixes a socket's buffers when the socket is made, and the
//! window scale follows their size, so a connection keeps its buffers
//! for life. What it need not keep is their *pages*: each buffer is an
//! anonymous mapping of its own (no allocator header on its first page,
//! only the pages data passed through are resident), and once both of a
//! socket's buffers have stayed empty for a while the TOE hands their
//! pages back to the kernel (`MADV_DONTNEED`). An idle connection then
//! holds no buffer page at all, though it touched one each way for the
//! MPA handshake; data flowing again faults zeroed pages back in.
//! Measured in docs/performance.md, "Round 5 (idle memory)".

use std::ptr::NonNull;

use thiserror::Error;

/// Buffer errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum BufferError {
    #[error("cannot map {0} octets of socket buffer")]
    Map(usize),
}

fn page_size() -> usize {
    // SAFETY: sysconf reads a configuration value and touches no memory of ours.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).ok().filter(|&s| s > 0).unwrap_or(4096)
}

/// One socket buffer: a private anonymous mapping of `len` octets (rounded
/// up to pages), unmapped on drop.
#[derive(Debug)]
pub(super) struct PageBuffer {
    base: NonNull<u8>,
    len: usize,
    mapped: usize,
}

impl PageBuffer {
    /// Maps `len` zeroed octets.
    pub(super) fn new(len: usize) -> Result<Self, BufferError> {
        let page = page_size();
        let mapped = len.max(1).checked_next_multiple_of(page).ok_or(BufferError::Map(len))?;
        // SAFETY: a fresh anonymous mapping at an address the kernel picks;
        // no existing memory is affected.
        let addr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if addr == libc::MAP_FAILED {
            return Err(BufferError::Map(len));
        }
        let base = NonNull::new(addr.cast::<u8>()).ok_or(BufferError::Map(len))?;
        Ok(PageBuffer { base, len, mapped })
    }

    /// The buffer as the slice smoltcp's `SocketBuffer` borrows.
    ///
    /// # Safety
    /// Call once per buffer, and drop whatever holds the slice (the
    /// socket) before the `PageBuffer`: the lifetime is a promise of the
    /// caller's, not of the type system.
    pub(super) unsafe fn storage(&mut self) -> &'static mut [u8] {
        // SAFETY: `base` maps `mapped` ≥ `len` readable, writable, zeroed
        // octets that stay mapped until `self` drops; the caller hands the
        // slice to one owner and drops it first (see above).
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len) }
    }

    /// Returns the buffer's pages to the kernel; they read as zeros and are
    /// faulted in again when written.
    ///
    /// Call only while the ring stored in it is empty: the ring then holds
    /// no octet anyone reads before writing it again (smoltcp reads only
    /// what it enqueued), so whether its free space holds old bytes or
    /// zeros cannot be seen.
    pub(super) fn release(&self) {
        // SAFETY: the range is exactly our own private anonymous mapping;
        // MADV_DONTNEED on it only replaces its pages by zero-fill-on-demand
        // ones (no mapping changes, nothing else is touched), and the
        // caller guarantees that no octet of it is read before it is
        // written again.
        let _ = unsafe { libc::madvise(self.base.as_ptr().cast::<libc::c_void>(), self.mapped, libc::MADV_DONTNEED) };
    }

    /// Pages of the buffer resident in memory now (`mincore`; a page only
    /// read counts too, though it maps the kernel's shared zero page).
    pub(super) fn resident_pages(&self) -> usize {
        let pages = self.mapped / page_size();
        let mut vec = vec![0u8; pages];
        // SAFETY: the range is our own mapping and `vec` has one octet per
        // page of it, as mincore writes.
        let rc = unsafe { libc::mincore(self.base.as_ptr().cast::<libc::c_void>(), self.mapped, vec.as_mut_ptr()) };
        if rc != 0 {
            // Cannot tell: count it all, so a test never passes by error.
            return pages;
        }
        vec.iter().filter(|&&v| v & 1 != 0).count()
    }
}

impl Drop for PageBuffer {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `new` made; whoever borrowed
        // its storage (the socket) was dropped before (see `storage`).
        let _ = unsafe { libc::munmap(self.base.as_ptr().cast::<libc::c_void>(), self.mapped) };
    }
}

// SAFETY: a `PageBuffer` owns its mapping alone (no shared state); moving
// it to another thread moves that ownership, as a `Vec<u8>` would.
unsafe impl Send for PageBuffer {}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn pages_are_resident_only_once_written_and_until_released() {
        let mut buffer = PageBuffer::new(64 * 1024 + 1).unwrap();
        assert_eq!(buffer.resident_pages(), 0);
        // SAFETY: the only borrower, dropped before `buffer`.
        let storage = unsafe { buffer.storage() };
        assert_eq!(storage.len(), 64 * 1024 + 1);
        storage[0] = 7;
        storage[64 * 1024] = 9;
        assert_eq!(buffer.resident_pages(), 2);
        buffer.release();
        assert_eq!(buffer.resident_pages(), 0);
        storage[5000] = 1;
        assert_eq!(buffer.resident_pages(), 1);
        // What was written before reads as zeros (mapping the kernel's
        // zero page, which mincore counts: so this comes last).
        assert_eq!((storage[0], storage[64 * 1024]), (0, 0));
    }
}
