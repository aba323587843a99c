//! Shared receive queues on the simulated wire: B's QPs 11 and 12 share
//! SRQ 5 and are connected to A's QPs 1 and 2.

use super::*;

const SRQ: u32 = 5;

fn srq_pair() -> Sim<Node, Node> {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    sim.b.engine.create_srq(SRQ, 4, 0).unwrap();
    let mut shared = QpConfig::new(PD);
    shared.srq = Some(SRQ);
    for (a, b, port) in [(1, 11, 40_000), (2, 12, 40_001)] {
        sim.b.engine.create_qp(b, shared).unwrap();
        assert!(sim.connect_qps(a, b, port, QpConfig::new(PD)));
    }
    settle_rtr(&mut sim);
    sim.a.events.clear();
    sim.b.events.clear();
    sim
}

fn post_srq(sim: &mut Sim<Node, Node>, wr_id: u64) {
    let (stag, iova) = registered_buffer(&mut sim.b, 64 * 1024);
    let sges = SgeList::single(Sge { addr: iova, length: 64 * 1024, lkey: stag });
    sim.b.engine.post_srq_recv(SRQ, RecvWr { wr_id, sges }).unwrap();
}

fn send(sim: &mut Sim<Node, Node>, qpn: u32, len: u32) {
    let (stag, iova) = registered_buffer(&mut sim.a, 64 * 1024);
    let mut wr = SendWr::new(u64::from(qpn), SendOpcode::Send);
    wr.sges = SgeList::single(Sge { addr: iova, length: len, lkey: stag });
    sim.a.engine.post_send(qpn, wr).unwrap();
}

fn receives(node: &Node) -> Vec<(u32, u64, WcStatus, Option<u32>)> {
    node.completions
        .iter()
        .filter(|c| c.queue == WorkQueue::Recv)
        .map(|c| (c.qpn, c.wr_id, c.status, c.srq_idx))
        .collect()
}

#[test]
fn qps_take_in_srq_order_and_an_error_leaves_the_rest() {
    let mut sim = srq_pair();
    for wr_id in [100, 101, 102] {
        post_srq(&mut sim, wr_id);
    }
    send(&mut sim, 2, 10);
    settle(&mut sim, 1);
    send(&mut sim, 1, 10);
    settle(&mut sim, 1);
    let ok = WcStatus::Success;
    assert_eq!(receives(&sim.b), vec![(12, 100, ok, Some(0)), (11, 101, ok, Some(1))]);
    assert_eq!(sim.b.engine.srq_taken(SRQ), Some(2));
    // QP 11 is reset: nothing of the SRQ is flushed or taken.
    let now = sim.now;
    sim.b.engine.inject(now, 11, Fault::SendRst).unwrap();
    settle(&mut sim, 1);
    assert_eq!(sim.b.state(11), Some(QpState::Error));
    assert_eq!(receives(&sim.b).len(), 2);
    assert_eq!(sim.b.engine.srq_pooled(SRQ), Some(1));
    send(&mut sim, 2, 10);
    settle(&mut sim, 1);
    assert_eq!(receives(&sim.b)[2], (12, 102, ok, Some(2)));
}

#[test]
fn a_message_cut_short_flushes_its_wr_on_its_qp() {
    let mut sim = srq_pair();
    post_srq(&mut sim, 100);
    post_srq(&mut sim, 101);
    send(&mut sim, 1, 60_000);
    assert!(sim.run_until(Duration::from_secs(2), |sim| sim.b.engine.srq_taken(SRQ) == Some(1)));
    assert!(receives(&sim.b).is_empty(), "still receiving");
    let now = sim.now;
    sim.b.engine.modify_qp(now, 11, QpState::Error).unwrap();
    sim.run_for(Duration::from_millis(1));
    assert_eq!(receives(&sim.b), vec![(11, 100, WcStatus::WrFlushErr, Some(0))]);
    send(&mut sim, 2, 10);
    settle(&mut sim, 1);
    assert_eq!(receives(&sim.b)[1], (12, 101, WcStatus::Success, Some(1)));
}

#[test]
fn srq_calls_are_checked() {
    let mut sim = srq_pair();
    let e = &mut sim.b.engine;
    let wr = RecvWr { wr_id: 1, sges: SgeList::EMPTY };
    assert!(matches!(e.post_recv(11, wr), Err(EngineError::InvalidState { .. })));
    assert_eq!(e.destroy_srq(SRQ), Err(EngineError::SrqBusy(SRQ)));
    assert_eq!(e.create_srq(SRQ, 4, 0), Err(EngineError::SrqExists(SRQ)));
    assert!(e.create_srq(6, 0, 0).is_err());
    let mut orphan = QpConfig::new(PD);
    orphan.srq = Some(99);
    assert_eq!(e.create_qp(20, orphan), Err(EngineError::NoSuchSrq(99)));
    for _ in 0..4 {
        e.post_srq_recv(SRQ, wr).unwrap();
    }
    assert_eq!(e.post_srq_recv(SRQ, wr), Err(EngineError::QueueFull));
    e.destroy_qp(11).unwrap();
    e.destroy_qp(12).unwrap();
    e.destroy_srq(SRQ).unwrap();
    assert_eq!(e.srq_taken(SRQ), None);
}

#[test]
fn a_resized_srq_pools_more_and_keeps_its_order() {
    let mut sim = srq_pair();
    for wr_id in 100..104 {
        post_srq(&mut sim, wr_id);
    }
    let full = RecvWr { wr_id: 1, sges: SgeList::EMPTY };
    let e = &mut sim.b.engine;
    assert_eq!(e.post_srq_recv(SRQ, full), Err(EngineError::QueueFull));
    assert!(e.resize_srq(SRQ, 2).is_err(), "a pool never shrinks");
    assert!(e.resize_srq(SRQ, 1 << 17).is_err());
    assert_eq!(e.resize_srq(99, 8), Err(EngineError::NoSuchSrq(99)));
    e.resize_srq(SRQ, 8).unwrap();
    for wr_id in 104..108 {
        post_srq(&mut sim, wr_id);
    }
    assert_eq!(sim.b.engine.srq_pooled(SRQ), Some(8));
    for (i, qpn) in [1, 2, 1, 2, 1, 2, 1, 2].into_iter().enumerate() {
        send(&mut sim, qpn, 10);
        settle(&mut sim, 1);
        let got = receives(&sim.b);
        assert_eq!(got.len(), i + 1);
        let want = (qpn + 10, 100 + i as u64, WcStatus::Success, Some(i as u32));
        assert_eq!(got[i], want, "WR {i} after the resize");
    }
}
