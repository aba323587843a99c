//! vhost-user plumbing: the frontend socket, the relay in front of the
//! rust-vmm daemon, and one backend per frontend connection.

pub mod backend;
pub mod relay;

use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use thiserror::Error;
use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use crate::t3::Device;
use crate::uplink::RecvBatch;
use backend::{NetBackend, KICK_EVENT, POLL_EVENT, RESUME_EVENT, TIMER_EVENT, UPLINK_EVENT, WRITABLE_EVENT};
use relay::{poll_readable, Relay, RelayEnd};

#[derive(Debug, Error)]
pub enum VhostError {
    #[error("frontend socket {path}: {source}")]
    Socket { path: String, source: io::Error },
    #[error("private backend channel: {0}")]
    Channel(io::Error),
    #[error("vhost-user daemon: {0}")]
    Daemon(String),
    #[error("registering the uplink with the worker: {0}")]
    Register(io::Error),
    #[error("engine timer: {0}")]
    Timer(io::Error),
    #[error("relay: {0}")]
    Relay(io::Error),
}

/// Binds the frontend socket, replacing a stale socket (never a file).
pub fn bind_frontend_socket(path: &Path) -> Result<UnixListener, VhostError> {
    let err = |source| VhostError::Socket { path: path.display().to_string(), source };
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            std::fs::remove_file(path).map_err(err)?;
        }
    }
    UnixListener::bind(path).map_err(err)
}

/// Serves frontends one after another until `stop` becomes readable:
/// when QEMU exits, the next QEMU can connect to the same vt3d.
pub fn serve_frontends<D: Device + 'static>(
    listener: &UnixListener,
    device: &Arc<D>,
    stop: BorrowedFd<'_>,
) -> Result<(), VhostError> {
    let nic = device.eth();
    let mut session = 0u64;
    let mut discard = RecvBatch::default();
    loop {
        // SAFETY: the uplink's descriptor stays open as long as `device`,
        // which outlives this borrow.
        let uplink = unsafe { BorrowedFd::borrow_raw(nic.uplink().as_raw_fd()) };
        let [incoming, stopped, frames] = poll_readable([listener.as_fd(), stop, uplink]).map_err(VhostError::Relay)?;
        if stopped {
            return Ok(());
        }
        if frames {
            // No guest to give them to: dropped, never left to block the peer.
            nic.discard_uplink(&mut discard);
        }
        if !incoming {
            continue;
        }
        let (frontend, _) = listener.accept().map_err(VhostError::Relay)?;
        session += 1;
        log::info!("session {session}: frontend connected");
        let end = serve_frontend(&frontend, device, stop)?;
        log::info!("session {session}: ended ({end:?}); {}", nic.stats);
        if end == RelayEnd::Stopped {
            return Ok(());
        }
    }
}

/// Runs one frontend connection to its end.
pub fn serve_frontend<D: Device + 'static>(
    frontend: &UnixStream,
    device: &Arc<D>,
    stop: BorrowedFd<'_>,
) -> Result<RelayEnd, VhostError> {
    let nic = device.eth();
    let backend = Arc::new(NetBackend::new(Arc::clone(device)).map_err(VhostError::Timer)?);
    let timer = backend.timer_fd();
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut daemon = VhostUserDaemon::new("vt3d-net".to_owned(), Arc::clone(&backend), mem).map_err(daemon_error)?;
    for handler in daemon.get_epoll_handlers().iter().take(1) {
        // Edge triggered: a pass reads until the socket is empty or its
        // budget ends (then it resumes on its own).
        handler
            .register_listener(
                nic.uplink().as_raw_fd(),
                EventSet::IN | EventSet::EDGE_TRIGGERED,
                u64::from(UPLINK_EVENT),
            )
            .map_err(VhostError::Register)?;
        // The uplink's EPOLLOUT, while frames wait for room (level
        // triggered: readable as long as the watched uplink is writable).
        handler
            .register_listener(backend.writable_fd(), EventSet::IN, u64::from(WRITABLE_EVENT))
            .map_err(VhostError::Register)?;
        // Level triggered: pending until the worker reads it.
        handler
            .register_listener(backend.resume_fd(), EventSet::IN, u64::from(RESUME_EVENT))
            .map_err(VhostError::Register)?;
        // Level triggered: readable for as long as the RNIC polls.
        handler
            .register_listener(backend.poll_fd(), EventSet::IN, u64::from(POLL_EVENT))
            .map_err(VhostError::Register)?;
        // Level triggered: an expiry stays readable until consumed.
        handler.register_listener(timer, EventSet::IN, u64::from(TIMER_EVENT)).map_err(VhostError::Register)?;
        if let Some(kick) = device.kick_fd() {
            handler.register_listener(kick, EventSet::IN, u64::from(KICK_EVENT)).map_err(VhostError::Register)?;
        }
    }
    let (mut private, daemon_end) = private_channel().map_err(VhostError::Channel)?;
    daemon.start(&mut private).map_err(daemon_error)?;

    let end = Relay::default().run(frontend, &daemon_end, stop);
    let _ = daemon_end.shutdown(std::net::Shutdown::Both);
    let _ = frontend.shutdown(std::net::Shutdown::Both);
    if let Err(e) = daemon.wait() {
        log::debug!("daemon ended: {e}");
    }
    // Dropping the daemon stops and joins its worker thread.
    drop(daemon);
    // The guest is gone, and with it every resource it created.
    device.end_session();
    end.map_err(VhostError::Relay)
}

fn daemon_error(e: vhost_user_backend::Error) -> VhostError {
    VhostError::Daemon(format!("{e:?}"))
}

/// A listener the daemon accepts on and the relay's end, connected through
/// an abstract unix socket (no file, nothing to clean up).
fn private_channel() -> io::Result<(Listener, UnixStream)> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!("vt3d-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let listener = UnixListener::bind_addr(&addr)?;
    // The connection waits in the backlog until the daemon accepts it.
    let relay_end = UnixStream::connect_addr(&addr)?;
    Ok((Listener::from(listener), relay_end))
}
