//! The control channel (docs/architecture.md §2): EtherType 0x88B5 frames
//! between vt3.ko and vt3d. Runs the first contact and authenticates every
//! command frame (auth.rs), decodes it into a typed request (commands.rs),
//! runs it against the RNIC and builds the sealed response; seals events. The provisioned key comes from a file (key.rs).

mod auth;
pub mod commands;
pub mod key;

use std::collections::VecDeque;

use vm_memory::GuestMemory;

pub use auth::{
    header, key_from_bytes, mac, random_nonce, session_key, unseal, ChannelStats, DriverEnd, FirstContact, Key, Nonce,
    Refusal, ReplayWindow, Sealed, Session,
};

pub use commands::Request;

use crate::abi::{Cmd, CtrlHdr, MsgType, Status, VT3_CTRL_VERSION, VT3_ETHERTYPE};
use crate::rnic::{Instant, Rnic};

const ETH_HDR: usize = 14;

/// What a control frame from the guest turned into.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send this frame back to the guest: the response.
    Reply(Vec<u8>),
    /// Nothing to send (a doorbell that went well).
    Silent,
    /// Refused without an answer (counted).
    Refused(Refusal),
}

/// The device's end of the control channel: at most one session, that of
/// the driver that last proved it holds the provisioned key.
#[derive(Debug)]
pub struct Channel {
    first_contact: FirstContact,
    session: Option<Session>,
    stats: std::sync::Arc<ChannelStats>,
}

fn mac_at(frame: &[u8], at: usize) -> [u8; 6] {
    let mut mac = [0u8; 6];
    if let Some(src) = frame.get(at..at + 6) {
        mac.copy_from_slice(src);
    }
    mac
}

/// Builds an Ethernet frame to `dst` from `src` around a sealed control
/// part.
pub fn build_frame(dst: [u8; 6], src: [u8; 6], ctrl: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(ETH_HDR + ctrl.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&VT3_ETHERTYPE.to_be_bytes());
    f.extend_from_slice(ctrl);
    f
}

impl Channel {
    /// A channel whose drivers must prove `key` (vt3_hw.h).
    pub fn new(key: Key, stats: std::sync::Arc<ChannelStats>) -> Self {
        Self { first_contact: FirstContact::new(key, 0), session: None, stats }
    }

    pub fn stats(&self) -> &ChannelStats {
        &self.stats
    }

    /// Whether a driver has a session (events have somewhere to go).
    pub fn has_session(&self) -> bool {
        self.session.is_some()
    }

    /// The frontend went away: its driver's session with it.
    pub fn end_session(&mut self) {
        self.session = None;
    }

    /// Handles one control frame from the guest at time `now`.
    pub fn handle_frame<M: GuestMemory>(&mut self, rnic: &mut Rnic, mem: &M, frame: &[u8], now: Instant) -> Outcome {
        let sealed = match auth::unseal(frame.get(ETH_HDR..).unwrap_or_default()) {
            Ok(m) => m,
            Err(why) => return refuse(&self.stats, why, frame),
        };
        if sealed.hdr.r#type != MsgType::Cmd as u8 {
            return refuse(&self.stats, Refusal::NotCommand, frame);
        }
        let opcode = sealed.hdr.opcode.to_native();
        let guest = mac_at(frame, 6);
        let now_ms = u64::try_from(now.total_millis()).unwrap_or(0);
        if opcode == Cmd::Hello as u16 {
            // A challenge under the provisioned key; the live session (if
            // any) is not touched.
            let answer = match random_nonce() {
                Some(nonce) => self.first_contact.hello(&sealed, nonce, now_ms),
                None => Err(Refusal::Hello),
            };
            return match answer {
                Ok(ctrl) => Outcome::Reply(build_frame(guest, guest, &ctrl)),
                Err(why) => refuse(&self.stats, why, frame),
            };
        }
        if opcode == Cmd::Prove as u16 {
            let session = match self.first_contact.prove(&sealed, now_ms) {
                Ok(session) => session,
                Err(why) => return refuse(&self.stats, why, frame),
            };
            if self.session.is_some() {
                log::info!("a proven driver session replaces the old one: its objects are dropped");
            }
            // Objects belong to the session that made them.
            rnic.reset();
            rnic.set_driver_mac(guest);
            let session = self.session.insert(session);
            self.stats.sessions.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Outcome::Reply(seal_reply(session, &sealed.hdr, Status::Ok, &[], guest));
        }
        let Some(session) = self.session.as_mut() else {
            return refuse(&self.stats, Refusal::NoSession, frame);
        };
        if let Err(why) = session.open(&sealed) {
            return refuse(&self.stats, why, frame);
        }
        let result = match Cmd::try_from(opcode) {
            Err(_) => Err(Status::Unsupported),
            Ok(cmd) if rnic.drops_command(now, cmd) => {
                log::debug!("{} dropped: commands are muted", cmd.name());
                return Outcome::Silent;
            }
            Ok(cmd) => {
                let r = Request::decode(cmd, sealed.payload).and_then(|request| rnic.execute(mem, now, &request));
                rnic.set_driver_mac(guest);
                if let Err(status) = r {
                    log::debug!("{} failed: {}", cmd.name(), status.name());
                }
                if cmd == Cmd::Doorbell && r.is_ok() {
                    return Outcome::Silent;
                }
                if rnic.loses_reply(cmd) {
                    log::debug!("{} carried out, its reply dropped (lose-reply)", cmd.name());
                    return Outcome::Silent;
                }
                r
            }
        };
        let (status, payload) = match result {
            Ok(p) => (Status::Ok, p),
            Err(s) => (s, Vec::new()),
        };
        // Events the command raised stay with the RNIC: the caller takes
        // them (take_events) as far as the guest has room.
        Outcome::Reply(seal_reply(session, &sealed.hdr, status, &payload, guest))
    }

    /// Moves up to `max` of the RNIC's pending events into `out` as sealed
    /// frames for the driver; the rest wait in the RNIC (events with no
    /// session to go to are dropped).
    pub fn take_events(&mut self, rnic: &mut Rnic, out: &mut VecDeque<Vec<u8>>, max: usize) {
        let (Some(session), Some(mac)) = (self.session.as_mut(), rnic.driver_mac()) else {
            rnic.drop_events();
            return;
        };
        for (event, body) in rnic.take_events(max) {
            let hdr = header(MsgType::Event, event as u16, 0, 0, body.len());
            out.push_back(build_frame(mac, mac, &session.seal(hdr, &body)));
        }
    }
}

/// Counts a refused frame and logs the first of each kind, then every
/// power of ten (a flood must not flood the log too).
fn refuse(stats: &ChannelStats, why: Refusal, frame: &[u8]) -> Outcome {
    let n = stats.refuse(why);
    if is_power_of_ten(n) {
        let version = frame.get(ETH_HDR).copied().unwrap_or(0);
        match why {
            Refusal::Version => log::warn!(
                "control frame of protocol v{version} refused: this vt3d speaks v{VT3_CTRL_VERSION} \
                 (vt3.ko and vt3d must come from the same release) [{n} so far]"
            ),
            _ => log::warn!("control frame refused ({}) [{n} so far]", why.name()),
        }
    }
    Outcome::Refused(why)
}

fn seal_reply(session: &mut Session, cmd: &CtrlHdr, status: Status, payload: &[u8], guest: [u8; 6]) -> Vec<u8> {
    let hdr = header(MsgType::Resp, cmd.opcode.to_native(), cmd.seq.to_native(), status as u16, payload.len());
    build_frame(guest, guest, &session.seal(hdr, payload))
}

fn is_power_of_ten(n: u64) -> bool {
    let mut p = 1u64;
    while p < n {
        p = p.saturating_mul(10);
    }
    p == n
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests;
