//! vt3d as deployed: two `vt3d serve` processes on a real uplink, each
//! driven by a synthetic guest over vhost-user, next to the host's own
//! numbers measured in the same run. A benchmark, never a timed test.
//!
//! ```sh
//! cargo bench -p vt3d --bench device                 # full (~1 min)
//! cargo bench -p vt3d --bench device -- --short      # a few seconds
//! cargo bench -p vt3d --bench device -- --out PATH   # JSON elsewhere
//! ```
//!
//! Writes `build/bench/device.json` (keys in run.rs) and prints a table.
//! `VT3D=path` runs another vt3d binary; `VT3_BENCH_SECS` sets the seconds
//! per measurement, `VT3_BENCH_REPEATS` how often each runs (the full form
//! 5: rows are medians with min–max), `VT3_BENCH_IDLE` the idle
//! connections of the memory measurement, `VT3_BENCH_UPLINKS` (`udp`, `unix-dgram`, comma-separated)
//! the uplinks measured.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

mod anchors;
mod guest;
mod run;
mod vring;
mod vt3d;

use std::path::PathBuf;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = args
        .iter()
        .position(|a| a == "--out")
        .and_then(|i| args.get(i + 1))
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../build/bench/device.json"), PathBuf::from);
    let mut opts = if args.iter().any(|a| a == "--short") { run::Options::short(out) } else { run::Options::full(out) };
    if let Some(secs) = std::env::var("VT3_BENCH_SECS").ok().and_then(|s| s.parse().ok()) {
        opts.secs = secs;
    }
    if let Some(n) = std::env::var("VT3_BENCH_REPEATS").ok().and_then(|s| s.parse().ok()) {
        opts.repeats = n;
    }
    if let Some(n) = std::env::var("VT3_BENCH_IDLE").ok().and_then(|s| s.parse().ok()) {
        opts.idle_conns = n;
    }
    if let Ok(names) = std::env::var("VT3_BENCH_UPLINKS") {
        opts.uplinks = names
            .split(',')
            .map(|name| match name {
                "udp" => vt3d::UplinkKind::Udp,
                "unix-dgram" => vt3d::UplinkKind::UnixDgram,
                "tap" => vt3d::UplinkKind::Tap,
                other => panic!("VT3_BENCH_UPLINKS: unknown uplink {other:?} (udp, unix-dgram, tap)"),
            })
            .filter(|&u| {
                let skip = u == vt3d::UplinkKind::Tap && !vt3d::can_make_taps();
                if skip {
                    println!("VT3_BENCH_UPLINKS: tap skipped: making taps and a bridge needs root");
                }
                !skip
            })
            .collect();
    }
    run::run(&opts);
}
