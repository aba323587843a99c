//! Memory management extensions on the simulated wire: fast-reg MRs
//! filled by REG_MR, invalidated by LOCAL_INV and by the peer's Send with
//! Invalidate, and the RFC 5040 rules on who may invalidate what. B owns
//! the fast-reg MRs (QP 2); A is the peer (QP 1). Both in PD [`PD`].

use super::*;
use crate::tpt::Backing;

const ALL: Access = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;
/// Where B's page lists live in its memory.
const PBL: u64 = 0x2_0000;
/// Scattered, out-of-order guest pages of the fast-reg MR.
const PAGES: [u64; 3] = [0x8_0000, 0x3_0000, 0x6_0000];
/// The region's IOVA: 0x100 into its first page.
const IOVA: u64 = 0x7000_0000_0100;
const LEN: u64 = 3 * 4096 - 0x100;

fn with_key(stag: u32, key: u8) -> u32 {
    stag & !0xff | u32::from(key)
}

fn next_key(stag: u32) -> u32 {
    with_key(stag, (stag as u8).wrapping_add(1))
}

fn write_pbl(node: &mut Node, at: u64, pages: &[u64]) {
    let bytes: Vec<u8> = pages.iter().flat_map(|p| p.to_le_bytes()).collect();
    node.memory.fill(at, &bytes);
}

fn reg_wr(wr_id: u64, stag: u32, npages: u32, access: Access) -> SendWr {
    let mut wr = SendWr::new(wr_id, SendOpcode::RegMr);
    wr.fast_reg = FastReg { stag, iova: IOVA, length: LEN, pbl_addr: PBL, npages, access };
    wr
}

fn local_inv_wr(wr_id: u64, stag: u32) -> SendWr {
    let mut wr = SendWr::new(wr_id, SendOpcode::LocalInv);
    wr.invalidate_stag = stag;
    wr
}

/// B: a fast-reg MR of 4 pages, registered over [`PAGES`] under a rotated
/// key. Returns (allocated STag, registered STag).
fn registered(sim: &mut Sim<Node, Node>, access: Access) -> (u32, u32) {
    let old = sim.b.regions.alloc_fast_reg(PD, 4);
    assert!(!sim.b.regions.get(old).unwrap().valid, "allocated invalid");
    write_pbl(&mut sim.b, PBL, &PAGES);
    let stag = next_key(old);
    sim.b.engine.post_send(2, reg_wr(100, stag, 3, access)).unwrap();
    settle(sim, 1);
    assert_eq!(results(&sim.b, 2), vec![(100, WcOpcode::RegMr, WcStatus::Success)]);
    sim.b.completions.clear();
    (old, stag)
}

/// What B's memory holds at region bytes `[offset, offset + len)` of
/// the MR over [`PAGES`] (0x100 into the first page).
fn region_bytes(node: &Node, offset: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut pos = offset + 0x100;
    while out.len() < len {
        let page = PAGES[(pos / 4096) as usize];
        let take = ((4096 - pos % 4096) as usize).min(len - out.len());
        out.extend_from_slice(node.memory.slice(page + pos % 4096, take));
        pos += take as u64;
    }
    out
}

/// A's access through `stag` failed at B with `error`, TERMINATE `sent`.
fn refused_at_b(sim: &Sim<Node, Node>, error: ProtocolError, sent: TermCode) {
    assert_eq!(others(&sim.b.qp_events(2)), vec![EventKind::LocalError { error, sent }]);
    assert_eq!(
        others(&sim.a.qp_events(1)),
        vec![EventKind::TerminateReceived { code: sent, class: sent.etype_class() }]
    );
}

#[test]
fn the_peer_writes_and_reads_through_a_fast_registered_stag() {
    let mut sim = pair();
    let (old, stag) = registered(&mut sim, ALL);
    let mr = sim.b.regions.get(stag).unwrap();
    let page_offset = match &mr.backing {
        Backing::Pages { page_offset, .. } => *page_offset,
        Backing::Dma => panic!("a fast-registered MR has pages"),
    };
    assert_eq!((mr.iova, mr.length, page_offset, mr.valid), (IOVA, LEN, 0x100, true));
    assert!(sim.b.regions.get(old).is_none(), "the key rotated: the old STag names nothing");
    // A WRITEs 9000 octets across all three pages, then READs them back.
    let data: Vec<u8> = (0..9000u32).map(|i| (i * 7 % 251) as u8).collect();
    let (astag, aiova) = registered_buffer(&mut sim.a, 2 * 9000);
    sim.a.memory.fill(aiova, &data);
    sim.a.engine.post_send(1, rdma(1, SendOpcode::Write, (astag, aiova), 9000, stag, IOVA + 50)).unwrap();
    sim.a.engine.post_send(1, rdma(2, SendOpcode::Read, (astag, aiova + 9000), 9000, stag, IOVA + 50)).unwrap();
    settle(&mut sim, 2);
    assert_eq!(
        results(&sim.a, 1),
        vec![(1, WcOpcode::Write, WcStatus::Success), (2, WcOpcode::Read, WcStatus::Success)]
    );
    assert_eq!(region_bytes(&sim.b, 50, 9000), data, "placed through the page list");
    assert_eq!(sim.a.memory.slice(aiova + 9000, 9000), &data[..], "read back");
    // Bounds are the registration's: one octet past the end is refused.
    sim.a.engine.post_send(1, rdma(3, SendOpcode::Write, (astag, aiova), 2, stag, IOVA + LEN - 1)).unwrap();
    settle(&mut sim, 2);
    refused_at_b(&sim, ProtocolError::WriteAccess(AccessError::Bounds), TermCode::DdpTaggedBaseOrBoundsViolation);
}

#[test]
fn rights_are_the_registrations() {
    // Registered for remote READ only: a WRITE is refused, nothing placed.
    let mut sim = pair();
    let (_, stag) = registered(&mut sim, LOCAL_WRITE | REMOTE_READ);
    let before = sim.b.memory.clone();
    let (astag, aiova) = registered_buffer(&mut sim.a, 64);
    sim.a.engine.post_send(1, rdma(1, SendOpcode::Write, (astag, aiova), 64, stag, IOVA)).unwrap();
    settle(&mut sim, 2);
    refused_at_b(&sim, ProtocolError::WriteAccess(AccessError::Rights), TermCode::DdpTaggedInvalidStag);
    assert!(sim.b.memory.changed_ranges(&before).is_empty());
}

#[test]
fn a_read_response_lands_in_a_fast_registered_sink() {
    // B READs from A into its own fast-reg MR (the READ sink of an iWARP
    // storage target must be a registered STag).
    let mut sim = pair();
    let (_, sink) = registered(&mut sim, LOCAL_WRITE | REMOTE_WRITE);
    let data: Vec<u8> = (0..7000u32).map(|i| (i % 253) as u8 ^ 0x3c).collect();
    let (astag, aiova) = registered_buffer(&mut sim.a, 7000);
    sim.a.memory.fill(aiova, &data);
    sim.b.engine.post_send(2, rdma(1, SendOpcode::Read, (sink, IOVA + 10), 7000, astag, aiova)).unwrap();
    // A fenced LOCAL_INV after it waits for the READ's last response.
    let mut inv = local_inv_wr(2, sink);
    inv.fence = true;
    sim.b.engine.post_send(2, inv).unwrap();
    settle(&mut sim, 2);
    assert_eq!(
        results(&sim.b, 2),
        vec![(1, WcOpcode::Read, WcStatus::Success), (2, WcOpcode::LocalInv, WcStatus::Success)]
    );
    assert_eq!(region_bytes(&sim.b, 10, 7000), data);
    assert!(!sim.b.regions.get(sink).unwrap().valid);
    // The invalidated sink refuses the next READ locally.
    sim.b.engine.post_send(2, rdma(3, SendOpcode::Read, (sink, IOVA), 100, astag, aiova)).unwrap();
    settle(&mut sim, 2);
    assert_eq!(results(&sim.b, 2)[2], (3, WcOpcode::Read, WcStatus::LocProtErr));
    assert_eq!(sim.b.state(2), Some(QpState::Error));
}

#[test]
fn access_after_local_invalidate_is_a_terminate() {
    for read in [false, true] {
        let mut sim = pair();
        let (_, stag) = registered(&mut sim, ALL);
        sim.b.engine.post_send(2, local_inv_wr(5, stag)).unwrap();
        settle(&mut sim, 1);
        assert_eq!(results(&sim.b, 2), vec![(5, WcOpcode::LocalInv, WcStatus::Success)]);
        let before = sim.b.memory.clone();
        let (astag, aiova) = registered_buffer(&mut sim.a, 64);
        let opcode = if read { SendOpcode::Read } else { SendOpcode::Write };
        sim.a.engine.post_send(1, rdma(1, opcode, (astag, aiova), 64, stag, IOVA)).unwrap();
        settle(&mut sim, 2);
        if read {
            refused_at_b(&sim, ProtocolError::ReadSourceAccess(AccessError::InvalidStag), TermCode::RdmapInvalidStag);
        } else {
            refused_at_b(&sim, ProtocolError::WriteAccess(AccessError::InvalidStag), TermCode::DdpTaggedInvalidStag);
        }
        assert!(sim.b.memory.changed_ranges(&before).is_empty(), "nothing placed");
    }
}

#[test]
fn send_with_invalidate_of_a_fast_reg_mr() {
    let mut sim = pair();
    let (_, stag) = registered(&mut sim, ALL);
    let (rstag, riova) = registered_buffer(&mut sim.b, 4096);
    let sges = SgeList::single(Sge { addr: riova, length: 4096, lkey: rstag });
    sim.b.engine.post_recv(2, RecvWr { wr_id: 7, sges }).unwrap();
    let (astag, aiova) = registered_buffer(&mut sim.a, 64);
    let mut inv = SendWr::new(1, SendOpcode::SendSolicitedInvalidate);
    inv.sges = SgeList::single(Sge { addr: aiova, length: 20, lkey: astag });
    inv.invalidate_stag = stag;
    sim.a.engine.post_send(1, inv).unwrap();
    settle(&mut sim, 1);
    let c = sim.b.completions[0];
    assert_eq!(
        (c.wr_id, c.status, c.byte_len, c.invalidated_stag, c.solicited),
        (7, WcStatus::Success, 20, Some(stag), true)
    );
    assert!(!sim.b.regions.get(stag).unwrap().valid);
    // The peer's next access through it fails.
    sim.a.engine.post_send(1, rdma(2, SendOpcode::Write, (astag, aiova), 8, stag, IOVA)).unwrap();
    settle(&mut sim, 2);
    refused_at_b(&sim, ProtocolError::WriteAccess(AccessError::InvalidStag), TermCode::DdpTaggedInvalidStag);
}

/// Send with Invalidate of an STag the peer may not invalidate: each is a
/// TERMINATE with siw's code, the receive completes REM_INV_REQ_ERR, and
/// the STag stays as it was.
#[test]
fn remote_invalidation_rules() {
    type Target = fn(&mut Sim<Node, Node>) -> u32;
    let cases: [(&str, Target, AccessError, TermCode); 4] = [
        (
            "an ordinary MR",
            |sim| registered_buffer(&mut sim.b, 4096).0,
            AccessError::Rights,
            TermCode::RdmapProtectionStagCannotBeInvalidated,
        ),
        (
            "another PD's fast-reg MR",
            |sim| sim.b.regions.alloc_fast_reg(PD + 1, 4),
            AccessError::WrongPd,
            TermCode::RdmapProtectionStagCannotBeInvalidated,
        ),
        (
            "a stale key of a fast-reg MR",
            |sim| registered(sim, ALL).0,
            AccessError::InvalidStag,
            TermCode::RdmapOperationStagCannotBeInvalidated,
        ),
        ("nothing at all", |_| 0x00ab_cd00, AccessError::InvalidStag, TermCode::RdmapOperationStagCannotBeInvalidated),
    ];
    for (what, target, error, sent) in cases {
        let mut sim = pair();
        let stag = target(&mut sim);
        let valid_before = sim.b.regions.iter_stags().map(|(s, mr)| (s, mr.valid)).collect::<Vec<_>>();
        let (rstag, riova) = registered_buffer(&mut sim.b, 4096);
        let sges = SgeList::single(Sge { addr: riova, length: 4096, lkey: rstag });
        sim.b.engine.post_recv(2, RecvWr { wr_id: 7, sges }).unwrap();
        let mut inv = SendWr::new(1, SendOpcode::SendInvalidate);
        inv.invalidate_stag = stag;
        sim.a.engine.post_send(1, inv).unwrap();
        settle(&mut sim, 2);
        assert_eq!(
            others(&sim.b.qp_events(2)),
            vec![EventKind::LocalError { error: ProtocolError::CannotInvalidate(error), sent }],
            "{what}"
        );
        assert_eq!(
            others(&sim.a.qp_events(1)),
            vec![EventKind::TerminateReceived { code: sent, class: sent.etype_class() }],
            "{what}"
        );
        let c = sim.b.completions[0];
        assert_eq!((c.wr_id, c.status, c.invalidated_stag), (7, WcStatus::RemInvReqErr, None), "{what}");
        for (s, valid) in valid_before {
            assert_eq!(sim.b.regions.get(s).unwrap().valid, valid, "{what}: STag {s:#x} untouched");
        }
    }
}

#[test]
fn key_rotation_makes_the_old_stag_invalid() {
    let mut sim = pair();
    let (_, first) = registered(&mut sim, ALL);
    sim.b.engine.post_send(2, local_inv_wr(1, first)).unwrap();
    // Re-registered over other pages under the next key.
    let new_pages = [0x9_0000u64, 0xa_0000, 0xb_0000];
    write_pbl(&mut sim.b, PBL + 0x100, &new_pages);
    let second = next_key(first);
    let mut reg = reg_wr(2, second, 3, ALL);
    reg.fast_reg.pbl_addr = PBL + 0x100;
    sim.b.engine.post_send(2, reg).unwrap();
    settle(&mut sim, 1);
    assert_eq!(
        results(&sim.b, 2),
        vec![(1, WcOpcode::LocalInv, WcStatus::Success), (2, WcOpcode::RegMr, WcStatus::Success)]
    );
    assert_eq!(first >> 8, second >> 8, "same index");
    let (astag, aiova) = registered_buffer(&mut sim.a, 64);
    sim.a.memory.fill(aiova, &[0x5a; 64]);
    sim.a.engine.post_send(1, rdma(1, SendOpcode::Write, (astag, aiova), 64, second, IOVA)).unwrap();
    settle(&mut sim, 1);
    assert_eq!(sim.b.memory.slice(new_pages[0] + 0x100, 64), &[0x5a; 64][..]);
    let before = sim.b.memory.clone();
    sim.a.engine.post_send(1, rdma(2, SendOpcode::Write, (astag, aiova), 64, first, IOVA)).unwrap();
    settle(&mut sim, 2);
    refused_at_b(&sim, ProtocolError::WriteAccess(AccessError::InvalidStag), TermCode::DdpTaggedInvalidStag);
    assert!(sim.b.memory.changed_ranges(&before).is_empty(), "the old STag reaches nothing");
}

/// Every REG_MR or LOCAL_INV rule broken: a local error completion
/// (LOC_QP_OP_ERR, in order), the QP to ERROR, the peer told it is our
/// error, and the MR as it was.
#[test]
fn refused_registrations_and_invalidations_are_local_errors() {
    type Case = fn(&mut Sim<Node, Node>) -> SendWr;
    let cases: [(&str, Case); 12] = [
        ("REG_MR of a valid MR", |sim| {
            let (_, stag) = registered(sim, ALL);
            reg_wr(9, next_key(stag), 3, ALL)
        }),
        ("REG_MR without a key rotation", |sim| {
            let stag = sim.b.regions.alloc_fast_reg(PD, 4);
            reg_wr(9, stag, 3, ALL)
        }),
        ("REG_MR of another PD's MR", |sim| {
            let stag = sim.b.regions.alloc_fast_reg(PD + 1, 4);
            reg_wr(9, next_key(stag), 3, ALL)
        }),
        ("REG_MR of more pages than allocated", |sim| {
            let stag = sim.b.regions.alloc_fast_reg(PD, 2);
            reg_wr(9, next_key(stag), 3, ALL)
        }),
        ("REG_MR of no pages", |sim| {
            let stag = sim.b.regions.alloc_fast_reg(PD, 4);
            reg_wr(9, next_key(stag), 0, ALL)
        }),
        ("REG_MR longer than its pages", |sim| {
            let stag = sim.b.regions.alloc_fast_reg(PD, 4);
            let mut wr = reg_wr(9, next_key(stag), 3, ALL);
            wr.fast_reg.length = LEN + 1;
            wr
        }),
        ("REG_MR of an ordinary MR's index", |sim| {
            let stag = registered_buffer(&mut sim.b, 4096).0;
            reg_wr(9, next_key(stag), 1, ALL)
        }),
        ("REG_MR with unknown access bits", |sim| {
            let stag = sim.b.regions.alloc_fast_reg(PD, 4);
            reg_wr(9, next_key(stag), 3, 0x100)
        }),
        ("REG_MR of an unaligned page", |sim| {
            let stag = sim.b.regions.alloc_fast_reg(PD, 4);
            write_pbl(&mut sim.b, PBL, &[0x8_0000, 0x3_0800, 0x6_0000]);
            reg_wr(9, next_key(stag), 3, ALL)
        }),
        ("REG_MR of a page outside guest RAM", |sim| {
            let stag = sim.b.regions.alloc_fast_reg(PD, 4);
            write_pbl(&mut sim.b, PBL, &[0x8_0000, 1 << 40, 0x6_0000]);
            reg_wr(9, next_key(stag), 3, ALL)
        }),
        ("LOCAL_INV of an ordinary MR", |sim| local_inv_wr(9, registered_buffer(&mut sim.b, 4096).0)),
        ("LOCAL_INV of another PD's MR", |sim| local_inv_wr(9, sim.b.regions.alloc_fast_reg(PD + 1, 4))),
    ];
    for (what, case) in cases {
        let mut sim = pair();
        write_pbl(&mut sim.b, PBL, &PAGES);
        let wr = case(&mut sim);
        let opcode = wr.opcode.wc_opcode();
        let tpt_before: Vec<_> = sim.b.regions.iter_stags().map(|(s, mr)| (s, mr.clone())).collect();
        sim.b.engine.post_send(2, wr).unwrap();
        settle(&mut sim, 2);
        assert_eq!(results(&sim.b, 2), vec![(9, opcode, WcStatus::LocQpOpErr)], "{what}");
        assert_eq!(
            others(&sim.b.qp_events(2)),
            vec![EventKind::WqeError { wr_id: 9, status: WcStatus::LocQpOpErr }],
            "{what}"
        );
        assert_eq!(sim.b.state(2), Some(QpState::Error), "{what}");
        assert_eq!(
            others(&sim.a.qp_events(1)),
            vec![EventKind::TerminateReceived {
                code: TermCode::RdmapLocalCatastrophic,
                class: ErrorClass::Catastrophic
            }],
            "{what}"
        );
        let tpt_after: Vec<_> = sim.b.regions.iter_stags().map(|(s, mr)| (s, mr.clone())).collect();
        assert_eq!(tpt_after, tpt_before, "{what}: the TPT is unchanged");
    }
}

/// Invalidating an invalid fast-reg MR is allowed (locally and by the
/// peer), and a REG_MR after it works again.
#[test]
fn invalidating_an_invalid_fast_reg_mr_is_allowed() {
    let mut sim = pair();
    let stag = sim.b.regions.alloc_fast_reg(PD, 4);
    sim.b.engine.post_send(2, local_inv_wr(1, stag)).unwrap();
    let (rstag, riova) = registered_buffer(&mut sim.b, 4096);
    let sges = SgeList::single(Sge { addr: riova, length: 4096, lkey: rstag });
    sim.b.engine.post_recv(2, RecvWr { wr_id: 7, sges }).unwrap();
    let mut inv = SendWr::new(1, SendOpcode::SendInvalidate);
    inv.invalidate_stag = stag;
    sim.a.engine.post_send(1, inv).unwrap();
    write_pbl(&mut sim.b, PBL, &PAGES);
    settle(&mut sim, 1);
    sim.b.engine.post_send(2, reg_wr(2, next_key(stag), 3, ALL)).unwrap();
    settle(&mut sim, 1);
    let b: Vec<_> = sim.b.completions.iter().map(|c| (c.wr_id, c.opcode, c.status, c.invalidated_stag)).collect();
    assert_eq!(
        b,
        vec![
            (1, WcOpcode::LocalInv, WcStatus::Success, None),
            (7, WcOpcode::Recv, WcStatus::Success, Some(stag)),
            (2, WcOpcode::RegMr, WcStatus::Success, None),
        ]
    );
    assert!(sim.b.regions.get(next_key(stag)).unwrap().valid);
}

/// READ_INV (IB_WR_RDMA_READ_WITH_INV, what rdma_rw posts on iWARP): the
/// sink is invalidated once the data is placed, before the completion; an
/// STag the QP may not invalidate is refused before the READ goes out.
#[test]
fn read_with_invalidate_invalidates_the_sink() {
    let mut sim = pair();
    let (_, sink) = registered(&mut sim, LOCAL_WRITE | REMOTE_WRITE);
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 241) as u8).collect();
    let (astag, aiova) = registered_buffer(&mut sim.a, 5000);
    sim.a.memory.fill(aiova, &data);
    let mut read = rdma(1, SendOpcode::ReadInvalidate, (sink, IOVA), 5000, astag, aiova);
    read.invalidate_stag = sink;
    sim.b.engine.post_send(2, read).unwrap();
    settle(&mut sim, 2);
    assert_eq!(results(&sim.b, 2), vec![(1, WcOpcode::Read, WcStatus::Success)]);
    assert_eq!(region_bytes(&sim.b, 0, 5000), data);
    assert!(!sim.b.regions.get(sink).unwrap().valid, "invalidated with the completion");

    // Naming an ordinary MR: refused locally, the peer never asked.
    let mut sim = pair();
    let (_, sink) = registered(&mut sim, LOCAL_WRITE | REMOTE_WRITE);
    let (plain, _) = registered_buffer(&mut sim.b, 4096);
    let (astag, aiova) = registered_buffer(&mut sim.a, 64);
    let mut read = rdma(2, SendOpcode::ReadInvalidate, (sink, IOVA), 64, astag, aiova);
    read.invalidate_stag = plain;
    sim.b.engine.post_send(2, read).unwrap();
    settle(&mut sim, 2);
    assert_eq!(results(&sim.b, 2), vec![(2, WcOpcode::Read, WcStatus::LocQpOpErr)]);
    assert_eq!(sim.a.engine.stats().read_requests_rx, 0);
    assert!(sim.b.regions.get(sink).unwrap().valid && sim.b.regions.get(plain).unwrap().valid);
}
