//! The vhost-user-net backend for one frontend connection: feature
//! negotiation and the event handler that moves frames between the
//! virtqueues, the uplink and the RNIC (control channel and iWARP engine,
//! which also runs on a timer).

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_bindings::bindings::virtio_ring::{
    VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC,
};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};
use vmm_sys_util::timerfd::TimerFd;

use crate::nic::virtio::{
    deliver_rx, drain_tx, ChainStats, NetLayout, RxOutcome, Scratch, VNET_HDR_LEN,
    VNET_HDR_LEN_LEGACY,
};
use crate::control::{Channel, Outcome, QueueAddrs};
use crate::nic::{GuestFrame, Nic};
use crate::rnic::Instant;
use crate::uplink::RECV_BUF_LEN;

/// virtio-net queue indices.
pub const RX_QUEUE: u16 = 0;
pub const TX_QUEUE: u16 = 1;
const NUM_QUEUES: usize = NUM_QUEUES_U16 as usize;
const NUM_QUEUES_U16: u16 = 2;
/// Epoll id of the uplink socket; ids up to NUM_QUEUES are the library's.
pub const UPLINK_EVENT: u16 = NUM_QUEUES_U16 + 1;
/// Epoll id of the engine's timer.
pub const TIMER_EVENT: u16 = UPLINK_EVENT + 1;
/// Epoll id of the management socket's kick (fault injection).
pub const KICK_EVENT: u16 = TIMER_EVENT + 1;
/// Shortest timer: an engine that wants to run again at once waits this
/// long (for a frame or a buffer) instead of spinning.
const MIN_TIMER: Duration = Duration::from_micros(100);
/// QEMU allows rx/tx_queue_size up to 1024.
const MAX_QUEUE_SIZE: usize = 1024;

type Memory = GuestMemoryAtomic<GuestMemoryMmap>;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("unknown device event {0}")]
    UnknownEvent(u16),
    #[error("virtqueue: {0}")]
    Queue(#[from] virtio_queue::Error),
    #[error("no guest memory table yet")]
    NoMemory,
}

impl From<BackendError> for std::io::Error {
    fn from(e: BackendError) -> Self {
        std::io::Error::other(e)
    }
}

/// State touched only by the worker thread, behind an uncontended lock.
#[derive(Debug)]
struct Datapath {
    layout: NetLayout,
    scratch: Scratch,
    /// Uplink receive buffer; holds a frame waiting for RX buffers.
    rx_buf: Vec<u8>,
    /// Length of the frame held in `rx_buf` while the RX ring is full.
    rx_pending: Option<usize>,
    /// The device's own frames for the guest (control responses, events):
    /// delivered before uplink traffic and never dropped.
    device_frames: VecDeque<Vec<u8>>,
    /// TX was left unread because `device_frames` was full.
    tx_throttled: bool,
}

/// The engine's timer: a non-blocking timerfd in the worker's epoll,
/// armed for the engine's next deadline.
#[derive(Debug)]
struct EngineTimer {
    fd: TimerFd,
    armed: Option<Instant>,
}

impl EngineTimer {
    fn new() -> io::Result<Self> {
        let fd = TimerFd::new()?;
        let raw = fd.as_raw_fd();
        // SAFETY: F_GETFL on a descriptor this function owns; no memory is passed.
        let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
        // SAFETY: F_SETFL on the same descriptor, only adding O_NONBLOCK: a
        // read after another handler re-armed the timer must not block the worker.
        if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { fd, armed: None })
    }

    /// Consumes the expiry (nothing to read is fine: it was re-armed).
    fn expired(&mut self) {
        let _ = self.fd.wait();
        self.armed = None;
    }

    fn arm(&mut self, now: Instant, at: Option<Instant>) {
        if at == self.armed {
            return;
        }
        let result = match at {
            None => self.fd.clear(),
            Some(at) => {
                let micros = u64::try_from(at.total_micros() - now.total_micros()).unwrap_or(0);
                self.fd.reset(Duration::from_micros(micros).max(MIN_TIMER), None)
            }
        };
        match result {
            Ok(()) => self.armed = at,
            Err(e) => log::warn!("engine timer: {e}"),
        }
    }
}

/// Past this many undelivered device frames, vt3d stops taking commands
/// from the TX ring: a guest that never posts RX buffers throttles itself
/// instead of growing vt3d's queue.
const MAX_DEVICE_FRAMES: usize = 1024;

#[derive(Debug)]
pub struct NetBackend {
    nic: Arc<Nic>,
    mem: Mutex<Option<Memory>>,
    event_idx: AtomicBool,
    datapath: Mutex<Datapath>,
    timer: Mutex<EngineTimer>,
    /// The driver's session; it ends with this frontend connection.
    channel: Mutex<Channel>,
    /// The guest's virtqueues, the proof a HELLO must carry.
    queues: Mutex<QueueAddrs>,
}

impl NetBackend {
    pub fn new(nic: Arc<Nic>) -> io::Result<Self> {
        let layout = NetLayout {
            hdr_len: VNET_HDR_LEN,
            mergeable: true,
            max_frame: nic.max_frame(),
        };
        Ok(Self {
            mem: Mutex::new(None),
            event_idx: AtomicBool::new(false),
            datapath: Mutex::new(Datapath {
                layout,
                scratch: Scratch::default(),
                rx_buf: vec![0; RECV_BUF_LEN],
                rx_pending: None,
                device_frames: VecDeque::new(),
                tx_throttled: false,
            }),
            timer: Mutex::new(EngineTimer::new()?),
            channel: Mutex::new(Channel::new(Arc::clone(&nic.control_stats))),
            queues: Mutex::new(QueueAddrs::default()),
            nic,
        })
    }

    /// The timer to register with the worker's epoll as [`TIMER_EVENT`].
    pub fn timer_fd(&self) -> RawFd {
        lock(&self.timer).fd.as_raw_fd()
    }

    fn now(&self) -> Instant {
        self.nic.now()
    }

    /// Runs the engine, queues its events for the guest and re-arms the
    /// timer for its next deadline.
    fn run_engine<M: vm_memory::GuestMemory>(&self, mem: &M, device_frames: &mut VecDeque<Vec<u8>>) {
        let now = self.now();
        let mut rnic = self.nic.rnic();
        let next = rnic.service(now, mem, &mut |frame| self.nic.offload_to_uplink(frame));
        lock(&self.channel).take_events(&mut rnic, device_frames);
        drop(rnic);
        lock(&self.timer).arm(now, next);
    }

    /// The frontend is gone: resets the guest's connections on the wire.
    pub fn abort_connections(&self) {
        let now = self.now();
        self.nic.rnic().abort_connections(now, &mut |frame| self.nic.offload_to_uplink(frame));
    }

    /// The management socket changed the engine (fault injection).
    fn on_kick(&self) {
        self.nic.take_kick();
        let Ok(mem) = self.memory() else { return };
        let mut dp = lock(&self.datapath);
        self.run_engine(&*mem.memory(), &mut dp.device_frames);
    }

    fn on_timer(&self) {
        lock(&self.timer).expired();
        // An error here would end the worker: without memory there is no
        // engine to run anyway.
        let Ok(mem) = self.memory() else { return };
        let mut dp = lock(&self.datapath);
        self.run_engine(&*mem.memory(), &mut dp.device_frames);
    }

    fn memory(&self) -> Result<Memory, BackendError> {
        lock(&self.mem).clone().ok_or(BackendError::NoMemory)
    }

    fn transmit(&self, tx: &VringRwLock) -> Result<(), BackendError> {
        let mem = self.memory()?;
        let mem = mem.memory();
        let mut dp = lock(&self.datapath);
        let Datapath { layout, scratch, device_frames, tx_throttled, .. } = &mut *dp;
        if device_frames.len() >= MAX_DEVICE_FRAMES {
            *tx_throttled = true;
            return Ok(());
        }
        *tx_throttled = false;
        let mut stats = ChainStats::default();
        let now = self.now();
        let mut commands = false;
        let used = {
            let mut state = tx.get_mut();
            drain_tx(state.get_queue_mut(), &*mem, layout, scratch, &mut stats, |frame| {
                if self.nic.from_guest(frame) == GuestFrame::Control {
                    commands = true;
                    let queues = *lock(&self.queues);
                    let mut rnic = self.nic.rnic();
                    match lock(&self.channel).handle_frame(&mut rnic, &*mem, frame, &queues, now) {
                        Outcome::Reply(frames) => device_frames.extend(frames),
                        Outcome::Silent | Outcome::Refused(_) => {}
                    }
                }
            })?
        };
        // Doorbells and connection commands give the engine work.
        if commands {
            self.run_engine(&*mem, device_frames);
        }
        self.nic.count_tx_malformed(stats.malformed);
        if used {
            signal(tx)?;
        }
        Ok(())
    }

    /// Delivers queued device frames; returns whether any was delivered and
    /// whether the queue is now empty.
    fn deliver_device_frames<M: vm_memory::GuestMemory>(
        queue: &mut virtio_queue::Queue,
        mem: &M,
        dp: &mut Datapath,
        stats: &mut ChainStats,
    ) -> Result<bool, BackendError> {
        let mut delivered = false;
        while let Some(frame) = dp.device_frames.front() {
            let avail_before = queue.avail_idx(mem, Ordering::Acquire)?;
            match deliver_rx(queue, mem, &dp.layout, &mut dp.scratch, stats, frame)? {
                RxOutcome::Delivered { .. } => {
                    dp.device_frames.pop_front();
                    delivered = true;
                }
                // Chains were consumed (and returned): retry this frame.
                RxOutcome::Dropped => delivered = true,
                RxOutcome::NoBuffers => {
                    queue.enable_notification(mem)?;
                    if queue.avail_idx(mem, Ordering::Acquire)? == avail_before {
                        break;
                    }
                }
            }
        }
        Ok(delivered)
    }

    /// Moves frames from the uplink into the RX ring until either runs dry.
    /// When the ring is full, the frame in hand is kept and the uplink is
    /// left unread (backpressure) until the guest's next RX kick.
    fn receive(&self, vring: &VringRwLock) -> Result<(), BackendError> {
        let Ok(mem) = self.memory() else {
            return Ok(()); // not set up yet; the RX enable event resumes us
        };
        let mem = mem.memory();
        let mut dp = lock(&self.datapath);
        let dp = &mut *dp;
        let mut stats = ChainStats::default();
        let mut delivered = false;
        {
            let mut state = vring.get_mut();
            if !state.get_queue().ready() || !state.is_enabled() {
                log::trace!("RX ring not ready");
                return Ok(());
            }
            let queue = state.get_queue_mut();
            delivered |= Self::deliver_device_frames(queue, &*mem, dp, &mut stats)?;
            let now = self.now();
            let mut rnic = self.nic.rnic();
            let mut offloaded = false;
            // Uplink frames wait while device frames do (they keep order
            // and priority); the RX kick resumes both.
            while dp.device_frames.is_empty() {
                let len = match dp.rx_pending.take() {
                    Some(len) => len,
                    None => match self.nic.uplink().recv(&mut dp.rx_buf) {
                        Ok(Some(len)) => len,
                        Ok(None) => break,
                        Err(e) => {
                            log::warn!("uplink receive: {e}");
                            break;
                        }
                    },
                };
                let frame = dp.rx_buf.get(..len).unwrap_or_default();
                if !self.nic.accept_from_uplink(frame) {
                    continue;
                }
                // Offloaded connections and RDMA listening ports go to the
                // engine; everything else (ARP included) to the guest.
                if rnic.wants(frame) {
                    self.nic.count_offload_rx();
                    rnic.receive(now, frame, &mut |reply| self.nic.offload_to_uplink(reply));
                    offloaded = true;
                    continue;
                }
                let avail_before = queue.avail_idx(&*mem, Ordering::Acquire)?;
                let outcome = deliver_rx(queue, &*mem, &dp.layout, &mut dp.scratch, &mut stats, frame)?;
                log::trace!("RX {len} bytes: {outcome:?}");
                match outcome {
                    RxOutcome::Delivered { .. } => delivered = true,
                    RxOutcome::Dropped => {
                        delivered = true; // chains were returned
                        self.nic.count_rx_dropped();
                    }
                    RxOutcome::NoBuffers => {
                        dp.rx_pending = Some(len);
                        queue.enable_notification(&*mem)?;
                        // Retry only if the guest added buffers meanwhile;
                        // otherwise wait for its kick (no busy loop).
                        if queue.avail_idx(&*mem, Ordering::Acquire)? == avail_before {
                            break;
                        }
                    }
                }
            }
            drop(rnic);
            // What the engine made of them (placements, CQEs, events)
            // reaches the guest in the same pass.
            if offloaded {
                self.run_engine(&*mem, &mut dp.device_frames);
                delivered |= Self::deliver_device_frames(queue, &*mem, dp, &mut stats)?;
            }
        }
        self.nic.count_rx(&stats);
        if delivered {
            signal(vring)?;
        }
        Ok(())
    }
}

/// Where the guest put a virtqueue (guest-physical, from vhost-user).
fn ring_addrs(vring: &VringRwLock) -> crate::abi::RingAddrs {
    let state = vring.get_ref();
    let q = state.get_queue();
    crate::abi::RingAddrs { desc: q.desc_table().into(), avail: q.avail_ring().into(), used: q.used_ring().into() }
}

/// Interrupts the guest if the used ring moved past what it asked for.
fn signal(vring: &VringRwLock) -> Result<(), BackendError> {
    if vring.needs_notification()? {
        if let Err(e) = vring.signal_used_queue() {
            log::warn!("signal used queue: {e}");
        }
    }
    Ok(())
}

/// A poisoned lock only means another handler panicked; the data is
/// still consistent for our purposes (counters and scratch space).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl VhostUserBackend for NetBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        NUM_QUEUES
    }

    fn max_queue_size(&self) -> usize {
        MAX_QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        1 << VIRTIO_F_VERSION_1
            | 1 << VIRTIO_NET_F_MRG_RXBUF
            | 1 << VIRTIO_RING_F_EVENT_IDX
            | 1 << VIRTIO_RING_F_INDIRECT_DESC
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn acked_features(&self, features: u64) {
        let modern = features & (1 << VIRTIO_F_VERSION_1) != 0;
        let mergeable = features & (1 << VIRTIO_NET_F_MRG_RXBUF) != 0;
        let mut dp = lock(&self.datapath);
        dp.layout.mergeable = mergeable;
        dp.layout.hdr_len = if modern || mergeable { VNET_HDR_LEN } else { VNET_HDR_LEN_LEGACY };
        log::info!("features acked: {features:#x} (mergeable={mergeable}, hdr={})", dp.layout.hdr_len);
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::REPLY_ACK | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn update_memory(&self, mem: Memory) -> std::io::Result<()> {
        *lock(&self.mem) = Some(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK)
            .map_err(|e| log::error!("exit event: {e}"))
            .ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        log::trace!("device event {device_event}");
        let [rx, tx] = vrings else {
            return Err(BackendError::UnknownEvent(device_event).into());
        };
        *lock(&self.queues) = QueueAddrs { rx: ring_addrs(rx), tx: ring_addrs(tx) };
        match device_event {
            // A TX kick may queue control responses: deliver them at once.
            TX_QUEUE => {
                self.transmit(tx)?;
                self.receive(rx)?;
            }
            // An RX kick means new buffers for held frames; once device
            // frames drain, a throttled TX ring is read again.
            RX_QUEUE | UPLINK_EVENT => {
                self.receive(rx)?;
                if lock(&self.datapath).tx_throttled {
                    self.transmit(tx)?;
                    self.receive(rx)?;
                }
            }
            TIMER_EVENT => {
                self.on_timer();
                self.receive(rx)?;
            }
            KICK_EVENT => {
                self.on_kick();
                self.receive(rx)?;
            }
            other => return Err(BackendError::UnknownEvent(other).into()),
        }
        Ok(())
    }
}
