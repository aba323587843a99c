//! Many datagrams per system call (`recvmmsg`, `sendmmsg`): on loopback a
//! syscall per 1514-octet frame is a large part of the cost of a frame.
//! The wire is unchanged: each datagram is still one Ethernet frame. With
//! UDP GRO (`gso.rs`) the kernel may hand over several datagrams of one
//! size in one receive; [`Received`] says where each frame is.

use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::gso::GroControl;
use super::{Uplink, RECV_BUF_LEN};

/// Datagrams taken per `recvmmsg`.
pub const RECV_BATCH: usize = 32;
/// Datagrams given per `sendmmsg` at most.
pub const SEND_BATCH: usize = 64;

/// What one receive put into its buffer: `len` octets, one frame, or
/// frames of `segment` octets each (the last may be shorter) when the
/// kernel coalesced datagrams of one size (UDP GRO).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Received {
    pub len: usize,
    pub segment: usize,
}

impl Received {
    /// One datagram, one frame.
    pub fn single(len: usize) -> Self {
        Self { len, segment: len }
    }

    /// The length of each frame but the last (never 0, never past `len`).
    fn frame_len(self) -> usize {
        if self.segment == 0 || self.segment > self.len {
            self.len.max(1)
        } else {
            self.segment
        }
    }

    /// The frames of `buf`, the buffer this receive filled.
    pub fn frames(self, buf: &[u8]) -> std::slice::Chunks<'_, u8> {
        buf.get(..self.len).unwrap_or(buf).chunks(self.frame_len())
    }
}

/// Receives at most one datagram into `bufs[0]` with `read` (an uplink
/// without batched receive); returns how many (0 or 1).
pub fn receive_one(
    bufs: &mut [Vec<u8>],
    received: &mut [Received],
    read: impl FnOnce(&mut [u8]) -> io::Result<Option<usize>>,
) -> io::Result<usize> {
    let (Some(buf), Some(slot)) = (bufs.first_mut(), received.first_mut()) else { return Ok(0) };
    Ok(read(buf)?.map_or(0, |len| {
        *slot = Received::single(len);
        1
    }))
}

/// Frames received at once, handed out one by one.
#[derive(Debug)]
pub struct RecvBatch {
    bufs: Vec<Vec<u8>>,
    received: Vec<Received>,
    filled: usize,
    /// The receive whose frames are being handed out, and where in its
    /// buffer the next frame starts.
    next: usize,
    offset: usize,
}

impl Default for RecvBatch {
    fn default() -> Self {
        // Zeroed buffers: pages no datagram ever reached stay untouched.
        Self {
            bufs: vec![vec![0; RECV_BUF_LEN]; RECV_BATCH],
            received: vec![Received::default(); RECV_BATCH],
            filled: 0,
            next: 0,
            offset: 0,
        }
    }
}

impl RecvBatch {
    /// The next frame from the uplink, receiving a new batch when this
    /// one is used up; `Ok(None)` when nothing is pending.
    pub fn next_frame(&mut self, uplink: &dyn Uplink) -> io::Result<Option<&[u8]>> {
        loop {
            if self.next == self.filled {
                self.next = 0;
                self.offset = 0;
                self.filled = 0;
                self.filled = uplink.recv_batch(&mut self.bufs, &mut self.received)?;
                if self.filled == 0 {
                    return Ok(None);
                }
            }
            let at = self.next;
            let received = self.received.get(at).copied().unwrap_or_default();
            let start = self.offset;
            if start >= received.len {
                // An empty datagram carries no frame.
                self.next += 1;
                self.offset = 0;
                continue;
            }
            let end = received.len.min(start + received.frame_len());
            if end == received.len {
                self.next += 1;
                self.offset = 0;
            } else {
                self.offset = end;
            }
            return Ok(self.bufs.get(at).and_then(|b| b.get(start..end)));
        }
    }
}

/// `recvmmsg` on a non-blocking socket into `bufs`, one receive each;
/// `names` (as many) receive the senders' addresses when given. With
/// `gro`, a receive may hold coalesced datagrams: their size comes from
/// the `UDP_GRO` control message. Returns how many receives arrived,
/// `Ok(0)` when none was pending.
pub(super) fn recvmmsg(
    fd: RawFd,
    bufs: &mut [Vec<u8>],
    received: &mut [Received],
    mut names: Option<&mut [libc::sockaddr_un]>,
    gro: bool,
) -> io::Result<usize> {
    let n = bufs.len().min(received.len()).min(names.as_ref().map_or(usize::MAX, |n| n.len()));
    let mut iovs: Vec<libc::iovec> =
        bufs.iter_mut().take(n).map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }).collect();
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
    let mut msgs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { std::mem::zeroed() }).collect();
    let mut controls: Vec<GroControl> = if gro { vec![GroControl::empty(); n] } else { Vec::new() };
    for (i, (msg, iov)) in msgs.iter_mut().zip(iovs.iter_mut()).enumerate() {
        msg.msg_hdr.msg_iov = std::ptr::from_mut(iov);
        msg.msg_hdr.msg_iovlen = 1;
        if let Some(name) = names.as_deref_mut().and_then(|names| names.get_mut(i)) {
            msg.msg_hdr.msg_name = std::ptr::from_mut(name).cast();
            msg.msg_hdr.msg_namelen = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_un>()).unwrap_or(0);
        }
        if let Some(control) = controls.get_mut(i) {
            msg.msg_hdr.msg_control = std::ptr::from_mut(control).cast();
            msg.msg_hdr.msg_controllen = std::mem::size_of::<GroControl>();
        }
    }
    let count = libc::c_uint::try_from(n).unwrap_or(0);
    // SAFETY: msgs holds `count` headers, each pointing at one iovec of
    // iovs (a live buffer of bufs with its length), when given at a
    // sockaddr_un of names and at a control buffer of controls, each with
    // its size; all of them outlive the call.
    let rc = unsafe { libc::recvmmsg(fd, msgs.as_mut_ptr(), count, libc::MSG_DONTWAIT, std::ptr::null_mut()) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock { Ok(0) } else { Err(e) };
    }
    let got = usize::try_from(rc).unwrap_or(0).min(n);
    for (i, (slot, msg)) in received.iter_mut().zip(&msgs).enumerate().take(got) {
        let len = usize::try_from(msg.msg_len).unwrap_or(0);
        let segment = controls.get(i).and_then(|c| c.segment(msg.msg_hdr.msg_controllen));
        *slot = Received { len, segment: segment.unwrap_or(len) };
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
