//! The control channel (DESIGN.md §2): EtherType 0x88B5 frames between
//! vt3.ko and vt3d. Parses a command frame, runs it against the RNIC and
//! builds the response frame; builds event frames.

use std::collections::VecDeque;

use vm_memory::{ByteValued, GuestMemory};

use crate::abi::{self, Cmd, CtrlHdr, EventType, MsgType, Status, VT3_CTRL_VERSION, VT3_ETHERTYPE};
use crate::rnic::{Instant, Rnic};

const ETH_HDR: usize = 14;
const CTRL_HDR: usize = std::mem::size_of::<CtrlHdr>();

/// What a control frame from the guest turned into.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send these frames back to the guest: the response, then any events
    /// the command raised.
    Reply(Vec<Vec<u8>>),
    /// Nothing to send (a doorbell that went well).
    Silent,
    /// Not a command we can answer (too short to carry a header, or not a
    /// command message); counted and dropped.
    Ignored,
}

fn mac_at(frame: &[u8], at: usize) -> [u8; 6] {
    let mut mac = [0u8; 6];
    if let Some(src) = frame.get(at..at + 6) {
        mac.copy_from_slice(src);
    }
    mac
}

/// Builds a control frame to `dst` from `src`.
pub fn build_frame(dst: [u8; 6], src: [u8; 6], hdr: &CtrlHdr, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HDR + CTRL_HDR + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&VT3_ETHERTYPE.to_be_bytes());
    f.extend_from_slice(hdr.as_slice());
    f.extend_from_slice(payload);
    f
}

/// Handles one control frame from the guest at time `now`.
pub fn handle_frame<M: GuestMemory>(rnic: &mut Rnic, mem: &M, frame: &[u8], now: Instant) -> Outcome {
    let Some(hdr) = frame.get(ETH_HDR..).and_then(abi::read_struct::<CtrlHdr>) else {
        return Outcome::Ignored;
    };
    if hdr.r#type != MsgType::Cmd as u8 {
        return Outcome::Ignored;
    }
    let body = frame.get(ETH_HDR + CTRL_HDR..).unwrap_or_default();
    let opcode = hdr.opcode.to_native();
    let guest = mac_at(frame, 6);
    let result = if hdr.version != VT3_CTRL_VERSION {
        Err(Status::Unsupported)
    } else {
        match (Cmd::try_from(opcode), body.get(..usize::from(hdr.len.to_native()))) {
            (Err(_), _) => Err(Status::Unsupported),
            (Ok(_), None) => Err(Status::Invalid),
            (Ok(cmd), Some(payload)) => {
                let r = rnic.execute(mem, now, cmd, payload);
                rnic.driver_mac = Some(guest);
                if let Err(status) = r {
                    log::debug!("{} failed: {}", cmd.name(), status.name());
                }
                if cmd == Cmd::Doorbell && r.is_ok() {
                    return Outcome::Silent;
                }
                r
            }
        }
    };
    let (status, payload) = match result {
        Ok(p) => (Status::Ok, p),
        Err(s) => (s, Vec::new()),
    };
    let resp = CtrlHdr {
        version: VT3_CTRL_VERSION,
        r#type: MsgType::Resp as u8,
        opcode: opcode.into(),
        seq: hdr.seq,
        status: (status as u16).into(),
        len: u16::try_from(payload.len()).unwrap_or(0).into(),
        reserved: 0.into(),
    };
    let mut frames = vec![build_frame(guest, mac_at(frame, 0), &resp, &payload)];
    frames.extend(rnic.events.drain(..).map(|(event, body)| event_frame(guest, event, &body)));
    Outcome::Reply(frames)
}

/// Moves the RNIC's pending events into `out` as frames for the driver
/// (the MAC of the last command; events raised before any command have
/// no one to go to and are dropped).
pub fn take_events(rnic: &mut Rnic, out: &mut VecDeque<Vec<u8>>) {
    match rnic.driver_mac {
        Some(mac) => out.extend(rnic.events.drain(..).map(|(event, body)| event_frame(mac, event, &body))),
        None => rnic.events.clear(),
    }
}

/// Builds an event frame for the guest at `mac`.
pub fn event_frame(mac: [u8; 6], event: EventType, body: &[u8]) -> Vec<u8> {
    let hdr = CtrlHdr {
        version: VT3_CTRL_VERSION,
        r#type: MsgType::Event as u8,
        opcode: (event as u16).into(),
        seq: 0.into(),
        status: 0.into(),
        len: u16::try_from(body.len()).unwrap_or(0).into(),
        reserved: 0.into(),
    };
    build_frame(mac, mac, &hdr, body)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests;
