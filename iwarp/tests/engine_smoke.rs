//! The shortest end-to-end path: connect, SEND, WRITE, READ, close.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod support;

use support::*;
use vt3_iwarp::engine::*;
use vt3_iwarp::sim::*;
use vt3_iwarp::toe::Duration;

#[test]
fn send_write_read_over_a_clean_wire() {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    let config = QpConfig::new(PD);
    assert!(sim.connect_qps(1, 2, 40_000, config), "{:?} {:?}", sim.a.events, sim.b.events);
    let mut rng = Rng::new(3);
    let mut arena_a = Arena::new(0, 1 << 20);
    let mut arena_b = Arena::new(0, 1 << 20);
    let all = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;
    let src = arena_a.register(&mut sim.a, all, 100_000, Some(&mut rng), 100);
    let dst = arena_b.register(&mut sim.b, all, 100_000, Some(&mut rng), 7);
    let data = random_bytes(&mut rng, 100_000);
    fill_buf(&mut sim.a, &src, 0, &data);

    // SEND into a posted receive.
    sim.b.engine.post_recv(2, recv_wr(10, &[dst.sge(0, 60_000)])).unwrap();
    sim.a.engine.post_send(1, send_wr(20, SendOpcode::Send, &[src.sge(0, 50_000)])).unwrap();
    assert!(sim.run_until(Duration::from_secs(5), |s| s.b.completions.len() == 1 && s.a.completions.len() == 1));
    let c = sim.b.completions[0];
    assert_eq!((c.wr_id, c.status, c.byte_len, c.opcode), (10, WcStatus::Success, 50_000, WcOpcode::Recv));
    assert_eq!(read_buf(&sim.b, &dst, 0, 50_000), data[..50_000]);

    // WRITE then READ back into another spot.
    sim.a.engine.post_send(1, rdma_wr(21, SendOpcode::Write, &[src.sge(0, 100_000)], &dst, 0)).unwrap();
    let back = arena_a.register(&mut sim.a, all, 100_000, None, 0);
    sim.a.engine.post_send(1, rdma_wr(22, SendOpcode::Read, &[back.sge(0, 100_000)], &dst, 0)).unwrap();
    assert!(sim.run_until(Duration::from_secs(5), |s| s.a.completions.len() == 3), "{:?}", sim.a.completions);
    assert_eq!(sim.a.completions[1].wr_id, 21);
    assert_eq!(sim.a.completions[2].wr_id, 22);
    assert_eq!(sim.a.completions[2].status, WcStatus::Success);
    assert_eq!(read_buf(&sim.b, &dst, 0, 100_000), data);
    assert_eq!(read_buf(&sim.a, &back, 0, 100_000), data);

    // Graceful close.
    let now = sim.now;
    sim.a.engine.modify_qp(now, 1, QpState::Closing).unwrap();
    assert!(
        sim.run_until(Duration::from_secs(5), |s| s.a.state(1) == Some(QpState::Idle)
            && s.b.state(2) == Some(QpState::Idle)),
        "{:?}\n{:?}",
        sim.a.events,
        sim.b.events
    );
    assert!(sim.a.qp_events(1).contains(&EventKind::CloseComplete { sq_outstanding: false }));
    assert!(sim.b.qp_events(2).contains(&EventKind::PeerClose));
}
