//! Deterministic pseudo-random values for tests (SplitMix64): reproducible
//! without a proptest dependency.
#![allow(dead_code, clippy::cast_possible_truncation)]

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    pub fn u16(&mut self) -> u16 {
        (self.next_u64() >> 48) as u16
    }

    pub fn u8(&mut self) -> u8 {
        (self.next_u64() >> 56) as u8
    }

    pub fn bool(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }

    /// Edge values half of the time, uniform otherwise.
    pub fn u32_edgy(&mut self) -> u32 {
        const EDGES: [u32; 6] = [0, 1, 0x7fff_ffff, 0x8000_0000, 0xffff_fffe, 0xffff_ffff];
        if self.bool() {
            EDGES[self.below(EDGES.len())]
        } else {
            self.u32()
        }
    }

    pub fn u64_edgy(&mut self) -> u64 {
        if self.bool() {
            [0, 1, u64::MAX, 1 << 63][self.below(4)]
        } else {
            self.next_u64()
        }
    }

    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.u8()).collect()
    }

    /// Between 0 and `bound - 1` random bytes.
    pub fn some_bytes(&mut self, bound: usize) -> Vec<u8> {
        let len = self.below(bound);
        self.bytes(len)
    }

    /// Cuts `len` into random positive pieces.
    pub fn splits(&mut self, len: usize, max_piece: usize) -> Vec<usize> {
        let mut pieces = Vec::new();
        let mut left = len;
        while left > 0 {
            let piece = 1 + self.below(max_piece.min(left));
            pieces.push(piece);
            left -= piece;
        }
        pieces
    }
}
