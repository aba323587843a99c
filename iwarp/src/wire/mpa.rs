//! MPA, Marker PDU Aligned framing (RFC 5044, updated by RFC 6581).
//!
//! Two wire units:
//!
//! * the connection-setup [`Frame`] (MPA Request / MPA Reply):
//!
//!   ```text
//!    0                   1                   2                   3
//!   +---------------------------------------------------------------+
//!   |        Key: "MPA ID Req Frame" or "MPA ID Rep Frame"          |  16 octets
//!   +-+-+-+-+-+-----+---------------+-------------------------------+
//!   |M|C|R|E| Res   |      Rev      |           PD_Length           |
//!   +-+-+-+-+-+-----+---------------+-------------------------------+
//!   |A|B|     IRD (14)              |C|D|     ORD (14)              |  rev 2 with E only
//!   +---------------------------------------------------------------+
//!   ~                    ULP private data                           ~
//!   ```
//!
//!   M: the sender wants markers in the data it receives; C: CRC wanted;
//!   R: reply rejects the connection; E: "enhanced" RFC 6581 connection
//!   data present (bit 0x10 of the flags octet, as siw, cxgb4 and irdma put
//!   it). Rev is 1 or 2. PD_Length counts every private-data octet,
//!   including the 4 enhanced octets, and is at most 512. Enhanced data:
//!   A = peer-to-peer, B/C/D = the zero-length SEND/WRITE/READ that may serve
//!   as "ready to receive" (RTR) message.
//!
//! * the [`Fpdu`]: ULPDU_Length (16 bits), the ULPDU, zero pad to a 4-octet
//!   boundary, CRC32c. The CRC field is present whether or not CRC was
//!   negotiated (RFC 5044 §7.1: "even when not in use, the CRC field remains
//!   present"); without CRC it is sent as zero and ignored on receipt.

use core::ops::Range;

use thiserror::Error;

use super::terminate::TermCode;
use super::{read_be16, read_le32, read_u8, write_be16, write_le32, write_slice, write_u8};
use crate::crc32c::Crc32c;

/// Key of an MPA Request frame.
pub const KEY_REQUEST: [u8; 16] = *b"MPA ID Req Frame";
/// Key of an MPA Reply frame.
pub const KEY_REPLY: [u8; 16] = *b"MPA ID Rep Frame";
/// Request/reply header length (key, flags, revision, PD_Length).
pub const FRAME_HEADER_LEN: usize = 20;
/// RFC 5044 limit on PD_Length.
pub const MAX_PRIVATE_DATA_LEN: usize = 512;
/// The largest legal request/reply frame.
pub const MAX_FRAME_LEN: usize = FRAME_HEADER_LEN + MAX_PRIVATE_DATA_LEN;
/// Length of the RFC 6581 IRD/ORD block at the start of the private data.
pub const ENHANCED_DATA_LEN: usize = 4;
/// IRD and ORD are 14-bit fields.
pub const IRD_ORD_MAX: u16 = 0x3fff;
/// MPA revision of RFC 5044.
pub const REVISION_1: u8 = 1;
/// MPA revision of RFC 6581 (enhanced connection setup).
pub const REVISION_2: u8 = 2;
/// The FPDU's ULPDU_Length field.
pub const FPDU_HEADER_LEN: usize = 2;
/// The FPDU's CRC field.
pub const CRC_LEN: usize = 4;

/// MPA errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Error {
    #[error("MPA data truncated")]
    Truncated,
    #[error("malformed MPA data: {0}")]
    Malformed(Malformed),
    #[error("unsupported MPA feature: {0}")]
    Unsupported(Unsupported),
    #[error("MPA CRC mismatch: computed {computed:#010x}, received {received:#010x}")]
    Crc { computed: u32, received: u32 },
}

/// What made MPA data malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Malformed {
    #[error("key is neither \"MPA ID Req Frame\" nor \"MPA ID Rep Frame\"")]
    Key,
    #[error("private data of {0} octets exceeds {MAX_PRIVATE_DATA_LEN}")]
    PrivateDataTooLong(usize),
    #[error("enhanced flag set but fewer than {ENHANCED_DATA_LEN} private data octets")]
    EnhancedDataMissing,
    #[error("enhanced connection data needs MPA revision 2")]
    EnhancedNeedsRevision2,
    #[error("IRD/ORD value {0} exceeds 14 bits")]
    IrdOrdRange(u16),
    #[error("ULPDU of {length} octets exceeds the limit of {limit}")]
    UlpduTooLong { length: usize, limit: usize },
}

/// What we do not implement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Unsupported {
    #[error("MPA revision {0}")]
    Revision(u8),
}

impl Error {
    /// The TERMINATE code that reports this error to the peer (LLP layer).
    pub fn term_code(&self) -> TermCode {
        match self {
            Error::Crc { .. } => TermCode::LlpCrcError,
            // A length the stream cannot hold means framing is lost: the
            // closest registered code is "ULPDU Length field mismatch".
            Error::Malformed(Malformed::UlpduTooLong { .. }) => TermCode::LlpMarkerUlpduLengthMismatch,
            Error::Truncated | Error::Malformed(_) | Error::Unsupported(_) => TermCode::LlpInvalidRequestReply,
        }
    }
}

mod field {
    use core::ops::Range;

    pub const KEY: Range<usize> = 0..16;
    pub const FLAGS: usize = 16;
    pub const REVISION: usize = 17;
    pub const PD_LENGTH: Range<usize> = 18..20;
    pub const PRIVATE_DATA: usize = 20;
    /// RFC 6581 words, relative to the start of the private data.
    pub const IRD: Range<usize> = 0..2;
    pub const ORD: Range<usize> = 2..4;

    pub const ULPDU_LENGTH: Range<usize> = 0..2;
    pub const ULPDU: usize = 2;
}

mod flag {
    pub const MARKERS: u8 = 0x80;
    pub const CRC: u8 = 0x40;
    pub const REJECT: u8 = 0x20;
    pub const ENHANCED: u8 = 0x10;
}

mod enhanced_bit {
    /// In the IRD word.
    pub const PEER_TO_PEER: u16 = 0x8000;
    /// In the IRD word.
    pub const RTR_SEND: u16 = 0x4000;
    /// In the ORD word.
    pub const RTR_WRITE: u16 = 0x8000;
    /// In the ORD word.
    pub const RTR_READ: u16 = 0x4000;
    pub const VALUE: u16 = super::IRD_ORD_MAX;
}

/// Which of the two connection-setup frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Request,
    Reply,
}

impl FrameKind {
    /// The 16-octet key that identifies this frame.
    pub const fn key(self) -> [u8; 16] {
        match self {
            FrameKind::Request => KEY_REQUEST,
            FrameKind::Reply => KEY_REPLY,
        }
    }
}

/// A zero-length RDMAP message usable as RFC 6581 "ready to receive".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RtrKind {
    Send,
    Write,
    Read,
}

/// A set of [`RtrKind`]s: offered by an initiator, chosen (one) by a responder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RtrSet {
    pub send: bool,
    pub write: bool,
    pub read: bool,
}

impl RtrSet {
    pub const NONE: RtrSet = RtrSet { send: false, write: false, read: false };
    pub const ALL: RtrSet = RtrSet { send: true, write: true, read: true };

    pub const fn only(kind: RtrKind) -> RtrSet {
        RtrSet {
            send: matches!(kind, RtrKind::Send),
            write: matches!(kind, RtrKind::Write),
            read: matches!(kind, RtrKind::Read),
        }
    }

    pub const fn contains(self, kind: RtrKind) -> bool {
        match kind {
            RtrKind::Send => self.send,
            RtrKind::Write => self.write,
            RtrKind::Read => self.read,
        }
    }

    pub const fn intersect(self, other: RtrSet) -> RtrSet {
        RtrSet { send: self.send && other.send, write: self.write && other.write, read: self.read && other.read }
    }

    pub const fn is_empty(self) -> bool {
        !(self.send || self.write || self.read)
    }
}

/// RFC 6581 enhanced connection data (first four private-data octets).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EnhancedData {
    /// Inbound RDMA Read queue depth (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth (14 bits).
    pub ord: u16,
    /// Peer-to-peer mode: an RTR message will start the data phase.
    pub peer_to_peer: bool,
    /// RTR messages offered (request) or the one chosen (reply).
    pub rtr: RtrSet,
}

impl EnhancedData {
    fn parse(words: &[u8]) -> Self {
        let ird = read_be16(words, field::IRD);
        let ord = read_be16(words, field::ORD);
        EnhancedData {
            ird: ird & enhanced_bit::VALUE,
            ord: ord & enhanced_bit::VALUE,
            peer_to_peer: ird & enhanced_bit::PEER_TO_PEER != 0,
            rtr: RtrSet {
                send: ird & enhanced_bit::RTR_SEND != 0,
                write: ord & enhanced_bit::RTR_WRITE != 0,
                read: ord & enhanced_bit::RTR_READ != 0,
            },
        }
    }

    fn words(&self) -> (u16, u16) {
        let bit = |set: bool, mask: u16| if set { mask } else { 0 };
        let ird =
            self.ird | bit(self.peer_to_peer, enhanced_bit::PEER_TO_PEER) | bit(self.rtr.send, enhanced_bit::RTR_SEND);
        let ord = self.ord | bit(self.rtr.write, enhanced_bit::RTR_WRITE) | bit(self.rtr.read, enhanced_bit::RTR_READ);
        (ird, ord)
    }
}

/// A view of an MPA Request or Reply frame.
#[derive(Debug, Clone)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Frame { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// The buffer holds the header and all PD_Length private-data octets.
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < FRAME_HEADER_LEN || len < self.frame_len() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn key(&self) -> [u8; 16] {
        let mut key = [0u8; 16];
        if let Some(bytes) = self.buffer.as_ref().get(field::KEY) {
            key.copy_from_slice(bytes);
        }
        key
    }

    pub fn kind(&self) -> Option<FrameKind> {
        match self.key() {
            KEY_REQUEST => Some(FrameKind::Request),
            KEY_REPLY => Some(FrameKind::Reply),
            _ => None,
        }
    }

    fn flag(&self, mask: u8) -> bool {
        read_u8(self.buffer.as_ref(), field::FLAGS) & mask != 0
    }

    pub fn markers(&self) -> bool {
        self.flag(flag::MARKERS)
    }

    pub fn crc(&self) -> bool {
        self.flag(flag::CRC)
    }

    pub fn reject(&self) -> bool {
        self.flag(flag::REJECT)
    }

    pub fn enhanced(&self) -> bool {
        self.flag(flag::ENHANCED)
    }

    pub fn revision(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::REVISION)
    }

    pub fn private_data_len(&self) -> u16 {
        read_be16(self.buffer.as_ref(), field::PD_LENGTH)
    }

    /// Header plus private data, as announced by PD_Length.
    pub fn frame_len(&self) -> usize {
        FRAME_HEADER_LEN + usize::from(self.private_data_len())
    }

    fn private_data_range(&self) -> Range<usize> {
        field::PRIVATE_DATA..self.frame_len()
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Frame<&'a T> {
    /// All private data octets (including RFC 6581 enhanced data).
    pub fn private_data(&self) -> &'a [u8] {
        let buffer: &'a [u8] = self.buffer.as_ref();
        buffer.get(self.private_data_range()).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    pub fn set_kind(&mut self, kind: FrameKind) {
        write_slice(self.buffer.as_mut(), field::KEY.start, &kind.key());
    }

    fn set_flag(&mut self, mask: u8, value: bool) {
        let flags = read_u8(self.buffer.as_ref(), field::FLAGS);
        let flags = if value { flags | mask } else { flags & !mask };
        write_u8(self.buffer.as_mut(), field::FLAGS, flags);
    }

    pub fn set_markers(&mut self, value: bool) {
        self.set_flag(flag::MARKERS, value);
    }

    pub fn set_crc(&mut self, value: bool) {
        self.set_flag(flag::CRC, value);
    }

    pub fn set_reject(&mut self, value: bool) {
        self.set_flag(flag::REJECT, value);
    }

    pub fn set_enhanced(&mut self, value: bool) {
        self.set_flag(flag::ENHANCED, value);
    }

    pub fn set_revision(&mut self, revision: u8) {
        write_u8(self.buffer.as_mut(), field::REVISION, revision);
    }

    pub fn set_private_data_len(&mut self, len: u16) {
        write_be16(self.buffer.as_mut(), field::PD_LENGTH, len);
    }

    /// The private data octets announced by PD_Length (empty if the buffer is shorter).
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let range = self.private_data_range();
        self.buffer.as_mut().get_mut(range).unwrap_or(&mut [])
    }
}

/// A parsed MPA Request or Reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    pub kind: FrameKind,
    /// The sender requires markers in the stream it receives.
    pub markers: bool,
    /// The sender wants CRC; CRC is used if either frame sets it.
    pub crc: bool,
    /// Reply only: the connection is rejected. Never set in a parsed request
    /// (RFC 5044: zero in requests, not checked on receipt).
    pub reject: bool,
    pub revision: u8,
    /// RFC 6581 data; only with revision 2.
    pub enhanced: Option<EnhancedData>,
    /// The ULP's private data (after the enhanced block, if any).
    pub private_data: &'a [u8],
}

impl<'a> Repr<'a> {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&'a T>) -> Result<Self, Error> {
        if frame.buffer.as_ref().len() < FRAME_HEADER_LEN {
            return Err(Error::Truncated);
        }
        let kind = frame.kind().ok_or(Error::Malformed(Malformed::Key))?;
        let revision = frame.revision();
        if !(REVISION_1..=REVISION_2).contains(&revision) {
            return Err(Error::Unsupported(Unsupported::Revision(revision)));
        }
        let announced = usize::from(frame.private_data_len());
        if announced > MAX_PRIVATE_DATA_LEN {
            return Err(Error::Malformed(Malformed::PrivateDataTooLong(announced)));
        }
        frame.check_len()?;
        let all = frame.private_data();
        // A revision 1 frame carries no enhanced data even if the flag is
        // set (siw behaves the same): its private data is all ULP data.
        let (enhanced, private_data) = if revision == REVISION_2 && frame.enhanced() {
            let (words, rest) =
                all.split_at_checked(ENHANCED_DATA_LEN).ok_or(Error::Malformed(Malformed::EnhancedDataMissing))?;
            (Some(EnhancedData::parse(words)), rest)
        } else {
            (None, all)
        };
        Ok(Repr {
            kind,
            markers: frame.markers(),
            crc: frame.crc(),
            reject: kind == FrameKind::Reply && frame.reject(),
            revision,
            enhanced,
            private_data,
        })
    }

    /// Value of the PD_Length field this frame will carry.
    pub fn wire_private_data_len(&self) -> usize {
        self.private_data.len() + if self.enhanced.is_some() { ENHANCED_DATA_LEN } else { 0 }
    }

    pub fn buffer_len(&self) -> usize {
        FRAME_HEADER_LEN + self.wire_private_data_len()
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) -> Result<(), Error> {
        if !(REVISION_1..=REVISION_2).contains(&self.revision) {
            return Err(Error::Unsupported(Unsupported::Revision(self.revision)));
        }
        let pd_len = self.wire_private_data_len();
        let pd_len_field = u16::try_from(pd_len)
            .ok()
            .filter(|&len| usize::from(len) <= MAX_PRIVATE_DATA_LEN)
            .ok_or(Error::Malformed(Malformed::PrivateDataTooLong(pd_len)))?;
        if let Some(enhanced) = &self.enhanced {
            if self.revision != REVISION_2 {
                return Err(Error::Malformed(Malformed::EnhancedNeedsRevision2));
            }
            for value in [enhanced.ird, enhanced.ord] {
                if value > IRD_ORD_MAX {
                    return Err(Error::Malformed(Malformed::IrdOrdRange(value)));
                }
            }
        }
        if frame.buffer.as_ref().len() < self.buffer_len() {
            return Err(Error::Truncated);
        }
        frame.set_kind(self.kind);
        write_u8(frame.buffer.as_mut(), field::FLAGS, 0); // reserved bits are zero
        frame.set_markers(self.markers);
        frame.set_crc(self.crc);
        frame.set_reject(self.kind == FrameKind::Reply && self.reject);
        frame.set_enhanced(self.enhanced.is_some());
        frame.set_revision(self.revision);
        frame.set_private_data_len(pd_len_field);
        let mut ulp_start = 0;
        if let Some(enhanced) = &self.enhanced {
            let (ird, ord) = enhanced.words();
            let data = frame.private_data_mut();
            write_be16(data, field::IRD, ird);
            write_be16(data, field::ORD, ord);
            ulp_start = ENHANCED_DATA_LEN;
        }
        write_slice(frame.private_data_mut(), ulp_start, self.private_data);
        Ok(())
    }
}

/// Number of zero octets after a ULPDU so the FPDU ends on a 4-octet boundary.
pub const fn pad_len(ulpdu_len: u16) -> usize {
    (FPDU_HEADER_LEN + ulpdu_len as usize).wrapping_neg() & 3
}

/// Total FPDU length for a ULPDU of `ulpdu_len` octets (header, pad and CRC).
pub const fn fpdu_len(ulpdu_len: u16) -> usize {
    FPDU_HEADER_LEN + ulpdu_len as usize + pad_len(ulpdu_len) + CRC_LEN
}

/// The largest ULPDU whose FPDU fits one TCP segment of `emss` octets
/// (RFC 5044 §5.2, markers disabled): `EMSS - (6 + EMSS mod 4)`. The CRC
/// field counts whether or not CRC is in use, so no CRC argument.
pub const fn mulpdu(emss: u16) -> u16 {
    emss.saturating_sub(6 + emss % 4)
}

/// A view of one MPA FPDU (no markers).
#[derive(Debug, Clone)]
pub struct Fpdu<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Fpdu<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Fpdu { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let fpdu = Self::new_unchecked(buffer);
        fpdu.check_len()?;
        Ok(fpdu)
    }

    /// The buffer holds the whole FPDU announced by ULPDU_Length.
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < FPDU_HEADER_LEN || len < self.total_len() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn ulpdu_length(&self) -> u16 {
        read_be16(self.buffer.as_ref(), field::ULPDU_LENGTH)
    }

    pub fn total_len(&self) -> usize {
        fpdu_len(self.ulpdu_length())
    }

    fn crc_range(&self) -> Range<usize> {
        let end = self.total_len();
        end - CRC_LEN..end
    }

    /// The received CRC field, as a CRC value comparable with [`Crc32c::finish`].
    pub fn crc_field(&self) -> u32 {
        read_le32(self.buffer.as_ref(), self.crc_range())
    }

    /// CRC32c over ULPDU_Length, ULPDU and pad.
    pub fn computed_crc(&self) -> u32 {
        let covered = self.buffer.as_ref().get(..self.crc_range().start).unwrap_or(&[]);
        Crc32c::new().update(covered).finish()
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Fpdu<&'a T> {
    pub fn ulpdu(&self) -> &'a [u8] {
        let buffer: &'a [u8] = self.buffer.as_ref();
        let end = field::ULPDU + usize::from(self.ulpdu_length());
        buffer.get(field::ULPDU..end).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Fpdu<T> {
    pub fn set_ulpdu_length(&mut self, len: u16) {
        write_be16(self.buffer.as_mut(), field::ULPDU_LENGTH, len);
    }

    pub fn ulpdu_mut(&mut self) -> &mut [u8] {
        let end = field::ULPDU + usize::from(self.ulpdu_length());
        self.buffer.as_mut().get_mut(field::ULPDU..end).unwrap_or(&mut [])
    }

    /// Zeroes the pad and writes the CRC field (zero without CRC).
    pub fn fill_trailer(&mut self, crc_enabled: bool) {
        let crc_range = self.crc_range();
        let pad_start = field::ULPDU + usize::from(self.ulpdu_length());
        if let Some(pad) = self.buffer.as_mut().get_mut(pad_start..crc_range.start) {
            pad.fill(0);
        }
        let crc = if crc_enabled { self.computed_crc() } else { 0 };
        write_le32(self.buffer.as_mut(), crc_range, crc);
    }
}

/// A parsed FPDU: its ULPDU (a DDP segment).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpduRepr<'a> {
    pub ulpdu: &'a [u8],
}

impl<'a> FpduRepr<'a> {
    /// Checks length and, when negotiated, the CRC.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(fpdu: &Fpdu<&'a T>, crc_enabled: bool) -> Result<Self, Error> {
        fpdu.check_len()?;
        if crc_enabled {
            let (computed, received) = (fpdu.computed_crc(), fpdu.crc_field());
            if computed != received {
                return Err(Error::Crc { computed, received });
            }
        }
        Ok(FpduRepr { ulpdu: fpdu.ulpdu() })
    }

    pub fn buffer_len(&self) -> usize {
        u16::try_from(self.ulpdu.len()).map_or(usize::MAX, fpdu_len)
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, fpdu: &mut Fpdu<T>, crc_enabled: bool) -> Result<(), Error> {
        let length = u16::try_from(self.ulpdu.len()).map_err(|_| {
            Error::Malformed(Malformed::UlpduTooLong { length: self.ulpdu.len(), limit: usize::from(u16::MAX) })
        })?;
        if fpdu.buffer.as_ref().len() < fpdu_len(length) {
            return Err(Error::Truncated);
        }
        fpdu.set_ulpdu_length(length);
        fpdu.ulpdu_mut().copy_from_slice(self.ulpdu);
        fpdu.fill_trailer(crc_enabled);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;

    #[test]
    fn padding_and_lengths() {
        assert_eq!([0u16, 1, 2, 3, 4, 5].map(pad_len), [2, 1, 0, 3, 2, 1]);
        assert_eq!(fpdu_len(2), 8);
        assert_eq!(fpdu_len(0), 8);
        assert_eq!(fpdu_len(u16::MAX), 2 + 65535 + 3 + 4);
        for emss in 0..=u16::MAX {
            let max = mulpdu(emss);
            if emss >= 8 {
                assert!(fpdu_len(max) <= usize::from(emss), "emss {emss}");
                assert!(fpdu_len(max + 1) > usize::from(emss) || emss % 4 != 0, "emss {emss}");
            } else {
                assert_eq!(max, 0);
            }
        }
        assert_eq!(mulpdu(1460), 1454);
        assert_eq!(mulpdu(1448), 1442);
    }

    #[test]
    fn request_round_trip_rev2() {
        let repr = Repr {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            reject: false,
            revision: REVISION_2,
            enhanced: Some(EnhancedData { ird: 16, ord: 0x3fff, peer_to_peer: true, rtr: RtrSet::ALL }),
            private_data: b"hello",
        };
        let mut buffer = vec![0u8; repr.buffer_len()];
        repr.emit(&mut Frame::new_unchecked(&mut buffer)).unwrap();
        assert_eq!(&buffer[20..24], &[0xc0, 0x10, 0xff, 0xff]);
        assert_eq!(Repr::parse(&Frame::new_checked(&buffer[..]).unwrap()).unwrap(), repr);
    }

    #[test]
    fn emit_rejects_bad_reprs() {
        let mut buffer = [0u8; MAX_FRAME_LEN + 8];
        let big = [0u8; MAX_PRIVATE_DATA_LEN + 1];
        let mut repr = Repr {
            kind: FrameKind::Reply,
            markers: false,
            crc: false,
            reject: false,
            revision: 1,
            enhanced: None,
            private_data: &big,
        };
        let mut frame = Frame::new_unchecked(&mut buffer[..]);
        assert_eq!(repr.emit(&mut frame), Err(Error::Malformed(Malformed::PrivateDataTooLong(513))));
        repr.private_data = &big[..508];
        repr.enhanced = Some(EnhancedData::default());
        assert_eq!(repr.emit(&mut frame), Err(Error::Malformed(Malformed::EnhancedNeedsRevision2)));
        repr.revision = 2;
        repr.private_data = &big[..509]; // 509 + 4 enhanced octets
        assert_eq!(repr.emit(&mut frame), Err(Error::Malformed(Malformed::PrivateDataTooLong(513))));
        repr.private_data = &big[..508];
        assert_eq!(repr.emit(&mut frame), Ok(()));
        repr.enhanced = Some(EnhancedData { ird: 0x4000, ..EnhancedData::default() });
        assert_eq!(repr.emit(&mut frame), Err(Error::Malformed(Malformed::IrdOrdRange(0x4000))));
        repr.enhanced = None;
        repr.revision = 3;
        assert_eq!(repr.emit(&mut frame), Err(Error::Unsupported(Unsupported::Revision(3))));
        repr.revision = 1;
        assert_eq!(repr.emit(&mut Frame::new_unchecked(&mut buffer[..100])), Err(Error::Truncated));
    }

    #[test]
    fn parse_checks() {
        let mut buffer = [0u8; 24];
        buffer[..16].copy_from_slice(&KEY_REQUEST);
        buffer[17] = 2;
        buffer[16] = flag::ENHANCED | flag::REJECT;
        buffer[19] = 2; // two octets: too few for the enhanced block
        let frame = Frame::new_unchecked(&buffer[..]);
        assert_eq!(Repr::parse(&frame), Err(Error::Malformed(Malformed::EnhancedDataMissing)));
        buffer[17] = 1; // revision 1 ignores the flag
        let repr = Repr::parse(&Frame::new_unchecked(&buffer[..])).unwrap();
        assert_eq!((repr.enhanced, repr.private_data.len(), repr.reject), (None, 2, false));
        buffer[17] = 0;
        assert_eq!(Repr::parse(&Frame::new_unchecked(&buffer[..])), Err(Error::Unsupported(Unsupported::Revision(0))));
        buffer[17] = 1;
        buffer[18] = 2; // 514 octets announced
        assert_eq!(
            Repr::parse(&Frame::new_unchecked(&buffer[..])),
            Err(Error::Malformed(Malformed::PrivateDataTooLong(514)))
        );
        buffer[18] = 0;
        buffer[19] = 5; // announced but absent
        assert_eq!(Repr::parse(&Frame::new_unchecked(&buffer[..])), Err(Error::Truncated));
        buffer[0] = b'X';
        assert_eq!(Repr::parse(&Frame::new_unchecked(&buffer[..])), Err(Error::Malformed(Malformed::Key)));
    }

    #[test]
    fn fpdu_crc() {
        let repr = FpduRepr { ulpdu: &[1, 2, 3] };
        let mut buffer = vec![0xeeu8; repr.buffer_len()];
        repr.emit(&mut Fpdu::new_unchecked(&mut buffer), true).unwrap();
        assert_eq!(&buffer[..8], &[0, 3, 1, 2, 3, 0, 0, 0], "length, ULPDU, 3 pad octets");
        let crc = Crc32c::new().update(&buffer[..8]).finish_wire();
        assert_eq!(&buffer[8..], &crc);
        assert_eq!(FpduRepr::parse(&Fpdu::new_checked(&buffer[..]).unwrap(), true).unwrap(), repr);
        buffer[3] ^= 1;
        assert!(matches!(FpduRepr::parse(&Fpdu::new_unchecked(&buffer[..]), true), Err(Error::Crc { .. })));
        assert!(FpduRepr::parse(&Fpdu::new_unchecked(&buffer[..]), false).is_ok());
        repr.emit(&mut Fpdu::new_unchecked(&mut buffer), false).unwrap();
        assert_eq!(&buffer[8..], &[0, 0, 0, 0]);
    }
}
