//! QP state machine tests, grouped by the state the QP is in when the
//! trigger happens. Two engines (or an engine and a raw peer) on a
//! simulated wire; time is injected, so timeouts take no wall time.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use std::net::SocketAddrV4;

use super::*;
use crate::mock::MockMemory;
use crate::sim::{Node, NodeConfig, RawPeer, Sim, WireConfig, IPS, MACS, PORT};
use crate::toe::TcpConfig;
use crate::tpt::Tpt;
use crate::wire::terminate::{ErrorClass, TermCode};

const PD: u32 = 3;

mod active;
mod cm;
mod faults;
mod frmr;
mod idle_memory;
mod mw;
mod qp;
mod rereg;
mod rx;
mod srq;
mod tx;

fn pair() -> Sim<Node, Node> {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    assert!(sim.connect_qps(1, 2, 40_000, QpConfig::new(PD)));
    settle_rtr(&mut sim);
    sim.a.events.clear();
    sim.b.events.clear();
    sim
}

/// `pairs` QP pairs connected through MPA (A's QP `1 + i` to B's
/// `101 + i`, from port `40_000 + i`), nothing settled after.
fn connected_pairs(pairs: u32) -> Sim<Node, Node> {
    let mut sim = Sim::pair(NodeConfig::new(0), NodeConfig::new(1), WireConfig::default());
    for i in 0..pairs {
        assert!(sim.connect_qps(1 + i, 101 + i, 40_000 + i as u16, QpConfig::new(PD)));
    }
    sim
}

/// Lets A's RTR (held for `rtr_hold` after the MPA reply) reach B, which
/// sends nothing before it.
fn settle_rtr(sim: &mut Sim<Node, Node>) {
    sim.run_for(EngineConfig::default().rtr_hold + Duration::from_millis(10));
}

fn states(events: &[EventKind]) -> Vec<(QpState, QpState)> {
    events
        .iter()
        .filter_map(|e| match e {
            EventKind::StateChanged { from, to } => Some((*from, *to)),
            _ => None,
        })
        .collect()
}

fn others(events: &[EventKind]) -> Vec<EventKind> {
    events.iter().filter(|e| !matches!(e, EventKind::StateChanged { .. })).cloned().collect()
}

fn settle(sim: &mut Sim<Node, Node>, secs: u64) {
    sim.run_for(Duration::from_secs(secs));
}

/// Completions of `qpn`: (wr_id, opcode, status).
fn results(node: &Node, qpn: u32) -> Vec<(u64, WcOpcode, WcStatus)> {
    node.completions.iter().filter(|c| c.qpn == qpn).map(|c| (c.wr_id, c.opcode, c.status)).collect()
}

fn rdma(wr_id: u64, opcode: SendOpcode, local: (u32, u64), len: u32, stag: u32, to: u64) -> SendWr {
    let mut wr = SendWr::new(wr_id, opcode);
    wr.sges = SgeList::single(Sge { addr: local.1, length: len, lkey: local.0 });
    wr.remote_stag = stag;
    wr.remote_addr = to;
    wr
}

/// A's WRITE of `len` octets (a pattern) to `to` through `stag`, from QP
/// `qp.0` of PD `qp.1`.
fn a_writes_in(sim: &mut Sim<Node, Node>, qp: (u32, u32), stag: u32, to: u64, len: u32) {
    let (qpn, pd) = qp;
    let (astag, aiova) = (sim.a.regions.register_contiguous(pd, LOCAL_WRITE, 0x1000, 0x1000, 8192), 0x1000);
    let data: Vec<u8> = (0..len).map(|i| (i % 241) as u8 ^ 0x5a).collect();
    sim.a.memory.fill(aiova, &data);
    sim.a.engine.post_send(qpn, rdma(1, SendOpcode::Write, (astag, aiova), len, stag, to)).unwrap();
    settle(sim, 2);
}

/// B's QP `bqpn` refused A's access (QP `aqpn`) with `error`, TERMINATE `sent`.
fn refused(sim: &Sim<Node, Node>, aqpn: u32, bqpn: u32, error: ProtocolError, sent: TermCode) {
    assert_eq!(others(&sim.b.qp_events(bqpn)), vec![EventKind::LocalError { error, sent }]);
    assert_eq!(
        others(&sim.a.qp_events(aqpn)),
        vec![EventKind::TerminateReceived { code: sent, class: sent.etype_class() }]
    );
}

fn registered_buffer(node: &mut Node, len: u64) -> (u32, u64) {
    let stag = node.regions.register_contiguous(PD, LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ, 0x1000, 0x1000, len);
    (stag, 0x1000)
}

/// A 4 KiB receive on `qpn`.
fn post_recv(node: &mut Node, qpn: u32, wr_id: u64) {
    let (stag, iova) = registered_buffer(node, 4096);
    let sges = SgeList::single(Sge { addr: iova, length: 4096, lkey: stag });
    node.engine.post_recv(qpn, RecvWr { wr_id, sges }).unwrap();
}

/// A SEND of `len` octets on `qpn`.
fn post_send(node: &mut Node, qpn: u32, wr_id: u64, len: u32) -> Result<(), EngineError> {
    let (stag, iova) = registered_buffer(node, 4096);
    let mut wr = SendWr::new(wr_id, SendOpcode::Send);
    wr.sges = SgeList::single(Sge { addr: iova, length: len, lkey: stag });
    node.engine.post_send(qpn, wr)
}
