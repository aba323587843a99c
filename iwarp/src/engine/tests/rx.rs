//! The receive step of a QP's poll: an FPDU that fails its CRC check is
//! a local error at the receiver, which sends a TERMINATE saying so.

use super::*;

#[test]
fn corrupted_crc_is_a_local_error_at_the_peer() {
    let mut sim = pair();
    let (stag, iova) = registered_buffer(&mut sim.a, 4096);
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::CorruptCrc).unwrap();
    let mut wr = SendWr::new(1, SendOpcode::Write);
    wr.sges = SgeList::single(Sge { addr: iova, length: 10, lkey: stag });
    sim.a.engine.post_send(1, wr).unwrap();
    settle(&mut sim, 5);
    assert_eq!(
        others(&sim.b.qp_events(2)),
        vec![EventKind::LocalError { error: ProtocolError::Crc, sent: TermCode::LlpCrcError }]
    );
    assert_eq!(
        others(&sim.a.qp_events(1)),
        vec![EventKind::TerminateReceived { code: TermCode::LlpCrcError, class: ErrorClass::Catastrophic }]
    );
}
