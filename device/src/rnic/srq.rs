//! Shared receive queues (docs/architecture.md §3.4): the
//! commands, the ring fetch into the engine's pool (the doorbell protocol
//! of an RQ, with VT3_SRQ_F_IDLE), and what follows the QPs' takes: the
//! consumer index and the limit event.

use std::mem::offset_of;
use std::sync::atomic::Ordering;

use vm_memory::{Bytes, GuestAddress, GuestMemory};

use super::memory::StatusWord;
use super::poll::{self, End, PollWindow, PolledQueue, ProducerRing, Take, Trigger};
use super::wqe::{self, BadWqe};
use super::{handle_reply, le, reply, CmdResult, Instant, Ring, Rnic, WorkProgress, FETCH_BUDGET};
use crate::abi::{
    self, CmdCreateSrq, CmdModifySrq, CmdResizeSrq, EventType, QpEvent, RqWqe, SrqAttr, SrqModifyMask, SrqStatus,
    SrqStatusFlag, Status,
};

#[derive(Debug)]
pub struct Srq {
    pub pdn: u32,
    pub ring: Ring,
    pub status_addr: GuestAddress,
    pub max_sge: u32,
    pub limit: u32,
    /// The limit event goes out once when armed, then disarms.
    pub armed: bool,
    pub qp_users: u32,
    /// WQEs copied into the engine's pool (`fetched`) and taken by QPs
    /// (`consumed`, published as cons: their slots may be reused).
    pub work: WorkProgress,
    /// The guest broke the ring (impossible producer index): nothing more
    /// is read from it.
    pub broken: bool,
    /// Adaptive polling of the ring ([`poll`]).
    pub poll: PollWindow,
}

fn field(srq: &Srq, offset: usize) -> StatusWord {
    StatusWord::at(srq.status_addr, offset)
}

impl Rnic {
    pub(super) fn create_srq<M: GuestMemory>(&mut self, mem: &M, a: &CmdCreateSrq) -> CmdResult {
        let l = self.limits;
        let pdn = le(a.pdn);
        if self.pds.get(pdn).is_none() {
            return Err(Status::NotFound);
        }
        let (max_sge, limit, depth) = (le(a.max_sge), le(a.limit), le(a.depth));
        if max_sge > l.max_srq_sge || limit > depth || a.reserved.to_native() != 0 {
            return Err(Status::Invalid);
        }
        let status_addr = Self::status_page(mem, a.status_addr.to_native(), std::mem::size_of::<SrqStatus>())?;
        let max_depth = (l.max_srq_wr + 1).next_power_of_two();
        let wqe = abi::VT3_WQE_SIZE as u64;
        let ring = self.read_ring(mem, depth, max_depth, wqe, a.ring_pbl_addr.to_native(), le(a.ring_npages))?;
        let npages = ring.pages.len() as u64;
        // Indices are free running: start where the page says.
        let cons = StatusWord::at(status_addr, offset_of!(SrqStatus, cons)).load(mem, Ordering::Acquire).unwrap_or(0);
        let srq = Srq {
            pdn,
            ring,
            status_addr,
            max_sge,
            limit,
            armed: limit != 0,
            qp_users: 0,
            work: WorkProgress { fetched: cons, consumed: cons },
            broken: false,
            poll: PollWindow::default(),
        };
        let Some(srqn) = self.srqs.insert(srq) else {
            self.pbl_used -= npages;
            return Err(Status::NoResource);
        };
        if let Err(e) = self.attach_srq(srqn) {
            log::warn!("SRQ {srqn}: the engine refused it: {e}");
            self.srqs.remove(srqn);
            self.pbl_used -= npages;
            return Err(Status::NoResource);
        }
        self.pd_users(pdn, true);
        // vt3d is idle on the ring: the first WQEs need a doorbell.
        StatusWord::at(status_addr, offset_of!(SrqStatus, flags)).fetch_or(mem, SrqStatusFlag::Idle as u32);
        handle_reply(srqn)
    }

    pub(super) fn modify_srq(&mut self, a: &CmdModifySrq) -> CmdResult {
        let mask = le(a.mask);
        let known = SrqModifyMask::Limit as u32 | SrqModifyMask::Arm as u32;
        if mask & !known != 0 || a.reserved.to_native() != 0 {
            return Err(Status::Invalid);
        }
        let srq = self.srqs.get_mut(le(a.srqn)).ok_or(Status::NotFound)?;
        let limit = if mask & SrqModifyMask::Limit as u32 != 0 { le(a.limit) } else { srq.limit };
        if limit > srq.ring.depth {
            return Err(Status::Invalid);
        }
        srq.limit = limit;
        if mask & SrqModifyMask::Arm as u32 != 0 {
            // Arming with no limit would never fire: refused, as the verbs do.
            if limit == 0 {
                return Err(Status::Invalid);
            }
            srq.armed = true;
        }
        Ok(Vec::new())
    }

    /// VT3_CMD_RESIZE_SRQ (docs/architecture.md §3.4): the ring
    /// becomes the new one, checked as at create, of a depth not below the
    /// current one. Indices keep running, so the WQEs not fetched yet are
    /// read from the new ring at their index (the driver copied them
    /// there); those in the engine's pool and those QPs took are copies,
    /// untouched. Commands run between engine passes: no fetch sees half
    /// of it. Refused, the SRQ stays as it was.
    pub(super) fn resize_srq<M: GuestMemory>(&mut self, mem: &M, a: &CmdResizeSrq) -> CmdResult {
        let (srqn, depth) = (le(a.srqn), le(a.depth));
        let srq = self.srqs.get(srqn).ok_or(Status::NotFound)?;
        if a.reserved.to_native() != 0 || depth < srq.ring.depth || srq.broken {
            return Err(Status::Invalid);
        }
        let max_depth = (self.limits.max_srq_wr + 1).next_power_of_two();
        let wqe = abi::VT3_WQE_SIZE as u64;
        let ring = self.read_ring(mem, depth, max_depth, wqe, a.ring_pbl_addr.to_native(), le(a.ring_npages))?;
        let npages = ring.pages.len() as u64;
        if let Some(offload) = self.offload.as_mut() {
            if let Err(e) = offload.engine.resize_srq(srqn, depth) {
                log::warn!("SRQ {srqn}: the engine refused a depth of {depth}: {e}");
                self.pbl_used -= npages;
                return Err(Status::Invalid);
            }
        }
        let Some(srq) = self.srqs.get_mut(srqn) else {
            self.pbl_used -= npages;
            return Err(Status::NotFound);
        };
        let old = std::mem::replace(&mut srq.ring, ring);
        self.pbl_used -= old.pages.len() as u64;
        Ok(Vec::new())
    }

    pub(super) fn query_srq(&self, srqn: u32) -> CmdResult {
        let srq = self.srqs.get(srqn).ok_or(Status::NotFound)?;
        reply(SrqAttr {
            depth: srq.ring.depth.into(),
            max_sge: srq.max_sge.into(),
            limit: srq.limit.into(),
            armed: u32::from(srq.armed).into(),
            qps: srq.qp_users.into(),
            reserved: 0.into(),
        })
    }

    pub(super) fn destroy_srq(&mut self, srqn: u32) -> CmdResult {
        let srq = self.srqs.get(srqn).ok_or(Status::NotFound)?;
        if srq.qp_users > 0 {
            return Err(Status::Busy);
        }
        if let Some(offload) = self.offload.as_mut() {
            let _ = offload.engine.destroy_srq(srqn);
        }
        if let Some(srq) = self.srqs.remove(srqn) {
            self.pbl_used -= srq.ring.pages.len() as u64;
            self.pd_users(srq.pdn, false);
        }
        self.srq_fetch_pending.retain(|&s| s != srqn);
        self.polled.set(PolledQueue::Srq(srqn), false);
        Ok(Vec::new())
    }

    /// Creates the engine's side of SRQ `srqn` (nothing without an engine):
    /// its pool starts empty at the consumer index, so WQEs fetched for an
    /// old engine are fetched again.
    pub(super) fn attach_srq(&mut self, srqn: u32) -> Result<(), vt3_iwarp::engine::EngineError> {
        let (Some(offload), Some(srq)) = (self.offload.as_mut(), self.srqs.get_mut(srqn)) else {
            return Ok(());
        };
        srq.work.fetched = srq.work.consumed;
        offload.engine.create_srq(srqn, srq.ring.depth, srq.work.consumed)
    }

    /// Copies the WQEs the guest produced on SRQ `srqn` into the engine's
    /// pool, never more than the ring's depth beyond the consumer index;
    /// returns whether any was posted. Doorbell suppression and polling as
    /// for an RQ (`datapath::fetch`). A producer index more than depth
    /// ahead of the consumer index breaks the ring: VT3_SRQ_F_ERROR,
    /// VT3_EV_SRQ_ERROR once, and nothing more is read (the QPs are not
    /// touched).
    pub(super) fn fetch_srq<M: GuestMemory>(&mut self, mem: &M, now: Instant, srqn: u32, trigger: Trigger) -> bool {
        let id = PolledQueue::Srq(srqn);
        let Some(srq) = self.srqs.get_mut(srqn) else { return false };
        let flags = field(srq, offset_of!(SrqStatus, flags));
        let Some(offload) = self.offload.as_mut() else {
            flags.fetch_or(mem, SrqStatusFlag::Idle as u32);
            srq.poll.stop();
            self.polled.set(id, false);
            return false;
        };
        if srq.broken {
            return false;
        }
        if trigger == Trigger::Doorbell {
            srq.poll.doorbell(now);
        }
        let (before, room) = (srq.poll, self.polled.has_room_for(id, now));
        let mut ring = SrqRing {
            mem,
            srqn,
            prod: field(srq, offset_of!(SrqStatus, prod)),
            flags,
            ring: &srq.ring,
            work: &mut srq.work,
            max_sge: srq.max_sge,
            engine: &mut offload.engine,
        };
        let (taken, end) = poll::drain(&mut ring, FETCH_BUDGET, |took| before.stays(now, took, room));
        srq.poll.record(now, trigger, taken, end == End::Polling);
        self.polled.set(id, end == End::Polling);
        match end {
            End::Pending => {
                if !self.srq_fetch_pending.contains(&srqn) {
                    self.srq_fetch_pending.push(srqn);
                }
            }
            End::Broken => {
                srq.broken = true;
                flags.fetch_or(mem, SrqStatusFlag::Error as u32);
                self.srq_ring_errors += 1;
                self.push_event(EventType::SrqError, &abi::Event { handle: srqn.into(), ..Default::default() });
            }
            End::Idle | End::Polling => {}
        }
        taken > 0
    }

    /// After engine work: publishes each SRQ's consumer index (the slots
    /// the QPs took are free), and sends VT3_EV_SRQ_LIMIT once when a take
    /// left fewer than `limit` WQEs posted and not taken.
    pub(super) fn sync_srqs<M: GuestMemory>(&mut self, mem: &M) {
        let Some(offload) = self.offload.as_ref() else { return };
        let mut limit_events = Vec::new();
        for (srqn, srq) in self.srqs.iter_mut() {
            let Some(taken) = offload.engine.srq_taken(srqn) else { continue };
            if taken == srq.work.consumed {
                continue;
            }
            srq.work.consumed = taken;
            field(srq, offset_of!(SrqStatus, cons)).store(mem, taken, Ordering::Release);
            if !srq.armed {
                continue;
            }
            // The guest's producer index, as far as it is believable.
            let prod = field(srq, offset_of!(SrqStatus, prod)).load(mem, Ordering::Acquire);
            let posted = prod.map_or(0, |p| p.wrapping_sub(taken)).min(srq.ring.depth);
            if posted < srq.limit {
                srq.armed = false;
                limit_events.push(srqn);
            }
        }
        for srqn in limit_events {
            self.push_event(EventType::SrqLimit, &abi::Event { handle: srqn.into(), ..Default::default() });
        }
    }

    /// VT3_QPE_LAST_WQE_REACHED for the QPs of an SRQ that entered ERROR:
    /// after the engine's output (the error's own event, the flush CQE of
    /// the WQE the QP had taken) was delivered.
    pub(super) fn report_last_wqe(&mut self) {
        for qpn in std::mem::take(&mut self.last_wqe_owed) {
            if self.qps.get(qpn).is_some() {
                let body = abi::Event {
                    handle: qpn.into(),
                    code: (QpEvent::LastWqeReached as u32).into(),
                    ..Default::default()
                };
                self.push_event(EventType::Qp, &body);
            }
        }
    }

    /// Continues SRQ fetches that spent their budget.
    pub(super) fn service_srq_rings<M: GuestMemory>(&mut self, mem: &M, now: Instant) {
        for srqn in std::mem::take(&mut self.srq_fetch_pending) {
            self.fetch_srq(mem, now, srqn, Trigger::Device);
        }
    }
}

/// An SRQ's ring in guest memory, feeding the engine's pool.
struct SrqRing<'a, M> {
    mem: &'a M,
    srqn: u32,
    prod: StatusWord,
    flags: StatusWord,
    ring: &'a Ring,
    work: &'a mut WorkProgress,
    max_sge: u32,
    engine: &'a mut vt3_iwarp::engine::Engine<vt3_iwarp::toe::SmolToe>,
}

impl<M: GuestMemory> ProducerRing for SrqRing<'_, M> {
    fn producer(&mut self) -> Option<u32> {
        self.prod.load(self.mem, Ordering::Acquire)
    }

    fn set_idle(&mut self, idle: bool) {
        if idle {
            self.flags.fetch_or(self.mem, SrqStatusFlag::Idle as u32);
        } else {
            self.flags.fetch_and_not(self.mem, SrqStatusFlag::Idle as u32);
        }
    }

    fn take(&mut self, prod: u32, budget: &mut u32) -> Take {
        let (srqn, work, depth) = (self.srqn, &mut *self.work, self.ring.depth);
        let outstanding = prod.wrapping_sub(work.consumed);
        if outstanding > depth {
            log::warn!(
                "SRQ {srqn}: producer index {prod} is {outstanding} ahead of the consumer index {} in a ring \
                 of {depth}: SRQ broken",
                work.consumed,
            );
            return Take::Broken;
        }
        let limits = wqe::WqeLimits { max_send_sge: 0, max_recv_sge: self.max_sge, max_inline: 0, sig_all: false };
        let mut taken = 0;
        while work.fetched != prod && work.fetched.wrapping_sub(work.consumed) < depth {
            if *budget == 0 {
                return Take::OutOfBudget(taken);
            }
            *budget -= 1;
            let raw = self.ring.entry_addr(work.fetched).and_then(|a| self.mem.read_obj::<RqWqe>(a).ok());
            let parsed = raw.ok_or(BadWqe::Unreadable).and_then(|w| wqe::recv_wr(&w, &limits));
            let result = match parsed {
                Ok(wr) => self.engine.post_srq_recv(srqn, wr),
                Err(e) => {
                    let wr_id = raw.map_or(0, |w| w.wr_id.to_native());
                    log::debug!("SRQ {srqn}: receive WQE {wr_id:#x} refused: {e}");
                    self.engine.post_srq_refused(srqn, wr_id, e.status())
                }
            };
            if let Err(e) = result {
                log::debug!("SRQ {srqn}: WQE {} not posted: {e}", work.fetched);
                break;
            }
            work.fetched = work.fetched.wrapping_add(1);
            taken += 1;
        }
        Take::Drained(taken)
    }
}

/// The SRQ a CREATE_QP names: it must exist in the QP's PD, and the QP
/// has no RQ ring of its own. Returns the empty ring that stands for it.
pub(super) fn check_qp_srq(rnic: &Rnic, a: &abi::CmdCreateQp) -> Result<Option<(u32, Ring)>, Status> {
    let srqn = le(a.srqn);
    if srqn == 0 {
        return Ok(None);
    }
    let srq = rnic.srqs.get(srqn).ok_or(Status::NotFound)?;
    if srq.pdn != le(a.pdn) || srq.broken {
        return Err(Status::Invalid);
    }
    if le(a.rq_depth) != 0 || le(a.rq_npages) != 0 || a.rq_pbl_addr.to_native() != 0 || le(a.max_recv_sge) != 0 {
        return Err(Status::Invalid);
    }
    Ok(Some((srqn, Ring { depth: 0, entry_size: abi::VT3_WQE_SIZE as u64, pages: Vec::new() })))
}
