//! The QP state machine between two engines (or an engine and a raw
//! peer), grouped by the state the QP is in when the trigger happens:
//! graceful close, the peer's FIN, RST, timeouts and TERMINATE in RTS; a
//! close with work outstanding, receives and RST while CLOSING; the
//! TERMINATE linger; ERROR, reuse and limits; refused WQEs.

use super::*;

mod rts {
    use super::*;

    #[test]
    fn graceful_close_both_sides() {
        let mut sim = pair();
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Closing).unwrap();
        settle(&mut sim, 5);
        let a = sim.a.qp_events(1);
        let b = sim.b.qp_events(2);
        assert_eq!(others(&a), vec![EventKind::CloseComplete { sq_outstanding: false }]);
        assert_eq!(states(&a), vec![(QpState::Rts, QpState::Closing), (QpState::Closing, QpState::Idle)]);
        assert_eq!(others(&b), vec![EventKind::PeerClose, EventKind::CloseComplete { sq_outstanding: false }]);
        assert_eq!(states(&b), vec![(QpState::Rts, QpState::Closing), (QpState::Closing, QpState::Idle)]);
        // TIME-WAIT passes, sockets are freed.
        settle(&mut sim, 60);
        assert_eq!(sim.a.engine.toe().tcp().socket_count(), 0);
    }

    #[test]
    fn peer_fin() {
        let mut sim = pair();
        let now = sim.now;
        sim.b.engine.inject(now, 2, Fault::SendFin).unwrap();
        settle(&mut sim, 5);
        let a = sim.a.qp_events(1);
        assert_eq!(others(&a), vec![EventKind::PeerClose, EventKind::CloseComplete { sq_outstanding: false }]);
        assert_eq!(states(&a), vec![(QpState::Rts, QpState::Closing), (QpState::Closing, QpState::Idle)]);
    }

    #[test]
    fn reset_by_the_peer() {
        let mut sim = pair();
        let now = sim.now;
        sim.b.engine.modify_qp(now, 2, QpState::Error).unwrap();
        settle(&mut sim, 1);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Aborted]);
        assert_eq!(states(&sim.b.qp_events(2)), vec![(QpState::Rts, QpState::Error)]);
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::Reset]);
        assert_eq!(states(&sim.a.qp_events(1)), vec![(QpState::Rts, QpState::Error)]);
    }

    #[test]
    fn injected_rst() {
        let mut sim = pair();
        let now = sim.now;
        sim.a.engine.inject(now, 1, Fault::SendRst).unwrap();
        settle(&mut sim, 1);
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::ResetSent]);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Reset]);
    }

    #[test]
    fn blackholed_wire_times_out_both_sides() {
        let mut sim = pair();
        let (stag, iova) = registered_buffer(&mut sim.a, 4096);
        sim.b.engine.post_recv(2, RecvWr { wr_id: 1, sges: SgeList::EMPTY }).unwrap();
        sim.wire.cut = [true, true];
        let cut_at = sim.now;
        let mut wr = SendWr::new(9, SendOpcode::Send);
        wr.sges = SgeList::single(Sge { addr: iova, length: 100, lkey: stag });
        sim.a.engine.post_send(1, wr).unwrap();
        settle(&mut sim, 200);
        // A had data outstanding, B was idle: keep-alive found the silence.
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::Timeout]);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Timeout]);
        assert_eq!(sim.a.state(1), Some(QpState::Error));
        assert_eq!(sim.b.state(2), Some(QpState::Error));
        let timeout = sim.a.engine.toe().tcp().config().timeout.unwrap();
        assert!(sim.now >= cut_at + timeout);
        // The SEND completed into the TCP buffer before the wire died; the
        // receive never completed; nothing else came out.
        assert_eq!(sim.a.completions.len(), 1);
        assert!(sim.b.completions.is_empty());
    }

    #[test]
    fn idle_connection_survives_on_keep_alives() {
        let mut sim = pair();
        settle(&mut sim, 600);
        assert_eq!(sim.a.state(1), Some(QpState::Rts));
        assert_eq!(sim.b.state(2), Some(QpState::Rts));
    }

    #[test]
    fn terminate_received_for_every_registered_code() {
        for code in TermCode::registered() {
            let mut sim = pair();
            let now = sim.now;
            sim.a.engine.inject(now, 1, Fault::Terminate(code)).unwrap();
            settle(&mut sim, 5);
            let class = code.etype_class();
            assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::TerminateReceived { code, class }], "{code}");
            assert_eq!(
                states(&sim.b.qp_events(2)),
                vec![(QpState::Rts, QpState::Terminate), (QpState::Terminate, QpState::Error)]
            );
            assert_eq!(
                others(&sim.a.qp_events(1)),
                vec![EventKind::LocalError { error: ProtocolError::Injected, sent: code }]
            );
            assert_eq!(sim.a.state(1), Some(QpState::Error));
            assert_eq!(sim.a.engine.stats().terminates_tx, 1);
        }
        // The classes map to the verbs events of docs/architecture.md §5.
        assert_eq!(TermCode::DdpTaggedInvalidStag.etype_class(), ErrorClass::Protection);
        assert_eq!(TermCode::DdpUntaggedInvalidMsnNoBuffer.etype_class(), ErrorClass::Operation);
        assert_eq!(TermCode::LlpCrcError.etype_class(), ErrorClass::Catastrophic);
    }
}

mod closing {
    use super::*;

    #[test]
    fn close_with_send_work_outstanding_ends_in_error() {
        let mut sim = pair();
        let (stag, iova) = registered_buffer(&mut sim.a, 4096);
        let mut wr = SendWr::new(1, SendOpcode::Read);
        wr.sges = SgeList::single(Sge { addr: iova, length: 10, lkey: stag });
        sim.a.engine.post_send(1, wr).unwrap();
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Closing).unwrap();
        settle(&mut sim, 5);
        let a = sim.a.qp_events(1);
        assert_eq!(others(&a), vec![EventKind::CloseComplete { sq_outstanding: true }]);
        assert_eq!(states(&a), vec![(QpState::Rts, QpState::Closing), (QpState::Closing, QpState::Error)]);
        assert!(sim.a.completions.is_empty(), "the provider flushes the READ");
    }

    #[test]
    fn receives_still_complete_while_closing() {
        let mut sim = pair();
        let (stag, iova) = registered_buffer(&mut sim.a, 4096);
        let (bstag, biova) = registered_buffer(&mut sim.b, 4096);
        sim.a
            .engine
            .post_recv(1, RecvWr { wr_id: 7, sges: SgeList::single(Sge { addr: iova, length: 100, lkey: stag }) })
            .unwrap();
        // A's FIN is held up; B sends meanwhile.
        sim.wire.cut = [false, true];
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Closing).unwrap();
        let mut wr = SendWr::new(1, SendOpcode::Send);
        wr.sges = SgeList::single(Sge { addr: biova, length: 50, lkey: bstag });
        sim.b.engine.post_send(2, wr).unwrap();
        settle(&mut sim, 1);
        assert_eq!(sim.a.state(1), Some(QpState::Closing));
        sim.wire.cut = [false, false];
        settle(&mut sim, 5);
        assert_eq!(sim.a.completions.len(), 1, "{:?}\n{:?}\n{:?}", sim.a.events, sim.b.events, sim.b.completions);
        assert_eq!(sim.a.completions[0].byte_len, 50);
        assert_eq!(sim.a.state(1), Some(QpState::Idle));
    }

    #[test]
    fn reset_while_closing() {
        let mut sim = pair();
        sim.wire.cut = [false, true]; // A's FIN never reaches B
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Closing).unwrap();
        settle(&mut sim, 1);
        sim.wire.cut = [false, false];
        let now = sim.now;
        sim.b.engine.inject(now, 2, Fault::SendRst).unwrap();
        settle(&mut sim, 1);
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::Reset]);
        assert_eq!(
            states(&sim.a.qp_events(1)),
            vec![(QpState::Rts, QpState::Closing), (QpState::Closing, QpState::Error)]
        );
    }

    #[test]
    fn fin_never_acknowledged_times_out() {
        let mut sim = pair();
        sim.wire.cut = [true, true];
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Closing).unwrap();
        settle(&mut sim, 200);
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::Timeout]);
        assert_eq!(sim.a.state(1), Some(QpState::Error));
    }
}

mod terminate {
    use super::*;

    #[test]
    fn linger_expires_when_the_peer_keeps_the_connection_open() {
        let raw = TcpConfig::new(MACS[0], IPS[0]);
        let mpa = negotiation::Config { peer_to_peer: false, ..negotiation::Config::default() };
        let mut sim = Sim::raw_pair(raw, NodeConfig::new(1), WireConfig::default(), 2, QpConfig::new(PD), mpa);
        assert!(sim.a.negotiated.is_some());
        let now = sim.now;
        sim.b.engine.inject(now, 2, Fault::Terminate(TermCode::RdmapCatastrophicGlobal)).unwrap();
        let start = sim.now;
        assert!(sim.run_until(Duration::from_secs(10), |s| s.b.state(2) == Some(QpState::Error)));
        let linger = sim.b.engine.config().terminate_linger;
        assert!(sim.now >= start + linger, "waited for the linger");
        settle_raw(&mut sim);
        assert_eq!(
            states(&sim.b.qp_events(2)),
            vec![
                (QpState::Idle, QpState::Rts),
                (QpState::Rts, QpState::Terminate),
                (QpState::Terminate, QpState::Error)
            ]
        );
        // The raw peer got the TERMINATE, then the FIN, then an RST.
        let ulpdus = sim.a.ulpdus();
        let term = crate::wire::terminate::Packet::new_unchecked(&ulpdus[0][18..]);
        assert_eq!(term.code(), TermCode::RdmapCatastrophicGlobal);
        assert_eq!(sim.a.status(), Some(LinkStatus::Closed(CloseReason::Reset)));
    }

    #[test]
    fn no_completions_once_terminated() {
        let mut sim = pair();
        let (stag, iova) = registered_buffer(&mut sim.b, 4096);
        sim.b
            .engine
            .post_recv(2, RecvWr { wr_id: 1, sges: SgeList::single(Sge { addr: iova, length: 100, lkey: stag }) })
            .unwrap();
        let now = sim.now;
        sim.b.engine.inject(now, 2, Fault::Terminate(TermCode::RdmapLocalCatastrophic)).unwrap();
        // A sends before it hears of it: B must not complete the receive.
        let (astag, aiova) = registered_buffer(&mut sim.a, 4096);
        let mut wr = SendWr::new(1, SendOpcode::Send);
        wr.sges = SgeList::single(Sge { addr: aiova, length: 10, lkey: astag });
        sim.a.engine.post_send(1, wr).unwrap();
        settle(&mut sim, 5);
        assert!(sim.b.completions.is_empty());
        assert_eq!(sim.b.state(2), Some(QpState::Error));
        assert_eq!(sim.b.engine.qp_info(2).unwrap().rq_posted, 0, "the driver flushes");
    }
}

fn settle_raw(sim: &mut Sim<RawPeer, Node>) {
    sim.run_for(Duration::from_millis(100));
}

mod error {
    use super::*;

    #[test]
    fn posts_are_refused_and_the_qp_can_be_reset() {
        let mut sim = pair();
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Error).unwrap();
        assert!(matches!(
            sim.a.engine.post_send(1, SendWr::new(1, SendOpcode::Send)),
            Err(EngineError::InvalidState { .. })
        ));
        assert!(sim.a.engine.post_recv(1, RecvWr { wr_id: 1, sges: SgeList::EMPTY }).is_err());
        assert!(sim.a.engine.modify_qp(now, 1, QpState::Closing).is_err());
        settle(&mut sim, 1);
        sim.a.engine.modify_qp(sim.now, 1, QpState::Idle).unwrap();
        let now = sim.now;
        sim.b.engine.modify_qp(now, 2, QpState::Idle).unwrap();
        sim.a.events.clear();
        sim.b.events.clear();
        assert!(sim.connect_qps(1, 2, 40_002, QpConfig::new(PD)));
        assert_eq!(sim.a.completions.len(), 0);
    }

    #[test]
    fn destroy_and_limits() {
        let mut sim = pair();
        assert_eq!(sim.a.engine.create_qp(1, QpConfig::new(PD)), Err(EngineError::QpExists(1)));
        sim.a.engine.destroy_qp(1).unwrap();
        settle(&mut sim, 1);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Reset]);
        assert_eq!(sim.a.engine.destroy_qp(1), Err(EngineError::NoSuchQp(1)));
        let mut tiny = QpConfig::new(PD);
        tiny.sq_depth = 1;
        sim.a.engine.create_qp(9, tiny).unwrap();
        sim.a.engine.post_send(9, SendWr::new(1, SendOpcode::Send)).unwrap();
        assert_eq!(sim.a.engine.post_send(9, SendWr::new(2, SendOpcode::Send)), Err(EngineError::QueueFull));
        let _ = (MockMemory::new(0), Tpt::for_tests());
    }
}

/// WQEs the device could not parse ([`Engine::post_refused`]): each
/// completes in posting order with its own status, the QP goes to ERROR,
/// the peer's TERMINATE says the error is ours, and nothing completes
/// after it (docs/events.md, "bad local WQE").
mod refused {
    use super::*;

    fn results(node: &Node, qpn: u32) -> Vec<(u64, WcStatus)> {
        node.completions.iter().filter(|c| c.qpn == qpn).map(|c| (c.wr_id, c.status)).collect()
    }

    fn local_terminate_at_peer(node: &Node, qpn: u32) -> bool {
        others(&node.qp_events(qpn))
            == vec![EventKind::TerminateReceived {
                code: TermCode::RdmapLocalCatastrophic,
                class: ErrorClass::Catastrophic,
            }]
    }

    #[test]
    fn a_refused_receive_completes_after_the_ones_before_it() {
        let mut sim = pair();
        post_recv(&mut sim.b, 2, 1);
        sim.b.engine.post_refused(2, WorkQueue::Recv, 2, WcStatus::LocQpOpErr).unwrap();
        assert!(
            matches!(
                sim.b.engine.post_recv(2, RecvWr { wr_id: 3, sges: SgeList::EMPTY }),
                Err(EngineError::InvalidState { .. })
            ),
            "nothing is posted after it"
        );
        // Two Sends, the second a zero-length one: never a SUCCESS for
        // the refused WQE.
        post_send(&mut sim.a, 1, 10, 100).unwrap();
        post_send(&mut sim.a, 1, 11, 0).unwrap();
        settle(&mut sim, 5);
        assert_eq!(results(&sim.b, 2), vec![(1, WcStatus::Success), (2, WcStatus::LocQpOpErr)]);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::WqeError { wr_id: 2, status: WcStatus::LocQpOpErr }]);
        assert_eq!(sim.b.state(2), Some(QpState::Error));
        assert!(local_terminate_at_peer(&sim.a, 1), "{:?}", sim.a.qp_events(1));
    }

    #[test]
    fn a_refused_receive_whose_turn_came_fails_without_waiting_for_a_send() {
        let mut sim = pair();
        sim.b.engine.post_refused(2, WorkQueue::Recv, 7, WcStatus::LocQpOpErr).unwrap();
        settle(&mut sim, 2);
        assert_eq!(results(&sim.b, 2), vec![(7, WcStatus::LocQpOpErr)]);
        assert_eq!(sim.b.state(2), Some(QpState::Error));
        assert!(local_terminate_at_peer(&sim.a, 1), "{:?}", sim.a.qp_events(1));
    }

    #[test]
    fn a_refused_send_completes_in_order_and_nothing_after_it() {
        let mut sim = pair();
        post_recv(&mut sim.b, 2, 1);
        post_recv(&mut sim.b, 2, 2);
        post_send(&mut sim.a, 1, 10, 100).unwrap();
        sim.a.engine.post_refused(1, WorkQueue::Send, 11, WcStatus::LocQpOpErr).unwrap();
        post_send(&mut sim.a, 1, 12, 100).unwrap();
        settle(&mut sim, 5);
        assert_eq!(results(&sim.a, 1), vec![(10, WcStatus::Success), (11, WcStatus::LocQpOpErr)]);
        assert_eq!(sim.a.state(1), Some(QpState::Error));
        assert_eq!(results(&sim.b, 2), vec![(1, WcStatus::Success)], "WR 12 never went out");
        assert!(local_terminate_at_peer(&sim.b, 2), "{:?}", sim.b.qp_events(2));
    }

    #[test]
    fn unconnected_qps_fail_a_refused_wqe_at_once() {
        let mut sim = pair();
        sim.a.engine.create_qp(5, QpConfig::new(PD)).unwrap();
        sim.a.engine.post_refused(5, WorkQueue::Send, 50, WcStatus::Success).unwrap();
        sim.a.engine.create_qp(6, QpConfig::new(PD)).unwrap();
        sim.a.engine.post_refused(6, WorkQueue::Recv, 60, WcStatus::LocProtErr).unwrap();
        settle(&mut sim, 1);
        assert_eq!(results(&sim.a, 5), vec![(50, WcStatus::LocQpOpErr)], "SUCCESS is never a refusal");
        assert_eq!(results(&sim.a, 6), vec![(60, WcStatus::LocProtErr)]);
        assert_eq!((sim.a.state(5), sim.a.state(6)), (Some(QpState::Error), Some(QpState::Error)));
    }
}
