//! A poll services the QPs with work only: 20 connected pairs go quiet,
//! a post wakes its QP alone, the peer's data wakes the receiver alone,
//! and both go quiet again once the message is through.

use super::*;

const PAIRS: u32 = 20;

fn idle_pairs() -> Sim<Node, Node> {
    let mut sim = connected_pairs(PAIRS);
    settle_rtr(&mut sim);
    settle(&mut sim, 1);
    sim
}

#[test]
fn only_qps_with_work_are_serviced() {
    let mut sim = idle_pairs();
    assert_eq!(sim.a.engine.active_qps(), 0, "connected and idle: nothing to service");
    assert_eq!(sim.b.engine.active_qps(), 0);

    post_recv(&mut sim.b, 107, 70);
    post_send(&mut sim.a, 7, 7, 100).unwrap();
    assert_eq!(sim.a.engine.active_qps(), 1, "the post woke its QP");
    assert_eq!(sim.b.engine.active_qps(), 1, "so did the receive");

    assert!(
        sim.run_until(Duration::from_secs(5), |sim| { sim.a.completions.len() == 1 && sim.b.completions.len() == 1 })
    );
    assert_eq!((sim.a.completions[0].qpn, sim.a.completions[0].wr_id), (7, 7));
    assert_eq!((sim.b.completions[0].qpn, sim.b.completions[0].wr_id), (107, 70));
    assert_eq!(sim.b.completions[0].status, WcStatus::Success);
    settle(&mut sim, 1);
    assert_eq!(sim.a.engine.active_qps(), 0, "quiet again");
    assert_eq!(sim.b.engine.active_qps(), 0);
    for i in 0..PAIRS {
        assert_eq!(sim.a.state(1 + i), Some(QpState::Rts));
        assert_eq!(sim.b.state(101 + i), Some(QpState::Rts));
    }
}
