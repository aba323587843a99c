//! Frames waiting for the uplink to become writable.
//!
//! A send that finds the peer's queue full (`WouldBlock`) keeps its frame
//! here instead of sleeping in the worker: the worker watches the uplink
//! for writability (EPOLLOUT) and flushes then, and while frames wait the
//! guest's TX ring is left unread, so the guest's own queue backs up as it
//! would behind a busy wire. The queue is bounded; past it frames are
//! dropped and counted (offloaded TCP retransmits them).

use std::collections::VecDeque;
use std::io;

use super::{Uplink, SEND_BATCH};

/// Frames held for the uplink at most: a burst of full-size segments
/// (about 2.3 MB at a 9000-octet MTU), enough for the engine's bursts of
/// every connection to survive a short stall of the peer.
pub const MAX_PENDING_SENDS: usize = 256;
/// From this many held frames on, the guest's TX ring is left unread
/// until the uplink drains: the rest of the room is for offloaded TCP,
/// which cannot be told to wait.
pub const TX_PAUSE_PENDING: usize = MAX_PENDING_SENDS / 2;

/// What became of one frame.
#[derive(Debug)]
pub enum Sent {
    /// On its way.
    Now,
    /// Held until the uplink is writable.
    Queued,
    /// The queue is full: dropped.
    Dropped,
    /// The uplink refused it for another reason (no peer yet, ...): dropped.
    Failed(io::Error),
}

/// A bounded FIFO of frames for the uplink, recycling its buffers so that
/// a congested uplink does not allocate per frame.
#[derive(Debug, Default)]
pub struct SendQueue {
    frames: VecDeque<Vec<u8>>,
    spare: Vec<Vec<u8>>,
    /// Frames the uplink refused while being flushed (not `WouldBlock`).
    pub flush_failures: u64,
}

impl SendQueue {
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// Sends `frame`, behind any frames already waiting (order is kept).
    pub fn send(&mut self, uplink: &dyn Uplink, frame: &[u8]) -> Sent {
        if !self.frames.is_empty() && !self.flush(uplink) {
            return self.hold(frame);
        }
        match uplink.send(frame) {
            Ok(()) => Sent::Now,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.hold(frame),
            Err(e) => Sent::Failed(e),
        }
    }

    /// Queues `frame` behind the others without sending it: the caller
    /// flushes the lot in one batch ([`SendQueue::flush`]) once it has
    /// produced them (an engine poll). Past [`SEND_BATCH`] frames waiting,
    /// a batch goes at once, so the queue's bound is not spent by one poll.
    pub fn defer(&mut self, uplink: &dyn Uplink, frame: &[u8]) -> Sent {
        if self.frames.len() >= SEND_BATCH {
            self.flush(uplink);
        }
        self.hold(frame)
    }

    /// Sends waiting frames, a batch per system call, until the uplink is
    /// full again; returns whether the queue is empty.
    pub fn flush(&mut self, uplink: &dyn Uplink) -> bool {
        while !self.frames.is_empty() {
            let mut batch: [&[u8]; SEND_BATCH] = [&[]; SEND_BATCH];
            let mut n = 0;
            for (slot, frame) in batch.iter_mut().zip(&self.frames) {
                *slot = frame;
                n += 1;
            }
            let sent = match uplink.send_batch(batch.get(..n).unwrap_or_default()) {
                Ok(sent) => sent.min(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) => {
                    log::trace!("uplink send (held frame): {e}");
                    self.flush_failures += 1;
                    1 // the refused frame is dropped
                }
            };
            self.recycle(sent);
            if sent < n && sent > 0 {
                continue; // the next batch starts with the refused frame
            }
            if sent == 0 {
                // Why was it refused? A full queue: wait for EPOLLOUT;
                // anything else: drop it and go on.
                let Some(frame) = self.frames.front() else { break };
                match uplink.send(frame) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                    result => {
                        if let Err(e) = result {
                            log::trace!("uplink send (held frame): {e}");
                            self.flush_failures += 1;
                        }
                        self.recycle(1);
                    }
                }
            }
        }
        true
    }

    /// The first `n` frames are gone: their buffers are kept for reuse.
    fn recycle(&mut self, n: usize) {
        for _ in 0..n {
            if let Some(buf) = self.frames.pop_front() {
                self.spare.push(buf);
            }
        }
    }

    /// Forgets every waiting frame (the uplink's peer is gone for good).
    pub fn clear(&mut self) {
        self.spare.extend(self.frames.drain(..));
    }

    fn hold(&mut self, frame: &[u8]) -> Sent {
        if self.frames.len() >= MAX_PENDING_SENDS {
            return Sent::Dropped;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(frame);
        self.frames.push_back(buf);
        Sent::Queued
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, RawFd};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    /// Takes frames while `open`, refuses them (queue full) otherwise.
    #[derive(Debug, Default)]
    struct Gate {
        open: AtomicBool,
        taken: Mutex<Vec<Vec<u8>>>,
    }

    impl Uplink for Gate {
        fn send(&self, frame: &[u8]) -> io::Result<()> {
            if !self.open.load(Ordering::Relaxed) {
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.taken.lock().unwrap().push(frame.to_vec());
            Ok(())
        }
        fn recv_batch(&self, _: &mut [Vec<u8>], _: &mut [crate::uplink::Received]) -> io::Result<usize> {
            Ok(0)
        }
    }

    impl AsRawFd for Gate {
        fn as_raw_fd(&self) -> RawFd {
            -1
        }
    }

    #[test]
    fn a_full_uplink_holds_frames_in_order_without_waiting() {
        let gate = Gate::default();
        let mut q = SendQueue::default();
        let start = std::time::Instant::now();
        for i in 0..MAX_PENDING_SENDS as u32 {
            assert!(matches!(q.send(&gate, &i.to_le_bytes()), Sent::Queued));
        }
        assert!(matches!(q.send(&gate, b"late"), Sent::Dropped));
        assert!(start.elapsed() < std::time::Duration::from_millis(100), "never sleeps");
        assert_eq!(q.len(), MAX_PENDING_SENDS);
        assert!(!q.flush(&gate));
        // Writable again: the held frames go first, in order.
        gate.open.store(true, Ordering::Relaxed);
        assert!(matches!(q.send(&gate, b"next"), Sent::Now));
        let taken = gate.taken.lock().unwrap();
        assert_eq!(taken.len(), MAX_PENDING_SENDS + 1);
        assert_eq!(taken[0], 0u32.to_le_bytes());
        assert_eq!(taken[MAX_PENDING_SENDS - 1], (MAX_PENDING_SENDS as u32 - 1).to_le_bytes());
        assert_eq!(taken[MAX_PENDING_SENDS], b"next");
        assert!(q.is_empty());
    }
}
