//! Uplinks: where the NIC's Ethernet frames go when they leave the host
//! side of the guest. Each datagram or tap read carries exactly one frame,
//! byte-compatible with QEMU's `-netdev socket,udp=` and `-netdev dgram`.

mod batch;
mod gso;
mod send_queue;
mod tap;
mod tso;
mod udp;
mod unix_dgram;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::str::FromStr;
use thiserror::Error;

pub use batch::{receive_one, Received, RecvBatch, RECV_BATCH, SEND_BATCH};
pub use send_queue::{SendQueue, Sent, MAX_PENDING_SENDS, TX_PAUSE_PENDING};
pub use tap::TapUplink;
pub use udp::UdpUplink;
pub use unix_dgram::UnixDgramUplink;

/// Size of the receive buffer: larger than any UDP datagram, so a frame is
/// never silently truncated; anything over the MTU is dropped by the NIC.
pub const RECV_BUF_LEN: usize = 65_536;

/// One Ethernet segment vt3d is attached to.
pub trait Uplink: AsRawFd + Send + Sync + fmt::Debug {
    /// Sends one frame without blocking. `WouldBlock` means the peer (or
    /// the socket buffer) is full: the caller keeps the frame and retries
    /// once the fd polls writable, so the fd must report writability for
    /// this peer (datagram uplinks are connected to it). Other failures
    /// (peer not up yet) are drops, like a NIC with no link.
    fn send(&self, frame: &[u8]) -> io::Result<()>;

    /// Sends the first frames of `frames` without blocking, in order;
    /// returns how many went. Fewer than all: the next one was refused
    /// (send it alone to learn why). An error: the first was refused for
    /// another reason than a full queue. Datagram uplinks use one
    /// `sendmmsg`.
    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        for (sent, frame) in frames.iter().enumerate() {
            if let Err(e) = self.send(frame) {
                return if sent == 0 && e.kind() != io::ErrorKind::WouldBlock { Err(e) } else { Ok(sent) };
            }
        }
        Ok(frames.len())
    }

    /// Receives without blocking into `bufs` (64 KiB each): receive `i`
    /// fills `bufs[i]` as `received[i]` says (one frame, or several of one
    /// size with UDP GRO); returns how many receives (0: none pending).
    /// Datagram uplinks take them in one `recvmmsg`.
    fn recv_batch(&self, bufs: &mut [Vec<u8>], received: &mut [Received]) -> io::Result<usize>;

    /// The uplink's own counters for `vt3d ctl stats` (`uplink.NAME`).
    fn counters(&self) -> Vec<(&'static str, u64)> {
        Vec::new()
    }
}

/// `--uplink` as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UplinkSpec {
    /// `udp:LOCAL_IP:PORT,REMOTE_IP:PORT`
    Udp { local: SocketAddr, remote: SocketAddr },
    /// `unix-dgram:LOCAL_PATH,REMOTE_PATH`
    UnixDgram { local: PathBuf, remote: PathBuf },
    /// `tap:IFNAME`
    Tap { ifname: String },
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SpecError {
    #[error("unknown uplink type {0:?} (expected udp:, unix-dgram: or tap:)")]
    UnknownType(String),
    #[error("{0}: expected two endpoints separated by a comma")]
    MissingRemote(&'static str),
    #[error("invalid socket address {0:?} (expected IP:PORT)")]
    BadAddress(String),
    #[error("interface name {0:?} must be 1 to 15 characters, no '/' or NUL")]
    BadIfname(String),
    #[error("empty socket path")]
    EmptyPath,
}

impl FromStr for UplinkSpec {
    type Err = SpecError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (kind, rest) = s.split_once(':').ok_or_else(|| SpecError::UnknownType(s.to_owned()))?;
        match kind {
            "udp" => {
                let (l, r) = rest.split_once(',').ok_or(SpecError::MissingRemote("udp"))?;
                let parse = |a: &str| a.parse().map_err(|_| SpecError::BadAddress(a.to_owned()));
                Ok(Self::Udp { local: parse(l)?, remote: parse(r)? })
            }
            "unix-dgram" => {
                let (l, r) = rest.split_once(',').ok_or(SpecError::MissingRemote("unix-dgram"))?;
                if l.is_empty() || r.is_empty() {
                    return Err(SpecError::EmptyPath);
                }
                Ok(Self::UnixDgram { local: l.into(), remote: r.into() })
            }
            "tap" => {
                let valid = (1..=15).contains(&rest.len()) && !rest.contains(['/', '\0']);
                if !valid {
                    return Err(SpecError::BadIfname(rest.to_owned()));
                }
                Ok(Self::Tap { ifname: rest.to_owned() })
            }
            other => Err(SpecError::UnknownType(other.to_owned())),
        }
    }
}

impl fmt::Display for UplinkSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Udp { local, remote } => write!(f, "udp:{local},{remote}"),
            Self::UnixDgram { local, remote } => {
                write!(f, "unix-dgram:{},{}", local.display(), remote.display())
            }
            Self::Tap { ifname } => write!(f, "tap:{ifname}"),
        }
    }
}

impl UplinkSpec {
    /// Opens the uplink in non-blocking mode.
    pub fn open(&self) -> io::Result<Box<dyn Uplink>> {
        Ok(match self {
            Self::Udp { local, remote } => Box::new(UdpUplink::open(*local, *remote)?),
            Self::UnixDgram { local, remote } => Box::new(UnixDgramUplink::open(local, remote)?),
            Self::Tap { ifname } => Box::new(TapUplink::open(ifname)?),
        })
    }
}

/// Asks for socket buffers of `bytes` each way (the kernel caps them at
/// net.core.{r,w}mem_max): bursts of full-size segments must fit.
fn grow_socket_buffers(fd: RawFd, bytes: libc::c_int) {
    for option in [libc::SO_SNDBUF, libc::SO_RCVBUF] {
        if let Err(e) = set_int_option(fd, libc::SOL_SOCKET, option, bytes) {
            log::debug!("setsockopt({option}): {e}");
        }
    }
}

/// `setsockopt` of an integer option.
fn set_int_option(fd: RawFd, level: libc::c_int, option: libc::c_int, value: libc::c_int) -> io::Result<()> {
    // SAFETY: fd is an open socket owned by the caller; the option value
    // is a c_int that lives across the call, with its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            option,
            std::ptr::from_ref(&value).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4),
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// How many octets the receive queue of socket `fd` holds (SO_RCVBUF, as
/// the kernel reports it: the doubled, capped value, which counts its own
/// per-datagram overhead); `None` when `fd` is no socket (tap).
pub fn receive_queue_bytes(fd: RawFd) -> Option<usize> {
    let mut value: libc::c_int = 0;
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4);
    // SAFETY: fd is an open descriptor owned by the caller; value and len
    // live across the call and len says how large value is.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, std::ptr::from_mut(&mut value).cast(), &mut len)
    };
    if rc != 0 {
        return None;
    }
    usize::try_from(value).ok().filter(|&v| v > 0)
}

/// Socket buffer size requested for datagram uplinks.
const SOCKET_BUFFER: libc::c_int = 4 << 20;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_kind() {
        assert_eq!(
            "udp:127.0.0.1:5000,127.0.0.1:5001".parse(),
            Ok(UplinkSpec::Udp { local: "127.0.0.1:5000".parse().unwrap(), remote: "127.0.0.1:5001".parse().unwrap() })
        );
        assert_eq!(
            "unix-dgram:/tmp/a,/tmp/b".parse(),
            Ok(UplinkSpec::UnixDgram { local: "/tmp/a".into(), remote: "/tmp/b".into() })
        );
        assert_eq!("tap:vt3tap0".parse(), Ok(UplinkSpec::Tap { ifname: "vt3tap0".into() }));
    }

    #[test]
    fn display_round_trips() {
        for s in ["udp:127.0.0.1:5000,[::1]:7", "unix-dgram:/x/a,/x/b", "tap:t0"] {
            assert_eq!(s.parse::<UplinkSpec>().unwrap().to_string(), s);
        }
    }

    #[test]
    fn rejects_bad_specs() {
        let bad = [
            ("", SpecError::UnknownType(String::new())),
            ("vde:/x", SpecError::UnknownType("vde".into())),
            ("udp:127.0.0.1:5000", SpecError::MissingRemote("udp")),
            ("udp:127.0.0.1,127.0.0.1:5", SpecError::BadAddress("127.0.0.1".into())),
            ("udp:1.2.3.4:5,host:5", SpecError::BadAddress("host:5".into())),
            ("unix-dgram:/a", SpecError::MissingRemote("unix-dgram")),
            ("unix-dgram:,/b", SpecError::EmptyPath),
            ("tap:", SpecError::BadIfname(String::new())),
            ("tap:a/b", SpecError::BadIfname("a/b".into())),
            ("tap:0123456789abcdef", SpecError::BadIfname("0123456789abcdef".into())),
        ];
        for (s, want) in bad {
            assert_eq!(s.parse::<UplinkSpec>(), Err(want), "{s}");
        }
    }
}
