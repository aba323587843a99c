//! vt3-iwarp: the iWARP layer of vt3, pure Rust, `#![deny(unsafe_code)]`.
//!
//! Wire layer (no I/O, no clock, no allocation per packet):
//!
//! * [`crc32c`]: the MPA CRC (Castagnoli), hardware where the CPU has it.
//! * [`wire`]: smoltcp-style `Packet<T>` views and `Repr` values for MPA
//!   (request/reply frames, FPDUs), DDP, RDMAP and TERMINATE.
//! * [`stream`]: the FPDU deframer (any TCP segmentation in, whole ULPDUs
//!   out) and the FPDU emitter.
//! * [`negotiation`]: the MPA connection-setup state machines (initiator and
//!   responder, revision 1 and 2), driven by bytes only.
//!
//! Engine (what vt3d runs; still no I/O of its own, time injected):
//!
//! * [`toe`]: the TCP offload engine, a [`toe::Transport`] trait and its
//!   smoltcp implementation [`toe::SmolToe`], fed and drained as Ethernet frames.
//! * [`engine`]: queue pairs on top of the TOE: MPA negotiation, DDP/RDMAP
//!   send and receive paths, the QP state machine and its events, work
//!   requests in and completions out. Guest memory and the TPT come in
//!   through [`engine::GuestMemory`] and [`engine::MemoryRegions`].
//! * [`tpt`]: the Translation and Protection Table vt3d keeps per device
//!   (over the handle [`table`]), the engine's [`engine::MemoryRegions`].
//! * [`mock`] and [`sim`]: an in-memory guest and wire for tests, fuzzing
//!   and benchmarks (feature `test-utils`).
//!
//! Nothing here panics on any network input, and every buffer that network
//! input can fill is bounded.
//!
//! No unsafe code, except where socket buffers are mappings of their own
//! whose idle pages go back to the kernel: `toe/buffer.rs` maps them and
//! `toe/smol/mod.rs`'s `new_socket` lends them to smoltcp (each allowed there,
//! with its `// SAFETY:`).
#![deny(unsafe_code)]

pub mod crc32c;
pub mod engine;
#[cfg(any(test, feature = "test-utils"))]
pub mod mock;
pub mod negotiation;
#[cfg(any(test, feature = "test-utils"))]
pub mod sim;
pub mod stream;
pub mod table;
pub mod toe;
pub mod tpt;
pub mod wire;
