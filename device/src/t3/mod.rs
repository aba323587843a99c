//! The T3 device behind the virtqueues: the Ethernet function
//! ([`crate::nic`]: uplink, MAC filter, EtherType demux, counters) and the
//! RDMA function ([`crate::control`] and [`crate::rnic`]) side by side,
//! neither owning the other. vhost-user walks the rings and calls the
//! device only through [`Device`], as rust-vmm's vhost-device crates call
//! theirs; it never sees a command, a QP or the engine's clock.

pub mod clock;

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use vm_memory::GuestMemoryMmap;
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

pub use clock::{Clock, Instant};

use crate::control::{Channel, ChannelStats, Key, Outcome};
use crate::nic::{GuestFrame, MacAddr, Nic};
use crate::rnic::poll::CONTENDED_YIELD;
use crate::rnic::{Limits, Rnic};
use crate::uplink::{self, Uplink};

/// Guest memory as vhost-user maps it.
pub type Memory = GuestMemoryMmap;

/// What became of a frame the guest transmitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromGuest {
    /// Sent to the uplink, or dropped and counted (runt, tagged control).
    Forwarded,
    /// A command for the device, executed (its reply, if any, queued):
    /// the device has work for [`Device::run`].
    Command,
}

/// What became of a frame read from the uplink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FromUplink {
    /// For the guest's RX ring.
    Guest,
    /// Taken by the device (an offloaded connection): run it.
    Offloaded,
    /// Filtered and counted.
    Dropped,
}

/// What vhost-user needs from the device behind the rings. Frames for the
/// guest the device makes itself (replies, events) go into `to_guest`,
/// which the backend delivers before uplink traffic.
pub trait Device: Send + Sync {
    /// The Ethernet function: the uplink, its send queue and the counters.
    fn eth(&self) -> &Nic;

    /// Now, on the device's clock.
    fn now(&self) -> Instant;

    /// A frame from the guest's TX ring (without its virtio-net header).
    fn guest_frame(&self, mem: &Memory, now: Instant, frame: &[u8], to_guest: &mut VecDeque<Vec<u8>>) -> FromGuest;

    /// A frame read from the uplink.
    fn uplink_frame(&self, now: Instant, frame: &[u8]) -> FromUplink;

    /// Runs the device's own work due at `now`; at most `room` of its
    /// events become frames in `to_guest` (the rest wait in the device).
    /// Returns when it wants to run next (`<= now`: work is left now).
    fn run(&self, mem: &Memory, now: Instant, to_guest: &mut VecDeque<Vec<u8>>, room: usize) -> Option<Instant>;

    /// One look at work queues the device polls instead of waiting for
    /// doorbells: whether it found work (then [`Device::run`]). Finding
    /// none, it leaves the core to whoever shares it before returning.
    fn poll(&self, mem: &Memory, now: Instant) -> bool;

    /// Whether the device wants [`Device::poll`] called after each pass.
    fn polling(&self) -> bool;

    /// The periodic look for work that makes no progress (stall watchdog).
    fn watch_progress(&self, mem: &Memory, now: Instant);

    /// An eventfd the device writes when something outside the rings
    /// changed it (the management socket); the backend then runs it.
    fn kick_fd(&self) -> Option<RawFd>;

    /// Consumes pending kicks.
    fn take_kick(&self);

    /// The frontend went away, and the guest with it: its connections are
    /// reset on the wire, its resources and its driver's session dropped.
    fn end_session(&self);
}

/// The T3: one Ethernet function and one RDMA function.
#[derive(Debug)]
pub struct T3 {
    eth: Nic,
    /// The RDMA function's resources; they belong to the connected guest
    /// and are dropped when it goes away. Locked before `channel`.
    rnic: Mutex<Rnic>,
    /// The driver's session; it ends with the frontend connection.
    channel: Mutex<Channel>,
    /// The provisioned key a driver must prove (all zeros: unauthenticated).
    control_key: Key,
    /// The control channel's counters (sessions, refused frames), kept
    /// across sessions.
    pub control_stats: Arc<ChannelStats>,
    clock: Clock,
    /// Written by the management socket after it changed the engine (fault
    /// injection): the worker runs the engine and delivers its events.
    kick: Option<EventFd>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl T3 {
    pub fn new(uplink: Box<dyn Uplink>, mac: Option<MacAddr>, mtu: usize) -> Self {
        let mut rnic = Rnic::new(Limits::default(), u32::try_from(mtu).unwrap_or(u32::MAX));
        rnic.set_uplink_queue(uplink::receive_queue_bytes(uplink.as_raw_fd()));
        let kick = EventFd::new(EFD_NONBLOCK).map_err(|e| log::warn!("no kick eventfd: {e}")).ok();
        let control_stats = Arc::<ChannelStats>::default();
        let control_key = [0, 0];
        Self {
            eth: Nic::new(uplink, mac, mtu),
            rnic: Mutex::new(rnic),
            channel: Mutex::new(Channel::new(control_key, Arc::clone(&control_stats))),
            control_key,
            control_stats,
            clock: Clock::default(),
            kick,
        }
    }

    /// The provisioned key drivers of this device must prove.
    #[must_use]
    pub fn with_control_key(mut self, key: Key) -> Self {
        self.control_key = key;
        self.channel = Mutex::new(Channel::new(key, Arc::clone(&self.control_stats)));
        self
    }

    /// The RDMA function's resources (management, tests).
    pub fn rnic(&self) -> MutexGuard<'_, Rnic> {
        lock(&self.rnic)
    }

    /// Asks the worker to run the engine soon (see [`Device::kick_fd`]).
    pub fn kick(&self) {
        if let Some(kick) = &self.kick {
            if let Err(e) = kick.write(1) {
                log::debug!("kick: {e}");
            }
        }
    }
}

impl Device for T3 {
    fn eth(&self) -> &Nic {
        &self.eth
    }

    fn now(&self) -> Instant {
        self.clock.now()
    }

    fn guest_frame(&self, mem: &Memory, now: Instant, frame: &[u8], to_guest: &mut VecDeque<Vec<u8>>) -> FromGuest {
        if self.eth.from_guest(frame) != GuestFrame::Control {
            return FromGuest::Forwarded;
        }
        let mut rnic = lock(&self.rnic);
        match lock(&self.channel).handle_frame(&mut rnic, mem, frame, now.engine()) {
            Outcome::Reply(frame) => to_guest.push_back(frame),
            Outcome::Silent | Outcome::Refused(_) => {}
        }
        FromGuest::Command
    }

    fn uplink_frame(&self, now: Instant, frame: &[u8]) -> FromUplink {
        if !self.eth.accept_from_uplink(frame) {
            return FromUplink::Dropped;
        }
        // Offloaded connections and RDMA listening ports go to the engine;
        // everything else (ARP included) to the guest.
        let mut rnic = lock(&self.rnic);
        if !rnic.wants(frame) {
            return FromUplink::Guest;
        }
        self.eth.count_offload_rx();
        rnic.receive(now.engine(), frame, &mut |reply| self.eth.offload_to_uplink(reply));
        FromUplink::Offloaded
    }

    fn run(&self, mem: &Memory, now: Instant, to_guest: &mut VecDeque<Vec<u8>>, room: usize) -> Option<Instant> {
        let mut rnic = lock(&self.rnic);
        rnic.set_uplink_room(self.eth.uplink_room());
        let next = rnic.service(now.engine(), mem, &mut |frame| self.eth.offload_to_uplink(frame));
        // The pass's frames leave together (receive()'s ACKs too).
        self.eth.flush_uplink();
        // Events the guest has no room for stay with the RNIC until
        // frames drain (its event queue is bounded, see Rnic::push_event).
        lock(&self.channel).take_events(&mut rnic, to_guest, room);
        next.map(Instant::from_engine)
    }

    fn poll(&self, mem: &Memory, now: Instant) -> bool {
        if lock(&self.rnic).poll_queues(now.engine(), mem) {
            return true;
        }
        let gave = std::time::Instant::now();
        std::thread::yield_now();
        if gave.elapsed() > CONTENDED_YIELD {
            lock(&self.rnic).polling_contended(self.now().engine());
        }
        false
    }

    fn polling(&self) -> bool {
        lock(&self.rnic).polling()
    }

    fn watch_progress(&self, mem: &Memory, now: Instant) {
        lock(&self.rnic).watch_progress(mem, now.engine());
    }

    fn kick_fd(&self) -> Option<RawFd> {
        self.kick.as_ref().map(AsRawFd::as_raw_fd)
    }

    fn take_kick(&self) {
        if let Some(kick) = &self.kick {
            let _ = kick.read();
        }
    }

    fn end_session(&self) {
        let now = self.now().engine();
        let mut rnic = lock(&self.rnic);
        rnic.abort_connections(now, &mut |frame| self.eth.offload_to_uplink(frame));
        // The RSTs just sent may wait for room: one more try, then the old
        // guest's frames are forgotten.
        self.eth.flush_uplink();
        self.eth.drop_uplink_backlog();
        log::info!("dropping the guest's RDMA resources: {:?}", rnic.counts());
        rnic.reset();
        *lock(&self.channel) = Channel::new(self.control_key, Arc::clone(&self.control_stats));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests;
