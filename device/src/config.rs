//! Command line (clap derive) and the validated configuration it yields.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

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
    /// Machine-readable output.
    #[arg(long)]
    pub json: bool,
    #[command(subcommand)]
    pub request: CtlRequest,
}

#[derive(Debug, Clone, Copy, Subcommand)]
pub enum CtlRequest {
    /// NIC counters, RDMA resource counts and iWARP engine counters.
    Stats,
    /// The TCB table of the TOE: state, 4-tuple, seq/ack, windows, RTT,
    /// retransmits, bytes.
    Tcb,
    /// The QP table: states, queue progress, connection.
    Qps,
}

impl CtlRequest {
    /// The request line sent to the management socket.
    pub fn line(self, json: bool) -> String {
        let name = match self {
            Self::Stats => "stats",
            Self::Tcb => "tcb",
            Self::Qps => "qps",
        };
        format!("{name} {}", if json { "json" } else { "text" })
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
}

impl From<ServeArgs> for Config {
    fn from(a: ServeArgs) -> Self {
        Self { socket: a.socket, uplink: a.uplink, mac: a.mac, mtu: usize::from(a.mtu), mgmt: a.mgmt }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
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
            "serve", "--socket", "/run/vt3/a.sock", "--uplink", "unix-dgram:/t/a,/t/b",
            "--mac", "52:54:00:00:00:01", "--mtu", "9000",
        ])
        .unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/vt3/a.sock"));
        assert_eq!(c.mac, Some([0x52, 0x54, 0, 0, 0, 1]));
        assert_eq!(c.mtu, 9000);
    }

    #[test]
    fn defaults() {
        let c = parse(&["serve", "--socket", "s", "--uplink", "tap:t0"]).unwrap();
        assert_eq!((c.mac, c.mtu), (None, 1500));
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
        assert_eq!(c.request.line(c.json), "tcb text");
        assert_eq!(CtlRequest::Qps.line(true), "qps json");
    }
}
