//! `unix-dgram:LOCAL,REMOTE`: one frame per datagram, as QEMU's
//! `-netdev dgram,local.type=unix,...,remote.type=unix,...` exchanges them.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use super::{grow_socket_buffers, nonblocking, Uplink, SOCKET_BUFFER};

#[derive(Debug)]
pub struct UnixDgramUplink {
    socket: UnixDatagram,
    local: PathBuf,
    remote: PathBuf,
}

impl UnixDgramUplink {
    pub fn open(local: &Path, remote: &Path) -> io::Result<Self> {
        // A socket left behind by an earlier run would make bind fail;
        // remove it, but never anything that is not a socket.
        if let Ok(meta) = std::fs::symlink_metadata(local) {
            if meta.file_type().is_socket() {
                std::fs::remove_file(local)?;
            }
        }
        let socket = UnixDatagram::bind(local)?;
        socket.set_nonblocking(true)?;
        grow_socket_buffers(socket.as_raw_fd(), SOCKET_BUFFER);
        Ok(Self { socket, local: local.to_owned(), remote: remote.to_owned() })
    }
}

impl Uplink for UnixDgramUplink {
    fn send(&self, frame: &[u8]) -> io::Result<()> {
        // Not connected: the peer may start (or restart) after us.
        self.socket.send_to(frame, &self.remote).map(drop)
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            let Some((n, from)) = nonblocking(self.socket.recv_from(buf))? else {
                return Ok(None);
            };
            if from.as_pathname() == Some(self.remote.as_path()) {
                return Ok(Some(n));
            }
            log::debug!("unix-dgram: ignoring datagram from {from:?}");
        }
    }
}

impl AsRawFd for UnixDgramUplink {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

impl Drop for UnixDgramUplink {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.local);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn frames_cross_and_strangers_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
        let peer = UnixDatagram::bind(&b).unwrap();
        let stranger = UnixDatagram::bind(&c).unwrap();
        let up = UnixDgramUplink::open(&a, &b).unwrap();

        let frame: Vec<u8> = (0..9014).map(|i| (i * 3) as u8).collect();
        up.send(&frame).unwrap();
        let mut buf = vec![0u8; 65536];
        let n = peer.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &frame[..]);

        stranger.send_to(b"noise", &a).unwrap();
        peer.send_to(&frame[..100], &a).unwrap();
        assert_eq!(up.recv(&mut buf).unwrap(), Some(100));
        assert_eq!(up.recv(&mut buf).unwrap(), None);
    }

    #[test]
    fn stale_socket_is_replaced_but_files_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        drop(UnixDatagram::bind(&a).unwrap());
        UnixDgramUplink::open(&a, &dir.path().join("b")).unwrap();

        let f = dir.path().join("file");
        std::fs::write(&f, b"keep me").unwrap();
        assert!(UnixDgramUplink::open(&f, &dir.path().join("b")).is_err());
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
    }

    #[test]
    fn send_without_peer_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let up = UnixDgramUplink::open(&dir.path().join("a"), &dir.path().join("nobody")).unwrap();
        assert!(up.send(&[0u8; 60]).is_err());
    }
}
