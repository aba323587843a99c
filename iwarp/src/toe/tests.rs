//! TOE tests: two stacks over a lossless in-memory wire, time injected.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::collections::VecDeque;
use std::net::{Ipv4Addr, SocketAddrV4};

use super::frame::flags;
use super::*;

const MAC_A: MacAddr = [0x52, 0x54, 0, 0, 0, 1];
const MAC_B: MacAddr = [0x52, 0x54, 0, 0, 0, 2];
const IP_A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const IP_B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

struct Pair<T = SmolToe> {
    a: T,
    b: T,
    now: Instant,
    /// Frames in flight: (to_b, frame).
    wire: VecDeque<(bool, Vec<u8>)>,
    drop_all: bool,
    strays: usize,
}

impl Pair {
    fn new(config: impl Fn(TcpConfig) -> TcpConfig) -> Self {
        let now = Instant::from_millis(1000);
        Pair {
            a: SmolToe::new(config(TcpConfig::new(MAC_A, IP_A)), now).unwrap(),
            b: SmolToe::new(config(TcpConfig::new(MAC_B, IP_B)), now).unwrap(),
            now,
            wire: VecDeque::new(),
            drop_all: false,
            strays: 0,
        }
    }
}

impl Pair<Link<SmolToe>> {
    /// Two stacks, each behind its link (`link.rs`: loopback, faults).
    fn linked(config: impl Fn(TcpConfig) -> TcpConfig) -> Self {
        let pair = Pair::new(config);
        Pair {
            a: Link::new(pair.a),
            b: Link::new(pair.b),
            now: pair.now,
            wire: pair.wire,
            drop_all: pair.drop_all,
            strays: pair.strays,
        }
    }
}

impl<T: Transport> Pair<T> {
    /// Runs both stacks until the wire is quiet, advancing time to timers
    /// only when `advance` is set.
    fn settle(&mut self, advance: bool, limit: Duration) {
        let end = self.now + limit;
        loop {
            let now = self.now;
            let mut out = Vec::new();
            self.a.egress(now, &mut |f| out.push((true, f.to_vec())));
            self.b.egress(now, &mut |f| out.push((false, f.to_vec())));
            if !self.drop_all {
                self.wire.extend(out);
            }
            if let Some((to_b, frame)) = self.wire.pop_front() {
                let (toe, other) = if to_b { (&mut self.b, false) } else { (&mut self.a, true) };
                if toe.wants(&frame) {
                    let mut replies = Vec::new();
                    toe.ingress(now, &frame, &mut |f| replies.push((other, f.to_vec())));
                    self.wire.extend(replies);
                } else {
                    self.strays += 1;
                }
                continue;
            }
            if !advance {
                return;
            }
            let next = [self.a.poll_at(now), self.b.poll_at(now)].into_iter().flatten().min();
            match next {
                Some(next) if next <= end => self.now = next.max(now + Duration::from_micros(1)),
                _ => return,
            }
        }
    }
}

fn read_all(toe: &mut impl Transport, id: SocketId) -> Vec<u8> {
    let mut got = Vec::new();
    toe.recv(id, &mut |data| {
        got.extend_from_slice(data);
        data.len()
    })
    .unwrap();
    got
}

#[test]
fn connect_transfer_and_graceful_close() {
    let mut pair = Pair::new(|c| c);
    pair.b.listen(4791, 4).unwrap();
    let remote = SocketAddrV4::new(IP_B, 4791);
    let a = pair.a.connect(pair.now, 40000, remote, MAC_B).unwrap();
    assert_eq!(pair.a.status(a), Some(LinkStatus::Connecting));
    pair.settle(false, Duration::ZERO);
    let b = pair.b.accept(4791).unwrap();
    assert_eq!(pair.a.status(a), Some(LinkStatus::Established));
    assert_eq!(pair.b.status(b), Some(LinkStatus::Established));
    assert_eq!(pair.a.mss(a), 1460);

    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    let mut sent = 0;
    let mut got = Vec::new();
    while got.len() < data.len() {
        sent += pair.a.send_slice(a, &data[sent..]).unwrap();
        pair.settle(true, Duration::from_secs(1));
        got.extend(read_all(&mut pair.b, b));
    }
    assert_eq!(got, data);
    let tcb = pair.a.tcb(a).unwrap();
    assert_eq!(tcb.bytes_out, data.len() as u64);
    assert_eq!(tcb.retransmits, 0);
    assert_eq!(tcb.state, TcpState::Established);
    assert!(tcb.srtt.is_some());
    assert_eq!(tcb.snd_una, tcb.snd_nxt);
    assert!(tcb.snd_wscale > 0, "{tcb:?}");
    assert_eq!(pair.b.tcb(b).unwrap().bytes_in, data.len() as u64);

    pair.a.close(a);
    pair.settle(false, Duration::ZERO);
    assert_eq!(pair.b.status(b), Some(LinkStatus::PeerClosed));
    assert_eq!(pair.a.status(a), Some(LinkStatus::Closing));
    pair.b.close(b);
    pair.settle(false, Duration::ZERO);
    assert_eq!(pair.b.status(b), Some(LinkStatus::Closed(CloseReason::Graceful)));
    assert_eq!(pair.a.status(a), Some(LinkStatus::Closed(CloseReason::Graceful)));
    pair.a.release(a);
    pair.b.release(b);
    pair.settle(true, Duration::from_secs(120));
    assert_eq!(pair.b.socket_count(), 1, "only the listening socket is left");
    assert_eq!(pair.a.socket_count(), 0, "TIME-WAIT over");
    assert_eq!(pair.strays, 0);
}

#[test]
fn reset_timeout_and_backlog() {
    let mut pair = Pair::linked(|mut c| {
        c.timeout = Some(Duration::from_secs(5));
        c
    });
    pair.b.listen(4791, 2).unwrap();
    let remote = SocketAddrV4::new(IP_B, 4791);
    let ids: Vec<SocketId> = (0..3).map(|i| pair.a.connect(pair.now, 40000 + i, remote, MAC_B).unwrap()).collect();
    pair.settle(false, Duration::ZERO);
    // Backlog 2: the third SYN is refused.
    assert_eq!(pair.a.status(ids[0]), Some(LinkStatus::Established));
    assert_eq!(pair.a.status(ids[1]), Some(LinkStatus::Established));
    assert_eq!(pair.a.status(ids[2]), Some(LinkStatus::Closed(CloseReason::Reset)));
    let b0 = pair.b.accept(4791).unwrap();
    let b1 = pair.b.accept(4791).unwrap();
    assert!(pair.b.accept(4791).is_none());
    // After accepting, the port takes new connections again.
    let again = pair.a.connect(pair.now, 40010, remote, MAC_B).unwrap();
    pair.settle(false, Duration::ZERO);
    assert_eq!(pair.a.status(again), Some(LinkStatus::Established));

    // Abort on one side is a reset on the other.
    pair.b.abort(b0);
    pair.settle(false, Duration::ZERO);
    assert_eq!(pair.b.status(b0), Some(LinkStatus::Closed(CloseReason::Aborted)));
    assert_eq!(pair.a.status(ids[0]), Some(LinkStatus::Closed(CloseReason::Reset)));

    // Blackhole on the link: data outstanding, nothing comes back: timeout.
    pair.a.set_fault(pair.now, ids[1], LinkFault::Blackhole(true)).unwrap();
    assert!(pair.a.tcb(ids[1]).unwrap().blackholed);
    pair.a.send_slice(ids[1], b"hello").unwrap();
    pair.settle(true, Duration::from_secs(30));
    assert_eq!(pair.a.status(ids[1]), Some(LinkStatus::Closed(CloseReason::Timeout)));
    assert!(pair.a.tcb(ids[1]).unwrap().retransmits > 0);
    assert!(pair.a.fault_counters().dropped > 0);
    // The connection's faults end when the engine releases it.
    pair.a.release(ids[1]);
    assert_eq!(
        pair.a.set_fault(pair.now, SocketId { index: 999, generation: 0 }, LinkFault::Blackhole(true)),
        Err(TcpError::NoSocket)
    );
    let _ = b1;
}

#[test]
fn demux_accepts_only_offloaded_traffic() {
    let mut pair = Pair::new(|c| c);
    pair.b.listen(4791, 1).unwrap();
    let a = pair.a.connect(pair.now, 40000, SocketAddrV4::new(IP_B, 4791), MAC_B).unwrap();
    let mut syn = Vec::new();
    pair.a.egress(pair.now, &mut |f| syn = f.to_vec());
    assert!(pair.b.wants(&syn));
    assert!(!pair.a.wants(&syn), "not addressed to A");
    let mut other_port = syn.clone();
    other_port[36..38].copy_from_slice(&22u16.to_be_bytes());
    assert!(!pair.b.wants(&other_port));
    let mut other_mac = syn.clone();
    other_mac[5] ^= 1;
    assert!(!pair.b.wants(&other_mac));
    assert!(!pair.b.wants(&syn[..40]));
    let arp = frame::arp_reply(MAC_B, IP_B, MAC_A, IP_A);
    assert!(!pair.b.wants(&arp));
    let _ = a;
}

#[test]
fn more_peers_than_neighbour_cache_entries() {
    // 80 peers, smoltcp caches 64 neighbours: entries get evicted, smoltcp
    // asks by ARP, the TOE re-announces; every connection comes up and
    // carries data.
    const PEERS: u8 = 80;
    let mut now = Instant::from_millis(1000);
    let mut hub = SmolToe::new(TcpConfig::new(MAC_A, IP_A), now).unwrap();
    let peer_mac = |i: u8| [0x52, 0x54, 0, 1, 0, i];
    let peer_ip = |i: u8| Ipv4Addr::new(10, 1, 0, i + 2);
    let mut peers: Vec<SmolToe> = (0..PEERS)
        .map(|i| {
            let mut c = TcpConfig::new(peer_mac(i), peer_ip(i));
            c.rx_buffer = 4096;
            c.tx_buffer = 4096;
            let mut toe = SmolToe::new(c, now).unwrap();
            toe.listen(5000, 1).unwrap();
            toe
        })
        .collect();
    let ids: Vec<SocketId> = (0..PEERS)
        .map(|i| {
            let remote = SocketAddrV4::new(peer_ip(i), 5000);
            hub.connect(now, 30_000 + u16::from(i), remote, peer_mac(i)).unwrap()
        })
        .collect();
    let mut sent = false;
    let mut done = false;
    for _ in 0..400 {
        let mut to_peers = Vec::new();
        hub.egress(now, &mut |f| to_peers.push(f.to_vec()));
        let mut to_hub = Vec::new();
        for frame in &to_peers {
            for peer in peers.iter_mut().filter(|p| p.wants(frame)) {
                peer.ingress(now, frame, &mut |f| to_hub.push(f.to_vec()));
            }
        }
        for peer in peers.iter_mut() {
            peer.egress(now, &mut |f| to_hub.push(f.to_vec()));
        }
        for frame in &to_hub {
            hub.ingress(now, frame, &mut |_| {});
        }
        let up = ids.iter().all(|&id| hub.status(id) == Some(LinkStatus::Established));
        if up && !sent {
            for &id in &ids {
                hub.send_slice(id, b"ping").unwrap();
            }
            sent = true;
        }
        let acked = |id| hub.tcb(id).is_some_and(|t| t.bytes_out == 4 && t.snd_una == t.snd_nxt);
        if sent && ids.iter().all(|&id| acked(id)) {
            done = true;
            break;
        }
        now += Duration::from_millis(50);
    }
    assert!(done, "{:?}", ids.iter().map(|&id| hub.status(id)).collect::<Vec<_>>());
}

/// Runs one stack alone until it has nothing to do (advancing time to
/// its timers up to `limit`); every frame it sends to the wire is kept.
fn settle_alone(toe: &mut impl Transport, now: &mut Instant, limit: Duration, wire: &mut Vec<Vec<u8>>) {
    let end = *now + limit;
    loop {
        toe.egress(*now, &mut |f| wire.push(f.to_vec()));
        match toe.poll_at(*now) {
            Some(next) if next <= *now => continue,
            Some(next) if next <= end => *now = next,
            _ => return,
        }
    }
}

/// One stack behind its link, with a connection from its own address to
/// itself: (stack, now, frames that reached the wire, active end, passive end).
fn looped_connection(config: TcpConfig) -> (Link<SmolToe>, Instant, Vec<Vec<u8>>, SocketId, SocketId) {
    let mut now = Instant::from_millis(1000);
    let mut toe = Link::new(SmolToe::new(config, now).unwrap());
    let mut wire = Vec::new();
    toe.listen(4791, 4).unwrap();
    let a = toe.connect(now, 40000, SocketAddrV4::new(config.ip, 4791), config.mac).unwrap();
    settle_alone(&mut toe, &mut now, Duration::ZERO, &mut wire);
    let b = toe.accept(4791).unwrap();
    (toe, now, wire, a, b)
}

#[test]
fn a_connection_to_our_own_address_never_touches_the_wire() {
    let (mut toe, mut now, mut wire, a, b) = looped_connection(TcpConfig::new(MAC_A, IP_A));
    assert_eq!(toe.status(a), Some(LinkStatus::Established));
    assert_eq!(toe.status(b), Some(LinkStatus::Established));

    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13) as u8).collect();
    let (mut sent, mut got) = (0, Vec::new());
    while got.len() < data.len() {
        sent += toe.send_slice(a, &data[sent..]).unwrap();
        settle_alone(&mut toe, &mut now, Duration::from_secs(1), &mut wire);
        got.extend(read_all(&mut toe, b));
    }
    assert_eq!(got, data);
    assert_eq!(toe.tcb(a).unwrap().retransmits, 0, "{:?} {:?}", toe.tcb(a), toe.fault_counters());

    toe.close(a);
    settle_alone(&mut toe, &mut now, Duration::ZERO, &mut wire);
    assert_eq!(toe.status(b), Some(LinkStatus::PeerClosed));
    toe.close(b);
    settle_alone(&mut toe, &mut now, Duration::ZERO, &mut wire);
    assert_eq!(toe.status(a), Some(LinkStatus::Closed(CloseReason::Graceful)));
    assert_eq!(toe.status(b), Some(LinkStatus::Closed(CloseReason::Graceful)));
    assert!(wire.is_empty(), "{} frames reached the wire", wire.len());
    assert_eq!(toe.fault_counters().loop_overflow, 0);
}

#[test]
fn the_link_faults_a_connection_to_our_own_address_too() {
    // Looped frames pass the link like any other: a blackholed loopback
    // connection times out, and not one frame reaches the wire.
    let mut config = TcpConfig::new(MAC_A, IP_A);
    config.timeout = Some(Duration::from_secs(5));
    let (mut toe, mut now, mut wire, a, b) = looped_connection(config);
    toe.set_fault(now, a, LinkFault::Blackhole(true)).unwrap();
    toe.send_slice(a, b"hello").unwrap();
    settle_alone(&mut toe, &mut now, Duration::from_secs(30), &mut wire);
    assert!(read_all(&mut toe, b).is_empty());
    assert_eq!(toe.status(a), Some(LinkStatus::Closed(CloseReason::Timeout)));
    assert!(toe.fault_counters().dropped > 0);
    assert!(wire.is_empty(), "{} frames reached the wire", wire.len());
}

#[test]
fn a_released_time_wait_gives_way_to_a_new_connection_on_its_tuple() {
    let mut pair = Pair::new(|c| c);
    pair.b.listen(4791, 4).unwrap();
    let remote = SocketAddrV4::new(IP_B, 4791);
    let a = pair.a.connect(pair.now, 40000, remote, MAC_B).unwrap();
    pair.settle(false, Duration::ZERO);
    let b = pair.b.accept(4791).unwrap();
    // a closes first: a's end waits in TIME-WAIT.
    pair.a.close(a);
    pair.settle(false, Duration::ZERO);
    pair.b.close(b);
    pair.settle(false, Duration::ZERO);
    assert_eq!(pair.a.tcb(a).unwrap().state, TcpState::TimeWait);
    assert_eq!(
        pair.a.connect(pair.now, 40000, remote, MAC_B),
        Err(TcpError::PortInUse(40000)),
        "still held by the engine"
    );
    pair.a.release(a);
    pair.b.release(b);
    pair.settle(false, Duration::ZERO);
    let again = pair.a.connect(pair.now, 40000, remote, MAC_B).unwrap();
    pair.settle(true, Duration::from_secs(1));
    let b2 = pair.b.accept(4791).unwrap();
    assert_eq!(pair.a.status(again), Some(LinkStatus::Established));
    assert_eq!(pair.b.status(b2), Some(LinkStatus::Established));
    assert_eq!(pair.a.status(a), None, "the old connection is gone");
}

/// Egress sends no more frames than the uplink said it has room for; the
/// rest waits in the socket (no loss, so no retransmission) until the
/// room is given back.
#[test]
fn egress_stays_within_the_uplink_room() {
    let mut pair = Pair::new(|c| c);
    pair.b.listen(4791, 4).unwrap();
    let a = pair.a.connect(pair.now, 40000, SocketAddrV4::new(IP_B, 4791), MAC_B).unwrap();
    pair.settle(false, Duration::ZERO);
    let b = pair.b.accept(4791).unwrap();
    let data: Vec<u8> = (0..20_000u32).map(|i| (i * 3) as u8).collect();
    assert_eq!(pair.a.send_slice(a, &data).unwrap(), data.len());

    // The initial congestion window allows two segments.
    pair.a.set_egress_room(1);
    let mut frames = Vec::new();
    pair.a.egress(pair.now, &mut |f| frames.push(f.to_vec()));
    pair.a.egress(pair.now, &mut |f| frames.push(f.to_vec()));
    assert_eq!(frames.len(), 1, "two egress calls share the room");
    pair.a.set_egress_room(0);
    pair.a.egress(pair.now, &mut |f| frames.push(f.to_vec()));
    assert_eq!(frames.len(), 1, "no room: nothing leaves");
    assert!(pair.a.poll_at(pair.now).is_some_and(|at| at <= pair.now), "data waits: poll again");

    pair.wire.extend(frames.into_iter().map(|f| (true, f)));
    pair.a.set_egress_room(usize::MAX);
    let mut got = Vec::new();
    while got.len() < data.len() {
        pair.settle(true, Duration::from_secs(1));
        got.extend(read_all(&mut pair.b, b));
    }
    assert_eq!(got, data);
    assert_eq!(pair.a.tcb(a).unwrap().retransmits, 0);
}

#[test]
fn buffer_sizes_follow_the_budget() {
    const K: usize = 1024;
    let mut c = TcpConfig::new(MAC_A, IP_A);
    c.rx_buffer = 256 * K;
    c.tx_buffer = 256 * K;
    c.buffer_budget = 2048 * K;
    assert_eq!(c.buffer_floor(), 64 * K);
    // Alone: the maxima.
    assert_eq!(c.buffer_sizes(0, 0), (256 * K, 256 * K));
    // An equal share among the sockets there are (7 + this one) …
    assert_eq!(c.buffer_sizes(7, 0), (128 * K, 128 * K));
    // … but no more than is left …
    assert_eq!(c.buffer_sizes(1, 1792 * K), (128 * K, 128 * K));
    // … and the floor once it is spent.
    assert_eq!(c.buffer_sizes(4, 2048 * K), (64 * K, 64 * K));
    assert_eq!(c.buffer_sizes(10_000, 3072 * K), (64 * K, 64 * K));
    // Whatever the MTU (a segment is at most 65495 octets).
    c.mtu = 65_535;
    assert_eq!(c.buffer_floor(), 64 * K);
    // A floor never exceeds the maxima.
    c.mtu = 1500;
    c.tx_buffer = 16 * K;
    assert_eq!(c.buffer_floor(), 16 * K);
    assert_eq!(c.buffer_sizes(4, 2048 * K), (16 * K, 16 * K));
}

#[test]
fn many_connections_share_the_buffer_budget() {
    const MAX: usize = 256 * 1024;
    const FLOOR: usize = 64 * 1024;
    // Room for two sockets' full buffers, both ways.
    const BUDGET: usize = 4 * MAX;
    let mut pair = Pair::new(|mut c| {
        c.rx_buffer = MAX;
        c.tx_buffer = MAX;
        c.buffer_budget = BUDGET;
        c
    });
    pair.b.listen(4791, 64).unwrap();
    assert_eq!(pair.b.socket_count(), 1, "one socket listens, whatever the backlog");
    assert_eq!(pair.b.buffers_reserved(), 2 * MAX);
    let remote = SocketAddrV4::new(IP_B, 4791);
    let ids: Vec<SocketId> = (0..40).map(|i| pair.a.connect(pair.now, 40000 + i, remote, MAC_B).unwrap()).collect();
    pair.settle(false, Duration::ZERO);
    let accepted: Vec<SocketId> = (0..40).map(|_| pair.b.accept(4791).unwrap()).collect();
    assert!(pair.b.accept(4791).is_none());
    // 40 connections and B's listening socket, within the bound.
    assert_eq!(pair.a.socket_count(), 40);
    assert_eq!(pair.b.socket_count(), 41);
    for toe in [&pair.a, &pair.b] {
        assert!(toe.buffers_reserved() <= BUDGET + toe.socket_count() * 2 * FLOOR);
    }
    // The first two got full buffers (the budget), the rest the floor.
    assert_eq!(pair.a.buffers_reserved(), 2 * (2 * MAX) + 38 * 2 * FLOOR);
    assert_eq!(pair.a.tcb(ids[0]).unwrap().rcv_wnd, Some(MAX as u32));
    assert_eq!(pair.a.tcb(ids[39]).unwrap().rcv_wnd, Some(FLOOR as u32));

    // A connection on the floor carries data past its window.
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 13) as u8).collect();
    let late = ids[39];
    let mut sent = 0;
    let mut got = Vec::new();
    let mut rounds = 0;
    while got.len() < data.len() {
        sent += pair.a.send_slice(late, &data[sent..]).unwrap();
        pair.settle(true, Duration::from_millis(100));
        for &b in &accepted {
            got.extend(read_all(&mut pair.b, b));
        }
        rounds += 1;
        assert!(rounds < 1000, "{} of {} octets", got.len(), data.len());
    }
    assert_eq!(got, data);

    // All closed: the budget is back.
    for &id in &ids {
        pair.a.close(id);
        pair.a.release(id);
    }
    for &id in &accepted {
        pair.b.close(id);
        pair.b.release(id);
    }
    pair.settle(true, Duration::from_secs(120));
    assert_eq!(pair.a.socket_count(), 0);
    assert_eq!(pair.a.buffers_reserved(), 0);
    assert_eq!(pair.b.socket_count(), 1);
}

/// Frames one egress call of `toe` sends at `now`.
fn egress_at(toe: &mut SmolToe, now: Instant) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    toe.egress(now, &mut |f| out.push(f.to_vec()));
    out
}

/// `n` established connections from A to B's port 4791, opened at `now`.
fn open(pair: &mut Pair, ports: std::ops::Range<u16>) -> Vec<SocketId> {
    let remote = SocketAddrV4::new(IP_B, 4791);
    let ids: Vec<SocketId> = ports.map(|port| pair.a.connect(pair.now, port, remote, MAC_B).unwrap()).collect();
    pair.settle(false, Duration::ZERO);
    for &id in &ids {
        assert_eq!(pair.a.status(id), Some(LinkStatus::Established));
        assert!(pair.b.accept(4791).is_some());
    }
    ids
}

#[test]
fn a_timer_of_an_idle_connection_fires_on_time_among_many() {
    let keep_alive = Duration::from_secs(2);
    let mut pair = Pair::new(|mut c| {
        c.keep_alive = Some(keep_alive);
        c.ack_delay = None;
        c
    });
    pair.b.listen(4791, 128).unwrap();
    let opened = pair.now;
    let first = open(&mut pair, 40000..40001)[0];
    // 100 more, half a second later: their timers come after the first's.
    pair.now += Duration::from_millis(500);
    let rest = open(&mut pair, 40001..40101);
    assert_eq!(pair.a.socket_count(), 101);

    // The first connection's keep-alive is A's next timer, exactly.
    let due = opened + keep_alive;
    assert_eq!(pair.a.poll_at(pair.now), Some(due));
    let polls = pair.a.socket_polls();
    assert!(egress_at(&mut pair.a, due - Duration::from_micros(1)).is_empty(), "nothing before its time");
    assert_eq!(pair.a.socket_polls(), polls, "no socket is due before");
    let out = egress_at(&mut pair.a, due);
    assert_eq!(pair.a.socket_polls(), polls + 1, "only the due socket is polled");
    assert_eq!(out.len(), 1, "one keep-alive probe");
    let probe = frame::parse(&out[0]).unwrap();
    assert_eq!(Some(probe.tuple_at_sender()), pair.a.tcb(first).unwrap().tuple);
    assert!(probe.has(flags::ACK) && !probe.has(flags::SYN | flags::FIN | flags::RST));
    // Then the other 100, at theirs.
    assert_eq!(pair.a.poll_at(due), Some(due + Duration::from_millis(500)));
    let out = egress_at(&mut pair.a, due + Duration::from_millis(500));
    assert_eq!(out.len(), rest.len(), "one probe each");
    let probed: std::collections::BTreeSet<FourTuple> =
        out.iter().map(|f| frame::parse(f).unwrap().tuple_at_sender()).collect();
    let expected: std::collections::BTreeSet<FourTuple> =
        rest.iter().map(|&id| pair.a.tcb(id).unwrap().tuple.unwrap()).collect();
    assert_eq!(probed, expected);
}

#[test]
fn a_segment_of_an_unknown_tuple_to_a_listening_port_is_refused_with_rst() {
    let mut pair = Pair::new(|c| c);
    pair.b.listen(4791, 4).unwrap();
    let a = open(&mut pair, 40000..40001)[0];
    // A B that never heard of the connection (restarted), listening again.
    let now = pair.now;
    let mut fresh_b = SmolToe::new(TcpConfig::new(MAC_B, IP_B), now).unwrap();
    fresh_b.listen(4791, 4).unwrap();
    pair.a.send_slice(a, b"anyone there?").unwrap();
    let data = egress_at(&mut pair.a, now);
    assert_eq!(data.len(), 1);
    assert!(fresh_b.wants(&data[0]), "a listening port's traffic is the TOE's");
    let mut replies = Vec::new();
    fresh_b.ingress(now, &data[0], &mut |f| replies.push(f.to_vec()));
    assert_eq!(fresh_b.socket_polls(), 1, "one set: the listening socket's");
    assert_eq!(replies.len(), 1, "answered at once");
    let rst = frame::parse(&replies[0]).unwrap();
    assert!(rst.has(flags::RST), "{rst:?}");
    assert_eq!(rst.tuple_at_receiver(), pair.a.tcb(a).unwrap().tuple.unwrap());
    assert_eq!(rst.dst_mac, MAC_A);
    assert_eq!(fresh_b.socket_count(), 1, "no socket made for it");
    assert!(egress_at(&mut fresh_b, now).is_empty());
    pair.a.ingress(now, &replies[0], &mut |_| {});
    assert_eq!(pair.a.status(a), Some(LinkStatus::Closed(CloseReason::Reset)));
}

#[test]
fn a_syn_to_a_listening_port_makes_the_connection_its_own_socket() {
    let mut pair = Pair::new(|c| c);
    pair.b.listen(4791, 4).unwrap();
    pair.b.listen(4792, 4).unwrap();
    assert_eq!(pair.b.socket_count(), 2, "one listening socket per port");
    let now = pair.now;
    let a = pair.a.connect(now, 40000, SocketAddrV4::new(IP_B, 4791), MAC_B).unwrap();
    let syn = egress_at(&mut pair.a, now);
    assert_eq!(syn.len(), 1);
    let mut replies = Vec::new();
    assert_eq!(pair.b.poll_at(now), None, "listening sockets have no timers");
    let polls = pair.b.socket_polls();
    pair.b.ingress(now, &syn[0], &mut |f| replies.push(f.to_vec()));
    assert_eq!(pair.b.socket_polls(), polls + 1, "the SYN went to port 4791's listening socket alone");
    assert!(replies.is_empty(), "the SYN-ACK goes out on egress");
    // The listening socket became the connection's; a new one listens.
    assert_eq!(pair.b.socket_count(), 3);
    let mut tcbs = Vec::new();
    pair.b.for_each_tcb(&mut |tcb| tcbs.push(*tcb));
    let tuple = frame::parse(&syn[0]).unwrap().tuple_at_receiver();
    let half_open: Vec<&TcbInfo> = tcbs.iter().filter(|t| t.tuple == Some(tuple)).collect();
    assert_eq!(half_open.len(), 1);
    assert_eq!(half_open[0].state, TcpState::SynReceived);
    assert_eq!(half_open[0].listen_port, Some(4791));
    let listening: Vec<Option<u16>> =
        tcbs.iter().filter(|t| t.state == TcpState::Listen).map(|t| t.listen_port).collect();
    assert_eq!(listening.len(), 2);
    assert!(listening.contains(&Some(4791)) && listening.contains(&Some(4792)));
    // Its timer is due: the SYN-ACK, once.
    assert_eq!(pair.b.poll_at(now).map(|at| at <= now), Some(true));
    let polls = pair.b.socket_polls();
    let syn_ack = egress_at(&mut pair.b, now);
    assert_eq!(pair.b.socket_polls(), polls + 1, "egress polled the new connection alone");
    assert_eq!(syn_ack.len(), 1);
    let segment = frame::parse(&syn_ack[0]).unwrap();
    assert!(segment.has(flags::SYN) && segment.has(flags::ACK));
    assert_eq!(segment.tuple_at_sender(), tuple);
    // A duplicate SYN makes nothing new and is not answered again now.
    pair.b.ingress(now, &syn[0], &mut |f| replies.push(f.to_vec()));
    assert!(replies.is_empty());
    assert_eq!(pair.b.socket_count(), 3);
    assert!(egress_at(&mut pair.b, now).is_empty());
    // The handshake completes through it.
    pair.a.ingress(now, &syn_ack[0], &mut |_| {});
    for ack in egress_at(&mut pair.a, now) {
        pair.b.ingress(now, &ack, &mut |_| {});
    }
    assert_eq!(pair.a.status(a), Some(LinkStatus::Established));
    let b = pair.b.accept(4791).unwrap();
    assert_eq!(pair.b.tcb(b).unwrap().tuple, Some(tuple));
    assert!(pair.b.accept(4792).is_none());
}

/// A connection from A port 40000 to B's listening port 4791, accepted.
fn established(pair: &mut Pair) -> (SocketId, SocketId) {
    pair.b.listen(4791, 4).unwrap();
    let remote = SocketAddrV4::new(IP_B, 4791);
    let a = pair.a.connect(pair.now, 40000, remote, MAC_B).unwrap();
    pair.settle(false, Duration::ZERO);
    let b = pair.b.accept(4791).unwrap();
    (a, b)
}

/// A message each way, read at once (what the MPA handshake does).
fn exchange(pair: &mut Pair, a: SocketId, b: SocketId, len: usize) {
    let data = vec![0x4d; len];
    assert_eq!(pair.a.send_slice(a, &data).unwrap(), len);
    pair.settle(false, Duration::ZERO);
    assert_eq!(read_all(&mut pair.b, b), data);
    assert_eq!(pair.b.send_slice(b, &data).unwrap(), len);
    pair.settle(false, Duration::ZERO);
    assert_eq!(read_all(&mut pair.a, a), data);
}

/// A connection whose ACKs go at once (so its buffers are empty when
/// `exchange` returns), and the TOEs' buffer release delay.
fn established_acking_at_once() -> (Pair, SocketId, SocketId, Duration) {
    let mut pair = Pair::new(|mut c| {
        c.ack_delay = None;
        c
    });
    let release = pair.a.config().buffer_release.unwrap();
    let (a, b) = established(&mut pair);
    (pair, a, b, release)
}

fn resident(pair: &Pair) -> (usize, usize) {
    (pair.a.resident_buffer_pages(), pair.b.resident_buffer_pages())
}

#[test]
fn idle_buffers_give_their_pages_back_and_data_passes_after() {
    let (mut pair, a, b, release) = established_acking_at_once();
    assert_eq!(resident(&pair), (0, 0), "a handshake without data touches no page");
    exchange(&mut pair, a, b, 300);
    let (pages_a, pages_b) = resident(&pair);
    assert!(pages_a >= 2 && pages_b >= 2, "{pages_a}, {pages_b}");

    // Not before the buffers stayed empty for `release`, then all of them.
    let emptied = pair.now;
    pair.settle(true, release - Duration::from_millis(1));
    assert!(pair.now < emptied + release);
    pair.now = emptied + release - Duration::from_millis(1);
    assert_eq!(resident(&pair), (pages_a, pages_b));
    pair.settle(true, Duration::from_millis(2));
    assert_eq!(resident(&pair), (0, 0), "an idle connection holds no buffer page");

    // Data flows through the released buffers (pages faulted in anew).
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
    let mut sent = 0;
    let mut got = Vec::new();
    while got.len() < data.len() {
        sent += pair.a.send_slice(a, &data[sent..]).unwrap();
        pair.settle(true, Duration::from_millis(50));
        got.extend(read_all(&mut pair.b, b));
    }
    assert_eq!(got, data);
    assert!(resident(&pair).1 > 0);
    pair.settle(true, release + Duration::from_millis(1));
    assert_eq!(resident(&pair), (0, 0));
    assert_eq!(pair.a.status(a), Some(LinkStatus::Established));
    assert_eq!(pair.a.tcb(a).unwrap().retransmits, 0);
}

#[test]
fn data_held_out_of_order_keeps_its_pages() {
    let (mut pair, a, b, release) = established_acking_at_once();
    // Pages in use: B's buffers will be empty-and-due during what follows.
    exchange(&mut pair, a, b, 300);

    // Two segments; the first is lost, so B holds the second out of
    // order (its receive queue, in order, stays empty).
    let data: Vec<u8> = (0..2000u32).map(|i| (i % 251) as u8 + 1).collect();
    assert_eq!(pair.a.send_slice(a, &data).unwrap(), data.len());
    let frames = egress_at(&mut pair.a, pair.now);
    assert_eq!(frames.len(), 2);
    for frame in &frames[1..] {
        pair.b.ingress(pair.now, frame, &mut |_| {});
    }
    assert_eq!(pair.b.recv_queue(b), 0);
    // Well past the release time (B's duplicate ACKs go nowhere).
    for _ in 0..4 {
        pair.now += release;
        let _ = egress_at(&mut pair.b, pair.now);
    }
    assert!(pair.b.resident_buffer_pages() > 0, "held data keeps its page");
    // The lost segment comes: all of it reads back, none of it zeroed.
    pair.b.ingress(pair.now, &frames[0], &mut |_| {});
    assert_eq!(read_all(&mut pair.b, b), data);
}
