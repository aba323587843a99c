//! The vhost-user-net backend for one frontend connection: feature
//! negotiation and the event handler that moves frames between the
//! virtqueues, the uplink and the device ([`Device`]), which also runs on a
//! timer. It knows rings, memory, budgets and wake-ups, nothing of RDMA.

use std::collections::VecDeque;
use std::io;
use std::ops::ControlFlow;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_bindings::bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::bindings::virtio_net::VIRTIO_NET_F_MRG_RXBUF;
use virtio_bindings::bindings::virtio_ring::{VIRTIO_RING_F_EVENT_IDX, VIRTIO_RING_F_INDIRECT_DESC};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::{ControlOperation, Epoll, EpollEvent, EventSet};
use vmm_sys_util::event::{new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};
use vmm_sys_util::timerfd::TimerFd;

use crate::nic::guest_frames::HeldFrames;
use crate::nic::virtio::{
    deliver_rx, drain_tx, pending_chains, ChainStats, NetLayout, QueueError, RxOutcome, Scratch, VNET_HDR_LEN,
    VNET_HDR_LEN_LEGACY,
};
use crate::nic::Nic;
use crate::t3::{Device, FromGuest, FromUplink, Instant};
use crate::uplink::RecvBatch;

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
/// Epoll id of the backend's own wake-up: a budget ran out with work left.
pub const RESUME_EVENT: u16 = KICK_EVENT + 1;
/// Epoll id of [`WritableWatch`]: the uplink took frames again.
pub const WRITABLE_EVENT: u16 = RESUME_EVENT + 1;
/// Epoll id of [`PollWatch`]: the RNIC polls work queues.
pub const POLL_EVENT: u16 = WRITABLE_EVENT + 1;
/// TX chains taken per wake-up (a NAPI weight): a guest that keeps its TX
/// ring full cannot keep the worker from RX, the engine and the uplink.
pub const TX_BUDGET: usize = 128;
/// Frames put into the RX ring per wake-up (the device's, held and new).
pub const RX_BUDGET: usize = 128;
/// Frames read from the uplink per wake-up: a flooding peer yields to the
/// guest's rings and the engine's timers.
pub const UPLINK_BUDGET: usize = 256;
/// A full uplink is retried this soon even without EPOLLOUT (a tap or a
/// peer that never polls writable must not strand held frames).
const UPLINK_RETRY: Duration = Duration::from_millis(1);
/// Shortest timer, for deadlines in the future (and an engine that wants
/// to run again while the uplink is full, where EPOLLOUT normally comes
/// first). An engine with work pending now is resumed at once instead
/// ([`NetBackend::run_engine`]): a timer there would pace every connection
/// to one burst per tick.
const MIN_TIMER: Duration = Duration::from_micros(100);
/// The rings are looked at this often even without a kick. A guest kick
/// that never reached vt3d (the soak met TX chains left in the ring with
/// no kick to follow, and the driver's commands behind them unanswered
/// until it declared the device lost) then costs this much delay instead
/// of the device. RX needs it too: buffers the guest added with a lost
/// kick are found by the same pass.
const RING_WATCHDOG: Duration = Duration::from_millis(20);
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
    /// Uplink receive buffer.
    /// Uplink frames received at once (recvmmsg), taken one by one.
    rx_batch: RecvBatch,
    /// Uplink frames for the guest waiting for RX buffers (bounded; the
    /// oldest is dropped beyond it).
    held: HeldFrames,
    /// The device's own frames for the guest (control responses, events):
    /// delivered before uplink traffic and never dropped. At most
    /// [`MAX_DEVICE_FRAMES`] plus the reply to one command: past the cap
    /// the TX ring is not read and the engine's events wait in the RNIC.
    device_frames: VecDeque<Vec<u8>>,
    /// TX was left unread because `device_frames` was full.
    tx_throttled: bool,
    /// TX was left unread because frames wait for the uplink.
    tx_waits_uplink: bool,
    /// The ring watchdog read TX chains and no kick came since.
    tx_rescued: bool,
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
        Ok(Self { fd: nonblocking_timer()?, armed: None })
    }

    /// Consumes the expiry (nothing to read is fine: it was re-armed).
    fn expired(&mut self) {
        let _ = self.fd.wait();
        self.armed = None;
    }

    /// Makes sure the timer fires within `within` (keeps an earlier expiry).
    fn arm_within(&mut self, now: Instant, within: Duration) {
        let at = now.after(within);
        if self.armed.is_none_or(|armed| armed > at) {
            self.arm(now, Some(at));
        }
    }

    fn arm(&mut self, now: Instant, at: Option<Instant>) {
        if at == self.armed {
            return;
        }
        let result = match at {
            None => self.fd.clear(),
            Some(at) => self.fd.reset(now.until(at).max(MIN_TIMER), None),
        };
        match result {
            Ok(()) => self.armed = at,
            Err(e) => log::warn!("engine timer: {e}"),
        }
    }
}

/// Writability of the uplink, watched only while frames wait for it: an
/// epoll set of its own (registered with the worker as
/// [`WRITABLE_EVENT`]) holds the uplink with EPOLLOUT exactly then. An
/// uplink always registered for EPOLLOUT wakes the worker each time the
/// peer reads a datagram, which in a stream is once per frame.
#[derive(Debug)]
struct WritableWatch {
    epoll: Epoll,
    uplink: RawFd,
    watching: bool,
}

impl WritableWatch {
    fn new(uplink: RawFd) -> io::Result<Self> {
        Ok(Self { epoll: Epoll::new()?, uplink, watching: false })
    }

    /// Watches the uplink for room while `waiting` (frames are held).
    fn set(&mut self, waiting: bool) {
        if waiting == self.watching {
            return;
        }
        let (op, events) = if waiting {
            (ControlOperation::Add, EventSet::OUT)
        } else {
            (ControlOperation::Delete, EventSet::empty())
        };
        match self.epoll.ctl(op, self.uplink, EpollEvent::new(events, 0)) {
            Ok(()) => self.watching = waiting,
            Err(e) => log::warn!("uplink writability watch: {e}"),
        }
    }
}

/// While the device polls work queues ([`Device::poll`]) the worker
/// comes back at once after each pass instead of sleeping: an eventfd in
/// its epoll set ([`POLL_EVENT`], level triggered) stays readable exactly
/// then. Every other event is served in between, as epoll reports them
/// together. (A periodic timer instead, measured: its wake-ups cost more
/// than the looks, a 64 B round trip took 5× longer on this host.)
#[derive(Debug)]
struct PollWatch {
    fd: EventFd,
    armed: bool,
}

impl PollWatch {
    fn new() -> io::Result<Self> {
        Ok(Self { fd: EventFd::new(EFD_NONBLOCK)?, armed: false })
    }

    fn set(&mut self, polling: bool) {
        if polling == self.armed {
            return;
        }
        let result = if polling { self.fd.write(1) } else { self.fd.read().map(drop) };
        match result {
            Ok(()) => self.armed = polling,
            Err(e) => log::warn!("poll event: {e}"),
        }
    }
}

/// A timerfd that never blocks the worker on read (a read after another
/// handler re-armed it finds nothing).
fn nonblocking_timer() -> io::Result<TimerFd> {
    let fd = TimerFd::new()?;
    let raw = fd.as_raw_fd();
    // SAFETY: F_GETFL on a descriptor this function owns; no memory is passed.
    let flags = unsafe { libc::fcntl(raw, libc::F_GETFL) };
    // SAFETY: F_SETFL on the same descriptor, only adding O_NONBLOCK.
    if flags < 0 || unsafe { libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Past this many undelivered device frames, vt3d stops taking commands
/// from the TX ring: a guest that never posts RX buffers throttles itself
/// instead of growing vt3d's queue.
const MAX_DEVICE_FRAMES: usize = 1024;

#[derive(Debug)]
pub struct NetBackend<D: Device> {
    device: Arc<D>,
    mem: Mutex<Option<Memory>>,
    event_idx: AtomicBool,
    datapath: Mutex<Datapath>,
    timer: Mutex<EngineTimer>,
    writable: Mutex<WritableWatch>,
    poll: Mutex<PollWatch>,
    /// Per queue: found broken, left alone until the frontend re-initialises it.
    broken: [AtomicBool; NUM_QUEUES],
    /// Written when a budget ran out with work left; the worker polls it
    /// as [`RESUME_EVENT`] (level triggered: it fires until read).
    resume: EventFd,
    /// The engine has work now (a burst budget ran out): run it at the
    /// next wake-up, which [`RESUME_EVENT`] brings at once.
    engine_due: AtomicBool,
}

impl<D: Device> NetBackend<D> {
    pub fn new(device: Arc<D>) -> io::Result<Self> {
        let nic = device.eth();
        let layout = NetLayout { hdr_len: VNET_HDR_LEN, mergeable: true, max_frame: nic.max_frame() };
        Ok(Self {
            mem: Mutex::new(None),
            event_idx: AtomicBool::new(false),
            datapath: Mutex::new(Datapath {
                layout,
                scratch: Scratch::default(),
                rx_batch: RecvBatch::default(),
                held: HeldFrames::default(),
                device_frames: VecDeque::new(),
                tx_throttled: false,
                tx_rescued: false,
                tx_waits_uplink: false,
            }),
            timer: Mutex::new(EngineTimer::new()?),
            writable: Mutex::new(WritableWatch::new(nic.uplink().as_raw_fd())?),
            poll: Mutex::new(PollWatch::new()?),
            broken: [AtomicBool::new(false), AtomicBool::new(false)],
            resume: EventFd::new(EFD_NONBLOCK)?,
            engine_due: AtomicBool::new(false),
            device,
        })
    }

    /// The device's Ethernet function: uplink and counters.
    fn nic(&self) -> &Nic {
        self.device.eth()
    }

    /// The timer to register with the worker's epoll as [`TIMER_EVENT`].
    pub fn timer_fd(&self) -> RawFd {
        lock(&self.timer).fd.as_raw_fd()
    }

    /// The epoll set to register with the worker's epoll as [`WRITABLE_EVENT`].
    pub fn writable_fd(&self) -> RawFd {
        lock(&self.writable).epoll.as_raw_fd()
    }

    /// The eventfd to register with the worker's epoll as [`RESUME_EVENT`].
    pub fn resume_fd(&self) -> RawFd {
        self.resume.as_raw_fd()
    }

    /// The eventfd to register with the worker's epoll as [`POLL_EVENT`].
    pub fn poll_fd(&self) -> RawFd {
        lock(&self.poll).fd.as_raw_fd()
    }

    fn now(&self) -> Instant {
        self.device.now()
    }

    /// Runs the device, queues its frames for the guest and re-arms the
    /// timer for its next deadline.
    fn run_engine(&self, mem: &GuestMemoryMmap, device_frames: &mut VecDeque<Vec<u8>>) {
        let now = self.now();
        let room = MAX_DEVICE_FRAMES.saturating_sub(device_frames.len());
        let next = self.device.run(mem, now, device_frames, room);
        // Work pending now: come back after the rings had their turn, not
        // after a timer tick. Behind a full uplink, EPOLLOUT (or the
        // timer) brings it back once frames can leave.
        if next.is_some_and(|at| at <= now) {
            self.engine_due.store(true, Ordering::Release);
            if !self.nic().uplink_congested() {
                self.resume();
                return;
            }
        }
        let watchdog = now.after(RING_WATCHDOG);
        let mut timer = lock(&self.timer);
        match next.filter(|&at| at < watchdog) {
            Some(at) => timer.arm(now, Some(at)),
            // Only the watchdog is due: an expiry armed already comes
            // sooner, and an early look is harmless (no system call per pass).
            None if timer.armed.is_some_and(|armed| armed > now) => {}
            None => timer.arm(now, Some(watchdog)),
        }
    }

    /// Runs the engine if it asked to run again at once.
    fn run_engine_if_due(&self) {
        if self.nic().uplink_congested() || !self.engine_due.swap(false, Ordering::AcqRel) {
            return;
        }
        let Ok(mem) = self.memory() else { return };
        let mut dp = lock(&self.datapath);
        self.run_engine(&mem.memory(), &mut dp.device_frames);
    }

    /// Something outside the rings changed the device (fault injection).
    fn on_kick(&self) {
        self.device.take_kick();
        let Ok(mem) = self.memory() else { return };
        let mut dp = lock(&self.datapath);
        self.run_engine(&mem.memory(), &mut dp.device_frames);
    }

    /// One look at the polled work queues: work found runs the device at
    /// once (and what it made reaches the guest).
    fn on_poll(&self, rx: &VringRwLock) -> Result<(), BackendError> {
        let Ok(mem) = self.memory() else { return Ok(()) };
        let mem = mem.memory();
        if !self.device.poll(&mem, self.now()) {
            return Ok(());
        }
        {
            let mut dp = lock(&self.datapath);
            self.run_engine(&mem, &mut dp.device_frames);
        }
        self.receive(rx)
    }

    fn on_timer(&self) {
        lock(&self.timer).expired();
        // An error here would end the worker: without memory there is no
        // engine to run anyway.
        let Ok(mem) = self.memory() else { return };
        let mut dp = lock(&self.datapath);
        self.run_engine(&mem.memory(), &mut dp.device_frames);
        self.device.watch_progress(&mem.memory(), self.now());
    }

    fn memory(&self) -> Result<Memory, BackendError> {
        lock(&self.mem).clone().ok_or(BackendError::NoMemory)
    }

    /// Takes up to [`TX_BUDGET`] chains from the TX ring: uplink frames
    /// are sent, control frames executed. The ring is left unread while
    /// the device's frames for the guest are at their cap, or while frames
    /// wait for a full uplink; each is resumed by what relieves it.
    fn transmit(&self, tx: &VringRwLock) -> Result<(), BackendError> {
        let Ok(mem) = self.memory() else { return Ok(()) };
        let mem = mem.memory();
        if self.is_broken(TX_QUEUE) {
            return Ok(());
        }
        let mut dp = lock(&self.datapath);
        let Datapath { layout, scratch, device_frames, tx_throttled, tx_waits_uplink, .. } = &mut *dp;
        if device_frames.len() >= MAX_DEVICE_FRAMES {
            if !*tx_throttled {
                self.nic().count_tx_paused(true);
            }
            *tx_throttled = true;
            return Ok(());
        }
        *tx_throttled = false;
        if self.nic().uplink_congested() {
            if !*tx_waits_uplink {
                self.nic().count_tx_paused(false);
            }
            *tx_waits_uplink = true;
            return Ok(());
        }
        *tx_waits_uplink = false;
        let mut stats = ChainStats::default();
        let now = self.now();
        let mut commands = false;
        let drained = {
            let mut state = tx.get_mut();
            if !state.get_queue().ready() || !state.is_enabled() {
                self.nic().note_tx_pass(false, None, state.get_queue().next_avail());
                return Ok(());
            }
            let drained = drain_tx(state.get_queue_mut(), &*mem, layout, scratch, &mut stats, TX_BUDGET, |frame| {
                if self.device.guest_frame(&mem, now, frame, device_frames) == FromGuest::Command {
                    commands = true;
                }
                // Stop before the guest's replies or the uplink's queue
                // outgrow their bounds.
                if device_frames.len() >= MAX_DEVICE_FRAMES || self.nic().uplink_congested() {
                    return ControlFlow::Break(());
                }
                ControlFlow::Continue(())
            });
            let queue = state.get_queue();
            let avail = queue.avail_idx(&*mem, Ordering::Acquire).ok().map(|w| w.0);
            self.nic().note_tx_pass(true, avail, queue.next_avail());
            drained
        };
        // Doorbells and connection commands give the engine work.
        if commands {
            self.run_engine(&mem, device_frames);
        }
        self.nic().count_tx_malformed(stats.malformed);
        self.nic().count_tx_oversize(stats.oversize, stats.oversize_len);
        match drained {
            Ok(done) => {
                if done.more {
                    if device_frames.len() >= MAX_DEVICE_FRAMES {
                        self.nic().count_tx_paused(true);
                        *tx_throttled = true;
                    } else if self.nic().uplink_congested() {
                        self.nic().count_tx_paused(false);
                        *tx_waits_uplink = true;
                    } else {
                        self.nic().count_budget_yield(true);
                        self.resume();
                    }
                }
                drop(dp);
                if done.used_any {
                    self.signal(TX_QUEUE, tx);
                }
            }
            Err(e) => {
                drop(dp);
                self.mark_broken(TX_QUEUE, &e);
                // Chains taken before the ring broke are back in it.
                self.signal(TX_QUEUE, tx);
            }
        }
        Ok(())
    }

    /// Delivers queued device frames while the budget lasts; returns
    /// whether any chain was used.
    fn deliver_device_frames<M: vm_memory::GuestMemory>(
        queue: &mut virtio_queue::Queue,
        mem: &M,
        dp: &mut Datapath,
        stats: &mut ChainStats,
        budget: &mut usize,
    ) -> Result<bool, QueueError> {
        let mut delivered = false;
        while let Some(frame) = dp.device_frames.front() {
            if *budget == 0 {
                break;
            }
            let outcome = deliver_one(queue, mem, &dp.layout, &mut dp.scratch, stats, frame)?;
            if outcome.is_some() {
                *budget -= 1;
            }
            match outcome {
                Some(RxOutcome::Delivered { .. }) => {
                    dp.device_frames.pop_front();
                    delivered = true;
                }
                // Chains were consumed (and returned): retry this frame.
                Some(RxOutcome::Dropped) => delivered = true,
                Some(RxOutcome::NoBuffers) => {}
                None => break,
            }
        }
        Ok(delivered)
    }

    /// Delivers held uplink frames (after the device's own, which keep
    /// their priority) while the budget lasts; returns whether any chain
    /// was used.
    fn deliver_held<M: vm_memory::GuestMemory>(
        &self,
        queue: &mut virtio_queue::Queue,
        mem: &M,
        dp: &mut Datapath,
        stats: &mut ChainStats,
        budget: &mut usize,
    ) -> Result<bool, QueueError> {
        let mut delivered = false;
        while dp.device_frames.is_empty() {
            let Some(frame) = dp.held.front() else { break };
            if *budget == 0 {
                break;
            }
            let outcome = deliver_one(queue, mem, &dp.layout, &mut dp.scratch, stats, frame)?;
            if outcome.is_some() {
                *budget -= 1;
            }
            match outcome {
                Some(RxOutcome::Delivered { .. }) => {
                    dp.held.pop_front();
                    delivered = true;
                }
                Some(RxOutcome::Dropped) => {
                    dp.held.pop_front();
                    delivered = true; // chains were returned
                    self.nic().count_rx_dropped();
                }
                Some(RxOutcome::NoBuffers) => {}
                None => break,
            }
        }
        Ok(delivered)
    }

    /// Moves frames into the RX ring: the device's own first, then uplink
    /// frames held for lack of buffers, then new uplink frames. The uplink
    /// is read even while the ring is full (or broken): frames of
    /// offloaded connections go to the engine, which needs no RX buffer;
    /// frames for the guest wait in a small bounded queue (the oldest
    /// dropped beyond it). Every step has a budget per wake-up; work left
    /// over resumes by itself ([`RESUME_EVENT`]).
    fn receive(&self, vring: &VringRwLock) -> Result<(), BackendError> {
        let Ok(mem) = self.memory() else {
            return Ok(()); // not set up yet; the RX enable event resumes us
        };
        let mem = mem.memory();
        let mut dp = lock(&self.datapath);
        let dp = &mut *dp;
        let mut stats = ChainStats::default();
        let mut pass = RxPass::default();
        let (result, usable) = {
            let mut state = vring.get_mut();
            let usable = state.get_queue().ready() && state.is_enabled() && !self.is_broken(RX_QUEUE);
            let ring = usable.then(|| state.get_queue_mut());
            (self.rx_pass(ring, &mem, dp, &mut stats, &mut pass), usable)
        };
        self.nic().count_rx(&stats);
        self.nic().note_rx_pass(usable, dp.device_frames.len());
        if let Err(e) = result {
            self.mark_broken(RX_QUEUE, &e);
        }
        if pass.more {
            self.nic().count_budget_yield(false);
            self.resume();
        }
        if pass.delivered {
            self.signal(RX_QUEUE, vring);
        }
        Ok(())
    }

    fn rx_pass(
        &self,
        mut ring: Option<&mut virtio_queue::Queue>,
        mem: &GuestMemoryMmap,
        dp: &mut Datapath,
        stats: &mut ChainStats,
        pass: &mut RxPass,
    ) -> Result<(), QueueError> {
        let mut budget = RX_BUDGET;
        if let Some(queue) = ring.as_deref_mut() {
            pass.delivered |= Self::deliver_device_frames(queue, mem, dp, stats, &mut budget)?;
            pass.delivered |= self.deliver_held(queue, mem, dp, stats, &mut budget)?;
        }
        let now = self.now();
        let mut offloaded = false;
        let mut reads = 0usize;
        loop {
            // Reading on once the ring's budget is spent would only fill
            // the held queue and drop from it: the rest waits for the
            // resumed pass (a ring without buffers spends no budget).
            if reads == UPLINK_BUDGET || (budget == 0 && ring.is_some()) {
                pass.more = true;
                break;
            }
            reads += 1;
            let frame = match dp.rx_batch.next_frame(self.nic().uplink()) {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    log::warn!("uplink receive: {e}");
                    break;
                }
            };
            let len = frame.len();
            match self.device.uplink_frame(now, frame) {
                FromUplink::Guest => {}
                FromUplink::Dropped => continue,
                FromUplink::Offloaded => {
                    offloaded = true;
                    continue;
                }
            }
            // Straight into the ring when nothing is ahead of it (no copy);
            // otherwise behind the frames already waiting.
            let direct = dp.device_frames.is_empty() && dp.held.is_empty() && budget > 0;
            if let (true, Some(queue)) = (direct, ring.as_deref_mut()) {
                let outcome = match deliver_one(queue, mem, &dp.layout, &mut dp.scratch, stats, frame) {
                    Ok(outcome) => outcome,
                    Err(e) => {
                        // Kept for the ring's re-initialisation (or the drop).
                        dp.held.push(frame);
                        return Err(e);
                    }
                };
                if outcome.is_some() {
                    budget -= 1;
                }
                log::trace!("RX {len} bytes: {outcome:?}");
                match outcome {
                    Some(RxOutcome::Delivered { .. }) => {
                        pass.delivered = true;
                        continue;
                    }
                    Some(RxOutcome::Dropped) => {
                        pass.delivered = true; // chains were returned
                        self.nic().count_rx_dropped();
                        continue;
                    }
                    Some(RxOutcome::NoBuffers) | None => {}
                }
            }
            if dp.held.push(frame) {
                self.nic().count_rx_dropped_backlog(1);
            }
            if let Some(queue) = ring.as_deref_mut() {
                pass.delivered |= self.deliver_held(queue, mem, dp, stats, &mut budget)?;
            }
        }
        // What the engine made of them (placements, CQEs, events)
        // reaches the guest in the same pass.
        if offloaded {
            self.run_engine(mem, &mut dp.device_frames);
        }
        if let Some(queue) = ring {
            pass.delivered |= Self::deliver_device_frames(queue, mem, dp, stats, &mut budget)?;
            pass.delivered |= self.deliver_held(queue, mem, dp, stats, &mut budget)?;
            // The budget ran out with frames left (not a lack of buffers:
            // that waits for the guest's kick).
            if budget == 0 && !(dp.device_frames.is_empty() && dp.held.is_empty()) {
                pass.more = true;
            }
        }
        Ok(())
    }

    /// Marks queue `index` broken: logged and counted once, then left
    /// alone until the frontend stops and re-initialises it.
    ///
    /// A virtio device would set DEVICE_NEEDS_RESET and raise a
    /// configuration interrupt here, but a vhost-user-net backend cannot:
    /// QEMU's vhost-user protocol carries no device-status change from the
    /// backend (its config-change message only re-reads the config space).
    /// So the queue stays stopped until the guest resets the device, which
    /// QEMU turns into GET_VRING_BASE ([`VhostUserBackend::stop_vring`]).
    fn mark_broken(&self, index: u16, e: &QueueError) {
        let Some(flag) = self.broken.get(usize::from(index)) else { return };
        if !flag.swap(true, Ordering::AcqRel) {
            log::error!("queue {index} broken: {e} (needs a device reset)");
            self.nic().count_queue_broken(index == TX_QUEUE);
        }
    }

    fn is_broken(&self, index: u16) -> bool {
        self.broken.get(usize::from(index)).is_none_or(|flag| flag.load(Ordering::Acquire))
    }

    /// Asks the worker to come back without a guest kick (a budget ran
    /// out with work left).
    fn resume(&self) {
        if let Err(e) = self.resume.write(1) {
            log::warn!("resume event: {e}");
        }
    }

    /// Interrupts the guest if the used ring moved past what it asked
    /// for; a ring whose event index cannot be read is broken.
    fn signal(&self, index: u16, vring: &VringRwLock) {
        match vring.needs_notification() {
            Ok(false) => {}
            Ok(true) => {
                if let Err(e) = vring.signal_used_queue() {
                    log::warn!("signal used queue: {e}");
                }
            }
            Err(e) => self.mark_broken(index, &QueueError::Ring(e)),
        }
    }

    /// The ring watchdog's look at TX: chains waiting that are not left
    /// unread on purpose (throttled, behind the uplink) are read now. Most
    /// have a kick on its way (the timer came first); when no kick came
    /// by the next look, the guest's was lost, and counts.
    fn tx_watchdog(&self, tx: &VringRwLock) -> Result<(), BackendError> {
        let Ok(mem) = self.memory() else { return Ok(()) };
        let waiting = {
            let state = tx.get_ref();
            let queue = state.get_queue();
            let usable = queue.ready() && state.is_enabled() && !self.is_broken(TX_QUEUE);
            usable && pending_chains(queue, &*mem.memory()).is_ok_and(|n| n > 0)
        };
        {
            let mut dp = lock(&self.datapath);
            if std::mem::take(&mut dp.tx_rescued) {
                self.nic().count_missed_kick();
            }
            if !waiting || dp.tx_throttled || dp.tx_waits_uplink {
                return Ok(());
            }
            dp.tx_rescued = true;
        }
        self.nic().count_watchdog_read();
        self.transmit(tx)
    }

    /// Whether the TX ring was left unread for a reason that no longer
    /// holds: the guest's replies drained below their cap, or the uplink
    /// has room again. Whichever pass relieved it (an RX kick, a timer, the
    /// engine's own flush), the guest will not kick again for chains it
    /// posted already, so the ring must be read again now.
    fn tx_unblocked(&self) -> bool {
        let dp = lock(&self.datapath);
        (dp.tx_throttled && dp.device_frames.len() < MAX_DEVICE_FRAMES)
            || (dp.tx_waits_uplink && !self.nic().uplink_congested())
    }
}

/// What one RX pass did.
#[derive(Debug, Default)]
struct RxPass {
    /// Chains were used: the guest may need an interrupt.
    delivered: bool,
    /// A budget ran out with work left.
    more: bool,
}

/// Delivers one frame. `None`: no buffers, and the guest added none since
/// (notifications are re-enabled, its kick resumes delivery);
/// `Some(NoBuffers)`: it added some meanwhile, retry.
fn deliver_one<M: vm_memory::GuestMemory>(
    queue: &mut virtio_queue::Queue,
    mem: &M,
    layout: &NetLayout,
    scratch: &mut Scratch,
    stats: &mut ChainStats,
    frame: &[u8],
) -> Result<Option<RxOutcome>, QueueError> {
    let avail_before = queue.avail_idx(mem, Ordering::Acquire)?;
    let outcome = deliver_rx(queue, mem, layout, scratch, stats, frame)?;
    if outcome != RxOutcome::NoBuffers {
        return Ok(Some(outcome));
    }
    queue.enable_notification(mem)?;
    if queue.avail_idx(mem, Ordering::Acquire)? == avail_before {
        stats.ring_empty += 1;
        return Ok(None);
    }
    Ok(Some(RxOutcome::NoBuffers))
}

/// A poisoned lock only means another handler panicked; the data is
/// still consistent for our purposes (counters and scratch space).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl<D: Device> VhostUserBackend for NetBackend<D> {
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
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).map_err(|e| log::error!("exit event: {e}")).ok()
    }

    fn handle_event(
        &self,
        device_event: u16,
        _evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> std::io::Result<()> {
        log::trace!("device event {device_event}");
        if device_event != POLL_EVENT {
            self.nic().count_wakeup();
        }
        let [rx, tx] = vrings else {
            return Err(BackendError::UnknownEvent(device_event).into());
        };
        // Whatever woke us, frames held for a full uplink go first if it
        // has room (EPOLLOUT comes as a WRITABLE_EVENT).
        self.nic().flush_uplink();
        // Whatever woke us (its own resume event, EPOLLOUT, a kick), an
        // engine with work left continues first.
        self.run_engine_if_due();
        match device_event {
            // A TX kick may queue control responses: deliver them at once.
            TX_QUEUE => {
                self.nic().count_tx_kick();
                lock(&self.datapath).tx_rescued = false;
                self.transmit(tx)?;
                self.receive(rx)?;
            }
            // An RX kick means new buffers for held frames.
            RX_QUEUE | UPLINK_EVENT => self.receive(rx)?,
            // Held frames left above; what waited behind them goes on.
            WRITABLE_EVENT => {
                self.transmit(tx)?;
                self.receive(rx)?;
            }
            TIMER_EVENT => {
                self.on_timer();
                self.tx_watchdog(tx)?;
                self.receive(rx)?;
            }
            KICK_EVENT => {
                self.on_kick();
                self.receive(rx)?;
            }
            // A budget ran out: carry on where it stopped, TX and RX alike
            // (each takes its budget again, so both make progress).
            RESUME_EVENT => {
                let _ = self.resume.read();
                self.transmit(tx)?;
                self.receive(rx)?;
            }
            POLL_EVENT => self.on_poll(rx)?,
            other => return Err(BackendError::UnknownEvent(other).into()),
        }
        // Frames the engine queued in this wake-up and did not flush yet
        // (a receive whose ACK needed no engine pass) leave now.
        if self.nic().uplink_backlog() > 0 && !self.nic().flush_uplink() {
            lock(&self.timer).arm_within(self.now(), UPLINK_RETRY);
        }
        if self.tx_unblocked() {
            self.transmit(tx)?;
            self.receive(rx)?;
        }
        lock(&self.writable).set(self.nic().uplink_backlog() > 0);
        let polling = self.device.polling();
        lock(&self.poll).set(polling);
        Ok(())
    }

    /// GET_VRING_BASE: the frontend stopped the ring, and sets it up again
    /// (SET_VRING_ADDR, SET_VRING_BASE, a kick) before it is used: a
    /// broken ring gets a fresh start.
    fn stop_vring(&self, queue_index: u32) -> std::io::Result<()> {
        let index = usize::try_from(queue_index).unwrap_or(usize::MAX);
        if let Some(flag) = self.broken.get(index) {
            if flag.swap(false, Ordering::AcqRel) {
                log::info!("queue {queue_index} re-initialised by the frontend: served again");
            }
        }
        Ok(())
    }

    fn reset_device(&self) {
        for flag in &self.broken {
            flag.store(false, Ordering::Release);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
#[path = "backend_tests.rs"]
mod tests;
