//! Memory windows on the simulated wire: B binds windows over its MR with
//! BIND_MW on QP 2 and A (QP 1, its peer) reaches B's memory through
//! them; every bind rule, the access checks through a window, and who may
//! invalidate which type. Both in PD [`PD`] unless a test says otherwise.

use super::*;
use crate::tpt::Mr;

/// B's MR: 8 KiB at IOVA [`MR_IOVA`], contiguous guest memory at [`MR_GUEST`].
const MR_IOVA: u64 = 0x5000_0000;
const MR_GUEST: u64 = 0x4_0000;
const MR_LEN: u64 = 8192;
const RW: Access = REMOTE_READ | REMOTE_WRITE;

fn next_key(stag: u32) -> u32 {
    stag & !0xff | u32::from((stag as u8).wrapping_add(1))
}

fn mr(node: &mut Node, access: Access) -> u32 {
    node.regions.register_contiguous(PD, access, MR_IOVA, MR_GUEST, MR_LEN)
}

fn bind_wr(wr_id: u64, bind: MwBind) -> SendWr {
    let mut wr = SendWr::new(wr_id, SendOpcode::BindMw);
    wr.bind = bind;
    wr
}

/// A bind of window `mw` (next key) over `[MR_IOVA + 0x100, +0x1000)` of `mr`.
fn bind_of(mw: u32, mr: u32, mw_type: MwType) -> MwBind {
    MwBind {
        mw_stag: next_key(mw),
        mr_stag: mr,
        addr: MR_IOVA + 0x100,
        length: 0x1000,
        access: RW | LOCAL_WRITE,
        mw_type,
    }
}

/// Posts `bind` on B's QP 2 and returns its completion status.
fn post_bind(sim: &mut Sim<Node, Node>, bind: MwBind) -> WcStatus {
    sim.b.completions.clear();
    sim.b.engine.post_send(2, bind_wr(50, bind)).unwrap();
    settle(sim, 1);
    let got = results(&sim.b, 2);
    assert_eq!(got.len(), 1, "one completion: {got:?}");
    assert_eq!(got[0].1, WcOpcode::BindMw);
    sim.b.completions.clear();
    got[0].2
}

/// B: an MR with MW_BIND and a window of `mw_type` bound over part of it.
/// Returns (MR STag, window STag).
fn bound(sim: &mut Sim<Node, Node>, mw_type: MwType) -> (u32, u32) {
    let mr = mr(&mut sim.b, LOCAL_WRITE | MW_BIND);
    let mw = sim.b.regions.alloc_window(PD, mw_type);
    let bind = bind_of(mw, mr, mw_type);
    assert_eq!(post_bind(sim, bind), WcStatus::Success);
    (mr, bind.mw_stag)
}

/// A's WRITE of `len` octets to `to` through `stag` from QP `qpn` (of [`PD`]).
fn a_writes(sim: &mut Sim<Node, Node>, qpn: u32, stag: u32, to: u64, len: u32) {
    a_writes_in(sim, (qpn, PD), stag, to, len);
}

#[test]
fn the_peer_writes_and_reads_through_bound_windows_of_both_types() {
    for mw_type in [MwType::One, MwType::Two] {
        let mut sim = pair();
        let (_, mw) = bound(&mut sim, mw_type);
        let before = sim.b.memory.clone();
        a_writes(&mut sim, 1, mw, MR_IOVA + 0x180, 3000);
        assert_eq!(results(&sim.a, 1), vec![(1, WcOpcode::Write, WcStatus::Success)]);
        let want: Vec<u8> = (0..3000u32).map(|i| (i % 241) as u8 ^ 0x5a).collect();
        assert_eq!(sim.b.memory.slice(MR_GUEST + 0x180, 3000), &want[..]);
        let (start, end) = (MR_GUEST + 0x180, MR_GUEST + 0x180 + 3000);
        assert!(sim.b.memory.changed_ranges(&before).iter().all(|&(s, e)| s >= start && e <= end));
        let (astag, aiova) = registered_buffer(&mut sim.a, 8192);
        sim.a.engine.post_send(1, rdma(2, SendOpcode::Read, (astag, aiova + 4096), 3000, mw, MR_IOVA + 0x180)).unwrap();
        settle(&mut sim, 2);
        assert_eq!(results(&sim.a, 1)[1], (2, WcOpcode::Read, WcStatus::Success));
        assert_eq!(sim.a.memory.slice(aiova + 4096, 3000), &want[..], "{mw_type:?}");
        assert_eq!(sim.b.state(2), Some(QpState::Rts));
    }
}

#[test]
fn every_refused_bind_completes_with_mw_bind_err_and_errors_the_qp() {
    type Case = (&'static str, fn(&mut Node, u32, u32) -> MwBind);
    let cases: [Case; 10] = [
        ("type 1 window, type 2 bind", |n, mr, _| {
            let mw = n.regions.alloc_window(PD, MwType::One);
            bind_of(mw, mr, MwType::Two)
        }),
        ("window of another PD", |n, mr, _| {
            let mw = n.regions.alloc_window(PD + 1, MwType::Two);
            bind_of(mw, mr, MwType::Two)
        }),
        ("MR of another PD", |n, _, mw| {
            let other = n.regions.register_contiguous(PD + 1, LOCAL_WRITE | MW_BIND, MR_IOVA, MR_GUEST, MR_LEN);
            bind_of(mw, other, MwType::Two)
        }),
        ("MR without MW_BIND", |n, _, mw| {
            let plain = n.regions.register_contiguous(PD, LOCAL_WRITE | RW, MR_IOVA, MR_GUEST, MR_LEN);
            bind_of(mw, plain, MwType::Two)
        }),
        ("remote write, MR without local write", |n, _, mw| {
            let ro = n.regions.register_contiguous(PD, MW_BIND | REMOTE_READ, MR_IOVA, MR_GUEST, MR_LEN);
            bind_of(mw, ro, MwType::Two)
        }),
        ("beyond the MR", |_, mr, mw| MwBind { addr: MR_IOVA + MR_LEN - 0x800, ..bind_of(mw, mr, MwType::Two) }),
        ("the window's own key", |_, mr, mw| MwBind { mw_stag: mw, ..bind_of(mw, mr, MwType::Two) }),
        ("an MR's STag as the window", |_, mr, _| bind_of(mr, mr, MwType::Two)),
        ("a window's STag as the MR", |n, _, mw| {
            let other = n.regions.alloc_window(PD, MwType::Two);
            bind_of(mw, other, MwType::Two)
        }),
        ("MW_BIND in the window's rights", |_, mr, mw| MwBind {
            access: REMOTE_READ | MW_BIND,
            ..bind_of(mw, mr, MwType::Two)
        }),
    ];
    for (name, make) in cases {
        let mut sim = pair();
        let mr = mr(&mut sim.b, LOCAL_WRITE | MW_BIND);
        let mw = sim.b.regions.alloc_window(PD, MwType::Two);
        let bind = make(&mut sim.b, mr, mw);
        let tpt = |n: &Node| -> Vec<(u32, Mr)> { n.regions.iter_stags().map(|(s, e)| (s, e.clone())).collect() };
        let before = tpt(&sim.b);
        assert_eq!(post_bind(&mut sim, bind), WcStatus::MwBindErr, "{name}");
        assert_eq!(sim.b.state(2), Some(QpState::Error), "{name}");
        assert_eq!(tpt(&sim.b), before, "{name}: the TPT as it was");
    }
    // A type 2 window is bound only when free: the second bind is refused.
    let mut sim = pair();
    let (mr, mw) = bound(&mut sim, MwType::Two);
    assert_eq!(post_bind(&mut sim, bind_of(mw, mr, MwType::Two)), WcStatus::MwBindErr);
    assert!(sim.b.regions.get(mw).is_some_and(|w| w.valid), "still bound as before");
}

#[test]
fn a_type_1_window_rebinds_and_a_zero_length_bind_unbinds_it() {
    let mut sim = pair();
    let (mr, first) = bound(&mut sim, MwType::One);
    let second = bind_of(first, mr, MwType::One);
    assert_eq!(post_bind(&mut sim, second), WcStatus::Success, "rebind while bound");
    assert!(sim.b.regions.get(first).is_none(), "the old key names nothing");
    let unbind = MwBind { length: 0, mr_stag: 0, access: 0, ..bind_of(second.mw_stag, mr, MwType::One) };
    assert_eq!(post_bind(&mut sim, unbind), WcStatus::Success);
    a_writes(&mut sim, 1, unbind.mw_stag, MR_IOVA + 0x100, 16);
    refused(&sim, 1, 2, ProtocolError::WriteAccess(AccessError::InvalidStag), TermCode::DdpTaggedInvalidStag);
}

#[test]
fn access_through_a_window_is_checked_like_an_mr() {
    // Bounds are the window's, not the MR's.
    let mut sim = pair();
    let (_, mw) = bound(&mut sim, MwType::Two);
    let before = sim.b.memory.clone();
    a_writes(&mut sim, 1, mw, MR_IOVA + 0x100 + 0x1000 - 1, 2);
    refused(&sim, 1, 2, ProtocolError::WriteAccess(AccessError::Bounds), TermCode::DdpTaggedBaseOrBoundsViolation);
    assert!(sim.b.memory.changed_ranges(&before).is_empty());
    // Rights are the window's: bound for READ, a WRITE is refused.
    let mut sim = pair();
    let mr = mr(&mut sim.b, LOCAL_WRITE | MW_BIND);
    let w = sim.b.regions.alloc_window(PD, MwType::Two);
    let read_only = MwBind { access: REMOTE_READ, ..bind_of(w, mr, MwType::Two) };
    assert_eq!(post_bind(&mut sim, read_only), WcStatus::Success);
    a_writes(&mut sim, 1, read_only.mw_stag, MR_IOVA + 0x100, 8);
    refused(&sim, 1, 2, ProtocolError::WriteAccess(AccessError::Rights), TermCode::DdpTaggedInvalidStag);
    // A window is never an lkey: B's own SEND from it is a local protection error.
    let mut sim = pair();
    let (_, mw) = bound(&mut sim, MwType::One);
    let mut send = SendWr::new(9, SendOpcode::Send);
    send.sges = SgeList::single(Sge { addr: MR_IOVA + 0x100, length: 8, lkey: mw });
    sim.b.engine.post_send(2, send).unwrap();
    settle(&mut sim, 1);
    assert_eq!(results(&sim.b, 2), vec![(9, WcOpcode::Send, WcStatus::LocProtErr)]);
}

#[test]
fn a_type_2_window_answers_only_its_qp_and_a_window_only_its_pd() {
    for (mw_type, pd, error, sent) in [
        (MwType::Two, PD, AccessError::WrongQp, TermCode::DdpTaggedStagNotAssociated),
        (MwType::One, PD + 1, AccessError::WrongPd, TermCode::DdpTaggedStagNotAssociated),
    ] {
        let config = QpConfig::new(pd);
        let mut sim = pair();
        assert!(sim.connect_qps(3, 4, 40_001, config));
        settle_rtr(&mut sim);
        sim.a.events.clear();
        sim.b.events.clear();
        let (_, mw) = bound(&mut sim, mw_type);
        a_writes_in(&mut sim, (3, pd), mw, MR_IOVA + 0x100, 8);
        refused(&sim, 3, 4, ProtocolError::WriteAccess(error), sent);
        // A READ through it on that connection: the RDMAP code.
        let mut sim = pair();
        assert!(sim.connect_qps(3, 4, 40_001, config));
        settle_rtr(&mut sim);
        sim.a.events.clear();
        sim.b.events.clear();
        let (_, mw) = bound(&mut sim, mw_type);
        let (astag, aiova) = (sim.a.regions.register_contiguous(pd, LOCAL_WRITE, 0x1000, 0x1000, 64), 0x1000);
        sim.a.engine.post_send(3, rdma(1, SendOpcode::Read, (astag, aiova), 8, mw, MR_IOVA + 0x100)).unwrap();
        settle(&mut sim, 2);
        refused(&sim, 3, 4, ProtocolError::ReadSourceAccess(error), TermCode::RdmapStagNotAssociated);
    }
    // Type 1 answers any QP of its PD.
    let mut sim = pair();
    assert!(sim.connect_qps(3, 4, 40_001, QpConfig::new(PD)));
    settle_rtr(&mut sim);
    let (_, mw) = bound(&mut sim, MwType::One);
    a_writes(&mut sim, 3, mw, MR_IOVA + 0x100, 8);
    assert_eq!(results(&sim.a, 3), vec![(1, WcOpcode::Write, WcStatus::Success)]);
}

#[test]
fn local_invalidate_ends_a_type_2_window_and_refuses_a_type_1() {
    let mut sim = pair();
    let (mr, mw) = bound(&mut sim, MwType::Two);
    let mut inv = SendWr::new(60, SendOpcode::LocalInv);
    inv.invalidate_stag = mw;
    sim.b.engine.post_send(2, inv).unwrap();
    settle(&mut sim, 1);
    assert_eq!(results(&sim.b, 2), vec![(60, WcOpcode::LocalInv, WcStatus::Success)]);
    sim.b.completions.clear();
    // Free again: it binds once more, under the next key.
    let again = bind_of(mw, mr, MwType::Two);
    assert_eq!(post_bind(&mut sim, again), WcStatus::Success);
    let mut inv = SendWr::new(61, SendOpcode::LocalInv);
    inv.invalidate_stag = again.mw_stag;
    sim.b.engine.post_send(2, inv).unwrap();
    settle(&mut sim, 1);
    a_writes(&mut sim, 1, again.mw_stag, MR_IOVA + 0x100, 8);
    refused(&sim, 1, 2, ProtocolError::WriteAccess(AccessError::InvalidStag), TermCode::DdpTaggedInvalidStag);
    // Type 1: LOCAL_INV is refused, the window stays bound.
    let mut sim = pair();
    let (_, mw) = bound(&mut sim, MwType::One);
    let mut inv = SendWr::new(62, SendOpcode::LocalInv);
    inv.invalidate_stag = mw;
    sim.b.engine.post_send(2, inv).unwrap();
    settle(&mut sim, 1);
    assert_eq!(results(&sim.b, 2), vec![(62, WcOpcode::LocalInv, WcStatus::LocQpOpErr)]);
    assert!(sim.b.regions.get(mw).is_some_and(|w| w.valid));
}

/// A sends B a Send with Invalidate naming `stag`; B has a receive posted.
fn a_sends_invalidate(sim: &mut Sim<Node, Node>, stag: u32) {
    let (rstag, riova) = registered_buffer(&mut sim.b, 4096);
    let sges = SgeList::single(Sge { addr: riova, length: 4096, lkey: rstag });
    sim.b.engine.post_recv(2, RecvWr { wr_id: 7, sges }).unwrap();
    let (astag, aiova) = registered_buffer(&mut sim.a, 64);
    let mut inv = SendWr::new(3, SendOpcode::SendInvalidate);
    inv.sges = SgeList::single(Sge { addr: aiova, length: 20, lkey: astag });
    inv.invalidate_stag = stag;
    sim.a.engine.post_send(1, inv).unwrap();
    settle(sim, 2);
}

#[test]
fn the_peer_invalidates_a_type_2_window_but_not_a_type_1() {
    let mut sim = pair();
    let (_, mw) = bound(&mut sim, MwType::Two);
    a_sends_invalidate(&mut sim, mw);
    let recv = sim.b.completions.iter().find(|c| c.wr_id == 7).copied().unwrap();
    assert_eq!((recv.status, recv.invalidated_stag), (WcStatus::Success, Some(mw)));
    assert!(sim.b.regions.get(mw).is_some_and(|w| !w.valid));
    sim.a.completions.clear();
    sim.a.events.clear();
    sim.b.events.clear();
    a_writes(&mut sim, 1, mw, MR_IOVA + 0x100, 8);
    refused(&sim, 1, 2, ProtocolError::WriteAccess(AccessError::InvalidStag), TermCode::DdpTaggedInvalidStag);
    // Type 1: "STag cannot be invalidated" (remote protection 0/1/09),
    // the receive completes with REM_INV_REQ_ERR, the window stays bound.
    let mut sim = pair();
    let (_, mw) = bound(&mut sim, MwType::One);
    a_sends_invalidate(&mut sim, mw);
    let recv = sim.b.completions.iter().find(|c| c.wr_id == 7).copied().unwrap();
    assert_eq!(recv.status, WcStatus::RemInvReqErr);
    refused(
        &sim,
        1,
        2,
        ProtocolError::CannotInvalidate(AccessError::Rights),
        TermCode::RdmapProtectionStagCannotBeInvalidated,
    );
    assert!(sim.b.regions.get(mw).is_some_and(|w| w.valid));
}
