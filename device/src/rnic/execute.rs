//! The commands of a driver session, run against the resources: one
//! arm per [`Request`] (decoded by the control channel), the validation
//! of each and its answer. The larger commands have functions of their
//! own beside the state they change (`mod.rs`, `srq.rs`, `offload.rs`,
//! `rereg.rs`, `pairing.rs`).

use super::*;

impl Rnic {
    /// Executes one control command at time `now`; the result is the
    /// response payload (empty for commands without one) or the error status.
    pub fn execute<M: GuestMemory>(&mut self, mem: &M, now: Instant, request: &Request) -> CmdResult {
        if let Some(answer) = self.fatal_gate(mem, now, request) {
            return answer;
        }
        match *request {
            Request::QueryDevice => reply(self.device_attr()),
            Request::QueryPort => reply(PortAttr {
                max_msg_size: (1u32 << 31).into(),
                mtu: self.mtu.into(),
                link_up: 1.into(),
                reserved: 0.into(),
            }),
            Request::SetAddr(a) => {
                if a.prefix_len > 32 {
                    return Err(Status::Invalid);
                }
                self.set_addr(mem, now, GuestAddr { mac: a.mac, ipv4: a.ipv4, prefix_len: a.prefix_len })?;
                Ok(Vec::new())
            }
            Request::AllocPd => {
                let pdn = self.pds.insert(Pd { users: 0 }).ok_or(Status::NoResource)?;
                handle_reply(pdn)
            }
            Request::DeallocPd { pdn } => match self.pds.get(pdn) {
                None => Err(Status::NotFound),
                Some(pd) if pd.users > 0 => Err(Status::Busy),
                Some(_) => {
                    self.pds.remove(pdn);
                    Ok(Vec::new())
                }
            },
            Request::RegMr(a) => self.reg_mr(mem, &a),
            Request::AllocMr(a) => self.alloc_mr(&a),
            Request::ReregMr(a) => self.rereg_mr(mem, &a),
            Request::DeregMr { stag } => {
                let mr = self.tpt.remove_for_dereg(stag).map_err(|e| match e {
                    DeregError::NotFound => Status::NotFound,
                    DeregError::WindowsBound => Status::Busy,
                })?;
                self.pbl_used -= mr.pbl_entries();
                self.pd_users(mr.pdn, false);
                Ok(Vec::new())
            }
            Request::AllocMw(a) => {
                let pdn = le(a.pdn);
                if self.pds.get(pdn).is_none() {
                    return Err(Status::NotFound);
                }
                let mw_type = u8::try_from(le(a.mw_type)).ok().and_then(MwType::from_wire).ok_or(Status::Invalid)?;
                let stag = self.tpt.insert(Mr::unbound_window(pdn, mw_type)).ok_or(Status::NoResource)?;
                self.pd_users(pdn, true);
                handle_reply(stag)
            }
            Request::DeallocMw { stag } => {
                let mw = self.tpt.remove_window(stag).ok_or(Status::NotFound)?;
                self.pd_users(mw.pdn, false);
                Ok(Vec::new())
            }
            Request::CreateCq(a) => self.create_cq(mem, &a),
            Request::DestroyCq { cqn } => match self.cqs.get(cqn) {
                None => Err(Status::NotFound),
                Some(cq) if cq.qp_users > 0 => Err(Status::Busy),
                Some(_) => {
                    if let Some(cq) = self.cqs.remove(cqn) {
                        self.pbl_used -= cq.ring.pages.len() as u64;
                    }
                    Ok(Vec::new())
                }
            },
            Request::ArmCq(a) => {
                let flags = le(a.flags);
                if flags & !(abi::ArmFlag::Next as u32 | abi::ArmFlag::Solicited as u32) != 0 {
                    return Err(Status::Invalid);
                }
                let cqn = le(a.cqn);
                let cq = self.cqs.get_mut(cqn).ok_or(Status::NotFound)?;
                // CQEs already waiting: the event goes out now, or a
                // completion written just before the arm would be lost.
                let status: abi::CqStatus = mem.read_obj(cq.status_addr).map_err(|_| Status::BadAddress)?;
                if status.prod != status.cons {
                    cq.arm_flags = 0;
                    self.push_event(EventType::CqCompletion, &abi::Event { handle: cqn.into(), ..Default::default() });
                } else {
                    cq.arm_flags |= flags;
                }
                Ok(Vec::new())
            }
            Request::CreateQp(a) => self.create_qp(mem, &a),
            Request::ModifyQp(a) => self.modify_qp(mem, now, &a),
            Request::QueryQp { qpn } => {
                let qp = self.qps.get(qpn).ok_or(Status::NotFound)?;
                reply(QpAttr {
                    state: (qp.state as u32).into(),
                    ird: qp.ird.into(),
                    ord: qp.ord.into(),
                    sq_depth: qp.sq.depth.into(),
                    rq_depth: qp.rq.depth.into(),
                    reserved: 0.into(),
                })
            }
            Request::DestroyQp { qpn } => {
                self.qps.get(qpn).ok_or(Status::NotFound)?;
                // Whatever the engine produced for this QP is delivered
                // now: its number may name a new QP soon.
                self.pump(now, mem);
                if let Some(offload) = self.offload.as_mut() {
                    let _ = offload.engine.destroy_qp(qpn);
                }
                let qp = self.qps.remove(qpn).ok_or(Status::NotFound)?;
                self.pbl_used -= (qp.sq.pages.len() + qp.rq.pages.len()) as u64;
                self.pd_users(qp.pdn, false);
                for cqn in [qp.send_cqn, qp.recv_cqn] {
                    if let Some(cq) = self.cqs.get_mut(cqn) {
                        cq.qp_users -= 1;
                    }
                }
                if let Some(srq) = self.srqs.get_mut(qp.srqn) {
                    srq.qp_users -= 1;
                }
                self.last_wqe_owed.retain(|&q| q != qpn);
                self.polled.remove_qp(qpn);
                Ok(Vec::new())
            }
            Request::Doorbell(db) => {
                let (qpn, queues) = (le(db.qpn), le(db.queues));
                if queues & abi::DoorbellQueue::Srq as u32 != 0 {
                    // An SRQ's doorbell names the SRQ, and nothing else.
                    if queues != abi::DoorbellQueue::Srq as u32 {
                        return Err(Status::Invalid);
                    }
                    self.srqs.get(qpn).ok_or(Status::NotFound)?;
                    self.doorbells += 1;
                    self.fetch_srq(mem, now, qpn, Trigger::Doorbell);
                    return Ok(Vec::new());
                }
                self.qps.get(qpn).ok_or(Status::NotFound)?;
                let known = abi::DoorbellQueue::Sq as u32 | abi::DoorbellQueue::Rq as u32;
                if queues & !known != 0 {
                    return Err(Status::Invalid);
                }
                self.doorbells += 1;
                // Without an engine yet, the WQEs wait in the ring: they
                // are fetched when the engine starts.
                if queues & abi::DoorbellQueue::Sq as u32 != 0 {
                    self.fetch(mem, now, qpn, WorkQueue::Send, Trigger::Doorbell);
                }
                if queues & abi::DoorbellQueue::Rq as u32 != 0 {
                    self.fetch(mem, now, qpn, WorkQueue::Recv, Trigger::Doorbell);
                }
                Ok(Vec::new())
            }
            Request::Reset => {
                self.reset();
                Ok(Vec::new())
            }
            Request::Listen(a) => self.listen(&a),
            Request::Unlisten(a) => self.unlisten(&a),
            Request::Connect(a) => self.connect(now, &a),
            Request::Accept(a) => self.accept(mem, now, &a),
            Request::Reject(a) => self.reject(&a),
            Request::Disconnect(a) => self.disconnect(mem, now, &a),
            Request::CreateSrq(a) => self.create_srq(mem, &a),
            Request::ModifySrq(a) => self.modify_srq(&a),
            Request::QuerySrq { srqn } => self.query_srq(srqn),
            Request::DestroySrq { srqn } => self.destroy_srq(srqn),
            Request::ResizeSrq(a) => self.resize_srq(mem, &a),
            Request::PairQp(a) => self.pair_qp(mem, now, &a),
        }
    }
}
