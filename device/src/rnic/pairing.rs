//! QPs of this device connected by modify_qp (VT3_CMD_PAIR_QP), a vt3
//! extension for test suites and one-VM setups: rdma-core's tests/ connect
//! two RC QPs of one device by naming each other's QPN (RTR), then RTS,
//! without a CM. iWARP QPs run only over a connection, so once both asked
//! for each other the device makes one inside its TOE loopback, exactly as
//! an rdma_cm loopback connection (TCP, MPA, then RDMAP/DDP with every TPT
//! check): the QP that asked first listens on its port, the other connects
//! to it. From the accept on it is a connection like any other.
//!
//! Until then the pair is pending: it fails as a whole if either QP leaves
//! the attempt (destroyed, moved to ERROR), and the listening QP, which no
//! connection event would reach, gets VT3_QPE_RESET (the connecting one
//! gets its CONNECT_REPLY from the failed open, as any active open).

use std::net::SocketAddrV4;

use vm_memory::GuestMemory;
use vt3_iwarp::engine::{self, ConnId, ConnectParams, ConnectRequest};
use vt3_iwarp::toe::FourTuple;

use super::offload::status;
use super::{le, CmdResult, Instant, Rnic};
use crate::abi::{CmdPairQp, QpEvent, QpFlag, QpState, Status};

/// A QP's request for a connection to `peer`, from its own `port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairRequest {
    pub peer: u32,
    pub port: u16,
}

/// A pair whose connection is under way: `listener` listens on the port
/// this entry is filed under, `connector` connects from `connector_port`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PendingPair {
    pub listener: u32,
    pub connector: u32,
    pub connector_port: u16,
}

/// `detail` of the VT3_QPE_RESET a failed pair reports (as a reset received).
const PAIR_FAILED: u32 = 0;

impl Rnic {
    /// VT3_CMD_PAIR_QP: records the request, or starts the connection when
    /// the peer asked for this QP already.
    pub(super) fn pair_qp<M: GuestMemory>(&mut self, mem: &M, now: Instant, a: &CmdPairQp) -> CmdResult {
        let (qpn, peer) = (le(a.qpn), le(a.peer_qpn));
        let port = u16::from_be_bytes(a.port);
        if qpn == peer || port == 0 {
            return Err(Status::Invalid);
        }
        let offload = self.offload.as_ref().ok_or(Status::State)?;
        let pending = |q: u32| offload.pairs.values().any(|p| p.listener == q || p.connector == q);
        let (this, other) = (self.qps.get(qpn).ok_or(Status::NotFound)?, self.qps.get(peer).ok_or(Status::NotFound)?);
        let kernel = QpFlag::Kernel as u32;
        if this.flags & kernel != 0 || other.flags & kernel != 0 {
            return Err(Status::Invalid);
        }
        let free = |q: &super::Qp, n: u32| q.state == QpState::Idle && !q.connecting && !q.spent && !pending(n);
        if !free(this, qpn) || !free(other, peer) {
            return Err(Status::State);
        }
        match other.pair {
            Some(PairRequest { peer: asked, port: listen_port }) if asked == qpn => {
                self.start_pair(now, peer, listen_port, qpn, port)?;
                self.pump(now, mem);
            }
            _ => {
                if let Some(qp) = self.qps.get_mut(qpn) {
                    qp.pair = Some(PairRequest { peer, port });
                }
            }
        }
        Ok(Vec::new())
    }

    /// Listens on the first QP's port and connects the second to it.
    fn start_pair(
        &mut self,
        now: Instant,
        listener: u32,
        listen_port: u16,
        connector: u32,
        connector_port: u16,
    ) -> Result<(), Status> {
        let offload = self.offload.as_mut().ok_or(Status::State)?;
        let ip = offload.ip();
        if offload.pairs.contains_key(&listen_port) || listen_port == connector_port {
            return Err(Status::Busy);
        }
        offload.engine.listen(listen_port, 1).map_err(status)?;
        let params = ConnectParams {
            local_port: connector_port,
            remote: SocketAddrV4::new(ip, listen_port),
            // Our own address: the TOE keeps the connection inside.
            next_hop: offload.mac(),
            private_data: Vec::new(),
        };
        if let Err(e) = offload.engine.connect(now, connector, params) {
            offload.engine.unlisten(listen_port);
            return Err(status(e));
        }
        offload.pairs.insert(listen_port, PendingPair { listener, connector, connector_port });
        let (listen_end, connect_end) = (SocketAddrV4::new(ip, listen_port), SocketAddrV4::new(ip, connector_port));
        if let Some(qp) = self.qps.get_mut(connector) {
            qp.pair = None;
            qp.connecting = true;
            qp.conn_id = 0;
            qp.tuple = Some(FourTuple { local: connect_end, remote: listen_end });
        }
        if let Some(qp) = self.qps.get_mut(listener) {
            qp.pair = None;
            qp.conn_id = 0;
            qp.tuple = Some(FourTuple { local: listen_end, remote: connect_end });
        }
        Ok(())
    }

    /// A connection request on a pending pair's port: the connector's is
    /// accepted on the listener (ESTABLISHED follows from the engine), any
    /// other refused. Returns false if the port is no pair's.
    pub(super) fn pair_request(&mut self, now: Instant, conn: ConnId, request: &ConnectRequest) -> bool {
        let Some(offload) = self.offload.as_mut() else { return false };
        let port = request.tuple.local.port();
        let Some(pair) = offload.pairs.get(&port).copied() else { return false };
        if request.tuple.remote != SocketAddrV4::new(offload.ip(), pair.connector_port) {
            log::info!("connection request {:?} on QP {}'s pairing port refused", request.tuple, pair.listener);
            let _ = offload.engine.reject(conn, &[]);
            return true;
        }
        offload.pairs.remove(&port);
        let accepted = offload.engine.accept(now, conn, pair.listener, &[]);
        // Nothing else may come in; an unaccepted request is aborted, so
        // the connector learns it from its failed open.
        offload.engine.unlisten(port);
        if let Err(e) = accepted {
            log::warn!("QP {}: its pair's connection could not be accepted: {e}", pair.listener);
            self.fail_pair_listener(now, pair.listener);
        }
        true
    }

    /// Ends the pending pairs one of whose QPs left the attempt (destroyed,
    /// moved to ERROR, its open failed). Returns whether any ended.
    pub(super) fn end_broken_pairs(&mut self, now: Instant) -> bool {
        let Some(offload) = self.offload.as_ref() else { return false };
        let broken: Vec<(u16, PendingPair)> = offload
            .pairs
            .iter()
            .filter(|(_, p)| {
                let connecting = self.qps.get(p.connector).is_some_and(|qp| qp.connecting);
                let listening = self.qps.get(p.listener).is_some()
                    && offload.engine.qp_state(p.listener) == Some(engine::QpState::Idle);
                !(connecting && listening)
            })
            .map(|(&port, &p)| (port, p))
            .collect();
        for &(port, pair) in &broken {
            let Some(offload) = self.offload.as_mut() else { break };
            offload.pairs.remove(&port);
            offload.engine.unlisten(port);
            // Its CONNECT_REPLY (ECONNABORTED) follows from the engine.
            if self.qps.get(pair.connector).is_some_and(|qp| qp.connecting) {
                let _ = offload.engine.modify_qp(now, pair.connector, engine::QpState::Error);
            }
            if self.qps.get(pair.listener).is_some() {
                self.fail_pair_listener(now, pair.listener);
            }
        }
        !broken.is_empty()
    }

    /// The listening QP of a pair that never connected: to ERROR, with the
    /// reset that tells the driver (once: the pair is gone already).
    fn fail_pair_listener(&mut self, now: Instant, qpn: u32) {
        if let Some(offload) = self.offload.as_mut() {
            let _ = offload.engine.modify_qp(now, qpn, engine::QpState::Error);
        }
        self.qp_event(qpn, QpEvent::Reset, PAIR_FAILED);
    }

    /// The listeners of pending pairs (an engine replaced or abandoned
    /// takes them along; they are owed their reset).
    pub(super) fn pair_listeners(&self) -> Vec<u32> {
        self.offload.as_ref().map_or_else(Vec::new, |o| o.pairs.values().map(|p| p.listener).collect())
    }
}
