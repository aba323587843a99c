//! Fault injection (`vt3d ctl fault …`): the faults and the entry point
//! that applies one to a QP's connection, through the TOE's per-socket
//! faults or the QP transitions of qp.rs. Linux siw has no counterpart.

use super::event::{ConnectFailure, EventKind};
use super::qp::{connect_failed, local_terminate, set_state, Phase, QpState};
use super::{woken, Engine, EngineError};
use crate::toe::{CloseReason, Duration, Instant, Link, LinkFault, SocketId, Split, Transport};
use crate::wire::terminate::TermCode;

/// Fault injection (`vt3d ctl fault …`), on one QP's connection.
///
/// What each produces (both ends vt3 engines; docs/architecture.md §5):
///
/// | fault | this QP | the peer's QP |
/// |---|---|---|
/// | `SendRst` | [`EventKind::ResetSent`], ERROR | [`EventKind::Reset`], ERROR |
/// | `SendFin` | CLOSING, later [`EventKind::CloseComplete`] | [`EventKind::PeerClose`], CLOSING, [`EventKind::CloseComplete`] |
/// | `Blackhole(true)` | [`EventKind::Timeout`] after the TCP timeout | the same, if its TCP times out |
/// | `Drop` / `Delay` | nothing by itself (TCP retransmits; RTT grows) | the same |
/// | `Split` | nothing (the stream is the same) | nothing, if its MPA reassembly takes an FPDU in any cut |
/// | `CorruptCrc` | [`EventKind::TerminateReceived`] (LLP 2/0/02) | [`EventKind::LocalError`] (`Crc`), TERMINATE sent |
/// | `Terminate(code)` | [`EventKind::LocalError`] (`Injected`, `code`) | [`EventKind::TerminateReceived`] (`code`) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Abort the connection: RST to the peer, QP → ERROR.
    SendRst,
    /// Close our half (FIN) as a graceful disconnect would.
    SendFin,
    /// Drop every frame of the connection both ways (→ timeout), or stop.
    Blackhole(bool),
    /// Drop `percent` % of the connection's frames both ways, drawn from a
    /// PRNG seeded with `seed` (deterministic); 0 stops.
    Drop { percent: u8, seed: u64 },
    /// Hold every frame the connection sends this long (`None`: stop).
    Delay(Option<Duration>),
    /// Send each data segment as two, the tail held back ([`Split`];
    /// `None`: stop).
    Split(Option<Split>),
    /// Corrupt the CRC of the next FPDU we send (CRC must be negotiated).
    CorruptCrc,
    /// Send a TERMINATE with this code; QP → TERMINATE → ERROR.
    Terminate(TermCode),
}

impl Fault {
    /// A short name (`vt3d ctl fault NAME`).
    pub fn name(&self) -> &'static str {
        match self {
            Fault::SendRst => "rst",
            Fault::SendFin => "fin",
            Fault::Blackhole(_) => "blackhole",
            Fault::Drop { .. } => "drop",
            Fault::Delay(_) => "delay",
            Fault::Split(_) => "split",
            Fault::CorruptCrc => "corrupt-crc",
            Fault::Terminate(_) => "terminate",
        }
    }
}

impl<T: Transport> Engine<T> {
    /// Fault injection on a QP's connection (see [`Fault`] for the events
    /// each one produces). Errors: no such QP, no connection (or not in a
    /// state the fault applies to), no CRC to corrupt.
    pub fn inject(&mut self, now: Instant, qpn: u32, fault: Fault) -> Result<(), EngineError> {
        let linger = self.config.terminate_linger;
        let qp = woken(&mut self.qps, &mut self.active, qpn).ok_or(EngineError::NoSuchQp(qpn))?;
        let not_connected = EngineError::InvalidState { qpn, state: qp.state, what: "not connected" };
        let sock = qp.conn.as_ref().ok_or(not_connected)?.sock;
        let streaming = qp.conn.as_ref().is_some_and(|conn| matches!(conn.phase, Phase::Streaming));
        match fault {
            Fault::SendRst => {
                if !streaming {
                    // Still connecting: the active open fails (aborted).
                    connect_failed(qp, &mut self.toe, &mut self.out, ConnectFailure::Tcp(CloseReason::Aborted), true);
                    return Ok(());
                }
                if let Some(conn) = qp.conn.take() {
                    self.toe.abort(conn.sock);
                    self.toe.release(conn.sock);
                }
                if !qp.end_reported {
                    qp.end_reported = true;
                    self.out.qp_event(qpn, EventKind::ResetSent);
                }
                set_state(qp, &mut self.out, QpState::Error);
            }
            Fault::SendFin => {
                if qp.state != QpState::Rts || !streaming {
                    return Err(EngineError::InvalidState {
                        qpn,
                        state: qp.state,
                        what: "a FIN needs a connected QP in RTS",
                    });
                }
                self.toe.close(sock);
                if let Some(conn) = qp.conn.as_mut() {
                    conn.fin_sent = true;
                }
                set_state(qp, &mut self.out, QpState::Closing);
            }
            Fault::Blackhole(on) => link_fault(&mut self.toe, now, qpn, sock, LinkFault::Blackhole(on))?,
            Fault::Drop { percent, seed } => {
                if percent > 100 {
                    return Err(EngineError::Config("drop percentage above 100"));
                }
                link_fault(&mut self.toe, now, qpn, sock, LinkFault::Drop { percent, seed })?;
            }
            Fault::Delay(delay) => link_fault(&mut self.toe, now, qpn, sock, LinkFault::Delay(delay))?,
            Fault::Split(split) => link_fault(&mut self.toe, now, qpn, sock, LinkFault::Split(split))?,
            Fault::CorruptCrc => {
                let stream = qp
                    .conn
                    .as_mut()
                    .and_then(|conn| conn.stream.as_mut())
                    .filter(|_| matches!(qp.state, QpState::Rts | QpState::Closing))
                    .ok_or(not_connected)?;
                if !stream.negotiated.crc {
                    return Err(EngineError::FaultNotApplicable {
                        qpn,
                        what: "CRC was not negotiated on this connection",
                    });
                }
                stream.corrupt_crc = true;
            }
            Fault::Terminate(code) => {
                if !streaming || !matches!(qp.state, QpState::Rts | QpState::Closing) {
                    return Err(not_connected);
                }
                local_terminate(qp, &mut self.toe, &mut self.out, now, linger, code);
            }
        }
        Ok(())
    }
}

/// A fault on the frames of `qpn`'s connection (`sock`), set on the link.
fn link_fault<T: Transport>(
    link: &mut Link<T>,
    now: Instant,
    qpn: u32,
    sock: SocketId,
    fault: LinkFault,
) -> Result<(), EngineError> {
    link.set_fault(now, sock, fault)
        .map_err(|_| EngineError::FaultNotApplicable { qpn, what: "the connection has no 4-tuple yet" })
}
