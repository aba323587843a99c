//! Connection set-up between two engines (or an engine and a raw peer):
//! the ULP's reject with private data, a SYN nobody answers, an MPA reply
//! that never comes, a request for markers refused by the engine itself,
//! and the initiator's RTR held for `rtr_hold`.

use super::*;

#[test]
fn rejected_by_the_ulp() {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    sim.start_connect(1, 2, 40_000, QpConfig::new(PD));
    assert!(sim.run_until(Duration::from_secs(5), |s| s.b.connect_request().is_some()));
    let conn = sim.b.connect_request().unwrap();
    match &sim.b.events[0].kind {
        EventKind::ConnectRequest(request) => {
            assert_eq!(request.private_data, b"qpn:2");
            assert_eq!((request.revision, request.ird, request.ord), (2, Some(16), Some(16)));
            assert_eq!(request.tuple.remote, SocketAddrV4::new(IPS[0], 40_000));
        }
        other => panic!("{other:?}"),
    }
    sim.b.engine.reject(conn, b"no thanks").unwrap();
    settle(&mut sim, 5);
    let events = sim.a.qp_events(1);
    assert_eq!(
        others(&events),
        vec![EventKind::ConnectFailed(ConnectFailure::Rejected { private_data: b"no thanks".to_vec() })]
    );
    assert_eq!(states(&events), vec![(QpState::Idle, QpState::Error)]);
    assert_eq!(sim.b.state(2), Some(QpState::Idle), "B's QP was never involved");
    // The QP can be reset and used again.
    let now = sim.now;
    sim.a.engine.modify_qp(now, 1, QpState::Idle).unwrap();
    sim.b.events.clear();
    assert!(sim.connect_qps(1, 2, 40_001, QpConfig::new(PD)));
}

#[test]
fn nobody_answers_the_syn() {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    sim.wire.cut = [true, true];
    sim.start_connect(1, 2, 40_000, QpConfig::new(PD));
    settle(&mut sim, 120);
    assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::ConnectFailed(ConnectFailure::Tcp(CloseReason::Timeout))]);
    assert_eq!(sim.a.state(1), Some(QpState::Error));
}

#[test]
fn mpa_reply_never_comes() {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    sim.start_connect(1, 2, 40_000, QpConfig::new(PD));
    // B's ULP never answers the request.
    assert!(sim.run_until(Duration::from_secs(5), |s| s.b.connect_request().is_some()));
    let asked = sim.now;
    assert!(sim.run_until(Duration::from_secs(30), |s| s.a.state(1) == Some(QpState::Error)));
    assert!(sim.now >= asked + Duration::from_secs(9), "MPA timeout is 10 s");
    assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::ConnectFailed(ConnectFailure::MpaTimeout)]);
    settle(&mut sim, 1);
    assert!(sim.b.events.iter().any(|e| e.kind == EventKind::ConnectWithdrawn));
    let conn = sim.b.connect_request().unwrap();
    assert_eq!(sim.b.engine.accept(sim.now, conn, 2, b""), Err(EngineError::NoSuchConnection));
}

#[test]
fn markers_are_refused_with_a_reject_reply() {
    let raw = TcpConfig::new(MACS[0], IPS[0]);
    let mpa = negotiation::Config { revision: 1, ..negotiation::Config::default() };
    let mut sim = Sim::new(
        RawPeer::new(raw, crate::sim::START),
        Node::new(1, NodeConfig::new(1), crate::sim::START),
        WireConfig::default(),
    );
    sim.b.engine.listen(PORT, 4).unwrap();
    let now = sim.now;
    sim.a.connect(now, 40_000, SocketAddrV4::new(IPS[1], PORT), MACS[1], mpa, b"");
    // Hand-made request asking for markers: replace the initiator's by raw bytes.
    settle_raw(&mut sim, |raw| raw.negotiated.is_some());
    assert!(sim.a.negotiated.is_none(), "no reply without an accept");
    let conn = sim.b.connect_request().unwrap();
    sim.b.engine.reject(conn, b"").unwrap();
    settle_raw(&mut sim, |raw| raw.rejected);
    assert!(sim.a.rejected);

    // Markers: the engine refuses by itself.
    let mut sim = Sim::new(
        RawPeer::new(TcpConfig::new(MACS[0], IPS[0]), crate::sim::START),
        Node::new(1, NodeConfig::new(1), crate::sim::START),
        WireConfig::default(),
    );
    sim.b.engine.listen(PORT, 4).unwrap();
    sim.a.connect(crate::sim::START, 40_000, SocketAddrV4::new(IPS[1], PORT), MACS[1], mpa, b"");
    let mut request = [0u8; 20];
    crate::wire::mpa::Repr {
        kind: crate::wire::mpa::FrameKind::Request,
        markers: true,
        crc: true,
        reject: false,
        revision: 1,
        enhanced: None,
        private_data: &[],
    }
    .emit(&mut crate::wire::mpa::Frame::new_unchecked(&mut request[..]))
    .unwrap();
    sim.a.disable_mpa();
    sim.a.send(&request);
    sim.run_for(Duration::from_secs(2));
    let refused = sim
        .b
        .events
        .iter()
        .any(|e| matches!(e.kind, EventKind::ConnectRefused { refusal: Some(negotiation::Refusal::Markers), .. }));
    assert!(refused, "{:?}", sim.b.events);
    // The reply has R set.
    assert!(sim.a.raw_received().len() >= 20);
    assert_eq!(sim.a.raw_received()[16] & 0x20, 0x20);
}

fn settle_raw(sim: &mut Sim<RawPeer, Node>, done: impl Fn(&RawPeer) -> bool) {
    sim.run_until(Duration::from_secs(5), |s| done(&s.a));
}

#[test]
fn initiator_holds_its_rtr_for_rtr_hold() {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    assert!(sim.connect_qps(1, 2, 40_000, QpConfig::new(PD)));
    let hold = EngineConfig::default().rtr_hold;
    sim.run_for(hold / 2);
    assert_eq!(sim.b.engine.stats().fpdus_rx, 0, "RTR sent within the hold");
    sim.run_for(hold);
    assert_eq!(sim.b.engine.stats().fpdus_rx, 1, "RTR not sent after the hold");
}
