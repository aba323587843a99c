//! The guest's side of a split virtqueue (virtio 1.x §2.7), as virtio_net
//! drives it: descriptors with fixed buffers, the available ring written
//! here, the used ring read here. No EVENT_IDX (not negotiated): vt3d's
//! `VRING_USED_F_NO_NOTIFY` says when a kick is not needed.

use std::sync::atomic::{fence, Ordering};

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const DESC_LEN: u64 = 16;
const VRING_DESC_F_WRITE: u16 = 2;
const VRING_USED_F_NO_NOTIFY: u16 = 1;

/// One split virtqueue in guest memory; buffer `id` is at `bufs + id * buf_len`.
#[derive(Debug)]
pub struct Vring {
    pub size: u16,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
    bufs: u64,
    buf_len: u32,
    avail_idx: u16,
    last_used: u16,
    free: Vec<u16>,
}

impl Vring {
    /// Lays the ring out at `base` (three pages for 256 entries).
    pub fn new(base: u64, size: u16, bufs: u64, buf_len: u32) -> Self {
        let desc = base;
        let avail = desc + u64::from(size) * DESC_LEN;
        let used = (avail + 6 + 2 * u64::from(size)).next_multiple_of(4096);
        Self { size, desc, avail, used, bufs, buf_len, avail_idx: 0, last_used: 0, free: (0..size).rev().collect() }
    }

    /// The end of the ring's memory.
    pub fn end(&self) -> u64 {
        self.used + 6 + 8 * u64::from(self.size)
    }

    pub fn buffer(&self, id: u16) -> u64 {
        self.bufs + u64::from(id) * u64::from(self.buf_len)
    }

    pub fn buf_len(&self) -> u32 {
        self.buf_len
    }

    /// A free descriptor (TX), if any.
    pub fn take_free(&mut self) -> Option<u16> {
        self.free.pop()
    }

    /// Makes buffer `id` (`len` octets) available, not yet published.
    pub fn push(&mut self, mem: &GuestMemoryMmap, id: u16, len: u32, device_writes: bool) {
        let at = self.desc + u64::from(id) * DESC_LEN;
        let flags = if device_writes { VRING_DESC_F_WRITE } else { 0 };
        mem.write_obj(self.buffer(id).to_le(), GuestAddress(at)).expect("descriptor address");
        mem.write_obj(len.to_le(), GuestAddress(at + 8)).expect("descriptor length");
        mem.write_obj(flags.to_le(), GuestAddress(at + 12)).expect("descriptor flags");
        mem.write_obj(0u16, GuestAddress(at + 14)).expect("descriptor next");
        let slot = u64::from(self.avail_idx % self.size);
        mem.write_obj(id.to_le(), GuestAddress(self.avail + 4 + 2 * slot)).expect("avail slot");
        self.avail_idx = self.avail_idx.wrapping_add(1);
    }

    /// Publishes what was pushed; returns whether the device wants a kick.
    pub fn publish(&self, mem: &GuestMemoryMmap) -> bool {
        mem.store(self.avail_idx.to_le(), GuestAddress(self.avail + 2), Ordering::Release).expect("avail idx");
        // The device re-reads avail after enabling notifications: order
        // our index before reading its flag.
        fence(Ordering::SeqCst);
        let flags: u16 = mem.load(GuestAddress(self.used), Ordering::Acquire).expect("used flags");
        u16::from_le(flags) & VRING_USED_F_NO_NOTIFY == 0
    }

    /// The next used element: (descriptor id, octets written).
    pub fn pop_used(&mut self, mem: &GuestMemoryMmap) -> Option<(u16, u32)> {
        let idx: u16 = mem.load(GuestAddress(self.used + 2), Ordering::Acquire).expect("used idx");
        if u16::from_le(idx) == self.last_used {
            return None;
        }
        let slot = u64::from(self.last_used % self.size);
        let at = self.used + 4 + 8 * slot;
        let id: u32 = mem.read_obj(GuestAddress(at)).expect("used id");
        let len: u32 = mem.read_obj(GuestAddress(at + 4)).expect("used len");
        self.last_used = self.last_used.wrapping_add(1);
        let id = u16::try_from(u32::from_le(id)).expect("a descriptor id of this ring");
        Some((id, u32::from_le(len)))
    }

    /// A used TX descriptor is free again.
    pub fn release(&mut self, id: u16) {
        self.free.push(id);
    }
}
