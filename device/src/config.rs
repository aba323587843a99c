//! Command line (clap derive) and the validated configuration it yields.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::abi::Cmd;
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
    #[arg(long)]
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
    #[arg(long)]
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
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum CaptureRequest {
    /// Start writing FILE (created or truncated; a relative path is taken
    /// from the client's working directory; no white space).
    Start {
        #[arg(value_name = "FILE", value_parser = capture_path)]
        file: PathBuf,
    },
    /// Stop the capture: what was queued is written and the file closed.
    Stop,
}

/// A capture file name as the request line can carry it (one word).
fn capture_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() || s.chars().any(char::is_whitespace) {
        return Err(format!("{s:?}: a capture file name must be one word (no white space)"));
    }
    Ok(PathBuf::from(s))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
pub enum FaultRequest {
    /// Abort the connection: RST to the peer; this QP -> ERROR
    /// (VT3_QPE_RESET, detail 1), the peer sees a reset.
    Rst {
        #[arg(long)]
        qp: u32,
    },
    /// Close our half (FIN) like a graceful disconnect: the peer sees
    /// PEER_CLOSE, this QP CLOSING then CLOSE_COMPLETE.
    Fin {
        #[arg(long)]
        qp: u32,
    },
    /// Drop every frame of the connection, both ways: TCP times out on
    /// both ends after `--tcp-timeout` (VT3_QPE_TIMEOUT).
    Blackhole {
        #[arg(long)]
        qp: u32,
        /// Lift the blackhole.
        #[arg(long)]
        off: bool,
    },
    /// Drop a percentage of the connection's frames, both ways, with a
    /// seeded PRNG (the same seed drops the same frames of the same
    /// traffic); --percent 0 stops.
    Drop {
        #[arg(long)]
        qp: u32,
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..=100))]
        percent: u8,
        #[arg(long, default_value_t = 1, value_parser = number::<u64>)]
        seed: u64,
    },
    /// Hold every frame the connection sends (data and ACKs) for MS
    /// milliseconds: the RTT grows by MS both ways; --ms 0 stops.
    Delay {
        #[arg(long)]
        qp: u32,
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=60_000))]
        ms: u32,
    },
    /// Send each data segment of the connection as two: the last TAIL
    /// octets of its payload HOLD_MS later, and the next segment after
    /// them (no reordering). TAIL 1-3 cuts an FPDU's CRC in two: the
    /// peer's MPA must reassemble it. --tail 0 stops.
    Split {
        #[arg(long)]
        qp: u32,
        #[arg(long, value_parser = clap::value_parser!(u16).range(0..=1400))]
        tail: u16,
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(0..=10_000))]
        hold_ms: u32,
    },
    /// Corrupt the CRC of the next FPDU sent: the peer detects a CRC error
    /// and answers with TERMINATE (LLP 2/0/0x02).
    CorruptCrc {
        #[arg(long)]
        qp: u32,
    },
    /// Send a TERMINATE with this RFC 5040 code (a registered
    /// layer/etype/ecode triple); this QP -> TERMINATE -> ERROR.
    Terminate {
        #[arg(long)]
        qp: u32,
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

impl FaultRequest {
    /// The words after `fault`.
    fn words(self) -> Vec<String> {
        let qp = |name: &str, qp: u32| vec![name.to_owned(), "--qp".to_owned(), qp.to_string()];
        match self {
            Self::Rst { qp: n } => qp("rst", n),
            Self::Fin { qp: n } => qp("fin", n),
            Self::Blackhole { qp: n, off } => {
                let mut w = qp("blackhole", n);
                if off {
                    w.push("--off".to_owned());
                }
                w
            }
            Self::Drop { qp: n, percent, seed } => {
                let mut w = qp("drop", n);
                w.extend(["--percent".to_owned(), percent.to_string(), "--seed".to_owned(), seed.to_string()]);
                w
            }
            Self::Delay { qp: n, ms } => {
                let mut w = qp("delay", n);
                w.extend(["--ms".to_owned(), ms.to_string()]);
                w
            }
            Self::Split { qp: n, tail, hold_ms } => {
                let mut w = qp("split", n);
                w.extend(["--tail".to_owned(), tail.to_string(), "--hold-ms".to_owned(), hold_ms.to_string()]);
                w
            }
            Self::CorruptCrc { qp: n } => qp("corrupt-crc", n),
            Self::Terminate { qp: n, layer, etype, ecode } => {
                let mut w = qp("terminate", n);
                for (k, v) in [("--layer", layer), ("--etype", etype), ("--ecode", ecode)] {
                    w.extend([k.to_owned(), v.to_string()]);
                }
                w
            }
            Self::InvalidateStag { stag } => {
                vec!["invalidate-stag".to_owned(), "--stag".to_owned(), format!("{stag:#x}")]
            }
            Self::DeviceFatal => vec!["device-fatal".to_owned()],
            Self::MuteCommands { ms } => vec!["mute-commands".to_owned(), "--ms".to_owned(), ms.to_string()],
            Self::LoseReply { command } => vec!["lose-reply".to_owned(), "--command".to_owned(), cli_name(command)],
        }
    }
}

impl CtlRequest {
    /// Makes a relative capture path absolute, from the client's working
    /// directory (vt3d's own may be anywhere).
    pub fn resolve_paths(self) -> std::io::Result<Self> {
        Ok(match self {
            Self::Capture(CaptureRequest::Start { file }) if file.is_relative() => {
                Self::Capture(CaptureRequest::Start { file: std::env::current_dir()?.join(file) })
            }
            other => other,
        })
    }

    /// The request line sent to the management socket.
    pub fn line(&self, json: bool) -> String {
        let mut words: Vec<String> = Vec::new();
        if json {
            words.push("--json".to_owned());
        }
        match self {
            Self::Stats => words.push("stats".to_owned()),
            Self::Tcb => words.push("tcb".to_owned()),
            Self::Qps => words.push("qps".to_owned()),
            Self::Cqs => words.push("cqs".to_owned()),
            Self::Mrs => words.push("mrs".to_owned()),
            Self::Fault(f) => {
                words.push("fault".to_owned());
                words.extend(f.words());
            }
            Self::Capture(CaptureRequest::Start { file }) => {
                words.extend(["capture".to_owned(), "start".to_owned(), file.display().to_string()]);
            }
            Self::Capture(CaptureRequest::Stop) => words.extend(["capture".to_owned(), "stop".to_owned()]),
        }
        words.join(" ")
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
            // The first line of clap's message names the problem.
            let text = e.to_string();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid request");
            first.trim_start_matches("error: ").to_owned()
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
        let cli = Cli::try_parse_from(["vt3d", "ctl", "--mgmt", "/m", "tcb"]).unwrap();
        let Command::Ctl(c) = cli.command else { panic!("not ctl") };
        assert_eq!(c.request.line(c.json), "tcb");
        assert_eq!(CtlRequest::Qps.line(true), "--json qps");
    }

    fn ctl(args: &[&str]) -> Result<CtlRequest, String> {
        let cli = Cli::try_parse_from(["vt3d", "ctl", "--mgmt", "/m"].iter().chain(args)).map_err(|e| e.to_string())?;
        let Command::Ctl(c) = cli.command else { panic!("not ctl") };
        Ok(c.request)
    }

    #[test]
    fn fault_command_lines() {
        let cases: [(&[&str], FaultRequest); 15] = [
            (&["fault", "rst", "--qp", "3"], FaultRequest::Rst { qp: 3 }),
            (&["fault", "fin", "--qp", "3"], FaultRequest::Fin { qp: 3 }),
            (&["fault", "blackhole", "--qp", "3"], FaultRequest::Blackhole { qp: 3, off: false }),
            (&["fault", "blackhole", "--qp", "3", "--off"], FaultRequest::Blackhole { qp: 3, off: true }),
            (&["fault", "drop", "--qp", "3", "--percent", "10"], FaultRequest::Drop { qp: 3, percent: 10, seed: 1 }),
            (
                &["fault", "drop", "--qp", "3", "--percent", "100", "--seed", "0xff"],
                FaultRequest::Drop { qp: 3, percent: 100, seed: 255 },
            ),
            (&["fault", "delay", "--qp", "3", "--ms", "250"], FaultRequest::Delay { qp: 3, ms: 250 }),
            (&["fault", "split", "--qp", "3", "--tail", "2"], FaultRequest::Split { qp: 3, tail: 2, hold_ms: 20 }),
            (
                &["fault", "split", "--qp", "3", "--tail", "0", "--hold-ms", "5"],
                FaultRequest::Split { qp: 3, tail: 0, hold_ms: 5 },
            ),
            (&["fault", "corrupt-crc", "--qp", "3"], FaultRequest::CorruptCrc { qp: 3 }),
            (
                &["fault", "terminate", "--qp", "3", "--layer", "1", "--etype", "2", "--ecode", "0x05"],
                FaultRequest::Terminate { qp: 3, layer: 1, etype: 2, ecode: 5 },
            ),
            (&["fault", "invalidate-stag", "--stag", "0x1a01"], FaultRequest::InvalidateStag { stag: 0x1a01 }),
            (&["fault", "device-fatal"], FaultRequest::DeviceFatal),
            (&["fault", "mute-commands", "--ms", "20000"], FaultRequest::MuteCommands { ms: 20000 }),
            (&["fault", "lose-reply", "--command", "create-cq"], FaultRequest::LoseReply { command: Cmd::CreateCq }),
        ];
        for (args, expected) in cases {
            let request = ctl(args).unwrap();
            assert_eq!(request, CtlRequest::Fault(expected), "{args:?}");
            // The line sent to the socket parses back to the same request.
            for json in [false, true] {
                let line = CtlLine::parse(&request.line(json)).unwrap();
                assert_eq!((line.request, line.json), (request.clone(), json), "{args:?}");
            }
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
        assert_eq!(start.line(false), "capture start /tmp/w.pcapng");
        assert_eq!(CtlLine::parse(&start.line(true)).unwrap().request, start);
        assert_eq!(ctl(&["capture", "stop"]).unwrap(), CtlRequest::Capture(CaptureRequest::Stop));
        let relative = ctl(&["capture", "start", "w.pcapng"]).unwrap().resolve_paths().unwrap();
        assert_eq!(
            relative,
            CtlRequest::Capture(CaptureRequest::Start { file: std::env::current_dir().unwrap().join("w.pcapng") })
        );
        assert!(ctl(&["capture", "start"]).unwrap_err().contains("FILE"));
        assert!(ctl(&["capture", "start", "a b"]).unwrap_err().contains("one word"));
        assert!(ctl(&["capture", "pause"]).is_err());
        assert_eq!(ctl(&["mrs"]).unwrap(), CtlRequest::Mrs);
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
