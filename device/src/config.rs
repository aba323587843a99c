//! Command line (clap derive) and the validated configuration it yields.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::abi::Cmd;
use crate::chaos::schedule::{self as chaos, Kind, Rate};
use crate::nic::{parse_mac, MacAddr};
use crate::uplink::UplinkSpec;

#[derive(Debug, Parser)]
#[command(name = "vt3d", version, about = "vt3d: a virtual T3-class iWARP RNIC for QEMU (vhost-user-net backend)")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve one NIC to QEMU over a vhost-user socket.
    Serve(ServeArgs),
    /// Ask a running vt3d (its --mgmt socket).
    Ctl(CtlArgs),
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The management socket given to `vt3d serve --mgmt`.
    #[arg(long, value_name = "PATH")]
    pub mgmt: PathBuf,
    /// Machine-readable output (one JSON value; errors as {"error": ...}).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub request: CtlRequest,
}

/// One management request as the socket reads it: the words of a
/// `vt3d ctl` command line after `--mgmt PATH` (`--json` included), e.g.
/// `--json fault drop --qp 3 --percent 10`.
#[derive(Debug, Parser)]
#[command(name = "vt3d-ctl", no_binary_name = true, disable_help_subcommand = true)]
pub struct CtlLine {
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub request: CtlRequest,
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum CtlRequest {
    /// NIC counters, RDMA resource counts, iWARP engine counters and
    /// fault-injection counters.
    Stats,
    /// The TCB table of the TOE: state, 4-tuple, seq/ack, windows, RTT,
    /// retransmits, bytes, faults in force.
    Tcb,
    /// The QP table: states, queue progress, connection.
    Qps,
    /// The CQ table: depth, producer index, arming, users.
    Cqs,
    /// The MR table (TPT): STag, PD, rights, IOVA, length, validity.
    Mrs,
    /// Fault injection on a QP's connection (--qp: the guest's QP number,
    /// as `vt3d ctl qps` shows it), an STag, or the whole device.
    #[command(subcommand)]
    Fault(FaultRequest),
    /// A pcapng capture of every frame on the uplink, both ways (offloaded
    /// iWARP connections included), with timestamps and directions.
    #[command(subcommand)]
    Capture(CaptureRequest),
    /// A seeded, replayable schedule of random connection faults (rst,
    /// fin, blackhole, drop, delay, split, corrupt-crc, terminate) aimed
    /// at ports, with a log of what each hit connection did next.
    #[command(subcommand)]
    Chaos(ChaosRequest),
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum ChaosRequest {
    /// Start a run: a schedule drawn from --seed, or one replayed from a log.
    Start(ChaosStart),
    /// Running, finished or stopped; faults injected and skipped so far.
    Status,
    /// Stop the run: no more faults, windows still open end now.
    Stop,
    /// Every fault scheduled: when, what, whom it hit, what came of it.
    Log,
}

/// `chaos start`: --seed and --rate, or --replay alone.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct ChaosStart {
    /// The PRNG's seed (a u64, decimal or 0x hex): one seed, one schedule.
    #[arg(long, value_parser = |s: &str| chaos::parse_seed(s).map_err(|e| e.to_string()),
          required_unless_present = "replay")]
    pub seed: Option<u64>,
    /// Faults per second, on average (exponential gaps), above 0 and at most 100.
    #[arg(long, value_parser = |s: &str| s.parse::<Rate>().map_err(|e| e.to_string()),
          required_unless_present = "replay")]
    pub rate: Option<Rate>,
    /// The kinds drawn from, uniformly [default: rst,fin,blackhole,delay,split].
    #[arg(long, value_delimiter = ',', value_parser = |s: &str| s.parse::<Kind>().map_err(|e| e.to_string()))]
    pub kinds: Vec<Kind>,
    /// Only connections with this TCP port at either end (repeatable);
    /// none: every connection.
    #[arg(long = "port", value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub ports: Vec<u16>,
    /// Finish after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=604_800))]
    pub duration: Option<u64>,
    /// Finish once this many faults were injected (skipped ones do not count).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=10_000))]
    pub max_faults: Option<u64>,
    /// How long drop, delay and split last.
    #[arg(long, value_name = "MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u32).range(1..=chaos::MAX_WINDOW_MS as i64))]
    pub window_ms: u32,
    /// How long a blackhole lasts (under the TCP timeout, 15 s by default).
    #[arg(long, value_name = "MS", default_value_t = 1000,
          value_parser = clap::value_parser!(u32).range(1..=chaos::MAX_BLACKHOLE_MS as i64))]
    pub blackhole_ms: u32,
    /// How long delay holds each frame.
    #[arg(long, value_name = "MS", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=chaos::MAX_DELAY_MS as i64))]
    pub delay_ms: u32,
    /// Replay a log written by `chaos log --json` (a path on vt3d's host):
    /// the same faults at the same offsets with the same draws.
    #[arg(long, value_name = "LOGFILE", value_parser = one_word,
          conflicts_with_all = ["seed", "rate", "kinds", "ports", "duration", "max_faults", "window_ms",
                                "blackhole_ms", "delay_ms"])]
    pub replay: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum CaptureRequest {
    /// Start writing FILE (created or truncated; a relative path is taken
    /// from the client's working directory; no white space).
    Start {
        #[arg(value_name = "FILE", value_parser = one_word)]
        file: PathBuf,
    },
    /// Stop the capture: what was queued is written and the file closed.
    Stop,
}

/// A file name as the request line can carry it (one word).
fn one_word(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() || s.chars().any(char::is_whitespace) {
        return Err(format!("{s:?}: a file name must be one word (no white space)"));
    }
    Ok(PathBuf::from(s))
}

/// Which connections a fault hits: one QP, or every live connection that
/// matches what a user knows of it (a port, a peer), or all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Args)]
#[group(required = true, multiple = false)]
pub struct Target {
    /// The guest's QP number, as `vt3d ctl qps` shows it.
    #[arg(long)]
    pub qp: Option<u32>,
    /// Every connection with this TCP port at either end.
    #[arg(long)]
    pub port: Option<u16>,
    /// Every connection to or from ADDR (or ADDR:PORT).
    #[arg(long, value_name = "ADDR[:PORT]", value_parser = peer)]
    pub peer: Option<Peer>,
    /// Every connection.
    #[arg(long)]
    pub all: bool,
}

/// A fault's target, or (`--arm`, with `--port`) the next connection to
/// come up on that port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Args)]
pub struct Aim {
    #[command(flatten)]
    pub target: Target,
    /// Not now: the next connection with --port P at either end gets the
    /// fault once it is established at this end (once). Only with --port;
    /// arm it at the connecting end to hit a connection up on both ends.
    #[arg(long)]
    pub arm: bool,
}

/// `--peer ADDR[:PORT]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub addr: std::net::Ipv4Addr,
    pub port: Option<u16>,
}

fn peer(s: &str) -> Result<Peer, String> {
    let (addr, port) = match s.split_once(':') {
        Some((a, p)) => (a, Some(p.parse::<u16>().map_err(|e| format!("{s:?}: port: {e}"))?)),
        None => (s, None),
    };
    let addr = addr.parse().map_err(|e| format!("{s:?}: not an IPv4 address: {e}"))?;
    Ok(Peer { addr, port })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum FaultRequest {
    /// Abort the connection: RST to the peer; this QP -> ERROR
    /// (VT3_QPE_RESET, detail 1), the peer sees a reset.
    Rst {
        #[command(flatten)]
        at: Aim,
    },
    /// Close our half (FIN) like a graceful disconnect: the peer sees
    /// PEER_CLOSE, this QP CLOSING then CLOSE_COMPLETE.
    Fin {
        #[command(flatten)]
        at: Aim,
    },
    /// Drop every frame of the connection, both ways: TCP times out on
    /// both ends after `--tcp-timeout` (VT3_QPE_TIMEOUT).
    Blackhole {
        #[command(flatten)]
        at: Aim,
        /// Lift the blackhole.
        #[arg(long)]
        off: bool,
    },
    /// Drop a percentage of the connection's frames, both ways, with a
    /// seeded PRNG (the same seed drops the same frames of the same
    /// traffic); --percent 0 stops.
    Drop {
        #[command(flatten)]
        at: Aim,
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
        percent: u8,
        #[arg(long, default_value_t = 1, value_parser = number::<u64>)]
        seed: u64,
    },
    /// Hold every frame the connection sends (data and ACKs) for MS
    /// milliseconds: the RTT grows by MS both ways; --ms 0 stops.
    Delay {
        #[command(flatten)]
        at: Aim,
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=60_000))]
        ms: u32,
    },
    /// Send each data segment of the connection as two: the last TAIL
    /// octets of its payload HOLD_MS later, and the next segment after
    /// them (no reordering). TAIL 1-3 cuts an FPDU's CRC in two: the
    /// peer's MPA must reassemble it. --tail 0 stops.
    Split {
        #[command(flatten)]
        at: Aim,
        #[arg(long, value_parser = clap::value_parser!(u16).range(0..=1400))]
        tail: u16,
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=10_000))]
        hold_ms: u32,
    },
    /// Corrupt the CRC of the next FPDU sent: the peer detects a CRC error
    /// and answers with TERMINATE (LLP 2/0/0x02).
    CorruptCrc {
        #[command(flatten)]
        at: Aim,
    },
    /// Send a TERMINATE with this RFC 5040 code (a registered
    /// layer/etype/ecode triple); this QP -> TERMINATE -> ERROR.
    Terminate {
        #[command(flatten)]
        at: Aim,
        /// 0 RDMAP, 1 DDP, 2 LLP (MPA).
        #[arg(long, value_parser = number::<u8>)]
        layer: u8,
        #[arg(long, value_parser = number::<u8>)]
        etype: u8,
        /// Decimal or 0x-prefixed hex.
        #[arg(long, value_parser = number::<u8>)]
        ecode: u8,
    },
    /// Invalidate an STag (as a Send with Invalidate would): the peer's
    /// next RDMA WRITE or READ on it fails and this side sends TERMINATE.
    InvalidateStag {
        /// Decimal or 0x-prefixed hex.
        #[arg(long, value_parser = number::<u32>)]
        stag: u32,
    },
    /// Fatal device error: VT3_EV_DEVICE_FATAL, every QP -> ERROR,
    /// commands refused until the driver resets the device.
    DeviceFatal,
    /// A hung command channel (a T3 whose firmware mailbox hangs while its
    /// DMA runs on): for MS milliseconds commands are dropped unanswered,
    /// doorbells and CQ arming still work, the data path runs on; --ms 0
    /// lifts it.
    MuteCommands {
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=600_000))]
        ms: u32,
    },
    /// A mailbox that loses one answer: the next command COMMAND (e.g.
    /// create-cq, create-qp, reg-mr) is carried out and its reply dropped.
    /// The driver's command times out while vt3d answers its probes: an
    /// unknown outcome (the driver keeps what it handed over).
    LoseReply {
        #[arg(long, value_parser = command_name)]
        command: Cmd,
    },
}

/// A command by its name in `vt3_hw.h`, lower case with dashes
/// (`create-cq` for VT3_CMD_CREATE_CQ).
fn command_name(s: &str) -> Result<Cmd, String> {
    Cmd::ALL.iter().copied().find(|c| cli_name(*c) == s).ok_or_else(|| {
        let names: Vec<String> = Cmd::ALL.iter().map(|c| cli_name(*c)).collect();
        format!("{s:?} is not a command (one of: {})", names.join(", "))
    })
}

fn cli_name(cmd: Cmd) -> String {
    cmd.name().trim_start_matches("VT3_CMD_").to_ascii_lowercase().replace('_', "-")
}

/// Decimal or `0x` hexadecimal.
fn number<T: TryFrom<u64>>(s: &str) -> Result<T, String> {
    let value = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse::<u64>(),
    }
    .map_err(|e| format!("{s:?}: {e}"))?;
    T::try_from(value).map_err(|_| format!("{s} is out of range"))
}

impl CtlRequest {
    /// The request line for the management socket: the words of ARGV
    /// after `ctl` (`vt3d ctl --mgmt PATH WORDS...`) without `--mgmt PATH`,
    /// and a relative capture or replay file made absolute (vt3d opens it). The server parses the
    /// same words as the client did (no second spelling of a request).
    pub fn forward(&self, argv: &[String]) -> std::io::Result<String> {
        let relative = match self {
            Self::Capture(CaptureRequest::Start { file }) if file.is_relative() => Some(file.display().to_string()),
            Self::Chaos(ChaosRequest::Start(ChaosStart { replay: Some(file), .. })) if file.is_relative() => {
                Some(file.display().to_string())
            }
            _ => None,
        };
        let mut words = Vec::new();
        let mut it = argv.iter().skip_while(|w| *w != "ctl").skip(1);
        while let Some(word) = it.next() {
            match word.as_str() {
                "--mgmt" => {
                    it.next();
                }
                w if w.starts_with("--mgmt=") => {}
                w if relative.as_deref() == Some(w) => {
                    words.push(std::env::current_dir()?.join(w).display().to_string())
                }
                _ => words.push(word.clone()),
            }
        }
        if let Some(w) = words.iter().find(|w| w.is_empty() || w.chars().any(char::is_whitespace)) {
            return Err(std::io::Error::other(format!("{w:?}: a request word must be one word (no white space)")));
        }
        Ok(words.join(" "))
    }
}

impl CtlLine {
    /// Parses a request line. The older form `stats json` / `tcb text`
    /// (format as the last word) is accepted too.
    pub fn parse(line: &str) -> Result<Self, String> {
        let mut words: Vec<&str> = line.split_whitespace().collect();
        let mut json = false;
        match words.last() {
            Some(&"json") if words.len() == 2 => {
                json = true;
                words.pop();
            }
            Some(&"text") if words.len() == 2 => {
                words.pop();
            }
            _ => {}
        }
        let mut parsed = CtlLine::try_parse_from(words).map_err(|e| {
            // The first line of clap's message names the problem (and the
            // next, when the first ends in a colon: what is missing).
            let text = e.to_string();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let first = lines.next().unwrap_or("invalid request").trim_start_matches("error: ");
            match lines.next() {
                Some(next) if first.ends_with(':') => format!("{first} {next}"),
                _ => first.to_owned(),
            }
        })?;
        parsed.json |= json;
        Ok(parsed)
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// vhost-user socket QEMU connects to (`-chardev socket,path=...`).
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// Where frames leave: udp:LOCAL_IP:PORT,REMOTE_IP:PORT |
    /// unix-dgram:LOCAL_PATH,REMOTE_PATH | tap:IFNAME
    #[arg(long, value_name = "SPEC")]
    pub uplink: UplinkSpec,
    /// The guest's MAC (as given to QEMU's virtio-net-pci): unicast frames
    /// for other MACs are filtered out.
    #[arg(long, value_parser = mac_arg)]
    pub mac: Option<MacAddr>,
    /// Management socket for `vt3d ctl`.
    #[arg(long, value_name = "PATH")]
    pub mgmt: Option<PathBuf>,
    /// Largest IP MTU carried (frames up to MTU + 18 bytes).
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u16).range(68..=65000))]
    pub mtu: u16,
    /// TCP user timeout of offloaded connections, in seconds: a connection
    /// that hears nothing from its peer this long (unanswered
    /// retransmissions or keep-alives, e.g. a blackhole) ends with
    /// VT3_QPE_TIMEOUT. Keep-alives go out after a third of it.
    #[arg(long, value_name = "SECS", default_value_t = crate::rnic::DEFAULT_TCP_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub tcp_timeout: u64,
    /// Work queues vt3d polls at once after they gave it work, so posts
    /// need no doorbell (docs/performance.md, round 3); 0: never, every
    /// post to an idle queue rings. Polling takes a core's time while it
    /// lasts (at most 1 ms after the last work of a queue): on a host
    /// whose cores TCG guests need it slows them.
    #[arg(long, value_name = "N", default_value_t = crate::rnic::poll::MAX_POLLED,
          value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub poll_queues: u16,
    /// Capture every frame on the uplink, both ways, to this pcapng file
    /// from the start (`vt3d ctl capture stop` ends it).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// The guest's provisioned key: 16 random bytes, made (mode 0600) if
    /// the file does not exist. The guest gets the same file through
    /// QEMU's `-fw_cfg name=opt/vt3/key,file=FILE`; only a driver that
    /// proves this key may drive the device.
    #[arg(long, value_name = "FILE", conflicts_with = "insecure_no_key")]
    pub key_file: Option<PathBuf>,
    /// Run without a key (the key is all zeros): any process in the guest
    /// with a packet socket can then drive the device and reach all of
    /// guest memory. For vt3.ko loaded with insecure_no_key=1 only.
    #[arg(long)]
    pub insecure_no_key: bool,
}

fn mac_arg(s: &str) -> Result<MacAddr, String> {
    parse_mac(s).ok_or_else(|| format!("{s:?} is not a MAC address like 52:54:00:12:34:56"))
}

/// What `vt3d serve` runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    pub socket: PathBuf,
    pub uplink: UplinkSpec,
    pub mac: Option<MacAddr>,
    pub mtu: usize,
    pub mgmt: Option<PathBuf>,
    /// Seconds (`--tcp-timeout`).
    pub tcp_timeout: u64,
    /// `--poll-queues`.
    pub poll_queues: usize,
    /// `--pcap`: capture the uplink to this file from the start.
    pub pcap: Option<PathBuf>,
    /// Where the provisioned key comes from.
    pub key: KeySource,
}

/// `--key-file`, `--insecure-no-key` or neither (vt3d then refuses to run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    File(PathBuf),
    InsecureNone,
    Missing,
}

impl From<ServeArgs> for Config {
    fn from(a: ServeArgs) -> Self {
        Self {
            socket: a.socket,
            uplink: a.uplink,
            mac: a.mac,
            mtu: usize::from(a.mtu),
            mgmt: a.mgmt,
            tcp_timeout: a.tcp_timeout,
            poll_queues: usize::from(a.poll_queues),
            pcap: a.pcap,
            key: match (a.key_file, a.insecure_no_key) {
                (Some(path), _) => KeySource::File(path),
                (None, true) => KeySource::InsecureNone,
                (None, false) => KeySource::Missing,
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use clap::error::ErrorKind;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("vt3d").chain(args.iter().copied()))?;
        match cli.command {
            Command::Serve(a) => Ok(a.into()),
            Command::Ctl(_) => panic!("not a serve command line"),
        }
    }

    #[test]
    fn full_command_line() {
        let c = parse(&[
            "serve",
            "--socket",
            "/run/vt3/a.sock",
            "--uplink",
            "unix-dgram:/t/a,/t/b",
            "--mac",
            "52:54:00:00:00:01",
            "--mtu",
            "9000",
        ])
        .unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/vt3/a.sock"));
        assert_eq!(c.mac, Some([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(c.mtu, 9000);
    }

    #[test]
    fn defaults() {
        let c = parse(&["serve", "--socket", "s", "--uplink", "tap:t0"]).unwrap();
        assert_eq!((c.mac, c.mtu, c.key), (None, 1500, KeySource::Missing));
    }

    #[test]
    fn key_sources() {
        let c = parse(&["serve", "--socket", "s", "--uplink", "tap:t0", "--key-file", "/k"]).unwrap();
        assert_eq!(c.key, KeySource::File("/k".into()));
        let c = parse(&["serve", "--socket", "s", "--uplink", "tap:t0", "--insecure-no-key"]).unwrap();
        assert_eq!(c.key, KeySource::InsecureNone);
        let both = parse(&["serve", "--socket", "s", "--uplink", "tap:t0", "--key-file", "/k", "--insecure-no-key"]);
        assert_eq!(both.unwrap_err().kind(), ErrorKind::ArgumentConflict);
    }

    #[test]
    fn errors_name_the_problem() {
        let cases: [(&[&str], &str); 5] = [
            (&["serve", "--uplink", "tap:t0"], "--socket"),
            (&["serve", "--socket", "s", "--uplink", "vde:x"], "unknown uplink type"),
            (&["serve", "--socket", "s", "--uplink", "tap:t0", "--mac", "52:54"], "not a MAC"),
            (&["serve", "--socket", "s", "--uplink", "tap:t0", "--mtu", "65001"], "65001"),
            (&["serve", "--socket", "s", "--uplink", "udp:1.2.3.4:5"], "two endpoints"),
        ];
        for (args, needle) in cases {
            let err = parse(args).unwrap_err();
            assert!(err.to_string().contains(needle), "{args:?}: {err}");
        }
        assert_eq!(parse(&[]).unwrap_err().kind(), ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand);
    }

    #[test]
    fn ctl_command_line() {
        let cli = Cli::try_parse_from(["vt3d", "ctl", "--mgmt", "/m", "--json", "stats"]).unwrap();
        let Command::Ctl(c) = cli.command else { panic!("not ctl") };
        assert_eq!((c.mgmt, c.json), (PathBuf::from("/m"), true));
        assert!(Cli::try_parse_from(["vt3d", "ctl", "stats"]).is_err(), "--mgmt is required");
        assert!(Cli::try_parse_from(["vt3d", "ctl", "--mgmt", "/m", "dance"]).is_err());
        for (argv, line) in [
            (&["vt3d", "ctl", "--mgmt", "/m", "tcb"][..], "tcb"),
            (&["vt3d", "ctl", "--json", "--mgmt=/m", "qps"], "--json qps"),
            (
                &["vt3d", "ctl", "--mgmt", "/m", "fault", "rst", "--port", "4420", "--arm"],
                "fault rst --port 4420 --arm",
            ),
        ] {
            let cli = Cli::try_parse_from(argv).unwrap();
            let Command::Ctl(c) = cli.command else { panic!("not ctl") };
            let argv: Vec<String> = argv.iter().map(|w| (*w).to_owned()).collect();
            let forwarded = c.request.forward(&argv).unwrap();
            assert_eq!(forwarded, line);
            let back = CtlLine::parse(&forwarded).unwrap();
            assert_eq!((back.request, back.json), (c.request, c.json));
        }
    }

    fn ctl(args: &[&str]) -> Result<CtlRequest, String> {
        let cli = Cli::try_parse_from(["vt3d", "ctl", "--mgmt", "/m"].iter().chain(args)).map_err(|e| e.to_string())?;
        let Command::Ctl(c) = cli.command else { panic!("not ctl") };
        Ok(c.request)
    }

    #[test]
    fn fault_command_lines() {
        let qp3 = Aim { target: Target { qp: Some(3), ..Target::default() }, arm: false };
        let cases: [(&[&str], FaultRequest); 15] = [
            (&["fault", "rst", "--qp", "3"], FaultRequest::Rst { at: qp3 }),
            (&["fault", "fin", "--qp", "3"], FaultRequest::Fin { at: qp3 }),
            (&["fault", "blackhole", "--qp", "3"], FaultRequest::Blackhole { at: qp3, off: false }),
            (&["fault", "blackhole", "--qp", "3", "--off"], FaultRequest::Blackhole { at: qp3, off: true }),
            (&["fault", "drop", "--qp", "3", "--percent", "10"], FaultRequest::Drop { at: qp3, percent: 10, seed: 1 }),
            (
                &["fault", "drop", "--qp", "3", "--percent", "100", "--seed", "0xff"],
                FaultRequest::Drop { at: qp3, percent: 100, seed: 255 },
            ),
            (&["fault", "delay", "--qp", "3", "--ms", "250"], FaultRequest::Delay { at: qp3, ms: 250 }),
            (&["fault", "split", "--qp", "3", "--tail", "2"], FaultRequest::Split { at: qp3, tail: 2, hold_ms: 20 }),
            (
                &["fault", "split", "--qp", "3", "--tail", "0", "--hold-ms", "5"],
                FaultRequest::Split { at: qp3, tail: 0, hold_ms: 5 },
            ),
            (&["fault", "corrupt-crc", "--qp", "3"], FaultRequest::CorruptCrc { at: qp3 }),
            (
                &["fault", "terminate", "--qp", "3", "--layer", "1", "--etype", "2", "--ecode", "0x05"],
                FaultRequest::Terminate { at: qp3, layer: 1, etype: 2, ecode: 5 },
            ),
            (&["fault", "invalidate-stag", "--stag", "0x1a01"], FaultRequest::InvalidateStag { stag: 0x1a01 }),
            (&["fault", "device-fatal"], FaultRequest::DeviceFatal),
            (&["fault", "mute-commands", "--ms", "20000"], FaultRequest::MuteCommands { ms: 20000 }),
            (&["fault", "lose-reply", "--command", "create-cq"], FaultRequest::LoseReply { command: Cmd::CreateCq }),
        ];
        for (args, expected) in cases {
            let request = ctl(args).unwrap();
            assert_eq!(request, CtlRequest::Fault(expected), "{args:?}");
            // The words forwarded to the socket parse back to the same request.
            for json in [false, true] {
                let argv: Vec<String> = ["vt3d", "ctl", "--mgmt", "/m"]
                    .into_iter()
                    .chain(json.then_some("--json"))
                    .chain(args.iter().copied())
                    .map(str::to_owned)
                    .collect();
                let line = CtlLine::parse(&request.forward(&argv).unwrap()).unwrap();
                assert_eq!((line.request, line.json), (request.clone(), json), "{args:?}");
            }
        }
        // Targets by what a user knows (vt3d refuses --arm without --port).
        let at = |target: Target, arm: bool| CtlRequest::Fault(FaultRequest::Rst { at: Aim { target, arm } });
        let port = Target { port: Some(4420), ..Target::default() };
        assert_eq!(ctl(&["fault", "rst", "--port", "4420"]).unwrap(), at(port, false));
        assert_eq!(ctl(&["fault", "rst", "--port", "4420", "--arm"]).unwrap(), at(port, true));
        assert_eq!(ctl(&["fault", "rst", "--all"]).unwrap(), at(Target { all: true, ..Target::default() }, false));
        let peer = Peer { addr: [10, 77, 0, 2].into(), port: None };
        assert_eq!(
            ctl(&["fault", "rst", "--peer", "10.77.0.2"]).unwrap(),
            at(Target { peer: Some(peer), ..Target::default() }, false)
        );
        let peer = Peer { port: Some(7174), ..peer };
        assert_eq!(
            ctl(&["fault", "rst", "--peer", "10.77.0.2:7174"]).unwrap(),
            at(Target { peer: Some(peer), ..Target::default() }, false)
        );
        for (args, needle) in [
            (&["fault", "rst", "--qp", "1", "--port", "2"][..], "cannot be used with"),
            (&["fault", "rst", "--peer", "10.77.0"], "not an IPv4 address"),
            (&["fault", "rst", "--peer", "10.77.0.2:x"], "port"),
            (&["fault", "rst", "--port", "70000"], "70000"),
        ] {
            let err = ctl(args).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        let bad: [(&[&str], &str); 7] = [
            (&["fault", "rst"], "--qp"),
            (&["fault", "drop", "--qp", "1", "--percent", "101"], "101"),
            (&["fault", "delay", "--qp", "1", "--ms", "60001"], "60001"),
            (&["fault", "terminate", "--qp", "1", "--layer", "256", "--etype", "0", "--ecode", "0"], "out of range"),
            (&["fault", "invalidate-stag", "--stag", "0xzz"], "0xzz"),
            (&["fault", "melt"], "melt"),
            (&["fault", "rst", "--qp", "-1"], "-1"),
        ];
        for (args, needle) in bad {
            let err = ctl(args).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        assert_eq!(ctl(&["cqs"]).unwrap(), CtlRequest::Cqs);
        // Capture: the line parses back; a relative path becomes absolute.
        let start = ctl(&["capture", "start", "/tmp/w.pcapng"]).unwrap();
        assert_eq!(start, CtlRequest::Capture(CaptureRequest::Start { file: "/tmp/w.pcapng".into() }));
        let argv = |file: &str| ["vt3d", "ctl", "--mgmt", "/m", "capture", "start", file].map(str::to_owned);
        assert_eq!(start.forward(&argv("/tmp/w.pcapng")).unwrap(), "capture start /tmp/w.pcapng");
        assert_eq!(ctl(&["capture", "stop"]).unwrap(), CtlRequest::Capture(CaptureRequest::Stop));
        let relative = ctl(&["capture", "start", "w.pcapng"]).unwrap();
        let forwarded = relative.forward(&argv("w.pcapng")).unwrap();
        assert_eq!(
            CtlLine::parse(&forwarded).unwrap().request,
            CtlRequest::Capture(CaptureRequest::Start { file: std::env::current_dir().unwrap().join("w.pcapng") })
        );
        assert!(ctl(&["capture", "start"]).unwrap_err().contains("FILE"));
        assert!(ctl(&["capture", "start", "a b"]).unwrap_err().contains("one word"));
        assert!(ctl(&["capture", "pause"]).is_err());
        assert_eq!(ctl(&["mrs"]).unwrap(), CtlRequest::Mrs);
    }

    #[test]
    fn chaos_command_lines() {
        let args = ["chaos", "start", "--seed", "42", "--rate", "0.5", "--kinds", "rst,delay", "--port", "4420"];
        let CtlRequest::Chaos(ChaosRequest::Start(start)) = ctl(&args).unwrap() else { panic!("not chaos start") };
        assert_eq!((start.seed, start.rate.map(Rate::per_s)), (Some(42), Some(0.5)));
        assert_eq!((start.kinds, start.ports), (vec![Kind::Rst, Kind::Delay], vec![4420]));
        assert_eq!((start.window_ms, start.blackhole_ms, start.delay_ms, start.replay), (2000, 1000, 100, None));
        // --json after the request too (as the synopsis writes it); the
        // line forwarded parses back the same.
        let argv: Vec<String> =
            ["vt3d", "ctl", "--mgmt", "/m"].iter().chain(&args).chain(&["--json"]).map(|w| (*w).to_owned()).collect();
        let cli = Cli::try_parse_from(&argv).unwrap();
        let Command::Ctl(c) = cli.command else { panic!("not ctl") };
        assert!(c.json);
        let line = CtlLine::parse(&c.request.forward(&argv).unwrap()).unwrap();
        assert_eq!((line.request, line.json), (c.request, true));
        // A relative replay file is vt3d's to open: made absolute.
        let argv = ["vt3d", "ctl", "--mgmt", "/m", "chaos", "start", "--replay", "log.json"].map(str::to_owned);
        let request = ctl(&["chaos", "start", "--replay", "log.json"]).unwrap();
        let CtlRequest::Chaos(ChaosRequest::Start(back)) =
            CtlLine::parse(&request.forward(&argv).unwrap()).unwrap().request
        else {
            panic!("not chaos start")
        };
        assert_eq!(back.replay, Some(std::env::current_dir().unwrap().join("log.json")));
        for (args, needle) in [
            (&["chaos", "start", "--seed", "1"][..], "--rate"),
            (&["chaos", "start", "--seed", "1", "--rate", "1", "--blackhole-ms", "20000"], "20000"),
            (&["chaos", "start", "--replay", "l.json", "--port", "1"], "cannot be used with"),
            (&["chaos", "start", "--seed", "1", "--rate", "1", "--max-faults", "0"], "--max-faults"),
            (&["chaos", "pause"], "pause"),
        ] {
            let err = ctl(args).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        for (args, request) in
            [("status", ChaosRequest::Status), ("stop", ChaosRequest::Stop), ("log", ChaosRequest::Log)]
        {
            assert_eq!(ctl(&["chaos", args]).unwrap(), CtlRequest::Chaos(request));
        }
    }

    #[test]
    fn request_lines_parse_without_panicking() {
        assert_eq!(CtlLine::parse("stats json").unwrap().request, CtlRequest::Stats);
        assert!(CtlLine::parse("stats json").unwrap().json);
        assert!(!CtlLine::parse("tcb text").unwrap().json);
        assert!(CtlLine::parse("--json mrs").unwrap().json);
        for bad in [
            "",
            "reboot",
            "tcb xml",
            "fault",
            "fault rst --qp",
            "--help",
            "help",
            "-V",
            "fault rst --qp 1 --qp 2",
            "\0\0",
        ] {
            let err = CtlLine::parse(bad).unwrap_err();
            assert!(!err.is_empty(), "{bad:?}");
        }
        // Random word salad from the vocabulary: an answer, never a panic.
        let vocab = [
            "fault",
            "rst",
            "fin",
            "blackhole",
            "drop",
            "delay",
            "corrupt-crc",
            "terminate",
            "invalidate-stag",
            "device-fatal",
            "--qp",
            "--percent",
            "--seed",
            "--ms",
            "--layer",
            "--etype",
            "--ecode",
            "--stag",
            "--off",
            "--json",
            "json",
            "text",
            "stats",
            "tcb",
            "qps",
            "cqs",
            "mrs",
            "0",
            "1",
            "255",
            "256",
            "0x",
            "0xffffffff",
            "-1",
            "99999999999999999999",
            "\u{0}",
            "é",
            "--",
            "-",
            "help",
            "--help",
            "-h",
        ];
        let mut x = 0x1234_5678_9abc_def0u64;
        for _ in 0..3000 {
            let mut line = Vec::new();
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            for i in 0..(x % 9) {
                line.push(vocab[((x >> (i * 6)) % vocab.len() as u64) as usize]);
            }
            let _ = CtlLine::parse(&line.join(" "));
        }
        assert_eq!(parse(&["serve", "--socket", "s", "--uplink", "tap:t0"]).unwrap().tcp_timeout, 15);
        assert!(parse(&["serve", "--socket", "s", "--uplink", "tap:t0", "--tcp-timeout", "0"]).is_err());
        assert_eq!(
            parse(&["serve", "--socket", "s", "--uplink", "tap:t0", "--tcp-timeout", "60"]).unwrap().tcp_timeout,
            60
        );
        assert_eq!(parse(&["serve", "--socket", "s", "--uplink", "tap:t0"]).unwrap().poll_queues, 64);
        assert_eq!(
            parse(&["serve", "--socket", "s", "--uplink", "tap:t0", "--poll-queues", "0"]).unwrap().poll_queues,
            0
        );
        assert_eq!(parse(&["serve", "--socket", "s", "--uplink", "tap:t0"]).unwrap().pcap, None);
        let with_pcap = parse(&["serve", "--socket", "s", "--uplink", "tap:t0", "--pcap", "/tmp/w.pcapng"]).unwrap();
        assert_eq!(with_pcap.pcap, Some(PathBuf::from("/tmp/w.pcapng")));
    }
}
