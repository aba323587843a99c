//! Two RNICs wired back to back, each driven through the control channel
//! as vt3.ko drives it and through rings in (mock) guest memory as libvt3
//! drives them: connection setup, SEND/RECV, RDMA WRITE and READ, CQ
//! arming and overflow, a malformed WQE, and graceful and abortive
//! disconnects with their events. The wire is the engine crate's
//! simulated one, in virtual time: no guests, no sockets, no sleeping.

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::sync::atomic::Ordering;

use vm_memory::{ByteValued, Bytes, GuestAddress, Le32};
use vt3_iwarp::sim::{Sim, WireConfig, IPS, MACS};
use vt3_iwarp::toe::{Duration, Instant};
use vt3d::abi::*;
use vt3d::rnic::poll::MAX_WINDOW;
use vt3d::rnic::{Limits, Rnic};
use vt3d::testing::{self, private_data as pd_bytes, rdma_wqe, send_wqe, sockaddr, CqRing, Local, Mr, QpRings};

#[path = "rdma_engine/chaos.rs"]
mod chaos;
#[path = "rdma_engine/pair.rs"]
mod pair;
#[path = "rdma_engine/srq.rs"]
mod srq;

const PORT: u16 = 7174;
const PAGE: u64 = VT3_PAGE_SIZE;
const MEM: usize = 8 << 20;

/// One guest of the simulation: vt3.ko and libvt3 over an RNIC in this
/// process (vt3d's testing::Guest).
type Guest = testing::Guest<Local>;

/// Guest `index` with the default limits, after first contact.
fn guest(index: usize) -> Guest {
    Guest::local(index, Rnic::new(Limits::default(), 1500))
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(151).wrapping_add(seed)).collect()
}

const ALL: u32 = Access::LocalWrite as u32 | Access::RemoteWrite as u32 | Access::RemoteRead as u32;

/// Both guests with an address, a PD, CQs, a QP and two buffers each.
struct Setup {
    sim: Sim<Guest, Guest>,
    qa: QpRings,
    qb: QpRings,
    /// Per guest: a source/sink buffer and a buffer the peer accesses.
    bufs: [(Mr, Mr); 2],
}

fn setup(recv_cq_depth: u32) -> Setup {
    let mut sim = Sim::new(guest(0), guest(1), WireConfig::default());
    let now = sim.now;
    let make = |g: &mut Guest, ip: [u8; 4]| {
        g.at(now).set_addr(ip).unwrap();
        let pdn = g.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
        let scq = g.at(now).cq(64);
        let rcq = g.at(now).cq(recv_cq_depth);
        let qp = g.at(now).qp(pdn, scq, rcq, 16);
        let local = g.at(now).mr(pdn, 64 * 1024, Access::LocalWrite as u32);
        let exposed = g.at(now).mr(pdn, 64 * 1024, ALL);
        (qp, (local, exposed))
    };
    let (qa, bufs_a) = make(&mut sim.a, IPS[0].octets());
    let (qb, bufs_b) = make(&mut sim.b, IPS[1].octets());
    Setup { sim, qa, qb, bufs: [bufs_a, bufs_b] }
}

/// CONNECT from `qp` to guest b's listener.
fn connect_args(qp: &QpRings, local_port: u16, pd: &[u8]) -> CmdConnect {
    testing::connect_args(qp.qpn, local_port, sockaddr(IPS[1].octets(), PORT), MACS[1], pd)
}

fn accept_args(conn_id: Le32, qpn: u32, pd: &[u8]) -> CmdAccept {
    testing::accept_args(conn_id.to_native(), qpn, pd)
}

fn listen_args(port: u16) -> CmdListen {
    testing::listen_args(port, 8)
}

/// LISTEN, CONNECT, CONNECT_REQUEST, ACCEPT, ESTABLISHED / CONNECT_REPLY.
fn connect(s: &mut Setup) {
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::Listen, &listen_args(PORT)).unwrap();
    s.sim.a.at(now).cmd(Cmd::Connect, &connect_args(&s.qa, 40_001, b"hello from a")).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.has_event(EventType::ConnectRequest)));
    let req = s.sim.b.cm_event(EventType::ConnectRequest).unwrap();
    assert_ne!(req.conn_id.to_native(), 0);
    assert_eq!(req.private_data.get(req.pd_len.to_native()), b"hello from a");
    assert_eq!((req.local.ipv4, u16::from_be_bytes(req.local.port)), (IPS[1].octets(), PORT));
    assert_eq!((req.remote.ipv4, u16::from_be_bytes(req.remote.port)), (IPS[0].octets(), 40_001));
    assert_eq!((req.ird.to_native(), req.ord.to_native()), (8, 8));

    let accept = accept_args(req.conn_id, s.qb.qpn, b"hi, a");
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::Accept, &accept).unwrap();
    let est = s.sim.b.cm_event(EventType::Established).expect("ESTABLISHED follows ACCEPT's response");
    assert_eq!((est.qpn.to_native(), est.conn_id, est.status.to_native()), (s.qb.qpn, req.conn_id, 0));
    assert_eq!(s.sim.b.qp_status(&s.qb).state.to_native(), QpState::Rts as u32);
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.has_event(EventType::ConnectReply)));
    let reply = s.sim.a.cm_event(EventType::ConnectReply).unwrap();
    assert_eq!((reply.qpn.to_native(), reply.status.to_native()), (s.qa.qpn, 0));
    assert_eq!(reply.private_data.get(reply.pd_len.to_native()), b"hi, a");
    assert_eq!((reply.remote.ipv4, u16::from_be_bytes(reply.remote.port)), (IPS[1].octets(), PORT));
    assert_eq!(s.sim.a.qp_status(&s.qa).state.to_native(), QpState::Rts as u32);
    s.sim.a.take_events();
    s.sim.b.take_events();
}

#[test]
fn connect_transfer_and_close_gracefully() {
    let mut s = setup(16);
    let (a_local, a_exposed) = s.bufs[0];
    let (b_local, b_exposed) = s.bufs[1];
    let now = s.sim.now;
    // Receives posted before the connection exists.
    for i in 0..4 {
        s.sim.b.at(now).post_recv(&mut s.qb, 100 + i, &b_local, i * 4096, 4096);
    }
    // The first receive finds the device idle and rings; the device then
    // polls the RQ for a window, so the next three need no doorbell.
    assert_eq!(s.sim.b.doorbells, 1, "one doorbell, then the device polls");
    assert_eq!(s.sim.b.qp_status(&s.qb).flags.to_native() & QpStatusFlag::RqIdle as u32, 0);
    connect(&mut s);

    // SEND into a posted receive.
    let data = pattern(3000, 1);
    s.sim.a.ram.write_bytes(a_local.guest, &data);
    let now = s.sim.now;
    s.sim
        .a
        .at(now)
        .post_send(&mut s.qa, &send_wqe(1, WrOpcode::Send, true, &[(a_local, 0, 1000), (a_local, 1000, 2000)]));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.b.cq_status(&s.qb.rcq).prod.to_native() == 1));
    let mut rcq = s.qb.rcq;
    let cqes = s.sim.b.poll_cq(&mut rcq);
    assert_eq!(cqes.len(), 1);
    let c = cqes[0];
    assert_eq!((c.wr_id.to_native(), c.qpn.to_native(), c.opcode, c.status), (100, s.qb.qpn, WcOpcode::Recv as u8, 0));
    assert_eq!(c.wqe_idx.to_native(), 0, "a CQE names its WQE: the RQ's first");
    assert_eq!(c.byte_len.to_native(), 3000);
    assert_eq!(s.sim.b.ram.read_bytes(b_local.guest, 3000), data);
    assert_eq!(s.sim.b.qp_status(&s.qb).rq_cons.to_native(), 1);
    let mut scq = s.qa.scq;
    let cqes = s.sim.a.poll_cq(&mut scq);
    assert_eq!((cqes.len(), cqes[0].wr_id.to_native(), cqes[0].opcode), (1, 1, WcOpcode::Send as u8));
    let st = s.sim.a.qp_status(&s.qa);
    assert_eq!(st.sq_cons.to_native(), 1);
    assert_ne!(st.flags.to_native() & QpStatusFlag::SqIdle as u32, 0, "idle again: the next post rings");

    // RDMA WRITE into b's exposed buffer, READ it back into a.
    let write = pattern(20_000, 7);
    s.sim.a.ram.write_bytes(a_local.guest + 8192, &write);
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut s.qa, &rdma_wqe(2, WrOpcode::Write, (a_local, 8192, 20_000), &b_exposed, 100));
    s.sim.a.at(now).post_send(&mut s.qa, &rdma_wqe(3, WrOpcode::Read, (a_local, 32_768, 20_000), &b_exposed, 100));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.a.cq_status(&s.qa.scq).prod.to_native() == 3));
    let cqes = s.sim.a.poll_cq(&mut scq);
    let got: Vec<(u64, u8, u8, u32, u32)> = cqes
        .iter()
        .map(|c| (c.wr_id.to_native(), c.opcode, c.status, c.byte_len.to_native(), c.wqe_idx.to_native()))
        .collect();
    assert_eq!(got, vec![(2, WcOpcode::Write as u8, 0, 20_000, 1), (3, WcOpcode::Read as u8, 0, 20_000, 2)]);
    assert_eq!(s.sim.b.ram.read_bytes(b_exposed.guest + 100, 20_000), write);
    assert_eq!(s.sim.a.ram.read_bytes(a_local.guest + 32_768, 20_000), write);
    // b's side of a WRITE or READ writes no CQE.
    assert!(s.sim.b.poll_cq(&mut rcq).is_empty());

    // b READs a's exposed buffer too (the other direction).
    s.sim.a.ram.write_bytes(a_exposed.guest, b"exposed by a");
    let now = s.sim.now;
    s.sim.b.at(now).post_send(&mut s.qb, &rdma_wqe(50, WrOpcode::Read, (b_local, 60_000, 12), &a_exposed, 0));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.b.cq_status(&s.qb.scq).prod.to_native() == 1));
    assert_eq!(s.sim.b.ram.read_bytes(b_local.guest + 60_000, 12), b"exposed by a");

    // An unsignaled SEND: no CQE on a, but its slot is retired; an armed
    // receive CQ raises one event.
    let mut arm = CmdArmCq { cqn: rcq.cqn.into(), flags: (ArmFlag::Next as u32).into() };
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::ArmCq, &arm).unwrap();
    assert!(!s.sim.b.has_event(EventType::CqCompletion));
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(4, WrOpcode::Send, false, &[(a_local, 0, 10)]));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.b.has_event(EventType::CqCompletion)));
    let ev: Event = read_struct(&s.sim.b.events.get(0).unwrap().1).unwrap();
    assert_eq!(ev.handle.to_native(), rcq.cqn);
    assert_eq!(s.sim.b.poll_cq(&mut rcq).len(), 1);
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.a.qp_status(&s.qa).sq_cons.to_native() == 4));
    assert!(s.sim.a.poll_cq(&mut scq).is_empty(), "unsignaled: no CQE");
    // SEND_SE wakes a CQ armed for solicited completions only.
    arm.flags = (ArmFlag::Solicited as u32).into();
    s.sim.b.take_events();
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::ArmCq, &arm).unwrap();
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(5, WrOpcode::Send, true, &[(a_local, 0, 10)]));
    s.sim.run_for(Duration::from_millis(50));
    assert!(!s.sim.b.has_event(EventType::CqCompletion), "not solicited");
    s.sim.a.at(s.sim.now).post_send(&mut s.qa, &send_wqe(6, WrOpcode::SendSe, true, &[(a_local, 0, 10)]));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.b.has_event(EventType::CqCompletion)));
    let cqes = s.sim.b.poll_cq(&mut rcq);
    assert_eq!(cqes.last().unwrap().flags & CqeFlag::Solicited as u8, CqeFlag::Solicited as u8);

    // Graceful close from a, with a SEND posted just before it: the SEND
    // still completes, then the FIN goes out.
    s.sim.a.take_events();
    s.sim.b.take_events();
    let now = s.sim.now;
    s.sim.b.at(now).post_recv(&mut s.qb, 200, &b_local, 0, 4096);
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(7, WrOpcode::Send, true, &[(a_local, 0, 100)]));
    s.sim.a.at(now).cmd(Cmd::Disconnect, &CmdDisconnect { qpn: s.qa.qpn.into(), abort: 0.into() }).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(5), |sim| {
        sim.a.qp_status(&s.qa).state.to_native() == QpState::Idle as u32
            && sim.b.qp_status(&s.qb).state.to_native() == QpState::Idle as u32
    }));
    let close = QpEvent::CloseComplete as u32;
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, close, 0)], "LLP close complete, nothing outstanding");
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::PeerClose as u32, 0), (s.qb.qpn, close, 0)]);
    // The unsignaled SEND was SQ WQE 3: the WQE indices skip it.
    let ids: Vec<(u64, u8, u32)> =
        s.sim.a.poll_cq(&mut scq).iter().map(|c| (c.wr_id.to_native(), c.status, c.wqe_idx.to_native())).collect();
    assert_eq!(ids, vec![(5, 0, 4), (6, 0, 5), (7, 0, 6)]);
    let last = *s.sim.b.poll_cq(&mut rcq).last().unwrap();
    assert_eq!((last.wr_id.to_native(), last.wqe_idx.to_native()), (200, 4));
    // IDLE after a clean close: every WQE is accounted for.
    let st = s.sim.b.qp_status(&s.qb);
    assert_eq!((st.rq_cons.to_native(), st.flags.to_native() & QpStatusFlag::Error as u32), (s.qb.rq_prod, 0));
}

/// A receive left over at a clean close stays between rq_cons and rq_prod
/// for the provider to flush; the closed QP takes no new work and no new
/// connection until ERROR -> IDLE resets it.
#[test]
fn a_closed_qp_leaves_its_leftovers_to_the_provider() {
    let mut s = setup(16);
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    s.sim.b.at(now).post_recv(&mut s.qb, 1, &b_local, 0, 4096);
    connect(&mut s);
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::Disconnect, &CmdDisconnect { qpn: s.qb.qpn.into(), abort: 0.into() }).unwrap();
    assert!(s
        .sim
        .run_until(Duration::from_secs(5), |sim| { sim.b.qp_status(&s.qb).state.to_native() == QpState::Idle as u32 }));
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::CloseComplete as u32, 0)]);
    assert_eq!(s.sim.b.qp_status(&s.qb).rq_cons.to_native(), 0, "the receive is the provider's to flush");
    // The peer's graceful disconnect after the close completed (its driver
    // had not heard of it yet): done, not an error, and nothing changes.
    assert!(s
        .sim
        .run_until(Duration::from_secs(5), |sim| { sim.a.qp_status(&s.qa).state.to_native() == QpState::Idle as u32 }));
    let now = s.sim.now;
    assert_eq!(
        s.sim.a.at(now).cmd(Cmd::Disconnect, &CmdDisconnect { qpn: s.qa.qpn.into(), abort: 0.into() }),
        Ok(Vec::new())
    );
    assert_eq!(s.sim.a.qp_status(&s.qa).state.to_native(), QpState::Idle as u32);
    // Posting to the closed QP: nothing is fetched (the provider flushes it).
    let now = s.sim.now;
    s.sim.b.at(now).post_recv(&mut s.qb, 2, &b_local, 0, 4096);
    let info = s.sim.b.dev.rnic.offload().unwrap().engine().qp_info(s.qb.qpn).unwrap();
    assert_eq!(info.rq_posted, 0);
    assert_eq!(s.sim.b.at(now).cmd(Cmd::Connect, &connect_args(&s.qb, 40_009, b"")), Err(Status::State));
    let modify = |state: QpState| CmdModifyQp {
        qpn: s.qb.qpn.into(),
        mask: (ModifyMask::State as u32).into(),
        state: (state as u32).into(),
        ..Default::default()
    };
    s.sim.b.at(now).cmd(Cmd::ModifyQp, &modify(QpState::Error)).unwrap();
    s.sim.b.at(now).cmd(Cmd::ModifyQp, &modify(QpState::Idle)).unwrap();
    let st = s.sim.b.qp_status(&s.qb);
    assert_eq!((st.rq_cons.to_native(), st.rq_prod.to_native()), (2, 2), "reset: all flushed");
    s.sim.b.at(now).post_recv(&mut s.qb, 3, &b_local, 0, 4096);
    let info = s.sim.b.dev.rnic.offload().unwrap().engine().qp_info(s.qb.qpn).unwrap();
    assert_eq!(info.rq_posted, 1, "reusable");
}

#[test]
fn abortive_disconnect_resets_the_peer() {
    let mut s = setup(16);
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    s.sim.b.at(now).post_recv(&mut s.qb, 1, &b_local, 0, 4096);
    connect(&mut s);
    let now = s.sim.now;
    s.sim.a.at(now).cmd(Cmd::Disconnect, &CmdDisconnect { qpn: s.qa.qpn.into(), abort: 1.into() }).unwrap();
    // The local side knows at once.
    let st = s.sim.a.qp_status(&s.qa);
    assert_eq!(st.state.to_native(), QpState::Error as u32);
    assert_ne!(st.flags.to_native() & QpStatusFlag::Error as u32, 0);
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::CloseComplete as u32, 0)]);
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| !sim.b.qp_events().is_empty()));
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::Reset as u32, 0)]);
    let st = s.sim.b.qp_status(&s.qb);
    assert_eq!(st.state.to_native(), QpState::Error as u32);
    assert_ne!(st.flags.to_native() & QpStatusFlag::Error as u32, 0);
    for cq in [s.qb.scq, s.qb.rcq] {
        assert_ne!(s.sim.b.cq_status(&cq).flags.to_native() & CqStatusFlag::Error as u32, 0);
    }
    // No CQE after the error: the provider flushes the posted receive.
    let mut rcq = s.qb.rcq;
    assert!(s.sim.b.poll_cq(&mut rcq).is_empty());
    assert_eq!(s.sim.b.qp_status(&s.qb).rq_cons.to_native(), 0);

    // ERROR -> IDLE makes the QP reusable; its indices catch up.
    let to_idle = CmdModifyQp {
        qpn: s.qb.qpn.into(),
        mask: (ModifyMask::State as u32).into(),
        state: (QpState::Idle as u32).into(),
        ..Default::default()
    };
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::ModifyQp, &to_idle).unwrap();
    let st = s.sim.b.qp_status(&s.qb);
    assert_eq!((st.state.to_native(), st.rq_cons.to_native()), (QpState::Idle as u32, 1));
    assert_eq!(st.flags.to_native() & QpStatusFlag::Error as u32, 0);
}

#[test]
fn a_malformed_wqe_fails_in_order() {
    let mut s = setup(16);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    s.sim.b.at(now).post_recv(&mut s.qb, 1, &b_local, 0, 4096);
    connect(&mut s);
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(10, WrOpcode::Send, true, &[(a_local, 0, 64)]));
    let mut bad = send_wqe(11, WrOpcode::Send, true, &[]);
    bad.opcode = 10; // one past VT3_WR_BIND_MW: no such opcode
    s.sim.a.at(now).post_send(&mut s.qa, &bad);
    assert!(s
        .sim
        .run_until(Duration::from_secs(3), |sim| !sim.a.qp_events().is_empty() && !sim.b.qp_events().is_empty()));
    let mut scq = s.qa.scq;
    let cqes = s.sim.a.poll_cq(&mut scq);
    let got: Vec<(u64, u8)> = cqes.iter().map(|c| (c.wr_id.to_native(), c.status)).collect();
    assert_eq!(got, vec![(10, 0), (11, WcStatus::LocQpOpErr as u8)]);
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::BadWqe as u32, WcStatus::LocQpOpErr as u32)]);
    // The peer is told with a TERMINATE (RDMAP, local catastrophic).
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::TerminateReceived as u32, 0x0000)]);
    assert!(s.sim.run_until(Duration::from_secs(5), |sim| {
        sim.a.qp_status(&s.qa).state.to_native() == QpState::Error as u32
    }));
}

#[test]
fn cq_overflow_is_reported_not_wrapped() {
    let mut s = setup(2);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    for i in 0..4 {
        s.sim.b.at(now).post_recv(&mut s.qb, i, &b_local, i * 4096, 4096);
    }
    connect(&mut s);
    let now = s.sim.now;
    for i in 0..3 {
        s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(i, WrOpcode::Send, true, &[(a_local, 0, 8)]));
    }
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.b.has_event(EventType::CqError)));
    let st = s.sim.b.cq_status(&s.qb.rcq);
    assert_eq!(st.prod.to_native(), 2);
    assert_ne!(st.flags.to_native() & CqStatusFlag::Overflow as u32, 0);
    let ev: Event = read_struct(&s.sim.b.events.iter().find(|(t, _)| *t == EventType::CqError).unwrap().1).unwrap();
    assert_eq!(ev.handle.to_native(), s.qb.rcq.cqn);
    let mut rcq = s.qb.rcq;
    let ids: Vec<u64> = s.sim.b.poll_cq(&mut rcq).iter().map(|c| c.wr_id.to_native()).collect();
    assert_eq!(ids, vec![0, 1], "the ring was not overwritten");
}

#[test]
fn refused_and_rejected_connections() {
    let mut s = setup(16);
    // Nobody listens: the SYN goes to b's guest kernel (not simulated
    // here, so unanswered) and the TCP handshake times out.
    let now = s.sim.now;
    s.sim.a.at(now).cmd(Cmd::Connect, &connect_args(&s.qa, 40_002, b"")).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(120), |sim| sim.a.has_event(EventType::ConnectReply)));
    let reply = s.sim.a.cm_event(EventType::ConnectReply).unwrap();
    assert_eq!(reply.status.to_native(), 110, "ETIMEDOUT");
    assert_eq!(s.sim.a.qp_status(&s.qa).state.to_native(), QpState::Error as u32);

    // A second QP, and a listener that rejects.
    let now = s.sim.now;
    let (scq, rcq) = (s.qa.scq, s.qa.rcq);
    let qa2 = s.sim.a.at(now).qp(1, scq, rcq, 16);
    s.sim.a.take_events();
    s.sim.b.at(now).cmd(Cmd::Listen, &listen_args(PORT)).unwrap();
    assert_eq!(s.sim.b.at(now).cmd(Cmd::Listen, &listen_args(PORT)), Err(Status::Busy));
    s.sim.a.at(now).cmd(Cmd::Connect, &connect_args(&qa2, 40_003, b"knock")).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.has_event(EventType::ConnectRequest)));
    let req = s.sim.b.cm_event(EventType::ConnectRequest).unwrap();
    let reject =
        CmdReject { conn_id: req.conn_id, pd_len: 4.into(), reserved: 0.into(), private_data: pd_bytes(b"nope") };
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::Reject, &reject).unwrap();
    assert_eq!(s.sim.b.at(now).cmd(Cmd::Reject, &reject), Err(Status::NotFound), "answered already");
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.has_event(EventType::ConnectReply)));
    let reply = s.sim.a.cm_event(EventType::ConnectReply).unwrap();
    assert_eq!((reply.qpn.to_native(), reply.status.to_native()), (qa2.qpn, 111), "ECONNREFUSED");
    assert_eq!(reply.private_data.get(reply.pd_len.to_native()), b"nope");
    s.sim.b.at(now).cmd(Cmd::Unlisten, &listen_args(PORT)).unwrap();
    assert_eq!(s.sim.b.at(now).cmd(Cmd::Unlisten, &listen_args(PORT)), Err(Status::NotFound));
}

#[test]
fn connection_commands_are_validated() {
    let mut g = guest(0);
    let now = Instant::from_millis(1);
    let pdn = g.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let cq = g.at(now).cq(16);
    let qp = g.at(now).qp(pdn, cq, cq, 16);
    // Before SET_ADDR there is no TOE.
    assert_eq!(g.at(now).cmd(Cmd::Listen, &listen_args(PORT)), Err(Status::State));
    assert_eq!(g.at(now).cmd(Cmd::Connect, &connect_args(&qp, 1, b"")), Err(Status::State));
    assert_eq!(g.at(now).set_addr([224, 0, 0, 1]), Err(Status::Invalid), "not unicast");
    g.at(now).set_addr(IPS[0].octets()).unwrap();
    g.at(now).set_addr(IPS[0].octets()).unwrap();

    let good = connect_args(&qp, 40_000, b"pd");
    let mut bad_remote_ip = good;
    bad_remote_ip.remote.ipv4 = [255, 255, 255, 255];
    // Our own address is a loopback connection, but not to the local end itself.
    let mut to_self = good;
    to_self.remote = sockaddr(IPS[0].octets(), 40_000);
    let mut foreign_local = good;
    foreign_local.local.ipv4 = [10, 9, 9, 9];
    let cases: Vec<(CmdConnect, Status)> = vec![
        (CmdConnect { pd_len: 513.into(), ..good }, Status::Invalid),
        (CmdConnect { pd_len: 512.into(), ..good }, Status::Invalid), // 508 left in MPA revision 2
        (CmdConnect { qpn: 99.into(), ..good }, Status::NotFound),
        (CmdConnect { ird: 9.into(), ..good }, Status::Invalid),
        (CmdConnect { ord: u32::MAX.into(), ..good }, Status::Invalid),
        (CmdConnect { local: sockaddr([0; 4], 0), ..good }, Status::Invalid),
        (CmdConnect { remote: sockaddr(IPS[1].octets(), 0), ..good }, Status::Invalid),
        (CmdConnect { next_hop: [0xff; 6], ..good }, Status::Invalid),
        (CmdConnect { next_hop: [0; 6], ..good }, Status::Invalid),
        (bad_remote_ip, Status::Invalid),
        (to_self, Status::Invalid),
        (foreign_local, Status::Invalid),
    ];
    for (args, want) in cases {
        assert_eq!(g.at(now).cmd(Cmd::Connect, &args), Err(want), "{args:?}");
    }
    let accept = CmdAccept { conn_id: 1.into(), qpn: qp.qpn.into(), ..Default::default() };
    assert_eq!(g.at(now).cmd(Cmd::Accept, &accept), Err(Status::NotFound), "unknown conn_id");
    assert_eq!(g.at(now).cmd(Cmd::Accept, &CmdAccept { pd_len: 600.into(), ..accept }), Err(Status::Invalid));
    let reject = CmdReject { conn_id: 7.into(), ..Default::default() };
    assert_eq!(g.at(now).cmd(Cmd::Reject, &reject), Err(Status::NotFound));
    assert_eq!(g.at(now).cmd(Cmd::Listen, &listen_args(0)), Err(Status::Invalid));
    assert_eq!(g.at(now).cmd(Cmd::Unlisten, &listen_args(5)), Err(Status::NotFound));
    let disconnect = |abort: u32| CmdDisconnect { qpn: qp.qpn.into(), abort: abort.into() };
    assert_eq!(g.at(now).cmd(Cmd::Disconnect, &disconnect(2)), Err(Status::Invalid));
    assert_eq!(g.at(now).cmd(Cmd::Disconnect, &disconnect(0)), Err(Status::State), "not connected");
    assert_eq!(
        g.at(now).cmd(Cmd::Disconnect, &CmdDisconnect { qpn: 77.into(), abort: 0.into() }),
        Err(Status::NotFound)
    );
    let db = CmdDoorbell { qpn: qp.qpn.into(), queues: 8.into() };
    assert_eq!(g.at(now).cmd(Cmd::Doorbell, &db), Err(Status::Invalid));

    // A good CONNECT takes the QP; a second one finds it busy.
    g.at(now).cmd(Cmd::Connect, &good).unwrap();
    assert_eq!(g.at(now).cmd(Cmd::Connect, &good), Err(Status::State));
    // Destroying it mid-connect is fine; the TOE forgets the connection.
    g.at(now).cmd(Cmd::DestroyQp, &CmdHandle { handle: qp.qpn.into(), reserved: 0.into() }).unwrap();
    let mut uplink = Vec::new();
    g.dev.rnic.service(now, &g.ram.mem, &mut |f| uplink.push(f.to_vec()));
    let mut tcbs = 0;
    g.dev.rnic.offload().unwrap().engine().for_each_tcb(&mut |_| tcbs += 1);
    assert_eq!(tcbs, 0);
    // A changed address starts a new engine; 0.0.0.0 stops it.
    g.at(now).set_addr([10, 33, 0, 9]).unwrap();
    assert_eq!(g.dev.rnic.offload().unwrap().ip().octets(), [10, 33, 0, 9]);
    g.at(now).set_addr([0; 4]).unwrap();
    assert!(g.dev.rnic.offload().is_none());
}

/// Random connection commands against a live engine: responses only.
/// Each command is answered with a status (only a good doorbell goes
/// unanswered), some get through to the engine, and afterwards the
/// engine still serves well-formed commands with its books in order.
#[test]
fn random_connection_commands_never_panic() {
    let mut g = guest(0);
    let now = Instant::from_millis(1);
    g.at(now).set_addr(IPS[0].octets()).unwrap();
    let pdn = g.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let cq = g.at(now).cq(16);
    let qp = g.at(now).qp(pdn, cq, cq, 16);
    let mut x = 0x853c_49e6_748f_ea9bu64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let cmds = [Cmd::Listen, Cmd::Unlisten, Cmd::Connect, Cmd::Accept, Cmd::Reject, Cmd::Disconnect, Cmd::Doorbell];
    // The ports the random LISTENs and UNLISTENs leave listening.
    let mut listening = std::collections::BTreeSet::new();
    for i in 0..3000u64 {
        let mut body = [0u8; 560];
        for b in body.iter_mut() {
            *b = next() as u8;
        }
        // Small handles and ports often enough to reach the engine.
        body[0] = (next() % 3) as u8;
        body[1..4].fill(0);
        let cmd = cmds[(next() % cmds.len() as u64) as usize];
        let len = (next() % 560) as usize;
        let silent = g.dev.silent;
        let r = g.at(Instant::from_millis(1 + i as i64)).raw(cmd, &body[..len]);
        if g.dev.silent != silent {
            // Only a good doorbell goes unanswered: one on the QP, for
            // its SQ or RQ.
            let db = read_struct::<CmdDoorbell>(&body[..len]).filter(|_| cmd == Cmd::Doorbell);
            let good = db.is_some_and(|db| db.qpn.to_native() == qp.qpn && matches!(db.queues.to_native(), 1..=3));
            assert!(good, "#{i} {cmd:?} ({len} bytes) got no response");
        }
        if r.is_ok() && matches!(cmd, Cmd::Listen | Cmd::Unlisten) {
            let port = u16::from_be_bytes(read_struct::<CmdListen>(&body[..len]).unwrap().local.port);
            assert!(
                if cmd == Cmd::Listen { listening.insert(port) } else { listening.remove(&port) },
                "#{i} {cmd:?} {port}"
            );
        }
        let mut sink = |_: &[u8]| {};
        g.dev.rnic.service(Instant::from_millis(1 + i as i64), &g.ram.mem, &mut sink);
    }
    assert!(!listening.is_empty(), "no random LISTEN got through to the engine");
    // The same engine, its listeners as the responses said: each one ends
    // once, and a well-formed LISTEN and CONNECT are served.
    let now = Instant::from_millis(3001);
    assert_eq!(g.dev.rnic.offload().unwrap().ip(), IPS[0]);
    for port in listening {
        assert_eq!(g.at(now).cmd(Cmd::Unlisten, &listen_args(port)), Ok(Vec::new()), "port {port}");
        assert_eq!(g.at(now).cmd(Cmd::Unlisten, &listen_args(port)), Err(Status::NotFound), "port {port}");
    }
    assert_eq!(g.at(now).cmd(Cmd::Listen, &listen_args(PORT)), Ok(Vec::new()));
    assert_eq!(g.at(now).cmd(Cmd::Connect, &connect_args(&qp, 40_000, b"pd")), Ok(Vec::new()));
}

/// When a guest goes away (vhost-user disconnect), its peers are reset at
/// once instead of timing out.
#[test]
fn a_vanished_guest_resets_its_peers() {
    let mut s = setup(16);
    connect(&mut s);
    let now = s.sim.now;
    let Sim { a, wire, .. } = &mut s.sim;
    a.dev.rnic.abort_connections(now, &mut |frame| wire.send(now, 1, frame));
    a.dev.rnic.reset();
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| !sim.b.qp_events().is_empty()));
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::Reset as u32, 0)]);
}

/// A new address means a new TOE: the old connections are gone, their QPs
/// in ERROR (the driver flushes them), other QPs carry over in IDLE with
/// the WQEs their rings still hold.
#[test]
fn an_address_change_ends_connections() {
    let mut s = setup(16);
    connect(&mut s);
    let now = s.sim.now;
    let (scq, rcq) = (s.qa.scq, s.qa.rcq);
    let mut idle = s.sim.a.at(now).qp(1, scq, rcq, 16);
    let (a_local, _) = s.bufs[0];
    s.sim.a.at(now).post_recv(&mut idle, 5, &a_local, 0, 64);
    s.sim.a.at(now).set_addr([10, 33, 0, 77]).unwrap();
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::Reset as u32, 0)]);
    let st = s.sim.a.qp_status(&s.qa);
    assert_eq!(st.state.to_native(), QpState::Error as u32);
    assert_ne!(st.flags.to_native() & QpStatusFlag::Error as u32, 0);
    assert_eq!(s.sim.a.qp_status(&idle).state.to_native(), QpState::Idle as u32);
    let info = s.sim.a.dev.rnic.offload().unwrap().engine().qp_info(idle.qpn).unwrap();
    assert_eq!(info.rq_posted, 1, "the posted receive was fetched again");
}

// ---- fault injection (`vt3d ctl fault …`): what each driver is told ----

use vt3_iwarp::engine::Fault;
use vt3_iwarp::wire::terminate::TermCode;
use vt3d::rnic::fault::{Fatal, FATAL_INJECTED};

fn qp_error_flag(g: &Guest, qp: &QpRings) -> bool {
    g.qp_status(qp).flags.to_native() & QpStatusFlag::Error as u32 != 0
}

fn cq_error_flag(g: &Guest, cq: &CqRing) -> bool {
    g.cq_status(cq).flags.to_native() & CqStatusFlag::Error as u32 != 0
}

#[test]
fn injected_rst_is_a_reset_on_both_ends() {
    let mut s = setup(16);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    s.sim.a.at(now).post_recv(&mut s.qa, 1, &a_local, 0, 4096);
    s.sim.b.at(now).post_recv(&mut s.qb, 2, &b_local, 0, 4096);
    connect(&mut s);
    let now = s.sim.now;
    let done = s.sim.a.dev.rnic.inject(now, s.qa.qpn, Fault::SendRst).unwrap();
    assert_eq!(done.state, Some("ERROR"));
    assert!(done.detail.contains(&format!("RST sent to {}:{PORT}", IPS[1])), "{}", done.detail);
    assert!(s
        .sim
        .run_until(Duration::from_secs(2), |sim| !sim.b.qp_events().is_empty() && !sim.a.qp_events().is_empty()));
    // Ours: RESET, detail 1 (we sent it); the peer's: RESET, detail 0.
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::Reset as u32, 1)]);
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::Reset as u32, 0)]);
    for (g, qp) in [(&s.sim.a, &s.qa), (&s.sim.b, &s.qb)] {
        assert_eq!(g.qp_status(qp).state.to_native(), QpState::Error as u32);
        assert!(qp_error_flag(g, qp) && cq_error_flag(g, &qp.rcq) && cq_error_flag(g, &qp.scq));
    }
    // No CQE after the error: the receives are left to the provider.
    s.sim.run_for(Duration::from_secs(2));
    let (mut ra, mut rb) = (s.qa.rcq, s.qb.rcq);
    assert!(s.sim.a.poll_cq(&mut ra).is_empty() && s.sim.b.poll_cq(&mut rb).is_empty());
    assert_eq!(s.sim.a.dev.rnic.fault_stats().rst, 1);
    // Refusals name the problem and are counted.
    let now = s.sim.now;
    let err = s.sim.a.dev.rnic.inject(now, s.qa.qpn, Fault::SendRst).unwrap_err();
    assert!(err.contains("not connected"), "{err}");
    assert_eq!(s.sim.a.dev.rnic.inject(now, 999, Fault::SendFin).unwrap_err(), "no QP 999");
    assert_eq!(s.sim.a.dev.rnic.fault_stats().refused, 2);
}

#[test]
fn faults_are_aimed_by_port_and_peer() {
    use vt3d::rnic::fault::FaultTarget;
    let mut s = setup(16);
    connect(&mut s);
    let (a, b) = (&s.sim.a.dev.rnic, &s.sim.b.dev.rnic);
    // Either end's port names the connection; a peer by address or address:port.
    assert_eq!(a.fault_targets(FaultTarget::Port(PORT)), Ok(vec![s.qa.qpn]));
    assert_eq!(a.fault_targets(FaultTarget::Port(40_001)), Ok(vec![s.qa.qpn]));
    assert_eq!(b.fault_targets(FaultTarget::Port(40_001)), Ok(vec![s.qb.qpn]));
    assert_eq!(a.fault_targets(FaultTarget::Peer(IPS[1], Some(PORT))), Ok(vec![s.qa.qpn]));
    assert_eq!(b.fault_targets(FaultTarget::Peer(IPS[0], None)), Ok(vec![s.qb.qpn]));
    assert_eq!(a.fault_targets(FaultTarget::All), Ok(vec![s.qa.qpn]));
    // What matches nothing says so.
    let none = a.fault_targets(FaultTarget::Port(9)).unwrap_err();
    assert_eq!(none, "no live connection matches --port 9: nothing injected (vt3d ctl qps lists them)");
    assert!(a.fault_targets(FaultTarget::Peer(IPS[0], None)).unwrap_err().contains("--peer 10."));
    assert!(a.fault_targets(FaultTarget::Peer(IPS[1], Some(1))).is_err());
    // A connection that ended is no target any more.
    let now = s.sim.now;
    s.sim.a.dev.rnic.inject(now, s.qa.qpn, Fault::SendRst).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| !sim.b.qp_events().is_empty()));
    assert!(s.sim.a.dev.rnic.fault_targets(FaultTarget::All).is_err());
    assert!(s.sim.b.dev.rnic.fault_targets(FaultTarget::Port(PORT)).is_err());
}

#[test]
fn an_armed_fault_fires_once_on_the_next_connection_to_its_port() {
    // Armed at the connecting end: it fires once that end is established,
    // when the accepting end is established already.
    let mut s = setup(16);
    s.sim.a.dev.rnic.arm_fault(PORT, Fault::SendRst).unwrap();
    s.sim.a.dev.rnic.arm_fault(9, Fault::SendFin).unwrap();
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::Listen, &listen_args(PORT)).unwrap();
    s.sim.a.at(now).cmd(Cmd::Connect, &connect_args(&s.qa, 40_001, b"")).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.has_event(EventType::ConnectRequest)));
    let req = s.sim.b.cm_event(EventType::ConnectRequest).unwrap();
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::Accept, &accept_args(req.conn_id, s.qb.qpn, b"")).unwrap();
    assert!(s
        .sim
        .run_until(Duration::from_secs(2), |sim| !sim.a.qp_events().is_empty() && !sim.b.qp_events().is_empty()));
    let reply = s.sim.a.cm_event(EventType::ConnectReply).unwrap();
    assert_eq!(reply.status.to_native(), 0, "a's connection came up before the fault");
    assert!(s.sim.b.has_event(EventType::Established));
    // a sent the RST, b received it.
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::Reset as u32, 1)]);
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::Reset as u32, 0)]);
    // Fired once; the other port's stays armed.
    let armed = s.sim.a.dev.rnic.armed();
    assert_eq!((armed.len(), armed[0].port), (1, 9));
    assert_eq!(s.sim.a.dev.rnic.fault_stats().rst, 1);
}

#[test]
fn injected_terminate_and_crc_report_terminate_events() {
    // TERMINATE with a chosen code: TERMINATE_SENT here, _RECEIVED there.
    let mut s = setup(16);
    connect(&mut s);
    let now = s.sim.now;
    let code = TermCode::registered_code(1, 2, 0x01).unwrap();
    let done = s.sim.a.dev.rnic.inject(now, s.qa.qpn, Fault::Terminate(code)).unwrap();
    assert!(done.detail.contains("detail 0x1201"), "{}", done.detail);
    let qa = s.qa;
    assert!(s.sim.run_until(Duration::from_secs(5), |sim| !sim.b.qp_events().is_empty() && qp_error_flag(&sim.a, &qa)));
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::TerminateSent as u32, 0x1201)]);
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::TerminateReceived as u32, 0x1201)]);

    // A bad CRC on the next FPDU: the peer detects it (LLP 2/0/02).
    let mut s = setup(16);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    s.sim.b.at(now).post_recv(&mut s.qb, 1, &b_local, 0, 4096);
    connect(&mut s);
    let now = s.sim.now;
    s.sim.a.dev.rnic.inject(now, s.qa.qpn, Fault::CorruptCrc).unwrap();
    let wqe = send_wqe(7, WrOpcode::Send, true, &[(a_local, 0, 100)]);
    s.sim.a.at(now).post_send(&mut s.qa, &wqe);
    assert!(s.sim.run_until(Duration::from_secs(5), |sim| !sim.a.qp_events().is_empty()));
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::TerminateSent as u32, 0x2002)]);
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::TerminateReceived as u32, 0x2002)]);
    let mut rb = s.qb.rcq;
    assert!(s.sim.b.poll_cq(&mut rb).is_empty(), "the corrupted SEND completed nothing");
}

#[test]
fn an_invalidated_stag_fails_the_peers_write() {
    let mut s = setup(16);
    let (a_local, _) = s.bufs[0];
    let (_, b_exposed) = s.bufs[1];
    connect(&mut s);
    let done = s.sim.b.dev.rnic.invalidate_stag(b_exposed.stag).unwrap();
    assert!(done.detail.contains("invalidated"), "{}", done.detail);
    assert!(!s.sim.b.dev.rnic.tpt().get(b_exposed.stag).unwrap().valid);
    assert!(s.sim.b.dev.rnic.invalidate_stag(b_exposed.stag).unwrap_err().contains("invalid already"));
    assert!(s.sim.b.dev.rnic.invalidate_stag(0xdead_beef).unwrap_err().contains("no MR"));
    let before = s.sim.b.ram.read_bytes(b_exposed.guest, 64);
    s.sim.a.ram.write_bytes(a_local.guest, &pattern(64, 3));
    let now = s.sim.now;
    let wqe = rdma_wqe(9, WrOpcode::Write, (a_local, 0, 64), &b_exposed, 0);
    s.sim.a.at(now).post_send(&mut s.qa, &wqe);
    assert!(s
        .sim
        .run_until(Duration::from_secs(5), |sim| !sim.a.qp_events().is_empty() && !sim.b.qp_events().is_empty()));
    // DDP tagged buffer error, invalid STag: QP_ACCESS_ERR on both sides.
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::TerminateSent as u32, 0x1100)]);
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::TerminateReceived as u32, 0x1100)]);
    assert_eq!(s.sim.b.ram.read_bytes(b_exposed.guest, 64), before, "nothing placed");
    assert_eq!(s.sim.b.dev.rnic.fault_stats().invalidate_stag, 1);
}

#[test]
fn blackhole_times_out_within_the_tcp_timeout() {
    let mut s = setup(16);
    connect(&mut s);
    // setup() started the engines with the default (15 s) timeout.
    assert_eq!(s.sim.a.dev.rnic.tcp_timeout(), Duration::from_secs(15));
    let now = s.sim.now;
    s.sim.a.dev.rnic.inject(now, s.qa.qpn, Fault::Blackhole(true)).unwrap();
    let start = s.sim.now;
    assert!(s
        .sim
        .run_until(Duration::from_secs(20), |sim| !sim.a.qp_events().is_empty() && !sim.b.qp_events().is_empty()));
    let took = s.sim.now - start;
    assert!(took <= Duration::from_millis(15_100) && took >= Duration::from_secs(9), "{took}");
    assert_eq!(s.sim.a.qp_events(), vec![(s.qa.qpn, QpEvent::Timeout as u32, 0)]);
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::Timeout as u32, 0)]);
    assert!(qp_error_flag(&s.sim.a, &s.qa) && qp_error_flag(&s.sim.b, &s.qb));
}

#[test]
fn a_shorter_tcp_timeout_applies_to_new_engines() {
    let mut sim = Sim::new(guest(0), guest(1), WireConfig::default());
    sim.a.dev.rnic.set_tcp_timeout(Duration::from_secs(3));
    assert_eq!(sim.a.dev.rnic.tcp_timeout(), Duration::from_secs(3));
    let now = sim.now;
    sim.a.at(now).set_addr(IPS[0].octets()).unwrap();
    let toe = sim.a.dev.rnic.offload().unwrap().engine().toe().tcp().config();
    assert_eq!((toe.timeout, toe.keep_alive), (Some(Duration::from_secs(3)), Some(Duration::from_secs(1))));
}

#[test]
fn device_fatal_flags_everything_and_refuses_commands_until_reset() {
    let mut s = setup(16);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    s.sim.a.at(now).post_recv(&mut s.qa, 1, &a_local, 0, 4096);
    s.sim.b.at(now).post_recv(&mut s.qb, 2, &b_local, 0, 4096);
    connect(&mut s);
    // A SEND from B completes on A before the fatal error: that CQE stays.
    let now = s.sim.now;
    let wqe = send_wqe(5, WrOpcode::Send, true, &[(b_local, 0, 10)]);
    s.sim.b.at(now).post_send(&mut s.qb, &wqe);
    let rcq_status = s.qa.rcq.status;
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| u32::from_le(
        sim.a.ram.mem.load::<u32>(GuestAddress(rcq_status), Ordering::Acquire).unwrap()
    ) == 1));
    let done = s.sim.a.dev.rnic.request_device_fatal().unwrap();
    assert!(done.detail.contains("1 QPs -> ERROR"), "{}", done.detail);
    assert_eq!(s.sim.a.dev.rnic.fatal(), Some(Fatal::Pending));
    assert!(s.sim.a.dev.rnic.request_device_fatal().is_err(), "once");
    s.sim.run_for(Duration::from_millis(10));
    assert_eq!(s.sim.a.dev.rnic.fatal(), Some(Fatal::Dead));
    // The event: DEVICE_FATAL, code 1 (injected), detail: QPs ended; no QP events.
    let fatal: Vec<Event> = s
        .sim
        .a
        .events
        .iter()
        .filter(|(t, _)| *t == EventType::DeviceFatal)
        .map(|(_, b)| read_struct(b).unwrap())
        .collect();
    assert_eq!(fatal.len(), 1);
    assert_eq!(
        (fatal[0].handle.to_native(), fatal[0].code.to_native(), fatal[0].detail.to_native()),
        (0, FATAL_INJECTED, 1)
    );
    assert!(s.sim.a.qp_events().is_empty());
    // Status pages: QP in ERROR with its flag, every CQ flagged; the CQE
    // written before stays, nothing after.
    assert_eq!(s.sim.a.qp_status(&s.qa).state.to_native(), QpState::Error as u32);
    assert!(qp_error_flag(&s.sim.a, &s.qa) && cq_error_flag(&s.sim.a, &s.qa.scq) && cq_error_flag(&s.sim.a, &s.qa.rcq));
    let mut ra = s.qa.rcq;
    assert_eq!(s.sim.a.poll_cq(&mut ra).len(), 1);
    // The peer's connection was reset.
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| !sim.b.qp_events().is_empty()));
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::Reset as u32, 0)]);
    // Commands fail with STATE, teardown works, RESET brings it back.
    let now = s.sim.now;
    assert_eq!(s.sim.a.at(now).cmd(Cmd::AllocPd, &CmdHandle::default()), Err(Status::State));
    let db = CmdDoorbell { qpn: s.qa.qpn.into(), queues: (DoorbellQueue::Rq as u32).into() };
    assert_eq!(s.sim.a.at(now).cmd(Cmd::Doorbell, &db), Err(Status::State));
    assert!(s.sim.a.at(now).cmd(Cmd::QueryDevice, &CmdHandle::default()).is_ok());
    let to_error = CmdModifyQp {
        qpn: s.qa.qpn.into(),
        mask: (ModifyMask::State as u32).into(),
        state: (QpState::Error as u32).into(),
        ..Default::default()
    };
    assert!(s.sim.a.at(now).cmd(Cmd::ModifyQp, &to_error).is_ok());
    let to_idle = CmdModifyQp { state: (QpState::Idle as u32).into(), ..to_error };
    assert_eq!(s.sim.a.at(now).cmd(Cmd::ModifyQp, &to_idle), Err(Status::State));
    assert!(s.sim.a.dev.rnic.inject(now, s.qa.qpn, Fault::SendRst).unwrap_err().contains("fatal"));
    s.sim.a.at(now).cmd(Cmd::DestroyQp, &CmdHandle { handle: s.qa.qpn.into(), reserved: 0.into() }).unwrap();
    s.sim.a.at(now).cmd(Cmd::Reset, &CmdHandle::default()).unwrap();
    assert_eq!(s.sim.a.dev.rnic.fatal(), None);
    assert!(s.sim.a.at(now).cmd(Cmd::AllocPd, &CmdHandle::default()).is_ok());
}

#[test]
fn an_impossible_producer_index_moves_the_qp_to_error() {
    let mut s = setup(16);
    connect(&mut s);
    let now = s.sim.now;
    // One write by the guest: the SQ producer index a ring and more ahead.
    s.qa.sq_prod = s.qa.sq_prod.wrapping_add(s.qa.depth + 1);
    s.sim.a.at(now).ring_doorbell(&s.qa, DoorbellQueue::Sq);
    assert!(s.sim.run_until(Duration::from_secs(3), |sim| {
        sim.a.qp_status(&s.qa).state.to_native() == QpState::Error as u32
    }));
    assert_eq!(s.sim.a.qp_status(&s.qa).sq_cons.to_native(), 0, "nothing was read from the ring");
    let mut scq = s.qa.scq;
    assert!(s.sim.a.poll_cq(&mut scq).is_empty(), "no completion for garbage");
    assert!(s.sim.a.qp_events().contains(&(s.qa.qpn, QpEvent::BadWqe as u32, WcStatus::LocQpOpErr as u32)));
    assert!(qp_error_flag(&s.sim.a, &s.qa));
    assert_eq!(s.sim.a.dev.rnic.ring_stats()[0], ("qp_ring_errors", 1));
    // The peer learns the connection is gone.
    assert!(s.sim.run_until(Duration::from_secs(3), |sim| !sim.b.qp_events().is_empty()));
}

#[test]
fn a_deep_ring_is_fetched_over_several_passes() {
    let mut s = setup(16);
    let now = s.sim.now;
    let g = &mut s.sim.a;
    let pdn = g.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let (scq, rcq) = (g.at(now).cq(512), g.at(now).cq(16));
    let mut qp = g.at(now).qp(pdn, scq, rcq, 512);
    // 300 WQEs behind one doorbell (an IDLE QP takes them and waits).
    for i in 0..300u32 {
        let slot = u64::from(qp.sq_prod & (qp.depth - 1));
        g.ram
            .mem
            .write_obj(send_wqe(u64::from(i), WrOpcode::Send, false, &[]), GuestAddress(qp.sq + slot * 128))
            .unwrap();
        qp.sq_prod += 1;
    }
    g.at(now).ring_doorbell(&qp, DoorbellQueue::Sq);
    let fetched = |g: &Guest| g.dev.rnic.qps().get(qp.qpn).unwrap().sq_work.fetched;
    assert_eq!(fetched(g), 128, "one budget per doorbell");
    assert_eq!(g.qp_status(&qp).flags.to_native() & QpStatusFlag::SqIdle as u32, 0, "not idle: no doorbell needed");
    let mut tx = |_: &[u8]| {};
    assert_eq!(g.dev.rnic.service(now, &g.ram.mem, &mut tx), Some(now), "more to fetch: run again at once");
    assert_eq!(fetched(g), 256);
    g.dev.rnic.service(now, &g.ram.mem, &mut tx);
    assert_eq!(fetched(g), 300);
    assert_eq!(g.qp_status(&qp).flags.to_native() & QpStatusFlag::SqIdle as u32, 0, "polled after the work");
    assert!(g.dev.rnic.poll_deadline().is_some_and(|end| end <= now + MAX_WINDOW));
    g.dev.rnic.service(now + MAX_WINDOW, &g.ram.mem, &mut tx);
    assert_ne!(g.qp_status(&qp).flags.to_native() & QpStatusFlag::SqIdle as u32, 0, "idle once the window ended");
    assert_eq!(g.doorbells, 1);
}

/// A queue that just gave work is polled: posts within its window need
/// no doorbell and are taken at the device's next look; the window grows
/// while looks find work; once one ends with nothing found the queue is
/// handed back (IDLE set) and the next post rings again.
#[test]
fn a_busy_queue_is_polled_without_doorbells_until_its_window_ends() {
    let mut s = setup(16);
    let t0 = s.sim.now;
    let g = &mut s.sim.a;
    let pdn = g.at(t0).handle(Cmd::AllocPd, &CmdHandle::default());
    let (scq, rcq) = (g.at(t0).cq(64), g.at(t0).cq(16));
    let mut qp = g.at(t0).qp(pdn, scq, rcq, 64);
    let mut tx = |_: &[u8]| {};
    let qpn = qp.qpn;
    let fetched = |g: &Guest| g.dev.rnic.qps().get(qpn).unwrap().sq_work.fetched;
    let stat = |g: &Guest, name: &str| g.dev.rnic.ring_stats().iter().find(|(k, _)| *k == name).unwrap().1;
    let sq_idle = |g: &Guest, qp: &QpRings| g.qp_status(qp).flags.to_native() & QpStatusFlag::SqIdle as u32 != 0;
    // An IDLE QP takes sends and holds them until it is connected.
    g.at(t0).post_send(&mut qp, &send_wqe(0, WrOpcode::Send, false, &[]));
    assert_eq!((g.doorbells, fetched(g)), (1, 1));
    assert!(!sq_idle(g, &qp), "polled after the work");
    // Ten more, 40 µs apart (within every window): found by polling.
    let mut t = t0;
    for i in 1..=10u64 {
        t += Duration::from_micros(40);
        g.at(t).post_send(&mut qp, &send_wqe(i, WrOpcode::Send, false, &[]));
        assert_eq!(fetched(g), i as u32, "no doorbell: taken at the next look");
        assert!(g.dev.rnic.poll_queues(t, &g.ram.mem), "the look finds it");
        assert_eq!(fetched(g), i as u32 + 1);
    }
    assert_eq!(g.doorbells, 1, "one doorbell for eleven WQEs");
    assert_eq!((stat(g, "poll_finds"), stat(g, "polled_queues")), (10, 1));
    // Nothing more: the window ends, and then the queue is handed back to
    // the doorbells.
    g.dev.rnic.service(t, &g.ram.mem, &mut tx);
    let end = g.dev.rnic.poll_deadline().unwrap();
    assert!(end > t && end <= t + MAX_WINDOW, "window end {end} after the last find at {t}");
    assert!(!g.dev.rnic.poll_queues(end - Duration::from_micros(1), &g.ram.mem));
    assert!(!sq_idle(g, &qp), "still polled inside the window");
    assert!(!g.dev.rnic.poll_queues(end, &g.ram.mem));
    assert!(sq_idle(g, &qp), "handed back at the window's end");
    assert!(!g.dev.rnic.polling());
    assert_eq!(stat(g, "polled_queues"), 0);
    g.at(end).post_send(&mut qp, &send_wqe(11, WrOpcode::Send, false, &[]));
    assert_eq!((g.doorbells, fetched(g)), (2, 12), "idle again: the next post rings and is taken at once");
}

/// `vt3d serve --poll-queues 0`: vt3d never polls, every post rings.
#[test]
fn without_polling_every_post_rings_its_doorbell() {
    let mut s = setup(16);
    let t0 = s.sim.now;
    let g = &mut s.sim.a;
    g.dev.rnic.set_poll_queues(0);
    let pdn = g.at(t0).handle(Cmd::AllocPd, &CmdHandle::default());
    let (scq, rcq) = (g.at(t0).cq(64), g.at(t0).cq(16));
    let mut qp = g.at(t0).qp(pdn, scq, rcq, 64);
    for i in 0..5u64 {
        g.at(t0).post_send(&mut qp, &send_wqe(i, WrOpcode::Send, false, &[]));
        assert_ne!(g.qp_status(&qp).flags.to_native() & QpStatusFlag::SqIdle as u32, 0, "idle after each fetch");
    }
    assert_eq!(g.doorbells, 5);
    assert_eq!(g.dev.rnic.qps().get(qp.qpn).unwrap().sq_work.fetched, 5);
    assert!(!g.dev.rnic.polling());
}

#[test]
fn a_malformed_receive_wqe_fails_in_order_with_its_own_status() {
    let mut s = setup(16);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    s.sim.b.at(now).post_recv(&mut s.qb, 1, &b_local, 0, 4096);
    // Five SGEs on a QP that allows four.
    let slot = u64::from(s.qb.rq_prod & (s.qb.depth - 1));
    let bad = RqWqe { wr_id: 2.into(), num_sge: 5, ..Default::default() };
    s.sim.b.ram.mem.write_obj(bad, GuestAddress(s.qb.rq + slot * 128)).unwrap();
    s.qb.rq_prod += 1;
    s.sim.b.at(now).ring_doorbell(&s.qb, DoorbellQueue::Rq);
    connect(&mut s);
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(10, WrOpcode::Send, true, &[(a_local, 0, 64)]));
    // A zero-length SEND must not complete the malformed WQE successfully.
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(11, WrOpcode::Send, true, &[]));
    assert!(s.sim.run_until(Duration::from_secs(5), |sim| {
        sim.b.qp_status(&s.qb).state.to_native() == QpState::Error as u32
    }));
    let mut rcq = s.qb.rcq;
    let got: Vec<(u64, u8)> = s.sim.b.poll_cq(&mut rcq).iter().map(|c| (c.wr_id.to_native(), c.status)).collect();
    assert_eq!(got, vec![(1, 0), (2, WcStatus::LocQpOpErr as u8)], "in order, its own status, nothing after");
    assert_eq!(s.sim.b.qp_events(), vec![(s.qb.qpn, QpEvent::BadWqe as u32, WcStatus::LocQpOpErr as u32)]);
    // The peer hears that the error is b's own (RDMAP local catastrophic).
    assert!(s.sim.run_until(Duration::from_secs(3), |sim| !sim.a.qp_events().is_empty()));
    assert_eq!(s.sim.a.qp_events()[0], (s.qa.qpn, QpEvent::TerminateReceived as u32, 0x0000));
}

#[test]
fn a_receive_posted_before_its_doorbell_arrives_takes_the_send() {
    let mut s = setup(16);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    connect(&mut s);
    // b posts a receive: the WQE and the producer index are in its memory,
    // the doorbell is still in b's TX queue when a's SEND arrives.
    let g = &mut s.sim.b;
    let mut wqe = RqWqe { wr_id: 7.into(), num_sge: 1, ..Default::default() };
    wqe.sge[0] = Sge { addr: b_local.iova.into(), length: 4096.into(), lkey: b_local.stag.into() };
    let slot = u64::from(s.qb.rq_prod & (s.qb.depth - 1));
    g.ram.mem.write_obj(wqe, GuestAddress(s.qb.rq + slot * 128)).unwrap();
    s.qb.rq_prod += 1;
    g.ram.mem.store(s.qb.rq_prod.to_le(), GuestAddress(s.qb.status + 4), Ordering::Release).unwrap();
    assert_ne!(g.qp_status(&s.qb).flags.to_native() & QpStatusFlag::RqIdle as u32, 0, "the doorbell is owed");
    let data = pattern(100, 3);
    s.sim.a.ram.write_bytes(a_local.guest, &data);
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(1, WrOpcode::Send, true, &[(a_local, 0, 100)]));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| {
        sim.b.cq_status(&s.qb.rcq).prod.to_native() == 1
            || sim.b.qp_status(&s.qb).state.to_native() == QpState::Error as u32
    }));
    let mut rcq = s.qb.rcq;
    let got: Vec<(u64, u8, u32)> =
        s.sim.b.poll_cq(&mut rcq).iter().map(|c| (c.wr_id.to_native(), c.status, c.byte_len.to_native())).collect();
    assert_eq!(got, vec![(7, 0, 100)], "placed in the receive the guest had posted");
    assert_eq!(s.sim.b.ram.read_bytes(b_local.guest, 100), data);
    assert_eq!(s.sim.b.qp_status(&s.qb).state.to_native(), QpState::Rts as u32);
    assert!(s.sim.b.qp_events().is_empty() && s.sim.a.qp_events().is_empty());

    // With no receive posted at all, a SEND is still the DDP error it is
    // (untagged, MSN with no buffer), not waited for.
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(2, WrOpcode::Send, true, &[(a_local, 0, 100)]));
    assert!(s.sim.run_until(Duration::from_secs(3), |sim| !sim.a.qp_events().is_empty()));
    assert_eq!(s.sim.a.qp_events()[0], (s.qa.qpn, QpEvent::TerminateReceived as u32, 0x1202));
    assert!(s.sim.run_until(Duration::from_secs(3), |sim| {
        sim.b.qp_status(&s.qb).state.to_native() == QpState::Error as u32
    }));
}

/// The soak's "no receive WQE posted" on several QPs at once: two SENDs
/// arrive together, the first finds the receive vt3d fetched, the second
/// the one the guest posted behind a doorbell not read yet. Both are
/// placed; the RQ running out in mid-poll is no reason to refuse one.
#[test]
fn a_send_whose_receive_waits_behind_a_late_doorbell_is_placed_though_the_rq_ran_out_meanwhile() {
    let mut s = setup(16);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    connect(&mut s);
    let now = s.sim.now;
    s.sim.b.at(now).post_recv(&mut s.qb, 1, &b_local, 0, 4096);
    // Its doorbell is read: vt3d holds that one receive.
    let _ = s.sim.run_until(Duration::from_millis(50), |_| false);
    // The second receive: in b's ring and status page, its doorbell owed.
    let g = &mut s.sim.b;
    let mut wqe = RqWqe { wr_id: 2.into(), num_sge: 1, ..Default::default() };
    wqe.sge[0] = Sge { addr: (b_local.iova + 4096).into(), length: 4096.into(), lkey: b_local.stag.into() };
    let slot = u64::from(s.qb.rq_prod & (s.qb.depth - 1));
    g.ram.mem.write_obj(wqe, GuestAddress(s.qb.rq + slot * 128)).unwrap();
    s.qb.rq_prod += 1;
    g.ram.mem.store(s.qb.rq_prod.to_le(), GuestAddress(s.qb.status + 4), Ordering::Release).unwrap();
    let data = pattern(200, 5);
    s.sim.a.ram.write_bytes(a_local.guest, &data);
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(1, WrOpcode::Send, true, &[(a_local, 0, 100)]));
    s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(2, WrOpcode::Send, true, &[(a_local, 100, 100)]));
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| {
        sim.b.cq_status(&s.qb.rcq).prod.to_native() == 2
            || sim.b.qp_status(&s.qb).state.to_native() == QpState::Error as u32
    }));
    let mut rcq = s.qb.rcq;
    let got: Vec<(u64, u8, u32)> =
        s.sim.b.poll_cq(&mut rcq).iter().map(|c| (c.wr_id.to_native(), c.status, c.byte_len.to_native())).collect();
    assert_eq!(got, vec![(1, 0, 100), (2, 0, 100)], "both SENDs placed, in order");
    assert_eq!(s.sim.b.qp_status(&s.qb).state.to_native(), QpState::Rts as u32);
    assert!(s.sim.b.qp_events().is_empty() && s.sim.a.qp_events().is_empty(), "no TERMINATE");
}

#[test]
fn a_connection_between_two_qps_of_one_device_stays_inside_it() {
    let mut s = setup(16);
    let now = s.sim.now;
    let on_wire = s.sim.wire.stats.sent;
    let g = &mut s.sim.a;
    let pdn = g.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let (cq1, cq2) = (g.at(now).cq(64), g.at(now).cq(64));
    let mut client = g.at(now).qp(pdn, cq1, cq1, 16);
    let mut server = g.at(now).qp(pdn, cq2, cq2, 16);
    let src = g.at(now).mr(pdn, 64 * 1024, Access::LocalWrite as u32);
    let sink = g.at(now).mr(pdn, 64 * 1024, ALL);
    g.at(now).post_recv(&mut server, 77, &sink, 0, 8192);
    g.at(now).post_recv(&mut server, 78, &sink, 20_000, 8192);
    g.at(now).cmd(Cmd::Listen, &listen_args(PORT)).unwrap();
    let own = IPS[0].octets();
    let mut args = connect_args(&client, 40_100, b"to myself");
    args.remote = sockaddr(own, PORT);
    args.next_hop = MACS[0];
    g.at(now).cmd(Cmd::Connect, &args).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.has_event(EventType::ConnectRequest)));
    let req = s.sim.a.cm_event(EventType::ConnectRequest).unwrap();
    assert_eq!(req.private_data.get(req.pd_len.to_native()), b"to myself");
    assert_eq!((req.remote.ipv4, u16::from_be_bytes(req.remote.port)), (own, 40_100));
    let accept = accept_args(req.conn_id, server.qpn, b"");
    let now = s.sim.now;
    s.sim.a.at(now).cmd(Cmd::Accept, &accept).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.has_event(EventType::ConnectReply)));
    assert_eq!(s.sim.a.cm_event(EventType::ConnectReply).unwrap().status.to_native(), 0);

    // SENDs and an RDMA WRITE, QP to QP inside the one device.
    let data = pattern(6000, 9);
    s.sim.a.ram.write_bytes(src.guest, &data);
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut client, &send_wqe(1, WrOpcode::Send, true, &[(src, 0, 6000)]));
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.cq_status(&cq2).prod.to_native() == 1));
    // Once the connection is up, one pass of the device takes a SEND to
    // its receive: what comes back in is read at once, not at a timer.
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut client, &send_wqe(2, WrOpcode::Send, true, &[(src, 0, 6000)]));
    let g = &mut s.sim.a;
    g.dev.rnic.service(now, &g.ram.mem, &mut |_| panic!("a frame for the wire"));
    assert_eq!(g.cq_status(&cq2).prod.to_native(), 2, "received in the same pass");
    s.sim.a.at(now).post_send(&mut client, &rdma_wqe(3, WrOpcode::Write, (src, 0, 6000), &sink, 40_000));
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.cq_status(&cq1).prod.to_native() == 3));
    let mut ccq = client.scq;
    let got: Vec<(u64, u8)> = s.sim.a.poll_cq(&mut ccq).iter().map(|c| (c.wr_id.to_native(), c.status)).collect();
    assert_eq!(got, vec![(1, 0), (2, 0), (3, 0)]);
    let mut scq = server.rcq;
    let got: Vec<(u64, u8, u32)> =
        s.sim.a.poll_cq(&mut scq).iter().map(|c| (c.wr_id.to_native(), c.status, c.byte_len.to_native())).collect();
    assert_eq!(got, vec![(77, 0, 6000), (78, 0, 6000)]);
    for at in [0, 20_000, 40_000] {
        assert_eq!(s.sim.a.ram.read_bytes(sink.guest + at, 6000), data);
    }
    assert_eq!(s.sim.wire.stats.sent, on_wire, "nothing went on the wire");
}

/// Fast registration through the guest's rings (docs/architecture.md
/// §3.3): ALLOC_MR, a REG_MR WQE with a rotated key, the peer's WRITE
/// through the new STag, its Send with Invalidate reported in the
/// receive CQE, and the next access a TERMINATE with the exact codes.
#[test]
fn fast_registration_through_the_rings() {
    let mut s = setup(16);
    connect(&mut s);
    let (a_local, _) = s.bufs[0];
    let (b_local, _) = s.bufs[1];
    let now = s.sim.now;
    let pdn = s.sim.b.dev.rnic.qps().get(s.qb.qpn).unwrap().pdn;
    let alloc = |max_pages: u32, pdn: u32| CmdAllocMr { pdn: pdn.into(), max_pages: max_pages.into() };
    // Limits: at least one page, at most max_fast_reg_pages, a real PD.
    let max = s.sim.b.dev.rnic.device_attr().max_fast_reg_pages.to_native();
    assert_eq!(max, Limits::default().max_fast_reg_pages);
    assert_eq!(s.sim.b.at(now).cmd(Cmd::AllocMr, &alloc(0, pdn)), Err(Status::Invalid));
    assert_eq!(s.sim.b.at(now).cmd(Cmd::AllocMr, &alloc(max + 1, pdn)), Err(Status::Invalid));
    assert_eq!(s.sim.b.at(now).cmd(Cmd::AllocMr, &alloc(4, 999)), Err(Status::NotFound));
    let mrs = s.sim.b.dev.rnic.counts().mr;
    let old = s.sim.b.at(now).handle(Cmd::AllocMr, &alloc(4, pdn));
    assert!(!s.sim.b.dev.rnic.tpt().get(old).unwrap().valid, "allocated invalid");

    // REG_MR over 3 fresh pages, iova 0x40 into the first.
    let (pbl, guest) = s.sim.b.ram.pages(3);
    let stag = old & !0xff | (old + 1) & 0xff;
    let iova = 0x5500_0000_0040u64;
    let reg = RegMrWqe {
        wr_id: 70.into(),
        opcode: WrOpcode::RegMr as u8,
        flags: WqeFlag::Signaled as u8,
        stag: stag.into(),
        iova: iova.into(),
        length: (3 * PAGE - 0x40).into(),
        pbl_addr: pbl.into(),
        npages: 3.into(),
        access: ALL.into(),
        page_shift: VT3_PAGE_SHIFT.into(),
        ..Default::default()
    };
    s.sim.b.at(now).post_send(&mut s.qb, &read_struct::<SqWqe>(reg.as_slice()).unwrap());
    // The page list may be reused once the WQE retired: scribble on it.
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.b.cq_status(&s.qb.scq).prod.to_native() == 1));
    s.sim.b.ram.write_bytes(pbl, &[0xff; 24]);
    let mut bscq = s.qb.scq;
    let c = s.sim.b.poll_cq(&mut bscq)[0];
    assert_eq!((c.wr_id.to_native(), c.opcode, c.status), (70, WcOpcode::RegMr as u8, WcStatus::Success as u8));
    assert!(s.sim.b.dev.rnic.tpt().get(old).is_none(), "the old key names nothing");

    // The peer WRITEs through it, across the page boundary.
    let remote = Mr { stag, iova, guest: guest + 0x40 };
    let data = pattern(6000, 9);
    s.sim.a.ram.write_bytes(a_local.guest, &data);
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut s.qa, &rdma_wqe(1, WrOpcode::Write, (a_local, 0, 6000), &remote, 8));
    // Then a Send with Invalidate of it.
    s.sim.b.at(now).post_recv(&mut s.qb, 300, &b_local, 0, 4096);
    let mut inv = send_wqe(2, WrOpcode::SendInv, true, &[(a_local, 0, 16)]);
    inv.invalidate_stag = stag.into();
    s.sim.a.at(now).post_send(&mut s.qa, &inv);
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.b.cq_status(&s.qb.rcq).prod.to_native() == 1));
    assert_eq!(s.sim.b.ram.read_bytes(guest + 0x48, 6000), data);
    let mut brcq = s.qb.rcq;
    let c = s.sim.b.poll_cq(&mut brcq)[0];
    assert_eq!((c.wr_id.to_native(), c.status, c.byte_len.to_native()), (300, 0, 16));
    assert_eq!(
        (c.flags & CqeFlag::Invalidated as u8, c.invalidated_stag.to_native()),
        (CqeFlag::Invalidated as u8, stag)
    );
    assert!(!s.sim.b.dev.rnic.tpt().get(stag).unwrap().valid);

    // The next WRITE through it: TERMINATE DDP 1/1/00 (invalid STag).
    let now = s.sim.now;
    s.sim.a.at(now).post_send(&mut s.qa, &rdma_wqe(3, WrOpcode::Write, (a_local, 0, 100), &remote, 0));
    assert!(s
        .sim
        .run_until(Duration::from_secs(2), |sim| !sim.b.qp_events().is_empty() && !sim.a.qp_events().is_empty()));
    let detail = 1 << 12 | 1 << 8;
    assert_eq!(s.sim.b.qp_events()[0], (s.qb.qpn, QpEvent::TerminateSent as u32, detail));
    assert_eq!(s.sim.a.qp_events()[0], (s.qa.qpn, QpEvent::TerminateReceived as u32, detail));

    // DEREG_MR frees the fast-reg entry (and the PD again once it is gone).
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::DeregMr, &CmdHandle { handle: stag.into(), reserved: 0.into() }).unwrap();
    assert_eq!(s.sim.b.dev.rnic.counts().mr, mrs);
    assert_eq!(
        s.sim.b.at(now).cmd(Cmd::DeregMr, &CmdHandle { handle: stag.into(), reserved: 0.into() }),
        Err(Status::NotFound)
    );
}

/// A hostile REG_MR (a page count far beyond the MR's allocation, a page
/// list outside guest RAM) completes LOC_QP_OP_ERR and sends the QP to
/// ERROR; so does a LOCAL_INV of an ordinary MR. Nothing is allocated for
/// the claimed pages, nothing panics.
#[test]
fn hostile_fast_registrations_are_local_errors() {
    type Bad = fn(RegMrWqe) -> RegMrWqe;
    let cases: [(&str, Bad); 4] = [
        ("u32::MAX pages", |w| RegMrWqe { npages: u32::MAX.into(), length: 100u64.into(), ..w }),
        ("a page list outside guest RAM", |w| RegMrWqe { pbl_addr: (1u64 << 44).into(), ..w }),
        ("a length wrapping the IOVA", |w| RegMrWqe { iova: (u64::MAX - 10).into(), length: 100u64.into(), ..w }),
        ("the old key", |w| RegMrWqe {
            stag: (w.stag.to_native().wrapping_sub(1) & 0xff | w.stag.to_native() & !0xff).into(),
            ..w
        }),
    ];
    for (what, bad) in cases {
        let mut s = setup(16);
        connect(&mut s);
        let now = s.sim.now;
        let pdn = s.sim.b.dev.rnic.qps().get(s.qb.qpn).unwrap().pdn;
        let old = s.sim.b.at(now).handle(Cmd::AllocMr, &CmdAllocMr { pdn: pdn.into(), max_pages: 2.into() });
        let (pbl, _) = s.sim.b.ram.pages(2);
        let good = RegMrWqe {
            wr_id: 9.into(),
            opcode: WrOpcode::RegMr as u8,
            stag: (old & !0xff | (old + 1) & 0xff).into(),
            length: 4096u64.into(),
            pbl_addr: pbl.into(),
            npages: 2.into(),
            access: ALL.into(),
            page_shift: VT3_PAGE_SHIFT.into(),
            ..Default::default()
        };
        s.sim.b.at(now).post_send(&mut s.qb, &read_struct::<SqWqe>(bad(good).as_slice()).unwrap());
        assert!(
            s.sim.run_until(Duration::from_secs(1), |sim| sim.b.cq_status(&s.qb.scq).prod.to_native() == 1),
            "{what}"
        );
        let mut scq = s.qb.scq;
        let c = s.sim.b.poll_cq(&mut scq)[0];
        assert_eq!(
            (c.wr_id.to_native(), c.opcode, c.status),
            (9, WcOpcode::RegMr as u8, WcStatus::LocQpOpErr as u8),
            "{what}"
        );
        assert!(
            s.sim.run_until(Duration::from_secs(1), |sim| sim.b.qp_status(&s.qb).state.to_native()
                == QpState::Error as u32),
            "{what}"
        );
        let mr = s.sim.b.dev.rnic.tpt().get(old).expect("the key did not change");
        assert!(!mr.valid, "{what}");
    }
    // LOCAL_INV of an ordinary MR.
    let mut s = setup(16);
    connect(&mut s);
    let (_, b_exposed) = s.bufs[1];
    let mut inv = send_wqe(5, WrOpcode::LocalInv, true, &[]);
    inv.invalidate_stag = b_exposed.stag.into();
    let now = s.sim.now;
    s.sim.b.at(now).post_send(&mut s.qb, &inv);
    assert!(s.sim.run_until(Duration::from_secs(1), |sim| sim.b.cq_status(&s.qb.scq).prod.to_native() == 1));
    let mut scq = s.qb.scq;
    let c = s.sim.b.poll_cq(&mut scq)[0];
    assert_eq!((c.opcode, c.status), (WcOpcode::LocalInv as u8, WcStatus::LocQpOpErr as u8));
    assert!(s.sim.b.dev.rnic.tpt().get(b_exposed.stag).unwrap().valid, "ordinary MRs are never invalidated by the QP");
}

/// The progress watchdog (`rnic.stalls`): a connected QP whose posted
/// send never reaches vt3d (no doorbell, no polling) is a stall, counted
/// once; a connected pair that waits for its peer, or moves data, is not.
mod watchdog {
    use super::*;

    fn stalls(g: &Guest) -> u64 {
        g.dev.rnic.ring_stats().iter().find(|(k, _)| *k == "stalls").unwrap().1
    }

    /// A connected pair, b with a receive posted for a's SEND.
    fn connected_pair() -> Setup {
        let mut s = setup(16);
        let (b_local, _) = s.bufs[1];
        let now = s.sim.now;
        s.sim.b.at(now).post_recv(&mut s.qb, 1, &b_local, 0, 4096);
        connect(&mut s);
        s
    }

    /// Runs the pair `secs` seconds with the watchdog looking on both ends.
    fn watch(s: &mut Setup, secs: u64) {
        s.sim.run_until(Duration::from_secs(secs), |sim| {
            let now = sim.now;
            sim.a.dev.rnic.watch_progress(&sim.a.ram.mem, now);
            sim.b.dev.rnic.watch_progress(&sim.b.ram.mem, now);
            false
        });
    }

    #[test]
    fn a_connected_pair_waiting_for_each_other_is_no_stall() {
        let mut s = connected_pair();
        watch(&mut s, 20);
        assert_eq!((stalls(&s.sim.a), stalls(&s.sim.b)), (0, 0));
    }

    #[test]
    fn a_send_into_a_silent_peer_is_no_stall() {
        // The peer stops answering under a SEND: a's TCB retransmits with
        // backoff, seconds apart; that is TCP at work, not a stall.
        let mut s = connected_pair();
        let (a_local, _) = s.bufs[0];
        s.sim.wire.cut = [true, true];
        let now = s.sim.now;
        s.sim.a.at(now).post_send(&mut s.qa, &send_wqe(7, WrOpcode::Send, true, &[(a_local, 0, 1000)]));
        // Retransmissions at about 1, 3 and 7 s; then quiet past 15 s.
        watch(&mut s, 15);
        let tcb = s.sim.a.dev.rnic.offload().unwrap().engine().tcb(s.qa.qpn).unwrap();
        assert!(tcb.retransmits == 3 && tcb.snd_una != tcb.snd_nxt, "retransmitting, backed off: {tcb:?}");
        assert_eq!((stalls(&s.sim.a), stalls(&s.sim.b)), (0, 0));
    }

    #[test]
    fn a_send_vt3d_never_takes_is_one_stall() {
        let mut s = connected_pair();
        s.sim.a.dev.rnic.set_poll_queues(0);
        // Written and published, but the doorbell is never rung.
        let qa = &mut s.qa;
        let slot = u64::from(qa.sq_prod & (qa.depth - 1));
        s.sim.a.ram.mem.write_obj(send_wqe(7, WrOpcode::Send, true, &[]), GuestAddress(qa.sq + slot * 128)).unwrap();
        qa.sq_prod += 1;
        s.sim.a.ram.mem.store(qa.sq_prod, GuestAddress(qa.status), Ordering::Release).unwrap();
        watch(&mut s, 4);
        assert_eq!(stalls(&s.sim.a), 0, "not yet: STALL_AFTER is 5 s");
        watch(&mut s, 20);
        assert_eq!((stalls(&s.sim.a), stalls(&s.sim.b)), (1, 0), "counted once, on a");
    }
}
