//! The RDMAP Terminate message (RFC 5040 §4.8) and the error codes it
//! carries (RFC 5040 §7.1, RFC 5041 §7, RFC 5044 §8, RFC 6581 §9; IANA
//! "Remote Direct Data Placement (RDDP)" registries, RFC 6580).
//!
//! A Terminate is an untagged DDP segment on queue 2 whose payload is:
//!
//! ```text
//!   0       4       8              16 17 18 19                       31
//!  +-------+-------+---------------+--+--+--+-------------------------+
//!  | Layer | EType |  Error Code   |M |D |R |        Reserved         |
//!  +-------+-------+---------------+--+--+--+-------------------------+
//!  | DDP Segment Length (16)       |   present when D is set
//!  +-------------------------------+
//!  ~ Terminated DDP Header         ~   14 or 18 octets (by its T bit), when D is set
//!  ~ Terminated RDMA Header        ~   when R is set (the 28-octet Read Request header)
//! ```
//!
//! M: the DDP Segment Length is valid; D: the offending segment's DDP
//! header is included; R: its RDMAP header is included (sometimes called
//! "A"). siw sets R for protection errors on a Send too, with nothing after
//! the DDP header, so parsing takes whatever follows the DDP header as the
//! RDMAP header.
//!
//! Registered codes, checked against the IANA registry and siw's `iwarp.h`:
//!
//! | layer | etype | ecode | meaning |
//! |---|---|---|---|
//! | 0 RDMAP | 0 Local Catastrophic | any (we send 0x00) | |
//! | 0 | 1 Remote Protection | 0x00 0x01 0x02 0x03 0x04 0x09 0xff | invalid STag, base or bounds, access rights, STag not associated with RDMAP stream, TO wrap, STag cannot be invalidated, unspecified |
//! | 0 | 2 Remote Operation | 0x05 0x06 0x07 0x08 0x09 0xff | invalid RDMAP version, unexpected opcode, catastrophic (stream), catastrophic (global), STag cannot be invalidated, unspecified |
//! | 1 DDP | 0 Local Catastrophic | 0x00 | |
//! | 1 | 1 Tagged Buffer | 0x00 0x01 0x02 0x03 0x04 | invalid STag, base or bounds, STag not associated with DDP stream, TO wrap, invalid DDP version |
//! | 1 | 2 Untagged Buffer | 0x01 0x02 0x03 0x04 0x05 0x06 | invalid QN, invalid MSN (no buffer), invalid MSN (range), invalid MO, message too long, invalid DDP version |
//! | 2 LLP | 0 MPA | 0x01 0x02 0x03 0x04 | TCP connection lost, CRC error, marker/ULPDU length mismatch, invalid request/reply frame |
//! | 2 | 0 MPA (RFC 6581) | 0x05 0x06 0x07 | local catastrophic, insufficient IRD, no matching RTR |
//!
//! The error type decides the verbs event the device raises when it
//! receives a Terminate ([`ErrorClass`], docs/architecture.md §5).

use core::fmt;

use thiserror::Error;

use super::{read_be16, read_u8, write_be16, write_slice, write_u8};
use crate::wire::ddp;

/// Terminate errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Error {
    #[error("Terminate message truncated")]
    Truncated,
    #[error("malformed Terminate: {0}")]
    Malformed(Malformed),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Malformed {
    #[error("a DDP segment length needs the DDP header it describes")]
    SegmentLengthWithoutDdpHeader,
    #[error("a copied DDP header of {0} octets matches neither 14 (tagged) nor 18 (untagged)")]
    DdpHeaderLength(usize),
    #[error("layer {layer} or error type {etype} does not fit in four bits")]
    FieldRange { layer: u8, etype: u8 },
}

/// The layer that detected the error.
pub mod layer {
    pub const RDMAP: u8 = 0;
    pub const DDP: u8 = 1;
    /// The lower layer protocol: MPA/TCP.
    pub const LLP: u8 = 2;
}

/// What kind of verbs event a received Terminate maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// Remote protection / tagged buffer errors → IB_EVENT_QP_ACCESS_ERR.
    Protection,
    /// Remote operation / untagged buffer errors → IB_EVENT_QP_REQ_ERR.
    Operation,
    /// Local catastrophic and LLP (MPA) errors, and anything unregistered → IB_EVENT_QP_FATAL.
    Catastrophic,
}

/// Classifies a (layer, error type) pair; unknown pairs are catastrophic.
pub const fn etype_class(layer: u8, etype: u8) -> ErrorClass {
    match (layer, etype) {
        (layer::RDMAP | layer::DDP, 1) => ErrorClass::Protection,
        (layer::RDMAP | layer::DDP, 2) => ErrorClass::Operation,
        _ => ErrorClass::Catastrophic,
    }
}

/// A Terminate error code: every registered (layer, etype, ecode), by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TermCode {
    RdmapLocalCatastrophic,
    RdmapInvalidStag,
    RdmapBaseOrBoundsViolation,
    RdmapAccessRightsViolation,
    RdmapStagNotAssociated,
    RdmapToWrap,
    RdmapProtectionStagCannotBeInvalidated,
    RdmapProtectionUnspecified,
    RdmapInvalidVersion,
    RdmapUnexpectedOpcode,
    RdmapCatastrophicStream,
    RdmapCatastrophicGlobal,
    RdmapOperationStagCannotBeInvalidated,
    RdmapOperationUnspecified,
    DdpLocalCatastrophic,
    DdpTaggedInvalidStag,
    DdpTaggedBaseOrBoundsViolation,
    DdpTaggedStagNotAssociated,
    DdpTaggedToWrap,
    DdpTaggedInvalidVersion,
    DdpUntaggedInvalidQn,
    DdpUntaggedInvalidMsnNoBuffer,
    DdpUntaggedInvalidMsnRange,
    DdpUntaggedInvalidMo,
    DdpUntaggedMessageTooLong,
    DdpUntaggedInvalidVersion,
    LlpConnectionLost,
    LlpCrcError,
    LlpMarkerUlpduLengthMismatch,
    LlpInvalidRequestReply,
    LlpLocalCatastrophic,
    LlpInsufficientIrd,
    LlpNoMatchingRtr,
    /// A triple outside the registries, kept verbatim.
    Other {
        layer: u8,
        etype: u8,
        ecode: u8,
    },
}

/// (code, layer, etype, ecode, name): the single source for both directions.
#[rustfmt::skip]
const REGISTRY: [(TermCode, u8, u8, u8, &str); 33] = {
    use layer::{DDP, LLP, RDMAP};
    use TermCode::*;
    [
        (RdmapLocalCatastrophic, RDMAP, 0, 0x00, "RDMAP local catastrophic error"),
        (RdmapInvalidStag, RDMAP, 1, 0x00, "RDMAP remote protection: invalid STag"),
        (RdmapBaseOrBoundsViolation, RDMAP, 1, 0x01, "RDMAP remote protection: base or bounds violation"),
        (RdmapAccessRightsViolation, RDMAP, 1, 0x02, "RDMAP remote protection: access rights violation"),
        (RdmapStagNotAssociated, RDMAP, 1, 0x03, "RDMAP remote protection: STag not associated with RDMAP stream"),
        (RdmapToWrap, RDMAP, 1, 0x04, "RDMAP remote protection: TO wrap"),
        (RdmapProtectionStagCannotBeInvalidated, RDMAP, 1, 0x09, "RDMAP remote protection: STag cannot be invalidated"),
        (RdmapProtectionUnspecified, RDMAP, 1, 0xff, "RDMAP remote protection: unspecified error"),
        (RdmapInvalidVersion, RDMAP, 2, 0x05, "RDMAP remote operation: invalid RDMAP version"),
        (RdmapUnexpectedOpcode, RDMAP, 2, 0x06, "RDMAP remote operation: unexpected opcode"),
        (RdmapCatastrophicStream, RDMAP, 2, 0x07, "RDMAP remote operation: catastrophic error, localized to RDMAP stream"),
        (RdmapCatastrophicGlobal, RDMAP, 2, 0x08, "RDMAP remote operation: catastrophic error, global"),
        (RdmapOperationStagCannotBeInvalidated, RDMAP, 2, 0x09, "RDMAP remote operation: STag cannot be invalidated"),
        (RdmapOperationUnspecified, RDMAP, 2, 0xff, "RDMAP remote operation: unspecified error"),
        (DdpLocalCatastrophic, DDP, 0, 0x00, "DDP local catastrophic error"),
        (DdpTaggedInvalidStag, DDP, 1, 0x00, "DDP tagged buffer: invalid STag"),
        (DdpTaggedBaseOrBoundsViolation, DDP, 1, 0x01, "DDP tagged buffer: base or bounds violation"),
        (DdpTaggedStagNotAssociated, DDP, 1, 0x02, "DDP tagged buffer: STag not associated with DDP stream"),
        (DdpTaggedToWrap, DDP, 1, 0x03, "DDP tagged buffer: TO wrap"),
        (DdpTaggedInvalidVersion, DDP, 1, 0x04, "DDP tagged buffer: invalid DDP version"),
        (DdpUntaggedInvalidQn, DDP, 2, 0x01, "DDP untagged buffer: invalid QN"),
        (DdpUntaggedInvalidMsnNoBuffer, DDP, 2, 0x02, "DDP untagged buffer: invalid MSN, no buffer available"),
        (DdpUntaggedInvalidMsnRange, DDP, 2, 0x03, "DDP untagged buffer: invalid MSN, MSN range is not valid"),
        (DdpUntaggedInvalidMo, DDP, 2, 0x04, "DDP untagged buffer: invalid MO"),
        (DdpUntaggedMessageTooLong, DDP, 2, 0x05, "DDP untagged buffer: message too long for available buffer"),
        (DdpUntaggedInvalidVersion, DDP, 2, 0x06, "DDP untagged buffer: invalid DDP version"),
        (LlpConnectionLost, LLP, 0, 0x01, "MPA: TCP connection closed, terminated or lost"),
        (LlpCrcError, LLP, 0, 0x02, "MPA: CRC error"),
        (LlpMarkerUlpduLengthMismatch, LLP, 0, 0x03, "MPA: marker and ULPDU length field mismatch"),
        (LlpInvalidRequestReply, LLP, 0, 0x04, "MPA: invalid MPA request or reply frame"),
        (LlpLocalCatastrophic, LLP, 0, 0x05, "MPA: local catastrophic error"),
        (LlpInsufficientIrd, LLP, 0, 0x06, "MPA: insufficient IRD resources"),
        (LlpNoMatchingRtr, LLP, 0, 0x07, "MPA: no matching RTR option"),
    ]
};

impl TermCode {
    /// Every registered code (the registry's `(code, name)` in order).
    pub fn registry() -> impl Iterator<Item = (TermCode, &'static str)> {
        REGISTRY.iter().map(|&(code, .., name)| (code, name))
    }

    /// Every registered code (all but [`TermCode::Other`]).
    pub fn registered() -> impl Iterator<Item = TermCode> {
        REGISTRY.iter().map(|&(code, ..)| code)
    }

    /// The code for a wire triple; unregistered triples become `Other`.
    pub fn from_fields(layer: u8, etype: u8, ecode: u8) -> TermCode {
        REGISTRY
            .iter()
            .find(|&&(_, l, t, c, _)| (l, t, c) == (layer, etype, ecode))
            .map_or(TermCode::Other { layer, etype, ecode }, |&(code, ..)| code)
    }

    /// The registered code for a triple, or why the triple is not one of
    /// RFC 5040's (layer), RFC 5040/5041/5044 and RFC 6581's (etype,
    /// ecode) as registered with IANA (RFC 6580). For fault injection:
    /// only codes a conforming peer can send are accepted.
    pub fn registered_code(layer: u8, etype: u8, ecode: u8) -> Result<TermCode, String> {
        let name = match layer {
            layer::RDMAP => "RDMAP",
            layer::DDP => "DDP",
            layer::LLP => "LLP",
            _ => return Err(format!("layer {layer} is none of 0 (RDMAP), 1 (DDP), 2 (LLP)")),
        };
        let known = |t: u8| REGISTRY.iter().filter(move |&&(_, l, et, ..)| l == layer && et == t);
        if known(etype).next().is_none() {
            let types: Vec<String> = (0..=15u8).filter(|&t| known(t).next().is_some()).map(|t| t.to_string()).collect();
            return Err(format!("{name} (layer {layer}) has no error type {etype} (it has {})", types.join(", ")));
        }
        match TermCode::from_fields(layer, etype, ecode) {
            TermCode::Other { .. } => {
                let codes: Vec<String> = known(etype).map(|&(.., c, _)| format!("{c:#04x}")).collect();
                Err(format!("{name} error type {etype} has no error code {ecode:#04x} (it has {})", codes.join(", ")))
            }
            code => Ok(code),
        }
    }

    /// (layer, etype, ecode) as carried on the wire.
    pub fn fields(self) -> (u8, u8, u8) {
        match self {
            TermCode::Other { layer, etype, ecode } => (layer, etype, ecode),
            named => REGISTRY
                .iter()
                .find(|&&(code, ..)| code == named)
                .map_or((layer::RDMAP, 0, 0), |&(_, l, t, c, _)| (l, t, c)),
        }
    }

    pub fn layer(self) -> u8 {
        self.fields().0
    }

    pub fn etype(self) -> u8 {
        self.fields().1
    }

    pub fn ecode(self) -> u8 {
        self.fields().2
    }

    /// The verbs-event class of this code's error type.
    pub fn etype_class(self) -> ErrorClass {
        let (layer, etype, _) = self.fields();
        etype_class(layer, etype)
    }

    /// Human-readable name; for `Other`, the name of its error type.
    pub fn description(self) -> &'static str {
        if let Some(&(.., name)) = REGISTRY.iter().find(|&&(code, ..)| code == self) {
            return name;
        }
        match self.fields() {
            (layer::RDMAP, 0, _) => "RDMAP local catastrophic error",
            (layer::RDMAP, 1, _) => "RDMAP remote protection error",
            (layer::RDMAP, 2, _) => "RDMAP remote operation error",
            (layer::DDP, 0, _) => "DDP local catastrophic error",
            (layer::DDP, 1, _) => "DDP tagged buffer error",
            (layer::DDP, 2, _) => "DDP untagged buffer error",
            (layer::LLP, 0, _) => "MPA error",
            _ => "unregistered error",
        }
    }
}

impl fmt::Display for TermCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (layer, etype, ecode) = self.fields();
        write!(f, "{} ({layer:#x}/{etype:#x}/{ecode:#04x})", self.description())
    }
}

/// Length of the Terminate Control field.
pub const CONTROL_LEN: usize = 4;
/// Length of the DDP Segment Length field.
pub const SEGMENT_LENGTH_LEN: usize = 2;

mod field {
    use core::ops::Range;

    pub const LAYER_ETYPE: usize = 0;
    pub const ECODE: usize = 1;
    pub const HEADER_CONTROL: usize = 2;
    pub const RESERVED: usize = 3;
    pub const SEGMENT_LENGTH: Range<usize> = 4..6;
    pub const DDP_HEADER: usize = 6;
}

mod header_control {
    pub const SEGMENT_LENGTH_VALID: u8 = 0x80;
    pub const DDP_HEADER: u8 = 0x40;
    pub const RDMAP_HEADER: u8 = 0x20;
}

fn copied_ddp_header_len(first_octet: u8) -> usize {
    if first_octet & 0x80 != 0 {
        ddp::TAGGED_HEADER_LEN
    } else {
        ddp::UNTAGGED_HEADER_LEN
    }
}

/// A view of a Terminate header (the payload of a Terminate segment).
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// The control field and, when D is set, the copied DDP header are present.
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < self.headers_start() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn layer(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::LAYER_ETYPE) >> 4
    }

    pub fn etype(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::LAYER_ETYPE) & 0x0f
    }

    pub fn ecode(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::ECODE)
    }

    pub fn code(&self) -> TermCode {
        TermCode::from_fields(self.layer(), self.etype(), self.ecode())
    }

    fn header_control(&self, mask: u8) -> bool {
        read_u8(self.buffer.as_ref(), field::HEADER_CONTROL) & mask != 0
    }

    /// M.
    pub fn segment_length_valid(&self) -> bool {
        self.header_control(header_control::SEGMENT_LENGTH_VALID)
    }

    /// D.
    pub fn ddp_header_included(&self) -> bool {
        self.header_control(header_control::DDP_HEADER)
    }

    /// R.
    pub fn rdmap_header_included(&self) -> bool {
        self.header_control(header_control::RDMAP_HEADER)
    }

    pub fn ddp_segment_length(&self) -> u16 {
        read_be16(self.buffer.as_ref(), field::SEGMENT_LENGTH)
    }

    fn ddp_header_len(&self) -> usize {
        if self.ddp_header_included() {
            copied_ddp_header_len(read_u8(self.buffer.as_ref(), field::DDP_HEADER))
        } else {
            0
        }
    }

    /// Offset where the RDMAP header (if any) starts.
    fn headers_start(&self) -> usize {
        if self.ddp_header_included() {
            field::DDP_HEADER + self.ddp_header_len()
        } else {
            CONTROL_LEN
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The copied DDP header (empty unless D is set).
    pub fn ddp_header(&self) -> &'a [u8] {
        let buffer: &'a [u8] = self.buffer.as_ref();
        let len = self.ddp_header_len();
        buffer.get(field::DDP_HEADER..field::DDP_HEADER + len).filter(|_| len > 0).unwrap_or(&[])
    }

    /// Everything after the copied DDP header (the RDMAP header, when R is set).
    pub fn rdmap_header(&self) -> &'a [u8] {
        let buffer: &'a [u8] = self.buffer.as_ref();
        buffer.get(self.headers_start()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes layer, etype, ecode; `FieldRange` if layer or etype exceed four bits.
    pub fn set_code(&mut self, code: TermCode) -> Result<(), Error> {
        let (layer, etype, ecode) = code.fields();
        if layer > 0x0f || etype > 0x0f {
            return Err(Error::Malformed(Malformed::FieldRange { layer, etype }));
        }
        write_u8(self.buffer.as_mut(), field::LAYER_ETYPE, (layer << 4) | etype);
        write_u8(self.buffer.as_mut(), field::ECODE, ecode);
        Ok(())
    }

    /// Writes M, D and R, clearing the reserved bits.
    pub fn set_header_control(&mut self, segment_length_valid: bool, ddp_header: bool, rdmap_header: bool) {
        let bit = |set: bool, mask: u8| if set { mask } else { 0 };
        let value = bit(segment_length_valid, header_control::SEGMENT_LENGTH_VALID)
            | bit(ddp_header, header_control::DDP_HEADER)
            | bit(rdmap_header, header_control::RDMAP_HEADER);
        write_u8(self.buffer.as_mut(), field::HEADER_CONTROL, value);
        write_u8(self.buffer.as_mut(), field::RESERVED, 0);
    }

    pub fn set_ddp_segment_length(&mut self, value: u16) {
        write_be16(self.buffer.as_mut(), field::SEGMENT_LENGTH, value);
    }
}

/// A parsed Terminate header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr<'a> {
    pub code: TermCode,
    /// M: the length of the offending DDP segment. Travels in front of the
    /// DDP header, so it needs `ddp_header`.
    pub ddp_segment_length: Option<u16>,
    /// D: the offending segment's DDP header (14 or 18 octets).
    pub ddp_header: Option<&'a [u8]>,
    /// R: the offending segment's RDMAP header (28 octets for a Read
    /// Request; may be empty, as siw sends it for Sends).
    pub rdmap_header: Option<&'a [u8]>,
}

impl<'a> Repr<'a> {
    /// A Terminate carrying only `code`.
    pub const fn new(code: TermCode) -> Self {
        Repr { code, ddp_segment_length: None, ddp_header: None, rdmap_header: None }
    }

    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Self, Error> {
        packet.check_len()?;
        let ddp_included = packet.ddp_header_included();
        Ok(Repr {
            code: packet.code(),
            ddp_segment_length: (ddp_included && packet.segment_length_valid()).then(|| packet.ddp_segment_length()),
            ddp_header: ddp_included.then(|| packet.ddp_header()),
            rdmap_header: packet.rdmap_header_included().then(|| packet.rdmap_header()),
        })
    }

    /// The verbs-event class of the carried error type.
    pub fn etype_class(&self) -> ErrorClass {
        self.code.etype_class()
    }

    pub fn buffer_len(&self) -> usize {
        CONTROL_LEN
            + self.ddp_header.map_or(0, |header| SEGMENT_LENGTH_LEN + header.len())
            + self.rdmap_header.map_or(0, <[u8]>::len)
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<(), Error> {
        if let Some(header) = self.ddp_header {
            let expected = header.first().map_or(0, |&octet| copied_ddp_header_len(octet));
            if header.len() != expected {
                return Err(Error::Malformed(Malformed::DdpHeaderLength(header.len())));
            }
        } else if self.ddp_segment_length.is_some() {
            return Err(Error::Malformed(Malformed::SegmentLengthWithoutDdpHeader));
        }
        if packet.buffer.as_ref().len() < self.buffer_len() {
            return Err(Error::Truncated);
        }
        packet.set_code(self.code)?;
        packet.set_header_control(
            self.ddp_segment_length.is_some(),
            self.ddp_header.is_some(),
            self.rdmap_header.is_some(),
        );
        let mut at = CONTROL_LEN;
        if let Some(header) = self.ddp_header {
            packet.set_ddp_segment_length(self.ddp_segment_length.unwrap_or(0));
            write_slice(packet.buffer.as_mut(), field::DDP_HEADER, header);
            at = field::DDP_HEADER + header.len();
        }
        if let Some(header) = self.rdmap_header {
            write_slice(packet.buffer.as_mut(), at, header);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_registered_triples_are_codes() {
        for code in TermCode::registered() {
            let (l, t, c) = code.fields();
            assert_eq!(TermCode::registered_code(l, t, c), Ok(code));
        }
        assert_eq!(TermCode::registry().count(), 33);
        let err = |l, t, c| TermCode::registered_code(l, t, c).unwrap_err();
        assert!(err(3, 0, 0).contains("layer 3"), "{}", err(3, 0, 0));
        assert!(err(2, 1, 0).contains("LLP (layer 2) has no error type 1 (it has 0)"), "{}", err(2, 1, 0));
        assert!(err(1, 2, 0).contains("no error code 0x00 (it has 0x01, 0x02"), "{}", err(1, 2, 0));
        assert!(err(0, 0, 0xff).contains("0x00"), "{}", err(0, 0, 0xff));
    }

    #[test]
    fn registry_is_consistent() {
        let codes: Vec<TermCode> = TermCode::registered().collect();
        assert_eq!(codes.len(), 33);
        for (index, &code) in codes.iter().enumerate() {
            let (layer, etype, ecode) = code.fields();
            assert_eq!(TermCode::from_fields(layer, etype, ecode), code, "{code}");
            assert!(codes[..index].iter().all(|&other| other.fields() != code.fields()), "duplicate {code}");
        }
    }

    #[test]
    fn classes() {
        assert_eq!(TermCode::RdmapAccessRightsViolation.etype_class(), ErrorClass::Protection);
        assert_eq!(TermCode::DdpTaggedToWrap.etype_class(), ErrorClass::Protection);
        assert_eq!(TermCode::RdmapUnexpectedOpcode.etype_class(), ErrorClass::Operation);
        assert_eq!(TermCode::DdpUntaggedInvalidMsnNoBuffer.etype_class(), ErrorClass::Operation);
        assert_eq!(TermCode::LlpCrcError.etype_class(), ErrorClass::Catastrophic);
        assert_eq!(TermCode::RdmapLocalCatastrophic.etype_class(), ErrorClass::Catastrophic);
        let siw_catastrophic = TermCode::from_fields(0, 0, 0xff);
        assert_eq!(siw_catastrophic, TermCode::Other { layer: 0, etype: 0, ecode: 0xff });
        assert_eq!(siw_catastrophic.etype_class(), ErrorClass::Catastrophic);
        assert_eq!(siw_catastrophic.description(), "RDMAP local catastrophic error");
        assert_eq!(TermCode::from_fields(9, 9, 9).etype_class(), ErrorClass::Catastrophic);
    }

    #[test]
    fn siw_style_send_protection_error() {
        // siw: R set for a Send, only the 18-octet DDP header follows.
        let mut buffer = vec![0x01, 0x00, 0xe0, 0x00, 0x00, 0x10];
        buffer.extend_from_slice(&[0x41, 0x44, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]);
        let repr = Repr::parse(&Packet::new_checked(&buffer[..]).unwrap()).unwrap();
        assert_eq!(repr.code, TermCode::RdmapInvalidStag);
        assert_eq!(repr.ddp_segment_length, Some(16));
        assert_eq!(repr.ddp_header.map(<[u8]>::len), Some(18));
        assert_eq!(repr.rdmap_header, Some(&[][..]));
        let mut out = vec![0u8; repr.buffer_len()];
        repr.emit(&mut Packet::new_unchecked(&mut out)).unwrap();
        assert_eq!(out, buffer);
    }

    #[test]
    fn emit_validation() {
        let mut out = [0u8; 64];
        let mut repr = Repr { ddp_segment_length: Some(1), ..Repr::new(TermCode::LlpCrcError) };
        assert_eq!(
            repr.emit(&mut Packet::new_unchecked(&mut out[..])),
            Err(Error::Malformed(Malformed::SegmentLengthWithoutDdpHeader))
        );
        repr.ddp_header = Some(&[0x80; 18]);
        assert_eq!(
            repr.emit(&mut Packet::new_unchecked(&mut out[..])),
            Err(Error::Malformed(Malformed::DdpHeaderLength(18)))
        );
        let repr = Repr::new(TermCode::Other { layer: 16, etype: 0, ecode: 0 });
        assert!(matches!(
            repr.emit(&mut Packet::new_unchecked(&mut out[..])),
            Err(Error::Malformed(Malformed::FieldRange { .. }))
        ));
        let repr = Repr::new(TermCode::LlpCrcError);
        assert_eq!(repr.emit(&mut Packet::new_unchecked(&mut out[..3])), Err(Error::Truncated));
        repr.emit(&mut Packet::new_unchecked(&mut out[..4])).unwrap();
        assert_eq!(&out[..4], &[0x20, 0x02, 0x00, 0x00]);
    }
}
