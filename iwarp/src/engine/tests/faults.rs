//! Fault injection (`vt3d ctl fault …`): for each fault, the events at both
//! ends (docs/architecture.md §5) and no completion once a QP reported its
//! end.

use super::*;

/// A pair whose TCP gives up after 15 s of silence (vt3d's default).
fn pair_with_timeout(secs: u64) -> Sim<Node, Node> {
    let mut configs = [NodeConfig::new(0), NodeConfig::new(1)];
    for c in &mut configs {
        c.tcp.set_user_timeout(Duration::from_secs(secs));
    }
    let mut sim = Sim::pair(configs[0], configs[1], WireConfig::default());
    assert!(sim.connect_qps(1, 2, 40_000, QpConfig::new(PD)));
    settle_rtr(&mut sim);
    sim.a.events.clear();
    sim.b.events.clear();
    sim
}

fn completions_of(node: &Node, qpn: u32) -> usize {
    node.completions.iter().filter(|c| c.qpn == qpn).count()
}

/// Once `qpn` reported its end, nothing completes on it any more,
/// whatever the peer still sends and however long we wait.
fn quiet_after_end(sim: &mut Sim<Node, Node>, on_a: bool) {
    let (node, qpn) = if on_a { (&mut sim.a, 1) } else { (&mut sim.b, 2) };
    let before = completions_of(node, qpn);
    assert_eq!(node.state(qpn), Some(QpState::Error));
    assert!(
        matches!(
            node.engine.post_recv(qpn, RecvWr { wr_id: 99, sges: SgeList::EMPTY }),
            Err(EngineError::InvalidState { .. })
        ),
        "posts are refused in ERROR"
    );
    let peer = if on_a { &mut sim.b } else { &mut sim.a };
    let peer_qpn = if on_a { 2 } else { 1 };
    let _ = post_send(peer, peer_qpn, 77, 100);
    settle(sim, 3);
    let node = if on_a { &sim.a } else { &sim.b };
    assert_eq!(completions_of(node, qpn), before, "a completion after the end");
}

#[test]
fn rst_resets_the_peer_and_ends_ours() {
    let mut sim = pair();
    post_recv(&mut sim.a, 1, 1);
    post_recv(&mut sim.b, 2, 2);
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::SendRst).unwrap();
    // Ours ends at once, without waiting for the wire.
    assert_eq!(sim.a.state(1), Some(QpState::Error));
    settle(&mut sim, 1);
    assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::ResetSent]);
    assert_eq!(states(&sim.a.qp_events(1)), vec![(QpState::Rts, QpState::Error)]);
    assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Reset]);
    assert_eq!(states(&sim.b.qp_events(2)), vec![(QpState::Rts, QpState::Error)]);
    assert!(sim.a.completions.is_empty() && sim.b.completions.is_empty(), "the provider flushes");
    quiet_after_end(&mut sim, true);
    quiet_after_end(&mut sim, false);
    // Nothing left to reset; unknown QPs are named.
    let now = sim.now;
    assert!(matches!(
        sim.a.engine.inject(now, 1, Fault::SendRst),
        Err(EngineError::InvalidState { what: "not connected", .. })
    ));
    assert_eq!(sim.a.engine.inject(now, 7, Fault::SendRst), Err(EngineError::NoSuchQp(7)));
}

#[test]
fn rst_while_connecting_fails_the_connect() {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    sim.wire.cut = [true, true];
    sim.start_connect(1, 2, 40_000, QpConfig::new(PD));
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::SendRst).unwrap();
    sim.run_for(Duration::from_millis(1));
    assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::ConnectFailed(ConnectFailure::Tcp(CloseReason::Aborted))]);
    assert_eq!(sim.a.state(1), Some(QpState::Error));
}

#[test]
fn fin_is_a_graceful_close_on_both_ends() {
    let mut sim = pair();
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::SendFin).unwrap();
    assert!(
        matches!(sim.a.engine.inject(now, 1, Fault::SendFin), Err(EngineError::InvalidState { .. })),
        "one FIN per connection"
    );
    settle(&mut sim, 5);
    assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::CloseComplete { sq_outstanding: false }]);
    assert_eq!(states(&sim.a.qp_events(1)), vec![(QpState::Rts, QpState::Closing), (QpState::Closing, QpState::Idle)]);
    assert_eq!(
        others(&sim.b.qp_events(2)),
        vec![EventKind::PeerClose, EventKind::CloseComplete { sq_outstanding: false }]
    );
}

/// Blackhole → both ends time out within the user timeout (15 s), and
/// no sooner than two thirds of it (keep-alives every 5 s).
#[test]
fn blackhole_times_out_both_ends_in_bounded_time() {
    for idle in [true, false] {
        let mut sim = pair_with_timeout(15);
        post_recv(&mut sim.b, 2, 1);
        let now = sim.now;
        sim.a.engine.inject(now, 1, Fault::Blackhole(true)).unwrap();
        assert!(sim.a.engine.tcb(1).unwrap().blackholed);
        let start = sim.now;
        if !idle {
            post_send(&mut sim.a, 1, 5, 100).unwrap();
        }
        assert!(sim.run_until(Duration::from_secs(30), |s| {
            s.a.state(1) == Some(QpState::Error) && s.b.state(2) == Some(QpState::Error)
        }));
        let took = sim.now - start;
        eprintln!("blackhole idle={idle}: both ends timed out after {took}");
        assert!(took >= Duration::from_secs(9) && took <= Duration::from_secs(15), "idle {idle}: {took}");
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::Timeout]);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Timeout]);
        assert!(sim.b.completions.is_empty());
        assert!(sim.a.engine.toe().fault_counters().dropped > 0);
        quiet_after_end(&mut sim, true);
        quiet_after_end(&mut sim, false);
    }
}

#[test]
fn blackhole_lifted_in_time_keeps_the_connection() {
    let mut sim = pair_with_timeout(15);
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::Blackhole(true)).unwrap();
    post_recv(&mut sim.b, 2, 1);
    post_send(&mut sim.a, 1, 5, 100).unwrap();
    settle(&mut sim, 4);
    assert!(sim.b.completions.is_empty());
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::Blackhole(false)).unwrap();
    settle(&mut sim, 5);
    assert_eq!(sim.b.completions.len(), 1, "retransmitted");
    assert_eq!(sim.a.state(1), Some(QpState::Rts));
}

/// Sends `count` SENDs of 1000 octets A → B; returns when B has them all.
fn transfer(sim: &mut Sim<Node, Node>, count: u64) -> Duration {
    let start = sim.now;
    let before = completions_of(&sim.b, 2) as u64;
    for i in 0..count {
        post_recv(&mut sim.b, 2, i);
        post_send(&mut sim.a, 1, i, 1000).unwrap();
    }
    assert!(sim.run_until(Duration::from_secs(120), |s| completions_of(&s.b, 2) as u64 == before + count));
    sim.now - start
}

#[test]
fn drop_percent_is_deterministic_and_tcp_recovers() {
    let run = |seed: u64| {
        let mut sim = pair();
        let now = sim.now;
        sim.a.engine.inject(now, 1, Fault::Drop { percent: 30, seed }).unwrap();
        assert_eq!(sim.a.engine.tcb(1).unwrap().drop_percent, 30);
        let took = transfer(&mut sim, 20);
        assert!(sim.b.completions.iter().all(|c| c.status == WcStatus::Success));
        let retransmits = sim.a.engine.tcb(1).unwrap().retransmits;
        let dropped = sim.a.engine.toe().fault_counters().dropped;
        assert!(dropped > 0 && retransmits > 0, "{dropped} {retransmits}");
        assert_eq!(sim.a.state(1), Some(QpState::Rts));
        (took, dropped, retransmits)
    };
    let first = run(7);
    assert_eq!(first, run(7), "same seed, same drops");
    // Percentages above 100 are refused; 0 stops dropping.
    let mut sim = pair();
    let now = sim.now;
    assert!(sim.a.engine.inject(now, 1, Fault::Drop { percent: 101, seed: 1 }).is_err());
    sim.a.engine.inject(now, 1, Fault::Drop { percent: 0, seed: 1 }).unwrap();
    transfer(&mut sim, 3);
    assert_eq!(sim.a.engine.toe().fault_counters().dropped, 0);
}

#[test]
fn delay_holds_outbound_frames() {
    let mut sim = pair();
    let fast = transfer(&mut sim, 1);
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::Delay(Some(Duration::from_millis(300)))).unwrap();
    assert_eq!(sim.a.engine.tcb(1).unwrap().delay, Some(Duration::from_millis(300)));
    let slow = transfer(&mut sim, 1);
    assert!(slow >= Duration::from_millis(300) && fast < Duration::from_millis(100), "{fast} {slow}");
    assert!(sim.a.engine.toe().fault_counters().delayed > 0);
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::Delay(None)).unwrap();
    settle(&mut sim, 1);
    assert!(transfer(&mut sim, 1) < Duration::from_millis(100));
    assert_eq!(sim.a.state(1), Some(QpState::Rts));
    assert_eq!(sim.b.state(2), Some(QpState::Rts));
}

/// Every data segment leaves as two, the last `tail` octets (the CRC,
/// or some of it, and more) later: B's MPA takes each FPDU in any cut,
/// nothing is reordered or lost, and `Split(None)` stops it.
#[test]
fn split_segments_cut_each_crc_and_the_stream_survives() {
    for tail in [1u16, 2, 3, 7] {
        let mut sim = pair();
        let now = sim.now;
        let split = crate::toe::Split { tail, hold: Duration::from_millis(5) };
        sim.a.engine.inject(now, 1, Fault::Split(Some(split))).unwrap();
        assert_eq!(sim.a.engine.tcb(1).unwrap().split, Some(split));
        let segs_in = sim.b.engine.tcb(2).unwrap().segs_in;
        transfer(&mut sim, 10);
        assert_eq!(completions_of(&sim.b, 2), 10, "tail {tail}");
        assert!(sim.b.completions.iter().all(|c| c.status == WcStatus::Success), "tail {tail}");
        let cut = sim.a.engine.toe().fault_counters().split;
        assert!(cut >= 10, "tail {tail}: {cut} segments cut");
        let arrived = sim.b.engine.tcb(2).unwrap().segs_in - segs_in;
        assert!(arrived >= 2 * cut, "tail {tail}: {arrived} segments for {cut} cut");
        assert_eq!(sim.a.engine.tcb(1).unwrap().retransmits, 0, "tail {tail}: nothing reordered or lost");

        let now = sim.now;
        sim.a.engine.inject(now, 1, Fault::Split(None)).unwrap();
        transfer(&mut sim, 2);
        assert_eq!(sim.a.engine.toe().fault_counters().split, cut, "tail {tail}: stopped");
        assert_eq!(sim.a.state(1), Some(QpState::Rts));
        assert_eq!(sim.b.state(2), Some(QpState::Rts));
    }
}

#[test]
fn corrupt_crc_ends_both_with_a_terminate() {
    let mut sim = pair();
    post_recv(&mut sim.b, 2, 1);
    post_recv(&mut sim.a, 1, 2);
    let now = sim.now;
    sim.a.engine.inject(now, 1, Fault::CorruptCrc).unwrap();
    post_send(&mut sim.a, 1, 3, 10).unwrap();
    settle(&mut sim, 5);
    assert_eq!(
        others(&sim.b.qp_events(2)),
        vec![EventKind::LocalError { error: ProtocolError::Crc, sent: TermCode::LlpCrcError }]
    );
    assert_eq!(
        states(&sim.b.qp_events(2)),
        vec![(QpState::Rts, QpState::Terminate), (QpState::Terminate, QpState::Error)]
    );
    assert_eq!(
        others(&sim.a.qp_events(1)),
        vec![EventKind::TerminateReceived { code: TermCode::LlpCrcError, class: ErrorClass::Catastrophic }]
    );
    assert_eq!(completions_of(&sim.b, 2), 0, "the corrupted SEND was not placed");
    quiet_after_end(&mut sim, true);
    quiet_after_end(&mut sim, false);
    assert_eq!(sim.b.engine.stats().terminates_tx, 1);
}

#[test]
fn corrupt_crc_needs_crc() {
    let mut config = QpConfig::new(PD);
    config.mpa.crc = false;
    let mut node = NodeConfig::new(1);
    node.engine.listen_mpa.crc = false;
    let mut sim = Sim::pair(NodeConfig::new(0), node, WireConfig::default());
    assert!(sim.connect_qps(1, 2, 40_000, config));
    let now = sim.now;
    assert_eq!(
        sim.a.engine.inject(now, 1, Fault::CorruptCrc),
        Err(EngineError::FaultNotApplicable { qpn: 1, what: "CRC was not negotiated on this connection" })
    );
    // Idle QPs have nothing to corrupt.
    sim.a.engine.create_qp(5, QpConfig::new(PD)).unwrap();
    assert!(matches!(
        sim.a.engine.inject(now, 5, Fault::CorruptCrc),
        Err(EngineError::InvalidState { what: "not connected", .. })
    ));
}

#[test]
fn terminate_reaches_the_peer_with_its_code() {
    for code in [
        TermCode::DdpTaggedInvalidStag,
        TermCode::DdpUntaggedInvalidMsnNoBuffer,
        TermCode::RdmapCatastrophicGlobal,
        TermCode::LlpInsufficientIrd,
    ] {
        let mut sim = pair();
        post_recv(&mut sim.a, 1, 1);
        post_recv(&mut sim.b, 2, 2);
        let now = sim.now;
        sim.a.engine.inject(now, 1, Fault::Terminate(code)).unwrap();
        settle(&mut sim, 5);
        assert_eq!(
            others(&sim.a.qp_events(1)),
            vec![EventKind::LocalError { error: ProtocolError::Injected, sent: code }]
        );
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::TerminateReceived { code, class: code.etype_class() }]);
        for node in [&sim.a, &sim.b] {
            assert!(node.completions.is_empty());
        }
        quiet_after_end(&mut sim, true);
        quiet_after_end(&mut sim, false);
        let now = sim.now;
        assert!(sim.a.engine.inject(now, 1, Fault::Terminate(code)).is_err(), "once");
    }
}

/// The host invalidates an STag the peer uses (`fault invalidate-stag`
/// works on the device's TPT; here the mock TPT): the peer's next
/// WRITE or READ on it is a remote access error we detect.
#[test]
fn invalidated_stag_fails_the_peers_next_access() {
    for read in [false, true] {
        let mut sim = pair();
        let (bstag, biova) = registered_buffer(&mut sim.b, 4096);
        sim.b.regions.invalidate(bstag, PD).unwrap();
        let snapshot = sim.b.memory.slice(biova, 64).to_vec();
        let (astag, aiova) = registered_buffer(&mut sim.a, 4096);
        let opcode = if read { SendOpcode::Read } else { SendOpcode::Write };
        let mut wr = SendWr::new(1, opcode);
        wr.sges = SgeList::single(Sge { addr: aiova, length: 64, lkey: astag });
        wr.remote_addr = biova;
        wr.remote_stag = bstag;
        sim.a.engine.post_send(1, wr).unwrap();
        settle(&mut sim, 5);
        let (error, sent) = if read {
            (ProtocolError::ReadSourceAccess(AccessError::InvalidStag), TermCode::RdmapInvalidStag)
        } else {
            (ProtocolError::WriteAccess(AccessError::InvalidStag), TermCode::DdpTaggedInvalidStag)
        };
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::LocalError { error, sent }]);
        assert_eq!(error.class(), ErrorClass::Protection, "QP_ACCESS_ERR");
        assert_eq!(
            others(&sim.a.qp_events(1)),
            vec![EventKind::TerminateReceived { code: sent, class: ErrorClass::Protection }]
        );
        assert_eq!(sim.b.memory.slice(biova, 64), &snapshot[..], "nothing placed");
        quiet_after_end(&mut sim, true);
        quiet_after_end(&mut sim, false);
    }
}
