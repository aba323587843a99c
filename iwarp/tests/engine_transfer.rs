//! Two engines back to back over a simulated wire with seeded loss,
//! duplication and reordering and varied MTUs: SEND, WRITE and READ of
//! sizes from 1 octet to 4 MiB, verified octet for octet in mock guest
//! memory, and many QPs at once.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod support;

use std::time::Instant as WallClock;

use support::*;
use vt3_iwarp::engine::*;
use vt3_iwarp::sim::*;
use vt3_iwarp::toe::Duration;

const ALL: Access = LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ;

fn lossy_pair(mtu_a: usize, mtu_b: usize, seed: u64, memory: usize) -> Sim<Node, Node> {
    let mut a = NodeConfig::new(0);
    let mut b = NodeConfig::new(1);
    a.tcp.mtu = mtu_a;
    b.tcp.mtu = mtu_b;
    a.memory = memory;
    b.memory = memory;
    Sim::pair(a, b, WireConfig::lossy(seed))
}

/// One SEND, one WRITE and one READ of `len` octets from A to B (the READ
/// pulls B's data back to A); checks every octet.
fn transfer(sim: &mut Sim<Node, Node>, arenas: &mut [Arena; 2], rng: &mut Rng, len: u64, wr_id: u64) {
    let (o1, o2, o3) = (rng.below(4096), rng.below(4096), rng.below(4096));
    let src = arenas[0].register(&mut sim.a, ALL, len, Some(rng), o1);
    let dst = arenas[1].register(&mut sim.b, ALL, len, Some(rng), o2);
    let back = arenas[0].register(&mut sim.a, ALL, len, Some(rng), o3);
    let data = random_bytes(rng, len as usize);
    fill_buf(&mut sim.a, &src, 0, &data);
    let before_a = sim.a.completions.len();
    let before_b = sim.b.completions.len();

    // SEND, split over up to 4 SGEs on both sides.
    let cut = |rng: &mut Rng| -> Vec<(u64, u64)> {
        let mut pieces = Vec::new();
        let parts = 1 + rng.below(4.min(len)) as usize;
        let mut at = 0;
        for i in 0..parts {
            let left = len - at;
            let take = if i + 1 == parts { left } else { 1 + rng.below(left - (parts - i - 1) as u64) };
            pieces.push((at, take));
            at += take;
        }
        pieces
    };
    let send_sges: Vec<Sge> = cut(rng).iter().map(|&(o, l)| src.sge(o, l)).collect();
    let recv_sges: Vec<Sge> = cut(rng).iter().map(|&(o, l)| dst.sge(o, l)).collect();
    sim.b.engine.post_recv(2, recv_wr(wr_id, &recv_sges)).unwrap();
    sim.a.engine.post_send(1, send_wr(wr_id, SendOpcode::Send, &send_sges)).unwrap();
    let ok = sim
        .run_until(Duration::from_secs(600), |s| s.b.completions.len() > before_b && s.a.completions.len() > before_a);
    assert!(ok, "SEND {len}: {:?} {:?} {:?}", sim.wire.stats, sim.a.events, sim.b.events);
    let recv = sim.b.completions[before_b];
    assert_eq!((recv.wr_id, recv.status, u64::from(recv.byte_len)), (wr_id, WcStatus::Success, len));
    assert!(read_buf(&sim.b, &dst, 0, len) == data, "SEND {len}: data differs");

    // WRITE over it with other data, then READ it back into `back`.
    let data2 = random_bytes(rng, len as usize);
    fill_buf(&mut sim.a, &src, 0, &data2);
    sim.a.engine.post_send(1, rdma_wr(wr_id + 1, SendOpcode::Write, &[src.sge(0, len)], &dst, 0)).unwrap();
    sim.a.engine.post_send(1, rdma_wr(wr_id + 2, SendOpcode::Read, &[back.sge(0, len)], &dst, 0)).unwrap();
    let ok = sim.run_until(Duration::from_secs(600), |s| s.a.completions.len() >= before_a + 3);
    assert!(ok, "WRITE/READ {len}: {:?}", sim.wire.stats);
    let done: Vec<(u64, WcStatus)> = sim.a.completions[before_a..].iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(done, vec![(wr_id, WcStatus::Success), (wr_id + 1, WcStatus::Success), (wr_id + 2, WcStatus::Success)]);
    assert!(read_buf(&sim.b, &dst, 0, len) == data2, "WRITE {len}: data differs");
    assert!(read_buf(&sim.a, &back, 0, len) == data2, "READ {len}: data differs");
}

#[test]
fn sizes_from_one_octet_to_four_mib_over_a_lossy_wire() {
    let wall = WallClock::now();
    // (MTU A, MTU B): small, Ethernet, asymmetric, jumbo.
    let setups: [(usize, usize, &[u64]); 4] = [
        (576, 576, &[1, 2, 3, 4, 5, 511, 512, 513, 4095, 4096, 4097, 70_000]),
        (1500, 1500, &[1, 7, 1453, 1454, 1455, 65_535, 65_536, 300_000, 4 << 20]),
        (9000, 1500, &[1, 13, 8_999, 100_000, 1 << 20]),
        (1500, 9000, &[33, 9_001, 200_000, 1 << 20]),
    ];
    let mut rng = Rng::new(42);
    for (round, &(mtu_a, mtu_b, sizes)) in setups.iter().enumerate() {
        let mut sim = lossy_pair(mtu_a, mtu_b, 100 + round as u64, 20 << 20);
        assert!(sim.connect_qps(1, 2, 40_000, QpConfig::new(PD)), "connect");
        let mut arenas = [Arena::new(0, 20 << 20), Arena::new(0, 20 << 20)];
        for (i, &len) in sizes.iter().enumerate() {
            transfer(&mut sim, &mut arenas, &mut rng, len, 100 * i as u64);
        }
        let stats = sim.wire.stats;
        assert!(stats.lost > 0 && stats.duplicated > 0 && stats.reordered > 0, "{stats:?}");
        eprintln!(
            "MTU {mtu_a}/{mtu_b}: {stats:?}, {} steps, {:?} virtual, tcb A {:?}",
            sim.steps,
            sim.now,
            sim.a.engine.tcb(1).map(|t| (t.retransmits, t.srtt))
        );
    }
    eprintln!("wall time {:?}", wall.elapsed());
}

#[test]
fn sixteen_qps_at_once_over_a_lossy_wire() {
    let mut sim = lossy_pair(1500, 1500, 7, 24 << 20);
    let config = QpConfig::new(PD);
    for i in 0..16u32 {
        sim.start_connect(100 + i, 200 + i, 41_000 + i as u16, config);
    }
    let up = sim.run_until(Duration::from_secs(30), |s| {
        s.accept_requests(config);
        (0..16).all(|i| s.a.state(100 + i) == Some(QpState::Rts) && s.b.state(200 + i) == Some(QpState::Rts))
    });
    assert!(up, "{:?}", sim.b.events);
    let mut rng = Rng::new(16);
    let mut arenas = [Arena::new(0, 24 << 20), Arena::new(0, 24 << 20)];
    struct Check {
        qpn_b: u32,
        dst: Buf,
        back: Buf,
        send_data: Vec<u8>,
        write_data: Vec<u8>,
        recv_at: Buf,
    }
    let mut checks = Vec::new();
    for i in 0..16u32 {
        let len = 1 + rng.below(200_000);
        let (qa, qb) = (100 + i, 200 + i);
        let src = arenas[0].register(&mut sim.a, ALL, len, Some(&mut rng), 0);
        let wsrc = arenas[0].register(&mut sim.a, ALL, len, None, 0);
        let back = arenas[0].register(&mut sim.a, ALL, len, None, 0);
        let dst = arenas[1].register(&mut sim.b, ALL, len, Some(&mut rng), 0);
        let recv_at = arenas[1].register(&mut sim.b, LOCAL_WRITE, len, None, 0);
        let send_data = random_bytes(&mut rng, len as usize);
        let write_data = random_bytes(&mut rng, len as usize);
        fill_buf(&mut sim.a, &src, 0, &send_data);
        fill_buf(&mut sim.a, &wsrc, 0, &write_data);
        sim.b.engine.post_recv(qb, recv_wr(u64::from(qb), &[recv_at.sge(0, len)])).unwrap();
        sim.a.engine.post_send(qa, send_wr(1, SendOpcode::Send, &[src.sge(0, len)])).unwrap();
        sim.a.engine.post_send(qa, rdma_wr(2, SendOpcode::Write, &[wsrc.sge(0, len)], &dst, 0)).unwrap();
        let mut read = rdma_wr(3, SendOpcode::Read, &[back.sge(0, len)], &dst, 0);
        read.fence = true;
        sim.a.engine.post_send(qa, read).unwrap();
        checks.push(Check { qpn_b: qb, dst, back, send_data, write_data, recv_at });
    }
    let done = sim.run_until(Duration::from_secs(600), |s| s.a.completions.len() == 48 && s.b.completions.len() == 16);
    assert!(done, "{} {} {:?}", sim.a.completions.len(), sim.b.completions.len(), sim.wire.stats);
    for c in &sim.a.completions {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
    for i in 0..16u32 {
        let ids: Vec<u64> = sim.a.completions.iter().filter(|c| c.qpn == 100 + i).map(|c| c.wr_id).collect();
        assert_eq!(ids, vec![1, 2, 3], "in order per QP");
    }
    for check in &checks {
        let len = check.send_data.len() as u64;
        assert!(sim.b.completions.iter().any(|c| c.qpn == check.qpn_b && c.byte_len as u64 == len));
        assert!(read_buf(&sim.b, &check.recv_at, 0, len) == check.send_data);
        assert!(read_buf(&sim.b, &check.dst, 0, len) == check.write_data);
        assert!(read_buf(&sim.a, &check.back, 0, len) == check.write_data);
    }
}

fn clean_pair() -> Sim<Node, Node> {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    assert!(sim.connect_qps(1, 2, 40_000, QpConfig::new(PD)));
    sim
}

#[test]
fn inline_invalidate_solicited_unsignaled_and_zero_length() {
    let mut sim = clean_pair();
    let mut arenas = [Arena::new(0, 1 << 20), Arena::new(0, 1 << 20)];
    let buf_b = arenas[1].register(&mut sim.b, ALL, 4096, None, 0);
    let plain = arenas[1].register(&mut sim.b, ALL, 4096, None, 0);
    // The peer may invalidate fast-reg MRs only (RFC 5040 as the verbs
    // restrict it): make the target one.
    let mr = sim.b.regions.remove(plain.stag).unwrap();
    let target = Buf { stag: sim.b.regions.register(vt3_iwarp::tpt::Mr { fast_reg: Some(1), ..mr }), ..plain };
    let src = arenas[0].register(&mut sim.a, ALL, 4096, None, 0);
    fill_buf(&mut sim.a, &src, 0, &[0x11; 4096]);
    for i in 0..6 {
        sim.b.engine.post_recv(2, recv_wr(10 + i, &[buf_b.sge(i * 100, 100)])).unwrap();
    }
    // Inline SEND.
    let mut inline = SendWr::new(1, SendOpcode::Send);
    inline.inline = InlineData::new(b"inline payload");
    sim.a.engine.post_send(1, inline).unwrap();
    // SEND_SE, unsignaled SEND, zero-length SEND, SEND_INV, SEND_SE_INV.
    sim.a.engine.post_send(1, send_wr(2, SendOpcode::SendSolicited, &[src.sge(0, 10)])).unwrap();
    let mut quiet = send_wr(3, SendOpcode::Send, &[src.sge(0, 20)]);
    quiet.signaled = false;
    sim.a.engine.post_send(1, quiet).unwrap();
    sim.a.engine.post_send(1, send_wr(4, SendOpcode::Send, &[])).unwrap();
    let mut inv = send_wr(5, SendOpcode::SendInvalidate, &[src.sge(0, 5)]);
    inv.invalidate_stag = target.stag;
    sim.a.engine.post_send(1, inv).unwrap();
    let mut se_inv = send_wr(6, SendOpcode::SendSolicitedInvalidate, &[]);
    se_inv.invalidate_stag = buf_b.stag ^ 0x100; // no such STag: cannot invalidate
                                                 // Zero-length WRITE and READ, inline WRITE.
    let mut zero_write = rdma_wr(7, SendOpcode::Write, &[], &target, 0);
    zero_write.remote_stag = 0xdead_0000; // not checked for zero length
    sim.a.engine.post_send(1, zero_write).unwrap();
    sim.a.engine.post_send(1, rdma_wr(8, SendOpcode::Read, &[], &buf_b, 0)).unwrap();
    let mut inline_write = rdma_wr(9, SendOpcode::Write, &[], &buf_b, 4000);
    inline_write.inline = InlineData::new(&[0x77; 64]);
    sim.a.engine.post_send(1, inline_write).unwrap();
    assert!(sim.run_until(Duration::from_secs(5), |s| s.a.completions.len() == 8));
    let a: Vec<(u64, WcOpcode, WcStatus, bool)> =
        sim.a.completions.iter().map(|c| (c.wr_id, c.opcode, c.status, c.signaled)).collect();
    assert_eq!(a[2], (3, WcOpcode::Send, WcStatus::Success, false), "unsignaled WRs are retired silently");
    assert!(a.iter().all(|c| c.2 == WcStatus::Success));
    let b: Vec<(u64, u32, Option<u32>, bool)> =
        sim.b.completions.iter().map(|c| (c.wr_id, c.byte_len, c.invalidated_stag, c.solicited)).collect();
    assert_eq!(
        b,
        vec![
            (10, 14, None, false),
            (11, 10, None, true),
            (12, 20, None, false),
            (13, 0, None, false),
            (14, 5, Some(target.stag), false),
        ]
    );
    assert_eq!(read_buf(&sim.b, &buf_b, 0, 14), b"inline payload");
    assert_eq!(read_buf(&sim.b, &buf_b, 4000, 64), vec![0x77; 64]);
    // The invalidated STag is dead now.
    assert!(!sim.b.regions.get(target.stag).unwrap().valid);

    // Send with Invalidate of a bad STag: error completion, TERMINATE.
    sim.a.engine.post_send(1, se_inv).unwrap();
    assert!(sim.run_until(Duration::from_secs(5), |s| s.b.state(2) == Some(QpState::Error)
        && s.a.state(1) == Some(QpState::Error)));
    let last = *sim.b.completions.last().unwrap();
    assert_eq!((last.wr_id, last.status), (15, WcStatus::RemInvReqErr));
    assert!(sim.b.qp_events(2).contains(&EventKind::LocalError {
        error: ProtocolError::CannotInvalidate(AccessError::InvalidStag),
        // siw's code for an STag naming nothing: remote operation 0/2/09.
        sent: vt3_iwarp::wire::terminate::TermCode::RdmapOperationStagCannotBeInvalidated,
    }));
}

#[test]
fn reads_beyond_ord_wait_and_complete_in_order_with_fences() {
    let mut sim = clean_pair();
    let mut arenas = [Arena::new(0, 1 << 20), Arena::new(0, 1 << 20)];
    let remote = arenas[1].register(&mut sim.b, ALL, 64 * 1024, None, 0);
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i / 1024) as u8).collect();
    fill_buf(&mut sim.b, &remote, 0, &data);
    let local = arenas[0].register(&mut sim.a, ALL, 64 * 1024, None, 0);
    let src = arenas[0].register(&mut sim.a, ALL, 16, None, 0);
    // 40 READs (ORD 16) interleaved with fenced SENDs.
    sim.b.engine.post_recv(2, recv_wr(1, &[remote.sge(0, 16)])).unwrap();
    for i in 0..40u64 {
        let at = (i % 64) * 1024;
        sim.a.engine.post_send(1, rdma_wr(i, SendOpcode::Read, &[local.sge(at, 1024)], &remote, at)).unwrap();
        if i == 20 {
            let mut fenced = send_wr(1000, SendOpcode::Send, &[src.sge(0, 16)]);
            fenced.fence = true;
            sim.a.engine.post_send(1, fenced).unwrap();
        }
    }
    let mut max_outstanding = 0;
    let done = sim.run_until(Duration::from_secs(10), |s| {
        max_outstanding = max_outstanding.max(s.a.engine.qp_info(1).unwrap().reads_outstanding);
        s.a.completions.len() == 41
    });
    assert!(done);
    assert!(max_outstanding <= 16 && max_outstanding > 1, "{max_outstanding}");
    let ids: Vec<u64> = sim.a.completions.iter().map(|c| c.wr_id).collect();
    let mut expected: Vec<u64> = (0..=20).collect();
    expected.push(1000);
    expected.extend(21..40);
    assert_eq!(ids, expected);
    assert!(read_buf(&sim.a, &local, 0, 40 * 1024) == data[..40 * 1024]);
    // The fenced SEND went out after READs 0..=20 completed.
    assert_eq!(sim.b.completions.len(), 1);
}
