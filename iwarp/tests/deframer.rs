//! The FPDU deframer yields the same ULPDUs whatever the TCP segmentation,
//! detects bad CRCs and refuses oversized lengths.
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

mod common;

use common::Rng;
use vt3_iwarp::stream::{emit_fpdu, seal_fpdu, FpduDeframer, ULPDU_OFFSET};
use vt3_iwarp::wire::mpa::{self, Error, Malformed};

const MAX_ULPDU: u16 = 1454; // mulpdu(1460)

/// A stream of `count` FPDUs and the ULPDUs it carries.
fn stream(rng: &mut Rng, count: usize, crc: bool) -> (Vec<u8>, Vec<Vec<u8>>) {
    let mut wire = Vec::new();
    let mut ulpdus = Vec::new();
    for _ in 0..count {
        let len = match rng.below(4) {
            0 => rng.below(4),
            1 => usize::from(MAX_ULPDU) - rng.below(4),
            _ => rng.below(usize::from(MAX_ULPDU) + 1),
        };
        let ulpdu = rng.bytes(len);
        let start = wire.len();
        wire.resize(start + mpa::fpdu_len(u16::try_from(len).unwrap()), 0);
        emit_fpdu(&ulpdu, crc, &mut wire[start..]).unwrap();
        ulpdus.push(ulpdu);
    }
    (wire, ulpdus)
}

/// Feeds `pieces` in order; returns the ULPDUs and the first error.
fn deframe<'a>(
    deframer: &mut FpduDeframer,
    pieces: impl IntoIterator<Item = &'a [u8]>,
) -> (Vec<Vec<u8>>, Option<Error>) {
    let mut out = Vec::new();
    for piece in pieces {
        let mut input = piece;
        loop {
            match deframer.next_ulpdu(&mut input) {
                Ok(Some(ulpdu)) => out.push(ulpdu.to_vec()),
                Ok(None) => break,
                Err(error) => return (out, Some(error)),
            }
        }
        assert!(input.is_empty(), "None only once the input is used up");
    }
    (out, None)
}

#[test]
fn every_fixed_segmentation_yields_the_same_ulpdus() {
    let mut rng = Rng::new(10);
    for crc in [true, false] {
        let (wire, expected) = stream(&mut rng, 24, crc);
        let mut sizes: Vec<usize> = (1..=64).collect();
        sizes.extend([99, 512, 1460, 1461, 4096, wire.len()]);
        for size in sizes {
            let mut deframer = FpduDeframer::new(MAX_ULPDU, crc);
            let (got, error) = deframe(&mut deframer, wire.chunks(size));
            assert_eq!(error, None);
            assert_eq!(got, expected, "chunk size {size}");
            assert_eq!(deframer.buffered(), 0);
        }
    }
}

#[test]
fn random_splits_yield_the_same_ulpdus() {
    let mut rng = Rng::new(11);
    for round in 0..200 {
        let crc = round % 2 == 0;
        let count = 1 + rng.below(12);
        let (wire, expected) = stream(&mut rng, count, crc);
        let max_piece = [2, 7, 100, 3000][round % 4];
        let mut deframer = FpduDeframer::new(MAX_ULPDU, crc);
        let mut rest = &wire[..];
        let mut pieces = Vec::new();
        for piece in rng.splits(wire.len(), max_piece) {
            let (head, tail) = rest.split_at(piece);
            pieces.push(head);
            rest = tail;
        }
        let (got, error) = deframe(&mut deframer, pieces);
        assert_eq!((got, error), (expected, None), "round {round}");
    }
}

#[test]
fn a_trailing_partial_fpdu_is_kept() {
    let mut rng = Rng::new(12);
    let (wire, expected) = stream(&mut rng, 3, true);
    let cut = wire.len() - 5;
    let mut deframer = FpduDeframer::new(MAX_ULPDU, true);
    let (got, _) = deframe(&mut deframer, [&wire[..cut]]);
    assert_eq!(got, expected[..2]);
    assert!(deframer.buffered() > 0);
    let (got, error) = deframe(&mut deframer, [&wire[cut..]]);
    assert_eq!((got, error), (expected[2..].to_vec(), None));
}

#[test]
fn any_corrupted_byte_after_the_length_is_a_crc_error() {
    let mut rng = Rng::new(13);
    let (wire, expected) = stream(&mut rng, 4, true);
    let first_len = mpa::fpdu_len(u16::try_from(expected[0].len()).unwrap());
    // Flip every octet of the first FPDU except its length field.
    for at in 2..first_len {
        let mut bad = wire.clone();
        bad[at] ^= 1 << rng.below(8);
        for size in [1, 3, wire.len()] {
            let mut deframer = FpduDeframer::new(MAX_ULPDU, true);
            let (got, error) = deframe(&mut deframer, bad.chunks(size));
            assert!(got.is_empty());
            assert!(matches!(error, Some(Error::Crc { .. })), "offset {at}: {error:?}");
            // The stream stays failed.
            let mut empty: &[u8] = &[];
            assert_eq!(deframer.next_ulpdu(&mut empty), Err(error.unwrap()));
        }
        // Without CRC the damage goes unnoticed (the CRC field is ignored).
        if at >= first_len - mpa::CRC_LEN {
            let mut deframer = FpduDeframer::new(MAX_ULPDU, false);
            let (got, error) = deframe(&mut deframer, [&bad[..]]);
            assert_eq!(error, None);
            assert_eq!(got.len(), expected.len());
        }
    }
}

#[test]
fn an_oversized_length_is_refused_before_buffering() {
    for size in [1, 2, 3, 100] {
        let mut wire = [0u8; 64];
        wire[..2].copy_from_slice(&(MAX_ULPDU + 1).to_be_bytes());
        let mut deframer = FpduDeframer::new(MAX_ULPDU, true);
        let (got, error) = deframe(&mut deframer, wire.chunks(size));
        assert!(got.is_empty());
        assert_eq!(error, Some(Error::Malformed(Malformed::UlpduTooLong { length: 1455, limit: 1454 })));
        assert!(deframer.buffered() <= 2);
        assert_eq!(error.unwrap().term_code(), vt3_iwarp::wire::terminate::TermCode::LlpMarkerUlpduLengthMismatch);
    }
    // The largest length the 16-bit field can carry is fine when allowed.
    let ulpdu = vec![7u8; usize::from(u16::MAX)];
    let mut wire = vec![0u8; mpa::fpdu_len(u16::MAX)];
    emit_fpdu(&ulpdu, true, &mut wire).unwrap();
    let mut deframer = FpduDeframer::new(u16::MAX, true);
    let (got, error) = deframe(&mut deframer, wire.chunks(1000));
    assert_eq!((got, error), (vec![ulpdu], None));
}

#[test]
fn sealed_in_place_fpdus_deframe() {
    let mut out = vec![0u8; mpa::fpdu_len(5)];
    out[ULPDU_OFFSET..ULPDU_OFFSET + 5].copy_from_slice(b"hello");
    let len = seal_fpdu(&mut out, 5, true).unwrap();
    let mut deframer = FpduDeframer::new(16, true);
    let (got, error) = deframe(&mut deframer, [&out[..len]]);
    assert_eq!((got, error), (vec![b"hello".to_vec()], None));
}
