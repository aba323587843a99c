//! Wire formats, in the style of smoltcp's `wire` module.
//!
//! Each protocol unit has a `Packet<T: AsRef<[u8]>>` view over a buffer
//! (`new_unchecked`, `new_checked` → `check_len`, field getters, and setters
//! when `T: AsMut<[u8]>`) and a `Repr`, the parsed high-level value, with
//! `parse`, `emit` and `buffer_len`.
//!
//! Unlike smoltcp, accessors never panic: on a buffer too short for a field
//! (one that did not pass `check_len`) a getter reads zero and a setter
//! writes nothing, and `emit` checks the buffer length and reports
//! `Truncated`. The device feeds these parsers hostile network input.
//!
//! All multi-byte fields are big-endian (network order), except the MPA CRC,
//! see [`crate::crc32c`].

pub mod ddp;
pub mod mpa;
pub mod rdmap;
pub mod terminate;

use core::ops::Range;

fn read_array<const N: usize>(buffer: &[u8], range: Range<usize>) -> [u8; N] {
    buffer.get(range).and_then(|bytes| <[u8; N]>::try_from(bytes).ok()).unwrap_or([0; N])
}

fn write_bytes(buffer: &mut [u8], range: Range<usize>, bytes: &[u8]) {
    if let Some(target) = buffer.get_mut(range) {
        if target.len() == bytes.len() {
            target.copy_from_slice(bytes);
        }
    }
}

pub(crate) fn read_u8(buffer: &[u8], at: usize) -> u8 {
    buffer.get(at).copied().unwrap_or(0)
}

pub(crate) fn write_u8(buffer: &mut [u8], at: usize, value: u8) {
    if let Some(byte) = buffer.get_mut(at) {
        *byte = value;
    }
}

pub(crate) fn read_be16(buffer: &[u8], range: Range<usize>) -> u16 {
    u16::from_be_bytes(read_array(buffer, range))
}

pub(crate) fn read_be32(buffer: &[u8], range: Range<usize>) -> u32 {
    u32::from_be_bytes(read_array(buffer, range))
}

pub(crate) fn read_be64(buffer: &[u8], range: Range<usize>) -> u64 {
    u64::from_be_bytes(read_array(buffer, range))
}

pub(crate) fn write_be16(buffer: &mut [u8], range: Range<usize>, value: u16) {
    write_bytes(buffer, range, &value.to_be_bytes());
}

pub(crate) fn write_be32(buffer: &mut [u8], range: Range<usize>, value: u32) {
    write_bytes(buffer, range, &value.to_be_bytes());
}

pub(crate) fn write_be64(buffer: &mut [u8], range: Range<usize>, value: u64) {
    write_bytes(buffer, range, &value.to_be_bytes());
}

pub(crate) fn read_le32(buffer: &[u8], range: Range<usize>) -> u32 {
    u32::from_le_bytes(read_array(buffer, range))
}

pub(crate) fn write_le32(buffer: &mut [u8], range: Range<usize>, value: u32) {
    write_bytes(buffer, range, &value.to_le_bytes());
}

/// Copies `source` into `buffer[start..]`; false (nothing written) if it does not fit.
pub(crate) fn write_slice(buffer: &mut [u8], start: usize, source: &[u8]) -> bool {
    let target = start.checked_add(source.len()).and_then(|end| buffer.get_mut(start..end));
    match target {
        Some(target) => {
            target.copy_from_slice(source);
            true
        }
        None => false,
    }
}
