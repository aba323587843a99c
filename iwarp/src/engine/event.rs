//! Engine events (the device turns them into `vt3_event`s and iw_cm
//! events, docs/architecture.md §5) and the protocol errors the engine
//! detects.

use thiserror::Error;

use super::memory::AccessError;
use super::qp::QpState;
use super::wr::WcStatus;
use super::ConnId;
use crate::negotiation::{self, Negotiated, Refusal};
use crate::toe::{CloseReason, FourTuple};
use crate::wire::terminate::{ErrorClass, TermCode};
use crate::wire::{mpa, rdmap};

/// A protocol error detected on a connection. The engine answers each with
/// a TERMINATE ([`ProtocolError::term_code`]) and moves the QP to
/// TERMINATE, then ERROR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ProtocolError {
    /// FPDU CRC mismatch.
    #[error("MPA CRC error")]
    Crc,
    /// MPA framing lost (an FPDU longer than we accept).
    #[error("MPA framing: {0}")]
    Framing(mpa::Error),
    /// DDP/RDMAP header: version, opcode, queue number, truncation.
    #[error("bad DDP/RDMAP header: {0}")]
    Header(rdmap::Error),
    /// An inbound RDMA WRITE refused by the TPT.
    #[error("RDMA WRITE sink: {0}")]
    WriteAccess(AccessError),
    /// Tagged offset plus length overflows 64 bits.
    #[error("tagged offset wraps")]
    TaggedOffsetWrap,
    /// A later segment of a tagged message changed STag or skipped offsets.
    #[error("tagged message continuity broken (STag changed: {stag_changed})")]
    TaggedDiscontinuity { stag_changed: bool },
    /// A Read Response with no RDMA READ outstanding.
    #[error("RDMA Read Response without an outstanding READ")]
    UnexpectedReadResponse,
    /// A Read Response for another STag, offset or length than requested.
    #[error("RDMA Read Response does not match the READ (STag mismatch: {stag_mismatch})")]
    ReadResponseMismatch { stag_mismatch: bool },
    /// Our own READ sink buffer refused by the TPT.
    #[error("READ sink buffer: {0}")]
    ReadSinkAccess(AccessError),
    /// A Send arrived and no receive WQE was posted.
    #[error("no receive WQE posted")]
    NoRecvWqe,
    /// Untagged MSN other than the next expected one.
    #[error("MSN {got} on queue {queue}, expected {expected}")]
    MsnGap { queue: u32, expected: u32, got: u32 },
    /// Untagged message offset other than the bytes received so far.
    #[error("message offset {got}, expected {expected}")]
    MoMismatch { expected: u32, got: u32 },
    /// A Send longer than the posted receive buffers.
    #[error("Send longer than the receive buffers")]
    MessageTooLong,
    /// The receive WQE's buffers refused by the TPT (a bad local WQE).
    #[error("receive buffer: {0}")]
    RecvBufferAccess(AccessError),
    /// A translated address outside guest RAM.
    #[error("guest memory access failed")]
    GuestMemory,
    /// Send with Invalidate naming an STag we may not invalidate.
    #[error("cannot invalidate the STag: {0}")]
    CannotInvalidate(AccessError),
    /// More RDMA Read Requests outstanding than our IRD.
    #[error("RDMA Read Request beyond IRD {ird}")]
    ReadBeyondIrd { ird: u16 },
    /// A Read Request segment of the wrong length, or not a single segment.
    #[error("malformed RDMA Read Request ({0} octets)")]
    ReadRequestLength(usize),
    /// The source of an inbound READ refused by the TPT.
    #[error("RDMA READ source: {0}")]
    ReadSourceAccess(AccessError),
    /// Source offset plus size overflows.
    #[error("RDMA READ source offset wraps")]
    ReadSourceWrap,
    /// Fault injection: a TERMINATE with a chosen code.
    #[error("injected TERMINATE")]
    Injected,
}

/// siw's mapping of a TPT refusal of a tagged placement to a DDP code
/// (RFC 5041 has no code for rights; siw reports "invalid STag").
fn tagged_code(error: AccessError) -> TermCode {
    match error {
        AccessError::InvalidStag | AccessError::Rights => TermCode::DdpTaggedInvalidStag,
        AccessError::Bounds => TermCode::DdpTaggedBaseOrBoundsViolation,
        AccessError::WrongPd | AccessError::WrongQp => TermCode::DdpTaggedStagNotAssociated,
    }
}

/// The RDMAP remote protection code for a refused READ source.
fn rdmap_code(error: AccessError) -> TermCode {
    match error {
        AccessError::InvalidStag => TermCode::RdmapInvalidStag,
        AccessError::Bounds => TermCode::RdmapBaseOrBoundsViolation,
        AccessError::Rights => TermCode::RdmapAccessRightsViolation,
        AccessError::WrongPd | AccessError::WrongQp => TermCode::RdmapStagNotAssociated,
    }
}

impl ProtocolError {
    /// The TERMINATE code we send for it (siw's choices where the RFCs
    /// leave room, so vt3 and siw report the same errors the same way).
    pub fn term_code(&self) -> TermCode {
        match *self {
            ProtocolError::Crc => TermCode::LlpCrcError,
            ProtocolError::Framing(error) => error.term_code(),
            ProtocolError::Header(error) => error.term_code(),
            ProtocolError::WriteAccess(error) | ProtocolError::ReadSinkAccess(error) => tagged_code(error),
            ProtocolError::TaggedOffsetWrap => TermCode::DdpTaggedToWrap,
            ProtocolError::TaggedDiscontinuity { stag_changed: true }
            | ProtocolError::ReadResponseMismatch { stag_mismatch: true } => TermCode::DdpTaggedInvalidStag,
            ProtocolError::TaggedDiscontinuity { stag_changed: false }
            | ProtocolError::ReadResponseMismatch { stag_mismatch: false } => TermCode::DdpTaggedBaseOrBoundsViolation,
            ProtocolError::UnexpectedReadResponse => TermCode::RdmapUnexpectedOpcode,
            ProtocolError::NoRecvWqe => TermCode::DdpUntaggedInvalidMsnNoBuffer,
            ProtocolError::MsnGap { .. } => TermCode::DdpUntaggedInvalidMsnRange,
            ProtocolError::MoMismatch { .. } => TermCode::DdpUntaggedInvalidMo,
            ProtocolError::MessageTooLong => TermCode::DdpUntaggedMessageTooLong,
            ProtocolError::RecvBufferAccess(_) | ProtocolError::GuestMemory => TermCode::DdpLocalCatastrophic,
            // siw's split: an STag naming nothing is an operation error,
            // one the peer may not touch (another PD's, an ordinary MR) a
            // protection error.
            ProtocolError::CannotInvalidate(AccessError::InvalidStag | AccessError::Bounds) => {
                TermCode::RdmapOperationStagCannotBeInvalidated
            }
            ProtocolError::CannotInvalidate(AccessError::WrongPd | AccessError::WrongQp | AccessError::Rights) => {
                TermCode::RdmapProtectionStagCannotBeInvalidated
            }
            ProtocolError::ReadBeyondIrd { .. } => TermCode::RdmapCatastrophicStream,
            ProtocolError::ReadRequestLength(len) if len > rdmap::READ_REQUEST_LEN => {
                TermCode::DdpUntaggedMessageTooLong
            }
            ProtocolError::ReadRequestLength(_) => TermCode::RdmapCatastrophicStream,
            ProtocolError::ReadSourceAccess(error) => rdmap_code(error),
            ProtocolError::ReadSourceWrap => TermCode::RdmapToWrap,
            ProtocolError::Injected => TermCode::RdmapLocalCatastrophic,
        }
    }

    /// The verbs event for a locally detected error, as iw_cxgb3 mapped
    /// its TPT errors: STag, PD, rights, bounds, wrap and invalidation
    /// errors → `Protection` (IB_EVENT_QP_ACCESS_ERR); everything else →
    /// `Catastrophic` (IB_EVENT_QP_FATAL).
    pub fn class(&self) -> ErrorClass {
        match self {
            ProtocolError::WriteAccess(_)
            | ProtocolError::ReadSinkAccess(_)
            | ProtocolError::ReadSourceAccess(_)
            | ProtocolError::RecvBufferAccess(_)
            | ProtocolError::TaggedOffsetWrap
            | ProtocolError::TaggedDiscontinuity { .. }
            | ProtocolError::ReadResponseMismatch { .. }
            | ProtocolError::ReadSourceWrap
            | ProtocolError::CannotInvalidate(_) => ErrorClass::Protection,
            _ => ErrorClass::Catastrophic,
        }
    }
}

/// Why an active open or MPA exchange failed before RTS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConnectFailure {
    /// The responder's ULP rejected us (MPA reply with R set).
    Rejected { private_data: Vec<u8> },
    /// TCP refused, reset, timed out, or closed before the reply.
    Tcp(CloseReason),
    /// The peer closed (FIN) during the MPA exchange.
    PeerClosed,
    /// No MPA reply within the MPA timeout.
    MpaTimeout,
    /// The reply was invalid or unacceptable.
    Mpa(negotiation::Error),
}

/// A connection request waiting for the ULP (iw_cm CONNECT_REQUEST).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    pub listen_port: u16,
    pub tuple: FourTuple,
    pub revision: u8,
    pub crc: bool,
    /// RFC 6581 data of the request, if any.
    pub ird: Option<u16>,
    pub ord: Option<u16>,
    pub peer_to_peer: bool,
    pub private_data: Vec<u8>,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventKind {
    /// A connection request arrived on a listening port: accept or reject it.
    ConnectRequest(ConnectRequest),
    /// A request we refused by ourselves (markers, no acceptable RTR, or a
    /// malformed request): informational.
    ConnectRefused { tuple: Option<FourTuple>, refusal: Option<Refusal> },
    /// A [`EventKind::ConnectRequest`] not yet answered went away.
    ConnectWithdrawn,
    /// The connection is up and the QP in RTS (iw_cm ESTABLISHED, or
    /// CONNECT_REPLY on the active side). `private_data`: the peer's.
    Established { negotiated: Negotiated, private_data: Vec<u8> },
    /// The active open failed (CONNECT_REPLY with an error); QP → ERROR.
    ConnectFailed(ConnectFailure),
    /// Every QP state change.
    StateChanged { from: QpState, to: QpState },
    /// The peer's FIN arrived while RTS: QP → CLOSING (iw_cm DISCONNECT).
    PeerClose,
    /// The graceful close completed (LLP Close Complete); the QP goes to
    /// IDLE, or to ERROR when send WQEs were still outstanding.
    CloseComplete { sq_outstanding: bool },
    /// An RST ended the connection: QP → ERROR (QP_FATAL, -ECONNRESET).
    Reset,
    /// Retransmission or keep-alive timeout: QP → ERROR (QP_FATAL, -ETIMEDOUT).
    Timeout,
    /// The peer sent a TERMINATE: QP → TERMINATE → ERROR. `class` picks
    /// the verbs event.
    TerminateReceived { code: TermCode, class: ErrorClass },
    /// We detected `error` and sent a TERMINATE with `sent`: QP → TERMINATE → ERROR.
    LocalError { error: ProtocolError, sent: TermCode },
    /// A bad local WQE (SGE, lkey, opcode): its completion carries
    /// `status`; QP → ERROR (QP_REQ_ERR). A TERMINATE (local catastrophic)
    /// goes to the peer.
    WqeError { wr_id: u64, status: WcStatus },
    /// The host moved the QP to ERROR while connected: an RST went out.
    Aborted,
    /// Fault injection ([`super::Fault::SendRst`]): we sent an RST the ULP
    /// did not ask for; QP → ERROR (reported like a reset: QP_FATAL,
    /// -ECONNRESET).
    ResetSent,
}

/// An event about a QP (`qpn`) or a not-yet-accepted connection (`conn`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub qpn: Option<u32>,
    pub conn: Option<ConnId>,
    pub kind: EventKind,
}
