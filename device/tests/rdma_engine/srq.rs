//! Shared receive queues through the control channel and the rings: two
//! QPs of one guest sharing an SRQ, the limit event, the flush rules on a
//! QP error (docs/architecture.md §3.4), and hostile input.

use super::*;

use vt3d::testing::{recv_wqe, QpCaps, SrqRing};

/// CREATE_QP's arguments for a QP of 16 SQ entries (one page at `sq`)
/// whose receives come from SRQ `srqn`.
fn srq_qp_args(pdn: u32, scq: &CqRing, rcq: &CqRing, sq: (u64, u64, u32), status: u64, srqn: u32) -> CmdCreateQp {
    CmdCreateQp {
        sq_pbl_addr: sq.0.into(),
        status_addr: status.into(),
        sq_npages: sq.2.into(),
        sq_depth: 16.into(),
        pdn: pdn.into(),
        send_cqn: scq.cqn.into(),
        recv_cqn: rcq.cqn.into(),
        max_send_sge: 4.into(),
        max_inline: 64.into(),
        srqn: srqn.into(),
        ..Default::default()
    }
}

/// Guest a with two QPs; guest b with two QPs sharing one SRQ and one
/// receive CQ; a's QP i connected to b's QP i.
struct SrqSetup {
    sim: Sim<Guest, Guest>,
    qa: [QpRings; 2],
    qb: [QpRings; 2],
    srq: SrqRing,
    rcq: CqRing,
    a_buf: Mr,
    b_buf: Mr,
    b_pdn: u32,
}

fn srq_setup(limit: u32) -> SrqSetup {
    let mut sim = Sim::new(guest(0), guest(1), WireConfig::default());
    let now = sim.now;
    let a = &mut sim.a;
    a.at(now).set_addr(IPS[0].octets()).unwrap();
    let pdn = a.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let qa = [0, 1].map(|_| {
        let (scq, rcq) = (a.at(now).cq(64), a.at(now).cq(64));
        a.at(now).qp(pdn, scq, rcq, 16)
    });
    let a_buf = a.at(now).mr(pdn, 256 * 1024, Access::LocalWrite as u32);
    let b = &mut sim.b;
    b.at(now).set_addr(IPS[1].octets()).unwrap();
    let b_pdn = b.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let srq = b.at(now).srq(b_pdn, 8, limit);
    let rcq = b.at(now).cq(64);
    let qb = [0, 1].map(|_| {
        let scq = b.at(now).cq(64);
        b.qp_with(b_pdn, scq, rcq, QpCaps { depth: 16, ..QpCaps::default() }, srq.srqn)
    });
    let b_buf = b.at(now).mr(b_pdn, 8 * 64 * 1024, Access::LocalWrite as u32);
    let mut s = SrqSetup { sim, qa, qb, srq, rcq, a_buf, b_buf, b_pdn };
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::Listen, &listen_args(PORT)).unwrap();
    for i in 0..2 {
        let now = s.sim.now;
        s.sim.a.at(now).cmd(Cmd::Connect, &connect_args(&s.qa[i], 40_001 + i as u16, b"")).unwrap();
        assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.has_event(EventType::ConnectRequest)));
        let req = s.sim.b.cm_event(EventType::ConnectRequest).unwrap();
        s.sim.b.take_events();
        let now = s.sim.now;
        s.sim.b.at(now).cmd(Cmd::Accept, &accept_args(req.conn_id, s.qb[i].qpn, b"")).unwrap();
        assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.a.has_event(EventType::ConnectReply)));
        s.sim.a.take_events();
        s.sim.b.take_events();
    }
    s
}

impl SrqSetup {
    /// b posts `n` SRQ WQEs of 64 KiB each, wr_id 100 + index.
    fn post(&mut self, n: u32) {
        for _ in 0..n {
            let i = self.srq.prod;
            let now = self.sim.now;
            let wqe = recv_wqe(100 + u64::from(i), &self.b_buf, u64::from(i % 8) * 65536, 65536);
            self.sim.b.at(now).post_srq(&mut self.srq, &wqe);
        }
    }

    /// a sends `len` octets on its QP `i`.
    fn send(&mut self, i: usize, wr_id: u64, len: u32) {
        let now = self.sim.now;
        let wqe = send_wqe(wr_id, WrOpcode::Send, true, &[(self.a_buf, 0, len)]);
        self.sim.a.at(now).post_send(&mut self.qa[i], &wqe);
    }

    /// Sends on QP `i` and waits for b's CQE.
    fn send_and_reap(&mut self, i: usize, len: u32) -> Cqe {
        self.send(i, 1, len);
        assert!(self
            .sim
            .run_until(Duration::from_secs(2), |sim| sim.b.cq_status(&self.rcq).prod.to_native() != self.rcq.cons));
        let mut rcq = self.rcq;
        let cqes = self.sim.b.poll_cq(&mut rcq);
        self.rcq = rcq;
        assert_eq!(cqes.len(), 1);
        cqes[0]
    }
}

fn summary(c: &Cqe) -> (u32, u64, u32, u8, u8) {
    (c.qpn.to_native(), c.wr_id.to_native(), c.wqe_idx.to_native(), c.status, c.flags)
}

const SRQ_FLAG: u8 = CqeFlag::Srq as u8;

#[test]
fn two_qps_take_from_one_srq_in_order() {
    let mut s = srq_setup(0);
    s.post(4);
    let (q0, q1) = (s.qb[0].qpn, s.qb[1].qpn);
    let got: Vec<_> = [0, 1, 0].into_iter().map(|i| summary(&s.send_and_reap(i, 3000))).collect();
    assert_eq!(got, vec![(q0, 100, 0, 0, SRQ_FLAG), (q1, 101, 1, 0, SRQ_FLAG), (q0, 102, 2, 0, SRQ_FLAG)]);
    let st = s.sim.b.srq_status(&s.srq);
    assert_eq!((st.prod.to_native(), st.cons.to_native()), (4, 3), "cons counts the WQEs taken");
    assert_eq!(s.sim.b.ram.read_bytes(s.b_buf.guest + 65536, 3000), s.sim.a.ram.read_bytes(s.a_buf.guest, 3000));
    // The QPs have no RQ of their own.
    let qp = read_struct::<QpAttr>(
        &s.sim.b.at(s.sim.now).cmd(Cmd::QueryQp, &CmdHandle { handle: q0.into(), reserved: 0.into() }).unwrap(),
    )
    .unwrap();
    assert_eq!(qp.rq_depth.to_native(), 0);
    assert!(s.sim.b.events.handles(EventType::SrqLimit).is_empty(), "not armed");
}

#[test]
fn the_limit_event_fires_once_per_arm() {
    let mut s = srq_setup(3);
    s.post(4);
    let now = s.sim.now;
    let query = |g: &mut Guest, srqn: u32| {
        read_struct::<SrqAttr>(
            &g.at(now).cmd(Cmd::QuerySrq, &CmdHandle { handle: srqn.into(), reserved: 0.into() }).unwrap(),
        )
        .unwrap()
    };
    let attr = query(&mut s.sim.b, s.srq.srqn);
    assert_eq!(
        (attr.depth.to_native(), attr.limit.to_native(), attr.armed.to_native(), attr.qps.to_native()),
        (8, 3, 1, 2)
    );
    s.send_and_reap(0, 100); // 3 left: not below the limit
    assert!(s.sim.b.events.handles(EventType::SrqLimit).is_empty());
    s.send_and_reap(1, 100); // 2 left
    assert_eq!(s.sim.b.events.handles(EventType::SrqLimit), vec![s.srq.srqn]);
    s.send_and_reap(0, 100); // 1 left: disarmed, no second event
    assert_eq!(s.sim.b.events.handles(EventType::SrqLimit).len(), 1);
    assert_eq!(query(&mut s.sim.b, s.srq.srqn).armed.to_native(), 0);
    // Re-armed (as ibv_modify_srq(IBV_SRQ_LIMIT)) and refilled: once more.
    let arm = CmdModifySrq {
        srqn: s.srq.srqn.into(),
        mask: (SrqModifyMask::Limit as u32 | SrqModifyMask::Arm as u32).into(),
        limit: 4.into(),
        reserved: 0.into(),
    };
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::ModifySrq, &arm).unwrap();
    s.post(4); // 5 posted, not taken
    for i in [1, 0, 1] {
        s.send_and_reap(i, 100);
    }
    assert_eq!(s.sim.b.events.handles(EventType::SrqLimit), vec![s.srq.srqn, s.srq.srqn]);
    // Arming without a limit, a limit above the depth, unknown bits: refused.
    let now = s.sim.now;
    for (mask, limit) in [(SrqModifyMask::Arm as u32, 0), (SrqModifyMask::Limit as u32, 9), (4, 1)] {
        let m = CmdModifySrq { mask: mask.into(), limit: limit.into(), ..arm };
        if mask == SrqModifyMask::Arm as u32 {
            let clear = CmdModifySrq { mask: (SrqModifyMask::Limit as u32).into(), limit: 0.into(), ..arm };
            s.sim.b.at(now).cmd(Cmd::ModifySrq, &clear).unwrap();
        }
        assert_eq!(s.sim.b.at(now).cmd(Cmd::ModifySrq, &m), Err(Status::Invalid), "{mask} {limit}");
    }
}

#[test]
fn a_qp_error_leaves_the_srq_to_the_other_qp() {
    let mut s = srq_setup(0);
    s.post(4);
    let (q0, q1) = (s.qb[0].qpn, s.qb[1].qpn);
    assert_eq!(summary(&s.send_and_reap(0, 100)), (q0, 100, 0, 0, SRQ_FLAG));
    // b's QP 0 fails (reset by its peer): no SRQ WQE is flushed or taken.
    let now = s.sim.now;
    s.sim.a.at(now).cmd(Cmd::Disconnect, &CmdDisconnect { qpn: s.qa[0].qpn.into(), abort: 1.into() }).unwrap();
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.qp_events().len() >= 2));
    assert_eq!(
        s.sim.b.qp_events(),
        vec![(q0, QpEvent::Reset as u32, 0), (q0, QpEvent::LastWqeReached as u32, 0)],
        "LAST_WQE_REACHED after the event that says why"
    );
    let mut rcq = s.rcq;
    assert!(s.sim.b.poll_cq(&mut rcq).is_empty(), "nothing was outstanding on QP 0");
    assert_eq!(s.sim.b.srq_status(&s.srq).cons.to_native(), 1);
    // The other QP takes the next WQEs.
    assert_eq!(summary(&s.send_and_reap(1, 100)), (q1, 101, 1, 0, SRQ_FLAG));
    // MODIFY to ERROR of the survivor: LAST_WQE_REACHED once, not per call.
    s.sim.b.take_events();
    let to = |state: QpState| CmdModifyQp {
        qpn: q1.into(),
        mask: (ModifyMask::State as u32).into(),
        state: (state as u32).into(),
        ..Default::default()
    };
    let now = s.sim.now;
    s.sim.b.at(now).cmd(Cmd::ModifyQp, &to(QpState::Error)).unwrap();
    s.sim.b.at(now).cmd(Cmd::ModifyQp, &to(QpState::Error)).unwrap();
    let last: Vec<_> = s.sim.b.qp_events().into_iter().filter(|e| e.1 == QpEvent::LastWqeReached as u32).collect();
    assert_eq!(last, vec![(q1, QpEvent::LastWqeReached as u32, 0)]);
    assert_eq!(s.sim.b.srq_status(&s.srq).cons.to_native(), 2, "two WQEs still posted for QPs to come");
}

#[test]
fn the_wqe_of_a_message_cut_short_is_flushed_on_its_own_qp() {
    let mut s = srq_setup(0);
    s.post(2);
    let (q0, q1) = (s.qb[0].qpn, s.qb[1].qpn);
    // A message of many segments; b's QP 0 fails once it took a WQE.
    s.send(0, 1, 60_000);
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.srq_status(&s.srq).cons.to_native() == 1));
    assert_eq!(s.sim.b.cq_status(&s.rcq).prod.to_native(), 0, "the message is still being received");
    let now = s.sim.now;
    let abort = CmdModifyQp {
        qpn: q0.into(),
        mask: (ModifyMask::State as u32).into(),
        state: (QpState::Error as u32).into(),
        ..Default::default()
    };
    s.sim.b.at(now).cmd(Cmd::ModifyQp, &abort).unwrap();
    // The taken WQE completes once, flushed, on QP 0, before the error flag.
    let mut rcq = s.rcq;
    let cqes = s.sim.b.poll_cq(&mut rcq);
    s.rcq = rcq;
    let flush = WcStatus::WrFlushErr as u8;
    assert_eq!(cqes.iter().map(summary).collect::<Vec<_>>(), vec![(q0, 100, 0, flush, SRQ_FLAG)]);
    assert!(qp_error_flag(&s.sim.b, &s.qb[0]));
    assert!(s.sim.b.qp_events().contains(&(q0, QpEvent::LastWqeReached as u32, 0)));
    // The next WQE is the other QP's.
    assert_eq!(summary(&s.send_and_reap(1, 100)), (q1, 101, 1, 0, SRQ_FLAG));
}

#[test]
fn a_malformed_srq_wqe_fails_the_qp_that_takes_it() {
    let mut s = srq_setup(0);
    let now = s.sim.now;
    let bad = RqWqe { num_sge: 5, ..recv_wqe(100, &s.b_buf, 0, 4096) };
    s.sim.b.at(now).post_srq(&mut s.srq, &bad);
    s.post(1);
    let q0 = s.qb[0].qpn;
    let c = s.send_and_reap(0, 100);
    assert_eq!(summary(&c), (q0, 100, 0, WcStatus::LocQpOpErr as u8, SRQ_FLAG));
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.qp_events().len() >= 2));
    let events = s.sim.b.qp_events();
    assert_eq!(events.first().map(|e| (e.0, e.1)), Some((q0, QpEvent::BadWqe as u32)));
    assert!(s.sim.run_until(Duration::from_secs(5), |sim| sim.b.qp_events().contains(&(
        q0,
        QpEvent::LastWqeReached as u32,
        0
    ))));
    // The next, good WQE is the other QP's.
    let q1 = s.qb[1].qpn;
    assert_eq!(summary(&s.send_and_reap(1, 100)), (q1, 101, 1, 0, SRQ_FLAG));
}

#[test]
fn an_srq_with_qps_is_not_destroyed() {
    let mut s = srq_setup(0);
    let now = s.sim.now;
    let h = |n: u32| CmdHandle { handle: n.into(), reserved: 0.into() };
    let srqn = s.srq.srqn;
    assert_eq!(s.sim.b.at(now).cmd(Cmd::DestroySrq, &h(srqn)), Err(Status::Busy));
    assert_eq!(s.sim.b.at(now).cmd(Cmd::DeallocPd, &h(s.b_pdn)), Err(Status::Busy));
    s.sim.b.at(now).cmd(Cmd::DestroyQp, &h(s.qb[0].qpn)).unwrap();
    assert_eq!(s.sim.b.at(now).cmd(Cmd::DestroySrq, &h(srqn)), Err(Status::Busy), "one QP left");
    s.sim.b.at(now).cmd(Cmd::DestroyQp, &h(s.qb[1].qpn)).unwrap();
    s.sim.b.at(now).cmd(Cmd::DestroySrq, &h(srqn)).unwrap();
    assert_eq!(s.sim.b.at(now).cmd(Cmd::DestroySrq, &h(srqn)), Err(Status::NotFound));
    assert_eq!(s.sim.b.at(now).cmd(Cmd::QuerySrq, &h(srqn)), Err(Status::NotFound));
}

#[test]
fn hostile_srq_input_is_refused() {
    let mut s = srq_setup(0);
    let now = s.sim.now;
    let b = &mut s.sim.b;
    let (pbl, _) = b.ram.pages(1);
    let status = b.ram.status_page();
    let good = CmdCreateSrq {
        ring_pbl_addr: pbl.into(),
        status_addr: status.into(),
        ring_npages: 1.into(),
        depth: 8.into(),
        pdn: s.b_pdn.into(),
        max_sge: 4.into(),
        limit: 0.into(),
        reserved: 0.into(),
    };
    let cases = [
        (CmdCreateSrq { depth: 6.into(), ..good }, Status::Invalid),
        (CmdCreateSrq { depth: 64.into(), ..good }, Status::Invalid), // more than one page holds
        (CmdCreateSrq { depth: (1 << 20).into(), ring_npages: (1 << 15).into(), ..good }, Status::Invalid),
        (CmdCreateSrq { max_sge: 5.into(), ..good }, Status::Invalid),
        (CmdCreateSrq { limit: 9.into(), ..good }, Status::Invalid),
        (CmdCreateSrq { reserved: 1.into(), ..good }, Status::Invalid),
        (CmdCreateSrq { pdn: 77.into(), ..good }, Status::NotFound),
        (CmdCreateSrq { status_addr: (MEM as u64).into(), ..good }, Status::BadAddress),
        (CmdCreateSrq { ring_pbl_addr: (MEM as u64 - 4).into(), ..good }, Status::BadAddress),
    ];
    for (args, want) in cases {
        assert_eq!(b.at(now).cmd(Cmd::CreateSrq, &args), Err(want), "{args:?}");
    }
    // A QP of an SRQ: same PD, and no RQ ring of its own.
    let other_pd = b.at(now).handle(Cmd::AllocPd, &CmdHandle::default());
    let (scq, rcq) = (b.at(now).cq(16), b.at(now).cq(16));
    let (sq_pbl, sq) = b.ram.pages(1);
    let qstatus = b.ram.status_page();
    let qp = srq_qp_args(s.b_pdn, &scq, &rcq, (sq_pbl, sq, 1), qstatus, s.srq.srqn);
    for (args, want) in [
        (CmdCreateQp { pdn: other_pd.into(), ..qp }, Status::Invalid),
        (CmdCreateQp { rq_depth: 16.into(), ..qp }, Status::Invalid),
        (CmdCreateQp { srqn: 99.into(), ..qp }, Status::NotFound),
    ] {
        assert_eq!(b.at(now).cmd(Cmd::CreateQp, &args), Err(want));
    }
    let db = |srqn: u32, queues: u32| CmdDoorbell { qpn: srqn.into(), queues: queues.into() };
    assert_eq!(b.at(now).cmd(Cmd::Doorbell, &db(99, DoorbellQueue::Srq as u32)), Err(Status::NotFound));
    assert_eq!(b.at(now).cmd(Cmd::Doorbell, &db(s.srq.srqn, DoorbellQueue::Srq as u32 | 1)), Err(Status::Invalid));
    // A producer index a ring and more ahead: the SRQ is broken, once,
    // nothing is read, and its QPs live on.
    s.srq.prod = s.srq.prod.wrapping_add(s.srq.depth + 1);
    s.sim.b.at(now).srq_doorbell(&s.srq);
    // A doorbell has no answer: the event goes out with the next pass.
    s.sim.run_for(Duration::from_millis(1));
    let st = s.sim.b.srq_status(&s.srq);
    assert_eq!(st.cons.to_native(), 0);
    assert_ne!(st.flags.to_native() & SrqStatusFlag::Error as u32, 0);
    assert_eq!(s.sim.b.events.handles(EventType::SrqError), vec![s.srq.srqn]);
    assert_eq!(s.sim.b.dev.rnic.offload().unwrap().engine().srq_pooled(s.srq.srqn), Some(0));
    let db = CmdDoorbell { qpn: s.srq.srqn.into(), queues: (DoorbellQueue::Srq as u32).into() };
    s.sim.b.at(now).cmd(Cmd::Doorbell, &db).unwrap();
    s.sim.run_for(Duration::from_millis(1));
    assert_eq!(s.sim.b.events.handles(EventType::SrqError).len(), 1, "reported once");
    assert_eq!(s.sim.b.dev.rnic.ring_stats()[2], ("srq_ring_errors", 1));
    assert_eq!(s.sim.b.qp_status(&s.qb[0]).state.to_native(), QpState::Rts as u32);
}

#[test]
fn an_address_change_does_not_lose_a_taken_srq_wqe() {
    let mut s = srq_setup(0);
    s.post(2);
    let q0 = s.qb[0].qpn;
    s.send(0, 1, 60_000);
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.srq_status(&s.srq).cons.to_native() == 1));
    // A new address: a new engine; QP 0's message will never finish.
    let now = s.sim.now;
    s.sim.b.at(now).set_addr([10, 9, 9, 9]).unwrap();
    let mut rcq = s.rcq;
    let cqes = s.sim.b.poll_cq(&mut rcq);
    assert_eq!(cqes.iter().map(summary).collect::<Vec<_>>(), vec![(q0, 100, 0, WcStatus::WrFlushErr as u8, SRQ_FLAG)]);
    assert!(qp_error_flag(&s.sim.b, &s.qb[0]) && qp_error_flag(&s.sim.b, &s.qb[1]));
    // The WQE not taken is fetched again by the new engine, still posted.
    assert_eq!(s.sim.b.srq_status(&s.srq).cons.to_native(), 1);
    assert_eq!(s.sim.b.dev.rnic.offload().unwrap().engine().srq_pooled(s.srq.srqn), Some(1));
}

#[path = "srq_resize.rs"]
mod resize;

/// Two SENDs placed in one pass when the pool holds one WQE and the ring a
/// second whose doorbell has not arrived (the device idle on the SRQ, so
/// the guest rang one; it is still in the TX queue behind the peer's
/// data): the second SEND must find the ring's WQE, not be refused for
/// want of a buffer. The chaos case met it with 16 QPs on one SRQ: one of
/// them got QP_REQ_ERR ("no receive WQE posted") in mid-run.
#[test]
fn an_srq_that_runs_dry_in_mid_pass_is_read_again() {
    let mut s = srq_setup(0);
    s.post(1);
    let idle = SrqStatusFlag::Idle as u32;
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim.b.srq_status(&s.srq).flags.to_native() & idle != 0));
    // The second WQE and the producer index, but no doorbell yet.
    let slot = u64::from(s.srq.prod & (s.srq.depth - 1));
    let wqe = recv_wqe(101, &s.b_buf, 65536, 65536);
    s.sim.b.ram.mem.write_obj(wqe, GuestAddress(s.srq.ring + slot * 128)).unwrap();
    s.srq.prod += 1;
    s.sim.b.ram.mem.store(s.srq.prod.to_le(), GuestAddress(s.srq.status), Ordering::Release).unwrap();
    assert_eq!(s.sim.b.dev.rnic.offload().unwrap().engine().srq_pooled(s.srq.srqn), Some(1));
    s.send(0, 1, 100);
    s.send(0, 2, 100);
    let rcq = s.rcq;
    assert!(s.sim.run_until(Duration::from_secs(2), |sim| sim
        .b
        .cq_status(&rcq)
        .prod
        .to_native()
        .wrapping_sub(rcq.cons)
        >= 2
        || !sim.b.qp_events().is_empty()));
    assert_eq!(s.sim.b.qp_events(), vec![], "no QP failed");
    let mut rcq = s.rcq;
    let mut got: Vec<_> = s.sim.b.poll_cq(&mut rcq).iter().map(|c| (c.wr_id.to_native(), c.status)).collect();
    got.sort_unstable();
    assert_eq!(got, vec![(100, 0), (101, 0)]);
}
