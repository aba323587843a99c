//! TCB values the TOE reads off the frames passing through: smoltcp
//! keeps its sequence numbers, windows and RTT estimator private.

use super::frame::{flags, Segment};
use super::{Duration, Instant};

/// TCB values read off the frames passing through.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Observed {
    pub(super) snd_una: Option<u32>,
    pub(super) snd_nxt: Option<u32>,
    pub(super) rcv_nxt: Option<u32>,
    /// The end of the furthest payload received (sequence space): past
    /// `rcv_nxt`, smoltcp may hold it out of order in its receive buffer.
    pub(super) rcv_high: Option<u32>,
    pub(super) peer_window: Option<u16>,
    pub(super) our_window: Option<u16>,
    pub(super) our_syn_wscale: Option<u8>,
    pub(super) peer_syn_wscale: Option<u8>,
    pub(super) peer_mss: Option<u16>,
    pub(super) srtt: Option<Duration>,
    pub(super) rttvar: Option<Duration>,
    /// (sequence number that acknowledges the probe, time sent).
    pub(super) probe: Option<(u32, Instant)>,
    pub(super) retransmits: u64,
    pub(super) segs_in: u64,
    pub(super) segs_out: u64,
    pub(super) bytes_in: u64,
    pub(super) bytes_out: u64,
    pub(super) bytes_out_wire: u64,
}

/// `a` is after `b` in sequence space.
fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

impl Observed {
    pub(super) fn window_scales(&self) -> (u8, u8) {
        match (self.our_syn_wscale, self.peer_syn_wscale) {
            (Some(ours), Some(peer)) => (ours, peer),
            _ => (0, 0),
        }
    }

    pub(super) fn incoming(&mut self, segment: &Segment, now: Instant) {
        self.segs_in += 1;
        self.bytes_in += segment.payload_len as u64;
        if segment.has(flags::SYN) {
            self.peer_syn_wscale = segment.wscale;
            self.peer_mss = segment.mss;
        }
        if segment.payload_len > 0 {
            let len = u32::try_from(segment.payload_len).unwrap_or(u32::MAX);
            let end = segment.seq.wrapping_add(u32::from(segment.has(flags::SYN))).wrapping_add(len);
            if self.rcv_high.is_none_or(|high| seq_after(end, high)) {
                self.rcv_high = Some(end);
            }
        }
        if segment.has(flags::ACK) {
            let ack = segment.ack;
            if self.snd_una.is_none_or(|una| seq_after(ack, una)) {
                self.snd_una = Some(ack);
            }
            self.peer_window = Some(segment.window);
            if let Some((target, sent)) = self.probe {
                if !seq_after(target, ack) {
                    self.probe = None;
                    self.rtt_sample(now - sent);
                }
            }
        }
    }

    /// Whether every octet received was acknowledged: then smoltcp holds
    /// nothing out of order (data it holds in order shows in its queue).
    /// Conservative: a segment smoltcp dropped (outside the window) keeps
    /// this false until the stream passes its end.
    pub(super) fn nothing_held_out_of_order(&self) -> bool {
        match (self.rcv_high, self.rcv_nxt) {
            (None, _) => true,
            (Some(high), Some(acked)) => !seq_after(high, acked),
            (Some(_), None) => false,
        }
    }

    /// RFC 6298 §2.
    pub(super) fn rtt_sample(&mut self, sample: Duration) {
        match (self.srtt, self.rttvar) {
            (Some(srtt), Some(rttvar)) => {
                let micros = |d: Duration| d.total_micros() as i64;
                let delta = (micros(srtt) - micros(sample)).unsigned_abs();
                let rttvar = (3 * rttvar.total_micros() + delta) / 4;
                let srtt = (7 * srtt.total_micros() + sample.total_micros()) / 8;
                self.srtt = Some(Duration::from_micros(srtt));
                self.rttvar = Some(Duration::from_micros(rttvar));
            }
            _ => {
                self.srtt = Some(sample);
                self.rttvar = Some(Duration::from_micros(sample.total_micros() / 2));
            }
        }
    }

    pub(super) fn outgoing(&mut self, segment: &Segment, now: Instant) {
        self.segs_out += 1;
        self.bytes_out_wire += segment.payload_len as u64;
        if segment.has(flags::SYN) {
            self.our_syn_wscale = segment.wscale;
        }
        if segment.has(flags::ACK) {
            self.rcv_nxt = Some(segment.ack);
            self.our_window = Some(segment.window);
        }
        let len = segment.seq_len();
        if len == 0 {
            return;
        }
        let end = segment.seq.wrapping_add(len);
        match self.snd_nxt {
            Some(nxt) if !seq_after(end, nxt) => {
                // Nothing new: a retransmission. Karn: no RTT sample across it.
                self.retransmits += 1;
                self.probe = None;
            }
            _ => {
                let new_from = match self.snd_nxt {
                    Some(nxt) if seq_after(nxt, segment.seq) => nxt,
                    _ => segment.seq,
                };
                self.bytes_out += u64::from(end.wrapping_sub(new_from))
                    .saturating_sub(u64::from(segment.has(flags::SYN)) + u64::from(segment.has(flags::FIN)));
                if seq_after(segment.seq, new_from) || new_from != segment.seq {
                    self.retransmits += 1;
                }
                self.snd_nxt = Some(end);
                if self.probe.is_none() {
                    self.probe = Some((end, now));
                }
            }
        }
    }
}
