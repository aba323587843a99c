//! Golden vectors: frames written out byte by byte from the RFC layouts,
//! compared with what the crate emits and parses.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use vt3_iwarp::stream::{emit_fpdu, FpduDeframer};
use vt3_iwarp::wire::mpa::{self, EnhancedData, Frame, FrameKind, RtrSet};
use vt3_iwarp::wire::rdmap::{self, Opcode, Placement, ReadRequestPacket, ReadRequestRepr};
use vt3_iwarp::wire::{ddp, terminate};

const REQ_KEY: [u8; 16] =
    [0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65];
const REP_KEY: [u8; 16] =
    [0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65];

fn concat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// Emits `repr`, compares with `golden`, parses `golden` back to `repr`.
fn check_frame(repr: &mpa::Repr<'_>, golden: &[u8]) {
    let mut emitted = vec![0u8; repr.buffer_len()];
    repr.emit(&mut Frame::new_unchecked(&mut emitted)).unwrap();
    assert_eq!(emitted, golden);
    let frame = Frame::new_checked(golden).unwrap();
    assert_eq!(&mpa::Repr::parse(&frame).unwrap(), repr);
}

#[test]
fn mpa_request_revision_1_with_private_data() {
    let golden = concat(&[&REQ_KEY, &[0x40, 0x01, 0x00, 0x05], b"hello"]); // C, rev 1, PD_Length 5
    let repr = mpa::Repr {
        kind: FrameKind::Request,
        markers: false,
        crc: true,
        reject: false,
        revision: 1,
        enhanced: None,
        private_data: b"hello",
    };
    check_frame(&repr, &golden);
}

#[test]
fn mpa_reply_revision_1_reject() {
    let golden = concat(&[&REP_KEY, &[0x60, 0x01, 0x00, 0x02], b"no"]); // C, R
    let repr = mpa::Repr {
        kind: FrameKind::Reply,
        markers: false,
        crc: true,
        reject: true,
        revision: 1,
        enhanced: None,
        private_data: b"no",
    };
    check_frame(&repr, &golden);
}

#[test]
fn mpa_request_revision_2_peer_to_peer() {
    // C and the enhanced flag; PD_Length 8 = 4 (IRD/ORD) + 4 ULP octets.
    // IRD word: P2P | 16; ORD word: WRITE RTR | READ RTR | 8.
    let golden = concat(&[&REQ_KEY, &[0x50, 0x02, 0x00, 0x08], &[0x80, 0x10, 0xc0, 0x08], b"abcd"]);
    let repr = mpa::Repr {
        kind: FrameKind::Request,
        markers: false,
        crc: true,
        reject: false,
        revision: 2,
        enhanced: Some(EnhancedData {
            ird: 16,
            ord: 8,
            peer_to_peer: true,
            rtr: RtrSet { send: false, write: true, read: true },
        }),
        private_data: b"abcd",
    };
    check_frame(&repr, &golden);
}

#[test]
fn mpa_reply_revision_2_send_rtr_and_markers_bit() {
    // M set (sender wants markers), no CRC; IRD word: P2P | SEND RTR | 0x3fff; ORD 1.
    let golden = concat(&[&REP_KEY, &[0x90, 0x02, 0x00, 0x04], &[0xff, 0xff, 0x00, 0x01]]);
    let repr = mpa::Repr {
        kind: FrameKind::Reply,
        markers: true,
        crc: false,
        reject: false,
        revision: 2,
        enhanced: Some(EnhancedData { ird: 0x3fff, ord: 1, peer_to_peer: true, rtr: RtrSet::only(mpa::RtrKind::Send) }),
        private_data: &[],
    };
    check_frame(&repr, &golden);
}

fn check_segment(repr: &rdmap::Repr, golden: &[u8]) {
    let mut emitted = vec![0u8; repr.buffer_len()];
    repr.emit(&mut ddp::Packet::new_unchecked(&mut emitted[..])).unwrap();
    assert_eq!(emitted, &golden[..repr.buffer_len()]);
    let packet = ddp::Packet::new_checked(golden).unwrap();
    assert_eq!(&rdmap::Repr::parse(&packet).unwrap(), repr);
}

#[test]
fn rdma_write_tagged_header() {
    #[rustfmt::skip]
    let golden = [
        0x81,                   // T=1, L=0, DV=1
        0x40,                   // RV=1, opcode 0 (RDMA Write)
        0x12, 0x34, 0x56, 0x78, // STag
        0x00, 0x00, 0x7f, 0xff, 0xf0, 0x00, 0x10, 0x00, // TO
        0xaa, 0xbb,             // payload
    ];
    let repr = rdmap::Repr {
        opcode: Opcode::RdmaWrite,
        last: false,
        placement: Placement::Tagged { stag: 0x1234_5678, offset: 0x7fff_f000_1000 },
    };
    check_segment(&repr, &golden);
    assert_eq!(ddp::Packet::new_checked(&golden[..]).unwrap().payload(), &[0xaa, 0xbb]);
}

#[test]
fn read_response_last_segment() {
    let golden = [0xc1, 0x42, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0x40];
    let repr = rdmap::Repr {
        opcode: Opcode::RdmaReadResponse,
        last: true,
        placement: Placement::Tagged { stag: 9, offset: 0x40 },
    };
    check_segment(&repr, &golden);
}

#[test]
fn send_untagged_header() {
    #[rustfmt::skip]
    let golden = [
        0x01, 0x43,             // T=0 L=0 DV=1; Send
        0x00, 0x00, 0x00, 0x00, // RsvdULP (no invalidate STag)
        0x00, 0x00, 0x00, 0x00, // QN 0
        0x00, 0x00, 0x00, 0x2a, // MSN 42
        0x00, 0x00, 0x05, 0xa0, // MO 1440
    ];
    let repr = rdmap::Repr {
        opcode: Opcode::Send,
        last: false,
        placement: Placement::Untagged { msn: 42, offset: 1440, invalidate_stag: 0 },
    };
    check_segment(&repr, &golden);
}

#[test]
fn rdma_read_request_segment() {
    #[rustfmt::skip]
    let golden = [
        0x41, 0x41,             // T=0 L=1 DV=1; RDMA Read Request
        0x00, 0x00, 0x00, 0x00, // RsvdULP
        0x00, 0x00, 0x00, 0x01, // QN 1
        0x00, 0x00, 0x00, 0x01, // MSN 1
        0x00, 0x00, 0x00, 0x00, // MO 0
        0x00, 0x00, 0x11, 0x01, // Data Sink STag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, // Data Sink TO
        0x00, 0x01, 0x00, 0x00, // RDMA Read Message Size 64 KiB
        0x00, 0x00, 0x22, 0x02, // Data Source STag
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // Data Source TO
    ];
    let header = rdmap::Repr {
        opcode: Opcode::RdmaReadRequest,
        last: true,
        placement: Placement::Untagged { msn: 1, offset: 0, invalidate_stag: 0 },
    };
    check_segment(&header, &golden);
    let request = ReadRequestRepr {
        sink_stag: 0x1101,
        sink_offset: 0x2000,
        size: 0x1_0000,
        source_stag: 0x2202,
        source_offset: 0x1_0000_0000,
    };
    let packet = ddp::Packet::new_checked(&golden[..]).unwrap();
    let parsed = ReadRequestRepr::parse(&ReadRequestPacket::new_checked(packet.payload()).unwrap()).unwrap();
    assert_eq!(parsed, request);
    let mut emitted = [0u8; rdmap::READ_REQUEST_LEN];
    request.emit(&mut ReadRequestPacket::new_unchecked(&mut emitted[..])).unwrap();
    assert_eq!(emitted, golden[18..]);
}

#[test]
fn rdma_write_fpdu_with_crc() {
    // CRC computed independently (bitwise CRC32c, little-endian wire order).
    #[rustfmt::skip]
    let golden = [
        0x00, 0x11,                                     // ULPDU_Length 17
        0xc1, 0x40, 0x00, 0x00, 0x01, 0x00,             // Write, last, STag 0x100
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // TO 0x1000
        0x61, 0x62, 0x63,                               // "abc"
        0x00,                                           // pad
        0x69, 0xa6, 0x89, 0x97,                         // CRC
    ];
    let mut ulpdu = [0u8; 17];
    let header = rdmap::Repr {
        opcode: Opcode::RdmaWrite,
        last: true,
        placement: Placement::Tagged { stag: 0x100, offset: 0x1000 },
    };
    let mut packet = ddp::Packet::new_unchecked(&mut ulpdu[..]);
    header.emit(&mut packet).unwrap();
    packet.payload_mut().copy_from_slice(b"abc");
    let mut wire = [0u8; 24];
    assert_eq!(emit_fpdu(&ulpdu, true, &mut wire).unwrap(), 24);
    assert_eq!(wire, golden);
    let mut deframer = FpduDeframer::new(1000, true);
    let mut input = &golden[..];
    assert_eq!(deframer.next_ulpdu(&mut input).unwrap(), Some(&ulpdu[..]));
}

#[test]
fn terminate_llp_crc_error_fpdu() {
    #[rustfmt::skip]
    let golden = [
        0x00, 0x16,                         // ULPDU_Length 22
        0x41, 0x47, 0, 0, 0, 0,             // untagged, last; Terminate
        0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0, // QN 2, MSN 1, MO 0
        0x20, 0x02, 0x00, 0x00,             // layer LLP, etype MPA, ecode CRC; no headers
        0x7f, 0xe4, 0x25, 0x85,             // CRC (no pad needed)
    ];
    let mut ulpdu = [0u8; 22];
    let header = rdmap::Repr {
        opcode: Opcode::Terminate,
        last: true,
        placement: Placement::Untagged { msn: 1, offset: 0, invalidate_stag: 0 },
    };
    let mut packet = ddp::Packet::new_unchecked(&mut ulpdu[..]);
    header.emit(&mut packet).unwrap();
    let term = terminate::Repr::new(terminate::TermCode::LlpCrcError);
    term.emit(&mut terminate::Packet::new_unchecked(packet.payload_mut())).unwrap();
    let mut wire = [0u8; 28];
    emit_fpdu(&ulpdu, true, &mut wire).unwrap();
    assert_eq!(wire, golden);

    let packet = ddp::Packet::new_checked(&golden[2..24]).unwrap();
    assert_eq!(rdmap::Repr::parse(&packet).unwrap(), header);
    let parsed = terminate::Repr::parse(&terminate::Packet::new_checked(packet.payload()).unwrap()).unwrap();
    assert_eq!(parsed, term);
    assert_eq!(parsed.etype_class(), terminate::ErrorClass::Catastrophic);
}

#[test]
fn terminate_with_read_request_headers() {
    // A remote protection error on a Read Request, reported as siw does:
    // M, D and R set, segment length, DDP header and the 28-octet RDMAP header.
    let ddp_header = [0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, 0, 0, 0, 0];
    let rdmap_header = [7u8; 28];
    let golden = concat(&[&[0x01, 0x02, 0xe0, 0x00], &[0x00, 0x00], &ddp_header, &rdmap_header]);
    let repr = terminate::Repr {
        code: terminate::TermCode::RdmapAccessRightsViolation,
        ddp_segment_length: Some(0),
        ddp_header: Some(&ddp_header),
        rdmap_header: Some(&rdmap_header),
    };
    let mut emitted = vec![0u8; repr.buffer_len()];
    repr.emit(&mut terminate::Packet::new_unchecked(&mut emitted[..])).unwrap();
    assert_eq!(emitted, golden);
    let parsed = terminate::Repr::parse(&terminate::Packet::new_checked(&golden[..]).unwrap()).unwrap();
    assert_eq!(parsed, repr);
    assert_eq!(parsed.etype_class(), terminate::ErrorClass::Protection);
}
