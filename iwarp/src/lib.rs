//! vt3-iwarp: the iWARP wire layer of vt3, pure Rust and free of I/O.
//!
//! * [`crc32c`]: the MPA CRC (Castagnoli), table driven.
//! * [`wire`]: smoltcp-style `Packet<T>` views and `Repr` values for MPA
//!   (request/reply frames, FPDUs), DDP, RDMAP and TERMINATE.
//! * [`stream`]: the FPDU deframer (any TCP segmentation in, whole ULPDUs
//!   out) and the FPDU emitter.
//! * [`negotiation`]: the MPA connection-setup state machines (initiator and
//!   responder, revision 1 and 2), driven by bytes only.
//!
//! Nothing here panics on any input, allocates per packet, or knows about
//! time: the device engine owns timers, sockets and guest memory.
#![forbid(unsafe_code)]

pub mod crc32c;
pub mod negotiation;
pub mod stream;
pub mod wire;
