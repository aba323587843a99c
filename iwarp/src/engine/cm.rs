//! Connection management (Linux siw: siw_cm.c): listening ports and the
//! connections they accept, the active open, the MPA request and reply
//! with their private data on both sides, the ULP's accept or reject, and
//! the stream state a connection starts FPDU mode with.

use std::net::SocketAddrV4;

use super::event::{ConnectFailure, ConnectRequest, EventKind};
use super::qp::{connect_failed, set_state, Conn, Phase, Qp, QpState, Stream, TxCurrent};
use super::rx;
use super::{woken, ConnId, Engine, EngineConfig, EngineError, Outputs};
use crate::negotiation::{self, Initiator, InitiatorEvent, Negotiated, Responder, ResponderEvent};
use crate::stream::{emit_fpdu, FpduDeframer};
use crate::toe::{CloseReason, FourTuple, Instant, LinkStatus, MacAddr, TcpError, Transport};
use crate::wire::mpa::{self, mulpdu, Frame, MAX_FRAME_LEN, MAX_PRIVATE_DATA_LEN};

/// An active open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectParams {
    pub local_port: u16,
    pub remote: SocketAddrV4,
    /// L2 next hop: the peer's MAC, or the gateway's.
    pub next_hop: MacAddr,
    pub private_data: Vec<u8>,
}

/// A connection a listener accepted, waiting for its MPA request or for
/// the ULP's accept or reject.
#[derive(Debug)]
pub(super) struct Pending {
    responder: Box<Responder>,
    listen_port: u16,
    tuple: Option<FourTuple>,
    pub(super) deadline: Instant,
    pub(super) requested: bool,
}

impl<T: Transport> Engine<T> {
    /// Listens on `port` (backlog: see [`Transport::listen`]).
    pub fn listen(&mut self, port: u16, backlog: usize) -> Result<(), EngineError> {
        self.toe.listen(port, backlog)?;
        self.listeners.insert(port, backlog);
        Ok(())
    }

    /// Stops listening; requests not yet accepted are dropped.
    pub fn unlisten(&mut self, port: u16) {
        if self.listeners.remove(&port).is_none() {
            return;
        }
        self.toe.unlisten(port);
        let gone: Vec<ConnId> = self.pending.iter().filter(|(_, p)| p.listen_port == port).map(|(&id, _)| id).collect();
        for id in gone {
            if let Some(pending) = self.pending.remove(&id) {
                self.toe.abort(id.0);
                self.toe.release(id.0);
                if pending.requested {
                    self.out.conn_event(id, EventKind::ConnectWithdrawn);
                }
            }
        }
    }

    /// Active open for an IDLE QP: TCP, then the MPA request with
    /// `private_data`; [`EventKind::Established`] or
    /// [`EventKind::ConnectFailed`] follows.
    pub fn connect(&mut self, now: Instant, qpn: u32, params: ConnectParams) -> Result<(), EngineError> {
        let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        if qp.state != QpState::Idle || qp.conn.is_some() {
            return Err(EngineError::InvalidState { qpn, state: qp.state, what: "connect needs an idle QP" });
        }
        let room =
            MAX_PRIVATE_DATA_LEN - if qp.config.mpa.revision == mpa::REVISION_2 { mpa::ENHANCED_DATA_LEN } else { 0 };
        if params.private_data.len() > room {
            return Err(EngineError::PrivateDataTooLong(params.private_data.len()));
        }
        let initiator = Initiator::new(qp.config.mpa)?;
        let sock = self.toe.connect(now, params.local_port, params.remote, params.next_hop)?;
        self.by_sock.insert(sock, qpn);
        qp.conn = Some(Conn {
            sock,
            tuple: self.toe.tcb(sock).and_then(|tcb| tcb.tuple),
            phase: Phase::TcpConnecting { initiator: Box::new(initiator), private_data: params.private_data },
            deadline: None,
            fin_sent: false,
            deframer: None,
            stream: None,
        });
        qp.end_reported = false;
        Ok(())
    }

    /// Accepts a [`EventKind::ConnectRequest`] on IDLE QP `qpn`: sends the
    /// MPA reply with `private_data`; the QP goes to RTS (it sends nothing
    /// before the initiator's first FPDU, RFC 5044 §7.1.2).
    pub fn accept(&mut self, now: Instant, conn: ConnId, qpn: u32, private_data: &[u8]) -> Result<(), EngineError> {
        let _ = now;
        let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        if qp.state != QpState::Idle || qp.conn.is_some() {
            return Err(EngineError::InvalidState { qpn, state: qp.state, what: "accept needs an idle QP" });
        }
        let pending = self.pending.get(&conn).ok_or(EngineError::NoSuchConnection)?;
        if !pending.requested {
            return Err(EngineError::NoSuchConnection);
        }
        // Replay the request into a responder with this QP's settings (its
        // IRD/ORD are the ones the reply must announce).
        let mut request = [0u8; MAX_FRAME_LEN];
        let (request_len, peer_private) = match pending.responder.request() {
            Some(repr) => {
                repr.emit(&mut Frame::new_unchecked(&mut request[..])).map_err(negotiation::Error::from)?;
                (repr.buffer_len(), repr.private_data.to_vec())
            }
            None => return Err(EngineError::NoSuchConnection),
        };
        let mut responder = Responder::new(qp.config.mpa)?;
        let mut input = request.get(..request_len).unwrap_or(&[]);
        match responder.receive(&mut input)? {
            ResponderEvent::Request => {}
            _ => {
                return Err(EngineError::Negotiation(negotiation::Error::InvalidState(
                    "this QP's MPA settings cannot serve the request",
                )))
            }
        }
        let mut reply = [0u8; MAX_FRAME_LEN];
        let (reply_len, negotiated) = responder.accept(private_data, &mut reply)?;
        let sock = conn.0;
        let reply = reply.get(..reply_len).unwrap_or(&[]);
        if self.toe.send_space(sock) < reply.len() {
            return Err(EngineError::Transport(TcpError::InvalidState));
        }
        self.toe.send_slice(sock, reply)?;
        let pending = self.pending.remove(&conn).ok_or(EngineError::NoSuchConnection)?;
        let mss = self.toe.mss(sock);
        self.by_sock.insert(sock, qpn);
        qp.conn = Some(Conn {
            sock,
            tuple: pending.tuple,
            phase: Phase::Streaming,
            deadline: None,
            fin_sent: false,
            deframer: Some(FpduDeframer::new(self.config.max_rx_ulpdu, negotiated.crc)),
            stream: Some(new_stream(negotiated, false, mss, None)),
        });
        qp.end_reported = false;
        self.out.stats.connections_established += 1;
        set_state(qp, &mut self.out, QpState::Rts);
        self.out.qp_event(qpn, EventKind::Established { negotiated, private_data: peer_private });
        Ok(())
    }

    /// Rejects a [`EventKind::ConnectRequest`]: MPA reply with R set, then FIN.
    pub fn reject(&mut self, conn: ConnId, private_data: &[u8]) -> Result<(), EngineError> {
        let pending = self.pending.get_mut(&conn).ok_or(EngineError::NoSuchConnection)?;
        if !pending.requested {
            return Err(EngineError::NoSuchConnection);
        }
        let mut reply = [0u8; MAX_FRAME_LEN];
        let len = pending.responder.reject(private_data, &mut reply)?;
        let _ = self.toe.send_slice(conn.0, reply.get(..len).unwrap_or(&[]));
        self.toe.close(conn.0);
        self.toe.release(conn.0);
        self.pending.remove(&conn);
        Ok(())
    }

    pub(super) fn accept_connections(&mut self, now: Instant) {
        let mut next = self.listeners.keys().next().copied();
        while let Some(port) = next {
            while self.pending.len() < self.config.max_pending {
                let Some(sock) = self.toe.accept(port) else {
                    break;
                };
                let Ok(responder) = Responder::new(self.config.listen_mpa) else {
                    self.toe.abort(sock);
                    self.toe.release(sock);
                    continue;
                };
                let tuple = self.toe.tcb(sock).and_then(|tcb| tcb.tuple);
                self.pending.insert(
                    ConnId(sock),
                    Pending {
                        responder: Box::new(responder),
                        listen_port: port,
                        tuple,
                        deadline: now + self.config.mpa_timeout,
                        requested: false,
                    },
                );
            }
            next = port.checked_add(1).and_then(|from| self.listeners.range(from..).next().map(|(&p, _)| p));
        }
    }

    pub(super) fn service_pending(&mut self, now: Instant) {
        let ids: Vec<ConnId> = self.pending.keys().copied().collect();
        for id in ids {
            let Some(pending) = self.pending.get_mut(&id) else {
                continue;
            };
            let sock = id.0;
            enum Outcome {
                Request,
                Refused(negotiation::Refusal),
                Failed,
            }
            let mut outcome = None;
            if !pending.requested {
                let responder = &mut pending.responder;
                let _ = self.toe.recv(sock, &mut |data| {
                    if outcome.is_some() {
                        return 0;
                    }
                    let mut input = data;
                    match responder.receive(&mut input) {
                        Ok(ResponderEvent::Pending) => {}
                        Ok(ResponderEvent::Request) => outcome = Some(Outcome::Request),
                        Ok(ResponderEvent::Refused(refusal)) => outcome = Some(Outcome::Refused(refusal)),
                        Err(_) => outcome = Some(Outcome::Failed),
                    }
                    data.len() - input.len()
                });
            }
            let tuple = pending.tuple;
            match outcome {
                Some(Outcome::Request) => {
                    pending.requested = true;
                    if let Some(repr) = pending.responder.request() {
                        let request = ConnectRequest {
                            listen_port: pending.listen_port,
                            tuple: tuple.unwrap_or(FourTuple {
                                local: SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
                                remote: SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0),
                            }),
                            revision: repr.revision,
                            crc: repr.crc,
                            ird: repr.enhanced.map(|e| e.ird),
                            ord: repr.enhanced.map(|e| e.ord),
                            peer_to_peer: repr.enhanced.is_some_and(|e| e.peer_to_peer),
                            private_data: repr.private_data.to_vec(),
                        };
                        self.out.conn_event(id, EventKind::ConnectRequest(request));
                    }
                }
                Some(Outcome::Refused(refusal)) => {
                    let mut reply = [0u8; MAX_FRAME_LEN];
                    if let Ok(len) = pending.responder.reject(&[], &mut reply) {
                        let _ = self.toe.send_slice(sock, reply.get(..len).unwrap_or(&[]));
                    }
                    self.toe.close(sock);
                    self.toe.release(sock);
                    self.pending.remove(&id);
                    self.out.stats.connections_refused += 1;
                    self.out.conn_event(id, EventKind::ConnectRefused { tuple, refusal: Some(refusal) });
                    continue;
                }
                Some(Outcome::Failed) => {
                    self.toe.abort(sock);
                    self.toe.release(sock);
                    self.pending.remove(&id);
                    self.out.stats.connections_refused += 1;
                    self.out.conn_event(id, EventKind::ConnectRefused { tuple, refusal: None });
                    continue;
                }
                None => {}
            }
            let Some(pending) = self.pending.get(&id) else {
                continue;
            };
            let gone = matches!(self.toe.status(sock), None | Some(LinkStatus::Closed(_) | LinkStatus::PeerClosed));
            let late = !pending.requested && now >= pending.deadline;
            if gone || late {
                let requested = pending.requested;
                self.toe.abort(sock);
                self.toe.release(sock);
                self.pending.remove(&id);
                if requested {
                    self.out.conn_event(id, EventKind::ConnectWithdrawn);
                }
            }
        }
    }
}

/// The active open's MPA request, once TCP is up. Whether the QP's poll
/// goes on: not without a connection, while TCP still connects, nor once
/// the connect failed.
pub(super) fn send_mpa_request<T: Transport>(
    qp: &mut Qp,
    toe: &mut T,
    out: &mut Outputs,
    now: Instant,
    config: &EngineConfig,
) -> bool {
    let Some(conn) = qp.conn.as_mut() else { return false };
    let sock = conn.sock;
    if let Phase::TcpConnecting { initiator, private_data } = &mut conn.phase {
        match toe.status(sock) {
            Some(LinkStatus::Connecting) => return false,
            Some(LinkStatus::Established | LinkStatus::PeerClosed) => {
                let mut request = [0u8; MAX_FRAME_LEN];
                let written = initiator
                    .write_request(private_data, &mut request)
                    .ok()
                    .and_then(|len| request.get(..len))
                    .filter(|req| toe.send_space(sock) >= req.len())
                    .map(|req| toe.send_slice(sock, req));
                match written {
                    Some(Ok(_)) => {
                        let Phase::TcpConnecting { initiator, .. } =
                            core::mem::replace(&mut conn.phase, Phase::Streaming)
                        else {
                            return false;
                        };
                        conn.phase = Phase::AwaitReply { initiator };
                        conn.deadline = Some(now + config.mpa_timeout);
                        conn.tuple = toe.tcb(sock).and_then(|tcb| tcb.tuple);
                    }
                    _ => {
                        connect_failed(qp, toe, out, ConnectFailure::Tcp(CloseReason::Aborted), true);
                        return false;
                    }
                }
            }
            Some(LinkStatus::Closed(reason)) => {
                connect_failed(qp, toe, out, ConnectFailure::Tcp(reason), false);
                return false;
            }
            Some(LinkStatus::Closing) | None => {
                connect_failed(qp, toe, out, ConnectFailure::Tcp(CloseReason::Aborted), true);
                return false;
            }
        }
    }
    true
}

/// The MPA reply to our request: the QP goes to RTS, or the connect
/// fails. Whether FPDUs may follow: not without a connection, before the
/// whole reply, nor after a rejection or a bad reply.
pub(super) fn receive_mpa_reply<T: Transport>(
    qp: &mut Qp,
    toe: &mut T,
    out: &mut Outputs,
    now: Instant,
    config: &EngineConfig,
) -> bool {
    let Some(conn) = qp.conn.as_mut() else { return false };
    let sock = conn.sock;
    if let Phase::AwaitReply { initiator } = &mut conn.phase {
        enum Reply {
            Up(Negotiated, Vec<u8>),
            Rejected(Vec<u8>),
            Failed(negotiation::Error),
        }
        let mut reply = None;
        let _ = toe.recv(sock, &mut |data| {
            if reply.is_some() {
                return 0;
            }
            let mut input = data;
            match initiator.receive(&mut input) {
                Ok(InitiatorEvent::Pending) => {}
                Ok(InitiatorEvent::Established { negotiated, private_data }) => {
                    reply = Some(Reply::Up(negotiated, private_data.to_vec()))
                }
                Ok(InitiatorEvent::Rejected { private_data }) => {
                    reply = Some(Reply::Rejected(private_data.to_vec()));
                }
                Err(error) => reply = Some(Reply::Failed(error)),
            }
            data.len() - input.len()
        });
        match reply {
            None => return false,
            Some(Reply::Rejected(private_data)) => {
                connect_failed(qp, toe, out, ConnectFailure::Rejected { private_data }, false);
                return false;
            }
            Some(Reply::Failed(error)) => {
                if let Some(code) = error.term_code() {
                    // MPA is in FPDU mode after a reply: say why we leave.
                    let term = rx::terminate_message(1, code, None);
                    let mut fpdu = [0u8; 96];
                    let crc = qp.config.mpa.crc;
                    if let Some(ulpdu) = term.ulpdu.get(..term.len) {
                        if let Ok(len) = emit_fpdu(ulpdu, crc, &mut fpdu) {
                            let _ = toe.send_slice(sock, fpdu.get(..len).unwrap_or(&[]));
                            out.stats.terminates_tx += 1;
                        }
                    }
                }
                connect_failed(qp, toe, out, ConnectFailure::Mpa(error), false);
                return false;
            }
            Some(Reply::Up(negotiated, private_data)) => {
                let mss = toe.mss(sock);
                conn.phase = Phase::Streaming;
                conn.deadline = None;
                conn.deframer = Some(FpduDeframer::new(config.max_rx_ulpdu, negotiated.crc));
                let hold = negotiated.rtr.map(|_| now + config.rtr_hold);
                conn.stream = Some(new_stream(negotiated, true, mss, hold));
                out.stats.connections_established += 1;
                set_state(qp, out, QpState::Rts);
                out.qp_event(qp.qpn, EventKind::Established { negotiated, private_data });
            }
        }
    }
    true
}

fn new_stream(negotiated: Negotiated, initiator: bool, mss: u16, tx_hold: Option<Instant>) -> Stream {
    Stream {
        negotiated,
        mulpdu: mulpdu(mss).max(64),
        tx_ready: initiator,
        tx_hold,
        rtr_out: if initiator { negotiated.rtr } else { None },
        rtr_in: if initiator { None } else { negotiated.rtr },
        tx_msn: [1; 3],
        tx_current: TxCurrent::Idle,
        prefer_sq: false,
        rx_msn: [1; 3],
        rx_send: None,
        rx_tagged: None,
        rx_stopped: false,
        terminate_out: None,
        corrupt_crc: false,
        scratch: Vec::new(),
    }
}
