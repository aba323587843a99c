//! `vt3d ctl chaos` against a real connection: the run's state machine
//! driven by the simulation's time, injecting through guest a's RNIC.

use super::*;
use vt3d::chaos::log::Outcome;
use vt3d::chaos::schedule::{Action, Kind, Planned, Rate, Windows};
use vt3d::chaos::{Chaos, OnRnic, Params, State};
use vt3d::rnic::conns::ConnEnd;

#[test]
fn a_chaos_run_delays_then_resets_a_live_connection() {
    let mut s = setup(16);
    connect(&mut s);
    let conns = s.sim.a.dev.rnic.connections();
    assert_eq!(conns.len(), 1);
    assert_eq!((conns[0].qpn, conns[0].tuple.local.port(), conns[0].tuple.remote.port()), (s.qa.qpn, 40_001, PORT));
    let params = Params {
        seed: Some(1),
        rate: Rate::new(1.0).unwrap(),
        kinds: vec![Kind::Delay, Kind::Rst],
        ports: vec![PORT],
        duration_s: None,
        max_faults: None,
        windows: Windows::default(),
    };
    let delay = Action::Delay { ms: 50, window_ms: 500 };
    let plan = vec![Planned { t_ms: 100, action: delay, r: 7 }, Planned { t_ms: 2000, action: Action::Rst, r: 3 }];
    let mut chaos = Chaos::replayed(params, plan);
    let start = s.sim.now;
    let mut delayed_while_open = false;
    while s.sim.now < start + Duration::from_millis(2500) {
        let now = s.sim.now;
        let at_ms = u64::try_from((now.total_micros() - start.total_micros()) / 1000).unwrap();
        chaos.poll(at_ms, &mut OnRnic { rnic: &mut s.sim.a.dev.rnic, now });
        if (150..600).contains(&at_ms) {
            let mut delay = None;
            s.sim.a.dev.rnic.for_each_tcb(&mut |t| delay = delay.or(t.delay));
            delayed_while_open |= delay.is_some();
        }
        s.sim.run_until(Duration::from_millis(10), |_| false);
    }
    assert!(delayed_while_open, "the delay was on during its window");
    let mut delay = None;
    s.sim.a.dev.rnic.for_each_tcb(&mut |t| delay = delay.or(t.delay));
    assert_eq!(delay, None, "and off after it");
    let entries = chaos.entries();
    assert_eq!((entries[0].off_ms, entries[0].outcome), (Some(600), Outcome::Survived));
    assert_eq!(entries[1].outcome, Outcome::Err);
    assert_eq!(entries.iter().map(|e| (e.matching, e.hit.unwrap().qpn)).collect::<Vec<_>>(), [(1, s.qa.qpn); 2]);
    assert_eq!(chaos.state(), State::Finished("replay done"));
    // Counted as vt3d ctl fault counts; the peer saw the reset.
    let stats = s.sim.a.dev.rnic.fault_stats();
    assert_eq!((stats.delay, stats.rst, stats.refused), (2, 1, 0), "the delay on, then off");
    assert!(s.sim.a.dev.rnic.connections().is_empty());
    assert_eq!(s.sim.a.dev.rnic.connection_end(conns[0].seq), Some(ConnEnd::Error));
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::Reset as u32, 0)]);
}
