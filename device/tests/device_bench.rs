//! The device bench's short form runs (CI): two vt3d processes, synthetic
//! guests, every scenario once, and the JSON it writes has its keys. No
//! figure is checked: a benchmark, never a timed test
//! (docs/architecture.md §8).

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

#[path = "../benches/device/anchors.rs"]
mod anchors;
#[path = "../benches/device/guest.rs"]
mod guest;
#[path = "../benches/device/run.rs"]
mod run;
#[path = "../benches/device/vring.rs"]
mod vring;
#[path = "../benches/device/vt3d.rs"]
mod vt3d;

#[test]
fn the_short_bench_runs_and_writes_its_keys() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("device.json");
    // The full form is what issue 15 asks for: 64 QPs, every MTU.
    let full = run::Options::full(out.clone());
    assert_eq!((full.qps, full.mtus.last().copied()), (64, Some(run::MAX_MTU)));
    let mut opts = run::Options::short(out.clone());
    // A debug vt3d: a few WRs are enough to cross every path.
    opts.secs = 0.1;
    opts.qps = 4;
    opts.uplinks = vec![vt3d::UplinkKind::UnixDgram, vt3d::UplinkKind::Udp];
    opts.mtus = vec![1500, 9000];
    opts.idle_conns = 4;
    // Repeats reuse the pair's connections: three show that a measurement
    // leaves its QP as it found it (a fourth would hide nothing more).
    opts.repeats = 3;
    run::run(&opts);
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    for key in [
        "write_1m_max_mtu_mbs",
        "tcp_loopback_mbs",
        "write_1m_1500_mbs",
        "raw_1500_ceiling_mbs",
        "rtt_64_us",
        "raw_pingpong_us",
        "qp64_vs_qp1",
        "rss_per_idle_conn_kib",
        "forward_pingpong_us",
        "forward_1514_per_s",
    ] {
        assert!(json[key].is_number(), "{key} missing from {json}");
    }
    // Each measurement's spread beside its median.
    let udp = &json["uplinks"]["udp"];
    for key in ["write_1m_9000_mbs_min", "write_1m_9000_mbs_max", "forward_1514_per_s_min"] {
        assert!(udp[key].is_number(), "{key} missing from {udp}");
    }
}
