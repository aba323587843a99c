//! vt3d: a virtual T3-class iWARP RNIC, served to QEMU as a vhost-user-net
//! backend.
//!
//! Layout follows the device (see docs/architecture.md §1):
//! - [`vhost`]: the vhost-user socket, the relay in front of the rust-vmm
//!   daemon, and the per-connection backend.
//! - [`nic`]: the Ethernet function — virtqueue datapath and the demux
//!   point where the RDMA function (control channel, TOE) attaches.
//! - [`uplink`]: where frames leave the host side (udp, unix-dgram, tap).
//! - [`control`]: the driver↔device control channel (EtherType 0x88B5).
//! - [`rnic`]: RDMA resources (PD, TPT, CQ, QP) and the limits enforced;
//!   behind them the iWARP engine (`vt3-iwarp`): connections, and WQEs
//!   and CQEs between the guest's rings and the engine.
//! - [`abi`]: the mirror of `guest-driver/include/vt3_hw.h`.
//! - [`mgmt`]: the management socket behind `vt3d ctl`.
//! - [`capture`]: the pcapng capture of the uplink.
//! - [`chaos`]: seeded random fault schedules (`vt3d ctl chaos`).
//! - [`config`]: command line and configuration.
//! - `testing` (feature `test-utils`): the synthetic guest of the tests,
//!   fuzz targets and device bench.

pub mod abi;
pub mod capture;
pub mod chaos;
pub mod config;
pub mod control;
pub mod mgmt;
pub mod nic;
pub mod rnic;
pub mod t3;
#[cfg(feature = "test-utils")]
pub mod testing;
pub mod uplink;
pub mod vhost;

use std::io;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use thiserror::Error;

pub use config::Config;
use t3::{Device, T3};

#[derive(Debug, Error)]
pub enum Error {
    #[error("uplink {spec}: {source}")]
    Uplink { spec: String, source: io::Error },
    #[error("signal handling: {0}")]
    Signals(io::Error),
    #[error("management socket: {0}")]
    Mgmt(io::Error),
    #[error("--pcap: {0}")]
    Capture(#[from] capture::CaptureError),
    #[error(transparent)]
    Vhost(#[from] vhost::VhostError),
    #[error(transparent)]
    Key(#[from] control::key::KeyError),
    #[error(
        "no key: give --key-file FILE, and the guest the same file with QEMU's \
         -fw_cfg name=opt/vt3/key,file=FILE (libvirt: <sysinfo type='fwcfg'>), \
         or run unauthenticated with --insecure-no-key (and vt3.ko insecure_no_key=1)"
    )]
    NoKey,
}

/// The provisioned key `serve` runs with.
fn control_key(source: &config::KeySource) -> Result<control::Key, Error> {
    match source {
        config::KeySource::File(path) => {
            let (key, made) = control::key::load_or_create(path)?;
            if made {
                log::info!("made a new key in {} (give the guest the same file)", path.display());
            }
            Ok(key)
        }
        config::KeySource::InsecureNone => {
            log::warn!(
                "--insecure-no-key: any process in the guest with a packet socket can drive the device \
                 and reach all of guest memory"
            );
            Ok([0, 0])
        }
        config::KeySource::Missing => Err(Error::NoKey),
    }
}

/// Runs `vt3d serve` until SIGINT or SIGTERM.
pub fn serve(config: &Config) -> Result<(), Error> {
    let key = control_key(&config.key)?;
    let uplink = config.uplink.open().map_err(|source| Error::Uplink { spec: config.uplink.to_string(), source })?;
    let device = Arc::new(T3::new(uplink, config.mac, config.mtu).with_control_key(key));
    device.rnic().set_tcp_timeout(vt3_iwarp::toe::Duration::from_secs(config.tcp_timeout));
    device.rnic().set_poll_queues(config.poll_queues);
    let nic = device.eth();
    nic.capture.describe(&config.uplink.to_string());
    if let Some(path) = &config.pcap {
        nic.capture.start(path)?;
    }
    let listener = vhost::bind_frontend_socket(&config.socket)?;
    if let Some(path) = &config.mgmt {
        let mgmt = vhost::bind_frontend_socket(path)?;
        mgmt::spawn(mgmt, Arc::clone(&device)).map_err(Error::Mgmt)?;
    }

    // Signals become a readable socket that every wait also polls.
    let (stop, stop_writer) = UnixStream::pair().map_err(Error::Signals)?;
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let writer = stop_writer.try_clone().map_err(Error::Signals)?;
        signal_hook::low_level::pipe::register(signal, writer).map_err(Error::Signals)?;
    }

    log::info!("vt3d serving {} (uplink {}, mtu {})", config.socket.display(), config.uplink, config.mtu);
    let result = vhost::serve_frontends(&listener, &device, stop.as_fd());
    let _ = std::fs::remove_file(&config.socket);
    if let Some(path) = &config.mgmt {
        let _ = std::fs::remove_file(path);
    }
    if nic.capture.path().is_some() {
        // What was queued is written and the file closed.
        let _ = nic.capture.stop();
    }
    log::info!("vt3d exiting; {}", nic.stats);
    Ok(result?)
}
