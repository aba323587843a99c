//! parse ∘ emit is the identity for every Repr over many pseudo-random
//! values, and every truncation of an emitted unit is an error, never a panic.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use common::Rng;
use vt3_iwarp::wire::ddp;
use vt3_iwarp::wire::mpa::{self, EnhancedData, Fpdu, FpduRepr, Frame, FrameKind, RtrSet};
use vt3_iwarp::wire::rdmap::{self, Opcode, Placement, ReadRequestPacket, ReadRequestRepr, Transport, OPCODES};
use vt3_iwarp::wire::terminate::{self, TermCode};

const ROUNDS: usize = 2000;

fn random_frame<'a>(rng: &mut Rng, private_data: &'a [u8]) -> mpa::Repr<'a> {
    let kind = if rng.bool() { FrameKind::Request } else { FrameKind::Reply };
    let revision = if rng.bool() { 1 } else { 2 };
    let enhanced = (revision == 2 && rng.bool()).then(|| EnhancedData {
        ird: rng.u16() & mpa::IRD_ORD_MAX,
        ord: rng.u16() & mpa::IRD_ORD_MAX,
        peer_to_peer: rng.bool(),
        rtr: RtrSet { send: rng.bool(), write: rng.bool(), read: rng.bool() },
    });
    let room = mpa::MAX_PRIVATE_DATA_LEN - if enhanced.is_some() { mpa::ENHANCED_DATA_LEN } else { 0 };
    let len = if rng.bool() { rng.below(room + 1) } else { [0, room][rng.below(2)] };
    mpa::Repr {
        kind,
        markers: rng.bool(),
        crc: rng.bool(),
        reject: kind == FrameKind::Reply && rng.bool(),
        revision,
        enhanced,
        private_data: &private_data[..len],
    }
}

#[test]
fn mpa_frames() {
    let mut rng = Rng::new(1);
    let private_data = rng.bytes(mpa::MAX_PRIVATE_DATA_LEN);
    for _ in 0..ROUNDS {
        let repr = random_frame(&mut rng, &private_data);
        let mut buffer = vec![0xa5u8; repr.buffer_len()];
        repr.emit(&mut Frame::new_unchecked(&mut buffer)).unwrap();
        assert_eq!(mpa::Repr::parse(&Frame::new_checked(&buffer[..]).unwrap()).unwrap(), repr);
        for len in 0..buffer.len() {
            assert_eq!(mpa::Repr::parse(&Frame::new_unchecked(&buffer[..len])), Err(mpa::Error::Truncated));
            assert_eq!(repr.emit(&mut Frame::new_unchecked(&mut vec![0; len])), Err(mpa::Error::Truncated));
        }
    }
}

#[test]
fn fpdus() {
    let mut rng = Rng::new(2);
    let data = rng.bytes(3000);
    for _ in 0..ROUNDS {
        let crc = rng.bool();
        let repr = FpduRepr { ulpdu: &data[..rng.below(data.len())] };
        let mut buffer = vec![0xa5u8; repr.buffer_len()];
        repr.emit(&mut Fpdu::new_unchecked(&mut buffer), crc).unwrap();
        assert_eq!(buffer.len() % 4, 0);
        assert_eq!(FpduRepr::parse(&Fpdu::new_checked(&buffer[..]).unwrap(), crc).unwrap(), repr);
        for len in 0..buffer.len() {
            assert_eq!(FpduRepr::parse(&Fpdu::new_unchecked(&buffer[..len]), crc), Err(mpa::Error::Truncated));
        }
    }
}

fn random_placement(rng: &mut Rng, opcode: Opcode) -> Placement {
    match opcode.transport() {
        Transport::Tagged => Placement::Tagged { stag: rng.u32_edgy(), offset: rng.u64_edgy() },
        Transport::Untagged { .. } => Placement::Untagged {
            msn: rng.u32_edgy(),
            offset: rng.u32_edgy(),
            invalidate_stag: if opcode.carries_invalidate_stag() { rng.u32_edgy() } else { 0 },
        },
    }
}

#[test]
fn ddp_headers() {
    let mut rng = Rng::new(3);
    for _ in 0..ROUNDS {
        let buffer_model = if rng.bool() {
            ddp::BufferModel::Tagged { stag: rng.u32_edgy(), offset: rng.u64_edgy() }
        } else {
            ddp::BufferModel::Untagged {
                ulp_word: rng.u32_edgy(),
                queue: rng.u32_edgy(),
                msn: rng.u32_edgy(),
                offset: rng.u32_edgy(),
            }
        };
        let repr = ddp::Repr { last: rng.bool(), ulp_control: rng.u8(), buffer_model };
        let mut buffer = vec![0u8; repr.buffer_len() + rng.below(4)];
        repr.emit(&mut ddp::Packet::new_unchecked(&mut buffer[..])).unwrap();
        assert_eq!(ddp::Repr::parse(&ddp::Packet::new_checked(&buffer[..]).unwrap()).unwrap(), repr);
        for len in 0..repr.buffer_len() {
            assert_eq!(ddp::Repr::parse(&ddp::Packet::new_unchecked(&buffer[..len])), Err(ddp::Error::Truncated));
        }
    }
}

#[test]
fn rdmap_headers_for_every_opcode() {
    let mut rng = Rng::new(4);
    for round in 0..ROUNDS {
        let (opcode, transport) = OPCODES[round % OPCODES.len()];
        let repr = rdmap::Repr { opcode, last: rng.bool(), placement: random_placement(&mut rng, opcode) };
        let mut buffer = vec![0u8; repr.buffer_len()];
        repr.emit(&mut ddp::Packet::new_unchecked(&mut buffer[..])).unwrap();
        let packet = ddp::Packet::new_checked(&buffer[..]).unwrap();
        assert_eq!(packet.tagged(), transport == Transport::Tagged);
        if let Transport::Untagged { queue } = transport {
            assert_eq!(packet.queue_number(), queue);
        }
        assert_eq!(rdmap::Repr::parse(&packet).unwrap(), repr);
        for len in 0..buffer.len() {
            assert_eq!(rdmap::Repr::parse(&ddp::Packet::new_unchecked(&buffer[..len])), Err(rdmap::Error::Truncated));
        }
    }
}

#[test]
fn read_request_headers() {
    let mut rng = Rng::new(5);
    for _ in 0..ROUNDS {
        let repr = ReadRequestRepr {
            sink_stag: rng.u32_edgy(),
            sink_offset: rng.u64_edgy(),
            size: rng.u32_edgy(),
            source_stag: rng.u32_edgy(),
            source_offset: rng.u64_edgy(),
        };
        let mut buffer = [0u8; rdmap::READ_REQUEST_LEN];
        repr.emit(&mut ReadRequestPacket::new_unchecked(&mut buffer[..])).unwrap();
        assert_eq!(ReadRequestRepr::parse(&ReadRequestPacket::new_checked(&buffer[..]).unwrap()).unwrap(), repr);
        for len in 0..buffer.len() {
            assert_eq!(
                ReadRequestRepr::parse(&ReadRequestPacket::new_unchecked(&buffer[..len])),
                Err(rdmap::Error::Truncated)
            );
        }
    }
}

/// Every registered code (and unregistered ones), with every header
/// combination, is emitted and parsed back; truncations are errors.
#[test]
fn every_terminate_code() {
    let mut rng = Rng::new(6);
    let tagged_header = [0x81u8; ddp::TAGGED_HEADER_LEN];
    let untagged_header = [0x41u8; ddp::UNTAGGED_HEADER_LEN];
    let read_request = rng.bytes(rdmap::READ_REQUEST_LEN);
    let mut codes: Vec<TermCode> = TermCode::registered().collect();
    assert_eq!(codes.len(), 33);
    codes.extend((0..40).map(|_| TermCode::Other { layer: rng.u8() & 0xf, etype: rng.u8() & 0xf, ecode: rng.u8() }));
    for code in codes {
        let (layer, etype, ecode) = code.fields();
        assert_eq!(TermCode::from_fields(layer, etype, ecode), code);
        for variant in 0..12 {
            let ddp_header: Option<&[u8]> = match variant % 3 {
                0 => None,
                1 => Some(&tagged_header),
                _ => Some(&untagged_header),
            };
            let repr = terminate::Repr {
                code,
                ddp_segment_length: ddp_header.filter(|_| variant & 4 != 0).map(|_| rng.u16()),
                ddp_header,
                rdmap_header: (variant >= 6).then_some(&read_request[..rng.below(read_request.len() + 1)]),
            };
            let mut buffer = vec![0u8; repr.buffer_len()];
            repr.emit(&mut terminate::Packet::new_unchecked(&mut buffer[..])).unwrap();
            let packet = terminate::Packet::new_checked(&buffer[..]).unwrap();
            assert_eq!((packet.layer(), packet.etype(), packet.ecode()), (layer, etype, ecode));
            let parsed = terminate::Repr::parse(&packet).unwrap();
            assert_eq!(parsed, repr, "{code}");
            assert_eq!(parsed.etype_class(), terminate::etype_class(layer, etype));
            // Cutting into the fixed part is an error; cutting the trailing
            // RDMAP header only shortens it (its length is implicit).
            let fixed =
                terminate::CONTROL_LEN + ddp_header.map_or(0, |header| terminate::SEGMENT_LENGTH_LEN + header.len());
            for len in 0..buffer.len() {
                let result = terminate::Repr::parse(&terminate::Packet::new_unchecked(&buffer[..len]));
                if len < fixed {
                    assert_eq!(result, Err(terminate::Error::Truncated));
                } else {
                    assert_eq!(result.unwrap().rdmap_header.map(<[u8]>::len), Some(len - fixed));
                }
            }
        }
    }
}

#[test]
fn unit_lengths_follow_the_rfc_padding() {
    for len in 0..=64u16 {
        let total = mpa::fpdu_len(len);
        assert_eq!(total % 4, 0);
        assert!(total - usize::from(len) - 6 <= 3);
    }
}
