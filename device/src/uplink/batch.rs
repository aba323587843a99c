//! Many datagrams per system call (`recvmmsg`, `sendmmsg`): on loopback a
//! syscall per 1514-octet frame is a large part of the cost of a frame.
//! The wire is unchanged: each datagram is still one Ethernet frame.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::{Uplink, RECV_BUF_LEN};

/// Datagrams taken per `recvmmsg`.
pub const RECV_BATCH: usize = 32;
/// Datagrams given per `sendmmsg` at most.
pub const SEND_BATCH: usize = 64;

/// Frames received at once, handed out one by one.
#[derive(Debug)]
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    filled: usize,
    next: usize,
}

impl Default for RecvBatch {
    fn default() -> Self {
        // Zeroed buffers: pages no datagram ever reached stay untouched.
        Self { bufs: vec![vec![0; RECV_BUF_LEN]; RECV_BATCH], lens: vec![0; RECV_BATCH], filled: 0, next: 0 }
    }
}

impl RecvBatch {
    /// The next frame from the uplink, receiving a new batch when this
    /// one is used up; `Ok(None)` when nothing is pending.
    pub fn next_frame(&mut self, uplink: &dyn Uplink) -> io::Result<Option<&[u8]>> {
        if self.next == self.filled {
            self.next = 0;
            self.filled = 0;
            self.filled = uplink.recv_batch(&mut self.bufs, &mut self.lens)?;
            if self.filled == 0 {
                return Ok(None);
            }
        }
        let at = self.next;
        self.next += 1;
        let len = self.lens.get(at).copied().unwrap_or(0);
        Ok(self.bufs.get(at).and_then(|b| b.get(..len)))
    }
}

/// `recvmmsg` on a non-blocking socket into `bufs`, one datagram each;
/// `names` (as many) receive the senders' addresses when given. Returns how
/// many arrived, `Ok(0)` when none was pending.
pub(super) fn recvmmsg(
    fd: RawFd,
    bufs: &mut [Vec<u8>],
    lens: &mut [usize],
    mut names: Option<&mut [libc::sockaddr_un]>,
) -> io::Result<usize> {
    let n = bufs.len().min(lens.len()).min(names.as_ref().map_or(usize::MAX, |n| n.len()));
    let mut iovs: Vec<libc::iovec> = bufs
        .iter_mut()
        .take(n)
        .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
        .collect();
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
    let mut msgs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
    for (i, (msg, iov)) in msgs.iter_mut().zip(iovs.iter_mut()).enumerate() {
        msg.msg_hdr.msg_iov = std::ptr::from_mut(iov);
        msg.msg_hdr.msg_iovlen = 1;
        if let Some(name) = names.as_deref_mut().and_then(|names| names.get_mut(i)) {
            msg.msg_hdr.msg_name = std::ptr::from_mut(name).cast();
            msg.msg_hdr.msg_namelen =
                libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_un>()).unwrap_or(0);
        }
    }
    let count = libc::c_uint::try_from(n).unwrap_or(0);
    // SAFETY: msgs holds `count` headers, each pointing at one iovec of
    // iovs (a live buffer of bufs with its length) and, when given, at a
    // sockaddr_un of names with its size; all of them outlive the call.
    let rc = unsafe { libc::recvmmsg(fd, msgs.as_mut_ptr(), count, libc::MSG_DONTWAIT, std::ptr::null_mut()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
    }
    let got = usize::try_from(rc).unwrap_or(0).min(n);
    for (len, msg) in lens.iter_mut().zip(&msgs).take(got) {
        *len = usize::try_from(msg.msg_len).unwrap_or(0);
    }
    Ok(got)
}

/// Whether a sockaddr_un (as recvmmsg filled it) names `path`.
pub(super) fn is_path(name: &libc::sockaddr_un, path: &Path) -> bool {
    let want = path.as_os_str().as_bytes();
    let got: Vec<u8> = name.sun_path.iter().take_while(|&&c| c != 0).map(|&c| c.to_ne_bytes()[0]).collect();
    got == want
}

/// `sendmmsg` of `frames` on a connected non-blocking socket: how many the
/// kernel took (fewer than all when the queue filled up); an error only
/// when the first one was refused.
pub(super) fn sendmmsg(fd: RawFd, frames: &[&[u8]]) -> io::Result<usize> {
    let n = frames.len().min(SEND_BATCH);
    let mut iovs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; SEND_BATCH];
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
    let mut msgs: [libc::mmsghdr; SEND_BATCH] = unsafe { std::mem::zeroed() };
    for ((iov, msg), frame) in iovs.iter_mut().zip(msgs.iter_mut()).zip(frames).take(n) {
        // The kernel only reads through iov_base (a send).
        *iov = libc::iovec { iov_base: frame.as_ptr().cast_mut().cast(), iov_len: frame.len() };
        msg.msg_hdr.msg_iov = std::ptr::from_mut(iov);
        msg.msg_hdr.msg_iovlen = 1;
    }
    let count = libc::c_uint::try_from(n).unwrap_or(0);
    // SAFETY: msgs holds `count` headers, each pointing at one iovec of
    // iovs that describes a live frame of `frames`; all outlive the call.
    let rc = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), count, libc::MSG_DONTWAIT) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(rc).unwrap_or(0))
}
