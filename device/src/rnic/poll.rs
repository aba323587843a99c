//! Adaptive polling of work queues and the doorbell hand-off (`vt3_hw.h`,
//! "Doorbells").
//!
//! A queue that just gave vt3d work is likely to give more soon (the next
//! SEND of a ping-pong, the receive re-posted after a completion). For a
//! short window vt3d keeps reading its producer index instead of waiting
//! for a doorbell, and keeps the queue's IDLE flag clear meanwhile, so the
//! provider and vt3.ko skip the doorbell (a frame through the guest's TX
//! ring, a wake-up, a control command on each side of every message).
//!
//! The window adapts per queue ([`PollWindow`]): it grows while polls find
//! work, and when a doorbell comes soon after it closed (a longer one would
//! have saved it) provided at least half of the queue's recent windows paid
//! (found work); it shrinks each time it ends with nothing found. Where the
//! gap between posts is a round trip of slow guests (TCG), windows almost
//! never pay: they stay short instead of taking the CPU the guests need. It is
//! bounded by [`MAX_WINDOW`], and only vt3d's own clock and its own record
//! of the work it took decide it: a guest that flips its flags or indices
//! can make vt3d read a ring, never poll past a window.
//!
//! Polling pays only with a core to spare. When a look that found nothing
//! gives the core away and gets it back late ([`CONTENDED_YIELD`]), other
//! threads were waiting for it (on a loaded host, the guests' vCPUs): the
//! whole set pauses for [`CONTENDED_PAUSE`] and every queue goes back to its
//! doorbells at its next look.
//!
//! The hand-off ([`drain`]): when vt3d stops, it sets the IDLE flag,
//! issues a full barrier and re-reads the producer index; the guest stores
//! its index, issues a full barrier and reads the flag. One of the two sees
//! the other's store, so a WQE posted in between is either taken by vt3d
//! or announced by a doorbell, never stranded.

use std::sync::atomic::{fence, Ordering};

use vt3_iwarp::engine::WorkQueue;
use vt3_iwarp::toe::Duration;

use super::Instant;

/// The shortest window: a queue whose polls never pay costs this much
/// polling after each piece of work.
pub const MIN_WINDOW: Duration = Duration::from_micros(16);
/// A new queue's window.
pub const INITIAL_WINDOW: Duration = Duration::from_micros(64);
/// The longest: the longest gap between posts polling covers, and the
/// most a queue that stopped giving work costs. A 64 B round trip between
/// TCG guests is ~0.4 ms on an idle host and 2-4 ms on a loaded one, where
/// polling that long takes the CPU the guests' vCPUs need (measured with
/// 4 ms: ib_send_lat 4-7x slower), so such gaps are left to doorbells.
pub const MAX_WINDOW: Duration = Duration::from_millis(1);
/// Of the last 8 windows, at least this many must have found work for a
/// doorbell to grow the window: growing is a bet that the next gap is like
/// the last, which only a queue whose windows pay has won.
const PAID_FOR_GROWTH: u32 = 4;
/// A new queue's record: as if half of its windows had paid.
const INITIAL_PAID: u8 = 0x0f;

/// A yield that gave the core away longer than this: it is shared.
pub const CONTENDED_YIELD: std::time::Duration = std::time::Duration::from_micros(200);
/// How long polling pauses then (a TCG round trip is 0.4-4 ms here: the
/// next try comes after several posts went by doorbells).
pub const CONTENDED_PAUSE: Duration = Duration::from_millis(50);

/// Queues polled at once by default (`vt3d serve --poll-queues`); the
/// others wait for doorbells, as before.
pub const MAX_POLLED: u16 = 64;

/// One queue's adaptive polling window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PollWindow {
    length: Duration,
    /// Polling until then (the IDLE flag is clear); `None`: vt3d waits for
    /// a doorbell.
    until: Option<Instant>,
    /// When the queue last gave work.
    last_work: Option<Instant>,
    /// The last 8 windows, newest in bit 0: 1 found work, 0 ended empty.
    paid: u8,
}

impl Default for PollWindow {
    fn default() -> Self {
        Self { length: INITIAL_WINDOW, until: None, last_work: None, paid: INITIAL_PAID }
    }
}

/// What started a look at a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// The guest's doorbell.
    Doorbell,
    /// vt3d polling the queue in its window.
    Poll,
    /// vt3d on its own (the QP entered RTS, a SEND waits for a receive, a
    /// fetch budget ran out, a graceful close).
    Device,
}

impl PollWindow {
    pub fn length(&self) -> Duration {
        self.length
    }

    /// Polling until then, if polling.
    pub fn until(&self) -> Option<Instant> {
        self.until
    }

    /// A doorbell at `now`: if it came within [`MAX_WINDOW`] of the last
    /// work while vt3d was not polling, a longer window would have saved
    /// it: grow to cover that gap with a quarter to spare (at least
    /// double), if the queue's windows have been paying.
    pub fn doorbell(&mut self, now: Instant) {
        if self.paid.count_ones() < PAID_FOR_GROWTH {
            return;
        }
        let Some(last) = self.last_work.filter(|_| self.until.is_none()) else { return };
        let gap = now - last;
        if gap <= MAX_WINDOW {
            self.length = (self.length * 2).max(gap + gap / 4).min(MAX_WINDOW);
        }
    }

    /// Whether vt3d keeps polling once the ring is drained at `now`: only
    /// if the poll set has `room` for the queue; then after taking work
    /// (`took`), else while the current window lasts.
    pub fn stays(&self, now: Instant, took: bool, room: bool) -> bool {
        room && (took || self.until.is_some_and(|until| now < until))
    }

    /// After a look at `now` by `trigger` that took `taken` WQEs and ended
    /// polling (`polling`) or not: work opens a new window (a poll's find
    /// grows it first); a window that ended with nothing found shrinks.
    pub fn record(&mut self, now: Instant, trigger: Trigger, taken: u32, polling: bool) {
        if taken > 0 {
            if trigger == Trigger::Poll {
                self.length = (self.length * 2).min(MAX_WINDOW);
                self.paid = self.paid << 1 | 1;
            }
            self.last_work = Some(now);
            self.until = polling.then(|| now + self.length);
            return;
        }
        if !polling && self.until.take().is_some_and(|until| now >= until) {
            self.length = (self.length / 2).max(MIN_WINDOW);
            self.paid <<= 1;
        }
    }

    /// Polling ends whatever the window (the queue takes no WQEs now).
    pub fn stop(&mut self) {
        self.until = None;
    }
}

/// A queue vt3d may poll.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolledQueue {
    Qp(u32, WorkQueue),
    Srq(u32),
}

/// The queues polled now, at most `capacity` (0: none): each is looked
/// at once per poll pass, with the fetch budget of a doorbell.
#[derive(Debug)]
pub struct PollSet {
    queues: Vec<PolledQueue>,
    capacity: usize,
    /// No queue is polled before then (the core was found shared).
    paused_until: Option<Instant>,
    /// Pauses so far (`rnic.poll_pauses`).
    pauses: u64,
}

impl Default for PollSet {
    fn default() -> Self {
        Self { queues: Vec::new(), capacity: usize::from(MAX_POLLED), paused_until: None, pauses: 0 }
    }
}

impl PollSet {
    /// At most `capacity` queues from now on (the others stop at their
    /// next look).
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// Whether `queue` is polled or may join at `now`.
    pub fn has_room_for(&self, queue: PolledQueue, now: Instant) -> bool {
        if self.paused_until.is_some_and(|until| now < until) {
            return false;
        }
        self.queues.len() < self.capacity || (self.queues.contains(&queue) && self.queues.len() <= self.capacity)
    }

    /// A look at `now` found the core shared: no queue is polled for
    /// [`CONTENDED_PAUSE`] (members leave at their next look).
    pub fn pause(&mut self, now: Instant) {
        self.paused_until = Some(now + CONTENDED_PAUSE);
        self.pauses += 1;
    }

    pub fn pauses(&self) -> u64 {
        self.pauses
    }

    /// Sets whether `queue` is polled (joining needs room: see
    /// [`PollSet::has_room_for`]).
    pub fn set(&mut self, queue: PolledQueue, polled: bool) {
        let at = self.queues.iter().position(|&q| q == queue);
        match (polled, at) {
            (true, None) if self.queues.len() < self.capacity => self.queues.push(queue),
            (false, Some(at)) => {
                self.queues.swap_remove(at);
            }
            _ => {}
        }
    }

    /// Forgets every queue of QP `qpn` (destroyed).
    pub fn remove_qp(&mut self, qpn: u32) {
        self.queues.retain(|q| !matches!(q, PolledQueue::Qp(n, _) if *n == qpn));
    }

    pub fn queues(&self) -> &[PolledQueue] {
        &self.queues
    }

    pub fn is_empty(&self) -> bool {
        self.queues.is_empty()
    }

    pub fn len(&self) -> usize {
        self.queues.len()
    }

    pub fn clear(&mut self) {
        self.queues.clear();
    }
}

/// A work queue vt3d consumes (an SQ, an RQ, an SRQ), as the doorbell
/// protocol sees it.
pub trait ProducerRing {
    /// The guest's producer index, read with acquire (`None`: unreadable).
    fn producer(&mut self) -> Option<u32>;
    /// Sets the IDLE flag (vt3d stops reading: the guest rings) or clears
    /// it (vt3d reads: the guest need not), atomically.
    fn set_idle(&mut self, idle: bool);
    /// Hands the WQEs before `prod` to the engine, taking one of `budget`
    /// each; returns how many it took and whether the ring is drained.
    fn take(&mut self, prod: u32, budget: &mut u32) -> Take;
}

/// What [`ProducerRing::take`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Take {
    /// WQEs taken up to the producer index (or as far as the engine or the
    /// ring's room allowed).
    Drained(u32),
    /// The budget ran out with WQEs left.
    OutOfBudget(u32),
    /// The producer index is impossible: nothing was read.
    Broken,
}

/// How a [`drain`] ended; the IDLE flag is clear in all but `Idle` (and
/// `Broken`, where the caller decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// vt3d stopped reading: the IDLE flag is set, the ring drained.
    Idle,
    /// vt3d keeps polling the queue.
    Polling,
    /// The budget ran out: vt3d carries on at its next pass.
    Pending,
    Broken,
}

/// Reads `ring` until drained or `budget` is spent, then either keeps
/// polling (`stays(took_any)` says so) or hands the queue back to the
/// guest's doorbells: IDLE flag set, full barrier, producer index read
/// again, and what arrived in between taken. Returns the WQEs taken and
/// how it ended.
pub fn drain(ring: &mut impl ProducerRing, mut budget: u32, mut stays: impl FnMut(bool) -> bool) -> (u32, End) {
    ring.set_idle(false);
    let mut taken = 0;
    let mut seen = ring.producer();
    while let Some(prod) = seen {
        match ring.take(prod, &mut budget) {
            Take::Drained(n) => taken += n,
            Take::OutOfBudget(n) => return (taken + n, End::Pending),
            Take::Broken => return (taken, End::Broken),
        }
        if stays(taken > 0) {
            return (taken, End::Polling);
        }
        ring.set_idle(true);
        // Our flag store before the index load; the guest orders its
        // index store before its flag load the same way.
        fence(Ordering::SeqCst);
        let again = ring.producer();
        if again == seen {
            return (taken, End::Idle);
        }
        ring.set_idle(false);
        seen = again;
    }
    ring.set_idle(true);
    (taken, End::Idle)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn at(micros: i64) -> Instant {
        Instant::from_micros(micros)
    }

    fn us(micros: u64) -> Duration {
        Duration::from_micros(micros)
    }

    /// Work at `now` that leaves the queue polling (as `drain` decides).
    fn work(w: &mut PollWindow, now: Instant, trigger: Trigger) {
        assert!(w.stays(now, true, true));
        w.record(now, trigger, 1, true);
    }

    /// Polls from `from` every `step` until the window ends; returns when.
    fn poll_out(w: &mut PollWindow, from: i64, step: i64) -> i64 {
        let mut t = from;
        while w.stays(at(t), false, true) {
            w.record(at(t), Trigger::Poll, 0, true);
            t += step;
        }
        w.record(at(t), Trigger::Poll, 0, false);
        t
    }

    #[test]
    fn a_window_opens_on_work_and_closes_when_it_ends() {
        let mut w = PollWindow::default();
        assert_eq!(w.until(), None, "a new queue waits for its doorbell");
        work(&mut w, at(1000), Trigger::Doorbell);
        assert_eq!(w.until(), Some(at(1000) + INITIAL_WINDOW));
        assert!(w.stays(at(1063), false, true));
        assert!(!w.stays(at(1064), false, true), "not a microsecond past the window");
        let ended = poll_out(&mut w, 1010, 10);
        assert_eq!(ended, 1070);
        assert_eq!(w.until(), None);
        assert_eq!(w.length(), INITIAL_WINDOW / 2, "nothing found: it shrinks");
    }

    #[test]
    fn polls_that_find_work_grow_it_up_to_the_bound() {
        let mut w = PollWindow::default();
        work(&mut w, at(0), Trigger::Doorbell);
        assert_eq!(w.length(), INITIAL_WINDOW, "a doorbell's work is no poll's find");
        let mut t = 0;
        for expect in [128, 256, 512, 1000, 1000] {
            t += 50;
            work(&mut w, at(t), Trigger::Poll);
            assert_eq!(w.length(), us(expect));
            assert_eq!(w.until(), Some(at(t) + us(expect)), "the window runs from the last find");
        }
        assert_eq!(w.length(), MAX_WINDOW);
    }

    #[test]
    fn fruitless_windows_shrink_it_down_to_the_bound() {
        let mut w = PollWindow::default();
        let mut t = 0;
        for expect in [32, 16, 16] {
            work(&mut w, at(t), Trigger::Doorbell);
            t = poll_out(&mut w, t + 1, 1) + 10_000;
            assert_eq!(w.length(), us(expect));
        }
        assert_eq!(w.length(), MIN_WINDOW);
    }

    #[test]
    fn a_doorbell_soon_after_the_window_grows_it_to_cover_the_gap() {
        let mut w = PollWindow::default();
        work(&mut w, at(0), Trigger::Doorbell);
        poll_out(&mut w, 1, 1);
        assert_eq!(w.length(), us(32));
        // The next post came 400 µs after the last work: a window of
        // 500 µs would have caught it.
        w.doorbell(at(400));
        assert_eq!(w.length(), us(500));
        work(&mut w, at(400), Trigger::Doorbell);
        // The next one, 400 µs later, is found by polling.
        assert!(w.stays(at(799), false, true));
        work(&mut w, at(800), Trigger::Poll);
        assert_eq!(w.length(), MAX_WINDOW);
    }

    #[test]
    fn windows_that_never_pay_stop_growing_on_doorbells() {
        // Posts 0.9 ms apart, a doorbell each (a TCG round trip): once
        // the windows' record is more misses than finds, a doorbell within
        // reach of MAX_WINDOW no longer grows the window.
        let mut w = PollWindow::default();
        let mut t = 0;
        let mut lengths = Vec::new();
        for _ in 0..8 {
            work(&mut w, at(t), Trigger::Doorbell);
            poll_out(&mut w, t + 1, 1);
            t += 900;
            w.doorbell(at(t));
            lengths.push(w.length().total_micros());
        }
        assert_eq!(lengths, [1000, 1000, 1000, 1000, 500, 250, 125, 62], "4 misses allowed, then only shrinking");
        for _ in 0..8 {
            work(&mut w, at(t), Trigger::Doorbell);
            poll_out(&mut w, t + 1, 1);
            t += 900;
            w.doorbell(at(t));
        }
        assert_eq!(w.length(), MIN_WINDOW);
        // Finds earn the growth back.
        for _ in 0..4 {
            t += 10;
            work(&mut w, at(t), Trigger::Poll);
        }
        poll_out(&mut w, t + 1, 1);
        let before = w.length();
        w.doorbell(at(t + 900));
        assert!(w.length() > before, "{:?} after 4 finds", w.length());
    }

    #[test]
    fn a_late_or_spurious_doorbell_teaches_nothing() {
        let mut w = PollWindow::default();
        w.doorbell(at(5));
        assert_eq!(w.length(), INITIAL_WINDOW, "no work yet to measure a gap from");
        work(&mut w, at(10), Trigger::Doorbell);
        // Rung while vt3d polled (the guest read the flag before it was
        // cleared): not a window too short.
        w.doorbell(at(20));
        assert_eq!(w.length(), INITIAL_WINDOW);
        poll_out(&mut w, 11, 1);
        let length = w.length();
        w.doorbell(at(10) + MAX_WINDOW + us(1));
        assert_eq!(w.length(), length, "longer after the work than any window");
    }

    #[test]
    fn a_full_poll_set_leaves_the_queue_to_its_doorbells() {
        let w = PollWindow::default();
        assert!(!w.stays(at(0), true, false));
        let mut set = PollSet::default();
        for qpn in 0..u32::from(MAX_POLLED) {
            assert!(set.has_room_for(PolledQueue::Qp(qpn, WorkQueue::Send), at(0)));
            set.set(PolledQueue::Qp(qpn, WorkQueue::Send), true);
        }
        let extra = PolledQueue::Srq(1);
        assert!(!set.has_room_for(extra, at(0)));
        set.set(extra, true);
        assert_eq!(set.len(), usize::from(MAX_POLLED), "never more than the bound");
        assert!(set.has_room_for(PolledQueue::Qp(3, WorkQueue::Send), at(0)), "a member keeps its place");
        set.remove_qp(3);
        assert!(set.has_room_for(extra, at(0)));
        // --poll-queues 0: nobody polls, members leave at their next look.
        set.set_capacity(0);
        assert!(!set.has_room_for(PolledQueue::Qp(4, WorkQueue::Send), at(0)));
        assert!(!set.has_room_for(extra, at(0)));
    }

    #[test]
    fn a_shared_core_pauses_every_queue_then_polling_resumes() {
        let mut set = PollSet::default();
        let (a, b) = (PolledQueue::Qp(1, WorkQueue::Send), PolledQueue::Srq(2));
        set.set(a, true);
        let mut w = PollWindow::default();
        work(&mut w, at(0), Trigger::Doorbell);
        set.pause(at(10));
        assert_eq!(set.pauses(), 1);
        assert!(!set.has_room_for(a, at(10)), "a member leaves");
        assert!(!set.has_room_for(b, at(10)), "nobody joins");
        assert!(!w.stays(at(11), false, set.has_room_for(a, at(11))), "not even inside its window");
        let resume = at(10) + CONTENDED_PAUSE;
        assert!(!set.has_room_for(b, resume - us(1)));
        assert!(set.has_room_for(b, resume));
    }

    /// A queue in memory, and a guest that posts one WQE at a chosen
    /// step of vt3d's hand-off, as libvt3 does: store the producer index,
    /// full barrier, read the IDLE flag, ring if it is set.
    struct MockRing {
        prod: u32,
        fetched: u32,
        idle: bool,
        /// Steps of the device so far (producer reads and flag stores).
        step: usize,
        /// The step before which the guest posts.
        post_at: usize,
        doorbell: bool,
    }

    impl MockRing {
        fn new(post_at: usize) -> Self {
            Self { prod: 5, fetched: 5, idle: false, step: 0, post_at, doorbell: false }
        }

        fn guest_step(&mut self) {
            if self.step == self.post_at {
                self.prod += 1;
                self.doorbell = self.idle;
            }
            self.step += 1;
        }
    }

    impl ProducerRing for MockRing {
        fn producer(&mut self) -> Option<u32> {
            self.guest_step();
            Some(self.prod)
        }

        fn set_idle(&mut self, idle: bool) {
            self.guest_step();
            self.idle = idle;
        }

        fn take(&mut self, prod: u32, budget: &mut u32) -> Take {
            let n = prod - self.fetched;
            *budget -= n;
            self.fetched = prod;
            Take::Drained(n)
        }
    }

    /// vt3d ends a polling window that found nothing more, and the guest
    /// posts a WQE exactly between vt3d's last read of the producer index
    /// and its IDLE store: the guest sees no IDLE and rings no doorbell,
    /// so only the re-read after the barrier can find the WQE.
    #[test]
    fn a_wqe_posted_at_the_hand_off_is_taken() {
        // Steps: 0 clear IDLE, 1 read prod, 2 set IDLE, 3 re-read, …
        let mut ring = MockRing::new(2);
        let (taken, end) = drain(&mut ring, 128, |_| false);
        assert!(!ring.doorbell, "the guest saw vt3d reading: no doorbell");
        assert_eq!(ring.fetched, 6, "the WQE is taken by the re-read");
        assert_eq!((taken, end), (1, End::Idle));
        assert!(ring.idle, "handed back: the next post rings");
    }

    /// Whatever step of the protocol the guest posts at, the WQE is
    /// taken, announced by a doorbell, or the queue is still polled.
    #[test]
    fn no_interleaving_strands_a_wqe() {
        for polls in [false, true] {
            for post_at in 0..8 {
                let mut ring = MockRing::new(post_at);
                let (_, end) = drain(&mut ring, 128, |took| polls && took);
                let posted = ring.step > post_at;
                let stranded = posted && ring.fetched != ring.prod && !ring.doorbell && end == End::Idle;
                assert!(!stranded, "post at step {post_at} (polling {polls}): stranded");
                assert_eq!(end == End::Idle, ring.idle, "the flag says what vt3d does");
            }
        }
    }

    #[test]
    fn the_budget_ends_a_drain_with_the_flag_clear() {
        struct Deep(u32, bool);
        impl ProducerRing for Deep {
            fn producer(&mut self) -> Option<u32> {
                Some(300)
            }
            fn set_idle(&mut self, idle: bool) {
                self.1 = idle;
            }
            fn take(&mut self, prod: u32, budget: &mut u32) -> Take {
                let n = (prod - self.0).min(*budget);
                *budget -= n;
                self.0 += n;
                if self.0 == prod {
                    Take::Drained(n)
                } else {
                    Take::OutOfBudget(n)
                }
            }
        }
        let mut ring = Deep(0, true);
        assert_eq!(drain(&mut ring, 128, |_| false), (128, End::Pending));
        assert!(!ring.1, "not idle: the guest rings no doorbell, vt3d carries on");
    }
}
