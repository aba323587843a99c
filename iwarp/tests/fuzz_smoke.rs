//! Runs each fuzz entry point on a few thousand pseudo-random inputs, so
//! the fuzz logic (and the crate's no-panic promise) is exercised by every
//! `cargo test`, without nightly or libFuzzer. Inputs are random bytes and
//! valid units with random damage, which reach deeper than noise alone.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

mod common;
#[path = "../fuzz/harness.rs"]
mod harness;

use common::Rng;
use vt3_iwarp::negotiation::{Config, Initiator};
use vt3_iwarp::stream::emit_fpdu;
use vt3_iwarp::wire::mpa::{self, EnhancedData, Frame, FrameKind, RtrSet};
use vt3_iwarp::wire::rdmap::{ReadRequestPacket, ReadRequestRepr};
use vt3_iwarp::wire::{ddp, rdmap, terminate};

const INPUTS: usize = 3000;

/// Flips, overwrites, truncates or extends `data` at random.
fn damage(rng: &mut Rng, mut data: Vec<u8>) -> Vec<u8> {
    for _ in 0..rng.below(4) {
        match rng.below(4) {
            0 if !data.is_empty() => {
                let at = rng.below(data.len());
                data[at] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let at = rng.below(data.len());
                data[at] = rng.u8();
            }
            2 => data.truncate(rng.below(data.len() + 1)),
            _ => data.extend(rng.some_bytes(8)),
        }
    }
    data
}

#[test]
fn mpa_deframer() {
    let mut rng = Rng::new(20);
    for round in 0..INPUTS {
        let config = rng.u8();
        let crc = config & 1 == 1;
        let mut input = vec![config];
        input.extend(rng.bytes(8));
        if round % 3 == 0 {
            input.extend(rng.some_bytes(300));
        } else {
            let max = usize::from(config >> 1) * 16;
            let mut wire = Vec::new();
            for _ in 0..rng.below(6) {
                let ulpdu = rng.some_bytes(max + 1);
                let start = wire.len();
                wire.resize(start + mpa::fpdu_len(u16::try_from(ulpdu.len()).unwrap()), 0);
                emit_fpdu(&ulpdu, crc, &mut wire[start..]).unwrap();
            }
            input.extend(if round % 3 == 1 { wire } else { damage(&mut rng, wire) });
        }
        harness::mpa_deframer(&input);
    }
}

fn random_segment(rng: &mut Rng) -> Vec<u8> {
    let (opcode, _) = rdmap::OPCODES[rng.below(rdmap::OPCODES.len())];
    let placement = match opcode.transport() {
        rdmap::Transport::Tagged => rdmap::Placement::Tagged { stag: rng.u32(), offset: rng.next_u64() },
        rdmap::Transport::Untagged { .. } => {
            rdmap::Placement::Untagged { msn: rng.u32(), offset: rng.u32(), invalidate_stag: rng.u32() }
        }
    };
    let header = rdmap::Repr { opcode, last: rng.bool(), placement };
    let mut segment = vec![0u8; header.buffer_len()];
    header.emit(&mut ddp::Packet::new_unchecked(&mut segment[..])).unwrap();
    match opcode {
        rdmap::Opcode::Terminate => {
            let codes: Vec<_> = terminate::TermCode::registered().collect();
            let copied = [0x41u8; ddp::UNTAGGED_HEADER_LEN];
            let tail = rng.bytes(28);
            let term = terminate::Repr {
                code: codes[rng.below(codes.len())],
                ddp_segment_length: None,
                ddp_header: rng.bool().then_some(&copied[..]),
                rdmap_header: rng.bool().then_some(&tail[..]),
            };
            let start = segment.len();
            segment.resize(start + term.buffer_len(), 0);
            term.emit(&mut terminate::Packet::new_unchecked(&mut segment[start..])).unwrap();
        }
        _ => segment.extend(rng.some_bytes(40)),
    }
    segment
}

#[test]
fn ddp_rdmap_parse() {
    let mut rng = Rng::new(21);
    for round in 0..INPUTS {
        let input = match round % 3 {
            0 => rng.some_bytes(64),
            1 => random_segment(&mut rng),
            _ => {
                let segment = random_segment(&mut rng);
                damage(&mut rng, segment)
            }
        };
        harness::ddp_rdmap_parse(&input);
    }
}

fn random_frame(rng: &mut Rng) -> Vec<u8> {
    let revision = 1 + u8::from(rng.bool());
    let private_data = rng.some_bytes(40);
    let repr = mpa::Repr {
        kind: if rng.bool() { FrameKind::Reply } else { FrameKind::Request },
        markers: rng.below(8) == 0,
        crc: rng.bool(),
        reject: rng.below(8) == 0,
        revision,
        enhanced: (revision == 2).then(|| EnhancedData {
            ird: rng.u16() & 0x3f,
            ord: rng.u16() & 0x3f,
            peer_to_peer: rng.bool(),
            rtr: RtrSet { send: rng.bool(), write: rng.bool(), read: rng.bool() },
        }),
        private_data: &private_data,
    };
    let mut frame = vec![0u8; repr.buffer_len()];
    repr.emit(&mut Frame::new_unchecked(&mut frame)).unwrap();
    frame
}

#[test]
fn mpa_negotiation() {
    let mut rng = Rng::new(22);
    for round in 0..INPUTS {
        let mut input = vec![rng.u8()];
        input.extend(rng.bytes(8));
        match round % 4 {
            0 => input.extend(rng.some_bytes(80)),
            1 => input.extend(random_frame(&mut rng)),
            2 => {
                let frame = random_frame(&mut rng);
                input.extend(damage(&mut rng, frame));
            }
            _ => {
                // Our own request, as a responder would receive it.
                let mut initiator = Initiator::new(Config::default()).unwrap();
                let mut out = [0u8; 64];
                let len = initiator.write_request(&rng.some_bytes(20), &mut out).unwrap();
                input.extend(damage(&mut rng, out[..len].to_vec()));
            }
        }
        harness::mpa_negotiation(&input);
    }
}

/// A DDP segment aimed at the `engine_receive` harness's regions (STags
/// 0x001 read/write at 0x1000, 0x101 read-only at 0x4000, 0x201
/// write-only at 0x6000), with plausible MSNs and offsets.
fn plausible_segment(rng: &mut Rng, msn: &mut [u32; 3]) -> Vec<u8> {
    let stags = [0x001, 0x101, 0x201, 0x301, rng.u32()];
    let bases = [0x1000u64, 0x4000, 0x6000, 0x8000, rng.next_u64()];
    let pick = rng.below(stags.len());
    let offset = bases[pick] + rng.below(9000) as u64;
    let payload = rng.some_bytes(600);
    let (opcode, placement, payload) = match rng.below(5) {
        0 => (rdmap::Opcode::RdmaWrite, rdmap::Placement::Tagged { stag: stags[pick], offset }, payload),
        1 | 2 => {
            let opcodes = [rdmap::Opcode::Send, rdmap::Opcode::SendInvalidate, rdmap::Opcode::SendSolicited];
            msn[0] += u32::from(rng.below(4) != 0);
            (
                opcodes[rng.below(3)],
                rdmap::Placement::Untagged { msn: msn[0], offset: 0, invalidate_stag: stags[rng.below(stags.len())] },
                payload,
            )
        }
        3 => {
            msn[1] += u32::from(rng.below(4) != 0);
            let mut request = [0u8; rdmap::READ_REQUEST_LEN];
            ReadRequestRepr {
                sink_stag: rng.u32(),
                sink_offset: rng.next_u64(),
                size: rng.below(5000) as u32,
                source_stag: stags[pick],
                source_offset: offset,
            }
            .emit(&mut ReadRequestPacket::new_unchecked(&mut request[..]))
            .unwrap();
            (
                rdmap::Opcode::RdmaReadRequest,
                rdmap::Placement::Untagged { msn: msn[1], offset: 0, invalidate_stag: 0 },
                request.to_vec(),
            )
        }
        _ => return random_segment(rng),
    };
    let header = rdmap::Repr { opcode, last: rng.below(4) != 0, placement };
    let mut segment = vec![0u8; header.buffer_len()];
    header.emit(&mut ddp::Packet::new_unchecked(&mut segment[..])).unwrap();
    segment.extend(payload);
    segment
}

#[test]
fn engine_receive() {
    let mut rng = Rng::new(23);
    for round in 0..ENGINE_INPUTS {
        let config = rng.u8();
        let crc = config & 1 == 1;
        let mut input = vec![config];
        if round % 5 == 0 {
            input.extend(rng.some_bytes(400));
        } else {
            let mut msn = [0u32; 3];
            let mut wire = Vec::new();
            for _ in 0..1 + rng.below(8) {
                let ulpdu = plausible_segment(&mut rng, &mut msn);
                let start = wire.len();
                wire.resize(start + mpa::fpdu_len(u16::try_from(ulpdu.len()).unwrap()), 0);
                emit_fpdu(&ulpdu, crc, &mut wire[start..]).unwrap();
            }
            input.extend(if round % 5 == 1 { damage(&mut rng, wire) } else { wire });
        }
        harness::engine_receive(&input);
    }
}

/// Each engine input sets up a connection: fewer of them.
const ENGINE_INPUTS: usize = 300;
