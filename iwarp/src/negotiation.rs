//! MPA connection setup (RFC 5044 §7.1, RFC 6581) as two state machines
//! driven only by bytes: an [`Initiator`] (active side) and a [`Responder`]
//! (passive side). They read from `&mut &[u8]` cursors, consuming exactly
//! the request/reply frame so that whatever follows belongs to the FPDU
//! stream, and write their frames into caller-provided buffers. Timers
//! (the MPA timeout) belong to the caller.
//!
//! Rules implemented:
//!
//! * Revision: the initiator offers its highest revision; the responder
//!   answers with the lower of both. A reply with a higher revision than
//!   requested is an error; a revision 1 reply to a revision 2 request
//!   falls back to revision 1 (no IRD/ORD exchange, no RTR).
//! * CRC: used when either frame sets C (RFC 5044: "When this field is '1'
//!   in either the MPA Request Frame or MPA Reply Frame, CRCs MUST be
//!   generated and checked by both endpoints").
//! * Markers: not implemented. A request asking for them is refused with a
//!   reject reply; a reply asking for them fails the initiator.
//! * Private data: at most 512 octets on the wire, the 4-octet RFC 6581
//!   block included.
//! * IRD/ORD (revision 2): the responder answers with its IRD and an ORD
//!   limited to the initiator's IRD; the initiator limits its ORD to the
//!   responder's IRD and fails with "insufficient IRD" if the responder's
//!   ORD exceeds its own IRD.
//! * Peer-to-peer (revision 2): the initiator offers RTR messages (it asks
//!   for peer-to-peer only with at least one to offer); the responder picks
//!   one it accepts, preferring a zero-length RDMA Write, then Read, then
//!   Send (siw's order; a peer's empty offer counts as Write, as siw does).
//!   The initiator must send that message as its first FPDU.
//!
//! A responder must not send any FPDU until it has received a valid one
//! from the initiator (RFC 5044 §7.1.2): in peer-to-peer mode that is the
//! RTR message.

use thiserror::Error;

use crate::wire::mpa::{
    self, EnhancedData, Frame, FrameKind, Repr, RtrKind, RtrSet, FRAME_HEADER_LEN, IRD_ORD_MAX, MAX_FRAME_LEN,
    MAX_PRIVATE_DATA_LEN, REVISION_1, REVISION_2,
};
use crate::wire::terminate::TermCode;
use crate::wire::write_slice;

/// Local policy for one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// Highest MPA revision we speak: 1 or 2.
    pub revision: u8,
    /// We want CRC (vt3's default). It is used if either side wants it.
    pub crc: bool,
    /// Inbound RDMA Read Requests we can have outstanding (≤ 0x3fff).
    pub ird: u16,
    /// Outbound RDMA Read Requests we want outstanding (≤ 0x3fff).
    pub ord: u16,
    /// Revision 2: run (initiator) or accept (responder) peer-to-peer mode.
    pub peer_to_peer: bool,
    /// RTR messages we can send (initiator) or accept (responder).
    pub rtr: RtrSet,
}

impl Default for Config {
    /// Revision 2, CRC, IRD = ORD = 16, peer-to-peer with zero-length
    /// Write or Read (a zero-length Send would need a posted receive).
    fn default() -> Self {
        Config {
            revision: REVISION_2,
            crc: true,
            ird: 16,
            ord: 16,
            peer_to_peer: true,
            rtr: RtrSet { send: false, write: true, read: true },
        }
    }
}

impl Config {
    fn validate(&self) -> Result<(), Error> {
        if !(REVISION_1..=REVISION_2).contains(&self.revision) {
            return Err(mpa::Error::Unsupported(mpa::Unsupported::Revision(self.revision)).into());
        }
        for value in [self.ird, self.ord] {
            if value > IRD_ORD_MAX {
                return Err(mpa::Error::Malformed(mpa::Malformed::IrdOrdRange(value)).into());
            }
        }
        Ok(())
    }
}

/// The connection parameters both sides agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub revision: u8,
    /// Generate and check FPDU CRCs.
    pub crc: bool,
    /// Our inbound RDMA Read depth.
    pub ird: u16,
    /// Our outbound RDMA Read depth.
    pub ord: u16,
    /// Peer-to-peer RTR message: the initiator sends it first, the
    /// responder waits for it.
    pub rtr: Option<RtrKind>,
}

/// Connection-setup failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum Error {
    #[error("invalid MPA frame: {0}")]
    Frame(#[from] mpa::Error),
    #[error("expected an MPA {expected:?} frame")]
    WrongFrame { expected: FrameKind },
    #[error("reply revision {replied} is above the requested revision {requested}")]
    RevisionMismatch { requested: u8, replied: u8 },
    #[error("the peer requires markers, which vt3 does not implement")]
    MarkersRequired,
    #[error("responder ORD {peer_ord} exceeds our IRD {our_ird}")]
    InsufficientIrd { peer_ord: u16, our_ird: u16 },
    #[error("the responder chose no RTR message we offered")]
    NoMatchingRtr,
    #[error("not valid now: {0}")]
    InvalidState(&'static str),
}

impl Error {
    /// The TERMINATE an initiator sends before closing, once the reply put
    /// MPA in FPDU mode (a responder cannot: it rejects or closes). `None`:
    /// just close.
    pub fn term_code(&self) -> Option<TermCode> {
        match self {
            Error::Frame(_) | Error::WrongFrame { .. } | Error::RevisionMismatch { .. } => {
                Some(TermCode::LlpInvalidRequestReply)
            }
            Error::InsufficientIrd { .. } => Some(TermCode::LlpInsufficientIrd),
            Error::NoMatchingRtr => Some(TermCode::LlpNoMatchingRtr),
            Error::MarkersRequired | Error::InvalidState(_) => None,
        }
    }
}

/// Collects one request/reply frame, at most [`MAX_FRAME_LEN`] octets.
#[derive(Debug)]
struct FrameReader {
    buffer: [u8; MAX_FRAME_LEN],
    len: usize,
}

impl FrameReader {
    const fn new() -> Self {
        FrameReader { buffer: [0; MAX_FRAME_LEN], len: 0 }
    }

    /// Takes this frame's bytes from `input`; true once it is complete.
    fn read(&mut self, input: &mut &[u8]) -> Result<bool, mpa::Error> {
        loop {
            let target = if self.len < FRAME_HEADER_LEN {
                FRAME_HEADER_LEN
            } else {
                // Refuse garbage and oversized frames before buffering more.
                if self.frame().kind().is_none() {
                    return Err(mpa::Error::Malformed(mpa::Malformed::Key));
                }
                let announced = usize::from(self.frame().private_data_len());
                if announced > MAX_PRIVATE_DATA_LEN {
                    return Err(mpa::Error::Malformed(mpa::Malformed::PrivateDataTooLong(announced)));
                }
                FRAME_HEADER_LEN + announced
            };
            let wanted = target.saturating_sub(self.len).min(input.len());
            if wanted == 0 {
                return Ok(self.len >= target);
            }
            let Some((taken, rest)) = input.split_at_checked(wanted) else {
                return Ok(false);
            };
            if !write_slice(&mut self.buffer, self.len, taken) {
                return Err(mpa::Error::Truncated);
            }
            self.len += wanted;
            *input = rest;
        }
    }

    fn frame(&self) -> Frame<&[u8]> {
        Frame::new_unchecked(self.buffer.get(..self.len).unwrap_or(&[]))
    }
}

/// RTR choice by preference: zero-length Write, Read, then Send.
fn preferred_rtr(candidates: RtrSet) -> Option<RtrKind> {
    [RtrKind::Write, RtrKind::Read, RtrKind::Send].into_iter().find(|&kind| candidates.contains(kind))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InitiatorState {
    Start,
    AwaitingReply,
    Done,
}

/// The active side: sends the MPA Request, then digests the Reply.
#[derive(Debug)]
pub struct Initiator {
    config: Config,
    state: InitiatorState,
    reader: FrameReader,
}

/// What a chunk of reply bytes produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitiatorEvent<'a> {
    /// The reply is incomplete: feed more bytes.
    Pending,
    /// Connected. Bytes after the reply are FPDUs. In peer-to-peer mode the
    /// `rtr` message must be our first FPDU.
    Established { negotiated: Negotiated, private_data: &'a [u8] },
    /// The responder's ULP rejected the connection: close.
    Rejected { private_data: &'a [u8] },
}

impl Initiator {
    pub fn new(config: Config) -> Result<Self, Error> {
        config.validate()?;
        Ok(Initiator { config, state: InitiatorState::Start, reader: FrameReader::new() })
    }

    /// The RTR messages we offer: peer-to-peer needs at least one.
    fn rtr_offer(&self) -> Option<RtrSet> {
        (self.config.peer_to_peer && !self.config.rtr.is_empty()).then_some(self.config.rtr)
    }

    /// Writes the MPA Request with the ULP's private data into `out`;
    /// returns its length. May be retried after an error (e.g. `out` too small).
    pub fn write_request(&mut self, private_data: &[u8], out: &mut [u8]) -> Result<usize, Error> {
        if self.state != InitiatorState::Start {
            return Err(Error::InvalidState("the request was already written"));
        }
        let config = &self.config;
        let offer = self.rtr_offer();
        let enhanced = (config.revision == REVISION_2).then_some(EnhancedData {
            ird: config.ird,
            ord: config.ord,
            peer_to_peer: offer.is_some(),
            rtr: offer.unwrap_or(RtrSet::NONE),
        });
        let request = Repr {
            kind: FrameKind::Request,
            markers: false,
            crc: config.crc,
            reject: false,
            revision: config.revision,
            enhanced,
            private_data,
        };
        request.emit(&mut Frame::new_unchecked(&mut *out))?;
        self.state = InitiatorState::AwaitingReply;
        Ok(request.buffer_len())
    }

    /// Feeds bytes from the responder, consuming at most the reply frame.
    /// Any error is final: close the connection (after a TERMINATE, see
    /// [`Error::term_code`]).
    pub fn receive(&mut self, input: &mut &[u8]) -> Result<InitiatorEvent<'_>, Error> {
        if self.state != InitiatorState::AwaitingReply {
            return Err(Error::InvalidState("no reply is expected"));
        }
        match self.reader.read(input) {
            Ok(false) => return Ok(InitiatorEvent::Pending),
            Ok(true) => self.state = InitiatorState::Done,
            Err(error) => {
                self.state = InitiatorState::Done;
                return Err(error.into());
            }
        }
        let config = self.config;
        let reply = Repr::parse(&self.reader.frame())?;
        if reply.kind != FrameKind::Reply {
            return Err(Error::WrongFrame { expected: FrameKind::Reply });
        }
        if reply.revision > config.revision {
            return Err(Error::RevisionMismatch { requested: config.revision, replied: reply.revision });
        }
        if reply.reject {
            return Ok(InitiatorEvent::Rejected { private_data: reply.private_data });
        }
        if reply.markers {
            return Err(Error::MarkersRequired);
        }
        let mut negotiated = Negotiated {
            revision: reply.revision,
            crc: config.crc || reply.crc,
            ird: config.ird,
            ord: config.ord,
            rtr: None,
        };
        if let Some(peer) = reply.enhanced {
            if peer.ord > config.ird {
                return Err(Error::InsufficientIrd { peer_ord: peer.ord, our_ird: config.ird });
            }
            negotiated.ord = config.ord.min(peer.ird);
            if let (Some(offer), true) = (self.rtr_offer(), peer.peer_to_peer) {
                let chosen = preferred_rtr(peer.rtr.intersect(offer)).ok_or(Error::NoMatchingRtr)?;
                negotiated.rtr = Some(chosen);
            }
        }
        Ok(InitiatorEvent::Established { negotiated, private_data: reply.private_data })
    }
}

/// Why a responder refuses a well-formed request by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The initiator wants markers.
    Markers,
    /// Peer-to-peer requested, but no offered RTR message is acceptable.
    NoMatchingRtr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ResponderState {
    AwaitingRequest,
    /// Waiting for the ULP: accept or reject.
    RequestReceived,
    /// Waiting for [`Responder::reject`] to produce the refusal.
    Refused,
    Done,
}

/// What the responder will answer; decided when the request arrives.
#[derive(Debug, Clone, Copy)]
struct ReplyPlan {
    enhanced: Option<EnhancedData>,
    negotiated: Negotiated,
}

/// The passive side: digests the MPA Request, then lets the ULP accept or
/// reject it.
#[derive(Debug)]
pub struct Responder {
    config: Config,
    state: ResponderState,
    reader: FrameReader,
    plan: Option<ReplyPlan>,
}

/// What a chunk of request bytes produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResponderEvent {
    /// The request is incomplete: feed more bytes.
    Pending,
    /// A request arrived ([`Responder::request`]): hand it to the ULP, then
    /// [`Responder::accept`] or [`Responder::reject`].
    Request,
    /// We cannot serve this request: send [`Responder::reject`]'s reply, then close.
    Refused(Refusal),
}

impl Responder {
    pub fn new(config: Config) -> Result<Self, Error> {
        config.validate()?;
        Ok(Responder { config, state: ResponderState::AwaitingRequest, reader: FrameReader::new(), plan: None })
    }

    /// Feeds bytes from the initiator, consuming at most the request frame.
    /// An error is final: close the connection without a reply.
    pub fn receive(&mut self, input: &mut &[u8]) -> Result<ResponderEvent, Error> {
        if self.state != ResponderState::AwaitingRequest {
            return Err(Error::InvalidState("no request is expected"));
        }
        match self.reader.read(input) {
            Ok(false) => return Ok(ResponderEvent::Pending),
            Ok(true) => self.state = ResponderState::Done,
            Err(error) => {
                self.state = ResponderState::Done;
                return Err(error.into());
            }
        }
        let config = self.config;
        let request = Repr::parse(&self.reader.frame())?;
        if request.kind != FrameKind::Request {
            return Err(Error::WrongFrame { expected: FrameKind::Request });
        }
        let mut plan = ReplyPlan {
            enhanced: None,
            negotiated: Negotiated {
                revision: request.revision.min(config.revision),
                crc: request.crc || config.crc,
                ird: config.ird,
                ord: config.ord,
                rtr: None,
            },
        };
        let refusal = if request.markers {
            Some(Refusal::Markers)
        } else {
            match request.enhanced.filter(|_| plan.negotiated.revision == REVISION_2) {
                Some(peer) => {
                    let negotiated = &mut plan.negotiated;
                    negotiated.ord = config.ord.min(peer.ird);
                    let mut refusal = None;
                    if peer.peer_to_peer && config.peer_to_peer {
                        let offered = if peer.rtr.is_empty() { RtrSet::only(RtrKind::Write) } else { peer.rtr };
                        negotiated.rtr = preferred_rtr(offered.intersect(config.rtr));
                        refusal = negotiated.rtr.is_none().then_some(Refusal::NoMatchingRtr);
                    }
                    plan.enhanced = Some(EnhancedData {
                        ird: negotiated.ird,
                        ord: negotiated.ord,
                        peer_to_peer: negotiated.rtr.is_some(),
                        rtr: negotiated.rtr.map_or(RtrSet::NONE, RtrSet::only),
                    });
                    refusal
                }
                None => None,
            }
        };
        self.plan = Some(plan);
        Ok(match refusal {
            Some(refusal) => {
                self.state = ResponderState::Refused;
                ResponderEvent::Refused(refusal)
            }
            None => {
                self.state = ResponderState::RequestReceived;
                ResponderEvent::Request
            }
        })
    }

    /// The received request (revision, CRC, markers, RFC 6581 data, ULP private data).
    pub fn request(&self) -> Option<Repr<'_>> {
        match self.state {
            ResponderState::RequestReceived | ResponderState::Refused => Repr::parse(&self.reader.frame()).ok(),
            ResponderState::AwaitingRequest | ResponderState::Done => None,
        }
    }

    /// Accepts with the ULP's private data: writes the reply into `out` and
    /// returns its length and the connection parameters.
    pub fn accept(&mut self, private_data: &[u8], out: &mut [u8]) -> Result<(usize, Negotiated), Error> {
        if self.state != ResponderState::RequestReceived {
            return Err(Error::InvalidState("accept needs a pending, acceptable request"));
        }
        let plan = self.plan.ok_or(Error::InvalidState("no reply plan"))?;
        let len = self.write_reply(&plan, false, private_data, out)?;
        self.state = ResponderState::Done;
        Ok((len, plan.negotiated))
    }

    /// Rejects (ULP decision, or after [`ResponderEvent::Refused`]): writes
    /// a reply with R set into `out`; then close the connection.
    pub fn reject(&mut self, private_data: &[u8], out: &mut [u8]) -> Result<usize, Error> {
        if !matches!(self.state, ResponderState::RequestReceived | ResponderState::Refused) {
            return Err(Error::InvalidState("reject needs a pending request"));
        }
        let plan = self.plan.ok_or(Error::InvalidState("no reply plan"))?;
        let len = self.write_reply(&plan, true, private_data, out)?;
        self.state = ResponderState::Done;
        Ok(len)
    }

    fn write_reply(&self, plan: &ReplyPlan, reject: bool, private_data: &[u8], out: &mut [u8]) -> Result<usize, Error> {
        let reply = Repr {
            kind: FrameKind::Reply,
            markers: false,
            crc: plan.negotiated.crc,
            reject,
            revision: plan.negotiated.revision,
            enhanced: plan.enhanced,
            private_data,
        };
        reply.emit(&mut Frame::new_unchecked(out))?;
        Ok(reply.buffer_len())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]
    use super::*;

    fn connect(initiator: Config, responder: Config) -> (Result<Negotiated, Error>, Option<Negotiated>) {
        let mut active = Initiator::new(initiator).unwrap();
        let mut passive = Responder::new(responder).unwrap();
        let mut wire = [0u8; MAX_FRAME_LEN];
        let len = active.write_request(b"ping", &mut wire).unwrap();
        let mut input = &wire[..len];
        assert_eq!(passive.receive(&mut input).unwrap(), ResponderEvent::Request);
        assert_eq!(passive.request().unwrap().private_data, b"ping");
        let (len, server) = passive.accept(b"pong", &mut wire).unwrap();
        let mut input = &wire[..len];
        let client = match active.receive(&mut input) {
            Ok(InitiatorEvent::Established { negotiated, private_data }) => {
                assert_eq!(private_data, b"pong");
                Ok(negotiated)
            }
            Ok(other) => panic!("{other:?}"),
            Err(error) => Err(error),
        };
        (client, Some(server))
    }

    #[test]
    fn defaults_agree() {
        let (client, server) = connect(Config::default(), Config::default());
        let client = client.unwrap();
        assert_eq!(Some(client), server);
        assert_eq!(client.rtr, Some(RtrKind::Write));
        assert!(client.crc);
    }

    #[test]
    fn wrong_state_calls_are_errors() {
        let mut active = Initiator::new(Config::default()).unwrap();
        let mut input: &[u8] = &[];
        assert!(matches!(active.receive(&mut input), Err(Error::InvalidState(_))));
        let mut passive = Responder::new(Config::default()).unwrap();
        assert!(matches!(passive.accept(&[], &mut [0u8; 64]), Err(Error::InvalidState(_))));
        assert!(matches!(passive.reject(&[], &mut [0u8; 64]), Err(Error::InvalidState(_))));
        assert!(passive.request().is_none());
        let bad = Config { ird: 0x4000, ..Config::default() };
        assert!(Responder::new(bad).is_err());
        assert!(Initiator::new(Config { revision: 3, ..Config::default() }).is_err());
    }
}
