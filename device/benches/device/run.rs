//! The scenarios, the table and `build/bench/device.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use vt3d::abi::{Access, Cmd, EventCm, EventType, WcStatus, WrOpcode};

use crate::anchors;
use vt3d::testing::{accept_args, connect_args, listen_args, rdma_wqe, sockaddr, CqRing, Mr, QpRings};

use crate::guest::{self, sq_wqe, Frames, Guest};
use crate::vt3d::{UplinkKind, Vt3d};

const MACS: [[u8; 6]; 2] = [[0x52, 0x54, 0, 0xb3, 0, 1], [0x52, 0x54, 0, 0xb3, 0, 2]];
const IPS: [[u8; 4]; 2] = [[10, 93, 0, 1], [10, 93, 0, 2]];
const PORT: u16 = 7174;
const MIB: u64 = 1 << 20;
/// Each side registers this much (WRITE/READ sources and sinks share it).
const MR_LEN: u64 = 8 * MIB;
const QP_DEPTH: u32 = 16;
/// Guest RAM a QP's rings take in the synthetic guest (SQ and RQ: a page
/// and a page-list page each).
const QP_GUEST_BYTES: usize = 4 * 4096;
/// Guest RAM besides the QPs' rings (the MR, CQs, virtqueues).
const GUEST_BASE_BYTES: usize = 160 << 20;
/// Idle connections opened between two progress lines.
const IDLE_STEP: usize = 1000;
/// 1 MiB WRs in flight per QP.
const IN_FLIGHT: u32 = 8;
/// `--mtu`'s upper bound: the largest MTU both uplinks carry (a UDP
/// datagram holds 65507 octets, a unix datagram more).
pub const MAX_MTU: u32 = 65_000;
const ALL: u32 = Access::LocalWrite as u32 | Access::RemoteWrite as u32 | Access::RemoteRead as u32;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Seconds per measurement.
    pub secs: f64,
    pub uplinks: Vec<UplinkKind>,
    pub mtus: Vec<u32>,
    /// QPs of the many-QP measurement.
    pub qps: usize,
    /// Idle connections of the memory measurement.
    pub idle_conns: usize,
    /// Times each measurement runs: its row is the median, with min–max.
    pub repeats: usize,
    pub out: PathBuf,
}

impl Options {
    /// The full run (`cargo bench -p vt3d --bench device`).
    pub fn full(out: PathBuf) -> Self {
        Self {
            secs: 2.0,
            uplinks: vec![UplinkKind::UnixDgram, UplinkKind::Udp],
            mtus: vec![1500, 9000, MAX_MTU],
            qps: 64,
            idle_conns: 512,
            repeats: 5,
            out,
        }
    }

    /// A few seconds: CI checks that it runs and writes its keys.
    pub fn short(out: PathBuf) -> Self {
        Self {
            secs: 0.25,
            uplinks: vec![UplinkKind::UnixDgram],
            mtus: vec![1500, MAX_MTU],
            qps: 64,
            idle_conns: 32,
            repeats: 1,
            out,
        }
    }
}

pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples.get(samples.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The repeats of one measurement.
#[derive(Debug, Default, Clone)]
struct Stat(Vec<f64>);

impl Stat {
    fn push(&mut self, v: f64) {
        self.0.push(v);
    }

    fn sorted(&self) -> Vec<f64> {
        let mut v = self.0.clone();
        v.sort_by(f64::total_cmp);
        v
    }

    /// The median; NaN when it was not measured.
    fn median(&self) -> f64 {
        median(&mut self.0.clone())
    }

    fn min(&self) -> f64 {
        self.sorted().first().copied().unwrap_or(f64::NAN)
    }

    fn max(&self) -> f64 {
        self.sorted().last().copied().unwrap_or(f64::NAN)
    }

    fn measured(&self) -> Option<f64> {
        (!self.0.is_empty()).then(|| self.median())
    }

    /// `median (min–max)` in `f`'s format; `-` when not measured.
    fn show(&self, f: &dyn Fn(f64) -> String) -> String {
        match self.0.len() {
            0 => "-".into(),
            1 => f(self.median()),
            _ => format!("{} ({}–{})", f(self.median()), f(self.min()), f(self.max())),
        }
    }
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    // sorted by median() before
    let at = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples.get(at).copied().unwrap_or(f64::NAN)
}

/// Two vt3d processes and their synthetic guests, set up as vt3.ko would:
/// an address, a PD, CQs and a registered buffer each; B listens.
struct Pair {
    a: Guest,
    b: Guest,
    procs: [Vt3d; 2],
    scq: [CqRing; 2],
    rcq: [CqRing; 2],
    pd: [u32; 2],
    mr: [Mr; 2],
    next_port: u16,
    /// QPs whose receive rings the ping-pong filled already: each repeat
    /// re-posts what it consumed, so filling again would overrun them.
    primed: std::collections::BTreeSet<u32>,
}

impl Pair {
    /// `qps`: how many QPs each guest will create at most.
    fn start(dir: &Path, uplink: UplinkKind, mtu: u32, cq_depth: u32, qps: usize) -> Self {
        let procs = Vt3d::pair(dir, uplink, mtu, MACS);
        // A memfd: pages no QP uses are never allocated.
        let ram = GUEST_BASE_BYTES + qps * QP_GUEST_BYTES;
        let boot = |i: usize| {
            let mut g = guest::boot(&procs[i].socket, MACS[i], IPS[i], ram, procs[i].key);
            g.set_addr(IPS[i]).expect("SET_ADDR");
            let pd = g.pd();
            let scq = g.cq(cq_depth);
            let rcq = g.cq(cq_depth);
            let mr = g.mr(pd, MR_LEN, ALL);
            (g, pd, scq, rcq, mr)
        };
        let (a, pa, sa, ra, ma) = boot(0);
        let (mut b, pb, sb, rb, mb) = boot(1);
        b.cmd(Cmd::Listen, &listen_args(PORT, 128)).expect("LISTEN");
        Self {
            a,
            b,
            procs,
            scq: [sa, sb],
            rcq: [ra, rb],
            pd: [pa, pb],
            mr: [ma, mb],
            next_port: 40_000,
            primed: std::collections::BTreeSet::new(),
        }
    }

    fn cpu_seconds(&self) -> f64 {
        self.procs.iter().map(Vt3d::cpu_seconds).sum()
    }

    fn failure(&mut self, what: &str) -> ! {
        self.a.poll_rx();
        self.b.poll_rx();
        panic!(
            "{what}\nQP events (qpn, code, detail): a {:?}, b {:?}\n--- vt3d a ---\n{}\n{}\n{}\n--- vt3d b ---\n{}\n{}\n{}",
            self.a.qp_events(),
            self.b.qp_events(),
            self.procs[0].log_tail(),
            self.procs[0].ctl("qps"),
            self.procs[0].ctl("tcb"),
            self.procs[1].log_tail(),
            self.procs[1].ctl("qps"),
            self.procs[1].ctl("tcb"),
        );
    }

    /// `n` connections A → B, each between two fresh QPs, `wave` at a time
    /// (B's backlog holds 128 requests).
    fn connect(&mut self, n: usize) -> Vec<(QpRings, QpRings)> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let wave = (n - out.len()).min(64);
            let mut pending = Vec::new();
            let mut b_qps = Vec::new();
            for _ in 0..wave {
                let qa = self.a.qp(self.pd[0], self.scq[0], self.rcq[0], QP_DEPTH);
                let qb = self.b.qp(self.pd[1], self.scq[1], self.rcq[1], QP_DEPTH);
                let port = self.next_port;
                self.next_port += 1;
                let args = connect_args(qa.qpn, port, sockaddr(self.b.ip, PORT), self.b.mac, b"");
                self.a.cmd(Cmd::Connect, &args).expect("CONNECT");
                pending.push(qa);
                b_qps.push(qb);
            }
            let mut accepted: BTreeMap<u32, QpRings> = BTreeMap::new();
            let mut replies = Vec::new();
            let start = Instant::now();
            while replies.len() < wave {
                let mut progress = self.b.poll_rx() | self.a.poll_rx();
                while let Some(body) = self.b.events.take(EventType::ConnectRequest) {
                    let req: EventCm = vt3d::abi::read_struct(&body).expect("a CONNECT_REQUEST");
                    let qb = b_qps.pop().unwrap_or_else(|| self.failure("more requests than connects"));
                    self.b
                        .cmd(Cmd::Accept, &accept_args(req.conn_id.to_native(), qb.qpn, b""))
                        .unwrap_or_else(|s| self.failure(&format!("ACCEPT: {}", s.name())));
                    let port = u16::from_be_bytes(req.remote.port);
                    accepted.insert(u32::from(port), qb);
                    progress = true;
                }
                while self.b.events.take(EventType::Established).is_some() {}
                while let Some(body) = self.a.events.take(EventType::ConnectReply) {
                    let reply: EventCm = vt3d::abi::read_struct(&body).expect("a CONNECT_REPLY");
                    if reply.status.to_native() != 0 {
                        self.failure(&format!("connection refused: status {}", reply.status.to_native()));
                    }
                    replies.push((reply.qpn.to_native(), u16::from_be_bytes(reply.local.port)));
                    progress = true;
                }
                if start.elapsed() > Duration::from_secs(30) {
                    self.failure(&format!("{} of {wave} connections after 30 s", replies.len()));
                }
                if !progress {
                    std::thread::yield_now();
                }
            }
            for (qpn, port) in replies {
                let qa = *pending.iter().find(|q| q.qpn == qpn).unwrap_or_else(|| self.failure("a reply for no QP"));
                let qb = accepted.remove(&u32::from(port)).unwrap_or_else(|| self.failure("a reply for no request"));
                out.push((qa, qb));
            }
        }
        out
    }

    /// 1 MiB WRITEs (or READs) from A on every QP, `IN_FLIGHT` each, for
    /// `secs`: octets per second, vt3d CPU seconds (both processes) per GB.
    fn stream(&mut self, qps: &mut [(QpRings, QpRings)], opcode: WrOpcode, secs: f64) -> (f64, f64) {
        let len = MIB as u32;
        let slots = MR_LEN / MIB;
        let index: BTreeMap<u32, usize> = qps.iter().enumerate().map(|(i, (qa, _))| (qa.qpn, i)).collect();
        let (local, remote) = (self.mr[0], self.mr[1]);
        let mut posted = 0u64;
        let post = |guest: &mut Guest, qa: &mut QpRings, n: u64| {
            let slot = n % slots;
            guest.post_send(qa, &rdma_wqe(n, opcode, (local, slot * MIB, len), &remote, slot * MIB));
        };
        for (qa, _) in qps.iter_mut() {
            for _ in 0..IN_FLIGHT {
                post(&mut self.a, qa, posted);
                posted += 1;
            }
        }
        let mut cqes = Vec::new();
        let cpu0 = self.cpu_seconds();
        let start = Instant::now();
        let mut done = 0u64;
        let mut last = Instant::now();
        // At least one WR, however short the run (a debug vt3d in CI).
        while start.elapsed().as_secs_f64() < secs || done == 0 {
            cqes.clear();
            if self.a.ram.reap(&mut self.scq[0], &mut cqes) == 0 {
                self.a.poll_rx();
                if last.elapsed() > Duration::from_secs(10) {
                    self.failure("no completion for 10 s");
                }
                std::thread::sleep(Duration::from_micros(20));
                continue;
            }
            last = Instant::now();
            for c in &cqes {
                if c.status != WcStatus::Success as u8 {
                    self.failure(&format!("{opcode:?} completed with status {}", c.status));
                }
                done += u64::from(len);
                let Some(&i) = index.get(&c.qpn.to_native()) else { continue };
                if let Some((qa, _)) = qps.get_mut(i) {
                    post(&mut self.a, qa, posted);
                    posted += 1;
                }
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let cpu = self.cpu_seconds() - cpu0;
        if std::env::var_os("VT3_BENCH_TCB").is_some() {
            let tcb = self.procs[0].ctl("tcb");
            let rows: Vec<&str> = tcb.lines().filter(|l| !l.contains("LISTEN")).take(4).collect();
            println!("{opcode:?} on {} QPs, sender's TCBs:\n{}", qps.len(), rows.join("\n"));
        }
        // Let the WRs in flight finish before the next measurement.
        self.drain(qps);
        (done as f64 / elapsed, cpu / (done as f64 / 1e9))
    }

    fn drain(&mut self, qps: &[(QpRings, QpRings)]) {
        let start = Instant::now();
        let mut cqes = Vec::new();
        while qps.iter().any(|(qa, _)| qa.sq_outstanding(&self.a.ram) > 0) && start.elapsed() < Duration::from_secs(10)
        {
            cqes.clear();
            self.a.ram.reap(&mut self.scq[0], &mut cqes);
            self.a.poll_rx();
            std::thread::sleep(Duration::from_micros(50));
        }
        cqes.clear();
        self.a.ram.reap(&mut self.scq[0], &mut cqes);
    }

    /// 64-octet SEND ping-pong on one connection: (median, p99) round
    /// trip in µs, and the doorbells both guests rang per round trip (four
    /// posts each: the device polls a queue that just gave work, so most
    /// need none).
    fn ping_pong(&mut self, qp: &mut (QpRings, QpRings), secs: f64) -> (f64, f64, f64) {
        let (qa, qb) = qp;
        let (ma, mb) = (self.mr[0], self.mr[1]);
        let recv_at = 4 * MIB;
        if self.primed.insert(qa.qpn) {
            for i in 0..8 {
                self.a.post_recv(qa, i, &ma, recv_at + i * 64, 64);
                self.b.post_recv(qb, i, &mb, recv_at + i * 64, 64);
            }
        }
        // The measurement starts once both vt3d hold the receives (a SEND
        // that finds none makes vt3d read the RQ, but the first round trip
        // would pay for it). The guest cannot see that (rq_cons moves on
        // completion), so the bench asks vt3d's management socket.
        for (side, q) in [(0, qa.qpn), (1, qb.qpn)] {
            let start = Instant::now();
            while self.procs[side].rq_fetched(q) < Some(8) {
                if start.elapsed() > Duration::from_secs(5) {
                    self.failure(&format!("vt3d {side}: receives of QP {q} not fetched after their doorbell"));
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        let mut cqes = Vec::new();
        let mut samples = Vec::new();
        let doorbells = self.a.doorbells + self.b.doorbells;
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed().as_secs_f64() < secs {
            let sent = Instant::now();
            self.a.post_send(qa, &sq_wqe(n, WrOpcode::Send, &ma, 0, 64));
            self.await_recv(1, sent);
            self.b.post_recv(qb, n, &mb, recv_at + (n % 8) * 64, 64);
            self.b.post_send(qb, &sq_wqe(n, WrOpcode::Send, &mb, 0, 64));
            self.await_recv(0, sent);
            samples.push(sent.elapsed().as_secs_f64() * 1e6);
            self.a.post_recv(qa, n, &ma, recv_at + (n % 8) * 64, 64);
            for side in 0..2 {
                cqes.clear();
                let g = if side == 0 { &mut self.a } else { &mut self.b };
                g.ram.reap(&mut self.scq[side], &mut cqes);
            }
            n += 1;
        }
        let p50 = median(&mut samples);
        let rung = (self.a.doorbells + self.b.doorbells - doorbells) as f64 / n.max(1) as f64;
        (p50, percentile(&samples, 0.99), rung)
    }

    /// The path's own anchor: a 64-octet plain Ethernet frame A → B and
    /// back through both vt3d processes and the uplink (no RDMA), one in
    /// flight: round trip p50 in µs.
    fn forward_ping_pong(&mut self, secs: f64) -> f64 {
        let mut ab = plain_frame(MACS[0], MACS[1], 64);
        let mut ba = plain_frame(MACS[1], MACS[0], 64);
        let mut samples = Vec::new();
        let start = Instant::now();
        let mut n = 0u64;
        while start.elapsed().as_secs_f64() < secs || n == 0 {
            let sent = Instant::now();
            let b0 = self.b.dev.plain_rx;
            self.send_plain(0, &mut ab, n, sent);
            self.await_plain(1, b0, sent);
            let a0 = self.a.dev.plain_rx;
            self.send_plain(1, &mut ba, n, sent);
            self.await_plain(0, a0, sent);
            samples.push(sent.elapsed().as_secs_f64() * 1e6);
            n += 1;
        }
        median(&mut samples)
    }

    /// 1514-octet plain frames A → B for `secs`, in bursts as a driver
    /// sends them: frames per second delivered into B's RX ring.
    fn forward_stream(&mut self, secs: f64) -> f64 {
        let mut frame = plain_frame(MACS[0], MACS[1], 1514);
        let b0 = self.b.dev.plain_rx;
        let mut seq = 0u64;
        let start = Instant::now();
        while start.elapsed().as_secs_f64() < secs || self.b.dev.plain_rx == b0 {
            let sent = self.a.send_burst(&mut frame, seq, 64);
            seq += sent as u64;
            let got = self.b.poll_rx();
            if sent == 0 && !got {
                std::thread::yield_now();
            }
            if start.elapsed() > Duration::from_secs(10) {
                self.failure("no plain frame arrived for 10 s");
            }
        }
        let elapsed = start.elapsed().as_secs_f64();
        let rate = (self.b.dev.plain_rx - b0) as f64 / elapsed;
        // What is still on its way is not counted, and not left behind.
        let settle = Instant::now();
        while settle.elapsed() < Duration::from_millis(50) {
            self.b.poll_rx();
            std::thread::yield_now();
        }
        rate
    }

    /// Sends one plain frame from `side`, waiting for a TX buffer (at most
    /// 10 s: a vt3d that stopped reading the ring fails the run).
    fn send_plain(&mut self, side: usize, frame: &mut [u8], seq: u64, since: Instant) {
        loop {
            let g = if side == 0 { &mut self.a } else { &mut self.b };
            if g.send_burst(frame, seq, 1) == 1 {
                return;
            }
            if since.elapsed() > Duration::from_secs(10) {
                self.failure("no TX buffer came back for 10 s");
            }
            std::thread::yield_now();
        }
    }

    fn await_plain(&mut self, side: usize, before: u64, since: Instant) {
        loop {
            let g = if side == 0 { &mut self.a } else { &mut self.b };
            g.poll_rx();
            if g.dev.plain_rx > before {
                return;
            }
            if since.elapsed() > Duration::from_secs(10) {
                self.failure("a plain frame of the ping-pong was lost");
            }
            std::thread::yield_now();
        }
    }

    /// Both vt3d processes' CPU, in % of one core, over `secs` without
    /// traffic (connections up): polling must stop when the work does.
    fn idle_cpu_percent(&self, secs: f64) -> f64 {
        // Longer than any polling window.
        std::thread::sleep(Duration::from_millis(20));
        let cpu0 = self.cpu_seconds();
        std::thread::sleep(Duration::from_secs_f64(secs));
        (self.cpu_seconds() - cpu0) / secs * 100.0
    }

    fn await_recv(&mut self, side: usize, since: Instant) {
        let mut cqes = Vec::new();
        loop {
            let g = if side == 0 { &mut self.a } else { &mut self.b };
            if g.ram.reap(&mut self.rcq[side], &mut cqes) > 0 {
                if cqes.iter().any(|c| c.status != WcStatus::Success as u8) {
                    self.failure("a receive completed in error");
                }
                return;
            }
            if since.elapsed() > Duration::from_secs(10) {
                self.failure("no SEND arrived for 10 s");
            }
            std::thread::yield_now();
        }
    }
}

/// A plain Ethernet frame of `len` octets (EtherType 0x88B6, the other
/// IEEE local experimental one: neither IP nor vt3's control channel).
fn plain_frame(src: [u8; 6], dst: [u8; 6], len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[..6].copy_from_slice(&dst);
    f[6..12].copy_from_slice(&src);
    f[12..14].copy_from_slice(&0x88b6u16.to_be_bytes());
    f
}

/// What one uplink × MTU gave, each measurement over the repeats.
#[derive(Debug, Default, Clone)]
struct Row {
    write_mbs: Stat,
    cpu_s_per_gb: Stat,
    read_mbs: Stat,
    /// The many-QP WRITE: MB/s and vt3d CPU seconds per GB.
    qps_mbs: Stat,
    qps_cpu_s_per_gb: Stat,
    rtt_p50_us: Stat,
    rtt_p99_us: Stat,
    doorbells_per_rtt: Stat,
    idle_cpu_percent: Stat,
    /// The forwarding anchor: plain frames through the same two vt3d.
    forward_rtt_us: Stat,
    forward_1514_per_s: Stat,
}

fn mbs(bytes_per_sec: f64) -> f64 {
    bytes_per_sec / 1e6
}

pub fn run(opts: &Options) -> Value {
    let dir = tempfile::Builder::new().prefix("vt3-device-bench").tempdir().expect("temp dir");
    let started = Instant::now();
    println!(
        "vt3d device benchmark: two `vt3d serve` ({}), synthetic guests over vhost-user, {} s per measurement, \
         {} repeat(s)",
        crate::vt3d::binary().display(),
        opts.secs,
        opts.repeats
    );

    // The anchors run before and after vt3d and keep the better of the
    // two: a shared machine only ever makes them slower.
    let anchor_pass = |raw: &mut BTreeMap<&'static str, (f64, f64)>| {
        let tcp = anchors::tcp_loopback(opts.secs / 2.0);
        // A tap has no raw datagram anchor of its own.
        for &u in opts.uplinks.iter().filter(|&&u| u != UplinkKind::Tap) {
            let rate = anchors::datagram_rate(u, 1514, opts.secs / 2.0, dir.path());
            let pp = anchors::datagram_ping_pong(u, opts.secs / 2.0, dir.path());
            let best = raw.get(u.name()).map_or((rate, pp), |&(r, p)| (r.max(rate), p.min(pp)));
            raw.insert(u.name(), best);
        }
        tcp
    };
    let mut raw = BTreeMap::new();
    let mut tcp = anchor_pass(&mut raw);

    let mut rows: BTreeMap<(&str, u32), Row> = BTreeMap::new();
    for &u in &opts.uplinks {
        for &mtu in &opts.mtus {
            let mut pair = Pair::start(dir.path(), u, mtu, 1024, 1 + opts.qps);
            let mut one = pair.connect(1);
            let mut many = None;
            let mut row = Row::default();
            for _ in 0..opts.repeats.max(1) {
                let (rate, cpu_s_per_gb) = pair.stream(&mut one, WrOpcode::Write, opts.secs);
                row.write_mbs.push(mbs(rate));
                row.cpu_s_per_gb.push(cpu_s_per_gb);
                if mtu != 1500 {
                    continue;
                }
                row.read_mbs.push(mbs(pair.stream(&mut one, WrOpcode::Read, opts.secs).0));
                if let Some(qp) = one.first_mut() {
                    let (p50, p99, rung) = pair.ping_pong(qp, opts.secs);
                    row.rtt_p50_us.push(p50);
                    row.rtt_p99_us.push(p99);
                    row.doorbells_per_rtt.push(rung);
                    row.idle_cpu_percent.push(pair.idle_cpu_percent(opts.secs.max(0.5)));
                }
                row.forward_rtt_us.push(pair.forward_ping_pong(opts.secs));
                row.forward_1514_per_s.push(pair.forward_stream(opts.secs));
                let many = many.get_or_insert_with(|| pair.connect(opts.qps));
                let (rate, cpu) = pair.stream(many, WrOpcode::Write, opts.secs);
                row.qps_mbs.push(mbs(rate));
                row.qps_cpu_s_per_gb.push(cpu);
            }
            println!("  {} MTU {mtu}: {} MB/s", u.name(), row.write_mbs.show(&|v| format!("{v:.0}")));
            rows.insert((u.name(), mtu), row);
        }
    }

    // Memory per idle connection: RSS before and after, both processes.
    let primary = opts.uplinks.first().copied().unwrap_or(UplinkKind::UnixDgram);
    let mut pair = Pair::start(dir.path(), primary, 1500, 64, 1 + opts.idle_conns);
    let warm = pair.connect(1);
    drop(warm);
    std::thread::sleep(Duration::from_millis(100));
    let before: Vec<u64> = pair.procs.iter().map(Vt3d::rss_kib).collect();
    // VT3_BENCH_SMAPS=DIR: /proc memory files of both processes, before and after.
    let smaps = std::env::var_os("VT3_BENCH_SMAPS").map(PathBuf::from);
    let snapshot = |pair: &Pair, when: &str| {
        if let Some(dir) = &smaps {
            std::fs::create_dir_all(dir).expect("VT3_BENCH_SMAPS directory");
            for (proc, side) in pair.procs.iter().zip(["a", "b"]) {
                proc.snapshot_memory(dir, &format!("{side}-{when}"));
            }
        }
    };
    snapshot(&pair, "before");
    // In steps, each reported: how connection setup and memory scale.
    let mut idle = Vec::with_capacity(opts.idle_conns);
    let step_started = Instant::now();
    while idle.len() < opts.idle_conns {
        idle.extend(pair.connect((opts.idle_conns - idle.len()).min(IDLE_STEP)));
        let rss: u64 = pair.procs.iter().map(Vt3d::rss_kib).sum();
        println!(
            "  {} idle connections: {:.1} s, vt3d CPU {:.1} s, RSS {} KiB (both processes)",
            idle.len(),
            step_started.elapsed().as_secs_f64(),
            pair.cpu_seconds(),
            rss
        );
    }
    std::thread::sleep(Duration::from_millis(200));
    let after: Vec<u64> = pair.procs.iter().map(Vt3d::rss_kib).collect();
    snapshot(&pair, "after");
    let grown: u64 = after.iter().zip(&before).map(|(a, b)| a.saturating_sub(*b)).sum();
    let rss_per_conn = grown as f64 / 2.0 / idle.len().max(1) as f64;
    drop(pair);

    tcp = tcp.max(anchor_pass(&mut raw));
    let report = Report { opts, tcp, raw, rows, rss_per_conn, idle: idle.len(), primary };
    let value = report.json();
    report.print();
    if let Some(parent) = opts.out.parent() {
        std::fs::create_dir_all(parent).expect("output directory");
    }
    std::fs::write(&opts.out, serde_json::to_string_pretty(&value).expect("JSON") + "\n").expect("write the JSON");
    println!("\nwrote {} ({:.1} s in all)", opts.out.display(), started.elapsed().as_secs_f64());
    value
}

struct Report<'a> {
    opts: &'a Options,
    tcp: f64,
    /// Per uplink: raw 1514-octet datagrams per second, ping-pong µs.
    raw: BTreeMap<&'static str, (f64, f64)>,
    rows: BTreeMap<(&'static str, u32), Row>,
    rss_per_conn: f64,
    idle: usize,
    primary: UplinkKind,
}

/// Payload of one frame at `mtu`: TCP/IP headers, MPA/DDP/CRC per FPDU.
fn payload_per_frame(mtu: u32) -> f64 {
    f64::from(mtu - 40 - 30)
}

impl Report<'_> {
    fn max_mtu(&self) -> u32 {
        self.opts.mtus.iter().copied().max().unwrap_or(1500)
    }

    fn json(&self) -> Value {
        let p = self.primary.name();
        let row = |mtu| self.rows.get(&(p, mtu)).cloned().unwrap_or_default();
        let (rate, pp) = self.raw.get(p).copied().unwrap_or((f64::NAN, f64::NAN));
        let r1500 = row(1500);
        let ceiling = mbs(rate * payload_per_frame(1500));
        let rtt = r1500.rtt_p50_us.median();
        let forward_rtt = r1500.forward_rtt_us.median();
        let qp64 = r1500.qps_mbs.median() / r1500.write_mbs.median();
        let max = row(self.max_mtu());
        let mut per_uplink = serde_json::Map::new();
        for &u in &self.opts.uplinks {
            let mut m = serde_json::Map::new();
            // A measurement's median under its key, its spread beside it.
            let mut put = |key: String, stat: &Stat| {
                if stat.measured().is_some() {
                    m.insert(format!("{key}_min"), json!(stat.min()));
                    m.insert(format!("{key}_max"), json!(stat.max()));
                    m.insert(key, json!(stat.median()));
                }
            };
            for &mtu in &self.opts.mtus {
                let r = self.rows.get(&(u.name(), mtu)).cloned().unwrap_or_default();
                put(format!("write_1m_{mtu}_mbs"), &r.write_mbs);
                put(format!("cpu_s_per_gb_{mtu}"), &r.cpu_s_per_gb);
                put(format!("read_1m_{mtu}_mbs"), &r.read_mbs);
                put(format!("write_1m_{mtu}_{}qp_mbs", self.opts.qps), &r.qps_mbs);
                put(format!("cpu_s_per_gb_{mtu}_{}qp", self.opts.qps), &r.qps_cpu_s_per_gb);
                put("rtt_64_us".into(), &r.rtt_p50_us);
                put("rtt_64_p99_us".into(), &r.rtt_p99_us);
                put("pingpong_doorbells_per_rtt".into(), &r.doorbells_per_rtt);
                put("idle_cpu_percent".into(), &r.idle_cpu_percent);
                put("forward_pingpong_us".into(), &r.forward_rtt_us);
                put("forward_1514_per_s".into(), &r.forward_1514_per_s);
            }
            let (rate, pp) = self.raw.get(u.name()).copied().unwrap_or((f64::NAN, f64::NAN));
            m.insert("raw_1514_per_s".into(), json!(rate));
            m.insert("raw_1500_ceiling_mbs".into(), json!(mbs(rate * payload_per_frame(1500))));
            m.insert("raw_pingpong_us".into(), json!(pp));
            per_uplink.insert(u.name().into(), Value::Object(m));
        }
        json!({
            "uplink": p,
            "max_mtu": self.max_mtu(),
            "secs": self.opts.secs,
            "repeats": self.opts.repeats,
            "write_1m_max_mtu_mbs": max.write_mbs.median(),
            "tcp_loopback_mbs": mbs(self.tcp),
            "write_1m_1500_mbs": r1500.write_mbs.median(),
            "raw_1500_ceiling_mbs": ceiling,
            "rtt_64_us": rtt,
            "raw_pingpong_us": pp,
            "forward_pingpong_us": forward_rtt,
            "forward_1514_per_s": r1500.forward_1514_per_s.median(),
            "qp64_vs_qp1": qp64,
            "qps": self.opts.qps,
            "rss_per_idle_conn_kib": self.rss_per_conn,
            "idle_conns": self.idle,
            "read_1m_1500_mbs": r1500.read_mbs.measured(),
            "cpu_s_per_gb_1500": r1500.cpu_s_per_gb.median(),
            "pingpong_doorbells_per_rtt": r1500.doorbells_per_rtt.measured(),
            "idle_cpu_percent": r1500.idle_cpu_percent.measured(),
            "ratios": {
                "max_mtu_vs_tcp_loopback": max.write_mbs.median() / mbs(self.tcp),
                "write_1500_vs_raw_ceiling": r1500.write_mbs.median() / ceiling,
                "rtt_vs_raw_pingpong": rtt / pp,
                "rtt_vs_forward_pingpong": rtt / forward_rtt,
            },
            "uplinks": per_uplink,
        })
    }

    fn print(&self) {
        println!(
            "\n| measurement ({} repeat(s): median (min–max)) | {} | host anchor (same run) |",
            self.opts.repeats,
            self.opts.uplinks.iter().map(|u| format!("vt3d over {}", u.name())).collect::<Vec<_>>().join(" | ")
        );
        println!("|---|{}---|", "---|".repeat(self.opts.uplinks.len()));
        let cells = |mtu: u32, f: &dyn Fn(&Row) -> String| {
            self.opts
                .uplinks
                .iter()
                .map(|u| self.rows.get(&(u.name(), mtu)).map_or("-".into(), f))
                .collect::<Vec<_>>()
                .join(" | ")
        };
        for &mtu in &self.opts.mtus {
            let anchor = if mtu == 1500 {
                format!("TCP loopback 1 MiB writes: {:.0} MB/s", mbs(self.tcp))
            } else {
                String::new()
            };
            println!(
                "| RDMA WRITE 1 MiB, 1 QP, MTU {mtu} | {} | {anchor} |",
                cells(mtu, &|r| format!(
                    "{} MB/s ({} CPU-s/GB)",
                    r.write_mbs.show(&|v| format!("{v:.0}")),
                    r.cpu_s_per_gb.show(&|v| format!("{v:.2}"))
                ))
            );
        }
        println!(
            "| RDMA READ 1 MiB, 1 QP, MTU 1500 | {} | |",
            cells(1500, &|r| format!("{} MB/s", r.read_mbs.show(&|v| format!("{v:.0}"))))
        );
        println!(
            "| RDMA WRITE 1 MiB, {} QPs, MTU 1500 | {} | |",
            self.opts.qps,
            cells(1500, &|r| format!(
                "{} MB/s ({:.2}× 1 QP, {} CPU-s/GB)",
                r.qps_mbs.show(&|v| format!("{v:.0}")),
                r.qps_mbs.median() / r.write_mbs.median(),
                r.qps_cpu_s_per_gb.show(&|v| format!("{v:.2}"))
            ))
        );
        println!(
            "| SEND 64 B ping-pong RTT p50 / p99 | {} | 64 B datagram ping-pong p50: {} |",
            cells(1500, &|r| format!(
                "{} / {} µs",
                r.rtt_p50_us.show(&|v| format!("{v:.1}")),
                r.rtt_p99_us.show(&|v| format!("{v:.0}"))
            )),
            self.raw.iter().map(|(u, r)| format!("{u} {:.1} µs", r.1)).collect::<Vec<_>>().join(", ")
        );
        println!(
            "| plain 64 B frame ping-pong through both vt3d (no RDMA) p50 | {} | the path's own anchor |",
            cells(1500, &|r| format!("{} µs", r.forward_rtt_us.show(&|v| format!("{v:.1}"))))
        );
        println!(
            "| plain 1514 B frames through both vt3d (no RDMA) | {} | as MB/s of 1430 B payload per frame |",
            cells(1500, &|r| format!(
                "{} k/s = {} MB/s",
                r.forward_1514_per_s.show(&|v| format!("{:.0}", v / 1e3)),
                r.forward_1514_per_s.show(&|v| format!("{:.0}", mbs(v * payload_per_frame(1500))))
            ))
        );
        println!(
            "| doorbells per ping-pong round trip (of 4 posts) | {} | |",
            cells(1500, &|r| r.doorbells_per_rtt.show(&|v| format!("{v:.2}")))
        );
        println!(
            "| vt3d CPU with connections up and no traffic | {} | |",
            cells(1500, &|r| format!("{} % of a core", r.idle_cpu_percent.show(&|v| format!("{v:.2}"))))
        );
        println!(
            "| raw datagrams, 1514 B (no vt3d) | {} | the MTU 1500 ceiling: rate × 1430 B of payload |",
            self.opts
                .uplinks
                .iter()
                .map(|u| self.raw.get(u.name()).map_or("-".into(), |r| format!(
                    "{:.0} k/s = {:.0} MB/s",
                    r.0 / 1e3,
                    mbs(r.0 * payload_per_frame(1500))
                )))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        println!(
            "| vt3d RSS per idle connection | {:.1} KiB ({} connections over {}) |{} |",
            self.rss_per_conn,
            self.idle,
            self.primary.name(),
            " |".repeat(self.opts.uplinks.len() - 1)
        );
        let v = self.json();
        println!("\nGoals (docs/architecture.md §8, issue 15), ratios of this run ({}):", self.primary.name());
        let r = &v["ratios"];
        println!(
            "  write_1m_max_mtu / tcp_loopback   = {:.2} (goal ≥ 0.5)",
            r["max_mtu_vs_tcp_loopback"].as_f64().unwrap_or(f64::NAN)
        );
        println!(
            "  write_1m_1500 / raw_1500_ceiling  = {:.2} (goal ≥ 0.8)",
            r["write_1500_vs_raw_ceiling"].as_f64().unwrap_or(f64::NAN)
        );
        println!(
            "  rtt_64 / raw_pingpong             = {:.2} (goal ≤ 1.5)",
            r["rtt_vs_raw_pingpong"].as_f64().unwrap_or(f64::NAN)
        );
        println!(
            "  rtt_64 / forward_pingpong         = {:.2} (RDMA's cost over the hops it cannot avoid)",
            r["rtt_vs_forward_pingpong"].as_f64().unwrap_or(f64::NAN)
        );
        println!(
            "  qp64_vs_qp1                       = {:.2} (goal ≥ 0.9)",
            v["qp64_vs_qp1"].as_f64().unwrap_or(f64::NAN)
        );
        println!("  rss_per_idle_conn_kib             = {:.1} (goal ≤ 20)", self.rss_per_conn);
    }
}
