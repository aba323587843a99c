//! The thread that drives a chaos run, and the management socket's
//! `chaos` requests. The thread sleeps until the run's next deadline (a
//! fault, a window's end, or a 50 ms look while outcomes are pending),
//! then locks the device just long enough to poll the run: it never holds
//! the device while asleep, wakes at once for `chaos stop`, and ends when
//! the run has nothing left to do or the device is gone.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::json;
use vt3_iwarp::engine::Fault;

use super::log::{self, read_replay};
use super::{Chaos, ChaosError, Connections, Params, State};
use crate::config::{ChaosRequest, ChaosStart};
use crate::rnic::conns::{ConnEnd, Connection};
use crate::rnic::{Instant as EngineInstant, Rnic};
use crate::t3::{Device, Instant, T3};

/// The RNIC, at one instant, as a run sees it.
#[derive(Debug)]
pub struct OnRnic<'a> {
    pub rnic: &'a mut Rnic,
    pub now: EngineInstant,
}

impl Connections for OnRnic<'_> {
    fn connections(&self) -> Vec<Connection> {
        self.rnic.connections()
    }

    fn connection_end(&self, seq: u64) -> Option<ConnEnd> {
        self.rnic.connection_end(seq)
    }

    fn inject(&mut self, qpn: u32, fault: Fault) -> Result<(), String> {
        self.rnic.inject(self.now, qpn, fault).map(|_| ())
    }
}

/// A run and when it started (the device's clock).
#[derive(Debug)]
struct Run {
    chaos: Chaos,
    start: Instant,
}

impl Run {
    fn at_ms(&self, now: Instant) -> u64 {
        u64::try_from(self.start.until(now).as_millis()).unwrap_or(u64::MAX)
    }

    /// Polls (or stops) the run against the device; kicks the worker if it
    /// injected anything.
    fn drive(&mut self, device: &T3, stop: bool) {
        let now = device.now();
        let at_ms = self.at_ms(now);
        let acted = {
            let mut rnic = device.rnic();
            let mut on = OnRnic { rnic: &mut rnic, now: now.engine() };
            if stop {
                self.chaos.stop(at_ms, &mut on)
            } else {
                self.chaos.poll(at_ms, &mut on)
            }
        };
        if acted {
            device.kick();
        }
    }
}

#[derive(Debug, Default)]
struct Slot {
    run: Option<Run>,
    /// Tells the thread to end.
    quit: bool,
}

#[derive(Debug, Default)]
struct Shared {
    slot: Mutex<Slot>,
    wake: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The management socket's chaos: at most one run, the last one kept for
/// `status` and `log` until the next `start`.
#[derive(Debug, Default)]
pub struct Control {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Control {
    fn drop(&mut self) {
        self.end_thread();
    }
}

impl Control {
    /// Answers one `chaos` request.
    pub fn answer(&self, device: &Arc<T3>, request: &ChaosRequest, json: bool) -> String {
        let result = match request {
            ChaosRequest::Start(start) => self.start(device, start, json),
            ChaosRequest::Status => Ok(self.status(device, json)),
            ChaosRequest::Stop => self.stop(device, json),
            ChaosRequest::Log => Ok(self.log(json)),
        };
        result.unwrap_or_else(|e| format!("error: {e}\n"))
    }

    fn start(&self, device: &Arc<T3>, start: &ChaosStart, json: bool) -> Result<String, ChaosError> {
        if lock(&self.shared.slot).run.as_ref().is_some_and(|r| r.chaos.state() == State::Running) {
            return Err(ChaosError::Running);
        }
        let chaos = match &start.replay {
            Some(path) => {
                let (params, plan) = read_replay(path)?;
                Chaos::replayed(params, plan)
            }
            None => {
                let params = Params {
                    seed: start.seed,
                    rate: start.rate.ok_or_else(|| ChaosError::Rate(String::new()))?,
                    kinds: Params::kinds(&start.kinds)?,
                    ports: start.ports.clone(),
                    duration_s: start.duration,
                    max_faults: start.max_faults,
                    windows: super::Windows {
                        blackhole_ms: start.blackhole_ms,
                        window_ms: start.window_ms,
                        delay_ms: start.delay_ms,
                    },
                };
                let seed = start.seed.ok_or_else(|| ChaosError::Seed(String::new()))?;
                Chaos::drawn(params, seed)
            }
        };
        // A finished run may still be tracking outcomes: that ends here.
        self.end_thread();
        let answer = started(chaos.params(), chaos.replay(), start.replay.as_deref(), json);
        {
            let mut slot = lock(&self.shared.slot);
            // Another client's start may have come in between.
            if slot.run.as_ref().is_some_and(|r| r.chaos.state() == State::Running) {
                return Err(ChaosError::Running);
            }
            *slot = Slot { run: Some(Run { chaos, start: device.now() }), quit: false };
        }
        let (shared, weak) = (Arc::clone(&self.shared), Arc::downgrade(device));
        let thread = thread::Builder::new()
            .name("vt3d-chaos".into())
            .spawn(move || drive(&shared, &weak))
            .map_err(|e| ChaosError::Thread(e.to_string()))?;
        *lock(&self.thread) = Some(thread);
        Ok(answer)
    }

    fn status(&self, device: &T3, json: bool) -> String {
        let slot = lock(&self.shared.slot);
        let Some(run) = slot.run.as_ref() else {
            return if json {
                format!(
                    "{}\n",
                    json!({"state": "idle", "seed": null, "elapsed_ms": 0, "injected": 0, "skipped": 0, "next_ms": null})
                )
            } else {
                "idle: chaos was never started\n".to_owned()
            };
        };
        let s = run.chaos.status(run.at_ms(device.now()));
        let seed = run.chaos.params().seed;
        if json {
            let v = json!({"state": s.state.name(), "seed": seed, "elapsed_ms": s.elapsed_ms,
                           "injected": s.injected, "skipped": s.skipped, "next_ms": s.next_ms});
            return format!("{v}\n");
        }
        let why = match s.state {
            State::Finished(why) => format!(" ({why})"),
            State::Running | State::Stopped => String::new(),
        };
        let next = s.next_ms.map_or_else(String::new, |n| format!(", next fault at {n} ms"));
        format!(
            "{}{why}: {}; {} ms elapsed, {} injected, {} skipped{next}\n",
            s.state.name(),
            log::describe(run.chaos.params()),
            s.elapsed_ms,
            s.injected,
            s.skipped
        )
    }

    fn stop(&self, device: &T3, json: bool) -> Result<String, ChaosError> {
        let (injected, skipped) = {
            let mut slot = lock(&self.shared.slot);
            let run = slot.run.as_mut().ok_or(ChaosError::NeverStarted)?;
            run.drive(device, true);
            let s = run.chaos.status(0);
            slot.quit = true;
            (s.injected, s.skipped)
        };
        self.shared.wake.notify_all();
        self.end_thread();
        Ok(if json {
            format!("{}\n", json!({"chaos": "stopped", "injected": injected, "skipped": skipped}))
        } else {
            format!("chaos stopped: {injected} injected, {skipped} skipped\n")
        })
    }

    fn log(&self, json: bool) -> String {
        let slot = lock(&self.shared.slot);
        let params = slot.run.as_ref().map(|r| r.chaos.params());
        let entries = slot.run.as_ref().map_or(&[][..], |r| r.chaos.entries());
        if json {
            format!("{}\n", log::json(params, entries))
        } else {
            log::text(params, entries)
        }
    }

    /// Ends the run's thread, if any, and waits for it (it is asleep or
    /// about to be: its longest step is one poll).
    fn end_thread(&self) {
        lock(&self.shared.slot).quit = true;
        self.shared.wake.notify_all();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

/// `chaos start`'s answer.
fn started(params: &Params, replay: bool, file: Option<&std::path::Path>, json: bool) -> String {
    if json {
        let kinds: Vec<&str> = params.kinds.iter().map(|k| k.name()).collect();
        let v = json!({"chaos": "started", "seed": params.seed, "rate": params.rate.per_s(), "kinds": kinds,
                       "ports": params.ports, "duration_s": params.duration_s, "max_faults": params.max_faults,
                       "replay": replay});
        return format!("{v}\n");
    }
    match file {
        Some(file) => format!("chaos replaying {}: {}\n", file.display(), log::describe(params)),
        None => format!("chaos started: {}\n", log::describe(params)),
    }
}

/// The run's thread: poll, sleep until the next deadline, again.
fn drive(shared: &Shared, device: &Weak<T3>) {
    let mut slot = lock(&shared.slot);
    loop {
        if slot.quit {
            return;
        }
        let Some(device) = device.upgrade() else { return };
        let Some(run) = slot.run.as_mut() else { return };
        run.drive(&device, false);
        let at_ms = run.at_ms(device.now());
        let Some(wake) = run.chaos.next_wake(at_ms) else { return };
        drop(device);
        let sleep = Duration::from_millis(wake.saturating_sub(at_ms).max(1));
        slot = shared.wake.wait_timeout(slot, sleep).unwrap_or_else(PoisonError::into_inner).0;
    }
}
