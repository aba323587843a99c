//! The data path between the guest's rings and the engine: WQEs fetched
//! on doorbells (with the doorbell-suppression protocol of `vt3_hw.h`),
//! completions written as CQEs, and QP states published in status pages.
//!
//! Ordering (docs/architecture.md §3.1): producer indices are read
//! with acquire before the WQEs they cover; a consumer index is published
//! with release once its slot may be reused; a CQE is written before the
//! CQ producer index (release).

use std::mem::offset_of;
use std::sync::atomic::Ordering;

use vm_memory::{Bytes, GuestAddress, GuestMemory};
use vt3_iwarp::engine::{self, Completion, WcStatus, WorkQueue};

use super::memory::StatusWord;
use super::poll::{self, End, PolledQueue, ProducerRing, Take, Trigger};
use super::wqe::{self, BadWqe};
use super::{Instant, Rnic, WorkProgress};
use crate::abi::{self, ArmFlag, CqStatus, CqStatusFlag, EventType, QpState, QpStatus, QpStatusFlag, RqWqe, SqWqe};

/// The status-page fields and flag of one work queue.
#[derive(Debug, Clone, Copy)]
struct QueueFields {
    prod: usize,
    cons: usize,
    idle: u32,
}

impl QueueFields {
    fn of(queue: WorkQueue) -> Self {
        match queue {
            WorkQueue::Send => Self {
                prod: offset_of!(QpStatus, sq_prod),
                cons: offset_of!(QpStatus, sq_cons),
                idle: QpStatusFlag::SqIdle as u32,
            },
            WorkQueue::Recv => Self {
                prod: offset_of!(QpStatus, rq_prod),
                cons: offset_of!(QpStatus, rq_cons),
                idle: QpStatusFlag::RqIdle as u32,
            },
        }
    }
}

fn qp_flags(status: GuestAddress) -> StatusWord {
    StatusWord::at(status, offset_of!(QpStatus, flags))
}

/// Writes the QP state into its status page, and the error flag on ERROR.
pub(super) fn publish_state<M: GuestMemory>(mem: &M, status: GuestAddress, state: QpState) {
    StatusWord::at(status, offset_of!(QpStatus, state)).store(mem, state as u32, Ordering::Release);
    if state == QpState::Error {
        qp_flags(status).fetch_or(mem, QpStatusFlag::Error as u32);
    }
}

/// Whether the engine takes new WQEs for `queue` in `state` (sends in IDLE
/// wait for the connection; receives are taken until the close).
fn accepts(state: Option<engine::QpState>, queue: WorkQueue) -> bool {
    use engine::QpState::{Closing, Idle, Rts};
    match queue {
        WorkQueue::Send => matches!(state, Some(Idle | Rts)),
        WorkQueue::Recv => matches!(state, Some(Idle | Rts | Closing)),
    }
}

/// A WQE the guest got wrong: its wr_id (0 if unreadable) and the status
/// it completes with, in posting order ([`engine::Engine::post_refused`]).
struct Refused {
    wr_id: u64,
    status: WcStatus,
}

/// Reads and parses the send WQE at `addr`.
fn read_send_wr<M: GuestMemory>(
    mem: &M,
    addr: Option<GuestAddress>,
    limits: &wqe::WqeLimits,
) -> Result<engine::SendWr, Refused> {
    let raw = addr.and_then(|a| mem.read_obj::<SqWqe>(a).ok());
    raw.ok_or(BadWqe::Unreadable).and_then(|w| wqe::send_wr(&w, limits)).map_err(|e| {
        let wr_id = raw.map_or(0, |w| w.wr_id.to_native());
        log::debug!("send WQE {wr_id:#x} refused: {e}");
        Refused { wr_id, status: e.status() }
    })
}

/// Reads and parses the receive WQE at `addr`.
fn read_recv_wr<M: GuestMemory>(
    mem: &M,
    addr: Option<GuestAddress>,
    limits: &wqe::WqeLimits,
) -> Result<engine::RecvWr, Refused> {
    let raw = addr.and_then(|a| mem.read_obj::<RqWqe>(a).ok());
    raw.ok_or(BadWqe::Unreadable).and_then(|w| wqe::recv_wr(&w, limits)).map_err(|e| {
        let wr_id = raw.map_or(0, |w| w.wr_id.to_native());
        log::debug!("receive WQE {wr_id:#x} refused: {e}");
        Refused { wr_id, status: e.status() }
    })
}

/// WQEs handed to the engine per queue per fetch (a NAPI weight): a deep
/// ring is taken over several engine passes, so one QP cannot hold the
/// worker while others and the virtqueues wait. The rest is fetched on
/// the next pass without a new doorbell (the IDLE flag stays clear).
pub const FETCH_BUDGET: u32 = 128;

/// One QP's SQ or RQ in guest memory, feeding the engine.
struct QpRing<'a, M> {
    mem: &'a M,
    qpn: u32,
    queue: WorkQueue,
    prod: StatusWord,
    flags: StatusWord,
    idle: u32,
    ring: &'a super::Ring,
    work: &'a mut WorkProgress,
    limits: wqe::WqeLimits,
    engine: &'a mut engine::Engine<vt3_iwarp::toe::SmolToe>,
}

impl<M: GuestMemory> ProducerRing for QpRing<'_, M> {
    fn producer(&mut self) -> Option<u32> {
        self.prod.load(self.mem, Ordering::Acquire)
    }

    fn set_idle(&mut self, idle: bool) {
        if idle {
            self.flags.fetch_or(self.mem, self.idle);
        } else {
            self.flags.fetch_and_not(self.mem, self.idle);
        }
    }

    fn take(&mut self, prod: u32, budget: &mut u32) -> Take {
        let (qpn, queue, work, depth) = (self.qpn, self.queue, &mut *self.work, self.ring.depth);
        let outstanding = prod.wrapping_sub(work.consumed);
        if outstanding > depth {
            log::warn!(
                "QP {qpn}: {queue:?} producer index {prod} is {outstanding} ahead of the consumer index {} \
                 in a ring of {depth}: QP to ERROR",
                work.consumed,
            );
            return Take::Broken;
        }
        let mut taken = 0;
        // Never more than a ring's worth ahead of the consumer index.
        while work.fetched != prod && work.fetched.wrapping_sub(work.consumed) < depth {
            if *budget == 0 {
                return Take::OutOfBudget(taken);
            }
            *budget -= 1;
            let addr = self.ring.entry_addr(work.fetched);
            let result = match queue {
                WorkQueue::Send => match read_send_wr(self.mem, addr, &self.limits) {
                    Ok(wr) => self.engine.post_send(qpn, wr),
                    Err(bad) => self.engine.post_refused(qpn, queue, bad.wr_id, bad.status),
                },
                WorkQueue::Recv => match read_recv_wr(self.mem, addr, &self.limits) {
                    Ok(wr) => self.engine.post_recv(qpn, wr),
                    Err(bad) => self.engine.post_refused(qpn, queue, bad.wr_id, bad.status),
                },
            };
            if let Err(e) = result {
                log::debug!("QP {qpn}: WQE {} not posted: {e}", work.fetched);
                break;
            }
            work.fetched = work.fetched.wrapping_add(1);
            taken += 1;
        }
        Take::Drained(taken)
    }
}

impl Rnic {
    /// Hands the WQEs the guest produced on `queue` of `qpn` to the engine;
    /// returns whether any was posted. `trigger`: what made vt3d look.
    /// A producer index more than the ring's depth ahead of the consumer
    /// index is impossible: nothing is read and the QP goes to ERROR at
    /// the next engine pass. Runs the doorbell-suppression protocol
    /// ([`poll::drain`]): the IDLE flag is clear while vt3d reads the ring
    /// and while it polls it after work ([`poll::PollWindow`]); when it
    /// stops, it sets the flag, issues a full barrier and re-reads the
    /// producer index, so a WQE posted in between is never missed (the
    /// producer does the mirror image).
    pub(super) fn fetch<M: GuestMemory>(
        &mut self,
        mem: &M,
        now: Instant,
        qpn: u32,
        queue: WorkQueue,
        trigger: Trigger,
    ) -> bool {
        if queue == WorkQueue::Recv {
            if let Some(srqn) = self.qps.get(qpn).map(|qp| qp.srqn).filter(|&s| s != 0) {
                return self.fetch_srq(mem, now, srqn, trigger);
            }
        }
        let Some(offload) = self.offload.as_mut() else { return false };
        let Some(qp) = self.qps.get_mut(qpn) else { return false };
        let id = PolledQueue::Qp(qpn, queue);
        let fields = QueueFields::of(queue);
        let flags = qp_flags(qp.status_addr);
        let limits = qp.wqe_limits();
        let takes = !qp.spent && accepts(offload.engine.qp_state(qpn), queue);
        let (ring, work, window) = match queue {
            WorkQueue::Send => (&qp.sq, &mut qp.sq_work, &mut qp.sq_poll),
            WorkQueue::Recv => (&qp.rq, &mut qp.rq_work, &mut qp.rq_poll),
        };
        if !takes {
            flags.fetch_or(mem, fields.idle);
            window.stop();
            self.polled.set(id, false);
            return false;
        }
        if trigger == Trigger::Doorbell {
            window.doorbell(now);
        }
        let (before, room) = (*window, self.polled.has_room_for(id, now));
        let mut ring = QpRing {
            mem,
            qpn,
            queue,
            prod: StatusWord::at(qp.status_addr, fields.prod),
            flags,
            idle: fields.idle,
            ring,
            work,
            limits,
            engine: &mut offload.engine,
        };
        let (taken, end) = poll::drain(&mut ring, FETCH_BUDGET, |took| before.stays(now, took, room));
        window.record(now, trigger, taken, end == End::Polling);
        self.polled.set(id, end == End::Polling);
        match end {
            End::Pending => {
                // Not idle: the guest rings no doorbell, the next engine
                // pass carries on.
                if !self.fetch_pending.contains(&(qpn, queue)) {
                    self.fetch_pending.push((qpn, queue));
                }
            }
            End::Broken => {
                flags.fetch_or(mem, fields.idle);
                if !self.ring_faults.contains(&(qpn, queue)) {
                    self.ring_faults.push((qpn, queue));
                }
            }
            End::Idle | End::Polling => {}
        }
        taken > 0
    }

    /// Retires one completion: advances the consumer index of its queue and
    /// writes its CQE (none for an unsignaled send). Returns whether the
    /// engine got new work (a deferred graceful close).
    pub(super) fn complete<M: GuestMemory>(&mut self, mem: &M, now: Instant, c: &Completion) -> bool {
        let Some(qp) = self.qps.get_mut(c.qpn) else { return false };
        if c.srq_idx.is_some() {
            // A WQE of the QP's SRQ, named by its SRQ index: the SRQ's
            // consumer index moved when the QP took it.
            let notify = c.solicited || c.status != WcStatus::Success;
            let cqn = qp.recv_cqn;
            self.post_cqe(mem, cqn, &wqe::cqe(c, 0), notify);
            return false;
        }
        let (work, cqn) = match c.queue {
            WorkQueue::Send => (&mut qp.sq_work, qp.send_cqn),
            WorkQueue::Recv => (&mut qp.rq_work, qp.recv_cqn),
        };
        // Completions come in WQE order per queue: this one is WQE `consumed`.
        let wqe_idx = work.consumed;
        work.consumed = work.consumed.wrapping_add(1);
        // Retired before its CQE is visible: a consumer that reaps the CQE
        // and reuses the slot never runs ahead of this index.
        StatusWord::at(qp.status_addr, QueueFields::of(c.queue).cons).store(mem, work.consumed, Ordering::Release);
        let drained = qp.sq_work.fetched == qp.sq_work.consumed;
        let close_now = c.queue == WorkQueue::Send && qp.close_requested && drained;
        if close_now {
            qp.close_requested = false;
        }
        if wqe::writes_cqe(c) {
            let notify = c.solicited || c.status != WcStatus::Success;
            self.post_cqe(mem, cqn, &wqe::cqe(c, wqe_idx), notify);
        }
        close_now && self.start_close(now, c.qpn)
    }

    /// Writes a CQE into CQ `cqn`, or reports the overflow; raises the
    /// completion event if the CQ is armed for it. `solicited`: the
    /// completion satisfies a solicited-only arm (a solicited receive, or
    /// any error, as the verbs specify).
    fn post_cqe<M: GuestMemory>(&mut self, mem: &M, cqn: u32, cqe: &abi::Cqe, solicited: bool) {
        let Some(cq) = self.cqs.get_mut(cqn) else { return };
        let cons = StatusWord::at(cq.status_addr, offset_of!(CqStatus, cons)).load(mem, Ordering::Acquire);
        let room = cons.is_some_and(|cons| cq.prod.wrapping_sub(cons) < cq.ring.depth);
        let written = room && cq.ring.entry_addr(cq.prod).is_some_and(|addr| mem.write_obj(*cqe, addr).is_ok());
        if !written {
            StatusWord::at(cq.status_addr, offset_of!(CqStatus, flags)).fetch_or(mem, CqStatusFlag::Overflow as u32);
            if !cq.overflowed {
                cq.overflowed = true;
                log::debug!("CQ {cqn} overflow (prod {}, cons {cons:?})", cq.prod);
                self.push_event(EventType::CqError, &abi::Event { handle: cqn.into(), ..Default::default() });
            }
            return;
        }
        cq.prod = cq.prod.wrapping_add(1);
        StatusWord::at(cq.status_addr, offset_of!(CqStatus, prod)).store(mem, cq.prod, Ordering::Release);
        let armed =
            cq.arm_flags & ArmFlag::Next as u32 != 0 || (cq.arm_flags & ArmFlag::Solicited as u32 != 0 && solicited);
        if armed {
            cq.arm_flags = 0;
            self.push_event(EventType::CqCompletion, &abi::Event { handle: cqn.into(), ..Default::default() });
        }
    }

    /// Records and publishes a QP state. ERROR flags the QP and its CQs (the
    /// provider or driver flushes what is between the consumer and producer
    /// indices). IDLE after a connection leaves the same to flush, and the
    /// rings alone (`spent`). ERROR -> IDLE resets the QP for a new
    /// connection: everything posted so far has been flushed, so the
    /// consumer indices catch up with the producer indices.
    pub(super) fn set_qp_state<M: GuestMemory>(&mut self, mem: &M, qpn: u32, to: QpState) {
        let Some(qp) = self.qps.get_mut(qpn) else { return };
        let from = qp.state;
        qp.state = to;
        if matches!(to, QpState::Error | QpState::Idle) {
            if let Some(seq) = qp.established.take() {
                self.conns.record(seq, to);
            }
        }
        if to == QpState::Error && from != QpState::Error && qp.srqn != 0 && !self.last_wqe_owed.contains(&qpn) {
            self.last_wqe_owed.push(qpn);
        }
        if to != QpState::Rts {
            qp.close_requested = false;
        }
        publish_state(mem, qp.status_addr, to);
        match to {
            QpState::Error => {
                for cqn in [qp.send_cqn, qp.recv_cqn] {
                    if let Some(cq) = self.cqs.get(cqn) {
                        StatusWord::at(cq.status_addr, offset_of!(CqStatus, flags))
                            .fetch_or(mem, CqStatusFlag::Error as u32);
                    }
                }
            }
            QpState::Idle if from == QpState::Error => {
                qp.spent = false;
                for (queue, work) in [(WorkQueue::Send, &mut qp.sq_work), (WorkQueue::Recv, &mut qp.rq_work)] {
                    let fields = QueueFields::of(queue);
                    let prod = StatusWord::at(qp.status_addr, fields.prod).load(mem, Ordering::Acquire);
                    let prod = prod.unwrap_or(work.fetched);
                    *work = WorkProgress { fetched: prod, consumed: prod };
                    StatusWord::at(qp.status_addr, fields.cons).store(mem, prod, Ordering::Release);
                }
                qp_flags(qp.status_addr).fetch_and_not(mem, QpStatusFlag::Error as u32);
            }
            QpState::Idle if from != QpState::Idle => qp.spent = true,
            _ => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::abi::{CmdArmCq, CmdCreateCq, Cqe};
    use crate::control::Request;
    use crate::rnic::Limits;
    use vm_memory::GuestMemoryMmap;

    const NOW: Instant = Instant::from_millis_const(1);
    const PBL: u64 = 0x1000;
    const RING: u64 = 0x2000;
    const STATUS: u64 = 0x3000;

    fn cq(depth: u32) -> (Rnic, GuestMemoryMmap, u32) {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x10000)]).unwrap();
        mem.write_obj(RING.to_le(), GuestAddress(PBL)).unwrap();
        let mut rnic = Rnic::new(Limits::default(), 1500);
        let args = CmdCreateCq {
            ring_pbl_addr: PBL.into(),
            status_addr: STATUS.into(),
            ring_npages: 1.into(),
            depth: depth.into(),
        };
        let resp = rnic.execute(&mem, NOW, &Request::CreateCq(args)).unwrap();
        let cqn = abi::read_struct::<abi::RespHandle>(&resp).unwrap().handle.to_native();
        (rnic, mem, cqn)
    }

    fn entry(wr_id: u64) -> Cqe {
        Cqe { wr_id: wr_id.into(), ..Default::default() }
    }

    fn status(mem: &GuestMemoryMmap) -> CqStatus {
        mem.read_obj(GuestAddress(STATUS)).unwrap()
    }

    fn events(rnic: &mut Rnic) -> Vec<EventType> {
        rnic.events.drain(..).map(|(t, _)| t).collect()
    }

    #[test]
    fn cqes_fill_the_ring_and_overflow_is_reported_once() {
        let (mut rnic, mem, cqn) = cq(4);
        for id in 0..4 {
            rnic.post_cqe(&mem, cqn, &entry(id), false);
        }
        assert_eq!(status(&mem).prod.to_native(), 4);
        for slot in 0..4u64 {
            let e: Cqe = mem.read_obj(GuestAddress(RING + slot * 32)).unwrap();
            assert_eq!(e.wr_id.to_native(), slot);
        }
        assert!(events(&mut rnic).is_empty());
        // Full (prod - cons == depth): nothing written, flagged, one event.
        rnic.post_cqe(&mem, cqn, &entry(4), false);
        rnic.post_cqe(&mem, cqn, &entry(5), false);
        let st = status(&mem);
        assert_eq!(st.prod.to_native(), 4);
        assert_eq!(st.flags.to_native(), CqStatusFlag::Overflow as u32);
        assert_eq!(events(&mut rnic), vec![EventType::CqError]);
        assert_eq!(mem.read_obj::<Cqe>(GuestAddress(RING)).unwrap().wr_id.to_native(), 0, "not overwritten");
        // The consumer catches up: the ring wraps.
        mem.write_obj(vm_memory::Le32::from(2), GuestAddress(STATUS + 4)).unwrap();
        rnic.post_cqe(&mem, cqn, &entry(6), false);
        assert_eq!(mem.read_obj::<Cqe>(GuestAddress(RING)).unwrap().wr_id.to_native(), 6);
        assert_eq!(status(&mem).prod.to_native(), 5);
        // A consumer index ahead of the producer is an overflow too, not a wild write.
        mem.write_obj(vm_memory::Le32::from(1000), GuestAddress(STATUS + 4)).unwrap();
        rnic.post_cqe(&mem, cqn, &entry(7), false);
        assert_eq!(status(&mem).prod.to_native(), 5);
    }

    #[test]
    fn armed_cqs_raise_one_event() {
        let (mut rnic, mem, cqn) = cq(16);
        let arm = |rnic: &mut Rnic, flags: ArmFlag| {
            let a = CmdArmCq { cqn: cqn.into(), flags: (flags as u32).into() };
            rnic.execute(&mem, NOW, &Request::ArmCq(a)).unwrap();
        };
        rnic.post_cqe(&mem, cqn, &entry(1), false);
        assert!(events(&mut rnic).is_empty(), "not armed");
        // Consumed, then armed for the next completion.
        mem.write_obj(vm_memory::Le32::from(1), GuestAddress(STATUS + 4)).unwrap();
        arm(&mut rnic, ArmFlag::Next);
        rnic.post_cqe(&mem, cqn, &entry(2), false);
        rnic.post_cqe(&mem, cqn, &entry(3), false);
        assert_eq!(events(&mut rnic), vec![EventType::CqCompletion], "one event, then disarmed");
        mem.write_obj(vm_memory::Le32::from(3), GuestAddress(STATUS + 4)).unwrap();
        arm(&mut rnic, ArmFlag::Solicited);
        rnic.post_cqe(&mem, cqn, &entry(4), false);
        assert!(events(&mut rnic).is_empty(), "unsolicited");
        rnic.post_cqe(&mem, cqn, &entry(5), true);
        assert_eq!(events(&mut rnic), vec![EventType::CqCompletion]);
    }
}
