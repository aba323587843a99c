//! `unix-dgram:LOCAL,REMOTE`: one frame per datagram, as QEMU's
//! `-netdev dgram,local.type=unix,...,remote.type=unix,...` exchanges them.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::{grow_socket_buffers, Received, Uplink, SOCKET_BUFFER};

#[derive(Debug)]
pub struct UnixDgramUplink {
    socket: UnixDatagram,
    local: PathBuf,
    remote: PathBuf,
    /// Connected to `remote`: only then does poll(2) report the peer's
    /// queue (EPOLLOUT once it has room), which the worker waits on when a
    /// send would block. An unconnected datagram socket always polls
    /// writable, so a full peer could never be waited for.
    connected: AtomicBool,
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
        let uplink =
            Self { socket, local: local.to_owned(), remote: remote.to_owned(), connected: AtomicBool::new(false) };
        // The peer may start (or restart) after us: connecting is retried
        // by every send until it works.
        if let Err(e) = uplink.connect() {
            log::debug!("unix-dgram: peer {} not there yet: {e}", remote.display());
        }
        Ok(uplink)
    }

    fn connect(&self) -> io::Result<()> {
        self.socket.connect(&self.remote)?;
        self.connected.store(true, Ordering::Relaxed);
        Ok(())
    }
}

/// The connected peer's socket is gone (it exited or was re-created).
fn peer_gone(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ECONNREFUSED | libc::ENOTCONN | libc::ECONNRESET))
}

impl Uplink for UnixDgramUplink {
    fn send(&self, frame: &[u8]) -> io::Result<()> {
        if !self.connected.load(Ordering::Relaxed) {
            self.connect()?;
        }
        match self.socket.send(frame) {
            // A peer that restarted binds a new socket at the same path:
            // connect to that one and try once more.
            Err(e) if peer_gone(&e) => {
                self.connected.store(false, Ordering::Relaxed);
                self.connect()?;
                self.socket.send(frame).map(drop)
            }
            other => other.map(drop),
        }
    }

    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        // Not connected yet, or the peer restarted: send() finds it.
        let Some(first) = frames.first() else { return Ok(0) };
        if !self.connected.load(Ordering::Relaxed) {
            self.send(first)?;
            return Ok(1);
        }
        match super::batch::sendmmsg(self.socket.as_raw_fd(), frames) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            Err(e) if peer_gone(&e) => self.send(first).map(|()| 1),
            other => other,
        }
    }

    fn recv_batch(&self, bufs: &mut [Vec<u8>], received: &mut [Received]) -> io::Result<usize> {
        // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
        let mut names: Vec<libc::sockaddr_un> = (0..bufs.len()).map(|_| unsafe { std::mem::zeroed() }).collect();
        let got = super::batch::recvmmsg(self.socket.as_raw_fd(), bufs, received, Some(&mut names), false)?;
        // Only the peer's datagrams are frames: keep those, in order.
        let mut kept = 0;
        for i in 0..got {
            let from_peer = names.get(i).is_some_and(|n| super::batch::is_path(n, &self.remote));
            if !from_peer {
                log::debug!("unix-dgram: ignoring a datagram from another socket");
                continue;
            }
            if i != kept {
                bufs.swap(i, kept);
                received.swap(i, kept);
            }
            kept += 1;
        }
        Ok(kept)
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

        // Connected to its peer, the uplink refuses strangers outright
        // (EPERM for them); were it not connected yet, recv drops theirs.
        let _ = stranger.send_to(b"noise", &a);
        peer.send_to(&frame[..100], &a).unwrap();
        let mut batch = crate::uplink::RecvBatch::default();
        assert_eq!(batch.next_frame(&up).unwrap(), Some(&frame[..100]));
        assert_eq!(batch.next_frame(&up).unwrap(), None);
    }

    #[test]
    fn a_batch_takes_the_peers_frames_in_order_and_drops_strangers() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (dir.path().join("a"), dir.path().join("b"), dir.path().join("c"));
        let peer = UnixDatagram::bind(&b).unwrap();
        let stranger = UnixDatagram::bind(&c).unwrap();
        // Not connected yet (no send so far): a stranger's datagram gets in.
        let mut up = UnixDgramUplink::open(&a, &dir.path().join("nobody")).unwrap();
        up.remote = b.clone();
        peer.send_to(&[1u8; 60], &a).unwrap();
        stranger.send_to(b"noise", &a).unwrap();
        peer.send_to(&[2u8; 1514], &a).unwrap();
        let mut batch = crate::uplink::RecvBatch::default();
        assert_eq!(batch.next_frame(&up).unwrap(), Some(&[1u8; 60][..]));
        assert_eq!(batch.next_frame(&up).unwrap(), Some(&[2u8; 1514][..]));
        assert_eq!(batch.next_frame(&up).unwrap(), None);
    }

    #[test]
    fn a_batch_is_sent_in_order_and_stops_at_a_full_peer() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let peer = UnixDatagram::bind(&b).unwrap();
        let up = UnixDgramUplink::open(&a, &b).unwrap();
        let frames: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 60 + usize::from(i)]).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        assert_eq!(up.send_batch(&refs).unwrap(), 5);
        let mut buf = vec![0u8; 2048];
        for f in &frames {
            let n = peer.recv(&mut buf).unwrap();
            assert_eq!(&buf[..n], &f[..]);
        }
        // A peer that never reads: the batch stops where its queue is full.
        let big = vec![7u8; 60_000];
        let many: Vec<&[u8]> = (0..64).map(|_| big.as_slice()).collect();
        let mut total = 0;
        loop {
            let sent = up.send_batch(&many).unwrap();
            total += sent;
            if sent < many.len() {
                break;
            }
            assert!(total < 1 << 20, "the peer's queue never filled");
        }
        assert_eq!(up.send(&big).unwrap_err().kind(), io::ErrorKind::WouldBlock);
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

    fn writable(fd: RawFd) -> bool {
        let mut pfd = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd that lives across the call; no timeout.
        let n = unsafe { libc::poll(&mut pfd, 1, 0) };
        n == 1 && pfd.revents & libc::POLLOUT != 0
    }

    #[test]
    fn a_full_peer_is_reported_by_poll_and_a_started_peer_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        // The peer starts after the uplink: the first send finds it.
        let up = UnixDgramUplink::open(&a, &b).unwrap();
        assert!(up.send(&[1u8; 60]).is_err(), "no peer yet");
        let peer = UnixDatagram::bind(&b).unwrap();
        up.send(&[2u8; 60]).unwrap();
        // Fill the peer's queue: poll says not writable, then writable
        // once the peer reads.
        let mut sent = 1;
        while up.send(&[3u8; 60]).is_ok() {
            sent += 1;
            assert!(sent < 100_000);
        }
        assert!(!writable(up.as_raw_fd()), "a full peer must not poll writable");
        let mut buf = [0u8; 64];
        for _ in 0..sent {
            peer.recv(&mut buf).unwrap();
        }
        assert!(writable(up.as_raw_fd()));
        // The peer restarts at the same path: the uplink reconnects.
        drop(peer);
        std::fs::remove_file(&b).unwrap();
        let peer = UnixDatagram::bind(&b).unwrap();
        up.send(&[4u8; 60]).unwrap();
        assert_eq!(peer.recv(&mut buf).unwrap(), 60);
        assert_eq!(buf[0], 4);
    }

    #[test]
    fn send_without_peer_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let up = UnixDgramUplink::open(&dir.path().join("a"), &dir.path().join("nobody")).unwrap();
        assert!(up.send(&[0u8; 60]).is_err());
    }
}
