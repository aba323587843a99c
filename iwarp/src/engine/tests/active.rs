//! A poll services the QPs with work only: 20 connected pairs go quiet,
//! a post wakes its QP alone, the peer's data wakes the receiver alone,
//! and both go quiet again once the message is through.

use super::*;

const PAIRS: u32 = 20;

fn idle_pairs() -> Sim<Node, Node> {
    let mut sim = Sim::pair(
        NodeConfig::new(0),
        NodeConfig::new(1),
        WireConfig::default(),
    );
    for i in 0..PAIRS {
        assert!(sim.connect_qps(1 + i, 101 + i, 40_000 + i as u16, QpConfig::new(PD)));
    }
    settle_rtr(&mut sim);
    settle(&mut sim, 1);
    sim
}

#[test]
fn only_qps_with_work_are_serviced() {
    let mut sim = idle_pairs();
    assert_eq!(
        sim.a.engine.active_qps(),
        0,
        "connected and idle: nothing to service"
    );
    assert_eq!(sim.b.engine.active_qps(), 0);

    let (stag, iova) = registered_buffer(&mut sim.b, 4096);
    let sges = SgeList::single(Sge {
        addr: iova,
        length: 4096,
        lkey: stag,
    });
    sim.b
        .engine
        .post_recv(107, RecvWr { wr_id: 70, sges })
        .unwrap();
    let (stag, iova) = registered_buffer(&mut sim.a, 4096);
    let mut wr = SendWr::new(7, SendOpcode::Send);
    wr.sges = SgeList::single(Sge {
        addr: iova,
        length: 100,
        lkey: stag,
    });
    sim.a.engine.post_send(7, wr).unwrap();
    assert_eq!(sim.a.engine.active_qps(), 1, "the post woke its QP");
    assert_eq!(sim.b.engine.active_qps(), 1, "so did the receive");

    assert!(sim.run_until(Duration::from_secs(5), |sim| {
        sim.a.completions.len() == 1 && sim.b.completions.len() == 1
    }));
    assert_eq!(
        (sim.a.completions[0].qpn, sim.a.completions[0].wr_id),
        (7, 7)
    );
    assert_eq!(
        (sim.b.completions[0].qpn, sim.b.completions[0].wr_id),
        (107, 70)
    );
    assert_eq!(sim.b.completions[0].status, WcStatus::Success);
    settle(&mut sim, 1);
    assert_eq!(sim.a.engine.active_qps(), 0, "quiet again");
    assert_eq!(sim.b.engine.active_qps(), 0);
    for i in 0..PAIRS {
        assert_eq!(sim.a.state(1 + i), Some(QpState::Rts));
        assert_eq!(sim.b.state(101 + i), Some(QpState::Rts));
    }
}
