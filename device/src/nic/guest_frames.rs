//! Uplink frames for the guest held while its RX ring has no buffers.
//!
//! The uplink keeps being read while the guest is slow to post RX buffers
//! (offloaded RDMA traffic needs none and must not stall behind the
//! guest's netdev), so frames for the guest wait here, in order. The
//! queue is small and bounded: past it the oldest frame is dropped and
//! counted, as a NIC drops when its ring is full. The device's own frames
//! (control responses and events) never go here: they are never dropped.

use std::collections::VecDeque;

/// Frames for the guest held at most (a NAPI weight's worth).
pub const MAX_HELD_FRAMES: usize = 64;

/// A bounded FIFO of frames that recycles its buffers (no allocation per
/// frame once warm).
#[derive(Debug)]
pub struct HeldFrames {
    frames: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    capacity: usize,
}

impl Default for HeldFrames {
    fn default() -> Self {
        Self::with_capacity(MAX_HELD_FRAMES)
    }
}

impl HeldFrames {
    pub fn with_capacity(capacity: usize) -> Self {
        Self { frames: VecDeque::with_capacity(capacity), spare: Vec::new(), capacity: capacity.max(1) }
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Appends a copy of `frame`; returns whether the oldest frame was
    /// dropped to make room.
    pub fn push(&mut self, frame: &[u8]) -> bool {
        let dropped = self.frames.len() >= self.capacity;
        let mut buf = if dropped { self.frames.pop_front() } else { self.spare.pop() }.unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.frames.push_back(buf);
        dropped
    }

    pub fn front(&self) -> Option<&[u8]> {
        self.frames.front().map(Vec::as_slice)
    }

    pub fn pop_front(&mut self) {
        if let Some(buf) = self.frames.pop_front() {
            self.spare.push(buf);
        }
    }

    pub fn clear(&mut self) {
        self.spare.extend(self.frames.drain(..));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_frame_goes_when_full() {
        let mut q = HeldFrames::with_capacity(3);
        for i in 0..3u8 {
            assert!(!q.push(&[i]));
        }
        assert!(q.push(&[3]));
        assert_eq!(q.len(), 3);
        let mut got = Vec::new();
        while let Some(f) = q.front() {
            got.push(f[0]);
            q.pop_front();
        }
        assert_eq!(got, [1, 2, 3]);
    }
}
