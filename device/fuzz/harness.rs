//! Fuzz entry points for vt3d, shared by the cargo-fuzz targets
//! (`fuzz_targets/`) and by `tests/fuzz_smoke.rs`, which runs them on
//! pseudo-random inputs in every `cargo test` and replays
//! `fuzz/regressions/`. Each one must never panic except on its own
//! assertions: a failed assertion (or a panic, or a hang) is a bug in vt3d
//! (docs/architecture.md §9: no panic, no unbounded allocation, no
//! out-of-range access on any guest or network input).
//!
//! The inputs are decoded, not parsed: every byte string means something,
//! and reading past the end yields zeros, so libFuzzer's mutations always
//! reach the code under test. Where a target needs valid objects to get
//! anywhere (a QP needs a PD, two CQs and page lists), the input picks
//! among "valid-ish" templates filled from the harness's own bookkeeping,
//! with a fuzzed field now and then, as well as sending raw bytes.
#![allow(
    dead_code,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::cast_possible_truncation,
    missing_debug_implementations
)]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};
use vt3_iwarp::sim::{Endpoint, Sim, WireConfig, IPS, MACS};
use vt3_iwarp::toe::{Duration, Instant};
use vt3d::abi::{
    self, Access, Cmd, CmdAccept, CmdArmCq, CmdConnect, CmdCreateCq, CmdCreateQp, CmdDisconnect, CmdDoorbell,
    CmdHandle, CmdListen, CmdModifyQp, CmdRegMr, CmdReject, CmdSetAddr, CqStatus, Cqe, CtrlHdr, DeviceAttr, EventCm,
    EventType, MsgType, PortAttr, PrivateData, QpAttr, QpState, QpStatus, RespHandle, RqWqe, SockAddr, SqWqe, Status,
    VT3_PAGE_SIZE, VT3_WQE_SIZE,
};
use vt3d::control::Request;
use vt3d::rnic::wqe::{self, WqeLimits};
use vt3d::rnic::{Counts, Limits, Rnic};
use vt3d::testing::{CqRing, GuestRam, Layout, QpCaps};

// ---------------------------------------------------------------------------
// Input decoding
// ---------------------------------------------------------------------------

/// The fuzz input, read front to back; past its end every read is zero.
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.data.split_at(n.min(self.data.len()));
        self.data = tail;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let src = self.bytes(N);
        out[..src.len()].copy_from_slice(src);
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 != 0
    }
}

/// One of `known` (most of the time) or a fuzzed value (a stale or
/// never-issued handle): handles are where object lifetimes break.
fn pick(input: &mut Input<'_>, known: &[u32]) -> u32 {
    let selector = input.u8();
    match known.len() {
        n if n > 0 && selector < 0xe0 => known[usize::from(selector) % n],
        _ => match selector & 3 {
            0 => 0,
            1 => u32::from(selector),
            _ => input.u32(),
        },
    }
}

/// Overwrites one aligned 32-bit field of `bytes` with a fuzzed value,
/// one time in four: the template stays valid except for that field.
fn mutate(input: &mut Input<'_>, bytes: &mut [u8]) {
    let m = input.u8();
    if m & 0xc0 != 0xc0 || bytes.len() < 4 {
        return;
    }
    let at = usize::from(m & 0x3f) * 4 % (bytes.len() / 4 * 4);
    bytes[at..at + 4].copy_from_slice(&input.u32().to_le_bytes());
}

fn as_bytes<T: ByteValued>(value: &T) -> Vec<u8> {
    value.as_slice().to_vec()
}

// ---------------------------------------------------------------------------
// A guest: an RNIC over mock guest memory, with the bookkeeping vt3.ko and
// libvt3 would have
// ---------------------------------------------------------------------------

/// Guest RAM per guest: small, so fuzzed addresses often land inside.
pub const MEM: u64 = 256 << 10;
/// Page lists are written here (2048 entries).
const PBL: u64 = 0;
const PBL_END: u64 = 0x4000;
/// Status pages, 64 bytes apart.
const STATUS: u64 = 0x4000;
const STATUS_END: u64 = 0x6000;
/// Ring and buffer pages from here to the end (wrapping around).
const PAGES: u64 = 0x6000;
const PAGE: u64 = VT3_PAGE_SIZE;

/// The guest's RAM laid out as above, every area wrapping around.
fn layout() -> Layout {
    Layout { size: MEM, pbl: PBL..PBL_END, status: STATUS..STATUS_END, pages: PAGES..MEM, wrap: true }
}

/// Listening port of the templates.
const PORT: u16 = 7174;

/// Small limits, so that "table full" and "budget spent" are reachable;
/// the PBL budget is what the final leak check registers in one go.
pub fn limits() -> Limits {
    Limits {
        max_qp: 8,
        max_qp_wr: 63,
        max_cq: 8,
        max_cqe: 255,
        max_mr: 16,
        max_pd: 4,
        max_pbl_pages: 64,
        pbl_budget: 64,
        ..Limits::default()
    }
}

#[derive(Debug, Clone)]
struct MrInfo {
    stag: u32,
    pdn: u32,
    iova: u64,
    length: u64,
    access: u32,
}

#[derive(Debug, Clone)]
struct CqInfo {
    cqn: u32,
    status: u64,
    depth: u32,
    /// The first pages of the ring (as the PBL named them).
    ring: Vec<u64>,
}

#[derive(Debug, Clone)]
struct QpInfo {
    qpn: u32,
    status: u64,
    /// The first pages of each ring (as the PBL named them).
    sq: Vec<u64>,
    rq: Vec<u64>,
    sq_depth: u32,
    rq_depth: u32,
    limits: WqeLimits,
    sq_prod: u32,
    rq_prod: u32,
    send_cqn: u32,
    recv_cqn: u32,
    /// Its receives come from this SRQ (0: its own RQ).
    srqn: u32,
}

#[derive(Debug, Clone)]
struct SrqInfo {
    srqn: u32,
    status: u64,
    depth: u32,
    ring: Vec<u64>,
    max_sge: u32,
    prod: u32,
}

pub struct Guest {
    pub rnic: Rnic,
    pub ram: GuestRam,
    index: usize,
    next_poll: Option<Instant>,
    pds: Vec<u32>,
    mrs: Vec<MrInfo>,
    cqs: Vec<CqInfo>,
    qps: Vec<QpInfo>,
    srqs: Vec<SrqInfo>,
    /// conn_ids of CONNECT_REQUEST events not yet answered.
    conn_ids: Vec<u32>,
    /// CQEs reaped, and how many of them had an error status (checked
    /// only in strict mode).
    cqes: u64,
    cqe_errors: u64,
}

impl Endpoint for Guest {
    fn wants(&self, frame: &[u8]) -> bool {
        self.rnic.wants(frame)
    }

    fn receive(&mut self, now: Instant, frame: &[u8], tx: &mut dyn FnMut(&[u8])) {
        if self.rnic.wants(frame) {
            self.rnic.receive(now, frame, tx);
        }
    }

    fn poll(&mut self, now: Instant, tx: &mut dyn FnMut(&[u8])) {
        self.next_poll = self.rnic.service(now, &self.ram.mem, tx);
        self.take_events();
    }

    fn poll_at(&mut self, _now: Instant) -> Option<Instant> {
        self.next_poll
    }
}

impl Guest {
    pub fn new(index: usize) -> Self {
        Self {
            rnic: Rnic::new(limits(), 1500),
            ram: GuestRam::anonymous(layout()),
            index,
            next_poll: None,
            pds: Vec::new(),
            mrs: Vec::new(),
            cqs: Vec::new(),
            qps: Vec::new(),
            srqs: Vec::new(),
            conn_ids: Vec::new(),
            cqes: 0,
            cqe_errors: 0,
        }
    }

    /// `n` fresh pages (wrapping around guest RAM) and their page list.
    fn pages(&mut self, n: u32) -> u64 {
        self.ram.pages(n).0
    }

    fn qpns(&self) -> Vec<u32> {
        self.qps.iter().map(|q| q.qpn).collect()
    }

    fn srqns(&self) -> Vec<u32> {
        self.srqs.iter().map(|s| s.srqn).collect()
    }

    fn cqns(&self) -> Vec<u32> {
        self.cqs.iter().map(|c| c.cqn).collect()
    }

    fn stags(&self) -> Vec<u32> {
        self.mrs.iter().map(|m| m.stag).collect()
    }

    /// Runs one command after authentication, as `control::handle_frame`
    /// does, and checks what came back.
    pub fn execute(&mut self, now: Instant, cmd: Cmd, payload: &[u8]) -> Result<Vec<u8>, Status> {
        let result = Request::decode(cmd, payload).and_then(|request| self.rnic.execute(&self.ram.mem, now, &request));
        if let Ok(resp) = &result {
            let expected = match cmd {
                Cmd::QueryDevice => std::mem::size_of::<DeviceAttr>(),
                Cmd::QueryPort => std::mem::size_of::<PortAttr>(),
                Cmd::AllocPd | Cmd::RegMr | Cmd::AllocMr | Cmd::CreateCq | Cmd::CreateQp | Cmd::CreateSrq => {
                    std::mem::size_of::<RespHandle>()
                }
                Cmd::QueryQp => std::mem::size_of::<QpAttr>(),
                Cmd::QuerySrq => std::mem::size_of::<abi::SrqAttr>(),
                _ => 0,
            };
            assert_eq!(resp.len(), expected, "{} response length", cmd.name());
            // A response must fit a control frame (u16 length).
            assert!(resp.len() <= usize::from(u16::MAX));
        }
        self.learn(cmd, payload, &result);
        self.take_events();
        let (c, l) = (self.rnic.counts(), self.rnic.limits());
        assert!(c.pd <= l.max_pd as usize && c.mr <= l.max_mr as usize);
        assert!(c.cq <= l.max_cq as usize && c.qp <= l.max_qp as usize);
        result
    }

    /// Keeps the bookkeeping in step with what the device accepted.
    fn learn(&mut self, cmd: Cmd, payload: &[u8], result: &Result<Vec<u8>, Status>) {
        let Ok(resp) = result else { return };
        let handle = abi::read_struct::<RespHandle>(resp).map(|h| h.handle.to_native());
        let arg = abi::read_struct::<CmdHandle>(payload).map(|h| h.handle.to_native());
        match cmd {
            Cmd::AllocPd => self.pds.extend(handle),
            Cmd::DeallocPd => self.pds.retain(|&p| Some(p) != arg),
            Cmd::RegMr => {
                let a: CmdRegMr = abi::read_struct(payload).unwrap();
                self.mrs.push(MrInfo {
                    stag: handle.unwrap(),
                    pdn: a.pdn.to_native(),
                    iova: a.iova.to_native(),
                    length: a.length.to_native(),
                    access: a.access.to_native(),
                });
            }
            Cmd::AllocMr => {
                // A fast-reg MR: empty until a REG_MR fills it (its STag's
                // key may change then; DEREG_MR takes any key for it).
                let a: abi::CmdAllocMr = abi::read_struct(payload).unwrap();
                self.mrs.push(MrInfo { stag: handle.unwrap(), pdn: a.pdn.to_native(), iova: 0, length: 0, access: 0 });
            }
            Cmd::DeregMr => self.mrs.retain(|m| Some(m.stag) != arg),
            Cmd::CreateCq => {
                let a: CmdCreateCq = abi::read_struct(payload).unwrap();
                self.cqs.push(CqInfo {
                    cqn: handle.unwrap(),
                    status: a.status_addr.to_native(),
                    depth: a.depth.to_native(),
                    ring: self.ram.read_pbl(a.ring_pbl_addr.to_native(), a.ring_npages.to_native()),
                });
            }
            Cmd::DestroyCq => self.cqs.retain(|c| Some(c.cqn) != arg),
            Cmd::CreateQp => {
                let a: CmdCreateQp = abi::read_struct(payload).unwrap();
                let status = a.status_addr.to_native();
                let st: QpStatus = self.ram.mem.read_obj(GuestAddress(status)).unwrap();
                self.qps.push(QpInfo {
                    qpn: handle.unwrap(),
                    status,
                    sq: self.ram.read_pbl(a.sq_pbl_addr.to_native(), a.sq_npages.to_native()),
                    rq: self.ram.read_pbl(a.rq_pbl_addr.to_native(), a.rq_npages.to_native()),
                    sq_depth: a.sq_depth.to_native(),
                    rq_depth: a.rq_depth.to_native(),
                    limits: WqeLimits {
                        max_send_sge: a.max_send_sge.to_native(),
                        max_recv_sge: a.max_recv_sge.to_native(),
                        max_inline: a.max_inline.to_native(),
                        sig_all: a.flags.to_native() & abi::QpFlag::SigAll as u32 != 0,
                    },
                    sq_prod: st.sq_prod.to_native(),
                    rq_prod: st.rq_prod.to_native(),
                    send_cqn: a.send_cqn.to_native(),
                    recv_cqn: a.recv_cqn.to_native(),
                    srqn: a.srqn.to_native(),
                });
            }
            Cmd::DestroyQp => self.qps.retain(|q| Some(q.qpn) != arg),
            Cmd::CreateSrq => {
                let a: abi::CmdCreateSrq = abi::read_struct(payload).unwrap();
                let status = a.status_addr.to_native();
                let st: abi::SrqStatus = self.ram.mem.read_obj(GuestAddress(status)).unwrap();
                self.srqs.push(SrqInfo {
                    srqn: handle.unwrap(),
                    status,
                    depth: a.depth.to_native(),
                    ring: self.ram.read_pbl(a.ring_pbl_addr.to_native(), a.ring_npages.to_native()),
                    max_sge: a.max_sge.to_native(),
                    prod: st.prod.to_native(),
                });
            }
            Cmd::DestroySrq => self.srqs.retain(|q| Some(q.srqn) != arg),
            // Posts go to the new ring (what was in the old is not copied:
            // the device must cope with whatever the new ring holds).
            Cmd::ResizeSrq => {
                let a: abi::CmdResizeSrq = abi::read_struct(payload).unwrap();
                let ring = self.ram.read_pbl(a.ring_pbl_addr.to_native(), a.ring_npages.to_native());
                if let Some(srq) = self.srqs.iter_mut().find(|s| s.srqn == a.srqn.to_native()) {
                    srq.depth = a.depth.to_native();
                    srq.ring = ring;
                }
            }
            Cmd::Accept | Cmd::Reject => {
                let conn = abi::read_struct::<CmdHandle>(payload).map(|h| h.handle.to_native());
                self.conn_ids.retain(|&c| Some(c) != conn);
            }
            Cmd::Reset => {
                self.pds.clear();
                self.mrs.clear();
                self.cqs.clear();
                self.qps.clear();
                self.srqs.clear();
                self.conn_ids.clear();
            }
            _ => {}
        }
    }

    /// Takes the events the RNIC raised (vt3d would frame them for the
    /// driver) and checks their shape.
    fn take_events(&mut self) {
        for (event, body) in self.rnic.take_events(usize::MAX) {
            let cm = matches!(event, EventType::ConnectRequest | EventType::ConnectReply | EventType::Established);
            let size = if cm { std::mem::size_of::<EventCm>() } else { std::mem::size_of::<abi::Event>() };
            assert_eq!(body.len(), size, "{} event body", event.name());
            if event == EventType::ConnectRequest {
                let cm: EventCm = abi::read_struct(&body).unwrap();
                assert!(usize::from(cm.pd_len.to_native()) <= abi::VT3_MAX_PRIVATE_DATA);
                self.conn_ids.push(cm.conn_id.to_native());
                if self.conn_ids.len() > 8 {
                    self.conn_ids.remove(0);
                }
            }
        }
    }

    /// Every object the bookkeeping knows is destroyed (each must go: the
    /// device's reference counts must agree), then nothing may be left,
    /// and the whole PBL budget must be free again.
    pub fn teardown(&mut self, now: Instant) {
        let handle = |h: u32| as_bytes(&CmdHandle { handle: h.into(), reserved: 0.into() });
        for qpn in self.qpns() {
            assert_eq!(self.execute(now, Cmd::DestroyQp, &handle(qpn)), Ok(Vec::new()), "destroy QP {qpn}");
        }
        for srqn in self.srqns() {
            assert_eq!(self.execute(now, Cmd::DestroySrq, &handle(srqn)), Ok(Vec::new()), "destroy SRQ {srqn}");
        }
        for stag in self.stags() {
            assert_eq!(self.execute(now, Cmd::DeregMr, &handle(stag)), Ok(Vec::new()), "deregister {stag:#x}");
        }
        for cqn in self.cqns() {
            assert_eq!(self.execute(now, Cmd::DestroyCq, &handle(cqn)), Ok(Vec::new()), "destroy CQ {cqn}");
        }
        for pdn in self.pds.clone() {
            assert_eq!(self.execute(now, Cmd::DeallocPd, &handle(pdn)), Ok(Vec::new()), "dealloc PD {pdn}");
        }
        assert_eq!(self.rnic.counts(), Counts::default(), "objects left behind");
        assert_eq!(self.rnic.counts().srq, 0, "SRQs left behind");
        // A PBL entry may repeat a page: 64 entries naming one page.
        let budget = self.rnic.limits().pbl_budget as u32;
        for i in 0..u64::from(budget) {
            self.ram.mem.write_obj(PAGES.to_le(), GuestAddress(PBL + i * 8)).unwrap();
        }
        let pd = self.execute(now, Cmd::AllocPd, &[]).expect("a PD after teardown");
        let pdn = abi::read_struct::<RespHandle>(&pd).unwrap().handle.to_native();
        let mr = CmdRegMr {
            iova: 0.into(),
            length: (u64::from(budget) * PAGE).into(),
            pbl_addr: PBL.into(),
            npages: budget.into(),
            pdn: pdn.into(),
            access: 1.into(),
            ..Default::default()
        };
        assert!(self.execute(now, Cmd::RegMr, mr.as_slice()).is_ok(), "PBL budget leaked");
    }
}

// ---------------------------------------------------------------------------
// Two guests on a simulated wire, and the operations the inputs drive
// ---------------------------------------------------------------------------

pub struct World {
    pub sim: Sim<Guest, Guest>,
    /// Rings share no page with anything else: their contents are the
    /// device's alone (see [`World::reap`]).
    strict: bool,
    /// Limits every posted WQE is also parsed with (besides its QP's).
    parse_limits: Option<WqeLimits>,
}

impl World {
    pub fn new() -> Self {
        Self { sim: Sim::new(Guest::new(0), Guest::new(1), WireConfig::default()), strict: false, parse_limits: None }
    }

    fn guest(&mut self, i: usize) -> &mut Guest {
        if i == 0 {
            &mut self.sim.a
        } else {
            &mut self.sim.b
        }
    }

    fn peer(&self, i: usize) -> &Guest {
        if i == 0 {
            &self.sim.b
        } else {
            &self.sim.a
        }
    }

    fn now(&self) -> Instant {
        self.sim.now
    }

    /// CQEs each guest reaped so far, and how many with an error.
    pub fn cqes_reaped(&self) -> [(u64, u64); 2] {
        [(self.sim.a.cqes, self.sim.a.cqe_errors), (self.sim.b.cqes, self.sim.b.cqe_errors)]
    }

    /// The state each guest's QPs show in their status pages.
    pub fn qp_states(&self) -> Vec<Vec<u32>> {
        [&self.sim.a, &self.sim.b]
            .iter()
            .map(|g| {
                g.qps
                    .iter()
                    .map(|q| {
                        g.ram.mem.read_obj::<QpStatus>(GuestAddress(q.status)).map_or(u32::MAX, |s| s.state.to_native())
                    })
                    .collect()
            })
            .collect()
    }

    pub fn execute(&mut self, i: usize, cmd: Cmd, payload: &[u8]) -> Result<Vec<u8>, Status> {
        let now = self.now();
        self.guest(i).execute(now, cmd, payload)
    }

    fn handle(&mut self, i: usize, cmd: Cmd, payload: &[u8]) -> u32 {
        let resp = self.execute(i, cmd, payload).unwrap_or_else(|s| panic!("{}: {}", cmd.name(), s.name()));
        abi::read_struct::<RespHandle>(&resp).unwrap().handle.to_native()
    }

    /// Runs the wire and both engines for `ms` of virtual time.
    pub fn run(&mut self, ms: u64) {
        self.sim.run_for(Duration::from_millis(ms));
    }

    /// A command frame (header + payload) as the control channel hands it
    /// over once the frame is authenticated: the header is parsed by
    /// `abi::read_struct`, then the opcode and length decide the rest.
    fn frame(&mut self, i: usize, input: &mut Input<'_>) {
        let raw = input.bytes(std::mem::size_of::<CtrlHdr>());
        let Some(hdr) = abi::read_struct::<CtrlHdr>(raw) else { return };
        assert_eq!(hdr.as_slice(), raw, "the header reads back as it came");
        let body = input.bytes(usize::from(hdr.len.to_native()));
        if hdr.r#type != MsgType::Cmd as u8 || hdr.version != abi::VT3_CTRL_VERSION {
            return;
        }
        if let Ok(cmd) = Cmd::try_from(hdr.opcode.to_native()) {
            let _ = self.execute(i, cmd, body);
        }
    }

    /// A known command with a payload of fuzzed bytes (often the wrong size).
    fn raw_command(&mut self, i: usize, input: &mut Input<'_>) {
        let cmd = Cmd::ALL[usize::from(input.u8()) % Cmd::ALL.len()];
        let len = usize::from(input.u8());
        let body = input.bytes(len).to_vec();
        let _ = self.execute(i, cmd, &body);
    }

    /// A command built from a template: valid handles and addresses from
    /// the bookkeeping, sizes and choices from the input, then perhaps one
    /// fuzzed field.
    fn template(&mut self, i: usize, input: &mut Input<'_>) {
        let cmd = Cmd::ALL[usize::from(input.u8()) % Cmd::ALL.len()];
        let mut payload = self.build(i, cmd, input);
        mutate(input, &mut payload);
        let _ = self.execute(i, cmd, &payload);
    }

    fn build(&mut self, i: usize, cmd: Cmd, input: &mut Input<'_>) -> Vec<u8> {
        let handle = |h: u32| as_bytes(&CmdHandle { handle: h.into(), reserved: 0.into() });
        let peer_ip = IPS[1 - i].octets();
        let g = self.guest(i);
        match cmd {
            Cmd::QueryDevice | Cmd::QueryPort | Cmd::AllocPd | Cmd::Reset => Vec::new(),
            Cmd::SetAddr => {
                let ipv4 = match input.u8() % 8 {
                    0 => [0; 4],
                    1 => peer_ip,
                    2 => input.array(),
                    _ => IPS[i].octets(),
                };
                as_bytes(&CmdSetAddr { mac: MACS[i], prefix_len: 24, reserved: 0, ipv4 })
            }
            Cmd::DeallocPd => handle(pick(input, &g.pds)),
            Cmd::RegMr => {
                let pdn = pick(input, &g.pds);
                let npages = 1 + u32::from(input.u8() % 8);
                let length = u64::from(npages) * PAGE - u64::from(input.u8());
                let access = u32::from(input.u8() & 7);
                let dma = input.u8() == 0xff;
                let pbl = g.pages(npages);
                as_bytes(&CmdRegMr {
                    iova: (0x7f00_0000_0000 + u64::from(input.u16()) * PAGE).into(),
                    length: length.into(),
                    pbl_addr: pbl.into(),
                    npages: npages.into(),
                    pdn: pdn.into(),
                    access: access.into(),
                    flags: u32::from(dma).into(),
                    page_offset: 0.into(),
                    reserved: 0.into(),
                })
            }
            Cmd::AllocMr => {
                let pdn = pick(input, &g.pds);
                as_bytes(&abi::CmdAllocMr { pdn: pdn.into(), max_pages: (1 + u32::from(input.u8() % 16)).into() })
            }
            Cmd::DeregMr => handle(pick(input, &g.stags())),
            Cmd::CreateCq => {
                let depth = 2u32 << (input.u8() % 7);
                as_bytes(&g.ram.new_cq(depth).0)
            }
            Cmd::DestroyCq => handle(pick(input, &g.cqns())),
            Cmd::ArmCq => {
                let cqn = pick(input, &g.cqns());
                as_bytes(&CmdArmCq { cqn: cqn.into(), flags: u32::from(input.u8() & 3).into() })
            }
            Cmd::CreateQp => {
                let pdn = pick(input, &g.pds);
                let cqns = g.cqns();
                let (scq, rcq) = (pick(input, &cqns), pick(input, &cqns));
                let (sq_depth, rq_depth) = (2u32 << (input.u8() % 5), 2u32 << (input.u8() % 5));
                let sq_npages = (sq_depth * VT3_WQE_SIZE as u32).div_ceil(PAGE as u32);
                let rq_npages = (rq_depth * VT3_WQE_SIZE as u32).div_ceil(PAGE as u32);
                let sq_pbl = g.pages(sq_npages);
                let rq_pbl = g.pages(rq_npages);
                let status = g.ram.status_page();
                let sizes = input.u8();
                let qp = CmdCreateQp {
                    sq_pbl_addr: sq_pbl.into(),
                    rq_pbl_addr: rq_pbl.into(),
                    status_addr: status.into(),
                    sq_npages: sq_npages.into(),
                    rq_npages: rq_npages.into(),
                    sq_depth: sq_depth.into(),
                    rq_depth: rq_depth.into(),
                    pdn: pdn.into(),
                    send_cqn: scq.into(),
                    recv_cqn: rcq.into(),
                    max_send_sge: u32::from(sizes & 7).min(4).into(),
                    max_recv_sge: u32::from((sizes >> 3) & 7).min(4).into(),
                    max_inline: (u32::from(sizes >> 6) * 32).min(64).into(),
                    flags: u32::from(input.u8() & 3).into(),
                    srqn: 0.into(),
                };
                // Every other QP of an SRQ: no RQ of its own then.
                let srqns = g.srqns();
                if !srqns.is_empty() && input.u8() & 1 == 0 {
                    let srqn = pick(input, &srqns);
                    as_bytes(&CmdCreateQp {
                        rq_pbl_addr: 0.into(),
                        rq_npages: 0.into(),
                        rq_depth: 0.into(),
                        max_recv_sge: 0.into(),
                        srqn: srqn.into(),
                        ..qp
                    })
                } else {
                    as_bytes(&qp)
                }
            }
            Cmd::ModifyQp => {
                let qpn = pick(input, &g.qpns());
                as_bytes(&CmdModifyQp {
                    qpn: qpn.into(),
                    mask: u32::from(input.u8() & 7).into(),
                    state: u32::from(input.u8() % 5).into(),
                    ird: u32::from(input.u8() % 9).into(),
                    ord: u32::from(input.u8() % 9).into(),
                    reserved: 0.into(),
                })
            }
            Cmd::QueryQp | Cmd::DestroyQp => handle(pick(input, &g.qpns())),
            Cmd::PairQp => {
                let qpns = g.qpns();
                let (qpn, peer_qpn) = (pick(input, &qpns), pick(input, &qpns));
                // A few ports, so that pairs collide on them; now and then 0.
                let port = if input.u8() == 0 { 0 } else { 40_100 + u16::from(input.u8() % 4) };
                as_bytes(&abi::CmdPairQp {
                    qpn: qpn.into(),
                    peer_qpn: peer_qpn.into(),
                    port: port.to_be_bytes(),
                    reserved: 0.into(),
                })
            }
            Cmd::CreateSrq => {
                let pdn = pick(input, &g.pds);
                let depth = 2u32 << (input.u8() % 5);
                let npages = (depth * VT3_WQE_SIZE as u32).div_ceil(PAGE as u32);
                let pbl = g.pages(npages);
                let status = g.ram.status_page();
                as_bytes(&abi::CmdCreateSrq {
                    ring_pbl_addr: pbl.into(),
                    status_addr: status.into(),
                    ring_npages: npages.into(),
                    depth: depth.into(),
                    pdn: pdn.into(),
                    max_sge: u32::from(input.u8() % 5).into(),
                    limit: u32::from(input.u8() % 8).into(),
                    reserved: 0.into(),
                })
            }
            Cmd::ModifySrq => {
                let srqn = pick(input, &g.srqns());
                as_bytes(&abi::CmdModifySrq {
                    srqn: srqn.into(),
                    mask: u32::from(input.u8() & 3).into(),
                    limit: u32::from(input.u8() % 40).into(),
                    reserved: 0.into(),
                })
            }
            Cmd::QuerySrq | Cmd::DestroySrq => handle(pick(input, &g.srqns())),
            Cmd::ResizeSrq => {
                let srqn = pick(input, &g.srqns());
                let depth = 2u32 << (input.u8() % 7);
                let npages = (depth * VT3_WQE_SIZE as u32).div_ceil(PAGE as u32);
                let pbl = g.pages(npages);
                as_bytes(&abi::CmdResizeSrq {
                    ring_pbl_addr: pbl.into(),
                    ring_npages: npages.into(),
                    depth: depth.into(),
                    srqn: srqn.into(),
                    reserved: 0.into(),
                })
            }
            Cmd::Doorbell => {
                let queues = u32::from(input.u8() & 7);
                let target = if queues & 4 != 0 { pick(input, &g.srqns()) } else { pick(input, &g.qpns()) };
                as_bytes(&CmdDoorbell { qpn: target.into(), queues: queues.into() })
            }
            Cmd::Listen | Cmd::Unlisten => {
                let port = if input.bool() { PORT } else { input.u16() };
                let local = SockAddr { ipv4: [0; 4], port: port.to_be_bytes(), reserved: 0.into() };
                as_bytes(&CmdListen { local, backlog: u32::from(input.u8()).into(), reserved: 0.into() })
            }
            Cmd::Connect => {
                let qpn = pick(input, &g.qpns());
                let local =
                    SockAddr { ipv4: [0; 4], port: (40_000 + u16::from(input.u8())).to_be_bytes(), reserved: 0.into() };
                let port = if input.u8() < 0xf0 { PORT } else { input.u16() };
                let remote = SockAddr { ipv4: peer_ip, port: port.to_be_bytes(), reserved: 0.into() };
                let (pd_len, private_data) = private_data(input);
                as_bytes(&CmdConnect {
                    local,
                    remote,
                    next_hop: MACS[1 - i],
                    pd_len: pd_len.into(),
                    qpn: qpn.into(),
                    ird: u32::from(input.u8() % 9).into(),
                    ord: u32::from(input.u8() % 9).into(),
                    reserved: 0.into(),
                    private_data,
                })
            }
            Cmd::Accept => {
                let conn_id = pick(input, &g.conn_ids);
                let qpn = pick(input, &g.qpns());
                let (pd_len, private_data) = private_data(input);
                as_bytes(&CmdAccept {
                    conn_id: conn_id.into(),
                    qpn: qpn.into(),
                    ird: u32::from(input.u8() % 9).into(),
                    ord: u32::from(input.u8() % 9).into(),
                    pd_len: pd_len.into(),
                    reserved0: 0.into(),
                    reserved1: 0.into(),
                    private_data,
                })
            }
            Cmd::Reject => {
                let conn_id = pick(input, &g.conn_ids);
                let (pd_len, private_data) = private_data(input);
                as_bytes(&CmdReject {
                    conn_id: conn_id.into(),
                    pd_len: pd_len.into(),
                    reserved: 0.into(),
                    private_data,
                })
            }
            Cmd::Disconnect => {
                let qpn = pick(input, &g.qpns());
                as_bytes(&CmdDisconnect { qpn: qpn.into(), abort: u32::from(input.u8() % 3).into() })
            }
            // HELLO (the control channel's own: `execute` refuses it) and
            // commands added later: raw octets until they get a template.
            _ => {
                let len = usize::from(input.u8());
                input.bytes(len).to_vec()
            }
        }
    }

    /// Writes a send or receive WQE into QP ring slot `prod` and publishes
    /// the new producer index, as libvt3 posts; a doorbell follows if the
    /// input says so (whatever the idle flag says).
    fn post_wqe(&mut self, i: usize, input: &mut Input<'_>) {
        let qpn = pick(input, &self.guest(i).qpns());
        let mode = input.u8();
        let peer_mrs = self.peer(i).mrs.clone();
        let parse_limits = self.parse_limits;
        let g = self.guest(i);
        let Some(qp) = g.qps.iter().position(|q| q.qpn == qpn) else { return };
        let send = mode & 1 == 0;
        let raw = mode & 2 != 0;
        let bytes: Vec<u8> = if raw {
            let mut w = vec![0u8; VT3_WQE_SIZE];
            let src = input.bytes(VT3_WQE_SIZE);
            w[..src.len()].copy_from_slice(src);
            w
        } else if send {
            as_bytes(&sq_template(input, &g.mrs, &peer_mrs))
        } else {
            as_bytes(&rq_template(input, &g.mrs))
        };
        let qp = &mut g.qps[qp];
        // The parsers alone, with the QP's own limits (and the input's):
        // whatever they accept stays within them.
        for limits in [Some(qp.limits), parse_limits].into_iter().flatten() {
            if send {
                let w: SqWqe = abi::read_struct(&bytes).unwrap();
                if let Ok(wr) = wqe::send_wr(&w, &limits) {
                    check_send_wr(&wr, &limits);
                    assert!(wr.signaled || !limits.sig_all);
                }
            } else {
                let w: RqWqe = abi::read_struct(&bytes).unwrap();
                if let Ok(wr) = wqe::recv_wr(&w, &limits) {
                    assert!(wr.sges.len() <= limits.max_recv_sge as usize);
                }
            }
        }
        if !send && qp.srqn != 0 {
            let srqn = qp.srqn;
            let Some(srq) = g.srqs.iter_mut().find(|s| s.srqn == srqn) else { return };
            let w: RqWqe = abi::read_struct(&bytes).unwrap();
            let limits = WqeLimits { max_send_sge: 0, max_recv_sge: srq.max_sge, max_inline: 0, sig_all: false };
            if let Ok(wr) = wqe::recv_wr(&w, &limits) {
                assert!(wr.sges.len() <= srq.max_sge as usize);
            }
            let byte = u64::from(srq.prod & srq.depth.wrapping_sub(1)) * VT3_WQE_SIZE as u64;
            if let Some(page) = srq.ring.get((byte / PAGE) as usize) {
                let _ = g.ram.mem.write_slice(&bytes, GuestAddress(page + byte % PAGE));
            }
            srq.prod = srq.prod.wrapping_add(1);
            let _ = g.ram.mem.write_obj(srq.prod.to_le(), GuestAddress(srq.status));
            if mode & 4 == 0 {
                let db = CmdDoorbell { qpn: srqn.into(), queues: (abi::DoorbellQueue::Srq as u32).into() };
                let _ = self.execute(i, Cmd::Doorbell, db.as_slice());
            }
            return;
        }
        let (pages, depth, prod) =
            if send { (&qp.sq, qp.sq_depth, &mut qp.sq_prod) } else { (&qp.rq, qp.rq_depth, &mut qp.rq_prod) };
        let byte = u64::from(*prod & depth.wrapping_sub(1)) * VT3_WQE_SIZE as u64;
        if let Some(page) = pages.get((byte / PAGE) as usize) {
            let _ = g.ram.mem.write_slice(&bytes, GuestAddress(page + byte % PAGE));
        }
        *prod = prod.wrapping_add(1);
        let (status, value) = (qp.status, *prod);
        let field =
            if send { std::mem::offset_of!(QpStatus, sq_prod) } else { std::mem::offset_of!(QpStatus, rq_prod) };
        let _ = g.ram.mem.write_obj(value.to_le(), GuestAddress(status + field as u64));
        if mode & 4 == 0 {
            let queues = if send { abi::DoorbellQueue::Sq } else { abi::DoorbellQueue::Rq } as u32;
            let db = CmdDoorbell { qpn: qpn.into(), queues: queues.into() };
            let _ = self.execute(i, Cmd::Doorbell, db.as_slice());
        }
    }

    /// Stores a fuzzed word into a status page: producer indices far
    /// ahead or behind, consumer indices the device must not trust.
    fn poke_status(&mut self, i: usize, input: &mut Input<'_>) {
        let g = self.guest(i);
        let which = input.u8();
        let value = match which >> 6 {
            0 => input.u32(),
            1 => u32::from(input.u8()),
            _ => 0u32.wrapping_sub(u32::from(input.u8())),
        };
        let addr = if which & 0x20 == 0 {
            let qps = g.qpns();
            let qpn = pick(input, &qps);
            let Some(qp) = g.qps.iter_mut().find(|q| q.qpn == qpn) else { return };
            let field = (u64::from(which) % 4) * 4; // sq_prod, rq_prod, sq_cons, rq_cons
            match field {
                0 => qp.sq_prod = value,
                4 => qp.rq_prod = value,
                _ => {}
            }
            qp.status + field
        } else {
            let cqs = g.cqns();
            let cqn = pick(input, &cqs);
            let Some(cq) = g.cqs.iter().find(|c| c.cqn == cqn) else { return };
            cq.status + (u64::from(which) % 3) * 4 // prod, cons, flags
        };
        let _ = g.ram.mem.write_obj(value.to_le(), GuestAddress(addr));
    }

    /// Reaps the CQEs of a CQ as libvt3's poll_cq does. With `strict`
    /// (no page of a CQ ring is shared with anything else, as in the
    /// `wqe` target), every CQE must be one the device could have written.
    fn reap(&mut self, i: usize, input: &mut Input<'_>) {
        let strict = self.strict;
        let g = self.guest(i);
        let cqn = pick(input, &g.cqns());
        let Some(cq) = g.cqs.iter().find(|c| c.cqn == cqn).cloned() else { return };
        let Ok(st) = g.ram.mem.read_obj::<CqStatus>(GuestAddress(cq.status)) else { return };
        let (prod, cons) = (st.prod.to_native(), st.cons.to_native());
        let waiting = prod.wrapping_sub(cons).min(cq.depth);
        if strict {
            for k in 0..waiting {
                let byte = u64::from(cons.wrapping_add(k) & (cq.depth - 1)) * 32;
                let Some(page) = cq.ring.get((byte / PAGE) as usize) else { continue };
                let e: Cqe = g.ram.mem.read_obj(GuestAddress(page + byte % PAGE)).unwrap();
                assert!(abi::WcOpcode::try_from(e.opcode).is_ok(), "CQE opcode {}", e.opcode);
                assert!(abi::WcStatus::try_from(e.status).is_ok(), "CQE status {}", e.status);
                assert_eq!(e.flags & !3, 0, "CQE flags {:#x}", e.flags);
                g.cqe_errors += u64::from(e.status != 0);
            }
        }
        g.cqes += u64::from(waiting);
        let _ = g.ram.mem.write_obj(prod.to_le(), GuestAddress(cq.status + 4));
    }

    /// Interprets the input as a sequence of operations on both guests.
    pub fn play(&mut self, input: &mut Input<'_>, ops: &[Op]) {
        let mut steps = 0;
        while !input.is_empty() && steps < 512 {
            steps += 1;
            let byte = input.u8();
            let i = usize::from(byte >> 7);
            match ops[usize::from(byte & 0x7f) % ops.len()] {
                Op::Frame => self.frame(i, input),
                Op::RawCommand => self.raw_command(i, input),
                Op::Template => self.template(i, input),
                Op::PostWqe => self.post_wqe(i, input),
                Op::PokeStatus => self.poke_status(i, input),
                Op::Reap => self.reap(i, input),
                Op::Run => {
                    let ms = u64::from(input.u8()) * 4;
                    self.run(ms);
                }
                Op::Doorbell => {
                    let qpn = pick(input, &self.guest(i).qpns());
                    let queues = if input.u8() < 0xf0 { u32::from(input.u8() & 3) } else { input.u32() };
                    let db = CmdDoorbell { qpn: qpn.into(), queues: queues.into() };
                    let _ = self.execute(i, Cmd::Doorbell, db.as_slice());
                }
                Op::Disconnect => {
                    let qpn = pick(input, &self.guest(i).qpns());
                    let abort = input.u8() & 1;
                    let d = CmdDisconnect { qpn: qpn.into(), abort: u32::from(abort).into() };
                    let _ = self.execute(i, Cmd::Disconnect, d.as_slice());
                }
            }
        }
    }

    /// Two guests with addresses, MRs of every kind, CQs and an
    /// established connection between their QPs, built as vt3.ko and
    /// libvt3 would. Returns the ranges the device must never write to.
    pub fn connected() -> (Self, Vec<(usize, u64, u64)>) {
        let mut w = World::new();
        let mut protected = Vec::new();
        for i in 0..2 {
            let a = CmdSetAddr { mac: MACS[i], prefix_len: 24, reserved: 0, ipv4: IPS[i].octets() };
            w.execute(i, Cmd::SetAddr, a.as_slice()).unwrap();
            let pdn = w.handle(i, Cmd::AllocPd, &[]);
            // Local write only, everything, remote read only, nothing.
            let rw = Access::LocalWrite as u32 | Access::RemoteWrite as u32 | Access::RemoteRead as u32;
            for (n, access) in [(4u64, Access::LocalWrite as u32), (4, rw), (2, Access::RemoteRead as u32), (2, 0)] {
                let (a, mr) = w.guest(i).ram.new_mr(pdn, n * PAGE, access);
                w.handle(i, Cmd::RegMr, a.as_slice());
                if access & (Access::LocalWrite as u32 | Access::RemoteWrite as u32) == 0 {
                    protected.push((i, mr.guest, n * PAGE));
                }
            }
            let mut cq = || {
                let (a, cq) = w.guest(i).ram.new_cq(16);
                CqRing { cqn: w.handle(i, Cmd::CreateCq, a.as_slice()), ..cq }
            };
            let (scq, rcq) = (cq(), cq());
            let (a, _) = w.guest(i).ram.new_qp(pdn, scq, rcq, QpCaps::default(), 0);
            w.handle(i, Cmd::CreateQp, a.as_slice());
            // Page lists and unused RAM: nothing of the device's.
            let g = w.guest(i);
            protected.push((i, PBL, PBL_END - PBL));
            protected.push((i, g.ram.next_page(), MEM - g.ram.next_page()));
        }
        let local = SockAddr { ipv4: [0; 4], port: PORT.to_be_bytes(), reserved: 0.into() };
        w.execute(1, Cmd::Listen, CmdListen { local, backlog: 4.into(), reserved: 0.into() }.as_slice()).unwrap();
        let qa = w.sim.a.qps[0].qpn;
        let connect = CmdConnect {
            local: SockAddr { ipv4: [0; 4], port: 40_001u16.to_be_bytes(), reserved: 0.into() },
            remote: SockAddr { ipv4: IPS[1].octets(), port: PORT.to_be_bytes(), reserved: 0.into() },
            next_hop: MACS[1],
            qpn: qa.into(),
            ird: 8.into(),
            ord: 8.into(),
            ..Default::default()
        };
        w.execute(0, Cmd::Connect, connect.as_slice()).unwrap();
        assert!(w.sim.run_until(Duration::from_secs(2), |sim| !sim.b.conn_ids.is_empty()), "no CONNECT_REQUEST");
        let accept = CmdAccept {
            conn_id: w.sim.b.conn_ids[0].into(),
            qpn: w.sim.b.qps[0].qpn.into(),
            ird: 8.into(),
            ord: 8.into(),
            ..Default::default()
        };
        w.execute(1, Cmd::Accept, accept.as_slice()).unwrap();
        let rts = |g: &Guest| {
            let st: QpStatus = g.ram.mem.read_obj(GuestAddress(g.qps[0].status)).unwrap();
            st.state.to_native() == QpState::Rts as u32
        };
        assert!(w.sim.run_until(Duration::from_secs(2), |sim| rts(&sim.a) && rts(&sim.b)), "not established");
        w.strict = true;
        (w, protected)
    }
}

impl Default for World {
    fn default() -> Self {
        Self::new()
    }
}

/// What an input byte may ask a [`World`] to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Frame,
    RawCommand,
    Template,
    PostWqe,
    PokeStatus,
    Reap,
    Run,
    Doorbell,
    Disconnect,
}

fn private_data(input: &mut Input<'_>) -> (u16, PrivateData) {
    let len = match input.u8() {
        0xff => input.u16(),
        n => u16::from(n & 0x3f),
    };
    let mut pd = PrivateData::default();
    let src = input.bytes(usize::from(len).min(abi::VT3_MAX_PRIVATE_DATA));
    pd.0[..src.len()].copy_from_slice(src);
    (len, pd)
}

/// An SGE naming one of `mrs` (offset and length fuzzed), or anything.
fn sge(input: &mut Input<'_>, mrs: &[MrInfo]) -> abi::Sge {
    let sel = input.u8();
    match mrs.get(usize::from(sel & 0x7f) % mrs.len().max(1)) {
        Some(mr) if sel & 0x80 == 0 => {
            let offset = u64::from(input.u16()) % (mr.length + 64);
            let length = u32::from(input.u16());
            abi::Sge { addr: (mr.iova + offset).into(), length: length.into(), lkey: mr.stag.into() }
        }
        _ => abi::Sge { addr: input.u64().into(), length: input.u32().into(), lkey: input.u32().into() },
    }
}

fn sq_template(input: &mut Input<'_>, mrs: &[MrInfo], peer: &[MrInfo]) -> SqWqe {
    let opcode = input.u8() % 11; // 10 is not an opcode (9, BIND_MW, binds whatever the slot says)
    if opcode == abi::WrOpcode::RegMr as u8 {
        return reg_mr_template(input, mrs);
    }
    let flags = match input.u8() {
        0xff => input.u8(),
        f => f & 7,
    };
    let mut w = SqWqe { wr_id: input.u64().into(), opcode, flags, ..Default::default() };
    let remote = sge(input, peer);
    (w.remote_addr, w.remote_stag) = (remote.addr, remote.lkey);
    w.invalidate_stag = peer.get(usize::from(input.u8()) % peer.len().max(1)).map_or(0, |m| m.stag).into();
    if flags & abi::WqeFlag::Inline as u8 != 0 {
        let len = u32::from(input.u8() % 72);
        w.inline_len = len.into();
        let data = input.bytes(len as usize);
        let dst = &mut w.as_mut_slice()[64..];
        let n = data.len().min(dst.len());
        dst[..n].copy_from_slice(&data[..n]);
    } else {
        w.num_sge = input.u8() % 6;
        for k in 0..usize::from(w.num_sge).min(4) {
            let s = sge(input, mrs);
            w.as_mut_slice()[64 + k * 16..80 + k * 16].copy_from_slice(s.as_slice());
        }
    }
    w
}

/// A REG_MR of one of `mrs` (a fast-reg one, or not) under the same, the
/// next or any key, over a page list somewhere in the PBL area (often a
/// real one), with fuzzed counts, lengths, rights and page shift.
fn reg_mr_template(input: &mut Input<'_>, mrs: &[MrInfo]) -> SqWqe {
    let stag = mrs.get(usize::from(input.u8()) % mrs.len().max(1)).map_or(input.u32(), |m| m.stag);
    let stag = match input.u8() % 4 {
        0 => stag,
        1 | 2 => stag & !0xff | stag.wrapping_add(1) & 0xff,
        _ => stag & !0xff | u32::from(input.u8()),
    };
    let npages = match input.u8() {
        0xff => input.u32(),
        n => u32::from(n % 20),
    };
    let reg = abi::RegMrWqe {
        wr_id: input.u64().into(),
        opcode: abi::WrOpcode::RegMr as u8,
        flags: input.u8() & 7,
        stag: stag.into(),
        iova: (u64::from(input.u16()) << 8).into(),
        length: (u64::from(npages.min(20)) * PAGE).wrapping_sub(u64::from(input.u8())).into(),
        pbl_addr: match input.u8() % 4 {
            0 => input.u64(),
            _ => PBL + u64::from(input.u16() % 0x800) * 8,
        }
        .into(),
        npages: npages.into(),
        access: u32::from(input.u8() & 0xf).into(),
        page_shift: if input.u8() == 0 { u32::from(input.u8()) } else { abi::VT3_PAGE_SHIFT }.into(),
        ..Default::default()
    };
    abi::read_struct(reg.as_slice()).unwrap_or_default()
}

fn rq_template(input: &mut Input<'_>, mrs: &[MrInfo]) -> RqWqe {
    let mut w = RqWqe { wr_id: input.u64().into(), num_sge: input.u8() % 6, ..Default::default() };
    for k in 0..usize::from(w.num_sge).min(4) {
        w.sge[k] = sge(input, mrs);
    }
    w
}

fn check_send_wr(wr: &vt3_iwarp::engine::SendWr, limits: &WqeLimits) {
    assert!(wr.sges.len() <= limits.max_send_sge as usize);
    let inline = wr.inline.map_or(0, |d| d.as_slice().len());
    assert!(inline <= limits.max_inline as usize);
    assert!(wr.inline.is_none() || wr.sges.is_empty());
}

// ---------------------------------------------------------------------------
// Targets
// ---------------------------------------------------------------------------

/// Input: a sequence of operations on two guests (the top bit of each
/// operation byte picks the guest): command frames (header + payload)
/// through the post-authentication dispatch `Rnic::execute`, known
/// commands with raw payloads, templates (PD → MR → CQ → QP → modify →
/// listen/connect/accept → doorbell → destroy) with fuzzed fields, WQEs
/// and status words written into guest memory, and time passing. At the
/// end both guests tear everything down: every object must go, and the
/// page-list budget must be whole again.
pub fn control_command(data: &[u8]) {
    let mut world = control_play(data);
    world.run(10);
    let now = world.now();
    for i in 0..2 {
        world.guest(i).teardown(now);
    }
}

/// The operations `control_command` draws from (by index, so the smoke
/// test can write scripts).
pub const CONTROL_OPS: [Op; 10] = [
    Op::Template,
    Op::Template,
    Op::Template,
    Op::Template,
    Op::Frame,
    Op::RawCommand,
    Op::PostWqe,
    Op::PokeStatus,
    Op::Run,
    Op::Reap,
];

/// `control_command` without the final teardown.
pub fn control_play(data: &[u8]) -> World {
    let mut input = Input::new(data);
    let mut world = World::new();
    world.play(&mut input, &CONTROL_OPS);
    world
}

/// Input: a limits octet (each WQE is also parsed with those limits),
/// then operations on an established connection
/// between two guests (each with a local-write MR, an all-access MR, a
/// remote-read MR and a no-access MR): send and receive WQEs (templates
/// naming those MRs with fuzzed offsets and lengths, or 128 raw octets)
/// written into the rings with doorbells, producer indices anywhere,
/// consumer indices the CQs must not trust, CQs reaped, time passing and
/// disconnects. The device must never write the page lists, unused RAM
/// or the MRs that allow no writes.
pub fn wqe(data: &[u8]) {
    let mut input = Input::new(data);
    // Every WQE also goes through the parsers with these fuzzed limits.
    let l = input.u8();
    let limits = WqeLimits {
        max_send_sge: u32::from(l & 7).min(4),
        max_recv_sge: u32::from((l >> 3) & 7).min(4),
        max_inline: if l & 0x40 != 0 { 64 } else { 16 },
        sig_all: l & 0x80 != 0,
    };
    let (mut world, protected) = World::connected();
    world.parse_limits = Some(limits);
    let snapshot = |w: &mut World| -> Vec<Vec<u8>> {
        protected
            .iter()
            .map(|&(i, at, len)| {
                let mut buf = vec![0u8; len as usize];
                w.guest(i).ram.mem.read_slice(&mut buf, GuestAddress(at)).unwrap();
                buf
            })
            .collect()
    };
    let before = snapshot(&mut world);
    world.play(&mut input, &WQE_OPS);
    world.run(50);
    let after = snapshot(&mut world);
    for (k, (b, a)) in before.iter().zip(&after).enumerate() {
        let (i, at, _) = protected[k];
        // Slices compare with memcmp: a byte loop here would be traced
        // compare by compare and cost more than the rest of the input.
        if b == a {
            continue;
        }
        if let Some(off) = b.iter().zip(a).position(|(x, y)| x != y) {
            panic!("guest {i}: the device wrote {:#x}, which it may not", at + off as u64);
        }
    }
    let now = world.now();
    for i in 0..2 {
        world.guest(i).teardown(now);
    }
}

/// The operations `wqe` draws from.
pub const WQE_OPS: [Op; 11] = [
    Op::PostWqe,
    Op::PostWqe,
    Op::PostWqe,
    Op::PostWqe,
    Op::PostWqe,
    Op::PokeStatus,
    Op::Doorbell,
    Op::Run,
    Op::Run,
    Op::Reap,
    Op::Disconnect,
];

/// Guest RAM of the virtio target: rings at 0, indirect tables from
/// `INDIRECT`, frame buffers from `DATA`.
const VQ_MEM: u64 = 0x2_0000;
const INDIRECT: u64 = 0x8000;
const DATA: u64 = 0x1_0000;

/// A descriptor address: inside the buffers (most of the time), inside
/// the indirect tables, or at the top of the address space (sums that
/// overflow).
fn vq_addr(input: &mut Input<'_>) -> u64 {
    let sel = input.u8();
    match sel >> 6 {
        0 | 1 => DATA + u64::from(input.u16()) % (VQ_MEM - DATA),
        2 => INDIRECT + u64::from(sel & 0x3f) * 16 * 8,
        _ => u64::MAX - u64::from(input.u16()),
    }
}

fn vq_len(input: &mut Input<'_>) -> u32 {
    match input.u8() {
        0xff => input.u32(),
        0xfe => u32::from(input.u16()),
        n => u32::from(n) * 8,
    }
}

fn vq_desc(input: &mut Input<'_>) -> [u8; 16] {
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    let addr = vq_addr(input);
    let len = vq_len(input);
    let f = input.u8();
    let mut flags = 0u16;
    if f & 1 != 0 {
        flags |= VRING_DESC_F_NEXT as u16;
    }
    if f & 2 != 0 {
        flags |= VRING_DESC_F_WRITE as u16;
    }
    if f & 4 != 0 && f & 8 != 0 {
        flags |= VRING_DESC_F_INDIRECT as u16;
    }
    if f & 0x80 != 0 {
        flags = input.u16();
    }
    let next = if f & 0x40 != 0 { input.u16() } else { u16::from(input.u8() & 0x3f) };
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&addr.to_le_bytes());
    d[8..12].copy_from_slice(&len.to_le_bytes());
    d[12..14].copy_from_slice(&flags.to_le_bytes());
    d[14..16].copy_from_slice(&next.to_le_bytes());
    d
}

/// Input: a config octet (queue size, EVENT_IDX, MRG_RXBUF, header
/// length, MTU), the descriptor table, indirect tables, the avail ring
/// (heads, flags, index — ahead of the device by a little, by the whole
/// ring, or anything when the index octet is 0xff), the starting
/// next_avail / next_used, then up to 16 operations: drain TX (with a
/// fuzzed budget and a sink that may stop early), deliver an RX frame,
/// the guest making more chains available (an index running ahead of the
/// device: a broken queue), or rewriting a descriptor. Nothing may spin:
/// an impossible index is an error. Every used entry must name a
/// descriptor of the table, TX entries have length 0, every chain taken
/// is used exactly once, an RX frame is delivered whole or not at all.
pub fn virtio_chains(data: &[u8]) {
    use std::ops::ControlFlow;
    use virtio_queue::{Queue, QueueT};
    use vt3d::nic::virtio::{
        deliver_rx, drain_tx, pending_chains, ChainStats, NetLayout, QueueError, RxOutcome, Scratch,
    };

    let mut input = Input::new(data);
    let config = input.u8();
    let size: u16 = 1 << (config & 7);
    let layout = NetLayout {
        hdr_len: if config & 0x10 != 0 { 12 } else { 10 },
        mergeable: config & 0x20 != 0,
        max_frame: [60, 1514, 9018, 65535][usize::from(config >> 6)],
    };
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), VQ_MEM as usize)]).unwrap();
    // The split ring laid out by hand (MockSplitQueue puts the used ring
    // over the avail ring's used_event slot): descriptors at 0, then the
    // avail ring (flags, idx, ring, used_event), then the used ring
    // (flags, idx, ring, avail_event), 4-aligned.
    let desc_table = 0u64;
    let avail = 16 * u64::from(size);
    let used = (avail + 6 + 2 * u64::from(size) + 3) & !3;
    assert!(used + 8 * u64::from(size) + 6 <= INDIRECT);

    let ndesc = u16::from(input.u8()).min(size);
    for k in 0..ndesc {
        mem.write_slice(&vq_desc(&mut input), GuestAddress(desc_table + u64::from(k) * 16)).unwrap();
    }
    let nindirect = u64::from(input.u8() & 0x7f);
    for k in 0..nindirect {
        mem.write_slice(&vq_desc(&mut input), GuestAddress(INDIRECT + k * 16)).unwrap();
    }
    let write_u16 = |at: u64, v: u16| mem.write_obj(v.to_le(), GuestAddress(at)).unwrap();
    let read_u16 = |at: u64| u16::from_le(mem.read_obj::<u16>(GuestAddress(at)).unwrap());
    let next_avail = input.u16();
    let next_used = input.u16();
    write_u16(avail, input.u16() & 1); // flags: NO_INTERRUPT or not
    let avail_heads = |input: &mut Input<'_>, from: u16, n: u16| {
        for k in 0..n {
            let head = if input.u8() == 0xff { input.u16() } else { u16::from(input.u8()) % ndesc.max(1) };
            let slot = u64::from(from.wrapping_add(k) % size);
            write_u16(avail + 4 + slot * 2, head);
        }
    };
    let ahead = match input.u8() {
        // A broken driver: any index at all.
        0xff => input.u16().wrapping_sub(next_avail),
        n => u16::from(n) % (size + 1),
    };
    avail_heads(&mut input, next_avail, ahead.min(size));
    write_u16(avail + 2, next_avail.wrapping_add(ahead));
    write_u16(used + 2, next_used);
    // used_event (after the avail ring) and avail_event (after the used ring).
    write_u16(avail + 4 + 2 * u64::from(size), input.u16());
    write_u16(used + 4 + 8 * u64::from(size), input.u16());

    let mut queue = Queue::new(size).unwrap();
    queue.set_size(size);
    queue.set_desc_table_address(Some(desc_table as u32), Some(0));
    queue.set_avail_ring_address(Some(avail as u32), Some(0));
    queue.set_used_ring_address(Some(used as u32), Some(0));
    queue.set_ready(true);
    queue.set_event_idx(config & 8 != 0);
    queue.set_next_avail(next_avail);
    queue.set_next_used(next_used);
    let mut scratch = Scratch::default();
    for _ in 0..16 {
        if input.is_empty() {
            break;
        }
        let used_before = read_u16(used + 2);
        let mut stats = ChainStats::default();
        match input.u8() % 4 {
            0 => {
                // A budget per call (backend.rs: 128), and a sink that may
                // ask to stop after some frame (a full uplink).
                let budget = match input.u8() {
                    0xff => usize::MAX,
                    n => usize::from(n),
                };
                let stop_after = u64::from(input.u8());
                let mut frames = 0u64;
                let result = drain_tx(&mut queue, &mem, &layout, &mut scratch, &mut stats, budget, |frame| {
                    assert!(frame.len() <= layout.max_frame, "TX frame of {} octets", frame.len());
                    frames += 1;
                    if frames == stop_after {
                        ControlFlow::Break(())
                    } else {
                        ControlFlow::Continue(())
                    }
                });
                assert_eq!(frames, stats.frames);
                let taken = stats.frames + stats.malformed + stats.oversize;
                assert!(taken <= budget as u64, "{taken} chains taken on a budget of {budget}");
                let n = read_u16(used + 2).wrapping_sub(used_before);
                for k in 0..n {
                    let slot = u64::from(used_before.wrapping_add(k) % size);
                    let id = u32::from_le(mem.read_obj::<u32>(GuestAddress(used + 4 + slot * 8)).unwrap());
                    let len = u32::from_le(mem.read_obj::<u32>(GuestAddress(used + 8 + slot * 8)).unwrap());
                    assert!(id < u32::from(size), "used id {id} of a {size}-entry queue");
                    assert_eq!(len, 0, "a TX chain is used with length 0");
                }
                match result {
                    Err(QueueError::Ring(_)) => {}
                    Err(QueueError::AvailIndexBeyondRing { .. } | QueueError::MissingChain { .. }) => {
                        assert_eq!(u64::from(n), taken, "chains popped and used");
                    }
                    Ok(done) => {
                        assert_eq!(u64::from(n), taken, "chains popped and used");
                        assert_eq!(done.used_any, taken > 0);
                        if !done.more {
                            assert_eq!(pending_chains(&queue, &mem).ok(), Some(0), "chains left without `more`");
                        }
                    }
                }
            }
            1 => {
                let len = usize::from(input.u16()) % (layout.max_frame + 1);
                let frame: Vec<u8> = (0..len).map(|k| k as u8).collect();
                let result = deliver_rx(&mut queue, &mem, &layout, &mut scratch, &mut stats, &frame);
                let n = read_u16(used + 2).wrapping_sub(used_before);
                let mut total = 0u64;
                for k in 0..n {
                    let slot = u64::from(used_before.wrapping_add(k) % size);
                    let id = u32::from_le(mem.read_obj::<u32>(GuestAddress(used + 4 + slot * 8)).unwrap());
                    let len = u32::from_le(mem.read_obj::<u32>(GuestAddress(used + 8 + slot * 8)).unwrap());
                    assert!(id < u32::from(size), "used id {id} of a {size}-entry queue");
                    total += u64::from(len);
                }
                match result {
                    Ok(RxOutcome::Delivered { buffers }) => {
                        assert!(buffers >= 1 && (layout.mergeable || buffers == 1));
                        if n <= size {
                            assert_eq!(total, (layout.hdr_len + len) as u64, "frame delivered in part");
                        }
                    }
                    Ok(RxOutcome::Dropped | RxOutcome::NoBuffers) => {
                        assert_eq!(total, 0, "an undelivered frame used buffers with a length");
                    }
                    Err(_) => {}
                }
            }
            2 => {
                // The guest makes more chains available.
                let idx = read_u16(avail + 2);
                let more = u16::from(input.u8()) % (size + 1);
                avail_heads(&mut input, idx, more);
                write_u16(avail + 2, idx.wrapping_add(more));
            }
            _ => {
                let k = u64::from(input.u8()) % u64::from(size);
                mem.write_slice(&vq_desc(&mut input), GuestAddress(desc_table + k * 16)).unwrap();
            }
        }
        let _ = queue.needs_notification(&mem);
    }
}

/// vhost-user message header fields, little-endian.
const VU_HEADER: usize = 12;
const VU_MAX_PAYLOAD: usize = 64 * 1024;
const VU_SET_FEATURES: u32 = 2;
const VU_SET_VRING_ENABLE: u32 = 18;
const VU_FLAG_NEED_REPLY: u32 = 0x8;

fn vu_message(request: u32, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(VU_HEADER + payload.len());
    for word in [request, flags, payload.len() as u32] {
        m.extend_from_slice(&word.to_le_bytes());
    }
    m.extend_from_slice(payload);
    m
}

/// Everything `sock` receives until its peer closes, read by a thread of
/// its own: many small messages fill a socket's buffer (each is a buffer
/// of its own in the kernel) long before their bytes would, and a writer
/// nobody reads from blocks for ever.
fn reader(sock: UnixStream) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let _ = (&sock).read_to_end(&mut out);
        out
    })
}

/// Input: two octets (how much of the rest QEMU sends; the remainder is
/// what the daemon sends back), then the two byte streams. QEMU's stream
/// goes through `Message::read_from` and `Relay::from_frontend` and must
/// reach the daemon exactly as a model of the quirk says (every message
/// as it came, an early SET_VRING_ENABLE held until after SET_FEATURES
/// with its NEED_REPLY answered by the relay); the daemon's stream must
/// reach QEMU unchanged. Then both streams go through `Relay::run`, which
/// must end (by a closed side or an error) and forward a prefix of the
/// same messages.
pub fn vhost_user_relay(data: &[u8]) {
    use vt3d::vhost::relay::{Message, Relay};

    // Both streams sit in socket buffers before anyone reads them.
    let mut input = Input::new(&data[..data.len().min(32 << 10)]);
    let split = usize::from(input.u16());
    let rest = input.bytes(usize::MAX);
    let (front_stream, back_stream) = rest.split_at(split.min(rest.len()));

    // The model: parse QEMU's stream independently.
    let mut to_daemon = Vec::new();
    let mut to_qemu = Vec::new();
    let mut held: Vec<Vec<u8>> = Vec::new();
    let mut features_set = false;
    let mut messages = 0usize;
    let mut at = front_stream;
    while at.len() >= VU_HEADER {
        let word = |k: usize| u32::from_le_bytes(at[k * 4..k * 4 + 4].try_into().unwrap());
        let (request, mut flags, size) = (word(0), word(1), word(2) as usize);
        if size > VU_MAX_PAYLOAD || at.len() < VU_HEADER + size {
            break;
        }
        let payload = &at[VU_HEADER..VU_HEADER + size];
        messages += 1;
        match request {
            VU_SET_VRING_ENABLE if !features_set => {
                if flags & VU_FLAG_NEED_REPLY != 0 {
                    to_qemu.extend(vu_message(VU_SET_VRING_ENABLE, 0x1 | 0x4, &0u64.to_le_bytes()));
                    flags &= !VU_FLAG_NEED_REPLY;
                }
                held.push(vu_message(request, flags, payload));
            }
            VU_SET_FEATURES => {
                to_daemon.extend(vu_message(request, flags, payload));
                features_set = true;
                for m in held.drain(..) {
                    to_daemon.extend(m);
                }
            }
            _ => to_daemon.extend(vu_message(request, flags, payload)),
        }
        at = &at[VU_HEADER + size..];
    }

    // The relay, one message at a time.
    let (qemu, front) = UnixStream::pair().unwrap();
    let (back, daemon) = UnixStream::pair().unwrap();
    (&qemu).write_all(front_stream).unwrap();
    qemu.shutdown(std::net::Shutdown::Write).unwrap();
    let (at_daemon, at_qemu) = (reader(daemon), reader(qemu));
    let mut relay = Relay::default();
    let mut relayed = 0usize;
    while let Ok(Some(msg)) = Message::read_from(&front) {
        assert!(msg.payload().len() <= VU_MAX_PAYLOAD);
        relay.from_frontend(msg, &front, &back).unwrap();
        relayed += 1;
    }
    drop((front, back));
    assert_eq!(relayed, messages, "messages read");
    assert_eq!(at_daemon.join().unwrap(), to_daemon, "what reached the daemon");
    assert_eq!(at_qemu.join().unwrap(), to_qemu, "what QEMU got back");

    // The daemon's replies, back to QEMU unchanged.
    let (daemon, back) = UnixStream::pair().unwrap();
    let (front, qemu) = UnixStream::pair().unwrap();
    (&daemon).write_all(back_stream).unwrap();
    daemon.shutdown(std::net::Shutdown::Write).unwrap();
    let at_qemu = reader(qemu);
    let mut expected = Vec::new();
    while let Ok(Some(msg)) = Message::read_from(&back) {
        msg.write_to(&front).unwrap();
        expected.extend(vu_message(msg.request(), msg.flags(), msg.payload()));
    }
    drop(front);
    let got = at_qemu.join().unwrap();
    assert_eq!(got, expected);
    assert!(back_stream.starts_with(&got), "a reply changed on its way");

    // Both directions at once through the relay's loop.
    let (qemu, front) = UnixStream::pair().unwrap();
    let (back, daemon) = UnixStream::pair().unwrap();
    let (stop, _stop_writer) = UnixStream::pair().unwrap();
    (&qemu).write_all(front_stream).unwrap();
    (&daemon).write_all(back_stream).unwrap();
    qemu.shutdown(std::net::Shutdown::Write).unwrap();
    daemon.shutdown(std::net::Shutdown::Write).unwrap();
    let (at_daemon, at_qemu) = (reader(daemon), reader(qemu));
    use std::os::fd::AsFd;
    let _ = Relay::default().run(&front, &back, stop.as_fd());
    drop((front, back));
    let _ = at_qemu.join().unwrap();
    let reached = at_daemon.join().unwrap();
    assert!(to_daemon.starts_with(&reached), "the loop forwarded something else");
}
