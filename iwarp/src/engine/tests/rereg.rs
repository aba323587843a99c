//! Re-registration on the simulated wire: B re-registers the MR it gave A
//! (QP 1 writes to B's QP 2), keeping its STag; A's next WRITEs land in
//! the new translation, are refused outside it, after the rights were
//! narrowed and after the MR moved to another PD, each with its exact
//! TERMINATE. An MR with a window bound to it is not re-registered.

use super::*;
use crate::tpt::Mr;

const OLD_IOVA: u64 = 0x5000_0000;
const OLD_GUEST: u64 = 0x4_0000;
const NEW_IOVA: u64 = 0x6000_0000;
/// Two pages, not contiguous, the first entered 0x200 in.
const NEW_PAGES: [u64; 2] = [0x9_0000, 0x7_0000];
const LEN: u64 = 8192 - 0x200;

fn pattern(len: u32) -> Vec<u8> {
    (0..len).map(|i| (i % 241) as u8 ^ 0x5a).collect()
}

/// B's MR over contiguous memory at [`OLD_GUEST`].
fn b_mr(sim: &mut Sim<Node, Node>, access: Access) -> u32 {
    sim.b.regions.register_contiguous(PD, access, OLD_IOVA, OLD_GUEST, LEN)
}

fn change(change: u32, pdn: u32, access: Access) -> Rereg {
    Rereg { change, new: Registration { pdn, access, iova: NEW_IOVA, length: LEN }, npages: 2, page_offset: 0x200 }
}

#[test]
fn writes_land_in_the_new_translation_and_not_in_the_old() {
    let mut sim = pair();
    let mr = b_mr(&mut sim, LOCAL_WRITE | REMOTE_WRITE);
    a_writes_in(&mut sim, (1, PD), mr, OLD_IOVA + 0x10, 100);
    assert_eq!(sim.b.memory.slice(OLD_GUEST + 0x10, 100), &pattern(100)[..]);

    let rereg = change(REREG_TRANSLATION, 0, 0);
    sim.b.regions.rereg_pages(mr, &rereg, NEW_PAGES.to_vec()).unwrap();
    let entry = sim.b.regions.get(mr).expect("the STag keeps naming it");
    assert_eq!((entry.iova, entry.length, entry.access, entry.pdn), (NEW_IOVA, LEN, LOCAL_WRITE | REMOTE_WRITE, PD));
    let before = sim.b.memory.clone();
    // 0x1000 - 0x200 + 0x100 in: across the page boundary, 0x100 on each side.
    let at = NEW_IOVA + 0xd00;
    a_writes_in(&mut sim, (1, PD), mr, at, 0x200);
    assert_eq!(results(&sim.a, 1), vec![(1, WcOpcode::Write, WcStatus::Success); 2]);
    let want = pattern(0x200);
    assert_eq!(sim.b.memory.slice(NEW_PAGES[0] + 0xf00, 0x100), &want[..0x100]);
    assert_eq!(sim.b.memory.slice(NEW_PAGES[1], 0x100), &want[0x100..]);
    // Nothing else changed (a written octet equal to the old one is no change).
    let written = [(NEW_PAGES[1], NEW_PAGES[1] + 0x100), (NEW_PAGES[0] + 0xf00, NEW_PAGES[0] + 0x1000)];
    let inside = |&(s, e): &(u64, u64)| written.iter().any(|&(ws, we)| s >= ws && e <= we);
    assert!(sim.b.memory.changed_ranges(&before).iter().all(inside));

    // The old addresses are no longer the region's: bounds, nothing written.
    let before = sim.b.memory.clone();
    a_writes_in(&mut sim, (1, PD), mr, OLD_IOVA + 0x10, 100);
    refused(&sim, 1, 2, ProtocolError::WriteAccess(AccessError::Bounds), TermCode::DdpTaggedBaseOrBoundsViolation);
    assert_eq!(sim.b.memory.changed_ranges(&before), vec![]);
}

#[test]
fn narrowed_rights_and_another_pd_refuse_the_peer() {
    type Case = (u32, u32, Access, AccessError, TermCode);
    let cases: [Case; 2] = [
        (REREG_ACCESS, PD, LOCAL_WRITE | REMOTE_READ, AccessError::Rights, TermCode::DdpTaggedInvalidStag),
        (REREG_PD, PD + 1, 0, AccessError::WrongPd, TermCode::DdpTaggedStagNotAssociated),
    ];
    for (what, pdn, access, error, sent) in cases {
        let mut sim = pair();
        let mr = b_mr(&mut sim, LOCAL_WRITE | REMOTE_WRITE);
        a_writes_in(&mut sim, (1, PD), mr, OLD_IOVA, 8);
        assert_eq!(results(&sim.a, 1), vec![(1, WcOpcode::Write, WcStatus::Success)], "{what}");
        sim.b.regions.rereg_pages(mr, &change(what, pdn, access), Vec::new()).unwrap();
        let before = sim.b.memory.clone();
        a_writes_in(&mut sim, (1, PD), mr, OLD_IOVA, 8);
        refused(&sim, 1, 2, ProtocolError::WriteAccess(error), sent);
        assert_eq!(sim.b.memory.changed_ranges(&before), vec![], "{what}");
        assert_eq!(sim.b.state(2), Some(QpState::Error), "{what}");
    }
    // Widened again (on a fresh pair: the first QP is in error), it works.
    let mut sim = pair();
    let mr = b_mr(&mut sim, LOCAL_WRITE);
    sim.b.regions.rereg_pages(mr, &change(REREG_ACCESS, 0, LOCAL_WRITE | REMOTE_WRITE), Vec::new()).unwrap();
    a_writes_in(&mut sim, (1, PD), mr, OLD_IOVA, 8);
    assert_eq!(results(&sim.a, 1), vec![(1, WcOpcode::Write, WcStatus::Success)]);
    assert_eq!(sim.b.memory.slice(OLD_GUEST, 8), &pattern(8)[..]);
}

#[test]
fn a_window_bound_to_the_mr_refuses_every_rereg() {
    let mut sim = pair();
    let mr = b_mr(&mut sim, LOCAL_WRITE | MW_BIND);
    let mw = sim.b.regions.alloc_window(PD, MwType::Two);
    let bind = MwBind {
        mw_stag: mw & !0xff | u32::from((mw as u8).wrapping_add(1)),
        mr_stag: mr,
        addr: OLD_IOVA,
        length: 0x100,
        access: REMOTE_WRITE,
        mw_type: MwType::Two,
    };
    let mut wr = SendWr::new(9, SendOpcode::BindMw);
    wr.bind = bind;
    sim.b.engine.post_send(2, wr).unwrap();
    settle(&mut sim, 1);
    assert_eq!(results(&sim.b, 2), vec![(9, WcOpcode::BindMw, WcStatus::Success)]);
    let tpt = |n: &Node| -> Vec<(u32, Mr)> { n.regions.iter_stags().map(|(s, e)| (s, e.clone())).collect() };
    let before = tpt(&sim.b);
    for what in [REREG_TRANSLATION, REREG_PD, REREG_ACCESS] {
        let got = sim.b.regions.rereg_pages(mr, &change(what, PD + 1, LOCAL_WRITE), NEW_PAGES.to_vec());
        assert_eq!(got, Err(ReregError::WindowsBound(1)), "{what}");
    }
    assert_eq!(tpt(&sim.b), before);
    // Not an MR: the window itself, a stale key.
    assert_eq!(
        sim.b.regions.rereg_pages(bind.mw_stag, &change(REREG_PD, PD, 0), Vec::new()),
        Err(ReregError::Kind("window"))
    );
    assert_eq!(
        sim.b.regions.rereg_pages(mr ^ 0x40, &change(REREG_PD, PD, 0), Vec::new()),
        Err(ReregError::NoSuchMr(mr ^ 0x40))
    );
    // Once the window is invalidated, the MR is re-registered.
    let mut inv = SendWr::new(10, SendOpcode::LocalInv);
    inv.invalidate_stag = bind.mw_stag;
    sim.b.engine.post_send(2, inv).unwrap();
    settle(&mut sim, 1);
    sim.b.regions.rereg_pages(mr, &change(REREG_ACCESS, PD, LOCAL_WRITE), Vec::new()).unwrap();
}
