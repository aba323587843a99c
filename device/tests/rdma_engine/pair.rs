//! QPs of one device connected by modify_qp (VT3_CMD_PAIR_QP): a loopback
//! connection inside guest a's TOE, its data path, its teardown, the
//! failures of a pair under way and the refusals.

use super::*;

const PORT_1: u16 = 50_001;
const PORT_2: u16 = 50_002;

/// A second QP on guest a, in a PD of its own, with its two buffers.
fn second_qp(g: &mut Guest, now: Instant) -> (QpRings, Mr, Mr) {
    let pdn = g.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let (scq, rcq) = (g.at(now).cq(64), g.at(now).cq(16));
    let qp = g.at(now).qp(pdn, scq, rcq, 16);
    let local = g.at(now).mr(pdn, 64 * 1024, Access::LocalWrite as u32);
    let exposed = g.at(now).mr(pdn, 64 * 1024, ALL);
    (qp, local, exposed)
}

fn pair(qpn: u32, peer: u32, port: u16) -> CmdPairQp {
    CmdPairQp { qpn: qpn.into(), peer_qpn: peer.into(), port: port.to_be_bytes(), reserved: 0.into() }
}

fn modify_state(qpn: u32, state: QpState) -> CmdModifyQp {
    CmdModifyQp {
        qpn: qpn.into(),
        mask: (ModifyMask::State as u32).into(),
        state: (state as u32).into(),
        ..Default::default()
    }
}

fn cm_events(g: &Guest, ty: EventType) -> Vec<EventCm> {
    g.events.iter().filter(|(t, _)| *t == ty).map(|(_, b)| read_struct(b).unwrap()).collect()
}

fn state(g: &Guest, qp: &QpRings) -> u32 {
    g.qp_status(qp).state.to_native()
}

#[test]
fn paired_qps_connect_in_the_loopback_and_move_data_both_ways() {
    let mut s = setup(16);
    let (q1_local, q1_exposed) = s.bufs[0];
    let now = s.sim.now;
    let (mut q2, q2_local, q2_exposed) = second_qp(&mut s.sim.a, now);
    let mut q1 = s.qa;
    // Work posted before the pair is up waits for it.
    s.sim.a.at(now).post_recv(&mut q2, 10, &q2_local, 0, 4096);
    s.sim.a.ram.write_bytes(q1_local.guest, b"paired by modify_qp");
    s.sim.a.at(now).post_send(&mut q1, &send_wqe(1, WrOpcode::Send, true, &[(q1_local, 0, 19)]));

    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, PORT_1)).unwrap();
    s.sim.run_for(Duration::from_millis(50));
    assert!(s.sim.a.events.is_empty(), "one side asked: nothing happens");
    assert_eq!(state(&s.sim.a, &q1), QpState::Idle as u32);
    assert_eq!(s.sim.a.cq_status(&q1.scq).prod.to_native(), 0, "the SEND waits, neither lost nor failed");

    let now = s.sim.now;
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q2.qpn, q1.qpn, PORT_2)).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| {
        sim.a.has_event(EventType::ConnectReply) && sim.a.has_event(EventType::Established)
    }));
    // The first to ask listened, the second connected, to its own address.
    let reply = cm_events(&s.sim.a, EventType::ConnectReply);
    let est = cm_events(&s.sim.a, EventType::Established);
    assert_eq!(reply.len(), 1);
    assert_eq!(est.len(), 1);
    assert_eq!((reply[0].qpn.to_native(), reply[0].status.to_native()), (q2.qpn, 0));
    assert_eq!((est[0].qpn.to_native(), est[0].conn_id.to_native()), (q1.qpn, 0));
    let ip = IPS[0].octets();
    assert_eq!((reply[0].local.ipv4, u16::from_be_bytes(reply[0].local.port)), (ip, PORT_2));
    assert_eq!((reply[0].remote.ipv4, u16::from_be_bytes(reply[0].remote.port)), (ip, PORT_1));
    assert_eq!(s.sim.b.events.len(), 0, "nothing reached the wire's other end");

    // The SEND posted early arrived.
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.a.cq_status(&q2.rcq).prod.to_native() == 1));
    let mut q2_rcq = q2.rcq;
    let c = s.sim.a.poll_cq(&mut q2_rcq)[0];
    assert_eq!((c.wr_id.to_native(), c.qpn.to_native(), c.status, c.byte_len.to_native()), (10, q2.qpn, 0, 19));
    assert_eq!(s.sim.a.ram.read_bytes(q2_local.guest, 19), b"paired by modify_qp");

    // WRITE q2 -> q1, READ q1 <- q2: each through the other's PD and STags.
    let data = pattern(10_000, 3);
    s.sim.a.ram.write_bytes(q2_local.guest + 8192, &data);
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut q2, &rdma_wqe(20, WrOpcode::Write, (q2_local, 8192, 10_000), &q1_exposed, 64));
    s.sim.a.ram.write_bytes(q2_exposed.guest + 4, b"read me back");
    s.sim.a.at(now).post_send(&mut q1, &rdma_wqe(2, WrOpcode::Read, (q1_local, 4096, 12), &q2_exposed, 4));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| {
        sim.a.cq_status(&q2.scq).prod.to_native() == 1 && sim.a.cq_status(&q1.scq).prod.to_native() == 2
    }));
    assert_eq!(s.sim.a.ram.read_bytes(q1_exposed.guest + 64, 10_000), data);
    assert_eq!(s.sim.a.ram.read_bytes(q1_local.guest + 4096, 12), b"read me back");
    let mut q1_scq = q1.scq;
    let ops: Vec<(u64, u8, u8)> =
        s.sim.a.poll_cq(&mut q1_scq).iter().map(|c| (c.wr_id.to_native(), c.opcode, c.status)).collect();
    assert_eq!(ops, vec![(1, WcOpcode::Send as u8, 0), (2, WcOpcode::Read as u8, 0)]);
    // A WRITE beyond q1's exposed buffer: the TPT check applies unchanged.
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut q2, &rdma_wqe(21, WrOpcode::Write, (q2_local, 0, 4096), &q1_exposed, 62 * 1024));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| state(&sim.a, &q2) == QpState::Error as u32));
    let terminate = s.sim.a.qp_events();
    assert_eq!(terminate.len(), 2, "{terminate:?}");
    assert!(terminate.iter().any(|&(q, code, _)| q == q2.qpn && code == QpEvent::TerminateReceived as u32));
    assert!(terminate.iter().any(|&(q, code, _)| q == q1.qpn && code == QpEvent::TerminateSent as u32));
}

#[test]
fn destroying_one_paired_qp_resets_the_other_once() {
    let mut s = setup(16);
    let now = s.sim.now;
    let (q2, _, _) = second_qp(&mut s.sim.a, now);
    let q1 = s.qa;
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q2.qpn, q1.qpn, PORT_2)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, PORT_1)).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.has_event(EventType::ConnectReply)));
    assert_eq!(state(&s.sim.a, &q1), QpState::Rts as u32);
    s.sim.a.take_events();
    let now = s.sim.now;
    s.sim.a.at(now).cmd(Cmd::DestroyQp, &CmdHandle { handle: q1.qpn.into(), reserved: 0.into() }).unwrap();
    s.sim.run_for(Duration::from_secs(1));
    assert_eq!(s.sim.a.qp_events(), vec![(q2.qpn, QpEvent::Reset as u32, 0)]);
    assert_eq!(state(&s.sim.a, &q2), QpState::Error as u32);
    assert_ne!(s.sim.a.qp_status(&q2).flags.to_native() & QpStatusFlag::Error as u32, 0);
}

/// A pair under way fails as a whole: each QP hears of it exactly once.
#[test]
fn a_pair_that_never_connected_fails_on_both_sides_once() {
    // The connecting QP destroyed before its request came in: the
    // listening one is reset.
    let mut s = setup(16);
    let now = s.sim.now;
    let (q2, _, _) = second_qp(&mut s.sim.a, now);
    let q1 = s.qa;
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, PORT_1)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q2.qpn, q1.qpn, PORT_2)).unwrap();
    s.sim.a.at(now).cmd(Cmd::DestroyQp, &CmdHandle { handle: q2.qpn.into(), reserved: 0.into() }).unwrap();
    s.sim.run_for(Duration::from_secs(1));
    assert_eq!(s.sim.a.qp_events(), vec![(q1.qpn, QpEvent::Reset as u32, 0)]);
    assert!(cm_events(&s.sim.a, EventType::Established).is_empty());
    assert_eq!(state(&s.sim.a, &q1), QpState::Error as u32);

    // The listening QP moved to ERROR: the connecting one's open fails.
    let mut s = setup(16);
    let now = s.sim.now;
    let (q2, _, _) = second_qp(&mut s.sim.a, now);
    let q1 = s.qa;
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, PORT_1)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q2.qpn, q1.qpn, PORT_2)).unwrap();
    s.sim.a.at(now).cmd(Cmd::ModifyQp, &modify_state(q1.qpn, QpState::Error)).unwrap();
    s.sim.run_for(Duration::from_secs(1));
    let replies = cm_events(&s.sim.a, EventType::ConnectReply);
    assert_eq!(replies.len(), 1);
    assert_eq!((replies[0].qpn.to_native(), replies[0].status.to_native()), (q2.qpn, 103), "ECONNABORTED");
    // The listener's reset goes out too; the driver, which ended it, drops it.
    assert_eq!(s.sim.a.qp_events(), vec![(q1.qpn, QpEvent::Reset as u32, 0)]);
    assert!(cm_events(&s.sim.a, EventType::Established).is_empty());
    assert_eq!(state(&s.sim.a, &q2), QpState::Error as u32);
}

#[test]
fn a_request_holds_while_the_qp_stays_idle_and_can_be_replaced() {
    let mut s = setup(16);
    let now = s.sim.now;
    let (q2, _, _) = second_qp(&mut s.sim.a, now);
    let (q3, _, _) = second_qp(&mut s.sim.a, now);
    let q1 = s.qa;
    // q1 asks for q2, then for q3 instead: q2 asking back pairs nothing.
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, PORT_1)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q3.qpn, PORT_1)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q2.qpn, q1.qpn, PORT_2)).unwrap();
    s.sim.run_for(Duration::from_millis(200));
    assert!(s.sim.a.events.is_empty(), "{:?}", s.sim.a.events);
    // A state change drops a request: q2's, here.
    s.sim.a.at(now).cmd(Cmd::ModifyQp, &modify_state(q2.qpn, QpState::Error)).unwrap();
    s.sim.a.at(now).cmd(Cmd::ModifyQp, &modify_state(q2.qpn, QpState::Idle)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, PORT_1)).unwrap();
    s.sim.run_for(Duration::from_millis(200));
    assert!(s.sim.a.events.is_empty(), "{:?}", s.sim.a.events);
    // q3 asks back for q1: connected.
    let now = s.sim.now;
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q3.qpn, PORT_1)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q3.qpn, q1.qpn, 50_003)).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.has_event(EventType::ConnectReply)));
    assert_eq!(state(&s.sim.a, &q1), QpState::Rts as u32);
    assert_eq!(state(&s.sim.a, &q3), QpState::Rts as u32);
    // Connected QPs take no other pair (nor ask again).
    let now = s.sim.now;
    assert_eq!(s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q2.qpn, q1.qpn, PORT_2)), Err(Status::State));
    assert_eq!(s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q3.qpn, PORT_1)), Err(Status::State));
}

#[test]
fn pair_requests_are_validated() {
    let mut s = setup(16);
    let now = s.sim.now;
    let (q2, _, _) = second_qp(&mut s.sim.a, now);
    let q1 = s.qa;
    let a = &mut s.sim.a;
    assert_eq!(a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q1.qpn, PORT_1)), Err(Status::Invalid), "itself");
    assert_eq!(a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, 0)), Err(Status::Invalid), "port 0");
    assert_eq!(a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, 999, PORT_1)), Err(Status::NotFound), "no such peer");
    assert_eq!(a.at(now).cmd(Cmd::PairQp, &pair(999, q1.qpn, PORT_1)), Err(Status::NotFound), "no such QP");
    // A kernel QP, on either side.
    let pdn = a.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let kernel = {
        let cq = a.at(now).cq(16);
        let (sq_pbl, _) = a.ram.pages(4);
        let (rq_pbl, _) = a.ram.pages(4);
        let status = a.ram.status_page();
        let args = CmdCreateQp {
            sq_pbl_addr: sq_pbl.into(),
            rq_pbl_addr: rq_pbl.into(),
            status_addr: status.into(),
            sq_npages: 4.into(),
            rq_npages: 4.into(),
            sq_depth: 16.into(),
            rq_depth: 16.into(),
            pdn: pdn.into(),
            send_cqn: cq.cqn.into(),
            recv_cqn: cq.cqn.into(),
            max_send_sge: 1.into(),
            max_recv_sge: 1.into(),
            max_inline: 0.into(),
            flags: (QpFlag::Kernel as u32).into(),
            srqn: 0.into(),
        };
        a.at(now).handle(Cmd::CreateQp, &args)
    };
    assert_eq!(a.at(now).cmd(Cmd::PairQp, &pair(kernel, q1.qpn, PORT_1)), Err(Status::Invalid), "kernel QP");
    assert_eq!(a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, kernel, PORT_1)), Err(Status::Invalid), "kernel peer");
    // A QP in a CM connection (and its peer on b) takes no pair.
    connect(&mut s);
    let now = s.sim.now;
    assert_eq!(s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q2.qpn, q1.qpn, PORT_2)), Err(Status::State), "peer connected");
    assert_eq!(s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, PORT_1)), Err(Status::State), "QP connected");
    // No address, no engine: nothing to pair in.
    let mut g = guest(0);
    let now = Instant::from_millis(0);
    let pdn = g.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let cq = g.at(now).cq(16);
    let (x, y) = (g.at(now).qp(pdn, cq, cq, 16), g.at(now).qp(pdn, cq, cq, 16));
    assert_eq!(g.at(now).cmd(Cmd::PairQp, &pair(x.qpn, y.qpn, PORT_1)), Err(Status::State), "no address");
    // Two pairs may not listen on one port.
    let mut s = setup(16);
    let now = s.sim.now;
    let (q2, _, _) = second_qp(&mut s.sim.a, now);
    let (q3, _, _) = second_qp(&mut s.sim.a, now);
    let (q4, _, _) = second_qp(&mut s.sim.a, now);
    let q1 = s.qa;
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q1.qpn, q2.qpn, PORT_1)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q2.qpn, q1.qpn, PORT_2)).unwrap();
    s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q3.qpn, q4.qpn, PORT_1)).unwrap();
    assert_eq!(s.sim.a.at(now).cmd(Cmd::PairQp, &pair(q4.qpn, q3.qpn, 50_004)), Err(Status::Busy), "port taken");
}
