//! `vt3d ctl chaos`: a seeded, replayable schedule of per-connection
//! faults aimed at a user's ports, run against the live device
//! (docs/vt3d-ctl.md, "Chaos").
//!
//! - [`schedule`]: the draws (when, which kind, its parameters, `r`), a
//!   pure function of the seed and the options;
//! - [`Chaos`]: the run as a state machine with injected time: faults due
//!   are injected through a [`Connections`] (the RNIC, or a test's fake),
//!   sticky ones turned off at their window's end, and what each hit
//!   connection did next tracked;
//! - [`log`]: the run's log as text and JSON, and back for a replay;
//! - [`runner`]: the thread that drives a run for the management socket.

pub mod log;
pub mod runner;
pub mod schedule;

use thiserror::Error;
use vt3_iwarp::engine::Fault;
use vt3_iwarp::toe::FourTuple;

use crate::rnic::conns::{ConnEnd, Connection};
use log::{Entry, Hit, Outcome, MAX_ENTRIES};
use schedule::{Kind, Planned, Rate, Schedule, Windows};

pub use runner::{Control, OnRnic};

/// Errors of `vt3d ctl chaos`, each naming the problem.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ChaosError {
    #[error("{0:?} is not a seed: give a u64 (0 to 18446744073709551615, decimal or 0x hex)")]
    Seed(String),
    #[error("{0:?} is not a rate: give faults per second, above 0 and at most {max} (e.g. 0.5)", max = schedule::MAX_RATE)]
    Rate(String),
    #[error("unknown kind {0:?} (valid: rst, fin, blackhole, drop, delay, split, corrupt-crc, terminate)")]
    Kind(String),
    #[error("kind {0} is named twice in --kinds")]
    KindTwice(&'static str),
    #[error("chaos is running: chaos stop first")]
    Running,
    #[error("no chaos run to stop (chaos was never started)")]
    NeverStarted,
    #[error("replay {path}: {why}")]
    Replay { path: String, why: String },
    #[error("no thread for the chaos run: {0}")]
    Thread(String),
}

/// What a run was started with (and its log's header).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Params {
    /// None: a replay of a log that had none.
    pub seed: Option<u64>,
    pub rate: Rate,
    pub kinds: Vec<Kind>,
    /// Connections with one of these ports at either end; empty: all.
    pub ports: Vec<u16>,
    pub duration_s: Option<u64>,
    pub max_faults: Option<u64>,
    pub windows: Windows,
}

impl Params {
    /// Kinds as given, or the default set; a kind named twice is refused
    /// (it would be drawn twice as often, silently).
    pub fn kinds(given: &[Kind]) -> Result<Vec<Kind>, ChaosError> {
        if given.is_empty() {
            return Ok(Kind::DEFAULT.to_vec());
        }
        for (i, k) in given.iter().enumerate() {
            if given.get(..i).is_some_and(|ahead| ahead.contains(k)) {
                return Err(ChaosError::KindTwice(k.name()));
            }
        }
        Ok(given.to_vec())
    }

    fn matches(&self, c: &Connection) -> bool {
        c.live()
            && (self.ports.is_empty()
                || self.ports.iter().any(|p| *p == c.tuple.local.port() || *p == c.tuple.remote.port()))
    }
}

/// The device as a run sees it.
pub trait Connections {
    /// Established connections not ended, in the order they were
    /// established ([`crate::rnic::Rnic::connections`]).
    fn connections(&self) -> Vec<Connection>;
    /// How connection `seq` ended, if that is known.
    fn connection_end(&self, seq: u64) -> Option<ConnEnd>;
    /// Injects `fault` on QP `qpn`'s connection, as `vt3d ctl fault` does.
    fn inject(&mut self, qpn: u32, fault: Fault) -> Result<(), String>;
}

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    /// Ended by itself: the reason.
    Finished(&'static str),
    /// `chaos stop`.
    Stopped,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Finished(_) => "finished",
            State::Stopped => "stopped",
        }
    }
}

/// A connection still up this long after its fault's window is `survived`.
pub const SETTLE_MS: u64 = 1000;
/// A connection that ended is `recovered` if its service's new connection
/// comes within this long. nvme-rdma reconnects every 10 s by default,
/// but a fault that hits a queue while the controller reconnects leaves
/// its Connect command to time out first (60 s, the admin timeout: seen
/// under chaos on 6.1), and only then is the next attempt made.
pub const RECOVERY_MS: u64 = 180_000;
/// How often a run looks at its connections while outcomes are pending.
pub const TRACK_MS: u64 = 50;

/// A run: a schedule (drawn or replayed) and its log.
pub struct Chaos {
    params: Params,
    replay: bool,
    plan: Box<dyn Iterator<Item = Planned> + Send>,
    next: Option<Planned>,
    state: State,
    entries: Vec<Entry>,
    injected: u64,
    skipped: u64,
    /// Entries whose window is open (their fault still on).
    open: Vec<usize>,
    /// The highest connection sequence number seen.
    seen_seq: u64,
    /// When it finished or was stopped.
    ended_ms: Option<u64>,
}

impl std::fmt::Debug for Chaos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Chaos").field("params", &self.params).field("state", &self.state).finish_non_exhaustive()
    }
}

/// A run's counters (`chaos status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub state: State,
    pub elapsed_ms: u64,
    pub injected: u64,
    pub skipped: u64,
    pub next_ms: Option<u64>,
}

/// Whether `new` is `old`'s service again: the same two addresses and
/// the same port at one end (the client's ephemeral port changes).
fn reconnects(old: &FourTuple, new: &FourTuple) -> bool {
    old.local.ip() == new.local.ip()
        && old.remote.ip() == new.remote.ip()
        && (old.local.port() == new.local.port() || old.remote.port() == new.remote.port())
}

impl Chaos {
    /// A run of `params`' seed.
    pub fn drawn(params: Params, seed: u64) -> Self {
        let schedule = Schedule::new(seed, params.rate, &params.kinds, params.windows);
        Self::new(params, Box::new(schedule), false)
    }

    /// A run of a log's schedule.
    pub fn replayed(params: Params, plan: Vec<Planned>) -> Self {
        Self::new(params, Box::new(plan.into_iter()), true)
    }

    fn new(params: Params, mut plan: Box<dyn Iterator<Item = Planned> + Send>, replay: bool) -> Self {
        let next = plan.next();
        Self {
            params,
            replay,
            plan,
            next,
            state: State::Running,
            entries: Vec::new(),
            injected: 0,
            skipped: 0,
            open: Vec::new(),
            seen_seq: 0,
            ended_ms: None,
        }
    }

    pub fn params(&self) -> &Params {
        &self.params
    }

    pub fn replay(&self) -> bool {
        self.replay
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn state(&self) -> State {
        self.state
    }

    pub fn status(&self, at_ms: u64) -> Status {
        Status {
            state: self.state,
            elapsed_ms: self.ended_ms.unwrap_or(at_ms),
            injected: self.injected,
            skipped: self.skipped,
            next_ms: self.next.filter(|_| self.state == State::Running).map(|p| p.t_ms),
        }
    }

    /// Does what is due at `at_ms` (ms since the start): windows that
    /// end, faults due, outcomes. True if it injected anything (the
    /// engine then has work).
    pub fn poll(&mut self, at_ms: u64, dev: &mut impl Connections) -> bool {
        let mut acted = self.close_windows(at_ms, false, dev);
        let duration_ms = self.params.duration_s.map(|s| s.saturating_mul(1000));
        while self.state == State::Running {
            let Some(due) = self.next.filter(|p| p.t_ms <= at_ms) else { break };
            if duration_ms.is_some_and(|d| due.t_ms >= d) {
                break;
            }
            acted |= self.apply(due, dev);
            self.next = self.plan.next();
            if self.params.max_faults.is_some_and(|m| self.injected >= m) {
                self.finish(at_ms, "max faults injected");
            } else if self.entries.len() >= MAX_ENTRIES {
                self.finish(at_ms, "the log is full");
            }
        }
        if self.state == State::Running {
            if let Some(d) = duration_ms.filter(|d| at_ms >= *d) {
                self.finish(d, "duration reached");
            } else if self.next.is_none() {
                self.finish(at_ms, "replay done");
            }
        }
        acted |= self.close_windows(at_ms, false, dev);
        self.track(at_ms, dev);
        acted
    }

    /// `chaos stop`: no more faults; windows still open end now.
    pub fn stop(&mut self, at_ms: u64, dev: &mut impl Connections) -> bool {
        if self.state == State::Running {
            self.state = State::Stopped;
            self.ended_ms = Some(at_ms);
        }
        self.close_windows(at_ms, true, dev)
    }

    /// When the run next has something to do (ms since the start), if
    /// anything: a fault due, a window's end, the duration's end, or a
    /// look at pending outcomes.
    pub fn next_wake(&self, at_ms: u64) -> Option<u64> {
        let running = self.state == State::Running;
        let due = self.next.filter(|_| running).map(|p| p.t_ms);
        let end = self.params.duration_s.filter(|_| running).map(|s| s.saturating_mul(1000));
        let offs = self.open.iter().filter_map(|&i| self.entries.get(i)).filter_map(window_end);
        let look = self.unsettled(at_ms).then_some(at_ms + TRACK_MS);
        due.into_iter().chain(end).chain(offs).chain(look).min()
    }

    fn unsettled(&self, at_ms: u64) -> bool {
        self.state != State::Stopped
            && self.entries.iter().any(|e| match e.outcome {
                Outcome::Pending => true,
                Outcome::Err | Outcome::Closed => e.ended_ms.is_some_and(|t| at_ms <= t + RECOVERY_MS),
                _ => false,
            })
    }

    fn finish(&mut self, at_ms: u64, why: &'static str) {
        self.state = State::Finished(why);
        self.ended_ms = Some(at_ms);
    }

    /// Injects one scheduled fault on the (r mod n)-th matching connection.
    fn apply(&mut self, due: Planned, dev: &mut impl Connections) -> bool {
        let conns = dev.connections();
        self.seen_seq = conns.iter().map(|c| c.seq).fold(self.seen_seq, u64::max);
        let matching: Vec<&Connection> = conns.iter().filter(|c| self.params.matches(c)).collect();
        let n = u64::try_from(matching.len()).unwrap_or(u64::MAX);
        let mut entry = Entry::new(due, u32::try_from(n).unwrap_or(u32::MAX));
        let target = usize::try_from(due.r.checked_rem(n).unwrap_or(0)).ok().and_then(|i| matching.get(i));
        let Some(&&target) = target else {
            self.skipped += 1;
            self.entries.push(entry);
            return false;
        };
        entry.hit = Some(Hit { qpn: target.qpn, seq: target.seq, tuple: target.tuple, seen_seq: self.seen_seq });
        let injected = match dev.inject(target.qpn, due.action.fault()) {
            Ok(()) => {
                self.injected += 1;
                entry.outcome = Outcome::Pending;
                if due.action.window().is_some() {
                    self.open.push(self.entries.len());
                }
                true
            }
            Err(e) => {
                self.skipped += 1;
                entry.error = Some(e);
                false
            }
        };
        self.entries.push(entry);
        injected
    }

    /// Turns off the sticky faults whose window ended by `at_ms` (`all`:
    /// every one, the run being stopped), on connections still up.
    fn close_windows(&mut self, at_ms: u64, all: bool, dev: &mut impl Connections) -> bool {
        if self.open.is_empty() {
            return false;
        }
        let conns = dev.connections();
        let mut acted = false;
        let open = std::mem::take(&mut self.open);
        for i in open {
            let Some(entry) = self.entries.get_mut(i) else { continue };
            let Some(end) = window_end(entry) else { continue };
            if !all && at_ms < end {
                self.open.push(i);
                continue;
            }
            let (Some(hit), Some((_, off))) = (entry.hit, entry.planned.action.window()) else { continue };
            // A connection that ended took its fault with it.
            if !conns.iter().any(|c| c.seq == hit.seq) {
                continue;
            }
            entry.off_ms = Some(end.min(at_ms));
            match dev.inject(hit.qpn, off) {
                Ok(()) => acted = true,
                Err(e) => entry.off_error = Some(e),
            }
        }
        acted
    }

    /// Updates what each hit connection did next.
    fn track(&mut self, at_ms: u64, dev: &impl Connections) {
        if !self.unsettled(at_ms) {
            return;
        }
        let conns = dev.connections();
        self.seen_seq = conns.iter().map(|c| c.seq).fold(self.seen_seq, u64::max);
        for e in &mut self.entries {
            let Some(hit) = e.hit else { continue };
            if e.outcome == Outcome::Pending {
                match conns.iter().find(|c| c.seq == hit.seq) {
                    Some(c) => {
                        let window = e.planned.action.window().map_or(0, |(ms, _)| u64::from(ms));
                        if c.state == crate::abi::QpState::Rts && at_ms >= e.planned.t_ms + window + SETTLE_MS {
                            e.outcome = Outcome::Survived;
                        }
                        continue;
                    }
                    None => {
                        e.outcome = match dev.connection_end(hit.seq) {
                            Some(ConnEnd::Closed) => Outcome::Closed,
                            // ERROR, or the QP destroyed while connected.
                            Some(ConnEnd::Error) | None => Outcome::Err,
                        };
                        e.ended_ms = Some(at_ms);
                    }
                }
            }
            let recovering = matches!(e.outcome, Outcome::Err | Outcome::Closed)
                && e.ended_ms.is_some_and(|t| at_ms <= t + RECOVERY_MS);
            if recovering && conns.iter().any(|c| c.seq > hit.seen_seq && reconnects(&hit.tuple, &c.tuple)) {
                e.outcome = Outcome::Recovered;
                e.recovered_ms = Some(at_ms);
            }
        }
    }
}

/// When an entry's window ends (ms since the start).
fn window_end(e: &Entry) -> Option<u64> {
    e.planned.action.window().map(|(ms, _)| e.planned.t_ms + u64::from(ms))
}

#[cfg(test)]
mod tests;
