//! CRC32c throughput of `vt3_iwarp::crc32c` (the MPA FPDU checksum, once per
//! FPDU on each side), over FPDU-sized and large buffers.
//!
//! ```sh
//! cargo bench -p vt3-iwarp --bench crc32c
//! ```
#![allow(clippy::cast_possible_truncation)]

use std::hint::black_box;
use std::time::{Duration, Instant};

use vt3_iwarp::crc32c::Crc32c;

fn main() {
    let seconds: f64 = std::env::var("VT3_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(0.5);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    println!("| buffer | CRC32c |");
    println!("|---|---|");
    for len in [64usize, 1460, 8960, 1 << 20] {
        let chunk = data.get(..len).unwrap_or(&data);
        let start = Instant::now();
        let mut octets = 0u64;
        while start.elapsed() < Duration::from_secs_f64(seconds) {
            for _ in 0..64 {
                black_box(Crc32c::new().update(black_box(chunk)).finish());
            }
            octets += 64 * len as u64;
        }
        let rate = octets as f64 / start.elapsed().as_secs_f64() / 1e9;
        println!("| {len} B | {rate:.2} GB/s |");
    }
}
