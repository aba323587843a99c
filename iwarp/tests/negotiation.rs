//! MPA connection setup between our initiator and responder, and against
//! hand-made frames (siw's, and misbehaving peers').
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use vt3_iwarp::negotiation::{
    Config, Error, Initiator, InitiatorEvent, Negotiated, Refusal, Responder, ResponderEvent,
};
use vt3_iwarp::wire::mpa::{self, EnhancedData, Frame, FrameKind, RtrKind, RtrSet};
use vt3_iwarp::wire::terminate::TermCode;

fn frame(repr: &mpa::Repr<'_>) -> Vec<u8> {
    let mut buffer = vec![0u8; repr.buffer_len()];
    repr.emit(&mut Frame::new_unchecked(&mut buffer)).unwrap();
    buffer
}

fn reply(enhanced: Option<EnhancedData>) -> mpa::Repr<'static> {
    mpa::Repr {
        kind: FrameKind::Reply,
        markers: false,
        crc: false,
        reject: false,
        revision: if enhanced.is_some() { 2 } else { 1 },
        enhanced,
        private_data: &[],
    }
}

fn request(enhanced: Option<EnhancedData>) -> mpa::Repr<'static> {
    mpa::Repr { kind: FrameKind::Request, ..reply(enhanced) }
}

/// Runs a whole exchange; returns (initiator view, responder view).
fn connect(initiator: Config, responder: Config) -> (Negotiated, Negotiated) {
    let mut active = Initiator::new(initiator).unwrap();
    let mut passive = Responder::new(responder).unwrap();
    let mut wire = [0u8; mpa::MAX_FRAME_LEN];
    let len = active.write_request(b"from initiator", &mut wire).unwrap();
    let mut input = &wire[..len];
    assert_eq!(passive.receive(&mut input).unwrap(), ResponderEvent::Request);
    assert!(input.is_empty());
    assert_eq!(passive.request().unwrap().private_data, b"from initiator");
    let (len, server) = passive.accept(b"from responder", &mut wire).unwrap();
    let mut input = &wire[..len];
    match active.receive(&mut input).unwrap() {
        InitiatorEvent::Established { negotiated, private_data } => {
            assert_eq!(private_data, b"from responder");
            (negotiated, server)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn revisions_meet_at_the_lower_one() {
    for (ours, theirs) in [(1, 1), (1, 2), (2, 1), (2, 2)] {
        let (client, server) =
            connect(Config { revision: ours, ..Config::default() }, Config { revision: theirs, ..Config::default() });
        let expected = ours.min(theirs);
        assert_eq!((client.revision, server.revision), (expected, expected));
        let rtr = (expected == 2).then_some(RtrKind::Write);
        assert_eq!((client.rtr, server.rtr), (rtr, rtr));
    }
}

#[test]
fn crc_is_on_when_either_side_wants_it() {
    for (ours, theirs) in [(false, false), (false, true), (true, false), (true, true)] {
        for revision in [1, 2] {
            let (client, server) = connect(
                Config { crc: ours, revision, ..Config::default() },
                Config { crc: theirs, revision, ..Config::default() },
            );
            assert_eq!(client.crc, ours || theirs);
            assert_eq!(server.crc, ours || theirs);
        }
    }
}

#[test]
fn ird_and_ord_are_limited_by_the_peer() {
    let (client, server) =
        connect(Config { ird: 4, ord: 8, ..Config::default() }, Config { ird: 2, ord: 16, ..Config::default() });
    assert_eq!((server.ird, server.ord), (2, 4), "responder ORD limited by the initiator's IRD");
    assert_eq!((client.ird, client.ord), (4, 2), "initiator ORD limited by the responder's IRD");
}

#[test]
fn insufficient_ird_fails_the_initiator() {
    let mut active = Initiator::new(Config { ird: 4, ..Config::default() }).unwrap();
    active.write_request(&[], &mut [0u8; 64]).unwrap();
    let bad = frame(&reply(Some(EnhancedData { ird: 8, ord: 10, ..EnhancedData::default() })));
    let error = active.receive(&mut &bad[..]).unwrap_err();
    assert_eq!(error, Error::InsufficientIrd { peer_ord: 10, our_ird: 4 });
    assert_eq!(error.term_code(), Some(TermCode::LlpInsufficientIrd));
}

#[test]
fn rtr_choice() {
    let offer = |rtr: RtrSet| Config { rtr, ..Config::default() };
    // The responder takes what both support, preferring Write, then Read.
    let (client, server) = connect(offer(RtrSet::only(RtrKind::Read)), Config::default());
    assert_eq!((client.rtr, server.rtr), (Some(RtrKind::Read), Some(RtrKind::Read)));
    let (client, _) = connect(offer(RtrSet::ALL), offer(RtrSet::ALL));
    assert_eq!(client.rtr, Some(RtrKind::Write));
    let (client, _) = connect(offer(RtrSet::only(RtrKind::Send)), offer(RtrSet::ALL));
    assert_eq!(client.rtr, Some(RtrKind::Send));
    // We do not ask for peer-to-peer without an RTR message to offer...
    let (client, server) = connect(offer(RtrSet::NONE), Config::default());
    assert_eq!((client.rtr, server.rtr), (None, None));
    // ...and take a peer's empty offer as Write, as siw does.
    let mut passive = Responder::new(Config::default()).unwrap();
    let empty_offer = frame(&request(Some(EnhancedData { ird: 1, ord: 1, peer_to_peer: true, rtr: RtrSet::NONE })));
    assert_eq!(passive.receive(&mut &empty_offer[..]).unwrap(), ResponderEvent::Request);
    assert_eq!(passive.accept(&[], &mut [0u8; 64]).unwrap().1.rtr, Some(RtrKind::Write));
    // A responder without peer-to-peer answers without RTR.
    let (client, server) = connect(Config::default(), Config { peer_to_peer: false, ..Config::default() });
    assert_eq!((client.rtr, server.rtr), (None, None));
}

#[test]
fn no_common_rtr_is_refused_with_a_reject_reply() {
    let mut active = Initiator::new(Config { rtr: RtrSet::only(RtrKind::Send), ..Config::default() }).unwrap();
    let mut passive = Responder::new(Config::default()).unwrap();
    let mut wire = [0u8; 64];
    let len = active.write_request(&[], &mut wire).unwrap();
    assert_eq!(passive.receive(&mut &wire[..len]).unwrap(), ResponderEvent::Refused(Refusal::NoMatchingRtr));
    assert!(passive.request().is_some());
    assert!(matches!(passive.accept(&[], &mut wire), Err(Error::InvalidState(_))));
    let len = passive.reject(&[], &mut wire).unwrap();
    assert_eq!(active.receive(&mut &wire[..len]).unwrap(), InitiatorEvent::Rejected { private_data: &[] });
}

#[test]
fn a_reply_choosing_an_unoffered_rtr_fails() {
    let mut active = Initiator::new(Config { rtr: RtrSet::only(RtrKind::Read), ..Config::default() }).unwrap();
    active.write_request(&[], &mut [0u8; 64]).unwrap();
    let bad =
        frame(&reply(Some(EnhancedData { ird: 1, ord: 1, peer_to_peer: true, rtr: RtrSet::only(RtrKind::Write) })));
    let error = active.receive(&mut &bad[..]).unwrap_err();
    assert_eq!(error, Error::NoMatchingRtr);
    assert_eq!(error.term_code(), Some(TermCode::LlpNoMatchingRtr));
}

#[test]
fn markers_are_refused_cleanly() {
    let mut passive = Responder::new(Config::default()).unwrap();
    let wants_markers = frame(&mpa::Repr { markers: true, crc: true, ..request(None) });
    assert_eq!(passive.receive(&mut &wants_markers[..]).unwrap(), ResponderEvent::Refused(Refusal::Markers));
    let mut out = [0u8; 64];
    let len = passive.reject(b"no markers", &mut out).unwrap();
    let answer = mpa::Repr::parse(&Frame::new_checked(&out[..len]).unwrap()).unwrap();
    assert_eq!(
        (answer.kind, answer.reject, answer.markers, answer.private_data),
        (FrameKind::Reply, true, false, &b"no markers"[..])
    );

    let mut active = Initiator::new(Config::default()).unwrap();
    active.write_request(&[], &mut [0u8; 64]).unwrap();
    let wants_markers = frame(&mpa::Repr { markers: true, ..reply(None) });
    let error = active.receive(&mut &wants_markers[..]).unwrap_err();
    assert_eq!((error, error.term_code()), (Error::MarkersRequired, None));
}

#[test]
fn ulp_reject_reaches_the_initiator() {
    let mut active = Initiator::new(Config::default()).unwrap();
    let mut passive = Responder::new(Config::default()).unwrap();
    let mut wire = [0u8; 600];
    let len = active.write_request(b"may I?", &mut wire).unwrap();
    assert_eq!(passive.receive(&mut &wire[..len]).unwrap(), ResponderEvent::Request);
    let len = passive.reject(b"no", &mut wire).unwrap();
    assert!(matches!(passive.reject(b"no", &mut wire), Err(Error::InvalidState(_))));
    assert_eq!(active.receive(&mut &wire[..len]).unwrap(), InitiatorEvent::Rejected { private_data: b"no" });
}

#[test]
fn private_data_limit() {
    let big = [0x5au8; 600];
    for (revision, room) in [(1, 512), (2, 508)] {
        let mut active = Initiator::new(Config { revision, ..Config::default() }).unwrap();
        let mut out = [0u8; 700];
        assert_eq!(
            active.write_request(&big[..room + 1], &mut out),
            Err(Error::Frame(mpa::Error::Malformed(mpa::Malformed::PrivateDataTooLong(513))))
        );
        assert_eq!(active.write_request(&big[..room], &mut out), Ok(532), "retry after an error");
        let mut passive = Responder::new(Config::default()).unwrap();
        assert_eq!(passive.receive(&mut &out[..532]).unwrap(), ResponderEvent::Request);
        assert_eq!(passive.request().unwrap().private_data.len(), room);
        assert!(passive.accept(&big[..room + 1], &mut out).is_err());
        assert!(passive.accept(&big[..room], &mut out).is_ok());
    }
}

#[test]
fn an_oversized_pd_length_fails_after_the_header() {
    let mut header = frame(&request(None));
    header[18..20].copy_from_slice(&513u16.to_be_bytes());
    header.extend_from_slice(&[0u8; 10]);
    let mut passive = Responder::new(Config::default()).unwrap();
    let mut input = &header[..];
    assert_eq!(
        passive.receive(&mut input),
        Err(Error::Frame(mpa::Error::Malformed(mpa::Malformed::PrivateDataTooLong(513))))
    );
    assert_eq!(input.len(), 10, "nothing after the header was consumed");
    assert!(matches!(passive.receive(&mut input), Err(Error::InvalidState(_))));
}

#[test]
fn every_split_point_and_trailing_bytes() {
    let mut active = Initiator::new(Config::default()).unwrap();
    let mut request_bytes = vec![0u8; 64];
    let len = active.write_request(b"split me", &mut request_bytes).unwrap();
    request_bytes.truncate(len);
    let mut reply_bytes = Vec::new();
    for split in 0..=len {
        let mut passive = Responder::new(Config::default()).unwrap();
        let mut first = &request_bytes[..split];
        let event = passive.receive(&mut first).unwrap();
        assert!(first.is_empty());
        if split < len {
            assert_eq!(event, ResponderEvent::Pending);
            // The rest, followed by the start of the FPDU stream.
            let tail = [&request_bytes[split..], b"FPDU"].concat();
            let mut second = &tail[..];
            assert_eq!(passive.receive(&mut second).unwrap(), ResponderEvent::Request);
            assert_eq!(second, b"FPDU");
        } else {
            assert_eq!(event, ResponderEvent::Request);
        }
        let mut out = [0u8; 64];
        let (len, _) = passive.accept(b"ok", &mut out).unwrap();
        reply_bytes = out[..len].to_vec();
    }
    // The reply, byte by byte, then FPDU bytes in the same chunk as its last byte.
    let (last, head) = reply_bytes.split_last().unwrap();
    for byte in head {
        assert_eq!(active.receive(&mut std::slice::from_ref(byte)).unwrap(), InitiatorEvent::Pending);
    }
    let tail = [&[*last][..], b"FPDU"].concat();
    let mut input = &tail[..];
    assert!(matches!(active.receive(&mut input).unwrap(), InitiatorEvent::Established { .. }));
    assert_eq!(input, b"FPDU");
}

#[test]
fn wrong_or_garbage_frames() {
    let mut passive = Responder::new(Config::default()).unwrap();
    let a_reply = frame(&reply(None));
    assert_eq!(passive.receive(&mut &a_reply[..]), Err(Error::WrongFrame { expected: FrameKind::Request }));

    let mut active = Initiator::new(Config::default()).unwrap();
    active.write_request(&[], &mut [0u8; 64]).unwrap();
    let a_request = frame(&request(None));
    let error = active.receive(&mut &a_request[..]).unwrap_err();
    assert_eq!(error, Error::WrongFrame { expected: FrameKind::Reply });
    assert_eq!(error.term_code(), Some(TermCode::LlpInvalidRequestReply));

    let mut passive = Responder::new(Config::default()).unwrap();
    let garbage = [b'G'; 20];
    assert_eq!(passive.receive(&mut &garbage[..]), Err(Error::Frame(mpa::Error::Malformed(mpa::Malformed::Key))));

    let mut active = Initiator::new(Config { revision: 1, ..Config::default() }).unwrap();
    active.write_request(&[], &mut [0u8; 64]).unwrap();
    let newer = frame(&reply(Some(EnhancedData::default())));
    assert_eq!(active.receive(&mut &newer[..]), Err(Error::RevisionMismatch { requested: 1, replied: 2 }));
}

/// A request as siw sends it by default (revision 2, enhanced, no CRC,
/// peer-to-peer offering a zero-length Write, IRD = ORD = 32) and our
/// byte-exact answer with the default configuration.
#[test]
fn siw_style_request_gets_a_byte_exact_reply() {
    #[rustfmt::skip]
    let siw_request = [
        b'M', b'P', b'A', b' ', b'I', b'D', b' ', b'R', b'e', b'q', b' ', b'F', b'r', b'a', b'm', b'e',
        0x10, 0x02, 0x00, 0x04, // enhanced, revision 2, PD_Length 4
        0x80, 0x20, 0x80, 0x20, // P2P | IRD 32, Write RTR | ORD 32
    ];
    #[rustfmt::skip]
    let expected_reply = [
        b'M', b'P', b'A', b' ', b'I', b'D', b' ', b'R', b'e', b'p', b' ', b'F', b'r', b'a', b'm', b'e',
        0x50, 0x02, 0x00, 0x04, // CRC (we want it), enhanced, revision 2, PD_Length 4
        0x80, 0x10, 0x80, 0x10, // P2P | IRD 16, Write RTR | ORD min(16, 32)
    ];
    let mut passive = Responder::new(Config::default()).unwrap();
    assert_eq!(passive.receive(&mut &siw_request[..]).unwrap(), ResponderEvent::Request);
    let mut out = [0u8; 64];
    let (len, negotiated) = passive.accept(&[], &mut out).unwrap();
    assert_eq!(&out[..len], &expected_reply);
    assert_eq!(negotiated, Negotiated { revision: 2, crc: true, ird: 16, ord: 16, rtr: Some(RtrKind::Write) });
}
