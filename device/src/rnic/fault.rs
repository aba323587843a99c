//! Fault injection (`vt3d ctl fault …`, docs/architecture.md §6): per
//! connection (the engine's [`Fault`]s, addressed by the guest's QP
//! number, or by what a user knows: a port, a peer, all connections, or
//! the next connection on a port), per memory region (invalidate an
//! STag), and for the whole device (VT3_EV_DEVICE_FATAL). Every injection is counted
//! ([`FaultStats`]) and answers with what it did, or why it could not.
//!
//! Events each fault produces (docs/vt3d-ctl.md has the full table):
//! `rst` → this QP VT3_QPE_RESET detail 1 (we sent it), the peer a reset;
//! `fin` → this QP CLOSING then VT3_QPE_CLOSE_COMPLETE, the peer
//! PEER_CLOSE; `blackhole` → VT3_QPE_TIMEOUT on both ends after the TCP
//! timeout; `corrupt-crc` → the peer detects the CRC error and sends
//! TERMINATE (VT3_QPE_TERMINATE_RECEIVED here); `terminate` →
//! VT3_QPE_TERMINATE_SENT here, TERMINATE received at the peer;
//! `invalidate-stag` → the peer's next access to it is a remote access
//! error we detect (VT3_QPE_TERMINATE_SENT, protection class);
//! `device-fatal` → VT3_EV_DEVICE_FATAL, every QP in ERROR;
//! `mute-commands` → no event: the driver's commands go unanswered (it
//! declares the device lost) while the data path runs on;
//! `lose-reply` → no event: one command is carried out and its answer
//! lost (the driver must treat the outcome as unknown).

use std::mem::offset_of;

use vm_memory::GuestMemory;
pub use vt3_iwarp::engine::Fault;
use vt3_iwarp::engine::{self, EngineError};
use vt3_iwarp::toe::Duration;

use super::memory::StatusWord;
use super::{Instant, Rnic};
use crate::abi::{self, Cmd, CqStatus, CqStatusFlag, EventType, QpState, Status};
use crate::control::Request;

/// Which connections a connection fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultTarget {
    /// The guest's QP number.
    Qp(u32),
    /// Every live connection with this port at either end.
    Port(u16),
    /// Every live connection to or from this address (and port).
    Peer(std::net::Ipv4Addr, Option<u16>),
    /// Every live connection.
    All,
}

impl std::fmt::Display for FaultTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Qp(n) => write!(f, "--qp {n}"),
            Self::Port(p) => write!(f, "--port {p}"),
            Self::Peer(a, None) => write!(f, "--peer {a}"),
            Self::Peer(a, Some(p)) => write!(f, "--peer {a}:{p}"),
            Self::All => write!(f, "--all"),
        }
    }
}

/// Faults armed at once, at most: each waits for a connection that may
/// never come.
pub const MAX_ARMED: usize = 64;

/// A fault waiting for the next connection with this port at either end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Armed {
    pub port: u16,
    pub fault: Fault,
}

/// `code` of the VT3_EV_DEVICE_FATAL event vt3d sends for
/// `vt3d ctl fault device-fatal` (`detail`: the number of QPs it ended).
pub const FATAL_INJECTED: u32 = 1;

/// Injections done (and refused), for `vt3d ctl stats`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultStats {
    pub rst: u64,
    pub fin: u64,
    pub blackhole: u64,
    pub drop: u64,
    pub delay: u64,
    pub split: u64,
    pub corrupt_crc: u64,
    pub terminate: u64,
    pub invalidate_stag: u64,
    pub device_fatal: u64,
    pub mute_commands: u64,
    /// Commands dropped unanswered while muted.
    pub muted_commands: u64,
    pub lose_reply: u64,
    /// Commands carried out whose reply was then dropped (`lose-reply`).
    pub lost_replies: u64,
    /// Requests refused (no such QP, not connected, bad code …).
    pub refused: u64,
}

impl FaultStats {
    pub fn rows(&self) -> [(&'static str, u64); 15] {
        [
            ("rst", self.rst),
            ("fin", self.fin),
            ("blackhole", self.blackhole),
            ("drop", self.drop),
            ("delay", self.delay),
            ("split", self.split),
            ("corrupt_crc", self.corrupt_crc),
            ("terminate", self.terminate),
            ("invalidate_stag", self.invalidate_stag),
            ("device_fatal", self.device_fatal),
            ("mute_commands", self.mute_commands),
            ("muted_commands", self.muted_commands),
            ("lose_reply", self.lose_reply),
            ("lost_replies", self.lost_replies),
            ("refused", self.refused),
        ]
    }

    fn count(&mut self, fault: &Fault) {
        let counter = match fault {
            Fault::SendRst => &mut self.rst,
            Fault::SendFin => &mut self.fin,
            Fault::Blackhole(_) => &mut self.blackhole,
            Fault::Drop { .. } => &mut self.drop,
            Fault::Delay(_) => &mut self.delay,
            Fault::Split(_) => &mut self.split,
            Fault::CorruptCrc => &mut self.corrupt_crc,
            Fault::Terminate(_) => &mut self.terminate,
        };
        *counter += 1;
    }
}

/// The device's fatal state (`fault device-fatal`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fatal {
    /// Requested by the management socket; carried out by the worker at
    /// its next engine run or command, whichever comes first (it needs
    /// guest memory for the status pages).
    Pending,
    /// Done: commands fail with VT3_ERR_STATE until VT3_CMD_RESET.
    Dead,
}

/// What an injection did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    /// One sentence: what was done and what the guest and the peer see.
    pub detail: String,
    /// The QP's state in the engine afterwards (QP faults).
    pub state: Option<&'static str>,
}

fn injected(detail: String, state: Option<engine::QpState>) -> Injected {
    Injected { detail, state: state.map(engine::QpState::name) }
}

/// Commands a dead device still answers: the teardown a driver does after
/// a fatal error (so rmmod and process exit work), queries, and RESET
/// (re-probe), which brings it back. `Some(result)`: answered here.
fn after_fatal(request: &Request) -> Option<Result<Vec<u8>, Status>> {
    match request {
        Request::QueryDevice
        | Request::QueryPort
        | Request::Reset
        | Request::DestroyQp { .. }
        | Request::DestroySrq { .. }
        | Request::DestroyCq { .. }
        | Request::DeregMr { .. }
        | Request::DeallocPd { .. } => None,
        // Nothing listens or connects any more: done already.
        Request::Unlisten(_) | Request::Disconnect(_) => Some(Ok(Vec::new())),
        // Every QP is in ERROR already.
        Request::ModifyQp(a) => {
            let to_error =
                a.mask.to_native() == abi::ModifyMask::State as u32 && a.state.to_native() == QpState::Error as u32;
            Some(if to_error { Ok(Vec::new()) } else { Err(Status::State) })
        }
        _ => Some(Err(Status::State)),
    }
}

impl Rnic {
    /// The TCP user timeout of connections (`vt3d serve --tcp-timeout`):
    /// applies to engines started from now on.
    pub fn set_tcp_timeout(&mut self, timeout: Duration) {
        self.tcp_timeout = timeout;
    }

    pub fn tcp_timeout(&self) -> Duration {
        self.tcp_timeout
    }

    pub fn fault_stats(&self) -> FaultStats {
        self.fault_stats
    }

    /// Counts a fault request refused before it reached the RNIC (bad
    /// arguments).
    pub fn count_refused(&mut self) {
        self.fault_stats.refused += 1;
    }

    /// Whether VT3_EV_DEVICE_FATAL was sent (or is about to be).
    pub fn fatal(&self) -> Option<Fatal> {
        self.fatal
    }

    /// The QPs a fault aimed at `target` hits: `--qp` names one (its own
    /// errors come from the injection); `--port`, `--peer` and `--all`
    /// match live connections (RTS or CLOSING) by their 4-tuple. None is
    /// an error that says what matched nothing.
    pub fn fault_targets(&self, target: FaultTarget) -> Result<Vec<u32>, String> {
        if let FaultTarget::Qp(qpn) = target {
            return Ok(vec![qpn]);
        }
        let hit: Vec<u32> = self
            .qps
            .iter()
            .filter(|(_, qp)| matches!(qp.state, QpState::Rts | QpState::Closing))
            .filter_map(|(qpn, qp)| {
                let tuple = self.qp_info(qpn).and_then(|i| i.tuple).or(qp.tuple)?;
                let matches = match target {
                    FaultTarget::Port(p) => tuple.local.port() == p || tuple.remote.port() == p,
                    FaultTarget::Peer(addr, port) => {
                        *tuple.remote.ip() == addr && port.is_none_or(|p| tuple.remote.port() == p)
                    }
                    FaultTarget::All => true,
                    FaultTarget::Qp(_) => false,
                };
                matches.then_some(qpn)
            })
            .collect();
        if hit.is_empty() {
            return Err(format!("no live connection matches {target}: nothing injected (vt3d ctl qps lists them)"));
        }
        Ok(hit)
    }

    /// `fault … --port P --arm`: the next connection with P at either end
    /// gets `fault` once it is established.
    pub fn arm_fault(&mut self, port: u16, fault: Fault) -> Result<Injected, String> {
        if self.armed.len() >= MAX_ARMED {
            self.fault_stats.refused += 1;
            return Err(format!("{MAX_ARMED} faults are armed already (each fires once)"));
        }
        self.armed.push(Armed { port, fault });
        Ok(injected(
            format!(
                "{} armed: the next connection with port {port} at either end gets it once established",
                fault.name()
            ),
            None,
        ))
    }

    /// Faults armed and not yet fired.
    pub fn armed(&self) -> &[Armed] {
        &self.armed
    }

    /// QP `qpn`'s connection is established: the first fault armed for
    /// one of its ports fires on it.
    pub(super) fn fire_armed(&mut self, now: Instant, qpn: u32) {
        let Some(tuple) = self.qp_info(qpn).and_then(|i| i.tuple) else { return };
        let ports = [tuple.local.port(), tuple.remote.port()];
        let Some(at) = self.armed.iter().position(|a| ports.contains(&a.port)) else { return };
        let armed = self.armed.remove(at);
        match self.inject(now, qpn, armed.fault) {
            Ok(done) => log::info!("armed fault fired on {tuple}: {}", done.detail),
            Err(e) => log::warn!("armed fault {} on {tuple} (QP {qpn}) failed: {e}", armed.fault.name()),
        }
    }

    /// Injects `fault` on QP `qpn`'s connection (the guest's QP number).
    pub fn inject(&mut self, now: Instant, qpn: u32, fault: Fault) -> Result<Injected, String> {
        let result = self.try_inject(now, qpn, fault);
        match &result {
            Ok(_) => self.fault_stats.count(&fault),
            Err(_) => self.fault_stats.refused += 1,
        }
        result
    }

    fn try_inject(&mut self, now: Instant, qpn: u32, fault: Fault) -> Result<Injected, String> {
        if self.fatal.is_some() {
            return Err("the device is in fatal error (reset it first)".into());
        }
        let timeout = self.tcp_timeout;
        self.qps.get(qpn).ok_or_else(|| format!("no QP {qpn}"))?;
        let offload =
            self.offload.as_mut().ok_or("no iWARP engine yet (the driver has not set the guest's address)")?;
        let engine = &mut offload.engine;
        let peer =
            engine.qp_info(qpn).and_then(|i| i.tuple).map_or_else(|| "the peer".to_owned(), |t| t.remote.to_string());
        engine.inject(now, qpn, fault).map_err(|e| match e {
            EngineError::InvalidState { state, what, .. } => format!("QP {qpn} is {state}: {what}"),
            other => other.to_string(),
        })?;
        let state = engine.qp_state(qpn);
        let detail = match fault {
            Fault::SendRst => format!(
                "QP {qpn}: RST sent to {peer}; QP -> ERROR, the driver gets VT3_QPE_RESET (detail 1: sent), \
                 the peer sees a reset"
            ),
            Fault::SendFin => format!(
                "QP {qpn}: FIN sent to {peer}; QP -> CLOSING, VT3_QPE_CLOSE_COMPLETE follows when the peer \
                 closes too (it sees PEER_CLOSE)"
            ),
            Fault::Blackhole(true) => format!(
                "QP {qpn}: every frame to and from {peer} is dropped; TCP times out within {} s \
                 (VT3_QPE_TIMEOUT) unless lifted with --off",
                timeout.secs()
            ),
            Fault::Blackhole(false) => format!("QP {qpn}: blackhole lifted"),
            Fault::Drop { percent: 0, .. } => format!("QP {qpn}: no longer dropping frames"),
            Fault::Drop { percent, seed } => {
                format!("QP {qpn}: dropping {percent}% of the frames to and from {peer} (seed {seed})")
            }
            Fault::Delay(None) => format!("QP {qpn}: frames no longer delayed"),
            Fault::Split(None) => format!("QP {qpn}: segments no longer split"),
            Fault::Split(Some(s)) => format!(
                "QP {qpn}: each data segment sent to {peer} leaves as two, its last {} octet(s) {} ms later",
                s.tail,
                s.hold.total_millis()
            ),
            Fault::Delay(Some(d)) => {
                format!("QP {qpn}: every frame sent to {peer} is held {} ms", d.total_millis())
            }
            Fault::CorruptCrc => format!(
                "QP {qpn}: the next FPDU sent to {peer} carries a bad CRC; the peer answers with TERMINATE \
                 LLP/0/0x02 (VT3_QPE_TERMINATE_RECEIVED here)"
            ),
            Fault::Terminate(code) => {
                let (l, t, c) = code.fields();
                format!(
                    "QP {qpn}: TERMINATE layer {l} etype {t} ecode {c:#04x} ({}) sent to {peer}; \
                     QP -> TERMINATE -> ERROR, the driver gets VT3_QPE_TERMINATE_SENT (detail {:#06x})",
                    code.description(),
                    u32::from(l) << 12 | u32::from(t) << 8 | u32::from(c)
                )
            }
        };
        Ok(injected(detail, state))
    }

    /// Invalidates STag `stag` as a Send with Invalidate would: every
    /// access through it fails from now on (the peer's RDMA WRITE or READ
    /// → a TERMINATE from us; local WQEs using it → LOC_PROT_ERR) until
    /// the region is deregistered.
    pub fn invalidate_stag(&mut self, stag: u32) -> Result<Injected, String> {
        let result = self.try_invalidate_stag(stag);
        match &result {
            Ok(_) => self.fault_stats.invalidate_stag += 1,
            Err(_) => self.fault_stats.refused += 1,
        }
        result
    }

    fn try_invalidate_stag(&mut self, stag: u32) -> Result<Injected, String> {
        if self.fatal.is_some() {
            return Err("the device is in fatal error (reset it first)".into());
        }
        let mr = self.tpt.get(stag).ok_or_else(|| format!("no MR with STag {stag:#x}"))?;
        if !mr.valid {
            return Err(format!("STag {stag:#x} is invalid already"));
        }
        let (pdn, iova, length) = (mr.pdn, mr.iova, mr.length);
        self.tpt.invalidate(stag, pdn).map_err(|e| format!("STag {stag:#x}: {e}"))?;
        Ok(injected(
            format!(
                "STag {stag:#x} (PD {pdn}, iova {iova:#x}, {length} octets) invalidated: the peer's next RDMA \
                 WRITE or READ on it fails, and this side sends TERMINATE (VT3_QPE_TERMINATE_SENT, \
                 DDP 1/1/0x00 or RDMAP 0/1/0x00)"
            ),
            None,
        ))
    }

    /// `fault device-fatal`: the worker moves every QP to ERROR (RST to
    /// every peer), flags the status pages and sends VT3_EV_DEVICE_FATAL
    /// (see [`Rnic::device_fatal`]).
    pub fn request_device_fatal(&mut self) -> Result<Injected, String> {
        let result = if self.fatal.is_some() {
            Err("the device is in fatal error already".to_owned())
        } else if self.driver_mac.is_none() {
            Err("no driver attached (no command received yet)".to_owned())
        } else {
            self.fatal = Some(Fatal::Pending);
            Ok(injected(
                format!(
                    "device fatal: {} QPs -> ERROR (RST to their peers), VT3_QP_F_ERROR and VT3_CQ_F_ERROR set in \
                     {} QP and {} CQ status pages, VT3_EV_DEVICE_FATAL (code {FATAL_INJECTED}) sent; commands \
                     fail with VT3_ERR_STATE until VT3_CMD_RESET",
                    self.qps.len(),
                    self.qps.len(),
                    self.cqs.len()
                ),
                None,
            ))
        };
        match &result {
            Ok(_) => self.fault_stats.device_fatal += 1,
            Err(_) => self.fault_stats.refused += 1,
        }
        result
    }

    /// `fault mute-commands`: until `now + for_`, commands that expect an
    /// answer are dropped (see [`Rnic::drops_command`]); zero lifts it.
    pub fn mute_commands(&mut self, now: Instant, for_: Duration) -> Result<Injected, String> {
        self.fault_stats.mute_commands += 1;
        if for_ == Duration::ZERO {
            self.muted_until = None;
            return Ok(injected("commands answered again".to_owned(), None));
        }
        self.muted_until = Some(now + for_);
        Ok(injected(
            format!(
                "commands dropped unanswered for {} ms (doorbells and CQ arming still work, the data path runs \
                 on): the driver's next command times out",
                for_.total_millis()
            ),
            None,
        ))
    }

    /// `fault lose-reply`: the next `cmd` is carried out and its reply
    /// dropped, once ([`Rnic::loses_reply`]): a mailbox that loses one
    /// answer. Doorbells and arming have no reply to lose; HELLO, PROVE and RESET
    /// are refused (they end the session's objects, which is not an
    /// unknown outcome the driver can keep memory for).
    pub fn lose_reply(&mut self, cmd: Cmd) -> Result<Injected, String> {
        if matches!(cmd, Cmd::Doorbell | Cmd::ArmCq | Cmd::Hello | Cmd::Prove | Cmd::Reset) {
            self.fault_stats.refused += 1;
            return Err(format!("{} has no reply lose-reply can drop", cmd.name()));
        }
        self.fault_stats.lose_reply += 1;
        self.lose_reply = Some(cmd);
        Ok(injected(
            format!(
                "the next {} is carried out and its reply dropped: the driver's command times out while vt3d \
                 answers its probes (outcome unknown)",
                cmd.name()
            ),
            None,
        ))
    }

    /// Whether the reply of `cmd`, just carried out, is to be dropped
    /// (`fault lose-reply`); clears the fault when it is.
    pub fn loses_reply(&mut self, cmd: Cmd) -> bool {
        if self.lose_reply != Some(cmd) {
            return false;
        }
        self.lose_reply = None;
        self.fault_stats.lost_replies += 1;
        true
    }

    /// Whether the command channel drops `cmd` at `now` (muted): what a
    /// hung command mailbox loses. Doorbells and arming are not answered
    /// anyway and stay served, so the data path goes on.
    pub fn drops_command(&mut self, now: Instant, cmd: Cmd) -> bool {
        let Some(until) = self.muted_until else { return false };
        if now >= until {
            self.muted_until = None;
            return false;
        }
        if matches!(cmd, Cmd::Doorbell | Cmd::ArmCq) {
            return false;
        }
        self.fault_stats.muted_commands += 1;
        true
    }

    /// Carries out a pending device fatal error, in the order `vt3_hw.h`
    /// documents for errors: CQEs already produced are written first, then
    /// every QP's error flag and every CQ's, then the event. Connections
    /// are reset (the RSTs leave at the next engine poll) and listeners
    /// dropped; the QPs' own end events are not sent (DEVICE_FATAL covers
    /// them).
    pub(super) fn device_fatal<M: GuestMemory>(&mut self, mem: &M, now: Instant) {
        if self.fatal != Some(Fatal::Pending) {
            return;
        }
        self.pump(now, mem);
        if let Some(offload) = self.offload.as_mut() {
            offload.abandon_all(now);
        }
        let qpns: Vec<u32> = self.qps.iter().map(|(qpn, _)| qpn).collect();
        for &qpn in &qpns {
            if let Some(qp) = self.qps.get_mut(qpn) {
                qp.connecting = false;
            }
            self.set_qp_state(mem, qpn, QpState::Error);
        }
        for (_, cq) in self.cqs.iter() {
            StatusWord::at(cq.status_addr, offset_of!(CqStatus, flags)).fetch_or(mem, CqStatusFlag::Error as u32);
        }
        let count = u32::try_from(qpns.len()).unwrap_or(u32::MAX);
        let body =
            abi::Event { handle: 0.into(), code: FATAL_INJECTED.into(), detail: count.into(), reserved: 0.into() };
        self.push_event(EventType::DeviceFatal, &body);
        self.fatal = Some(Fatal::Dead);
        log::warn!("device fatal error injected: {count} QPs in ERROR; commands refused until RESET");
    }

    /// The gate in front of every command once the device is fatal:
    /// `Some(answer)`, or `None` to run the command.
    pub(super) fn fatal_gate<M: GuestMemory>(
        &mut self,
        mem: &M,
        now: Instant,
        request: &Request,
    ) -> Option<Result<Vec<u8>, Status>> {
        self.fatal?;
        self.device_fatal(mem, now);
        after_fatal(request)
    }
}
