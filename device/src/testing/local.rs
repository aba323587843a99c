//! The device in this process: an [`Rnic`] behind its control channel,
//! driven in virtual time by the engine crate's simulated wire. Commands
//! go through the channel exactly as vt3.ko's frames do (sealed, checked,
//! answered); vt3d's worker loop is the [`Endpoint`] impl.

use std::collections::VecDeque;

use vt3_iwarp::sim::{Endpoint, MACS};
use vt3_iwarp::toe::Instant;

use super::guest::{DriverPath, Events, Guest};
use super::ram::{GuestRam, Layout};
use crate::abi::{Cmd, EventType, MsgType, Status};
use crate::control::{build_frame, Channel, DriverEnd, Outcome};
use crate::rnic::Rnic;

/// Where [`Local`] guests keep things: 8 MiB of RAM, page lists from
/// 1 MiB, status pages from 1984 KiB, rings and buffers from 2 MiB.
pub fn local_layout() -> Layout {
    Layout {
        size: 8 << 20,
        pbl: 0x10_0000..0x1f_0000,
        status: 0x1f_0000..0x20_0000,
        pages: 0x20_0000..8 << 20,
        wrap: false,
    }
}

/// The device end of an in-process guest.
#[derive(Debug)]
pub struct Local {
    pub rnic: Rnic,
    pub chan: Channel,
    end: DriverEnd,
    mac: [u8; 6],
    /// The virtual time commands run at: the simulation's, set by
    /// [`Guest::at`] and by every step of the wire.
    pub now: Instant,
    next_poll: Option<Instant>,
    /// Commands that got no response (`Outcome::Silent`): a doorbell
    /// that went well, or a command muted or whose reply was lost.
    pub silent: u32,
}

impl Local {
    /// Opens an event frame sealed for the driver and keeps it.
    fn record_event(&mut self, events: &mut Events, frame: &[u8]) {
        assert_eq!(frame.get(..6), Some(&self.mac[..]), "events go to the driver's MAC");
        let ev = self.end.open(frame.get(14..).unwrap_or_default()).expect("an event sealed for the driver");
        assert_eq!(ev.hdr.r#type, MsgType::Event as u8);
        let kind = EventType::try_from(ev.hdr.opcode.to_native()).expect("a known event");
        events.push(kind, ev.payload.to_vec());
    }

    /// Frames every event the device queued and opens them.
    fn drain_events(&mut self, events: &mut Events) {
        let mut frames = VecDeque::new();
        self.chan.take_events(&mut self.rnic, &mut frames, usize::MAX);
        for frame in frames {
            self.record_event(events, &frame);
        }
    }
}

impl DriverPath for Local {
    fn command(&mut self, ram: &GuestRam, events: &mut Events, cmd: Cmd, args: &[u8]) -> Result<Vec<u8>, Status> {
        let (seq, ctrl) = self.end.command(cmd as u16, args);
        let frame = build_frame(self.mac, self.mac, &ctrl);
        let reply = match self.chan.handle_frame(&mut self.rnic, &ram.mem, &frame, self.now) {
            Outcome::Reply(reply) => reply,
            Outcome::Silent => {
                self.silent += 1;
                return Ok(Vec::new());
            }
            Outcome::Refused(why) => panic!("command refused: {why:?}"),
        };
        let resp = self.end.open(reply.get(14..).unwrap_or_default()).expect("a response sealed for the driver");
        assert_eq!(resp.hdr.seq.to_native(), seq);
        let (status, body) = (resp.hdr.status.to_native(), resp.payload.to_vec());
        // Events the command raised follow its response.
        self.drain_events(events);
        match Status::try_from(status).expect("a known status") {
            Status::Ok => Ok(body),
            s => Err(s),
        }
    }
}

impl Guest<Local> {
    /// Guest `index` of the simulation (its MAC from [`MACS`]) with `rnic`,
    /// after first contact with its device.
    pub fn local(index: usize, rnic: Rnic) -> Self {
        let key = [index as u64 + 1, 0x5eed];
        let mac = MACS.get(index).copied().expect("a simulated guest's MAC");
        let dev = Local {
            rnic,
            chan: Channel::new(key, std::sync::Arc::default()),
            end: DriverEnd::new(key),
            mac,
            now: Instant::from_millis(0),
            next_poll: None,
            silent: 0,
        };
        let mut guest = Guest::new(GuestRam::anonymous(local_layout()), dev, mac);
        let (Local { end, chan, rnic, now, .. }, mem) = (&mut guest.dev, &guest.ram.mem);
        end.handshake(|ctrl| match chan.handle_frame(rnic, mem, &build_frame(mac, mac, &ctrl), *now) {
            Outcome::Reply(resp) => resp.get(14..).map(<[u8]>::to_vec),
            _ => None,
        })
        .expect("first contact refused");
        guest
    }

    /// The guest, with its commands run at `now`.
    pub fn at(&mut self, now: Instant) -> &mut Self {
        self.dev.now = now;
        self
    }
}

impl Endpoint for Guest<Local> {
    fn wants(&self, frame: &[u8]) -> bool {
        self.dev.rnic.wants(frame)
    }

    fn receive(&mut self, now: Instant, frame: &[u8], tx: &mut dyn FnMut(&[u8])) {
        self.dev.now = now;
        if self.dev.rnic.wants(frame) {
            self.dev.rnic.receive(now, frame, tx);
        }
    }

    fn poll(&mut self, now: Instant, tx: &mut dyn FnMut(&[u8])) {
        self.dev.now = now;
        // vt3d's worker also looks at polled queues until their windows end.
        let rnic = &mut self.dev.rnic;
        self.dev.next_poll = match (rnic.service(now, &self.ram.mem, tx), rnic.poll_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.dev.drain_events(&mut self.events);
    }

    fn poll_at(&mut self, _now: Instant) -> Option<Instant> {
        self.dev.next_poll
    }
}
