//! RDMAP, the RDMA Protocol (RFC 5040 §4), on top of DDP.
//!
//! RDMAP owns DDP's RsvdULP fields: `RsvdULP[0:7]` is the RDMAP control
//! octet (`RV:2 | Rsvd:2 | Opcode:4`, RV = 1) and, in untagged segments,
//! `RsvdULP[8:39]` carries the Invalidate STag of Send with Invalidate (zero,
//! and ignored on receipt, otherwise). An RDMA Read Request carries a 28-octet
//! [`ReadRequestRepr`] after its DDP header; a Terminate carries the header
//! of [`super::terminate`].
//!
//! [`Repr`] covers the DDP+RDMAP header present in every segment. Which
//! buffer model and queue each opcode uses comes from one table, [`OPCODES`],
//! read by both `parse` and `emit`.

use thiserror::Error;

use super::ddp::{self, BufferModel};
use super::terminate::TermCode;
use super::{read_be32, read_be64, write_be32, write_be64};

/// The RDMAP version of RFC 5040.
pub const VERSION: u8 = 1;
/// Length of the RDMA Read Request header.
pub const READ_REQUEST_LEN: usize = 28;

/// Untagged DDP queues used by RDMAP (RFC 5040 §5.1).
pub mod queue {
    pub const SEND: u32 = 0;
    pub const READ_REQUEST: u32 = 1;
    pub const TERMINATE: u32 = 2;
}

/// RDMAP message types.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Opcode {
    RdmaWrite = 0,
    RdmaReadRequest = 1,
    RdmaReadResponse = 2,
    Send = 3,
    SendInvalidate = 4,
    SendSolicited = 5,
    SendSolicitedInvalidate = 6,
    Terminate = 7,
}

/// How an opcode travels over DDP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tagged,
    Untagged { queue: u32 },
}

/// Every RDMAP opcode and its DDP transport; opcodes 8..=15 are reserved.
pub const OPCODES: [(Opcode, Transport); 8] = [
    (Opcode::RdmaWrite, Transport::Tagged),
    (Opcode::RdmaReadRequest, Transport::Untagged { queue: queue::READ_REQUEST }),
    (Opcode::RdmaReadResponse, Transport::Tagged),
    (Opcode::Send, Transport::Untagged { queue: queue::SEND }),
    (Opcode::SendInvalidate, Transport::Untagged { queue: queue::SEND }),
    (Opcode::SendSolicited, Transport::Untagged { queue: queue::SEND }),
    (Opcode::SendSolicitedInvalidate, Transport::Untagged { queue: queue::SEND }),
    (Opcode::Terminate, Transport::Untagged { queue: queue::TERMINATE }),
];

impl Opcode {
    /// The opcode with wire value `value` (low four bits of the control octet).
    pub fn from_wire(value: u8) -> Option<Opcode> {
        OPCODES.iter().map(|&(opcode, _)| opcode).find(|&opcode| opcode as u8 == value)
    }

    pub fn transport(self) -> Transport {
        OPCODES.iter().find(|&&(opcode, _)| opcode == self).map_or(Transport::Tagged, |&(_, transport)| transport)
    }

    /// Send with Invalidate and Send with Solicited Event and Invalidate.
    pub const fn carries_invalidate_stag(self) -> bool {
        matches!(self, Opcode::SendInvalidate | Opcode::SendSolicitedInvalidate)
    }

    /// The Send variants that ask for a solicited event at the receiver.
    pub const fn solicited_event(self) -> bool {
        matches!(self, Opcode::SendSolicited | Opcode::SendSolicitedInvalidate)
    }

    /// The RDMAP control octet: RV = 1, reserved bits zero.
    pub const fn control_octet(self) -> u8 {
        (VERSION << 6) | self as u8
    }
}

/// RDMAP header errors. [`Error::term_code`] names the TERMINATE to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Error {
    #[error("DDP/RDMAP header truncated")]
    Truncated,
    #[error("malformed RDMAP header: {0}")]
    Malformed(Malformed),
    #[error("unsupported: {0}")]
    Unsupported(Unsupported),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Malformed {
    #[error("{opcode:?} with DDP tagged flag {tagged}")]
    BufferModel { opcode: Opcode, tagged: bool },
    #[error("{opcode:?} on DDP queue {queue}")]
    QueueNumber { opcode: Opcode, queue: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Unsupported {
    #[error("DDP version {version}")]
    DdpVersion { version: u8, tagged: bool },
    #[error("RDMAP version {0}")]
    RdmapVersion(u8),
    #[error("RDMAP opcode {0:#x}")]
    Opcode(u8),
}

impl From<ddp::Error> for Error {
    fn from(error: ddp::Error) -> Self {
        match error {
            ddp::Error::Truncated => Error::Truncated,
            ddp::Error::Unsupported(ddp::Unsupported::Version { version, tagged }) => {
                Error::Unsupported(Unsupported::DdpVersion { version, tagged })
            }
        }
    }
}

impl Error {
    /// The TERMINATE code reporting this error (as siw reports the same errors).
    pub fn term_code(&self) -> TermCode {
        match self {
            Error::Unsupported(Unsupported::DdpVersion { tagged: true, .. }) => TermCode::DdpTaggedInvalidVersion,
            Error::Unsupported(Unsupported::DdpVersion { tagged: false, .. }) => TermCode::DdpUntaggedInvalidVersion,
            Error::Unsupported(Unsupported::RdmapVersion(_)) => TermCode::RdmapInvalidVersion,
            Error::Unsupported(Unsupported::Opcode(_)) | Error::Malformed(Malformed::BufferModel { .. }) => {
                TermCode::RdmapUnexpectedOpcode
            }
            Error::Malformed(Malformed::QueueNumber { .. }) => TermCode::DdpUntaggedInvalidQn,
            // A segment too short for its own headers has no dedicated code.
            Error::Truncated => TermCode::RdmapCatastrophicStream,
        }
    }
}

/// Where the segment's payload is placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// RDMA Write and Read Response: the data sink buffer.
    Tagged { stag: u32, offset: u64 },
    /// Sends, Read Request, Terminate: message `msn` of the opcode's queue,
    /// at message offset `offset`. `invalidate_stag` is zero unless the
    /// opcode carries one.
    Untagged { msn: u32, offset: u32, invalidate_stag: u32 },
}

/// The DDP+RDMAP header of one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub opcode: Opcode,
    /// DDP L: last segment of the message.
    pub last: bool,
    pub placement: Placement,
}

impl Repr {
    /// Checks, in siw's order: DDP version, RDMAP version, opcode, buffer
    /// model and queue number against [`OPCODES`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &ddp::Packet<&T>) -> Result<Self, Error> {
        let ddp = ddp::Repr::parse(packet)?;
        let version = ddp.ulp_control >> 6;
        if version != VERSION {
            return Err(Error::Unsupported(Unsupported::RdmapVersion(version)));
        }
        let value = ddp.ulp_control & 0x0f;
        let opcode = Opcode::from_wire(value).ok_or(Error::Unsupported(Unsupported::Opcode(value)))?;
        let placement = match (opcode.transport(), ddp.buffer_model) {
            (Transport::Tagged, BufferModel::Tagged { stag, offset }) => Placement::Tagged { stag, offset },
            (Transport::Untagged { queue }, BufferModel::Untagged { ulp_word, queue: received, msn, offset }) => {
                if received != queue {
                    return Err(Error::Malformed(Malformed::QueueNumber { opcode, queue: received }));
                }
                let invalidate_stag = if opcode.carries_invalidate_stag() { ulp_word } else { 0 };
                Placement::Untagged { msn, offset, invalidate_stag }
            }
            (_, model) => {
                let tagged = matches!(model, BufferModel::Tagged { .. });
                return Err(Error::Malformed(Malformed::BufferModel { opcode, tagged }));
            }
        };
        Ok(Repr { opcode, last: ddp.last, placement })
    }

    /// The STag to invalidate, for the two Send with Invalidate opcodes.
    pub fn invalidate_stag(&self) -> Option<u32> {
        match self.placement {
            Placement::Untagged { invalidate_stag, .. } if self.opcode.carries_invalidate_stag() => {
                Some(invalidate_stag)
            }
            _ => None,
        }
    }

    /// DDP header length (the RDMAP control fields live inside it).
    pub fn buffer_len(&self) -> usize {
        match self.opcode.transport() {
            Transport::Tagged => ddp::TAGGED_HEADER_LEN,
            Transport::Untagged { .. } => ddp::UNTAGGED_HEADER_LEN,
        }
    }

    /// Writes the header; `Malformed` if `placement` does not fit the opcode.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ddp::Packet<T>) -> Result<(), Error> {
        let buffer_model = match (self.opcode.transport(), self.placement) {
            (Transport::Tagged, Placement::Tagged { stag, offset }) => BufferModel::Tagged { stag, offset },
            (Transport::Untagged { queue }, Placement::Untagged { msn, offset, invalidate_stag }) => {
                let ulp_word = if self.opcode.carries_invalidate_stag() { invalidate_stag } else { 0 };
                BufferModel::Untagged { ulp_word, queue, msn, offset }
            }
            (_, placement) => {
                let tagged = matches!(placement, Placement::Tagged { .. });
                return Err(Error::Malformed(Malformed::BufferModel { opcode: self.opcode, tagged }));
            }
        };
        let ddp = ddp::Repr { last: self.last, ulp_control: self.opcode.control_octet(), buffer_model };
        Ok(ddp.emit(packet)?)
    }
}

mod read_request_field {
    use core::ops::Range;

    pub const SINK_STAG: Range<usize> = 0..4;
    pub const SINK_OFFSET: Range<usize> = 4..12;
    pub const SIZE: Range<usize> = 12..16;
    pub const SOURCE_STAG: Range<usize> = 16..20;
    pub const SOURCE_OFFSET: Range<usize> = 20..28;
}

/// A view of the RDMA Read Request header (the payload of a Read Request segment).
#[derive(Debug, Clone)]
pub struct ReadRequestPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ReadRequestPacket<T> {
    pub const fn new_unchecked(buffer: T) -> Self {
        ReadRequestPacket { buffer }
    }

    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < READ_REQUEST_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Data Sink STag: where the Read Response data goes (the requester's buffer).
    pub fn sink_stag(&self) -> u32 {
        read_be32(self.buffer.as_ref(), read_request_field::SINK_STAG)
    }

    pub fn sink_offset(&self) -> u64 {
        read_be64(self.buffer.as_ref(), read_request_field::SINK_OFFSET)
    }

    /// RDMA Read Message Size in octets.
    pub fn size(&self) -> u32 {
        read_be32(self.buffer.as_ref(), read_request_field::SIZE)
    }

    /// Data Source STag: the responder's buffer to read from.
    pub fn source_stag(&self) -> u32 {
        read_be32(self.buffer.as_ref(), read_request_field::SOURCE_STAG)
    }

    pub fn source_offset(&self) -> u64 {
        read_be64(self.buffer.as_ref(), read_request_field::SOURCE_OFFSET)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReadRequestPacket<T> {
    pub fn set_sink_stag(&mut self, value: u32) {
        write_be32(self.buffer.as_mut(), read_request_field::SINK_STAG, value);
    }

    pub fn set_sink_offset(&mut self, value: u64) {
        write_be64(self.buffer.as_mut(), read_request_field::SINK_OFFSET, value);
    }

    pub fn set_size(&mut self, value: u32) {
        write_be32(self.buffer.as_mut(), read_request_field::SIZE, value);
    }

    pub fn set_source_stag(&mut self, value: u32) {
        write_be32(self.buffer.as_mut(), read_request_field::SOURCE_STAG, value);
    }

    pub fn set_source_offset(&mut self, value: u64) {
        write_be64(self.buffer.as_mut(), read_request_field::SOURCE_OFFSET, value);
    }
}

/// A parsed RDMA Read Request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequestRepr {
    pub sink_stag: u32,
    pub sink_offset: u64,
    pub size: u32,
    pub source_stag: u32,
    pub source_offset: u64,
}

impl ReadRequestRepr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &ReadRequestPacket<&T>) -> Result<Self, Error> {
        packet.check_len()?;
        Ok(ReadRequestRepr {
            sink_stag: packet.sink_stag(),
            sink_offset: packet.sink_offset(),
            size: packet.size(),
            source_stag: packet.source_stag(),
            source_offset: packet.source_offset(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }

    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut ReadRequestPacket<T>) -> Result<(), Error> {
        packet.check_len()?;
        packet.set_sink_stag(self.sink_stag);
        packet.set_sink_offset(self.sink_offset);
        packet.set_size(self.size);
        packet.set_source_stag(self.source_stag);
        packet.set_source_offset(self.source_offset);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;

    #[test]
    fn opcode_table_is_indexed_by_wire_value() {
        for (index, &(opcode, transport)) in OPCODES.iter().enumerate() {
            assert_eq!(opcode as usize, index);
            assert_eq!(Opcode::from_wire(opcode as u8), Some(opcode));
            assert_eq!(opcode.transport(), transport);
        }
        assert!((8..=15).all(|value| Opcode::from_wire(value).is_none()));
    }

    #[test]
    fn send_invalidate_golden() {
        let repr = Repr {
            opcode: Opcode::SendSolicitedInvalidate,
            last: true,
            placement: Placement::Untagged { msn: 7, offset: 0x100, invalidate_stag: 0xdead_beef },
        };
        let mut buffer = [0u8; 18];
        repr.emit(&mut ddp::Packet::new_unchecked(&mut buffer[..])).unwrap();
        #[rustfmt::skip]
        assert_eq!(buffer, [
            0x41, 0x46, 0xde, 0xad, 0xbe, 0xef, // control, RDMAP control (RV 1, opcode 6), inval STag
            0, 0, 0, 0,                         // QN 0
            0, 0, 0, 7,                         // MSN
            0, 0, 1, 0,                         // MO
        ]);
        let parsed = Repr::parse(&ddp::Packet::new_checked(&buffer[..]).unwrap()).unwrap();
        assert_eq!(parsed, repr);
        assert_eq!(parsed.invalidate_stag(), Some(0xdead_beef));
    }

    #[test]
    fn errors_map_to_terminate_codes() {
        let mut buffer = [0u8; 18];
        buffer[0] = 0x41;
        buffer[1] = 0x43; // Send
        buffer[9] = 1; // ...on the Read Request queue
        let error = Repr::parse(&ddp::Packet::new_unchecked(&buffer[..])).unwrap_err();
        assert_eq!(error, Error::Malformed(Malformed::QueueNumber { opcode: Opcode::Send, queue: 1 }));
        assert_eq!(error.term_code(), TermCode::DdpUntaggedInvalidQn);
        buffer[1] = 0x48;
        let error = Repr::parse(&ddp::Packet::new_unchecked(&buffer[..])).unwrap_err();
        assert_eq!(error.term_code(), TermCode::RdmapUnexpectedOpcode);
        buffer[1] = 0x83;
        let error = Repr::parse(&ddp::Packet::new_unchecked(&buffer[..])).unwrap_err();
        assert_eq!(error, Error::Unsupported(Unsupported::RdmapVersion(2)));
        assert_eq!(error.term_code(), TermCode::RdmapInvalidVersion);
        buffer[0] = 0xc0; // tagged, DDP version 0
        let error = Repr::parse(&ddp::Packet::new_unchecked(&buffer[..])).unwrap_err();
        assert_eq!(error.term_code(), TermCode::DdpTaggedInvalidVersion);
        buffer[0] = 0xc1;
        buffer[1] = 0x43; // Send, tagged
        let error = Repr::parse(&ddp::Packet::new_unchecked(&buffer[..])).unwrap_err();
        assert_eq!(error, Error::Malformed(Malformed::BufferModel { opcode: Opcode::Send, tagged: true }));
    }

    #[test]
    fn emit_refuses_mismatched_placement() {
        let repr = Repr {
            opcode: Opcode::RdmaWrite,
            last: false,
            placement: Placement::Untagged { msn: 1, offset: 0, invalidate_stag: 0 },
        };
        let mut buffer = [0u8; 18];
        assert!(matches!(
            repr.emit(&mut ddp::Packet::new_unchecked(&mut buffer[..])),
            Err(Error::Malformed(Malformed::BufferModel { .. }))
        ));
        let repr = Repr {
            opcode: Opcode::Send,
            last: false,
            placement: Placement::Untagged { msn: 1, offset: 0, invalidate_stag: 9 },
        };
        repr.emit(&mut ddp::Packet::new_unchecked(&mut buffer[..])).unwrap();
        assert_eq!(&buffer[2..6], &[0, 0, 0, 0], "reserved RsvdULP word stays zero");
        assert_eq!(repr.emit(&mut ddp::Packet::new_unchecked(&mut buffer[..17])), Err(Error::Truncated));
    }
}
