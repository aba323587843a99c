//! Two vt3 engines over a real loopback, next to the host's own numbers.
//!
//! ```sh
//! cargo bench -p vt3-iwarp --bench engine          # ~17 s of measuring
//! VT3_BENCH_SECS=1 cargo bench -p vt3-iwarp --bench engine   # quicker
//! ```
//!
//! Knobs: `VT3_BENCH_SECS` (per measurement), `VT3_BENCH_WINDOW` (TCP
//! receive buffer, octets; default: half the UDP socket queue, see
//! [`window_for`]), `VT3_BENCH_ACK_DELAY_US` (0: no delayed ACKs).
//!
//! The threads spin: run it on an otherwise idle machine. With other
//! busy processes (a QEMU guest, a build) a spinning thread loses its
//! core for whole scheduler slices and every window-limited flow stalls
//! for milliseconds; numbers then drop by up to 10×, the bare datagram
//! ping-pong shows the same outliers.
//!
//! Each engine runs in its own thread with mock guest memory and TPT; the
//! uplink is one Ethernet frame per datagram, as vt3d's `udp:` and
//! `unix-dgram:` uplinks do: UDP sockets on 127.0.0.1, or unix datagram
//! sockets in a temp dir. Threads spin (non-blocking I/O), as do the
//! baselines, so latencies compare.
//!
//! Measured: RDMA WRITE throughput (1 MiB WRs, 8 in flight) at MTU 1500
//! and 9000, SEND ping-pong (64 B) round-trip time, and in the same run
//! the host anchors: TCP over loopback (std `TcpStream`, 1 MiB writes),
//! UDP and unix-datagram ping-pong (64 B), and the raw frame rate of each
//! uplink (1514-octet datagrams, one sender, one receiver).
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration as StdDuration, Instant as StdInstant};

use vt3_iwarp::engine::{
    ConnectParams, Engine, EngineConfig, EventKind, Io, QpConfig, QpState, RecvWr, SendOpcode, SendWr, Sge, SgeList,
    WcStatus, LOCAL_WRITE, REMOTE_READ, REMOTE_WRITE,
};
use vt3_iwarp::mock::MockMemory;
use vt3_iwarp::sim::{IPS, MACS, PORT};
use vt3_iwarp::toe::{Instant, SmolToe, TcpConfig};
use vt3_iwarp::tpt::Tpt;

/// One Ethernet frame per datagram, non-blocking.
trait Link: Send {
    /// Sends one frame; on a full queue spins up to 2 ms, then drops.
    fn send(&self, frame: &[u8]) -> bool;
    fn recv(&self, buf: &mut [u8]) -> Option<usize>;
}

struct Udp(UdpSocket);
struct Unix(UnixDatagram);

fn spin_send(mut attempt: impl FnMut() -> std::io::Result<usize>) -> bool {
    let start = StdInstant::now();
    loop {
        match attempt() {
            Ok(_) => return true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                SEND_STALLS.fetch_add(1, Ordering::Relaxed);
                if start.elapsed() > StdDuration::from_millis(2) {
                    SEND_DROPS.fetch_add(1, Ordering::Relaxed);
                    return false;
                }
                std::hint::spin_loop();
            }
            Err(_) => {
                SEND_DROPS.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
    }
}

static SEND_STALLS: AtomicU64 = AtomicU64::new(0);
static SEND_DROPS: AtomicU64 = AtomicU64::new(0);

impl Link for Udp {
    fn send(&self, frame: &[u8]) -> bool {
        spin_send(|| self.0.send(frame))
    }
    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.0.recv(buf).ok()
    }
}

impl Link for Unix {
    fn send(&self, frame: &[u8]) -> bool {
        spin_send(|| self.0.send(frame))
    }
    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        self.0.recv(buf).ok()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Uplink {
    Udp,
    UnixDgram,
}

impl Uplink {
    fn name(self) -> &'static str {
        match self {
            Uplink::Udp => "udp",
            Uplink::UnixDgram => "unix-dgram",
        }
    }

    fn pair(self, dir: &std::path::Path, tag: &str) -> (Box<dyn Link>, Box<dyn Link>) {
        match self {
            Uplink::Udp => {
                let a = UdpSocket::bind("127.0.0.1:0").unwrap();
                let b = UdpSocket::bind("127.0.0.1:0").unwrap();
                a.connect(b.local_addr().unwrap()).unwrap();
                b.connect(a.local_addr().unwrap()).unwrap();
                a.set_nonblocking(true).unwrap();
                b.set_nonblocking(true).unwrap();
                (Box::new(Udp(a)), Box::new(Udp(b)))
            }
            Uplink::UnixDgram => {
                let pa = dir.join(format!("{tag}-a"));
                let pb = dir.join(format!("{tag}-b"));
                let _ = std::fs::remove_file(&pa);
                let _ = std::fs::remove_file(&pb);
                let a = UnixDatagram::bind(&pa).unwrap();
                let b = UnixDatagram::bind(&pb).unwrap();
                a.connect(&pb).unwrap();
                b.connect(&pa).unwrap();
                a.set_nonblocking(true).unwrap();
                b.set_nonblocking(true).unwrap();
                (Box::new(Unix(a)), Box::new(Unix(b)))
            }
        }
    }
}

/// An engine with its guest and its uplink.
struct Side {
    engine: Engine<SmolToe>,
    memory: MockMemory,
    regions: Tpt,
    link: Box<dyn Link>,
    clock: StdInstant,
    buf: Vec<u8>,
    frames_in: u64,
    frames_out: u64,
}

const PD: u32 = 1;
const MIB: u64 = 1 << 20;
/// The TCP window (receive buffer) must fit the receiving uplink's socket
/// queue (212992 octets of UDP rmem by default, counted in skb truesize:
/// ~2.3 KiB per 1514-octet datagram, ~16 KiB per 9014-octet one), or
/// frames drop and smoltcp's 1 s minimum RTO stalls the flow. Half the
/// queue by default; `VT3_BENCH_WINDOW` overrides.
fn window_for(mtu: usize) -> usize {
    let truesize = if mtu > 4096 { 16 * 1024 } else { 2304 };
    let default = 106_496 / truesize * (mtu - 40);
    std::env::var("VT3_BENCH_WINDOW").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

impl Side {
    fn new(index: usize, link: Box<dyn Link>, mtu: usize, clock: StdInstant) -> Side {
        let mut tcp = TcpConfig::new(MACS[index], IPS[index]);
        tcp.mtu = mtu;
        tcp.rx_buffer = window_for(mtu).max(4 * mtu);
        tcp.tx_buffer = 256 * 1024;
        if let Some(us) = std::env::var("VT3_BENCH_ACK_DELAY_US").ok().and_then(|s| s.parse::<u64>().ok()) {
            tcp.ack_delay = (us > 0).then(|| vt3_iwarp::toe::Duration::from_micros(us));
        }
        let now = Instant::from_micros(clock.elapsed().as_micros() as i64);
        let toe = SmolToe::new(tcp, now).unwrap();
        Side {
            engine: Engine::new(toe, EngineConfig::default()),
            memory: MockMemory::new(4 * MIB as usize),
            regions: Tpt::for_tests(),
            link,
            clock,
            buf: vec![0; 65_536],
            frames_in: 0,
            frames_out: 0,
        }
    }

    fn now(&self) -> Instant {
        Instant::from_micros(self.clock.elapsed().as_micros() as i64)
    }

    /// Takes in what arrived, runs the engine, sends what it emits.
    fn pump(&mut self) {
        let now = self.now();
        let Side { engine, link, buf, frames_in, frames_out, memory, regions, .. } = self;
        for _ in 0..256 {
            let Some(len) = link.recv(buf) else { break };
            *frames_in += 1;
            let frame = &buf[..len];
            if engine.wants(frame) {
                engine.receive(now, frame, &mut |reply| {
                    *frames_out += 1;
                    link.send(reply);
                });
            }
        }
        let mut uplink = |frame: &[u8]| {
            *frames_out += 1;
            link.send(frame);
        };
        let mut io = Io { memory, regions, uplink: &mut uplink };
        engine.poll(now, &mut io);
    }
}

#[derive(Debug, Clone, Copy)]
enum Scenario {
    /// 1 MiB RDMA WRITEs, 8 in flight.
    Write,
    /// 64-octet SEND ping-pong.
    PingPong,
}

#[derive(Debug, Default, Clone)]
struct Outcome {
    /// Octets placed per second (WRITE) or round trips (ping-pong).
    bytes_per_sec: f64,
    rtt_us_avg: f64,
    rtt_us_p50: f64,
    rtt_us_p99: f64,
    frames_per_sec: f64,
    retransmits: u64,
    srtt_us: Option<u64>,
    fpdus: u64,
    stalls: u64,
    drops: u64,
}

fn run_engines(uplink: Uplink, mtu: usize, scenario: Scenario, secs: f64, dir: &std::path::Path) -> Outcome {
    SEND_STALLS.store(0, Ordering::Relaxed);
    SEND_DROPS.store(0, Ordering::Relaxed);
    let (link_a, link_b) = uplink.pair(dir, &format!("{}-{mtu}-{scenario:?}", uplink.name()));
    let clock = StdInstant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let placed = Arc::new(AtomicU64::new(0));

    let server = {
        let stop = stop.clone();
        let placed = placed.clone();
        thread::spawn(move || {
            let mut b = Side::new(1, link_b, mtu, clock);
            let all = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;
            let mr = b.regions.register_contiguous(PD, all, 0x10_0000, 0x10_0000, MIB);
            b.engine.listen(PORT, 4).unwrap();
            b.engine.create_qp(2, QpConfig::new(PD)).unwrap();
            let small = Sge { addr: 0x10_0000, length: 64, lkey: mr };
            for i in 0..32 {
                b.engine.post_recv(2, RecvWr { wr_id: i, sges: SgeList::single(small) }).unwrap();
            }
            let mut reply = SendWr::new(0, SendOpcode::Send);
            reply.sges = SgeList::single(small);
            reply.signaled = false;
            let mut polls = 0u64;
            while !stop.load(Ordering::Relaxed) {
                b.pump();
                while let Some(event) = b.engine.pop_event() {
                    if let (EventKind::ConnectRequest(_), Some(conn)) = (&event.kind, event.conn) {
                        let now = b.now();
                        b.engine.accept(now, conn, 2, b"").unwrap();
                    }
                }
                while let Some(c) = b.engine.pop_completion() {
                    if c.qpn == 2 && c.opcode == vt3_iwarp::engine::WcOpcode::Recv {
                        b.engine.post_recv(2, RecvWr { wr_id: c.wr_id, sges: SgeList::single(small) }).unwrap();
                        b.engine.post_send(2, reply).unwrap();
                    }
                }
                polls += 1;
                if polls.is_multiple_of(64) {
                    placed.store(b.engine.stats().bytes_placed, Ordering::Relaxed);
                }
            }
            (b.frames_in, b.frames_out)
        })
    };

    let mut a = Side::new(0, link_a, mtu, clock);
    let all = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;
    let src = a.regions.register_contiguous(PD, all, 0x10_0000, 0x10_0000, MIB);
    let mut qp = QpConfig::new(PD);
    qp.sq_depth = 64;
    a.engine.create_qp(1, qp).unwrap();
    let params = ConnectParams {
        local_port: 40_000,
        remote: SocketAddrV4::new(IPS[1], PORT),
        next_hop: MACS[1],
        private_data: Vec::new(),
    };
    let now = a.now();
    a.engine.connect(now, 1, params).unwrap();
    let deadline = StdInstant::now() + StdDuration::from_secs(5);
    while a.engine.qp_state(1) != Some(QpState::Rts) {
        a.pump();
        assert!(StdInstant::now() < deadline, "connect timed out");
    }
    while a.engine.pop_event().is_some() {}
    // Let the RTR reach the responder.
    let settle = StdInstant::now();
    while settle.elapsed() < StdDuration::from_millis(20) {
        a.pump();
    }

    let mut outcome = Outcome::default();
    let warmup = StdDuration::from_secs_f64(secs * 0.15);
    let measure = StdDuration::from_secs_f64(secs);
    match scenario {
        Scenario::Write => {
            let mut write = SendWr::new(0, SendOpcode::Write);
            write.sges = SgeList::single(Sge { addr: 0x10_0000, length: MIB as u32, lkey: src });
            write.remote_stag = 0x001; // the server's first registration
            write.remote_addr = 0x10_0000;
            let mut in_flight = 0;
            let start = StdInstant::now();
            let mut window: Option<(StdInstant, u64, u64)> = None;
            loop {
                while in_flight < 8 {
                    a.engine.post_send(1, write).unwrap();
                    in_flight += 1;
                }
                a.pump();
                while let Some(c) = a.engine.pop_completion() {
                    assert_eq!(c.status, WcStatus::Success);
                    in_flight -= 1;
                }
                let elapsed = start.elapsed();
                if window.is_none() && elapsed >= warmup {
                    window = Some((StdInstant::now(), placed.load(Ordering::Relaxed), a.frames_out));
                }
                if elapsed >= warmup + measure {
                    break;
                }
                assert_eq!(a.engine.qp_state(1), Some(QpState::Rts), "connection lost");
            }
            let (t0, placed0, frames0) = window.unwrap();
            let dt = t0.elapsed().as_secs_f64();
            outcome.bytes_per_sec = (placed.load(Ordering::Relaxed) - placed0) as f64 / dt;
            outcome.frames_per_sec = (a.frames_out - frames0) as f64 / dt;
        }
        Scenario::PingPong => {
            let small = Sge { addr: 0x10_0000, length: 64, lkey: src };
            for i in 0..32 {
                a.engine.post_recv(1, RecvWr { wr_id: i, sges: SgeList::single(small) }).unwrap();
            }
            let mut ping = SendWr::new(0, SendOpcode::Send);
            ping.sges = SgeList::single(small);
            ping.signaled = false;
            let mut samples: Vec<f64> = Vec::with_capacity(1 << 20);
            let start = StdInstant::now();
            loop {
                let sent = StdInstant::now();
                a.engine.post_send(1, ping).unwrap();
                let mut done = false;
                while !done {
                    a.pump();
                    while let Some(c) = a.engine.pop_completion() {
                        if c.opcode == vt3_iwarp::engine::WcOpcode::Recv {
                            a.engine.post_recv(1, RecvWr { wr_id: c.wr_id, sges: SgeList::single(small) }).unwrap();
                            done = true;
                        }
                    }
                    if start.elapsed() > warmup + measure + StdDuration::from_secs(2) {
                        panic!("ping-pong stalled");
                    }
                }
                if start.elapsed() >= warmup && samples.len() < samples.capacity() {
                    samples.push(sent.elapsed().as_secs_f64() * 1e6);
                }
                if start.elapsed() >= warmup + measure {
                    break;
                }
            }
            samples.sort_by(f64::total_cmp);
            outcome.rtt_us_avg = samples.iter().sum::<f64>() / samples.len() as f64;
            outcome.rtt_us_p50 = samples[samples.len() / 2];
            outcome.rtt_us_p99 = samples[samples.len() * 99 / 100];
        }
    }
    let tcb = a.engine.tcb(1).unwrap();
    outcome.retransmits = tcb.retransmits;
    outcome.srtt_us = tcb.srtt.map(|d| d.total_micros());
    outcome.fpdus = a.engine.stats().fpdus_tx;
    outcome.stalls = SEND_STALLS.load(Ordering::Relaxed);
    outcome.drops = SEND_DROPS.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let _ = server.join();
    outcome
}

/// TCP over loopback, 1 MiB writes: octets per second.
fn tcp_loopback(secs: f64) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let duration = StdDuration::from_secs_f64(secs);
    let writer = thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        let chunk = vec![0x5au8; MIB as usize];
        let start = StdInstant::now();
        while start.elapsed() < duration + StdDuration::from_millis(300) {
            if stream.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let (mut stream, _) = listener.accept().unwrap();
    let mut buf = vec![0u8; MIB as usize];
    let warm = StdInstant::now();
    while warm.elapsed() < StdDuration::from_millis(200) {
        let _ = stream.read(&mut buf).unwrap();
    }
    let start = StdInstant::now();
    let mut total = 0u64;
    while start.elapsed() < duration {
        let n = stream.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let rate = total as f64 / start.elapsed().as_secs_f64();
    drop(stream);
    let _ = writer.join();
    rate
}

/// 64-octet ping-pong over a datagram link pair, both sides spinning: RTT in µs.
fn datagram_ping_pong(uplink: Uplink, secs: f64, dir: &std::path::Path) -> (f64, f64) {
    let (a, b) = uplink.pair(dir, "pingpong");
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let stop = stop.clone();
        thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                if let Some(n) = b.recv(&mut buf) {
                    b.send(&buf[..n]);
                }
            }
        })
    };
    let mut buf = [0u8; 2048];
    let ping = [7u8; 64];
    let mut samples = Vec::with_capacity(1 << 20);
    let start = StdInstant::now();
    while start.elapsed() < StdDuration::from_secs_f64(secs) {
        let sent = StdInstant::now();
        a.send(&ping);
        while a.recv(&mut buf).is_none() {
            std::hint::spin_loop();
        }
        if samples.len() < samples.capacity() {
            samples.push(sent.elapsed().as_secs_f64() * 1e6);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
    samples.sort_by(f64::total_cmp);
    let avg = samples.iter().sum::<f64>() / samples.len() as f64;
    (avg, samples[samples.len() / 2])
}

/// Frames of `size` octets one way as fast as they go: frames per second received.
fn frame_rate(uplink: Uplink, size: usize, secs: f64, dir: &std::path::Path) -> f64 {
    SEND_DROPS.store(0, Ordering::Relaxed);
    let (a, b) = uplink.pair(dir, &format!("blast{size}"));
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        thread::spawn(move || {
            let frame = vec![0x33u8; size];
            while !stop.load(Ordering::Relaxed) {
                a.send(&frame);
            }
        })
    };
    let mut buf = vec![0u8; 65_536];
    let start = StdInstant::now();
    let mut frames = 0u64;
    while start.elapsed() < StdDuration::from_secs_f64(secs) {
        if b.recv(&mut buf).is_some() {
            frames += 1;
        }
    }
    let rate = frames as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = sender.join();
    rate
}

fn mb(bytes_per_sec: f64) -> String {
    format!("{:.0} MB/s ({:.2} Gbit/s)", bytes_per_sec / 1e6, bytes_per_sec * 8.0 / 1e9)
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is ignored.
    let secs: f64 = std::env::var("VT3_BENCH_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(1.6);
    let dir: PathBuf = std::env::temp_dir().join(format!("vt3-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let started = StdInstant::now();
    println!("vt3 engine benchmark: {secs} s per measurement, 2 threads, spinning I/O");
    println!(
        "(mock guest memory and TPT, CRC32c on, TCP windows {} KiB at MTU 1500, {} KiB at 9000)\n",
        window_for(1500) / 1024,
        window_for(9000) / 1024
    );

    let mut rows = Vec::new();
    for uplink in [Uplink::Udp, Uplink::UnixDgram] {
        for mtu in [1500, 9000] {
            let o = run_engines(uplink, mtu, Scenario::Write, secs, &dir);
            rows.push((uplink, mtu, o));
        }
    }
    let mut pings = Vec::new();
    for uplink in [Uplink::Udp, Uplink::UnixDgram] {
        pings.push((uplink, run_engines(uplink, 1500, Scenario::PingPong, secs * 0.75, &dir)));
    }
    let tcp = tcp_loopback(secs);
    let udp_pp = datagram_ping_pong(Uplink::Udp, secs * 0.5, &dir);
    let unix_pp = datagram_ping_pong(Uplink::UnixDgram, secs * 0.5, &dir);
    let mut blast = Vec::new();
    for uplink in [Uplink::Udp, Uplink::UnixDgram] {
        blast.push((uplink, frame_rate(uplink, 1514, secs * 0.5, &dir), frame_rate(uplink, 9014, secs * 0.5, &dir)));
    }

    println!("| measurement | vt3 over udp | vt3 over unix-dgram | host anchor (same run) |");
    println!("|---|---|---|---|");
    for mtu in [1500, 9000] {
        let get = |u| rows.iter().find(|r| r.0 == u && r.1 == mtu).map(|r| r.2.clone()).unwrap();
        let (u, x) = (get(Uplink::Udp), get(Uplink::UnixDgram));
        let anchor = if mtu == 1500 { format!("TCP loopback, 1 MiB writes: {}", mb(tcp)) } else { String::new() };
        println!("| RDMA WRITE 1 MiB, MTU {mtu} | {} | {} | {anchor} |", mb(u.bytes_per_sec), mb(x.bytes_per_sec));
    }
    let (pu, px) = (&pings[0].1, &pings[1].1);
    println!(
        "| SEND 64 B ping-pong RTT (avg / p50 / p99) | {:.1} / {:.1} / {:.1} µs | {:.1} / {:.1} / {:.1} µs | UDP 64 B ping-pong: {:.1} / {:.1} µs; unix-dgram: {:.1} / {:.1} µs (avg / p50) |",
        pu.rtt_us_avg, pu.rtt_us_p50, pu.rtt_us_p99, px.rtt_us_avg, px.rtt_us_p50, px.rtt_us_p99,
        udp_pp.0, udp_pp.1, unix_pp.0, unix_pp.1
    );
    println!(
        "| uplink frame rate, 1514 B / 9014 B frames | {:.0} k/s / {:.0} k/s | {:.0} k/s / {:.0} k/s | (raw datagrams, no engine) |",
        blast[0].1 / 1e3, blast[0].2 / 1e3, blast[1].1 / 1e3, blast[1].2 / 1e3
    );

    println!("\nDetails (sender side):");
    for (uplink, mtu, o) in &rows {
        println!(
            "  WRITE {:<10} MTU {mtu:>4}: {:>7.0} frames/s out, {} FPDUs, {} retransmits, srtt {:?} µs, {} send stalls (queue full), {} drops",
            uplink.name(), o.frames_per_sec, o.fpdus, o.retransmits, o.srtt_us, o.stalls, o.drops
        );
    }
    for (uplink, o) in &pings {
        println!("  ping-pong {:<10}: {} retransmits, {} drops", uplink.name(), o.retransmits, o.drops);
    }

    println!("\nWhat limits the engine:");
    for (uplink, mtu, o) in &rows {
        let ceiling = blast.iter().find(|b| b.0 == *uplink).map(|b| if *mtu == 1500 { b.1 } else { b.2 }).unwrap();
        let payload = (*mtu - 40 - 30) as f64; // TCP/IP headers, MPA/DDP/CRC overhead per FPDU
        println!(
            "  {:<10} MTU {mtu:>4}: {:>3.0}% of the uplink's raw frame rate ({:.0} k/s); that rate × {:.0} B of payload per frame = {} ceiling{}",
            uplink.name(),
            100.0 * o.frames_per_sec / ceiling,
            ceiling / 1e3,
            payload,
            mb(ceiling * payload),
            if o.srtt_us.is_some_and(|rtt| rtt > 0) {
                format!("; window/RTT = {}", mb(window_for(*mtu) as f64 / (o.srtt_us.unwrap() as f64 / 1e6)))
            } else {
                String::new()
            },
        );
    }
    println!("  - one send() or recv() syscall per Ethernet frame (no GSO/GRO, no batching): the uplink frame rate is the ceiling;");
    println!("    a 9000-byte MTU moves 6x the payload per syscall. unix-dgram queues hold {} datagrams (net.unix.max_dgram_qlen),",
        std::fs::read_to_string("/proc/sys/net/unix/max_dgram_qlen").map(|s| s.trim().to_owned()).unwrap_or_default());
    println!("    so the sender stalls until the receiver drains (counted as send stalls above).");
    println!("  - the TCP window must fit the receiver's socket queue or frames drop and smoltcp's 1 s minimum RTO stalls the flow;");
    println!("  - per frame, besides the syscalls: one copy guest memory → TCP send buffer (FPDU built in place, CRC32c over it),");
    println!("    smoltcp's copy into the frame + checksum, and on receive smoltcp's copy into its buffer, CRC32c, one copy into guest memory.");
    println!("\ntotal bench time {:.1} s", started.elapsed().as_secs_f64());
    let _ = std::fs::remove_dir_all(&dir);
}
