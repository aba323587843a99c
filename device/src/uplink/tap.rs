//! `tap:IFNAME`: a Linux tap interface (needs CAP_NET_ADMIN), one frame
//! per read/write, no packet-information prefix.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;

use super::{nonblocking, receive_one, Received, Uplink};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;

/// The part of `struct ifreq` TUNSETIFF reads, padded to its full size.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

#[derive(Debug)]
pub struct TapUplink {
    file: File,
}

impl TapUplink {
    pub fn open(ifname: &str) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: IFF_TAP | IFF_NO_PI, _pad: [0; 22] };
        let name = ifname.as_bytes();
        // Leave room for the terminating NUL.
        let dst = req
            .name
            .get_mut(..name.len())
            .filter(|_| name.len() < libc::IFNAMSIZ)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "interface name too long"))?;
        dst.copy_from_slice(name);
        // SAFETY: TUNSETIFF reads a `struct ifreq`; `req` is a live, properly
        // sized and initialised value for the duration of the call.
        let ret = unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { file })
    }
}

impl Uplink for TapUplink {
    fn send(&self, frame: &[u8]) -> io::Result<()> {
        (&self.file).write(frame).map(drop)
    }

    fn recv_batch(&self, bufs: &mut [Vec<u8>], received: &mut [Received]) -> io::Result<usize> {
        receive_one(bufs, received, |buf| nonblocking((&self.file).read(buf)))
    }
}

impl AsRawFd for TapUplink {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rejects_overlong_name() {
        let err = TapUplink::open("0123456789abcdefg").unwrap_err();
        assert!(matches!(
            err.kind(),
            io::ErrorKind::InvalidInput | io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
        ));
    }

    /// Needs CAP_NET_ADMIN (CI runs as root): the interface appears while
    /// the uplink is open and reading it without traffic does not block.
    #[test]
    fn creates_the_interface() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("creates_the_interface: not root, cannot create a tap");
            return;
        }
        let name = format!("vt3t{}", std::process::id() % 100_000);
        let tap = TapUplink::open(&name).unwrap();
        assert!(std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
        let mut batch = crate::uplink::RecvBatch::default();
        assert_eq!(batch.next_frame(&tap).unwrap(), None);
        drop(tap);
        assert!(!std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
    }
}
