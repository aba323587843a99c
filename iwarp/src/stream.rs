//! MPA over a TCP byte stream: the FPDU deframer (receive) and emitter
//! (transmit). Markers are never in use (vt3 refuses them), so FPDUs follow
//! each other back to back.

use crate::wire::mpa::{fpdu_len, Error, Fpdu, FpduRepr, Malformed, FPDU_HEADER_LEN};

/// Reassembles FPDUs from TCP payload cut at arbitrary points and yields
/// their ULPDUs (DDP segments).
///
/// An FPDU that arrives whole inside one input chunk is returned as a slice
/// of that chunk (no copy); only FPDUs split across chunks are gathered in
/// an internal buffer, allocated once at construction and sized for the
/// largest FPDU accepted. A length above that limit, or a CRC mismatch, is
/// an error and MPA framing is lost for good (no markers to resynchronise):
/// every later call returns the same error and the connection must be
/// terminated (see [`Error::term_code`]).
///
/// ```
/// # use vt3_iwarp::stream::{FpduDeframer, emit_fpdu};
/// let mut wire = [0u8; 16];
/// let len = emit_fpdu(b"hello", true, &mut wire).unwrap();
/// let mut deframer = FpduDeframer::new(1024, true);
/// let (first, second) = wire[..len].split_at(3);
/// let mut input = first;
/// assert_eq!(deframer.next_ulpdu(&mut input).unwrap(), None); // incomplete, buffered
/// let mut input = second;
/// assert_eq!(deframer.next_ulpdu(&mut input).unwrap(), Some(&b"hello"[..]));
/// assert_eq!(deframer.next_ulpdu(&mut input).unwrap(), None);
/// ```
#[derive(Debug)]
pub struct FpduDeframer {
    crc_enabled: bool,
    max_ulpdu_len: u16,
    /// Bytes of the FPDU currently being gathered; never above its capacity.
    partial: Vec<u8>,
    /// `partial` holds a complete FPDU already handed out: drop it first.
    delivered: bool,
    failed: Option<Error>,
}

impl FpduDeframer {
    /// `max_ulpdu_len` bounds what the peer may send (e.g. [`crate::wire::mpa::mulpdu`] of
    /// the path MSS, with headroom); `crc_enabled` as negotiated.
    pub fn new(max_ulpdu_len: u16, crc_enabled: bool) -> Self {
        FpduDeframer {
            crc_enabled,
            max_ulpdu_len,
            // Taken at the first FPDU split across segments ([`Self::gather`]):
            // an idle connection holds nothing.
            partial: Vec::new(),
            delivered: false,
            failed: None,
        }
    }

    pub fn crc_enabled(&self) -> bool {
        self.crc_enabled
    }

    /// Bytes of an incomplete FPDU held between calls.
    pub fn buffered(&self) -> usize {
        if self.delivered {
            0
        } else {
            self.partial.len()
        }
    }

    /// Consumes bytes from the front of `input` and returns the next
    /// complete ULPDU, or `None` once `input` is exhausted (any incomplete
    /// FPDU is kept for the next call). Call repeatedly until `None`.
    ///
    /// The returned slice borrows either `input`'s data or the deframer, so
    /// it lives until the next call.
    pub fn next_ulpdu<'r, 'i: 'r>(&'r mut self, input: &mut &'i [u8]) -> Result<Option<&'r [u8]>, Error> {
        if let Some(error) = self.failed {
            return Err(error);
        }
        if self.delivered {
            self.partial.clear();
            self.delivered = false;
        }
        if self.partial.is_empty() {
            // Fast path: the whole FPDU is in `input`, hand out a slice of it.
            let available: &'i [u8] = input;
            match announced_len(available, self.max_ulpdu_len) {
                Err(error) => return Err(self.fail(error)),
                Ok(Some(total)) => {
                    if let Some((fpdu, rest)) = available.split_at_checked(total) {
                        *input = rest;
                        return validate(fpdu, self.crc_enabled).map(Some).map_err(|error| self.fail(error));
                    }
                }
                Ok(None) => {}
            }
        }
        if let Err(error) = self.gather(input) {
            return Err(self.fail(error));
        }
        let total = match announced_len(&self.partial, self.max_ulpdu_len) {
            Ok(Some(total)) if self.partial.len() == total => total,
            Ok(_) => return Ok(None),
            Err(error) => return Err(self.fail(error)),
        };
        self.delivered = true;
        match validate(self.partial.get(..total).unwrap_or(&[]), self.crc_enabled) {
            Ok(ulpdu) => Ok(Some(ulpdu)),
            Err(error) => {
                self.failed = Some(error);
                Err(error)
            }
        }
    }

    /// Moves bytes from `input` into `partial`: up to the end of the
    /// ULPDU_Length field, then up to the end of the FPDU it announces.
    fn gather<'i>(&mut self, input: &mut &'i [u8]) -> Result<(), Error> {
        loop {
            let target = announced_len(&self.partial, self.max_ulpdu_len)?.unwrap_or(FPDU_HEADER_LEN);
            let before = self.partial.len();
            let available: &'i [u8] = input;
            let wanted = target.saturating_sub(before).min(available.len());
            let Some((taken, rest)) = available.split_at_checked(wanted) else {
                return Ok(());
            };
            if self.partial.capacity() == 0 {
                // Once, at the first split FPDU: the largest one accepted.
                self.partial.reserve_exact(fpdu_len(self.max_ulpdu_len));
            }
            self.partial.extend_from_slice(taken);
            *input = rest;
            let header_just_completed = before < FPDU_HEADER_LEN && self.partial.len() == FPDU_HEADER_LEN;
            if !header_just_completed {
                return Ok(());
            }
        }
    }

    fn fail(&mut self, error: Error) -> Error {
        self.failed = Some(error);
        error
    }
}

/// Total FPDU length once the ULPDU_Length field is available.
fn announced_len(bytes: &[u8], max_ulpdu_len: u16) -> Result<Option<usize>, Error> {
    let Some(header) = bytes.get(..FPDU_HEADER_LEN) else {
        return Ok(None);
    };
    let length = Fpdu::new_unchecked(header).ulpdu_length();
    if length > max_ulpdu_len {
        return Err(Error::Malformed(Malformed::UlpduTooLong {
            length: usize::from(length),
            limit: usize::from(max_ulpdu_len),
        }));
    }
    Ok(Some(fpdu_len(length)))
}

/// Checks one complete FPDU and returns its ULPDU.
fn validate(fpdu: &[u8], crc_enabled: bool) -> Result<&[u8], Error> {
    FpduRepr::parse(&Fpdu::new_unchecked(fpdu), crc_enabled).map(|repr| repr.ulpdu)
}

/// Offset of the ULPDU inside an FPDU: write the DDP segment there, then [`seal_fpdu`].
pub const ULPDU_OFFSET: usize = FPDU_HEADER_LEN;

/// Frames a ULPDU that the caller already wrote at
/// `out[ULPDU_OFFSET..ULPDU_OFFSET + ulpdu_len]` (headers and payload placed
/// straight from guest memory, no staging copy): writes ULPDU_Length, the
/// pad and the CRC field. Returns the FPDU length.
pub fn seal_fpdu(out: &mut [u8], ulpdu_len: u16, crc_enabled: bool) -> Result<usize, Error> {
    let total = fpdu_len(ulpdu_len);
    let fpdu_buffer = out.get_mut(..total).ok_or(Error::Truncated)?;
    let mut fpdu = Fpdu::new_unchecked(fpdu_buffer);
    fpdu.set_ulpdu_length(ulpdu_len);
    fpdu.fill_trailer(crc_enabled);
    Ok(total)
}

/// Frames `ulpdu` into `out` (copying it). Returns the FPDU length.
pub fn emit_fpdu(ulpdu: &[u8], crc_enabled: bool, out: &mut [u8]) -> Result<usize, Error> {
    let repr = FpduRepr { ulpdu };
    repr.emit(&mut Fpdu::new_unchecked(&mut *out), crc_enabled)?;
    Ok(repr.buffer_len())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;

    fn drain(deframer: &mut FpduDeframer, mut input: &[u8]) -> Result<Vec<Vec<u8>>, Error> {
        let mut out = Vec::new();
        while let Some(ulpdu) = deframer.next_ulpdu(&mut input)? {
            out.push(ulpdu.to_vec());
        }
        assert!(input.is_empty());
        Ok(out)
    }

    /// An idle connection's deframer holds no buffer; a split FPDU gets
    /// one no larger than the largest FPDU it accepts.
    #[test]
    fn the_reassembly_buffer_is_taken_when_needed() {
        let mut deframer = FpduDeframer::new(100, true);
        assert_eq!(deframer.partial.capacity(), 0);
        let mut wire = vec![0u8; 64];
        let n = emit_fpdu(&[7; 20], true, &mut wire).unwrap();
        assert_eq!(drain(&mut deframer, &wire[..5]).unwrap().len(), 0);
        assert_eq!(drain(&mut deframer, &wire[5..n]).unwrap(), vec![vec![7u8; 20]]);
        assert_eq!(deframer.partial.capacity(), fpdu_len(100));
    }

    #[test]
    fn whole_fpdus_in_one_chunk_are_zero_copy() {
        let mut wire = vec![0u8; 64];
        let a = emit_fpdu(&[1; 5], true, &mut wire).unwrap();
        let b = emit_fpdu(&[2; 8], true, &mut wire[a..]).unwrap();
        let mut deframer = FpduDeframer::new(100, true);
        let mut input = &wire[..a + b];
        let first = deframer.next_ulpdu(&mut input).unwrap().unwrap();
        assert_eq!(first.as_ptr(), wire[2..].as_ptr(), "borrowed from the input");
        assert_eq!(deframer.next_ulpdu(&mut input).unwrap(), Some(&[2u8; 8][..]));
        assert_eq!(deframer.next_ulpdu(&mut input).unwrap(), None);
        assert_eq!(deframer.buffered(), 0);
    }

    #[test]
    fn byte_at_a_time() {
        let mut wire = vec![0u8; 64];
        let len = emit_fpdu(b"abcdefg", false, &mut wire).unwrap();
        let mut deframer = FpduDeframer::new(7, false);
        let mut got = Vec::new();
        for byte in &wire[..len] {
            got.extend(drain(&mut deframer, std::slice::from_ref(byte)).unwrap());
        }
        assert_eq!(got, vec![b"abcdefg".to_vec()]);
    }

    #[test]
    fn errors_are_sticky() {
        let mut deframer = FpduDeframer::new(4, true);
        let error = drain(&mut deframer, &[0, 5]).unwrap_err();
        assert_eq!(error, Error::Malformed(Malformed::UlpduTooLong { length: 5, limit: 4 }));
        assert_eq!(drain(&mut deframer, &[]).unwrap_err(), error);

        let mut wire = [0u8; 8];
        emit_fpdu(&[9, 9], true, &mut wire).unwrap();
        wire[7] ^= 0x80;
        let mut deframer = FpduDeframer::new(4, true);
        assert!(matches!(drain(&mut deframer, &wire[..5]), Ok(ref v) if v.is_empty()));
        assert!(matches!(drain(&mut deframer, &wire[5..]), Err(Error::Crc { .. })));
        assert!(matches!(drain(&mut deframer, &wire), Err(Error::Crc { .. })));
    }

    #[test]
    fn seal_in_place() {
        let mut out = [0xffu8; 12];
        out[ULPDU_OFFSET..ULPDU_OFFSET + 3].copy_from_slice(b"xyz");
        assert_eq!(seal_fpdu(&mut out, 3, true).unwrap(), 12);
        let mut emitted = [0u8; 12];
        emit_fpdu(b"xyz", true, &mut emitted).unwrap();
        assert_eq!(out, emitted);
        assert_eq!(seal_fpdu(&mut out[..11], 3, true), Err(Error::Truncated));
        assert_eq!(emit_fpdu(b"xyz", true, &mut out[..11]), Err(Error::Truncated));
    }
}
