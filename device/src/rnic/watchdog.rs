//! The progress watchdog: a connected QP that has work waiting — WQEs the
//! guest posted and vt3d has not taken, WRs in the engine not completed,
//! data its TCB has to send or has received and not handed on — and makes
//! no progress for [`STALL_AFTER`] is a stall. vt3d logs it once with the
//! whole state and counts it (`rnic.stalls`): a connection that stops with
//! nothing moving is a bug of vt3's, never a state to wait out.

use std::collections::BTreeMap;

use vt3_iwarp::toe::{Duration, Instant, TcbInfo};

/// How long work may wait without progress before it is a stall.
pub const STALL_AFTER: Duration = Duration::from_secs(5);
/// How long a TCB that waits for its peer — data in flight not yet
/// acknowledged, or a closed send window — may go without progress: its
/// own timers (retransmission, zero-window probe) are in charge, and they
/// back off to TCP's largest RTO (60 s, RFC 6298 2.5) between two tries.
/// Only a TCB that stays quiet longer has lost its timer.
pub const PEER_WAIT_AFTER: Duration = Duration::from_secs(65);
/// How often the watchdog looks (it runs on the engine's timer).
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// What the watchdog reads of one QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpProgress {
    /// The guest's SQ producer index (its status page).
    pub sq_prod: u32,
    pub sq_fetched: u32,
    pub sq_consumed: u32,
    pub rq_fetched: u32,
    pub rq_consumed: u32,
    /// WRs the engine holds that have not completed.
    pub sq_outstanding: usize,
    pub reads_outstanding: usize,
    pub tcp: Option<TcpProgress>,
}

/// The moving parts of a TCB: its sequence numbers and queues, and its
/// retransmissions (a TCB retransmitting into a blackhole is at work: its
/// user timeout ends it). Keep-alives and pure ACKs are not progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpProgress {
    pub snd_una: Option<u32>,
    pub snd_nxt: Option<u32>,
    pub rcv_nxt: Option<u32>,
    /// The peer's send window (`None` before the handshake).
    pub snd_wnd: Option<u32>,
    pub retransmits: u64,
    /// Octets queued to send (unsent or unacknowledged).
    pub send_queue: usize,
    /// Octets received and not yet taken by the engine.
    pub recv_queue: usize,
}

impl TcpProgress {
    pub fn of(t: &TcbInfo) -> Self {
        Self {
            snd_una: t.snd_una,
            snd_nxt: t.snd_nxt,
            rcv_nxt: t.rcv_nxt,
            snd_wnd: t.snd_wnd,
            // Keep-alives count as retransmissions too, and are not work.
            retransmits: if t.snd_una == t.snd_nxt { 0 } else { t.retransmits },
            send_queue: t.send_queue,
            recv_queue: t.recv_queue,
        }
    }
}

impl QpProgress {
    /// What the QP's work waits for, if it has any, and how long that may
    /// take without progress before it is a stall.
    pub fn waiting_for(&self) -> Option<(&'static str, Duration)> {
        if self.sq_prod != self.sq_fetched {
            return Some(("vt3d to take posted send WQEs", STALL_AFTER));
        }
        let tcp = self.tcp;
        // Unacknowledged data or a closed window: the peer is to act, and
        // the TCB's timers keep asking it; WRs behind that data wait too.
        let peer_is_to_act = tcp.is_some_and(|t| t.snd_una != t.snd_nxt || (t.send_queue > 0 && t.snd_wnd == Some(0)));
        if self.sq_fetched != self.sq_consumed || self.sq_outstanding > 0 || self.reads_outstanding > 0 {
            if peer_is_to_act {
                return Some((
                    "the peer to acknowledge data or open its window (send WRs wait behind it)",
                    PEER_WAIT_AFTER,
                ));
            }
            return Some(("send WRs in the engine to complete", STALL_AFTER));
        }
        let tcp = tcp?;
        if tcp.send_queue > 0 {
            if peer_is_to_act {
                return Some(("the peer to acknowledge data or open its window", PEER_WAIT_AFTER));
            }
            return Some(("the TCB to send its queued data", STALL_AFTER));
        }
        if tcp.recv_queue > 0 {
            return Some(("the engine to take received data", STALL_AFTER));
        }
        None
    }
}

#[derive(Debug, Clone, Copy)]
struct Watched {
    progress: QpProgress,
    since: Instant,
    reported: bool,
}

/// A stall the watchdog found: the QP, since when, and what it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub qpn: u32,
    pub waiting_for: &'static str,
    pub for_ms: i64,
}

#[derive(Debug, Default)]
pub struct Watchdog {
    next_look: Option<Instant>,
    watched: BTreeMap<u32, Watched>,
    stalls: u64,
}

impl Watchdog {
    /// Stalls counted since vt3d started.
    pub fn stalls(&self) -> u64 {
        self.stalls
    }

    /// Whether it is time for a look.
    pub fn due(&mut self, now: Instant) -> bool {
        match self.next_look {
            Some(at) if now < at => false,
            _ => {
                self.next_look = Some(now + LOOK_EVERY);
                true
            }
        }
    }

    /// Looks at the connected QPs (`qps`: each one's progress now; QPs
    /// not named are forgotten). Returns the stalls new in this look.
    pub fn look(&mut self, now: Instant, qps: impl IntoIterator<Item = (u32, QpProgress)>) -> Vec<Stall> {
        let mut seen = BTreeMap::new();
        let mut stalls = Vec::new();
        for (qpn, progress) in qps {
            let w = match self.watched.get(&qpn) {
                Some(w) if w.progress == progress => *w,
                _ => Watched { progress, since: now, reported: false },
            };
            let mut w = w;
            if let Some((waiting_for, patience)) = progress.waiting_for() {
                if !w.reported && now - w.since >= patience {
                    w.reported = true;
                    self.stalls += 1;
                    stalls.push(Stall { qpn, waiting_for, for_ms: (now - w.since).total_millis() as i64 });
                }
            } else {
                // Idle with nothing to do is no stall: the clock restarts.
                w.since = now;
            }
            seen.insert(qpn, w);
        }
        self.watched = seen;
        stalls
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn idle() -> QpProgress {
        QpProgress {
            sq_prod: 4,
            sq_fetched: 4,
            sq_consumed: 4,
            rq_fetched: 2,
            rq_consumed: 1,
            sq_outstanding: 0,
            reads_outstanding: 0,
            tcp: Some(TcpProgress {
                snd_una: Some(10),
                snd_nxt: Some(10),
                rcv_nxt: Some(7),
                snd_wnd: Some(65_535),
                retransmits: 0,
                send_queue: 0,
                recv_queue: 0,
            }),
        }
    }

    fn at(ms: i64) -> Instant {
        Instant::from_millis(ms)
    }

    #[test]
    fn an_idle_qp_waiting_for_its_peer_is_no_stall() {
        let mut w = Watchdog::default();
        for ms in (0..60_000).step_by(500) {
            assert_eq!(w.look(at(ms), [(1, idle())]), vec![], "at {ms} ms");
        }
        assert_eq!(w.stalls(), 0);
    }

    #[test]
    fn work_that_does_not_move_is_reported_once_after_stall_after() {
        let mut w = Watchdog::default();
        let stuck = QpProgress { sq_prod: 5, ..idle() };
        assert_eq!(w.look(at(0), [(1, stuck)]), vec![]);
        assert_eq!(w.look(at(4_999), [(1, stuck)]), vec![]);
        let found = w.look(at(5_000), [(1, stuck)]);
        assert_eq!(found, vec![Stall { qpn: 1, waiting_for: "vt3d to take posted send WQEs", for_ms: 5_000 }]);
        assert_eq!(w.look(at(9_000), [(1, stuck)]), vec![], "logged once");
        assert_eq!(w.stalls(), 1);
        // Progress, then stuck again: a second stall.
        let moved = QpProgress { sq_fetched: 5, ..stuck };
        let engine_stuck = moved;
        assert_eq!(w.look(at(10_000), [(1, engine_stuck)]), vec![]);
        assert_eq!(w.look(at(15_000), [(1, engine_stuck)]).len(), 1);
        assert_eq!(w.stalls(), 2);
    }

    #[test]
    fn work_that_moves_is_no_stall() {
        let mut w = Watchdog::default();
        let mut p = QpProgress { sq_outstanding: 8, ..idle() };
        for ms in (0..60_000).step_by(1_000) {
            p.tcp = p.tcp.map(|t| TcpProgress { snd_una: t.snd_una.map(|u| u + 1000), ..t });
            assert_eq!(w.look(at(ms), [(1, p)]), vec![]);
        }
    }

    #[test]
    fn each_kind_of_waiting_work_is_seen() {
        let tcp = idle().tcp.unwrap();
        let in_flight = TcpProgress { snd_nxt: Some(50), send_queue: 40, ..tcp };
        let window_shut = TcpProgress { send_queue: 40, snd_wnd: Some(0), ..tcp };
        let peer = "the peer to acknowledge data or open its window";
        let peer_wrs = "the peer to acknowledge data or open its window (send WRs wait behind it)";
        let cases = [
            (QpProgress { sq_prod: 5, ..idle() }, "vt3d to take posted send WQEs", STALL_AFTER),
            (QpProgress { sq_consumed: 3, ..idle() }, "send WRs in the engine to complete", STALL_AFTER),
            (QpProgress { reads_outstanding: 1, ..idle() }, "send WRs in the engine to complete", STALL_AFTER),
            (QpProgress { sq_outstanding: 1, tcp: Some(in_flight), ..idle() }, peer_wrs, PEER_WAIT_AFTER),
            (
                QpProgress { tcp: Some(TcpProgress { send_queue: 100, ..tcp }), ..idle() },
                "the TCB to send its queued data",
                STALL_AFTER,
            ),
            (QpProgress { tcp: Some(in_flight), ..idle() }, peer, PEER_WAIT_AFTER),
            (QpProgress { tcp: Some(window_shut), ..idle() }, peer, PEER_WAIT_AFTER),
            (
                QpProgress { tcp: Some(TcpProgress { recv_queue: 9, ..tcp }), ..idle() },
                "the engine to take received data",
                STALL_AFTER,
            ),
        ];
        for (p, want, patience) in cases {
            assert_eq!(p.waiting_for(), Some((want, patience)), "{p:?}");
        }
        assert_eq!(idle().waiting_for(), None);
    }

    #[test]
    fn a_tcb_retransmitting_into_silence_is_no_stall_until_its_timer_is_lost() {
        // The peer stopped answering: smoltcp backs its retransmissions off
        // (1, 2, 4 ... 60 s apart); between two of them nothing moves.
        let mut w = Watchdog::default();
        let tcp = TcpProgress { snd_nxt: Some(50), send_queue: 40, ..idle().tcp.unwrap() };
        let mut p = QpProgress { tcp: Some(tcp), ..idle() };
        let mut retransmit_at = 1_000;
        let mut gap = 1_000;
        let mut last_retransmit = 0;
        for ms in (0..200_000).step_by(500) {
            if ms == retransmit_at {
                last_retransmit = ms;
                p.tcp = p.tcp.map(|t| TcpProgress { retransmits: t.retransmits + 1, ..t });
                gap = (gap * 2).min(60_000);
                retransmit_at += gap;
            }
            assert_eq!(w.look(at(ms), [(1, p)]), vec![], "at {ms} ms");
        }
        // A TCB whose timer never fires again is a stall, after PEER_WAIT_AFTER.
        let quiet_from = last_retransmit;
        assert_eq!(w.look(at(quiet_from + 60_000), [(1, p)]), vec![]);
        assert_eq!(w.look(at(quiet_from + 66_000), [(1, p)]).len(), 1);
    }

    #[test]
    fn a_qp_gone_is_forgotten() {
        let mut w = Watchdog::default();
        let stuck = QpProgress { sq_prod: 5, ..idle() };
        w.look(at(0), [(1, stuck)]);
        w.look(at(4_000), []);
        assert_eq!(w.look(at(6_000), [(1, stuck)]), vec![], "its clock restarted");
    }
}
