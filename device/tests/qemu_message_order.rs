//! Reproduces QEMU's vhost-user message order for virtio-net — including
//! SET_VRING_ENABLE before SET_FEATURES — against the real daemon, once
//! through vt3d's relay (must work) and once straight to the daemon (the
//! published crate drops the connection: the reason the relay exists).

#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vt3d::t3::T3;
use vt3d::uplink::UplinkSpec;
use vt3d::vhost::backend::NetBackend;
use vt3d::vhost::relay::RelayEnd;
use vt3d::vhost::serve_frontend;

const GET_FEATURES: u32 = 1;
const SET_FEATURES: u32 = 2;
const SET_OWNER: u32 = 3;
const GET_PROTOCOL_FEATURES: u32 = 15;
const SET_PROTOCOL_FEATURES: u32 = 16;
const SET_VRING_ENABLE: u32 = 18;
const VERSION: u32 = 0x1;
const REPLY: u32 = 0x4;
const NEED_REPLY: u32 = 0x8;
const PROTOCOL_FEATURES: u64 = 1 << 30;
const REPLY_ACK: u64 = 1 << 3;

/// The QEMU side of the conversation, written by hand from the spec.
struct Frontend(UnixStream);

impl Frontend {
    fn send(&mut self, request: u32, flags: u32, payload: &[u8]) {
        let mut msg = Vec::new();
        for w in [request, VERSION | flags, payload.len() as u32] {
            msg.extend_from_slice(&w.to_le_bytes());
        }
        msg.extend_from_slice(payload);
        self.0.write_all(&msg).unwrap();
    }

    /// Reads a reply; `None` if the peer hung up.
    fn reply(&mut self, request: u32) -> Option<u64> {
        let mut hdr = [0u8; 12];
        self.0.read_exact(&mut hdr).ok()?;
        let word = |i: usize| u32::from_le_bytes(hdr[i * 4..i * 4 + 4].try_into().unwrap());
        assert_eq!(word(0), request, "reply to the wrong request");
        assert_eq!(word(1) & REPLY, REPLY);
        let mut body = vec![0u8; word(2) as usize];
        self.0.read_exact(&mut body).ok()?;
        Some(u64::from_le_bytes(body[..8].try_into().unwrap()))
    }

    /// QEMU 7.2/10.0 opening a vhost-user-net device, up to SET_FEATURES.
    /// Returns `None` as soon as the backend hangs up.
    fn qemu_handshake(&mut self) -> Option<()> {
        self.send(GET_FEATURES, 0, &[]);
        let features = self.reply(GET_FEATURES)?;
        assert_ne!(features & PROTOCOL_FEATURES, 0);
        self.send(GET_PROTOCOL_FEATURES, 0, &[]);
        let protocol = self.reply(GET_PROTOCOL_FEATURES)?;
        assert_ne!(protocol & REPLY_ACK, 0);
        self.send(SET_PROTOCOL_FEATURES, 0, &REPLY_ACK.to_le_bytes());
        self.send(SET_OWNER, NEED_REPLY, &[]);
        assert_eq!(self.reply(SET_OWNER)?, 0);
        // The quirk: vring enable (disable, here) before the features.
        let mut state = Vec::new();
        state.extend_from_slice(&0u32.to_le_bytes());
        state.extend_from_slice(&0u32.to_le_bytes());
        self.send(SET_VRING_ENABLE, NEED_REPLY, &state);
        assert_eq!(self.reply(SET_VRING_ENABLE)?, 0);
        self.send(SET_FEATURES, NEED_REPLY, &(features & !(1u64 << 24)).to_le_bytes());
        assert_eq!(self.reply(SET_FEATURES)?, 0);
        // Still talking?
        self.send(GET_PROTOCOL_FEATURES, 0, &[]);
        self.reply(GET_PROTOCOL_FEATURES)?;
        Some(())
    }
}

fn nic(dir: &std::path::Path) -> Arc<T3> {
    let spec: UplinkSpec =
        format!("unix-dgram:{},{}", dir.join("up").display(), dir.join("peer").display()).parse().unwrap();
    Arc::new(T3::new(spec.open().unwrap(), None, 1500))
}

#[test]
fn qemu_order_works_through_the_relay() {
    let dir = tempfile::tempdir().unwrap();
    let nic = nic(dir.path());
    let (qemu, vt3d) = UnixStream::pair().unwrap();
    let (stop, _stop_writer) = UnixStream::pair().unwrap();
    let server = thread::spawn(move || serve_frontend(&vt3d, &nic, stop.as_fd()).unwrap());

    let mut frontend = Frontend(qemu);
    frontend.0.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(frontend.qemu_handshake(), Some(()), "vt3d dropped QEMU's connection");
    drop(frontend);
    assert_eq!(server.join().unwrap(), RelayEnd::FrontendClosed);
}

#[test]
fn the_published_daemon_alone_rejects_qemu_order() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Arc::new(NetBackend::new(nic(dir.path())).unwrap());
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon = VhostUserDaemon::new("direct".into(), backend, mem).unwrap();
    let path = dir.path().join("direct.sock");
    let mut listener = Listener::new(&path, true).unwrap();
    let qemu = UnixStream::connect(&path).unwrap();
    daemon.start(&mut listener).unwrap();

    let mut frontend = Frontend(qemu);
    frontend.0.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(
        frontend.qemu_handshake(),
        None,
        "vhost-user-backend now accepts QEMU's order: the relay may be unnecessary"
    );
    let _ = daemon.wait();
}
