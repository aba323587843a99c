//! The smoltcp device of one TOE call ([`Port`]): at most one received
//! frame in, and a transmit path that frames, observes and hands out each
//! packet smoltcp builds (to the link: `link.rs`).

use std::collections::HashMap;

use smoltcp::phy::{self, Device, DeviceCapabilities, Medium};

use super::frame::{self, ETHERNET_HEADER_LEN};
use super::smol::Slot;
use super::{FourTuple, Instant, MacAddr};

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
                entry.observed.outgoing(&segment, self.now);
            }
        }
        (self.uplink)(frame);
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
