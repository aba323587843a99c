//! Shared receive queues: one pool of receive WRs that several QPs take
//! from in posting order. A QP takes the next WR when the first DDP
//! segment of a Send arrives (the iWARP moment a receive WQE is consumed);
//! from then on the WR belongs to that QP: it completes there, in error
//! or flushed if the QP fails before the message is complete. A QP error
//! never touches the WRs still in the pool.

use std::collections::VecDeque;

use super::wr::{RecvWr, WcStatus};

/// A pooled WR: parsed, or refused by the device (it fails the QP that
/// takes it, with this status, as a refused RQ WQE would).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SrqWr {
    Posted(RecvWr),
    Refused { wr_id: u64, status: WcStatus },
}

/// One SRQ: the WRs posted and not yet taken, each with its free-running
/// index (the device's ring index, named in the CQE).
#[derive(Debug)]
pub(crate) struct Srq {
    pub depth: u32,
    pool: VecDeque<(u32, SrqWr)>,
    /// Index of the next WR posted.
    next: u32,
    /// Index after the last WR taken: the device's consumer index.
    taken: u32,
    /// QPs attached (destroy waits until none).
    pub qps: u32,
}

impl Srq {
    /// An empty SRQ whose indices start at `start` (they are free running:
    /// a new engine starts where the guest's ring is).
    pub fn new(depth: u32, start: u32) -> Srq {
        Srq { depth, pool: VecDeque::with_capacity(depth as usize), next: start, taken: start, qps: 0 }
    }

    /// Whether another WR fits (the pool holds at most `depth`).
    pub fn is_full(&self) -> bool {
        self.pool.len() >= self.depth as usize
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.pool.is_empty()
    }

    pub fn len(&self) -> usize {
        self.pool.len()
    }

    /// Adds a WR at the tail; the caller checked `is_full`.
    pub fn push(&mut self, wr: SrqWr) {
        self.pool.push_back((self.next, wr));
        self.next = self.next.wrapping_add(1);
    }

    /// Takes the next WR in SRQ order.
    pub fn take(&mut self) -> Option<(u32, SrqWr)> {
        let (index, wr) = self.pool.pop_front()?;
        self.taken = index.wrapping_add(1);
        Some((index, wr))
    }

    /// Index after the last WR taken (free running).
    pub fn taken(&self) -> u32 {
        self.taken
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::engine::wr::SgeList;

    fn wr(wr_id: u64) -> SrqWr {
        SrqWr::Posted(RecvWr { wr_id, sges: SgeList::EMPTY })
    }

    #[test]
    fn takes_in_posting_order_with_free_running_indices() {
        let mut srq = Srq::new(2, u32::MAX);
        assert_eq!(srq.take(), None);
        srq.push(wr(1));
        srq.push(wr(2));
        assert!(srq.is_full());
        assert_eq!(srq.take(), Some((u32::MAX, wr(1))));
        assert_eq!(srq.taken(), 0, "wraps");
        srq.push(wr(3));
        assert_eq!(srq.take(), Some((0, wr(2))));
        assert_eq!(srq.take(), Some((1, wr(3))));
        assert_eq!(srq.taken(), 2);
        assert!(srq.is_empty());
    }
}
