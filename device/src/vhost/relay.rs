//! A vhost-user message relay between QEMU and our `VhostUserDaemon`.
//!
//! Why: QEMU (7.2 through 10.x) sends `SET_VRING_ENABLE` for virtio-net
//! *before* `SET_FEATURES`. The published `vhost`/`vhost-user-backend`
//! crates treat that as a protocol violation ("inactive feature") and drop
//! the connection. Rather than patch them, vt3d accepts QEMU's connection
//! itself and relays every message (header, payload, SCM_RIGHTS fds) to the
//! daemon over a private socket. An early `SET_VRING_ENABLE` is held back
//! (and acked to QEMU if it asked for a reply) and replayed right after
//! `SET_FEATURES`. Only control messages cross the relay: the rings, kick
//! and call eventfds and guest memory are shared directly.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use vmm_sys_util::sock_ctrl_msg::ScmSocket;

pub const HEADER_LEN: usize = 12;
/// Generous bound on a message body (the largest, a memory table of 509
/// slots, is ~16 KiB); anything larger is a broken peer.
const MAX_PAYLOAD: usize = 64 * 1024;
/// vhost-user passes at most 32 fds with one message.
const MAX_FDS: usize = 32;

pub const SET_FEATURES: u32 = 2;
pub const SET_VRING_ENABLE: u32 = 18;
const FLAG_VERSION: u32 = 0x1;
const FLAG_REPLY: u32 = 0x4;
const FLAG_NEED_REPLY: u32 = 0x8;

/// One vhost-user message with the fds that came with it.
#[derive(Debug)]
pub struct Message {
    header: [u8; HEADER_LEN],
    payload: Vec<u8>,
    fds: Vec<File>,
}

impl Message {
    pub fn new(request: u32, flags: u32, payload: &[u8]) -> Self {
        let mut header = [0u8; HEADER_LEN];
        let size = u32::try_from(payload.len()).unwrap_or(u32::MAX);
        for (i, v) in [request, flags, size].into_iter().enumerate() {
            if let Some(dst) = header.get_mut(i * 4..i * 4 + 4) {
                dst.copy_from_slice(&v.to_le_bytes());
            }
        }
        Self { header, payload: payload.to_vec(), fds: Vec::new() }
    }

    fn word(&self, i: usize) -> u32 {
        let mut w = [0u8; 4];
        if let Some(src) = self.header.get(i * 4..i * 4 + 4) {
            w.copy_from_slice(src);
        }
        u32::from_le_bytes(w)
    }

    pub fn request(&self) -> u32 {
        self.word(0)
    }

    pub fn flags(&self) -> u32 {
        self.word(1)
    }

    pub fn payload(&self) -> &[u8] {
        &self.payload
    }

    fn set_flags(&mut self, flags: u32) {
        if let Some(dst) = self.header.get_mut(4..8) {
            dst.copy_from_slice(&flags.to_le_bytes());
        }
    }

    /// Reads one message; `Ok(None)` on a clean end of stream.
    pub fn read_from(sock: &UnixStream) -> io::Result<Option<Self>> {
        let mut header = [0u8; HEADER_LEN];
        let mut raw_fds = [-1 as RawFd; MAX_FDS];
        let mut iov = [libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: header.len() }];
        let (n, nfds) = retry_interrupted(|| {
            // SAFETY: the iovec points at `header`, which lives and is not
            // otherwise borrowed until the call returns; `raw_fds` is a
            // valid out-buffer of MAX_FDS entries.
            unsafe { sock.recv_with_fds(&mut iov, &mut raw_fds) }.map_err(io::Error::from)
        })?;
        let fds = raw_fds
            .iter()
            .take(nfds)
            // SAFETY: the kernel installed these fds for us in recvmsg; we
            // are their only owner.
            .map(|&fd| unsafe { File::from_raw_fd(fd) })
            .collect();
        if n == 0 {
            return Ok(None);
        }
        if n < HEADER_LEN {
            let rest = header.get_mut(n..).unwrap_or_default();
            (&*sock).read_exact(rest)?;
        }
        let mut msg = Self { header, payload: Vec::new(), fds };
        let size = msg.word(2) as usize;
        if size > MAX_PAYLOAD {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("vhost-user message {} with {size}-byte body", msg.request()),
            ));
        }
        msg.payload.resize(size, 0);
        (&*sock).read_exact(&mut msg.payload)?;
        Ok(Some(msg))
    }

    /// Writes the message, its fds riding on the first byte.
    pub fn write_to(&self, sock: &UnixStream) -> io::Result<()> {
        let fds: Vec<RawFd> = self.fds.iter().map(AsRawFd::as_raw_fd).collect();
        let bufs = [&self.header[..], &self.payload[..]];
        let sent = retry_interrupted(|| sock.send_with_fds(&bufs, &fds).map_err(io::Error::from))?;
        let total = HEADER_LEN + self.payload.len();
        if sent < total {
            // A stream socket may take a large body in pieces.
            let mut rest = Vec::with_capacity(total);
            rest.extend_from_slice(&self.header);
            rest.extend_from_slice(&self.payload);
            (&*sock).write_all(rest.get(sent..).unwrap_or_default())?;
        }
        Ok(())
    }
}

/// Runs a socket call again when a signal interrupted it before it moved
/// anything (EINTR): `recvmsg`/`sendmsg` with fds are not retried for us as
/// `read_exact`/`write_all` are, and any signal vt3d gets (a handler
/// without SA_RESTART, a profiler, a debugger) would otherwise end QEMU's
/// vhost-user connection. Found by the `vhost_user_relay` fuzz target, whose
/// timer signal interrupted a relay.
fn retry_interrupted<T>(mut call: impl FnMut() -> io::Result<T>) -> io::Result<T> {
    loop {
        match call() {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            result => return result,
        }
    }
}

/// Why the relay stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayEnd {
    FrontendClosed,
    BackendClosed,
    Stopped,
}

/// Per-connection relay state.
#[derive(Debug, Default)]
pub struct Relay {
    features_set: bool,
    held: Vec<Message>,
}

impl Relay {
    /// Handles one message from the frontend.
    pub fn from_frontend(&mut self, mut msg: Message, frontend: &UnixStream, backend: &UnixStream) -> io::Result<()> {
        match msg.request() {
            SET_VRING_ENABLE if !self.features_set => {
                log::debug!("holding SET_VRING_ENABLE sent before SET_FEATURES");
                if msg.flags() & FLAG_NEED_REPLY != 0 {
                    let ack = Message::new(SET_VRING_ENABLE, FLAG_VERSION | FLAG_REPLY, &0u64.to_le_bytes());
                    ack.write_to(frontend)?;
                    msg.set_flags(msg.flags() & !FLAG_NEED_REPLY);
                }
                self.held.push(msg);
                Ok(())
            }
            SET_FEATURES => {
                msg.write_to(backend)?;
                self.features_set = true;
                for held in self.held.drain(..) {
                    held.write_to(backend)?;
                }
                Ok(())
            }
            _ => msg.write_to(backend),
        }
    }

    /// Relays until one side closes or `stop` becomes readable.
    pub fn run(&mut self, frontend: &UnixStream, backend: &UnixStream, stop: BorrowedFd<'_>) -> io::Result<RelayEnd> {
        loop {
            let [front_ready, back_ready, stop_ready] = poll_readable([frontend.as_fd(), backend.as_fd(), stop])?;
            if stop_ready {
                return Ok(RelayEnd::Stopped);
            }
            if front_ready {
                match Message::read_from(frontend) {
                    Ok(Some(msg)) => self.from_frontend(msg, frontend, backend)?,
                    Ok(None) => return Ok(RelayEnd::FrontendClosed),
                    Err(e) if is_disconnect(&e) => return Ok(RelayEnd::FrontendClosed),
                    Err(e) => return Err(e),
                }
            }
            if back_ready {
                match Message::read_from(backend) {
                    Ok(Some(msg)) => msg.write_to(frontend)?,
                    Ok(None) => return Ok(RelayEnd::BackendClosed),
                    Err(e) if is_disconnect(&e) => return Ok(RelayEnd::BackendClosed),
                    Err(e) => return Err(e),
                }
            }
        }
    }
}

fn is_disconnect(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::ConnectionReset | io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe)
}

/// Waits until at least one fd is readable (or hung up).
pub fn poll_readable<const N: usize>(fds: [BorrowedFd<'_>; N]) -> io::Result<[bool; N]> {
    let mut pollfds = fds.map(|fd| libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 });
    loop {
        // SAFETY: `pollfds` is a valid array of N pollfd structs whose fds
        // are borrowed for the duration of the call.
        let ret = unsafe { libc::poll(pollfds.as_mut_ptr(), N as libc::nfds_t, -1) };
        if ret >= 0 {
            break;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
    let ready = libc::POLLIN | libc::POLLHUP | libc::POLLERR;
    Ok(pollfds.map(|p| p.revents & ready != 0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    #[test]
    fn message_round_trip_with_fds() {
        let (a, b) = pair();
        let mut msg = Message::new(5, FLAG_VERSION, &[1, 2, 3, 4, 5, 6, 7, 8]);
        msg.fds.push(tempfile::tempfile().unwrap());
        msg.fds.push(tempfile::tempfile().unwrap());
        msg.write_to(&a).unwrap();
        let got = Message::read_from(&b).unwrap().unwrap();
        assert_eq!((got.request(), got.flags(), got.payload()), (5, FLAG_VERSION, &[1, 2, 3, 4, 5, 6, 7, 8][..]));
        assert_eq!(got.fds.len(), 2);
    }

    #[test]
    fn oversized_body_is_refused() {
        let (a, b) = pair();
        let mut header = Message::new(1, FLAG_VERSION, &[]).header;
        header[8..12].copy_from_slice(&(MAX_PAYLOAD as u32 + 1).to_le_bytes());
        (&a).write_all(&header).unwrap();
        let err = Message::read_from(&b).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn truncated_message_is_an_error_and_eof_is_none() {
        let (a, b) = pair();
        (&a).write_all(&Message::new(1, FLAG_VERSION, &[0; 8]).header).unwrap();
        (&a).write_all(&[0; 3]).unwrap();
        drop(a);
        assert!(Message::read_from(&b).is_err());
        let (a, b) = pair();
        drop(a);
        assert!(Message::read_from(&b).unwrap().is_none());
    }

    /// QEMU's order: SET_VRING_ENABLE (with REPLY_ACK) before SET_FEATURES.
    #[test]
    fn early_vring_enable_is_acked_held_and_replayed_after_set_features() {
        let (qemu, front) = pair();
        let (back, daemon) = pair();
        let mut relay = Relay::default();

        let enable = Message::new(SET_VRING_ENABLE, FLAG_VERSION | FLAG_NEED_REPLY, &[0, 0, 0, 0, 1, 0, 0, 0]);
        relay.from_frontend(enable, &front, &back).unwrap();
        let ack = Message::read_from(&qemu).unwrap().unwrap();
        assert_eq!(ack.request(), SET_VRING_ENABLE);
        assert_eq!(ack.flags(), FLAG_VERSION | FLAG_REPLY);
        assert_eq!(ack.payload(), &0u64.to_le_bytes());

        let features = Message::new(SET_FEATURES, FLAG_VERSION, &(1u64 << 30).to_le_bytes());
        relay.from_frontend(features, &front, &back).unwrap();
        let first = Message::read_from(&daemon).unwrap().unwrap();
        let second = Message::read_from(&daemon).unwrap().unwrap();
        assert_eq!(first.request(), SET_FEATURES);
        assert_eq!(second.request(), SET_VRING_ENABLE);
        assert_eq!(second.flags() & FLAG_NEED_REPLY, 0, "the relay already answered");
        assert_eq!(second.payload(), &[0, 0, 0, 0, 1, 0, 0, 0]);

        // After SET_FEATURES, SET_VRING_ENABLE passes straight through.
        let later = Message::new(SET_VRING_ENABLE, FLAG_VERSION | FLAG_NEED_REPLY, &[1, 0, 0, 0, 1, 0, 0, 0]);
        relay.from_frontend(later, &front, &back).unwrap();
        let passed = Message::read_from(&daemon).unwrap().unwrap();
        assert_eq!(passed.flags() & FLAG_NEED_REPLY, FLAG_NEED_REPLY);
    }
}
