//! A hostile peer: it speaks TCP and MPA properly, then sends bad FPDUs.
//! For each: nothing panics, nothing is written outside the regions that
//! allow it, the right TERMINATE goes out (parsed here off the wire), the
//! right event comes up, and the QP ends in ERROR.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation, clippy::type_complexity)]

use vt3_iwarp::engine::*;
use vt3_iwarp::mock::MockMemory;
use vt3_iwarp::negotiation;
use vt3_iwarp::sim::*;
use vt3_iwarp::toe::{Duration, TcpConfig};
use vt3_iwarp::wire::ddp;
use vt3_iwarp::wire::rdmap::{self, Opcode, Placement, ReadRequestPacket, ReadRequestRepr};
use vt3_iwarp::wire::terminate::{self, TermCode};

const PD: u32 = 5;
const QPN: u32 = 2;

/// The engine's memory regions.
struct Regions {
    rw: u32,
    ro: u32,
    wo: u32,
    other_pd: u32,
    stale: u32,
    recv: u32,
}

const RW: u64 = 0x10_000;
const RO: u64 = 0x20_000;
const WO: u64 = 0x30_000;
const OTHER: u64 = 0x40_000;
const STALE: u64 = 0x50_000;
const RECV: u64 = 0x60_000;

struct Hostile {
    sim: Sim<RawPeer, Node>,
    regions: Regions,
    before: MockMemory,
}

fn setup(ird: u16, max_rx_ulpdu: u16) -> Hostile {
    let raw = TcpConfig::new(MACS[0], IPS[0]);
    let mut node = NodeConfig::new(1);
    node.engine.max_rx_ulpdu = max_rx_ulpdu;
    let mut qp = QpConfig::new(PD);
    qp.mpa.ird = ird;
    let mpa = negotiation::Config { peer_to_peer: false, ..negotiation::Config::default() };
    let mut sim = Sim::raw_pair(raw, node, WireConfig::default(), QPN, qp, mpa);
    assert!(sim.a.negotiated.is_some(), "raw peer connected");
    let b = &mut sim.b;
    let all = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;
    let old = b.regions.register_contiguous(PD, all, STALE, STALE, 4096);
    b.regions.remove(old);
    let regions = Regions {
        rw: b.regions.register_contiguous(PD, all, RW, RW, 8192),
        ro: b.regions.register_contiguous(PD, REMOTE_READ, RO, RO, 4096),
        wo: b.regions.register_contiguous(PD, REMOTE_WRITE, WO, WO, 4096),
        other_pd: b.regions.register_contiguous(PD + 1, all, OTHER, OTHER, 4096),
        stale: old,
        recv: b.regions.register_contiguous(PD, LOCAL_WRITE, RECV, RECV, 4096),
    };
    let _ = b.regions.register_contiguous(PD, all, STALE, STALE, 4096); // same index, new key
    b.engine
        .post_recv(QPN, RecvWr { wr_id: 1, sges: SgeList::single(Sge { addr: RECV, length: 100, lkey: regions.recv }) })
        .unwrap();
    let before = b.memory.clone();
    b.events.clear();
    Hostile { sim, regions, before }
}

fn tagged(opcode: Opcode, stag: u32, to: u64, payload: &[u8], last: bool) -> Vec<u8> {
    let header = rdmap::Repr { opcode, last, placement: Placement::Tagged { stag, offset: to } };
    let mut ulpdu = vec![0u8; header.buffer_len() + payload.len()];
    header.emit(&mut ddp::Packet::new_unchecked(&mut ulpdu[..])).unwrap();
    ulpdu[header.buffer_len()..].copy_from_slice(payload);
    ulpdu
}

fn untagged(opcode: Opcode, msn: u32, mo: u32, inval: u32, payload: &[u8], last: bool) -> Vec<u8> {
    let header =
        rdmap::Repr { opcode, last, placement: Placement::Untagged { msn, offset: mo, invalidate_stag: inval } };
    let mut ulpdu = vec![0u8; header.buffer_len() + payload.len()];
    header.emit(&mut ddp::Packet::new_unchecked(&mut ulpdu[..])).unwrap();
    ulpdu[header.buffer_len()..].copy_from_slice(payload);
    ulpdu
}

fn read_request(msn: u32, size: u32, source_stag: u32, source_to: u64) -> Vec<u8> {
    let mut payload = [0u8; 28];
    ReadRequestRepr { sink_stag: 0x77, sink_offset: 0x1000, size, source_stag, source_offset: source_to }
        .emit(&mut ReadRequestPacket::new_unchecked(&mut payload[..]))
        .unwrap();
    untagged(Opcode::RdmaReadRequest, msn, 0, 0, &payload, true)
}

impl Hostile {
    fn send(&mut self, ulpdu: &[u8]) {
        self.sim.a.send_ulpdu(ulpdu, None);
    }

    fn run(&mut self) {
        self.sim.run_for(Duration::from_secs(5));
    }

    /// The TERMINATE the engine sent: (code, header control M D R, copied DDP header, RDMAP header).
    fn terminate(&self) -> (TermCode, Option<u16>, Option<Vec<u8>>, Option<Vec<u8>>) {
        let ulpdus = self.sim.a.ulpdus();
        let term = ulpdus
            .iter()
            .find(|u| {
                let p = ddp::Packet::new_unchecked(&u[..]);
                rdmap::Repr::parse(&p).is_ok_and(|r| r.opcode == Opcode::Terminate)
            })
            .unwrap_or_else(|| panic!("no TERMINATE in {} ULPDUs", ulpdus.len()));
        let header = rdmap::Repr::parse(&ddp::Packet::new_unchecked(&term[..])).unwrap();
        assert_eq!(header.placement, Placement::Untagged { msn: 1, offset: 0, invalidate_stag: 0 });
        assert!(header.last);
        let repr = terminate::Repr::parse(&terminate::Packet::new_checked(&term[18..]).unwrap()).unwrap();
        (repr.code, repr.ddp_segment_length, repr.ddp_header.map(<[u8]>::to_vec), repr.rdmap_header.map(<[u8]>::to_vec))
    }

    /// Checks the event, the TERMINATE code, the final state and memory.
    fn expect(&mut self, error: ProtocolError, code: TermCode, allowed: &[(u64, u64)]) {
        self.run();
        let events = self.sim.b.qp_events(QPN);
        assert!(
            events.contains(&EventKind::LocalError { error, sent: code }),
            "expected {error:?} / {code}: {events:?}"
        );
        assert_eq!(error.term_code(), code);
        assert_eq!(self.terminate().0, code);
        let transitions: Vec<EventKind> =
            events.into_iter().filter(|e| matches!(e, EventKind::StateChanged { .. })).collect();
        assert_eq!(
            transitions,
            vec![
                EventKind::StateChanged { from: QpState::Rts, to: QpState::Terminate },
                EventKind::StateChanged { from: QpState::Terminate, to: QpState::Error },
            ]
        );
        for (start, end) in self.sim.b.memory.changed_ranges(&self.before) {
            assert!(
                allowed.iter().any(|&(a, b)| a <= start && end <= b),
                "write outside the allowed regions: {start:#x}..{end:#x}"
            );
        }
    }
}

#[test]
fn baseline_valid_traffic_is_placed() {
    let mut h = setup(16, u16::MAX);
    let rw = h.regions.rw;
    h.send(&tagged(Opcode::RdmaWrite, rw, RW + 100, b"hello", true));
    h.send(&untagged(Opcode::Send, 1, 0, 0, b"world", true));
    h.run();
    assert_eq!(h.sim.b.memory.slice(RW + 100, 5), b"hello");
    assert_eq!(h.sim.b.memory.slice(RECV, 5), b"world");
    assert_eq!(h.sim.b.completions.len(), 1);
    assert_eq!(h.sim.b.state(QPN), Some(QpState::Rts));
    assert_eq!(h.sim.b.memory.changed_ranges(&h.before), vec![(RW + 100, RW + 105), (RECV, RECV + 5)]);
}

#[test]
fn bad_crc() {
    let mut h = setup(16, u16::MAX);
    let mut fpdu = vec![0u8; 64];
    let ulpdu = tagged(Opcode::RdmaWrite, h.regions.rw, RW, b"corrupted", true);
    let len = vt3_iwarp::stream::emit_fpdu(&ulpdu, true, &mut fpdu).unwrap();
    fpdu[len - 1] ^= 1;
    h.sim.a.send(&fpdu[..len]);
    h.expect(ProtocolError::Crc, TermCode::LlpCrcError, &[]);
    let (_, length, ddp_header, rdmap_header) = h.terminate();
    assert_eq!((length, ddp_header, rdmap_header), (None, None, None), "LLP errors carry no headers");
}

#[test]
fn bad_opcode_and_versions() {
    for (byte, value, code) in [
        (1usize, 0x49u8, TermCode::RdmapUnexpectedOpcode), // opcode 9
        (1, 0x80, TermCode::RdmapInvalidVersion),          // RDMAP version 2
        (0, 0xc2, TermCode::DdpTaggedInvalidVersion),      // tagged, DDP version 2
        (0, 0x40, TermCode::DdpUntaggedInvalidVersion),    // untagged, DDP version 0
    ] {
        let mut h = setup(16, u16::MAX);
        let mut ulpdu = tagged(Opcode::RdmaWrite, h.regions.rw, RW, b"x", true);
        if byte == 0 && value & 0x80 == 0 {
            ulpdu = untagged(Opcode::Send, 1, 0, 0, b"x", true);
        }
        ulpdu[byte] = value;
        h.send(&ulpdu);
        h.run();
        let (sent, length, ddp_header, _) = h.terminate();
        assert_eq!(sent, code);
        assert_eq!((length, ddp_header), (None, None), "layout unknown: no headers");
        let events = h.sim.b.qp_events(QPN);
        assert!(
            events
                .iter()
                .any(|e| matches!(e, EventKind::LocalError { error: ProtocolError::Header(_), sent } if *sent == code)),
            "{events:?}"
        );
        assert!(h.sim.b.memory.changed_ranges(&h.before).is_empty());
    }
}

#[test]
fn invalid_stale_and_foreign_stags() {
    let cases: [(fn(&Regions) -> u32, u64, AccessError, TermCode); 4] = [
        (|_| 0x00ab_cd01, RW, AccessError::InvalidStag, TermCode::DdpTaggedInvalidStag),
        (|r| r.stale, STALE, AccessError::InvalidStag, TermCode::DdpTaggedInvalidStag),
        (|r| r.other_pd, OTHER, AccessError::WrongPd, TermCode::DdpTaggedStagNotAssociated),
        (|r| r.ro, RO, AccessError::Rights, TermCode::DdpTaggedInvalidStag),
    ];
    for (stag, to, access, code) in cases {
        let mut h = setup(16, u16::MAX);
        let ulpdu = tagged(Opcode::RdmaWrite, stag(&h.regions), to, &[0xee; 64], true);
        h.send(&ulpdu);
        h.expect(ProtocolError::WriteAccess(access), code, &[]);
        // D and M: the offending DDP header and the segment length.
        let (_, length, ddp_header, rdmap_header) = h.terminate();
        assert_eq!(length, Some(ulpdu.len() as u16));
        assert_eq!(ddp_header.as_deref(), Some(&ulpdu[..14]));
        assert_eq!(rdmap_header, None);
    }
}

#[test]
fn out_of_bounds_and_wrapping_writes() {
    let mut h = setup(16, u16::MAX);
    // Starts inside, ends 1 octet past the 8 KiB region: nothing may land.
    h.send(&tagged(Opcode::RdmaWrite, h.regions.rw, RW + 8192 - 63, &[0xee; 64], true));
    h.expect(ProtocolError::WriteAccess(AccessError::Bounds), TermCode::DdpTaggedBaseOrBoundsViolation, &[]);

    let mut h = setup(16, u16::MAX);
    h.send(&tagged(Opcode::RdmaWrite, h.regions.rw, RW - 1, &[0xee; 4], true));
    h.expect(ProtocolError::WriteAccess(AccessError::Bounds), TermCode::DdpTaggedBaseOrBoundsViolation, &[]);

    let mut h = setup(16, u16::MAX);
    h.send(&tagged(Opcode::RdmaWrite, h.regions.rw, u64::MAX - 10, &[0xee; 100], true));
    h.expect(ProtocolError::TaggedOffsetWrap, TermCode::DdpTaggedToWrap, &[]);

    // A multi-segment WRITE that changes STag half way.
    let mut h = setup(16, u16::MAX);
    h.send(&tagged(Opcode::RdmaWrite, h.regions.rw, RW, &[1; 10], false));
    h.send(&tagged(Opcode::RdmaWrite, h.regions.wo, WO, &[2; 10], true));
    h.expect(
        ProtocolError::TaggedDiscontinuity { stag_changed: true },
        TermCode::DdpTaggedInvalidStag,
        &[(RW, RW + 10)],
    );
}

#[test]
fn reads_with_bad_sources_and_beyond_ird() {
    let cases: [(fn(&Regions) -> u32, u64, u32, ProtocolError, TermCode); 5] = [
        (|r| r.wo, WO, 16, ProtocolError::ReadSourceAccess(AccessError::Rights), TermCode::RdmapAccessRightsViolation),
        (
            |_| 0x0099_0001,
            RW,
            16,
            ProtocolError::ReadSourceAccess(AccessError::InvalidStag),
            TermCode::RdmapInvalidStag,
        ),
        (
            |r| r.rw,
            RW + 8000,
            500,
            ProtocolError::ReadSourceAccess(AccessError::Bounds),
            TermCode::RdmapBaseOrBoundsViolation,
        ),
        (
            |r| r.other_pd,
            OTHER,
            16,
            ProtocolError::ReadSourceAccess(AccessError::WrongPd),
            TermCode::RdmapStagNotAssociated,
        ),
        (|r| r.rw, u64::MAX - 3, 16, ProtocolError::ReadSourceWrap, TermCode::RdmapToWrap),
    ];
    for (stag, to, size, error, code) in cases {
        let mut h = setup(16, u16::MAX);
        let request = read_request(1, size, stag(&h.regions), to);
        h.send(&request);
        h.expect(error, code, &[]);
        // Remote protection errors carry M, D and R with the Read Request header.
        let (_, length, ddp_header, rdmap_header) = h.terminate();
        assert_eq!(length, Some(request.len() as u16));
        assert_eq!(ddp_header.as_deref(), Some(&request[..18]));
        assert_eq!(rdmap_header.as_deref(), Some(&request[18..46]));
    }

    // IRD 2: the third outstanding Read Request is refused.
    let mut h = setup(2, u16::MAX);
    let rw = h.regions.rw;
    for msn in 1..=3 {
        h.send(&read_request(msn, 4096, rw, RW));
    }
    h.expect(ProtocolError::ReadBeyondIrd { ird: 2 }, TermCode::RdmapCatastrophicStream, &[]);

    // A Read Request of the wrong length.
    let mut h = setup(16, u16::MAX);
    let short = untagged(Opcode::RdmaReadRequest, 1, 0, 0, &[0; 20], true);
    h.send(&short);
    h.expect(ProtocolError::ReadRequestLength(20), TermCode::RdmapCatastrophicStream, &[]);
}

#[test]
fn untagged_sequence_errors() {
    // MSN gap: the first Send must carry MSN 1.
    let mut h = setup(16, u16::MAX);
    h.send(&untagged(Opcode::Send, 2, 0, 0, b"gap", true));
    h.expect(ProtocolError::MsnGap { queue: 0, expected: 1, got: 2 }, TermCode::DdpUntaggedInvalidMsnRange, &[]);
    let (_, length, ddp_header, _) = h.terminate();
    assert_eq!(length, Some(21));
    assert_eq!(ddp_header.map(|h| h.len()), Some(18), "untagged DDP header copied");

    // MO mismatch: the first segment must start at 0 …
    let mut h = setup(16, u16::MAX);
    h.send(&untagged(Opcode::Send, 1, 5, 0, b"mo", true));
    h.expect(ProtocolError::MoMismatch { expected: 0, got: 5 }, TermCode::DdpUntaggedInvalidMo, &[]);
    // … and the next continue where the last ended.
    let mut h = setup(16, u16::MAX);
    h.send(&untagged(Opcode::Send, 1, 0, 0, b"abc", false));
    h.send(&untagged(Opcode::Send, 1, 4, 0, b"def", true));
    h.expect(ProtocolError::MoMismatch { expected: 3, got: 4 }, TermCode::DdpUntaggedInvalidMo, &[(RECV, RECV + 3)]);

    // No receive WQE.
    let mut h = setup(16, u16::MAX);
    h.send(&untagged(Opcode::Send, 1, 0, 0, b"one", true));
    h.send(&untagged(Opcode::Send, 2, 0, 0, b"two", true));
    h.expect(ProtocolError::NoRecvWqe, TermCode::DdpUntaggedInvalidMsnNoBuffer, &[(RECV, RECV + 3)]);
    assert_eq!(h.sim.b.completions.len(), 1, "the first Send completed");

    // Oversize Send: 200 octets into a 100-octet receive.
    let mut h = setup(16, u16::MAX);
    h.send(&untagged(Opcode::Send, 1, 0, 0, &[9; 200], true));
    h.expect(ProtocolError::MessageTooLong, TermCode::DdpUntaggedMessageTooLong, &[]);
    let c = h.sim.b.completions[0];
    assert_eq!((c.wr_id, c.status), (1, WcStatus::LocLenErr));

    // Invalid queue number.
    let mut h = setup(16, u16::MAX);
    let mut ulpdu = untagged(Opcode::Send, 1, 0, 0, b"qn", true);
    ulpdu[9] = 3;
    h.send(&ulpdu);
    h.run();
    assert_eq!(h.terminate().0, TermCode::DdpUntaggedInvalidQn);
}

#[test]
fn unexpected_read_response_and_bad_invalidate() {
    let mut h = setup(16, u16::MAX);
    h.send(&tagged(Opcode::RdmaReadResponse, 0x77, 0x1000, b"unasked", true));
    h.expect(ProtocolError::UnexpectedReadResponse, TermCode::RdmapUnexpectedOpcode, &[]);

    let mut h = setup(16, u16::MAX);
    let foreign = h.regions.other_pd;
    h.send(&untagged(Opcode::SendInvalidate, 1, 0, foreign, b"inv", true));
    h.expect(
        ProtocolError::CannotInvalidate(AccessError::WrongPd),
        TermCode::RdmapProtectionStagCannotBeInvalidated,
        &[(RECV, RECV + 3)],
    );
    assert!(h.sim.b.regions.get(foreign).unwrap().valid, "not invalidated");
    assert_eq!(h.sim.b.completions[0].status, WcStatus::RemInvReqErr);
}

#[test]
fn truncated_and_oversized_fpdus() {
    // A ULPDU shorter than its DDP header.
    let mut h = setup(16, u16::MAX);
    h.send(&[0x41, 0x43, 0, 0, 0]);
    h.expect(ProtocolError::Header(rdmap::Error::Truncated), TermCode::RdmapCatastrophicStream, &[]);

    // An FPDU longer than the engine accepts: framing is lost.
    let mut h = setup(16, 2048);
    h.send(&tagged(Opcode::RdmaWrite, h.regions.rw, RW, &[3; 3000], true));
    h.run();
    assert_eq!(h.terminate().0, TermCode::LlpMarkerUlpduLengthMismatch);
    assert!(h.sim.b.memory.changed_ranges(&h.before).is_empty());

    // Half an FPDU, then the peer closes: nothing placed, a clean close.
    let mut h = setup(16, u16::MAX);
    let ulpdu = tagged(Opcode::RdmaWrite, h.regions.rw, RW, &[4; 100], true);
    let mut fpdu = vec![0u8; 200];
    let len = vt3_iwarp::stream::emit_fpdu(&ulpdu, true, &mut fpdu).unwrap();
    h.sim.a.send(&fpdu[..len / 2]);
    h.run();
    let sock = h.sim.a.sock.unwrap();
    vt3_iwarp::toe::Transport::close(&mut h.sim.a.toe, sock);
    h.run();
    assert!(h.sim.b.memory.changed_ranges(&h.before).is_empty());
    let events = h.sim.b.qp_events(QPN);
    assert!(events.contains(&EventKind::PeerClose), "{events:?}");
}

#[test]
fn random_garbage_after_setup_never_escapes_the_regions() {
    let mut rng = Rng::new(99);
    for round in 0..40 {
        let mut h = setup(4, 4096);
        let rw = h.regions.rw;
        let mut stream = Vec::new();
        for _ in 0..1 + rng.below(6) {
            let mut ulpdu = match rng.below(4) {
                0 => tagged(
                    Opcode::RdmaWrite,
                    rw,
                    RW + rng.below(9000),
                    &vec![0xcc; rng.below(300) as usize],
                    rng.below(2) == 0,
                ),
                1 => untagged(
                    Opcode::Send,
                    1 + rng.below(2) as u32,
                    rng.below(3) as u32 * 50,
                    0,
                    &vec![0xdd; rng.below(200) as usize],
                    true,
                ),
                2 => read_request(1 + rng.below(2) as u32, rng.below(9000) as u32, rw, RW + rng.below(9000)),
                _ => {
                    let mut junk = vec![0u8; rng.below(60) as usize];
                    rng.fill(&mut junk);
                    junk
                }
            };
            if rng.below(3) == 0 && !ulpdu.is_empty() {
                let at = rng.below(ulpdu.len() as u64) as usize;
                ulpdu[at] ^= 1 << rng.below(8);
            }
            let mut fpdu = vec![0u8; ulpdu.len() + 12];
            let len = vt3_iwarp::stream::emit_fpdu(&ulpdu, rng.below(8) != 0, &mut fpdu).unwrap();
            stream.extend_from_slice(&fpdu[..len]);
        }
        h.sim.a.send(&stream);
        h.run();
        for (start, end) in h.sim.b.memory.changed_ranges(&h.before) {
            let inside = (RW <= start && end <= RW + 8192) || (RECV <= start && end <= RECV + 100);
            assert!(inside, "round {round}: write at {start:#x}..{end:#x}");
        }
    }
}
