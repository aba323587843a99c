//! DDP, Direct Data Placement (RFC 5041 §4): the header of every DDP segment
//! (one per MPA ULPDU).
//!
//! ```text
//!   0 1 2 3 4 5 6 7 8 9 ...
//!  +-+-+-------+---+---------------+
//!  |T|L| Rsvd  |DV | RsvdULP[0:7]  |   control; RsvdULP[0:7] is RDMAP's control octet
//!  +-+-+-------+---+---------------+
//!  tagged (T=1), 14 octets:   | STag (32) | TO (64) |
//!  untagged (T=0), 18 octets: | RsvdULP[8:39] (32) | QN (32) | MSN (32) | MO (32) |
//! ```
//!
//! T: tagged buffer model; L: last segment of the DDP message; DV: DDP
//! version, 1. The reserved bits are sent as zero and not checked.

use thiserror::Error;

use super::{read_be32, read_be64, read_u8, write_be32, write_be64, write_u8};

/// The DDP version of RFC 5041.
pub const VERSION: u8 = 1;
pub const TAGGED_HEADER_LEN: usize = 14;
pub const UNTAGGED_HEADER_LEN: usize = 18;

/// DDP header errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Error {
    #[error("DDP segment shorter than its header")]
    Truncated,
    #[error("unsupported: {0}")]
    Unsupported(Unsupported),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Unsupported {
    /// `tagged` tells which TERMINATE error type reports it.
    #[error("DDP version {version} (tagged: {tagged})")]
    Version { version: u8, tagged: bool },
}

mod field {
    use core::ops::Range;

    pub const CONTROL: usize = 0;
    pub const ULP_CONTROL: usize = 1;
    pub const STAG: Range<usize> = 2..6;
    pub const TAGGED_OFFSET: Range<usize> = 6..14;
    pub const ULP_WORD: Range<usize> = 2..6;
    pub const QUEUE_NUMBER: Range<usize> = 6..10;
    pub const MESSAGE_SEQUENCE_NUMBER: Range<usize> = 10..14;
    pub const MESSAGE_OFFSET: Range<usize> = 14..18;
}

mod control {
    pub const TAGGED: u8 = 0x80;
    pub const LAST: u8 = 0x40;
    pub const VERSION: u8 = 0x03;
}

/// A view of a DDP segment.
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

    /// The buffer holds the whole header (14 or 18 octets, by the T bit).
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len == 0 || len < self.header_len() {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn control(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::CONTROL)
    }

    pub fn tagged(&self) -> bool {
        self.control() & control::TAGGED != 0
    }

    pub fn last(&self) -> bool {
        self.control() & control::LAST != 0
    }

    pub fn version(&self) -> u8 {
        self.control() & control::VERSION
    }

    /// `RsvdULP[0:7]`: the RDMAP control octet in iWARP.
    pub fn ulp_control(&self) -> u8 {
        read_u8(self.buffer.as_ref(), field::ULP_CONTROL)
    }

    /// Tagged: the data sink STag.
    pub fn stag(&self) -> u32 {
        read_be32(self.buffer.as_ref(), field::STAG)
    }

    /// Tagged: the data sink tagged offset.
    pub fn tagged_offset(&self) -> u64 {
        read_be64(self.buffer.as_ref(), field::TAGGED_OFFSET)
    }

    /// Untagged: `RsvdULP[8:39]` (RDMAP's Invalidate STag).
    pub fn ulp_word(&self) -> u32 {
        read_be32(self.buffer.as_ref(), field::ULP_WORD)
    }

    /// Untagged: QN.
    pub fn queue_number(&self) -> u32 {
        read_be32(self.buffer.as_ref(), field::QUEUE_NUMBER)
    }

    /// Untagged: MSN.
    pub fn message_sequence_number(&self) -> u32 {
        read_be32(self.buffer.as_ref(), field::MESSAGE_SEQUENCE_NUMBER)
    }

    /// Untagged: MO.
    pub fn message_offset(&self) -> u32 {
        read_be32(self.buffer.as_ref(), field::MESSAGE_OFFSET)
    }

    pub fn header_len(&self) -> usize {
        if self.tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The ULP payload after the DDP header.
    pub fn payload(&self) -> &'a [u8] {
        let buffer: &'a [u8] = self.buffer.as_ref();
        buffer.get(self.header_len()..).unwrap_or(&[])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes T, L and DV (version 1), clearing the reserved bits.
    pub fn set_control(&mut self, tagged: bool, last: bool) {
        let mut value = VERSION;
        if tagged {
            value |= control::TAGGED;
        }
        if last {
            value |= control::LAST;
        }
        write_u8(self.buffer.as_mut(), field::CONTROL, value);
    }

    pub fn set_ulp_control(&mut self, value: u8) {
        write_u8(self.buffer.as_mut(), field::ULP_CONTROL, value);
    }

    pub fn set_stag(&mut self, value: u32) {
        write_be32(self.buffer.as_mut(), field::STAG, value);
    }

    pub fn set_tagged_offset(&mut self, value: u64) {
        write_be64(self.buffer.as_mut(), field::TAGGED_OFFSET, value);
    }

    pub fn set_ulp_word(&mut self, value: u32) {
        write_be32(self.buffer.as_mut(), field::ULP_WORD, value);
    }

    pub fn set_queue_number(&mut self, value: u32) {
        write_be32(self.buffer.as_mut(), field::QUEUE_NUMBER, value);
    }

    pub fn set_message_sequence_number(&mut self, value: u32) {
        write_be32(self.buffer.as_mut(), field::MESSAGE_SEQUENCE_NUMBER, value);
    }

    pub fn set_message_offset(&mut self, value: u32) {
        write_be32(self.buffer.as_mut(), field::MESSAGE_OFFSET, value);
    }

    /// The ULP payload after the DDP header.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        self.buffer.as_mut().get_mut(start..).unwrap_or(&mut [])
    }
}

/// Where a segment's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BufferModel {
    /// Into the remote buffer named by an STag, at tagged offset `offset`.
    Tagged { stag: u32, offset: u64 },
    /// Into the next buffer of queue `queue`: message `msn`, at `offset`.
    /// `ulp_word` is `RsvdULP[8:39]`, opaque to DDP.
    Untagged { ulp_word: u32, queue: u32, msn: u32, offset: u32 },
}

/// A parsed DDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub last: bool,
    /// `RsvdULP[0:7]`, opaque to DDP (RDMAP's control octet).
    pub ulp_control: u8,
    pub buffer_model: BufferModel,
}

impl Repr {
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Self, Error> {
        packet.check_len()?;
        if packet.version() != VERSION {
            return Err(Error::Unsupported(Unsupported::Version {
                version: packet.version(),
                tagged: packet.tagged(),
            }));
        }
        let buffer_model = if packet.tagged() {
            BufferModel::Tagged { stag: packet.stag(), offset: packet.tagged_offset() }
        } else {
            BufferModel::Untagged {
                ulp_word: packet.ulp_word(),
                queue: packet.queue_number(),
                msn: packet.message_sequence_number(),
                offset: packet.message_offset(),
            }
        };
        Ok(Repr { last: packet.last(), ulp_control: packet.ulp_control(), buffer_model })
    }

    pub fn is_tagged(&self) -> bool {
        matches!(self.buffer_model, BufferModel::Tagged { .. })
    }

    pub fn buffer_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HEADER_LEN
        } else {
            UNTAGGED_HEADER_LEN
        }
    }

    /// Writes the header; the payload after it is left alone.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<(), Error> {
        if packet.buffer.as_ref().len() < self.buffer_len() {
            return Err(Error::Truncated);
        }
        packet.set_control(self.is_tagged(), self.last);
        packet.set_ulp_control(self.ulp_control);
        match self.buffer_model {
            BufferModel::Tagged { stag, offset } => {
                packet.set_stag(stag);
                packet.set_tagged_offset(offset);
            }
            BufferModel::Untagged { ulp_word, queue, msn, offset } => {
                packet.set_ulp_word(ulp_word);
                packet.set_queue_number(queue);
                packet.set_message_sequence_number(msn);
                packet.set_message_offset(offset);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;

    #[test]
    fn tagged_golden() {
        let repr = Repr {
            last: true,
            ulp_control: 0x40,
            buffer_model: BufferModel::Tagged { stag: 0x1122_3344, offset: 0x0102_0304_0506_0708 },
        };
        let mut buffer = [0u8; 16];
        repr.emit(&mut Packet::new_unchecked(&mut buffer[..])).unwrap();
        assert_eq!(buffer, [0xc1, 0x40, 0x11, 0x22, 0x33, 0x44, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0]);
        let packet = Packet::new_checked(&buffer[..]).unwrap();
        assert_eq!(Repr::parse(&packet).unwrap(), repr);
        assert_eq!(packet.payload(), &[0, 0]);
    }

    #[test]
    fn version_and_length_checks() {
        let mut buffer = [0u8; UNTAGGED_HEADER_LEN];
        buffer[0] = 0x42; // untagged, last, DV=2
        let packet = Packet::new_checked(&buffer[..]).unwrap();
        assert_eq!(Repr::parse(&packet), Err(Error::Unsupported(Unsupported::Version { version: 2, tagged: false })));
        assert_eq!(Packet::new_checked(&buffer[..17]).err(), Some(Error::Truncated));
        assert_eq!(Packet::new_checked(&buffer[..0]).err(), Some(Error::Truncated));
        buffer[0] = 0x81; // tagged: 14 octets suffice
        assert!(Packet::new_checked(&buffer[..14]).is_ok());
        assert_eq!(Packet::new_checked(&buffer[..13]).err(), Some(Error::Truncated));
    }
}
