//! Fuzz entry points, shared by the cargo-fuzz targets (`fuzz_targets/`)
//! and by `tests/fuzz_smoke.rs`, which runs them on pseudo-random inputs in
//! every `cargo test`. Each one must never panic except on its own
//! assertions: a failed assertion is a bug in the crate.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation
)]

use vt3_iwarp::negotiation::{Config, Initiator, InitiatorEvent, Responder, ResponderEvent};
use vt3_iwarp::stream::{emit_fpdu, FpduDeframer};
use vt3_iwarp::wire::mpa::{self, RtrSet};
use vt3_iwarp::wire::rdmap::{self, Opcode, ReadRequestPacket, ReadRequestRepr};
use vt3_iwarp::wire::{ddp, terminate};

/// Cuts `data` into chunks whose sizes cycle through `sizes` (0 counts as 1).
fn chunks<'a>(data: &'a [u8], sizes: &'a [u8]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut rest = data;
    let mut index = 0;
    while !rest.is_empty() {
        let size = sizes.get(index % sizes.len().max(1)).map_or(rest.len(), |&s| usize::from(s).max(1));
        let (head, tail) = rest.split_at(size.min(rest.len()));
        out.push(head);
        rest = tail;
        index += 1;
    }
    out
}

/// All ULPDUs the deframer yields for `pieces`, and the error that stopped it.
fn deframe(deframer: &mut FpduDeframer, pieces: &[&[u8]]) -> (Vec<Vec<u8>>, Option<mpa::Error>) {
    let mut ulpdus = Vec::new();
    for piece in pieces {
        let mut input = *piece;
        loop {
            match deframer.next_ulpdu(&mut input) {
                Ok(Some(ulpdu)) => ulpdus.push(ulpdu.to_vec()),
                Ok(None) => {
                    assert!(input.is_empty());
                    break;
                }
                Err(error) => return (ulpdus, Some(error)),
            }
        }
    }
    (ulpdus, None)
}

/// Input: one config octet (bit 0 CRC, the rest the length limit), eight
/// chunk sizes, then the TCP byte stream.
pub fn mpa_deframer(data: &[u8]) {
    let Some((&config, rest)) = data.split_first() else {
        return;
    };
    let crc = config & 1 == 1;
    let max_ulpdu = u16::from(config >> 1) * 16;
    let (sizes, stream) = rest.split_at(rest.len().min(8));

    let mut whole = FpduDeframer::new(max_ulpdu, crc);
    let (expected, error) = deframe(&mut whole, &[stream]);
    let mut split = FpduDeframer::new(max_ulpdu, crc);
    let pieces = chunks(stream, sizes);
    assert_eq!(deframe(&mut split, &pieces), (expected.clone(), error), "segmentation changed the result");

    // Re-framing what came out gives back the same ULPDUs.
    let mut wire = Vec::new();
    for ulpdu in &expected {
        assert!(ulpdu.len() <= usize::from(max_ulpdu));
        let start = wire.len();
        wire.resize(start + mpa::fpdu_len(u16::try_from(ulpdu.len()).unwrap()), 0);
        emit_fpdu(ulpdu, crc, &mut wire[start..]).unwrap();
    }
    let mut again = FpduDeframer::new(max_ulpdu, crc);
    assert_eq!(deframe(&mut again, &[&wire]), (expected, None));
}

/// Input: one DDP segment (an MPA ULPDU).
pub fn ddp_rdmap_parse(data: &[u8]) {
    let packet = ddp::Packet::new_unchecked(data);
    let _ = ddp::Repr::parse(&packet);
    let header = match rdmap::Repr::parse(&packet) {
        Ok(header) => header,
        Err(error) => {
            let _ = error.term_code();
            return;
        }
    };
    let mut buffer = [0u8; ddp::UNTAGGED_HEADER_LEN];
    let mut emitted = ddp::Packet::new_unchecked(&mut buffer[..header.buffer_len()]);
    header.emit(&mut emitted).expect("a parsed header re-emits");
    assert_eq!(rdmap::Repr::parse(&ddp::Packet::new_unchecked(&buffer[..])).unwrap(), header);

    let payload = packet.payload();
    match header.opcode {
        Opcode::RdmaReadRequest => {
            if let Ok(request) = ReadRequestRepr::parse(&ReadRequestPacket::new_unchecked(payload)) {
                let mut buffer = [0u8; rdmap::READ_REQUEST_LEN];
                request.emit(&mut ReadRequestPacket::new_unchecked(&mut buffer[..])).unwrap();
                assert_eq!(&buffer[..], &payload[..rdmap::READ_REQUEST_LEN]);
            }
        }
        Opcode::Terminate => {
            if let Ok(term) = terminate::Repr::parse(&terminate::Packet::new_unchecked(payload)) {
                let _ = (term.etype_class(), term.code.description(), term.code.to_string());
                let mut buffer = vec![0u8; term.buffer_len()];
                term.emit(&mut terminate::Packet::new_unchecked(&mut buffer[..])).expect("a parsed Terminate re-emits");
                assert_eq!(terminate::Repr::parse(&terminate::Packet::new_unchecked(&buffer[..])).unwrap(), term);
            }
        }
        _ => {}
    }
}

/// Input: one config octet, eight chunk sizes, then bytes from the peer,
/// played both as a request to our responder and as a reply to our initiator.
pub fn mpa_negotiation(data: &[u8]) {
    let Some((&selector, rest)) = data.split_first() else {
        return;
    };
    let config = Config {
        revision: 1 + (selector & 1),
        crc: selector & 2 != 0,
        ird: u16::from(selector >> 4),
        ord: u16::from(selector & 0x0c),
        peer_to_peer: selector & 0x10 != 0,
        rtr: RtrSet { send: selector & 0x20 != 0, write: selector & 0x40 != 0, read: selector & 0x80 != 0 },
    };
    let (sizes, peer_bytes) = rest.split_at(rest.len().min(8));
    let pieces = chunks(peer_bytes, sizes);

    let mut responder = Responder::new(config).unwrap();
    let mut consumed = 0;
    for piece in &pieces {
        let mut input = *piece;
        let result = responder.receive(&mut input);
        consumed += piece.len() - input.len();
        assert!(consumed <= mpa::MAX_FRAME_LEN);
        let mut out = [0u8; mpa::MAX_FRAME_LEN];
        match result {
            Ok(ResponderEvent::Pending) => continue,
            Ok(ResponderEvent::Request) => {
                let echo = responder.request().expect("request available").private_data.to_vec();
                // Our reply carries the enhanced block only if the request
                // did, so the peer's private data always fits back.
                let (len, negotiated) = responder.accept(&echo, &mut out).expect("echo fits");
                let reply = mpa::Repr::parse(&mpa::Frame::new_checked(&out[..len]).unwrap()).unwrap();
                assert_eq!((reply.kind, reply.reject, reply.markers), (mpa::FrameKind::Reply, false, false));
                assert!(negotiated.revision <= config.revision);
                assert_eq!(negotiated.crc, reply.crc);
            }
            Ok(ResponderEvent::Refused(_)) => {
                let len = responder.reject(&[], &mut out).unwrap();
                let reply = mpa::Repr::parse(&mpa::Frame::new_checked(&out[..len]).unwrap()).unwrap();
                assert!(reply.reject);
            }
            Err(error) => {
                let _ = error.term_code();
            }
        }
        break;
    }

    let mut initiator = Initiator::new(config).unwrap();
    initiator.write_request(b"fuzz", &mut [0u8; 64]).unwrap();
    for piece in &pieces {
        let mut input = *piece;
        match initiator.receive(&mut input) {
            Ok(InitiatorEvent::Pending) => assert!(input.is_empty()),
            Ok(InitiatorEvent::Established { negotiated, .. }) => {
                assert!(negotiated.revision <= config.revision);
                assert!(negotiated.crc || !config.crc);
                assert_eq!(negotiated.ird, config.ird);
                assert!(negotiated.ord <= config.ord);
                assert!(negotiated.rtr.is_none_or(|kind| config.peer_to_peer && config.rtr.contains(kind)));
                break;
            }
            Ok(InitiatorEvent::Rejected { .. }) => break,
            Err(error) => {
                let _ = error.term_code();
                break;
            }
        }
    }
}

/// Input: one config octet, then the byte stream a peer sends on an
/// established connection (after the MPA exchange), cut into TCP
/// segments by the stack.
///
/// Config: bit 0 CRC, bit 1 small MTU (576), bits 2-3 IRD − 1, bit 4 a
/// second receive WQE. The engine (responder) has a read/write region,
/// a read-only one, a write-only one and a posted receive buffer; guest
/// memory outside the regions that allow writes must not change, nothing
/// may panic, and once the QP is in ERROR no completion may appear.
pub fn engine_receive(data: &[u8]) {
    use vt3_iwarp::engine::{QpConfig, QpState, RecvWr, Sge, SgeList, LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE};
    use vt3_iwarp::sim::{NodeConfig, Sim, WireConfig, IPS, MACS};
    use vt3_iwarp::toe::{Duration, TcpConfig};

    let Some((&config, stream)) = data.split_first() else {
        return;
    };
    let crc = config & 1 == 1;
    let mut raw = TcpConfig::new(MACS[0], IPS[0]);
    let mut node = NodeConfig::new(1);
    if config & 2 != 0 {
        raw.mtu = 576;
        node.tcp.mtu = 576;
    }
    node.memory = 64 * 1024;
    node.engine.max_rx_ulpdu = 4096;
    let mut qp = QpConfig::new(1);
    qp.mpa.ird = u16::from((config >> 2) & 3) + 1;
    qp.mpa.crc = crc;
    let mpa = Config { crc, peer_to_peer: false, ..Config::default() };
    let mut sim = Sim::raw_pair(raw, node, WireConfig::default(), 2, qp, mpa);
    assert!(sim.a.negotiated.is_some());
    const RW: u64 = 0x1000;
    const RO: u64 = 0x4000;
    const WO: u64 = 0x6000;
    const RECV: u64 = 0x8000;
    let b = &mut sim.b;
    b.regions.register_contiguous(1, LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ, RW, RW, 8192);
    b.regions.register_contiguous(1, REMOTE_READ, RO, RO, 4096);
    b.regions.register_contiguous(1, REMOTE_WRITE, WO, WO, 4096);
    let recv = b.regions.register_contiguous(1, LOCAL_WRITE, RECV, RECV, 4096);
    let receives = if config & 16 != 0 { 2 } else { 1 };
    for i in 0..receives {
        let sge = Sge { addr: RECV + i * 2048, length: 2048, lkey: recv };
        b.engine.post_recv(2, RecvWr { wr_id: i, sges: SgeList::single(sge) }).unwrap();
    }
    let before = b.memory.clone();
    sim.a.send(stream);
    sim.run_for(Duration::from_secs(3));
    for (start, end) in sim.b.memory.changed_ranges(&before) {
        let allowed = (RW <= start && end <= RW + 8192)
            || (WO <= start && end <= WO + 4096)
            || (RECV <= start && end <= RECV + 4096);
        assert!(allowed, "write outside the regions: {start:#x}..{end:#x}");
    }
    assert!(sim.b.completions.len() <= receives as usize);
    if sim.b.state(2) == Some(QpState::Error) {
        let completions = sim.b.completions.len();
        sim.a.send(stream);
        sim.run_for(Duration::from_secs(1));
        assert_eq!(sim.b.completions.len(), completions, "completion after ERROR");
    }
    // Whatever the engine sent back frames cleanly (a TERMINATE at most).
    for ulpdu in sim.a.ulpdus() {
        let header = rdmap::Repr::parse(&ddp::Packet::new_unchecked(&ulpdu[..]));
        assert!(header.is_ok(), "the engine sent a malformed ULPDU");
    }
}
