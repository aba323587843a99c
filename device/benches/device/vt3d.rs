//! vt3d as deployed: `vt3d serve` child processes with their real command
//! line on a real uplink, and what /proc says about them.

use std::fs::File;
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Which uplink the two vt3d processes share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UplinkKind {
    UnixDgram,
    Udp,
    /// Two taps (vnet header, TSO) in a Linux bridge the bench makes: root.
    Tap,
}

impl UplinkKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::UnixDgram => "unix-dgram",
            Self::Udp => "udp",
            Self::Tap => "tap",
        }
    }

    /// `--uplink` for side `a` and `b` (each the other's peer), and the
    /// bridge a tap pair lives in.
    fn specs(self, dir: &Path, mtu: u32) -> ([String; 2], Option<Arc<TapBridge>>) {
        if self == Self::Tap {
            let bridge = TapBridge::new(mtu);
            let specs = [format!("tap:{}", bridge.taps[0]), format!("tap:{}", bridge.taps[1])];
            return (specs, Some(Arc::new(bridge)));
        }
        (self.datagram_specs(dir), None)
    }

    fn datagram_specs(self, dir: &Path) -> [String; 2] {
        match self {
            Self::UnixDgram => {
                let (a, b) = (dir.join("a.uplink"), dir.join("b.uplink"));
                [
                    format!("unix-dgram:{},{}", a.display(), b.display()),
                    format!("unix-dgram:{},{}", b.display(), a.display()),
                ]
            }
            Self::Udp => {
                let (a, b) = (free_udp_port(), free_udp_port());
                [format!("udp:127.0.0.1:{a},127.0.0.1:{b}"), format!("udp:127.0.0.1:{b},127.0.0.1:{a}")]
            }
            Self::Tap => unreachable!("taps are made by specs()"),
        }
    }
}

/// Whether the bench may make taps and bridges (CAP_NET_ADMIN: root).
pub fn can_make_taps() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Two persistent taps in a bridge of their own, at one MTU; removed on
/// drop (after the vt3d using them are gone).
#[derive(Debug)]
pub struct TapBridge {
    bridge: String,
    taps: [String; 2],
}

static BRIDGES: AtomicUsize = AtomicUsize::new(0);

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip (iproute2)");
    assert!(out.status.success(), "ip {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

impl TapBridge {
    fn new(mtu: u32) -> Self {
        assert!(can_make_taps(), "the tap uplink's bridge needs root (CAP_NET_ADMIN)");
        let stem = format!("vtb{}x{}", std::process::id() % 100_000, BRIDGES.fetch_add(1, Ordering::Relaxed));
        let this = Self { bridge: format!("{stem}br"), taps: [format!("{stem}a"), format!("{stem}b")] };
        let mtu = mtu.to_string();
        ip(&["link", "add", &this.bridge, "type", "bridge"]);
        for tap in &this.taps {
            ip(&["tuntap", "add", "dev", tap, "mode", "tap"]);
            // IPv6 autoconfiguration would put frames of its own on the bridge.
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{tap}/disable_ipv6"), "1");
            ip(&["link", "set", tap, "mtu", &mtu, "master", &this.bridge, "up"]);
        }
        ip(&["link", "set", &this.bridge, "mtu", &mtu, "up"]);
        this
    }
}

impl Drop for TapBridge {
    fn drop(&mut self) {
        for link in self.taps.iter().chain([&self.bridge]) {
            let _ = Command::new("ip").args(["link", "del", link]).output();
        }
    }
}

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").and_then(|s| s.local_addr()).map(|a| a.port()).expect("a free UDP port")
}

/// One `vt3d serve`.
#[derive(Debug)]
pub struct Vt3d {
    child: Child,
    pub socket: PathBuf,
    /// The provisioned key (its file is `--key-file`): the synthetic
    /// guest's driver proves it.
    pub key: [u64; 2],
    log: PathBuf,
    /// The taps' bridge, shared by the pair (dropped after the process).
    _bridge: Option<Arc<TapBridge>>,
}

/// The vt3d binary: `VT3D` if set, else the one cargo built beside this bench.
pub fn binary() -> PathBuf {
    std::env::var_os("VT3D").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vt3d")), PathBuf::from)
}

impl Vt3d {
    /// Starts the pair `a`, `b` on `uplink` with `mtu`, sockets in `dir`.
    pub fn pair(dir: &Path, uplink: UplinkKind, mtu: u32, macs: [[u8; 6]; 2]) -> [Self; 2] {
        let (specs, bridge) = uplink.specs(dir, mtu);
        let start = |name: &str, spec: &str, mac: [u8; 6], key: [u64; 2]| {
            let socket = dir.join(format!("{name}.vhost"));
            let key_file = dir.join(format!("{name}.key"));
            let bytes: Vec<u8> = key.iter().flat_map(|w| w.to_le_bytes()).collect();
            std::fs::write(&key_file, bytes).expect("key file");
            let log = dir.join(format!("{name}.log"));
            let _ = std::fs::remove_file(&socket);
            let mac = mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
            let child = Command::new(binary())
                .args(["serve", "--socket"])
                .arg(&socket)
                .args(["--uplink", spec, "--mac", &mac, "--mtu", &mtu.to_string()])
                .arg("--mgmt")
                .arg(dir.join(format!("{name}.mgmt")))
                .arg("--key-file")
                .arg(&key_file)
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(File::create(&log).expect("vt3d log file"))
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", binary().display()));
            Self { child, socket, key, log, _bridge: bridge.clone() }
        };
        [start("a", &specs[0], macs[0], [0xb3, 0x5eed]), start("b", &specs[1], macs[1], [0xb4, 0x5eed])]
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// User + system CPU time so far, seconds (/proc/PID/stat).
    pub fn cpu_seconds(&self) -> f64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).unwrap_or_default();
        // Fields after the command name (which may hold spaces): state is 3rd.
        let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
        // utime and stime are fields 14 and 15 of stat, 12 and 13 here.
        // SAFETY: sysconf reads a configuration value, no memory of ours.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        (ticks(11) + ticks(12)) as f64 / hz as f64
    }

    /// Resident set, KiB (/proc/PID/status VmRSS).
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Copies /proc/PID/{status,smaps_rollup,smaps} to `dir/NAME-{what}` (memory breakdowns).
    pub fn snapshot_memory(&self, dir: &std::path::Path, name: &str) {
        for what in ["status", "smaps_rollup", "smaps"] {
            let text = std::fs::read_to_string(format!("/proc/{}/{what}", self.pid())).unwrap_or_default();
            std::fs::write(dir.join(format!("{name}-{what}")), text).expect("write a memory snapshot");
        }
    }

    /// `vt3d ctl` against this process (for a failure report).
    pub fn ctl(&self, request: &str) -> String {
        let mgmt = self.socket.with_extension("mgmt");
        Command::new(binary())
            .args(["ctl", "--mgmt"])
            .arg(mgmt)
            .arg(request)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// RQ WQEs vt3d fetched from QP `qpn`'s ring (`vt3d ctl qps`).
    pub fn rq_fetched(&self, qpn: u32) -> Option<u64> {
        let table = self.ctl("qps");
        let mut lines = table.lines();
        let header: Vec<&str> = lines.next()?.split_whitespace().collect();
        let column = header.iter().position(|h| *h == "rq_fetched")?;
        lines
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|row| row.first() == Some(&qpn.to_string().as_str()))
            .and_then(|row| row.get(column).and_then(|v| v.parse().ok()))
    }

    /// The child's log so far (for a failure report).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for Vt3d {
    fn drop(&mut self) {
        // SIGTERM: vt3d resets its connections and exits cleanly.
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill sends a signal to our own child, by its pid
            // (always > 0); no memory is passed.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let _ = self.child.wait();
    }
}
