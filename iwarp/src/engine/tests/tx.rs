//! The transmit step of a QP's poll: a send WQE that fails its checks
//! completes in error, the QP goes to ERROR through TERMINATE, and the
//! peer's TERMINATE says the error is ours.

use super::*;

#[test]
fn bad_local_wqe_completes_in_error() {
    let mut sim = pair();
    let mut wr = SendWr::new(5, SendOpcode::Send);
    wr.sges = SgeList::single(Sge { addr: 0, length: 10, lkey: 0x4242 });
    sim.a.engine.post_send(1, wr).unwrap();
    settle(&mut sim, 5);
    assert_eq!(sim.a.completions.len(), 1);
    assert_eq!((sim.a.completions[0].wr_id, sim.a.completions[0].status), (5, WcStatus::LocProtErr));
    assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::WqeError { wr_id: 5, status: WcStatus::LocProtErr }]);
    assert_eq!(sim.a.state(1), Some(QpState::Error));
    assert_eq!(
        others(&sim.b.qp_events(2)),
        vec![EventKind::TerminateReceived { code: TermCode::RdmapLocalCatastrophic, class: ErrorClass::Catastrophic }]
    );
    // An inline READ is an operation error.
    let mut sim = pair();
    let mut wr = SendWr::new(6, SendOpcode::Read);
    wr.inline = InlineData::new(b"x");
    sim.a.engine.post_send(1, wr).unwrap();
    settle(&mut sim, 5);
    assert_eq!(sim.a.completions[0].status, WcStatus::LocQpOpErr);
}
