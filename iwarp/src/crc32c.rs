//! CRC32c (Castagnoli), the MPA FPDU checksum (RFC 5044 §6, same CRC as
//! iSCSI, RFC 3720 §12.1).
//!
//! Slicing-by-8 over tables built at compile time: no allocation, no
//! per-call setup. [`Crc32c::finish`] returns the conventional CRC value
//! (`"123456789"` → `0xE306_9283`). On the wire MPA carries that value's
//! **little-endian** bytes — the order in which RFC 3720 appendix B.4 lists
//! its examples (32 zero bytes → `aa 36 91 8a`) and the order in which Linux
//! (siw, iSCSI) emits it. Use [`Crc32c::finish_wire`] for the trailer bytes.

/// The reflected Castagnoli polynomial 0x1EDC6F41.
const POLYNOMIAL: u32 = 0x82F6_3B78;

/// `TABLES[k][b]` is the CRC contribution of byte `b` followed by `k` zero bytes.
static TABLES: [[u32; 256]; 8] = build_tables();

// Evaluated at compile time only: an out-of-range index here would fail the
// build, never a running device.
#[allow(clippy::indexing_slicing, clippy::cast_possible_truncation)]
const fn build_tables() -> [[u32; 256]; 8] {
    let mut tables = [[0u32; 256]; 8];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = byte as u32;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ POLYNOMIAL
            } else {
                crc >> 1
            };
            bit += 1;
        }
        tables[0][byte] = crc;
        byte += 1;
    }
    let mut byte = 0;
    while byte < 256 {
        let mut slice = 1;
        while slice < 8 {
            let previous = tables[slice - 1][byte];
            tables[slice][byte] = (previous >> 8) ^ tables[0][(previous & 0xff) as usize];
            slice += 1;
        }
        byte += 1;
    }
    tables
}

/// Table lookup; a `u8` index is always inside a 256-entry table.
#[inline(always)]
#[allow(clippy::indexing_slicing)]
fn lookup(slice: usize, byte: u8) -> u32 {
    TABLES[slice & 7][usize::from(byte)]
}

/// An incremental CRC32c computation.
///
/// ```
/// use vt3_iwarp::crc32c::Crc32c;
/// let crc = Crc32c::new().update(b"1234").update(b"56789").finish();
/// assert_eq!(crc, 0xE306_9283);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crc32c {
    state: u32,
}

impl Default for Crc32c {
    fn default() -> Self {
        Self::new()
    }
}

impl Crc32c {
    /// A fresh computation (the register preset to all ones).
    pub const fn new() -> Self {
        Self { state: !0 }
    }

    /// Feeds `data`; may be called any number of times.
    pub fn update(&mut self, data: &[u8]) -> &mut Self {
        let mut crc = self.state;
        let mut words = data.chunks_exact(8);
        for word in &mut words {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(word); // chunks_exact guarantees 8 bytes
            let low =
                (crc ^ u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])).to_le_bytes();
            crc = lookup(7, low[0])
                ^ lookup(6, low[1])
                ^ lookup(5, low[2])
                ^ lookup(4, low[3])
                ^ lookup(3, bytes[4])
                ^ lookup(2, bytes[5])
                ^ lookup(1, bytes[6])
                ^ lookup(0, bytes[7]);
        }
        for &byte in words.remainder() {
            crc = lookup(0, crc.to_le_bytes()[0] ^ byte) ^ (crc >> 8);
        }
        self.state = crc;
        self
    }

    /// The CRC of everything fed so far (does not reset the computation).
    pub const fn finish(&self) -> u32 {
        !self.state
    }

    /// The four bytes MPA puts in the FPDU CRC field.
    pub const fn finish_wire(&self) -> [u8; 4] {
        self.finish().to_le_bytes()
    }
}

/// One-shot CRC32c of `data`.
pub fn checksum(data: &[u8]) -> u32 {
    Crc32c::new().update(data).finish()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing)]
    use super::*;

    /// Bitwise reference implementation, the definition of the CRC.
    fn reference(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &byte in data {
            crc ^= u32::from(byte);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ POLYNOMIAL
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// RFC 3720 appendix B.4: the CRC bytes as listed there (wire order).
    #[test]
    fn rfc3720_vectors() {
        let zeros = [0u8; 32];
        let ones = [0xffu8; 32];
        let incrementing: Vec<u8> = (0..32).collect();
        let decrementing: Vec<u8> = (0..32).rev().collect();
        #[rustfmt::skip]
        let iscsi_read_pdu: [u8; 48] = [
            0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
            0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        ];
        let cases: [(&[u8], u32); 5] = [
            (&zeros, 0xAA36_918A),
            (&ones, 0x43AB_A862),
            (&incrementing, 0x4E79_DD46),
            (&decrementing, 0x5CDB_3F11),
            (&iscsi_read_pdu, 0x563A_96D9),
        ];
        for (data, listed) in cases {
            let crc = Crc32c::new().update(data).finish_wire();
            assert_eq!(crc, listed.to_be_bytes(), "wire bytes for {data:02x?}");
            assert_eq!(checksum(data), listed.swap_bytes());
        }
        assert_eq!(checksum(b"123456789"), 0xE306_9283);
        assert_eq!(checksum(b""), 0);
    }

    #[test]
    fn incremental_equals_oneshot_and_reference() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let data: Vec<u8> = (0..1031)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed.to_le_bytes()[0]
            })
            .collect();
        for len in (0..data.len()).step_by(7) {
            let whole = &data[..len];
            let expected = reference(whole);
            assert_eq!(checksum(whole), expected);
            for split in [0, 1, 3, 8, 9, len / 2, len] {
                let split = split.min(len);
                let mut crc = Crc32c::new();
                crc.update(&whole[..split]).update(&whole[split..]);
                assert_eq!(crc.finish(), expected, "len {len} split {split}");
            }
            let mut bytewise = Crc32c::default();
            for byte in whole {
                bytewise.update(std::slice::from_ref(byte));
            }
            assert_eq!(bytewise.finish(), expected);
        }
    }
}
