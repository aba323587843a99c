//! The smoltcp device of one TOE call ([`Port`]): at most one received
//! frame in, and a transmit path that frames, observes, fault-injects and
//! hands out each packet smoltcp builds; and where frames leaving the TOE
//! go (the uplink, the delay queue, or back in for our own MAC).

use std::collections::{BTreeMap, HashMap, VecDeque};

use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};

use super::frame::{self, ETHERNET_HEADER_LEN};
use super::smol::Slot;
use super::{Duration, FourTuple, Instant, MacAddr};

/// Frames held back by the delay fault, at most this many (beyond: dropped).
pub const MAX_DELAYED_FRAMES: usize = 4096;

/// Frames to our own address waiting to come back in (a connection
/// between two sockets of this TOE never touches the wire, as in a
/// T3's). Past this many, a frame is dropped and TCP sends it again.
pub const MAX_LOOPED_FRAMES: usize = 4096;

/// Frames of delayed connections, by release time (FIFO within a time).
#[derive(Debug, Default)]
pub(super) struct DelayQueue {
    pub(super) frames: BTreeMap<(Instant, u64), Vec<u8>>,
    pub(super) next: u64,
}

/// What fault injection did to frames, TOE-wide.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounters {
    /// Frames dropped by blackhole or drop-percentage faults (both ways).
    pub dropped: u64,
    /// Frames held back by the delay fault.
    pub delayed: u64,
    /// Frames dropped because the delay queue was full.
    pub delay_overflow: u64,
    /// Segments cut in two by the split fault.
    pub split: u64,
    /// Frames to our own address dropped because the loopback queue was full.
    pub loop_overflow: u64,
}

/// Frames sent to our own MAC, to come back in in order.
#[derive(Debug, Default)]
pub(super) struct LoopQueue {
    pub(super) frames: VecDeque<Vec<u8>>,
    pub(super) overflow: u64,
    pub(super) taken: u64,
}

/// Where a frame leaving the TOE goes: back in when it is for our own
/// MAC (a connection between two of our sockets), else to the uplink.
pub(super) fn send_out(frame: &[u8], our_mac: MacAddr, looped: &mut LoopQueue, uplink: &mut dyn FnMut(&[u8])) {
    if frame.get(..6) != Some(&our_mac[..]) {
        uplink(frame);
    } else if looped.frames.len() >= MAX_LOOPED_FRAMES {
        looped.overflow += 1;
    } else {
        looped.frames.push_back(frame.to_vec());
    }
}

/// The smoltcp device for one call: at most one received frame, and a
/// transmit path that observes each frame and hands it to the uplink.
pub(super) struct Port<'a> {
    pub(super) rx: Option<&'a [u8]>,
    pub(super) tx: TxPath<'a>,
}

pub(super) struct TxPath<'a> {
    pub(super) scratch: &'a mut Vec<u8>,
    pub(super) uplink: &'a mut dyn FnMut(&[u8]),
    pub(super) slots: &'a mut [Slot],
    pub(super) by_tuple: &'a HashMap<FourTuple, u32>,
    pub(super) delayed: &'a mut DelayQueue,
    pub(super) faults: &'a mut FaultCounters,
    pub(super) budget: usize,
    /// IP MTU.
    pub(super) mtu: usize,
    pub(super) our_mac: MacAddr,
    /// Next hop for packets of no known connection (replies during ingress).
    pub(super) reply_to: Option<MacAddr>,
    pub(super) now: Instant,
}

impl TxPath<'_> {
    /// Frames the IPv4 packet smoltcp built at `scratch[14..14 + len]`,
    /// observes it and sends it.
    fn deliver(&mut self, len: usize) {
        let end = ETHERNET_HEADER_LEN + len;
        let Some(packet) = self.scratch.get(ETHERNET_HEADER_LEN..end) else {
            return;
        };
        // Only TCP leaves the TOE.
        let Some((local, remote)) = frame::ip_tcp_endpoints(packet) else {
            return;
        };
        let entry = self
            .by_tuple
            .get(&FourTuple { local, remote })
            .and_then(|&index| self.slots.get_mut(index as usize))
            .and_then(|slot| slot.entry.as_mut());
        let next_hop = match (&entry, self.reply_to) {
            (Some(entry), _) => entry.next_hop,
            (None, Some(mac)) => mac,
            (None, None) => return,
        };
        if let Some(header) = self.scratch.get_mut(..ETHERNET_HEADER_LEN) {
            frame::write_ethernet_header(header, next_hop, self.our_mac);
        }
        let Some(frame) = self.scratch.get(..end) else {
            return;
        };
        if let Some(entry) = entry {
            if let Some(segment) = frame::parse(frame) {
                // A blackholed connection still counts what TCP sent.
                entry.observed.outgoing(&segment, self.now);
            }
            if entry.drops() {
                self.faults.dropped += 1;
                return;
            }
            let now = self.now;
            let mut at = now + entry.delay.unwrap_or(Duration::ZERO);
            if let Some(split) = entry.split {
                // One segment at a time: a frame leaves after the rest of
                // the segment before it, so the peer sees no reordering.
                at = at.max(entry.split_until);
                let (mut head, mut rest) = (Vec::new(), Vec::new());
                if frame::split_segment(frame, usize::from(split.tail), &mut head, &mut rest) {
                    self.faults.split += 1;
                    entry.split_until = at + split.hold;
                    if at > now {
                        self.delayed.hold(self.faults, at, head);
                    } else {
                        (self.uplink)(&head);
                    }
                    self.delayed.hold(self.faults, entry.split_until, rest);
                    return;
                }
            }
            if at > now {
                self.delayed.hold(self.faults, at, frame.to_vec());
                return;
            }
        }
        (self.uplink)(frame);
    }
}

impl DelayQueue {
    /// Queues `frame` to leave at `at` (after the frames queued for the
    /// same time); a full queue drops it.
    fn hold(&mut self, faults: &mut FaultCounters, at: Instant, frame: Vec<u8>) {
        if self.frames.len() >= MAX_DELAYED_FRAMES {
            faults.delay_overflow += 1;
        } else {
            faults.delayed += 1;
            self.frames.insert((at, self.next), frame);
            self.next = self.next.wrapping_add(1);
        }
    }
}

pub(super) struct RxToken<'a>(&'a [u8]);

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(self.0)
    }
}

pub(super) struct TxToken<'a, 'b>(&'a mut TxPath<'b>);

impl phy::TxToken for TxToken<'_, '_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let path = self.0;
        path.budget = path.budget.saturating_sub(1);
        let total = ETHERNET_HEADER_LEN + len;
        if path.scratch.len() < total {
            path.scratch.resize(total, 0);
        }
        match path.scratch.get_mut(ETHERNET_HEADER_LEN..total) {
            Some(packet) => {
                let result = f(packet);
                path.deliver(len);
                result
            }
            // Not reachable (resized above); never panic anyway.
            None => f(&mut vec![0; len]),
        }
    }
}

impl<'p> Device for Port<'p> {
    type RxToken<'a>
        = RxToken<'a>
    where
        Self: 'a;
    type TxToken<'a>
        = TxToken<'a, 'p>
    where
        Self: 'a;

    fn receive(&mut self, _now: smoltcp::time::Instant) -> Option<(RxToken<'_>, TxToken<'_, 'p>)> {
        let frame = self.rx.take()?;
        Some((RxToken(frame), TxToken(&mut self.tx)))
    }

    fn transmit(&mut self, _now: smoltcp::time::Instant) -> Option<TxToken<'_, 'p>> {
        if self.tx.budget == 0 {
            return None;
        }
        Some(TxToken(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        capabilities(self.tx.mtu)
    }
}

fn capabilities(mtu: usize) -> DeviceCapabilities {
    let mut caps = DeviceCapabilities::default();
    caps.medium = Medium::Ip;
    caps.max_transmission_unit = mtu;
    caps.max_burst_size = None;
    caps
}
