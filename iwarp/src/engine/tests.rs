//! QP state machine tests, grouped by the state the QP is in when the
//! trigger happens. Two engines (or an engine and a raw peer) on a
//! simulated wire; time is injected, so timeouts take no wall time.
#![allow(
    clippy::unwrap_used,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]

use std::net::SocketAddrV4;

use super::*;
use crate::mock::{MockMemory, MockRegions};
use crate::sim::{Node, NodeConfig, RawPeer, Sim, WireConfig, IPS, MACS, PORT};
use crate::toe::TcpConfig;
use crate::wire::terminate::{ErrorClass, TermCode};

const PD: u32 = 3;

fn pair() -> Sim<Node, Node> {
    let mut sim = Sim::pair(
        NodeConfig::new(0),
        NodeConfig::new(1),
        WireConfig::default(),
    );
    assert!(sim.connect_qps(1, 2, 40_000, QpConfig::new(PD)));
    // Let the RTR reach B (B sends nothing before it).
    sim.run_for(Duration::from_millis(10));
    sim.a.events.clear();
    sim.b.events.clear();
    sim
}

fn states(events: &[EventKind]) -> Vec<(QpState, QpState)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::StateChanged { from, to } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

fn others(events: &[EventKind]) -> Vec<EventKind> {
    events
        .iter()
        .filter(|e| !matches!(e, EventKind::StateChanged { .. }))
        .cloned()
        .collect()
}

fn settle(sim: &mut Sim<Node, Node>, secs: u64) {
    sim.run_for(Duration::from_secs(secs));
}

fn registered_buffer(node: &mut Node, len: u64) -> (u32, u64) {
    let stag = node.regions.register_contiguous(
        PD,
        LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ,
        0x1000,
        0x1000,
        len,
    );
    (stag, 0x1000)
}

#[test]
fn state_names_match_the_abi_values() {
    for (value, (state, name)) in QP_STATE_NAMES.iter().enumerate() {
        assert_eq!(*state as usize, value);
        assert_eq!(state.name(), *name);
        assert_eq!(QpState::from_wire(value as u32), Some(*state));
    }
    assert_eq!(QpState::from_wire(5), None);
    assert_eq!(QpState::Terminate.to_string(), "TERMINATE");
}

mod idle {
    use super::*;

    #[test]
    fn rejected_by_the_ulp() {
        let mut sim = Sim::pair(
            NodeConfig::new(0),
            NodeConfig::new(1),
            WireConfig::default(),
        );
        sim.start_connect(1, 2, 40_000, QpConfig::new(PD));
        assert!(sim.run_until(Duration::from_secs(5), |s| s.b.connect_request().is_some()));
        let conn = sim.b.connect_request().unwrap();
        match &sim.b.events[0].kind {
            EventKind::ConnectRequest(request) => {
                assert_eq!(request.private_data, b"qpn:2");
                assert_eq!(
                    (request.revision, request.ird, request.ord),
                    (2, Some(16), Some(16))
                );
                assert_eq!(request.tuple.remote, SocketAddrV4::new(IPS[0], 40_000));
            }
            other => panic!("{other:?}"),
        }
        sim.b.engine.reject(conn, b"no thanks").unwrap();
        settle(&mut sim, 5);
        let events = sim.a.qp_events(1);
        assert_eq!(
            others(&events),
            vec![EventKind::ConnectFailed(ConnectFailure::Rejected {
                private_data: b"no thanks".to_vec()
            })]
        );
        assert_eq!(states(&events), vec![(QpState::Idle, QpState::Error)]);
        assert_eq!(
            sim.b.state(2),
            Some(QpState::Idle),
            "B's QP was never involved"
        );
        // The QP can be reset and used again.
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Idle).unwrap();
        sim.b.events.clear();
        assert!(sim.connect_qps(1, 2, 40_001, QpConfig::new(PD)));
    }

    #[test]
    fn nobody_answers_the_syn() {
        let mut sim = Sim::pair(
            NodeConfig::new(0),
            NodeConfig::new(1),
            WireConfig::default(),
        );
        sim.wire.cut = [true, true];
        sim.start_connect(1, 2, 40_000, QpConfig::new(PD));
        settle(&mut sim, 120);
        assert_eq!(
            others(&sim.a.qp_events(1)),
            vec![EventKind::ConnectFailed(ConnectFailure::Tcp(
                CloseReason::Timeout
            ))]
        );
        assert_eq!(sim.a.state(1), Some(QpState::Error));
    }

    #[test]
    fn mpa_reply_never_comes() {
        let mut sim = Sim::pair(
            NodeConfig::new(0),
            NodeConfig::new(1),
            WireConfig::default(),
        );
        sim.start_connect(1, 2, 40_000, QpConfig::new(PD));
        // B's ULP never answers the request.
        assert!(sim.run_until(Duration::from_secs(5), |s| s.b.connect_request().is_some()));
        let asked = sim.now;
        assert!(sim.run_until(Duration::from_secs(30), |s| s.a.state(1)
            == Some(QpState::Error)));
        assert!(
            sim.now >= asked + Duration::from_secs(9),
            "MPA timeout is 10 s"
        );
        assert_eq!(
            others(&sim.a.qp_events(1)),
            vec![EventKind::ConnectFailed(ConnectFailure::MpaTimeout)]
        );
        settle(&mut sim, 1);
        assert!(sim
            .b
            .events
            .iter()
            .any(|e| e.kind == EventKind::ConnectWithdrawn));
        let conn = sim.b.connect_request().unwrap();
        assert_eq!(
            sim.b.engine.accept(sim.now, conn, 2, b""),
            Err(EngineError::NoSuchConnection)
        );
    }

    #[test]
    fn markers_are_refused_with_a_reject_reply() {
        let raw = TcpConfig::new(MACS[0], IPS[0]);
        let mpa = negotiation::Config {
            revision: 1,
            ..negotiation::Config::default()
        };
        let mut sim = Sim::new(
            RawPeer::new(raw, crate::sim::START),
            Node::new(1, NodeConfig::new(1), crate::sim::START),
            WireConfig::default(),
        );
        sim.b.engine.listen(PORT, 4).unwrap();
        let now = sim.now;
        sim.a.connect(
            now,
            40_000,
            SocketAddrV4::new(IPS[1], PORT),
            MACS[1],
            mpa,
            b"",
        );
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
        sim.a.connect(
            crate::sim::START,
            40_000,
            SocketAddrV4::new(IPS[1], PORT),
            MACS[1],
            mpa,
            b"",
        );
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
        .emit(&mut crate::wire::mpa::Frame::new_unchecked(
            &mut request[..],
        ))
        .unwrap();
        sim.a.disable_mpa();
        sim.a.send(&request);
        sim.run_for(Duration::from_secs(2));
        let refused = sim.b.events.iter().any(|e| {
            matches!(
                e.kind,
                EventKind::ConnectRefused {
                    refusal: Some(negotiation::Refusal::Markers),
                    ..
                }
            )
        });
        assert!(refused, "{:?}", sim.b.events);
        // The reply has R set.
        assert!(sim.a.raw_received().len() >= 20);
        assert_eq!(sim.a.raw_received()[16] & 0x20, 0x20);
    }

    fn settle_raw(sim: &mut Sim<RawPeer, Node>, done: impl Fn(&RawPeer) -> bool) {
        sim.run_until(Duration::from_secs(5), |s| done(&s.a));
    }
}

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
        assert_eq!(
            others(&a),
            vec![EventKind::CloseComplete {
                sq_outstanding: false
            }]
        );
        assert_eq!(
            states(&a),
            vec![
                (QpState::Rts, QpState::Closing),
                (QpState::Closing, QpState::Idle)
            ]
        );
        assert_eq!(
            others(&b),
            vec![
                EventKind::PeerClose,
                EventKind::CloseComplete {
                    sq_outstanding: false
                }
            ]
        );
        assert_eq!(
            states(&b),
            vec![
                (QpState::Rts, QpState::Closing),
                (QpState::Closing, QpState::Idle)
            ]
        );
        // TIME-WAIT passes, sockets are freed.
        settle(&mut sim, 60);
        assert_eq!(sim.a.engine.toe().socket_count(), 0);
    }

    #[test]
    fn peer_fin() {
        let mut sim = pair();
        let now = sim.now;
        sim.b.engine.inject(now, 2, Fault::SendFin).unwrap();
        settle(&mut sim, 5);
        let a = sim.a.qp_events(1);
        assert_eq!(
            others(&a),
            vec![
                EventKind::PeerClose,
                EventKind::CloseComplete {
                    sq_outstanding: false
                }
            ]
        );
        assert_eq!(
            states(&a),
            vec![
                (QpState::Rts, QpState::Closing),
                (QpState::Closing, QpState::Idle)
            ]
        );
    }

    #[test]
    fn reset_by_the_peer() {
        let mut sim = pair();
        let now = sim.now;
        sim.b.engine.modify_qp(now, 2, QpState::Error).unwrap();
        settle(&mut sim, 1);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Aborted]);
        assert_eq!(
            states(&sim.b.qp_events(2)),
            vec![(QpState::Rts, QpState::Error)]
        );
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::Reset]);
        assert_eq!(
            states(&sim.a.qp_events(1)),
            vec![(QpState::Rts, QpState::Error)]
        );
    }

    #[test]
    fn injected_rst() {
        let mut sim = pair();
        let now = sim.now;
        sim.a.engine.inject(now, 1, Fault::SendRst).unwrap();
        settle(&mut sim, 1);
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::Aborted]);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Reset]);
    }

    #[test]
    fn blackholed_wire_times_out_both_sides() {
        let mut sim = pair();
        let (stag, iova) = registered_buffer(&mut sim.a, 4096);
        sim.b
            .engine
            .post_recv(
                2,
                RecvWr {
                    wr_id: 1,
                    sges: SgeList::EMPTY,
                },
            )
            .unwrap();
        sim.wire.cut = [true, true];
        let cut_at = sim.now;
        let mut wr = SendWr::new(9, SendOpcode::Send);
        wr.sges = SgeList::single(Sge {
            addr: iova,
            length: 100,
            lkey: stag,
        });
        sim.a.engine.post_send(1, wr).unwrap();
        settle(&mut sim, 200);
        // A had data outstanding, B was idle: keep-alive found the silence.
        assert_eq!(others(&sim.a.qp_events(1)), vec![EventKind::Timeout]);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Timeout]);
        assert_eq!(sim.a.state(1), Some(QpState::Error));
        assert_eq!(sim.b.state(2), Some(QpState::Error));
        let timeout = sim.a.engine.toe().config().timeout.unwrap();
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
            assert_eq!(
                others(&sim.b.qp_events(2)),
                vec![EventKind::TerminateReceived { code, class }],
                "{code}"
            );
            assert_eq!(
                states(&sim.b.qp_events(2)),
                vec![
                    (QpState::Rts, QpState::Terminate),
                    (QpState::Terminate, QpState::Error)
                ]
            );
            assert_eq!(
                others(&sim.a.qp_events(1)),
                vec![EventKind::LocalError {
                    error: ProtocolError::Injected,
                    sent: code
                }]
            );
            assert_eq!(sim.a.state(1), Some(QpState::Error));
            assert_eq!(sim.a.engine.stats().terminates_tx, 1);
        }
        // The classes map to the verbs events of DESIGN §5.
        assert_eq!(
            TermCode::DdpTaggedInvalidStag.etype_class(),
            ErrorClass::Protection
        );
        assert_eq!(
            TermCode::DdpUntaggedInvalidMsnNoBuffer.etype_class(),
            ErrorClass::Operation
        );
        assert_eq!(
            TermCode::LlpCrcError.etype_class(),
            ErrorClass::Catastrophic
        );
    }

    #[test]
    fn corrupted_crc_is_a_local_error_at_the_peer() {
        let mut sim = pair();
        let (stag, iova) = registered_buffer(&mut sim.a, 4096);
        let now = sim.now;
        sim.a.engine.inject(now, 1, Fault::CorruptCrc).unwrap();
        let mut wr = SendWr::new(1, SendOpcode::Write);
        wr.sges = SgeList::single(Sge {
            addr: iova,
            length: 10,
            lkey: stag,
        });
        sim.a.engine.post_send(1, wr).unwrap();
        settle(&mut sim, 5);
        assert_eq!(
            others(&sim.b.qp_events(2)),
            vec![EventKind::LocalError {
                error: ProtocolError::Crc,
                sent: TermCode::LlpCrcError
            }]
        );
        assert_eq!(
            others(&sim.a.qp_events(1)),
            vec![EventKind::TerminateReceived {
                code: TermCode::LlpCrcError,
                class: ErrorClass::Catastrophic
            }]
        );
    }

    #[test]
    fn bad_local_wqe_completes_in_error() {
        let mut sim = pair();
        let mut wr = SendWr::new(5, SendOpcode::Send);
        wr.sges = SgeList::single(Sge {
            addr: 0,
            length: 10,
            lkey: 0x4242,
        });
        sim.a.engine.post_send(1, wr).unwrap();
        settle(&mut sim, 5);
        assert_eq!(sim.a.completions.len(), 1);
        assert_eq!(
            (sim.a.completions[0].wr_id, sim.a.completions[0].status),
            (5, WcStatus::LocProtErr)
        );
        assert_eq!(
            others(&sim.a.qp_events(1)),
            vec![EventKind::WqeError {
                wr_id: 5,
                status: WcStatus::LocProtErr
            }]
        );
        assert_eq!(sim.a.state(1), Some(QpState::Error));
        assert_eq!(
            others(&sim.b.qp_events(2)),
            vec![EventKind::TerminateReceived {
                code: TermCode::RdmapLocalCatastrophic,
                class: ErrorClass::Catastrophic
            }]
        );
        // An inline READ is an operation error.
        let mut sim = pair();
        let mut wr = SendWr::new(6, SendOpcode::Read);
        wr.inline = InlineData::new(b"x");
        sim.a.engine.post_send(1, wr).unwrap();
        settle(&mut sim, 5);
        assert_eq!(sim.a.completions[0].status, WcStatus::LocQpOpErr);
    }
}

mod closing {
    use super::*;

    #[test]
    fn close_with_send_work_outstanding_ends_in_error() {
        let mut sim = pair();
        let (stag, iova) = registered_buffer(&mut sim.a, 4096);
        let mut wr = SendWr::new(1, SendOpcode::Read);
        wr.sges = SgeList::single(Sge {
            addr: iova,
            length: 10,
            lkey: stag,
        });
        sim.a.engine.post_send(1, wr).unwrap();
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Closing).unwrap();
        settle(&mut sim, 5);
        let a = sim.a.qp_events(1);
        assert_eq!(
            others(&a),
            vec![EventKind::CloseComplete {
                sq_outstanding: true
            }]
        );
        assert_eq!(
            states(&a),
            vec![
                (QpState::Rts, QpState::Closing),
                (QpState::Closing, QpState::Error)
            ]
        );
        assert!(
            sim.a.completions.is_empty(),
            "the provider flushes the READ"
        );
    }

    #[test]
    fn receives_still_complete_while_closing() {
        let mut sim = pair();
        let (stag, iova) = registered_buffer(&mut sim.a, 4096);
        let (bstag, biova) = registered_buffer(&mut sim.b, 4096);
        sim.a
            .engine
            .post_recv(
                1,
                RecvWr {
                    wr_id: 7,
                    sges: SgeList::single(Sge {
                        addr: iova,
                        length: 100,
                        lkey: stag,
                    }),
                },
            )
            .unwrap();
        // A's FIN is held up; B sends meanwhile.
        sim.wire.cut = [false, true];
        let now = sim.now;
        sim.a.engine.modify_qp(now, 1, QpState::Closing).unwrap();
        let mut wr = SendWr::new(1, SendOpcode::Send);
        wr.sges = SgeList::single(Sge {
            addr: biova,
            length: 50,
            lkey: bstag,
        });
        sim.b.engine.post_send(2, wr).unwrap();
        settle(&mut sim, 1);
        assert_eq!(sim.a.state(1), Some(QpState::Closing));
        sim.wire.cut = [false, false];
        settle(&mut sim, 5);
        assert_eq!(
            sim.a.completions.len(),
            1,
            "{:?}\n{:?}\n{:?}",
            sim.a.events,
            sim.b.events,
            sim.b.completions
        );
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
            vec![
                (QpState::Rts, QpState::Closing),
                (QpState::Closing, QpState::Error)
            ]
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
        let mpa = negotiation::Config {
            peer_to_peer: false,
            ..negotiation::Config::default()
        };
        let mut sim = Sim::raw_pair(
            raw,
            NodeConfig::new(1),
            WireConfig::default(),
            2,
            QpConfig::new(PD),
            mpa,
        );
        assert!(sim.a.negotiated.is_some());
        let now = sim.now;
        sim.b
            .engine
            .inject(now, 2, Fault::Terminate(TermCode::RdmapCatastrophicGlobal))
            .unwrap();
        let start = sim.now;
        assert!(sim.run_until(Duration::from_secs(10), |s| s.b.state(2)
            == Some(QpState::Error)));
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
            .post_recv(
                2,
                RecvWr {
                    wr_id: 1,
                    sges: SgeList::single(Sge {
                        addr: iova,
                        length: 100,
                        lkey: stag,
                    }),
                },
            )
            .unwrap();
        let now = sim.now;
        sim.b
            .engine
            .inject(now, 2, Fault::Terminate(TermCode::RdmapLocalCatastrophic))
            .unwrap();
        // A sends before it hears of it: B must not complete the receive.
        let (astag, aiova) = registered_buffer(&mut sim.a, 4096);
        let mut wr = SendWr::new(1, SendOpcode::Send);
        wr.sges = SgeList::single(Sge {
            addr: aiova,
            length: 10,
            lkey: astag,
        });
        sim.a.engine.post_send(1, wr).unwrap();
        settle(&mut sim, 5);
        assert!(sim.b.completions.is_empty());
        assert_eq!(sim.b.state(2), Some(QpState::Error));
        assert_eq!(
            sim.b.engine.qp_info(2).unwrap().rq_posted,
            0,
            "the driver flushes"
        );
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
        assert!(sim
            .a
            .engine
            .post_recv(
                1,
                RecvWr {
                    wr_id: 1,
                    sges: SgeList::EMPTY
                }
            )
            .is_err());
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
        assert_eq!(
            sim.a.engine.create_qp(1, QpConfig::new(PD)),
            Err(EngineError::QpExists(1))
        );
        sim.a.engine.destroy_qp(1).unwrap();
        settle(&mut sim, 1);
        assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::Reset]);
        assert_eq!(sim.a.engine.destroy_qp(1), Err(EngineError::NoSuchQp(1)));
        let mut tiny = QpConfig::new(PD);
        tiny.sq_depth = 1;
        sim.a.engine.create_qp(9, tiny).unwrap();
        sim.a
            .engine
            .post_send(9, SendWr::new(1, SendOpcode::Send))
            .unwrap();
        assert_eq!(
            sim.a.engine.post_send(9, SendWr::new(2, SendOpcode::Send)),
            Err(EngineError::QueueFull)
        );
        let _ = (MockMemory::new(0), MockRegions::new());
    }
}
