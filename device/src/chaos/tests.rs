//! The chaos state machine against a fake device, with injected time.

#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use std::net::SocketAddrV4;

use super::log::{self, Outcome};
use super::schedule::{parse_seed, Action, Kind, Planned, Rate, Schedule, Windows};
use super::*;
use crate::abi::QpState;

/// Connections a test sets up; what was injected; rst ends a connection.
#[derive(Default)]
struct Fake {
    conns: Vec<Connection>,
    ends: Vec<(u64, ConnEnd)>,
    injected: Vec<(u32, Fault)>,
    refuse: bool,
}

impl Fake {
    fn with(conns: &[(u64, u32, u16, u16)]) -> Self {
        Self { conns: conns.iter().map(|&(seq, qpn, l, r)| conn(seq, qpn, l, r)).collect(), ..Self::default() }
    }

    fn end(&mut self, seq: u64, how: ConnEnd) {
        self.conns.retain(|c| c.seq != seq);
        self.ends.push((seq, how));
    }
}

impl Connections for Fake {
    fn connections(&self) -> Vec<Connection> {
        self.conns.clone()
    }

    fn connection_end(&self, seq: u64) -> Option<ConnEnd> {
        self.ends.iter().find(|(s, _)| *s == seq).map(|(_, e)| *e)
    }

    fn inject(&mut self, qpn: u32, fault: Fault) -> Result<(), String> {
        if self.refuse {
            return Err(format!("QP {qpn} is CLOSING: not connected"));
        }
        self.injected.push((qpn, fault));
        if fault == Fault::SendRst {
            let seq = self.conns.iter().find(|c| c.qpn == qpn).unwrap().seq;
            self.end(seq, ConnEnd::Error);
        }
        Ok(())
    }
}

fn conn(seq: u64, qpn: u32, local_port: u16, remote_port: u16) -> Connection {
    let tuple = FourTuple {
        local: SocketAddrV4::new([10, 0, 0, 1].into(), local_port),
        remote: SocketAddrV4::new([10, 0, 0, 2].into(), remote_port),
    };
    Connection { seq, qpn, tuple, state: QpState::Rts }
}

fn params(kinds: &[Kind], ports: &[u16]) -> Params {
    Params {
        seed: Some(7),
        rate: Rate::new(1.0).unwrap(),
        kinds: kinds.to_vec(),
        ports: ports.to_vec(),
        duration_s: None,
        max_faults: None,
        windows: Windows::default(),
    }
}

/// A run of exactly these faults.
fn planned(params: Params, plan: &[(u64, Action, u64)]) -> Chaos {
    Chaos::replayed(params, plan.iter().map(|&(t_ms, action, r)| Planned { t_ms, action, r }).collect())
}

fn first(seed: u64, rate: f64, kinds: &[Kind], n: usize) -> Vec<Planned> {
    Schedule::new(seed, Rate::new(rate).unwrap(), kinds, Windows::default()).take(n).collect()
}

#[test]
fn a_seed_names_one_schedule() {
    let all = Kind::ALL;
    assert_eq!(first(42, 0.5, &all, 200), first(42, 0.5, &all, 200), "same seed, same schedule");
    assert_ne!(first(42, 0.5, &all, 20), first(43, 0.5, &all, 20), "another seed, another schedule");
    // Pinned: a change to the PRNG, its seeding or the draw order shows here.
    let pinned: Vec<(u64, &str, u64)> =
        first(42, 0.5, &Kind::DEFAULT, 4).iter().map(|p| (p.t_ms, p.action.kind().name(), p.r)).collect();
    assert_eq!(pinned, PINNED);
    // Poisson: the mean gap is 1/rate.
    let long = first(1, 2.0, &all, 4000);
    let mean_ms = long.last().unwrap().t_ms / 4000;
    assert!((450..=550).contains(&mean_ms), "mean gap {mean_ms} ms at 2/s");
    // Uniform over the kinds; drop draws its own seed, terminate a registered code.
    for kind in all {
        let n = long.iter().filter(|p| p.action.kind() == kind).count();
        assert!((400..=600).contains(&n), "{}: {n} of 4000", kind.name());
    }
    assert!(long.iter().any(|p| matches!(p.action, Action::Drop { percent: 20, window_ms: 2000, seed } if seed != 0)));
    let codes: std::collections::HashSet<_> =
        long.iter().filter_map(|p| if let Action::Terminate { code } = p.action { Some(code) } else { None }).collect();
    assert!(codes.len() > 20, "{} TERMINATE codes", codes.len());
}

const PINNED: [(u64, &str, u64); 4] = [
    (2291, "rst", 14246666336075071430),
    (3134, "delay", 5323617429756461744),
    (3459, "fin", 3031530047897583361),
    (5437, "delay", 4401121311800897944),
];

#[test]
fn r_picks_among_matching_connections_in_establishment_order() {
    // Established in the order 3, 5, 9 (seq), listed out of order; the
    // one on port 22 never matches --port 4420.
    let mut dev = Fake::with(&[(5, 2, 4420, 50001), (9, 7, 4420, 50002), (3, 11, 50000, 4420), (4, 1, 22, 50003)]);
    let mut chaos =
        planned(params(&[Kind::Rst], &[4420]), &[(10, Action::Rst, 0), (20, Action::Rst, 4), (30, Action::Rst, 1)]);
    dev.conns.sort_by_key(|c| c.seq);
    assert!(chaos.poll(30, &mut dev));
    // r = 0 -> the first (seq 3, QP 11); then 4 mod 2 = 0 of (5, 9) -> QP 2; then 1 mod 1 -> QP 7.
    let qps: Vec<u32> = dev.injected.iter().map(|(qpn, _)| *qpn).collect();
    assert_eq!(qps, [11, 2, 7]);
    let matching: Vec<u32> = chaos.entries().iter().map(|e| e.matching).collect();
    assert_eq!(matching, [3, 2, 1]);
    assert_eq!(chaos.status(30).injected, 3);
}

#[test]
fn nothing_matching_is_skipped_and_not_counted() {
    let mut dev = Fake::with(&[(1, 1, 22, 50000)]);
    let mut p = params(&[Kind::Rst], &[4420]);
    p.max_faults = Some(1);
    let mut chaos = planned(p, &[(10, Action::Rst, 5), (20, Action::Rst, 5), (30, Action::Rst, 5)]);
    chaos.poll(15, &mut dev);
    let e = &chaos.entries()[0];
    assert_eq!((e.outcome, e.hit, e.matching), (Outcome::Skipped, None, 0));
    assert!(log::text(Some(chaos.params()), chaos.entries()).contains("skipped (no matching connection)"));
    assert_eq!(chaos.state(), State::Running, "a skipped fault does not count toward --max-faults");
    dev.conns.push(conn(2, 4, 4420, 50001));
    chaos.poll(25, &mut dev);
    assert_eq!(chaos.state(), State::Finished("max faults injected"));
    let s = chaos.status(99);
    assert_eq!((s.injected, s.skipped, s.next_ms, s.elapsed_ms), (1, 1, None, 25));
    chaos.poll(40, &mut dev);
    assert_eq!(chaos.entries().len(), 2, "nothing after finishing");
    // A failed injection is logged with its error, skipped too.
    let mut dev = Fake { refuse: true, ..Fake::with(&[(1, 1, 4420, 50000)]) };
    let mut chaos = planned(params(&[Kind::Fin], &[]), &[(10, Action::Fin, 0)]);
    chaos.poll(10, &mut dev);
    let e = &chaos.entries()[0];
    assert_eq!((e.outcome, e.error.as_deref()), (Outcome::Skipped, Some("QP 1 is CLOSING: not connected")));
    assert_eq!(chaos.status(10).skipped, 1);
}

#[test]
fn a_run_finishes_at_its_duration() {
    let mut p = params(&Kind::DEFAULT, &[]);
    p.duration_s = Some(10);
    let mut chaos = Chaos::drawn(p, 1);
    let mut dev = Fake::with(&[(1, 1, 4420, 50000)]);
    dev.refuse = true; // no outcome to track: only the schedule matters
    let mut at = 0;
    while chaos.state() == State::Running {
        at = chaos.next_wake(at).unwrap();
        chaos.poll(at, &mut dev);
    }
    assert_eq!((chaos.state(), at), (State::Finished("duration reached"), 10_000));
    assert!(chaos.entries().iter().all(|e| e.planned.t_ms < 10_000));
    assert_eq!(chaos.entries().len(), first(1, 1.0, &Kind::DEFAULT, 40).iter().filter(|p| p.t_ms < 10_000).count());
    assert_eq!(chaos.status(20_000).elapsed_ms, 10_000);
    assert_eq!(chaos.next_wake(at), None, "nothing left to do");
}

#[test]
fn sticky_faults_end_with_their_window() {
    let mut dev = Fake::with(&[(1, 1, 4420, 50000), (2, 2, 4420, 50001)]);
    let delay = Action::Delay { ms: 100, window_ms: 2000 };
    let blackhole = Action::Blackhole { window_ms: 1000 };
    let mut chaos = planned(params(&Kind::ALL, &[]), &[(100, delay, 0), (200, blackhole, 1)]);
    chaos.poll(200, &mut dev);
    assert_eq!(chaos.next_wake(200), Some(250), "outcomes pending: a look every 50 ms");
    chaos.poll(1199, &mut dev);
    assert_eq!(dev.injected.len(), 2);
    chaos.poll(1200, &mut dev);
    assert_eq!(dev.injected[2], (2, Fault::Blackhole(false)));
    assert_eq!(chaos.entries()[1].off_ms, Some(1200));
    chaos.poll(2100, &mut dev);
    assert_eq!(dev.injected[3], (1, Fault::Delay(None)));
    assert_eq!(chaos.entries()[0].off_ms, Some(2100));
    // Both still up a second after their window: survived.
    chaos.poll(3100, &mut dev);
    let outcomes: Vec<Outcome> = chaos.entries().iter().map(|e| e.outcome).collect();
    assert_eq!(outcomes, [Outcome::Survived, Outcome::Survived]);
    assert_eq!(chaos.next_wake(3100), None);

    // Stopped inside a window: turned off at once; a connection gone
    // took its fault with it.
    let mut dev = Fake::with(&[(1, 1, 4420, 50000), (2, 2, 4420, 50001)]);
    let split = Action::Split { tail: 2, hold_ms: 20, window_ms: 2000 };
    let mut chaos = planned(params(&Kind::ALL, &[]), &[(0, split, 0), (0, split, 1), (5000, Action::Rst, 0)]);
    chaos.poll(10, &mut dev);
    dev.end(2, ConnEnd::Error);
    assert!(chaos.stop(500, &mut dev));
    assert_eq!(dev.injected[2..], [(1, Fault::Split(None))]);
    assert_eq!((chaos.entries()[0].off_ms, chaos.entries()[1].off_ms), (Some(500), None));
    assert_eq!(chaos.status(900).state, State::Stopped);
    assert_eq!(chaos.status(900).elapsed_ms, 500);
    assert_eq!(chaos.next_wake(900), None);
}

#[test]
fn outcomes_err_closed_recovered_survived() {
    // 1: rst on the client's connection 10.0.0.1:50000 -> :4420; it
    //    reconnects from another port: recovered.
    // 2: fin on QP 2, which closes in order: closed.
    // 3: corrupt-crc on QP 3, whose peer TERMINATEs: err.
    // 4: delay on QP 4 that stays up: survived.
    let mut dev = Fake::with(&[(1, 1, 50000, 4420), (2, 2, 50001, 4420), (3, 3, 50002, 4420), (4, 4, 50003, 4420)]);
    let delay = Action::Delay { ms: 100, window_ms: 500 };
    let plan = [(10, Action::Rst, 0), (20, Action::Fin, 0), (30, Action::CorruptCrc, 1), (40, delay, 2)];
    let mut chaos = planned(params(&Kind::ALL, &[4420]), &plan);
    chaos.poll(40, &mut dev);
    let outcome = |c: &Chaos| c.entries().iter().map(|e| e.outcome).collect::<Vec<_>>();
    use Outcome::{Closed, Err, Pending, Recovered, Survived};
    assert_eq!(outcome(&chaos), [Err, Pending, Pending, Pending]);
    dev.end(2, ConnEnd::Closed);
    dev.end(3, ConnEnd::Error);
    chaos.poll(100, &mut dev);
    assert_eq!(outcome(&chaos), [Err, Closed, Err, Pending]);
    // A new connection on the other service port is no recovery; one to
    // the same service (4420) from a new ephemeral port is.
    dev.conns.push(conn(5, 9, 50010, 7174));
    chaos.poll(200, &mut dev);
    assert_eq!(outcome(&chaos)[0], Err);
    dev.conns.push(conn(6, 10, 50011, 4420));
    chaos.poll(300, &mut dev);
    assert_eq!(outcome(&chaos), [Recovered, Recovered, Recovered, Pending]);
    chaos.poll(1540, &mut dev);
    assert_eq!(outcome(&chaos)[3], Survived);
    let json = log::json(Some(chaos.params()), chaos.entries());
    assert_eq!(json["faults"][0]["local"], "10.0.0.1:50000");
    assert_eq!(json["faults"][0]["remote"], "10.0.0.2:4420");
    assert_eq!(json["faults"][3]["outcome"], "survived");
    assert_eq!(json["faults"][3]["off_ms"], 540);
    // The rst's connection was seen ended at the first look (40), its
    // service back at 300.
    assert_eq!(
        (json["faults"][0]["ended_ms"].as_u64(), json["faults"][0]["recovered_ms"].as_u64()),
        (Some(40), Some(300))
    );
    assert_eq!(json["faults"][3]["recovered_ms"], serde_json::Value::Null);
}

#[test]
fn a_connection_up_before_the_fault_is_no_recovery() {
    // Two queues of one service; the second, up before the fault, is not
    // the first's reconnection.
    let mut dev = Fake::with(&[(1, 1, 50000, 4420), (2, 2, 50001, 4420)]);
    let mut chaos = planned(params(&[Kind::Rst], &[]), &[(10, Action::Rst, 0)]);
    chaos.poll(10, &mut dev);
    chaos.poll(500, &mut dev);
    assert_eq!(chaos.entries()[0].outcome, Outcome::Err);
    // Past the recovery window it is final: nothing left to watch.
    chaos.poll(10 + RECOVERY_MS + 1, &mut dev);
    assert_eq!(chaos.next_wake(10 + RECOVERY_MS + 1), None);
}

#[test]
fn a_log_replays_to_the_same_schedule() {
    let mut p = params(&Kind::ALL, &[4420, 7174]);
    p.max_faults = Some(50);
    p.duration_s = Some(3600);
    let mut chaos = Chaos::drawn(p.clone(), 99);
    let mut dev = Fake::with(&[(1, 1, 4420, 50000), (2, 2, 22, 50001)]);
    chaos.poll(30_000, &mut dev);
    let text = log::json(Some(chaos.params()), chaos.entries()).to_string();
    let (replayed, plan) = log::parse_replay(&text).unwrap();
    assert_eq!(replayed, Params { windows: Windows::default(), ..p });
    let original: Vec<Planned> = chaos.entries().iter().map(|e| e.planned).collect();
    assert!(original.len() > 10, "{} entries", original.len());
    assert_eq!(plan, original);
    // Replayed against the same connections: the same log, entry by entry.
    let mut again = Chaos::replayed(replayed, plan);
    again.poll(30_000, &mut Fake::with(&[(1, 1, 4420, 50000), (2, 2, 22, 50001)]));
    assert_eq!(again.entries(), chaos.entries());
}

#[test]
fn bad_replay_logs_are_refused_with_the_reason() {
    let good = r#"{"seed":1,"rate":0.5,"kinds":["rst","delay"],"ports":[4420],"duration_s":null,"max_faults":null,
        "faults":[{"t_ms":5,"kind":"delay","params":{"ms":100,"window_ms":2000},"r":18446744073709551615}]}"#;
    let (params, plan) = log::parse_replay(good).unwrap();
    assert_eq!(params.seed, Some(1));
    assert_eq!(plan[0], Planned { t_ms: 5, action: Action::Delay { ms: 100, window_ms: 2000 }, r: u64::MAX });
    for (bad, why) in [
        ("", "empty"),
        ("[1]", "not a JSON object"),
        ("{\"seed\":", "not JSON"),
        (&good.replace("\"rate\":0.5", "\"rate\":0"), "rate 0 is not"),
        (&good.replace("\"seed\":1", "\"seed\":-1"), "seed -1 is not a u64"),
        (&good.replace("[\"rst\",\"delay\"]", "[\"melt\"]"), "unknown kind \"melt\""),
        (&good.replace("[4420]", "[0]"), "port 0 is not 1-65535"),
        (&good.replace("[4420]", "[65536]"), "port 65536"),
        (&good.replace("\"ms\":100", "\"ms\":0"), "params.ms of delay: 0 is not"),
        (&good.replace("\"ms\":100", "\"ms\":100,\"tail\":1"), "delay has no parameter \"tail\""),
        (&good.replace("\"kind\":\"delay\"", "\"kind\":\"rst\""), "rst has no parameter"),
        (&good.replace("\"kind\":\"delay\"", "\"kind\":\"fin\""), "fin has no parameter"),
        (
            &good.replace("18446744073709551615", "18446744073709551616"),
            "faults[0]: r 1.8446744073709552e+19 is not a u64",
        ),
        (&good.replace(r#""faults":[{"#, r#""faults":[{"t_ms":9,"kind":"rst","params":{},"r":1},{"#), "before"),
        (&good.replace("[\"rst\",\"delay\"]", "[\"rst\"]"), "kind delay is not in kinds"),
        (&good.replace(r#"[{"t_ms""#, r#"[],"x":[{"t_ms""#), "no faults to replay"),
    ] {
        let err = log::parse_replay(bad).unwrap_err();
        assert!(err.contains(why), "{bad}: {err}");
    }
    let terminate = good
        .replace(
            r#""kind":"delay","params":{"ms":100,"window_ms":2000}"#,
            r#""kind":"terminate","params":{"layer":0,"etype":2,"ecode":0}"#,
        )
        .replace("\"delay\"]", "\"terminate\"]");
    assert!(log::parse_replay(&terminate).unwrap_err().contains("not an RFC 5040 TERMINATE code"));
    // A file: missing, too large.
    let dir = tempfile::tempdir().unwrap();
    let err = log::read_replay(&dir.path().join("none.json")).unwrap_err().to_string();
    assert!(err.starts_with("replay ") && err.contains("No such file"), "{err}");
    let big = dir.path().join("big.json");
    std::fs::write(&big, vec![b' '; usize::try_from(log::MAX_REPLAY_BYTES).unwrap() + 1]).unwrap();
    assert!(log::read_replay(&big).unwrap_err().to_string().contains("larger than"));
}

#[test]
fn bad_options_name_the_problem() {
    assert_eq!(parse_seed("0x10"), Ok(16));
    assert_eq!(parse_seed("18446744073709551615"), Ok(u64::MAX));
    for bad in ["-1", "18446744073709551616", "seven", ""] {
        assert!(parse_seed(bad).unwrap_err().to_string().contains("is not a seed: give a u64"), "{bad}");
    }
    assert_eq!("0.5".parse::<Rate>().unwrap().per_s(), 0.5);
    assert_eq!("100".parse::<Rate>().unwrap().per_s(), 100.0);
    for bad in ["0", "-1", "NaN", "inf", "100.5", "1e9", "fast"] {
        let err = bad.parse::<Rate>().unwrap_err().to_string();
        assert!(err.contains("is not a rate") && err.contains("at most 100"), "{bad}: {err}");
    }
    let err = "melt".parse::<Kind>().unwrap_err().to_string();
    assert_eq!(err, "unknown kind \"melt\" (valid: rst, fin, blackhole, drop, delay, split, corrupt-crc, terminate)");
    assert_eq!(Params::kinds(&[]).unwrap(), Kind::DEFAULT);
    assert_eq!(Params::kinds(&[Kind::Rst, Kind::Rst]).unwrap_err().to_string(), "kind rst is named twice in --kinds");
    for kind in Kind::ALL {
        assert_eq!(kind.name().parse::<Kind>().unwrap(), kind);
    }
}

/// A device with no guest on a unix-dgram uplink in `dir`.
fn device(dir: &std::path::Path) -> std::sync::Arc<crate::t3::T3> {
    let spec: crate::uplink::UplinkSpec =
        format!("unix-dgram:{},{}", dir.join("u").display(), dir.join("p").display()).parse().unwrap();
    std::sync::Arc::new(crate::t3::T3::new(spec.open().unwrap(), None, 1500))
}

#[test]
fn chaos_requests_over_the_management_answer() {
    let dir = tempfile::tempdir().unwrap();
    let device = device(dir.path());
    let control = Control::default();
    let ask = |line: &str| crate::mgmt::answer(line, &device, &control);
    // Never started: idle, an empty log, nothing to stop.
    assert_eq!(
        ask("--json chaos status"),
        "{\"state\":\"idle\",\"seed\":null,\"elapsed_ms\":0,\"injected\":0,\"skipped\":0,\"next_ms\":null}\n"
    );
    assert_eq!(ask("chaos log"), "no chaos run yet\n");
    assert_eq!(
        ask("chaos log --json"),
        "{\"seed\":null,\"rate\":null,\"kinds\":[],\"ports\":[],\"duration_s\":null,\"max_faults\":null,\"faults\":[]}\n"
    );
    assert_eq!(ask("chaos stop"), "error: no chaos run to stop (chaos was never started)\n");
    // Errors name the problem.
    for (line, why) in [
        ("chaos start --seed x --rate 1", "\"x\" is not a seed"),
        ("chaos start --seed 1 --rate 0", "\"0\" is not a rate"),
        ("chaos start --seed 1 --rate NaN", "\"NaN\" is not a rate"),
        ("chaos start --seed 1 --rate 101", "at most 100"),
        ("chaos start --seed 1 --rate 1 --kinds rst,melt", "unknown kind \"melt\" (valid: rst, fin,"),
        ("chaos start --seed 1 --rate 1 --kinds rst,rst", "kind rst is named twice"),
        ("chaos start --seed 1 --rate 1 --port 0", "invalid value '0' for '--port <PORT>'"),
        ("chaos start --seed 1 --rate 1 --port 65536", "invalid value '65536' for '--port <PORT>'"),
        ("chaos start --rate 1", "--seed"),
        ("chaos start --seed 1 --replay /tmp/x.json", "'--seed <SEED>' cannot be used with '--replay <LOGFILE>'"),
        ("chaos start --replay /nonexistent-vt3/log.json", "replay /nonexistent-vt3/log.json: No such file"),
    ] {
        let answer = ask(line);
        assert!(answer.starts_with("error: ") && answer.contains(why), "{line}: {answer}");
    }
    let empty = dir.path().join("empty.json");
    std::fs::write(&empty, "").unwrap();
    assert!(ask(&format!("chaos start --replay {}", empty.display())).contains("empty (want the JSON"));

    // A run on a device without connections: every fault skipped.
    let started =
        ask("chaos start --seed 0x2a --rate 100 --kinds rst,drop --port 4420 --port 7174 --max-faults 3 --json");
    assert_eq!(
        started,
        "{\"chaos\":\"started\",\"seed\":42,\"rate\":100.0,\"kinds\":[\"rst\",\"drop\"],\"ports\":[4420,7174],\
         \"duration_s\":null,\"max_faults\":3,\"replay\":false}\n"
    );
    assert_eq!(ask("chaos start --seed 1 --rate 1"), "error: chaos is running: chaos stop first\n");
    std::thread::sleep(std::time::Duration::from_millis(100));
    let status: serde_json::Value = serde_json::from_str(&ask("chaos status --json")).unwrap();
    assert_eq!((status["state"].as_str(), status["seed"].as_u64()), (Some("running"), Some(42)));
    assert!(status["skipped"].as_u64().unwrap() > 0 && status["next_ms"].is_u64(), "{status}");
    let stopped: serde_json::Value = serde_json::from_str(&ask("--json chaos stop")).unwrap();
    assert_eq!((stopped["chaos"].as_str(), stopped["injected"].as_u64()), (Some("stopped"), Some(0)));
    assert!(ask("chaos status").starts_with("stopped: seed 42, rate 100/s, kinds rst,drop, ports 4420,7174"));
    assert!(ask("chaos stop").starts_with("chaos stopped: 0 injected"), "stop is idempotent once started");
    let text = ask("chaos log");
    assert!(text.starts_with("chaos seed 42, rate 100/s") && text.contains("(no matching connection)"), "{text}");

    // Its log replays: the same schedule (nothing matches again).
    let log = ask("chaos log --json");
    let file = dir.path().join("log.json");
    std::fs::write(&file, &log).unwrap();
    let replay = ask(&format!("--json chaos start --replay {}", file.display()));
    assert!(replay.contains("\"seed\":42") && replay.ends_with("\"replay\":true}\n"), "{replay}");
    let logged: serde_json::Value = serde_json::from_str(&log).unwrap();
    let n = logged["faults"].as_array().unwrap().len();
    for _ in 0..100 {
        if ask("--json chaos status").contains("\"finished\"") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(ask("chaos status").starts_with("finished (replay done)"), "{}", ask("chaos status"));
    let again: serde_json::Value = serde_json::from_str(&ask("chaos log --json")).unwrap();
    assert_eq!(again["faults"], logged["faults"]);
    assert_eq!(again["faults"].as_array().unwrap().len(), n);
}
