//! The control protocol driven as vt3.ko drives it, hostile inputs included.

use super::*;
use crate::abi::*;
use crate::rnic::{Counts, Limits};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};

const GUEST: [u8; 6] = [0x52, 0x54, 0, 0, 0, 1];
const MEM: usize = 64 << 20;
const PBL: u64 = 0x10_0000; // page lists are written here
const PAGES: u64 = 0x20_0000; // ring and buffer pages from here
const STATUS: u64 = 0x1f_0000; // status pages
const NOW: crate::rnic::Instant = crate::rnic::Instant::from_millis_const(1000);

/// The provisioned key (vt3d --key-file, the guest's fw_cfg).
const KEY: Key = [0x0123_4567_89ab_cdef, 0x0fed_cba9_8765_4321];

struct Driver {
    chan: Channel,
    end: DriverEnd,
    rnic: Rnic,
    mem: GuestMemoryMmap,
    /// Event frames that followed the last response.
    events: Vec<Vec<u8>>,
    /// The channel's clock.
    now: crate::rnic::Instant,
    seq: u32,
    next_pbl: u64,
    next_page: u64,
    next_status: u64,
}

fn zeroed<T: ByteValued + Default>() -> T {
    T::default()
}

impl Driver {
    fn new() -> Self {
        Self::with_limits(Limits::default())
    }

    /// A driver whose first contact vt3d took.
    fn with_limits(limits: Limits) -> Self {
        let mut d = Self::without_session(limits);
        d.handshake();
        assert_eq!(d.sessions(), 1);
        d
    }

    fn without_session(limits: Limits) -> Self {
        Self {
            chan: Channel::new(KEY, std::sync::Arc::default()),
            end: DriverEnd::new(KEY),
            rnic: Rnic::new(limits, 1500),
            mem: GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM)]).unwrap(),
            events: Vec::new(),
            now: NOW,
            seq: 0,
            next_pbl: PBL,
            next_page: PAGES,
            next_status: STATUS,
        }
    }

    /// A command frame sealed by the driver, header fields as given.
    fn frame(&mut self, version: u8, opcode: u16, len: u16, payload: &[u8]) -> Vec<u8> {
        self.seq += 1;
        let mut hdr = header(MsgType::Cmd, opcode, self.seq, 0, usize::from(len));
        hdr.version = version;
        build_frame(GUEST, GUEST, &self.end.seal(hdr, payload))
    }

    fn deliver(&mut self, frame: &[u8]) -> Outcome {
        self.chan.handle_frame(&mut self.rnic, &self.mem, frame, self.now)
    }

    fn sessions(&self) -> u64 {
        self.chan.stats().sessions.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The first contact as vt3.ko makes it: HELLO, vt3d's challenge,
    /// PROVE and its answer under the new session key.
    fn handshake(&mut self) {
        let hello = build_frame(GUEST, GUEST, &self.end.hello());
        let Outcome::Reply(challenge) = self.deliver(&hello) else { panic!("HELLO not answered") };
        assert_eq!(&challenge[..6], &GUEST);
        let (_, prove) = self.end.prove(&challenge[14..]).expect("a challenge under the provisioned key");
        let (status, body) = self.send(&build_frame(GUEST, GUEST, &prove));
        assert_eq!((status, body.len()), (Status::Ok as u16, 0), "PROVE answered");
    }

    /// Sends a command; returns (status, response payload).
    fn raw(&mut self, opcode: u16, payload: &[u8]) -> (u16, Vec<u8>) {
        let f = self.frame(VT3_CTRL_VERSION, opcode, payload.len() as u16, payload);
        self.send(&f)
    }

    /// Sends a frame that must be answered; checks the answer is sealed
    /// for the driver, and so are the events after it.
    fn send(&mut self, frame: &[u8]) -> (u16, Vec<u8>) {
        let Outcome::Reply(resp) = self.deliver(frame) else {
            panic!("no reply");
        };
        let mut frames = vec![resp];
        let mut events = std::collections::VecDeque::new();
        self.chan.take_events(&mut self.rnic, &mut events, usize::MAX);
        frames.extend(events);
        let resp = &frames[0];
        assert_eq!(&resp[12..14], &VT3_ETHERTYPE.to_be_bytes());
        assert_eq!(&resp[..6], &GUEST);
        let opened = self.end.open(&resp[14..]).expect("a response the driver takes");
        assert_eq!(opened.hdr.r#type, MsgType::Resp as u8);
        assert_eq!(opened.hdr.seq.to_native(), self.end_seq(frame), "response must echo seq");
        let body = opened.payload.to_vec();
        let status = opened.hdr.status.to_native();
        for ev in &frames[1..] {
            let e = self.end.open(&ev[14..]).expect("an event the driver takes");
            assert_eq!(e.hdr.r#type, MsgType::Event as u8);
        }
        self.events = frames[1..].to_vec();
        (status, body)
    }

    fn end_seq(&self, frame: &[u8]) -> u32 {
        read_struct::<CtrlHdr>(&frame[14..]).unwrap().seq.to_native()
    }

    fn cmd<T: ByteValued>(&mut self, cmd: Cmd, args: &T) -> Result<Vec<u8>, Status> {
        let (status, body) = self.raw(cmd as u16, args.as_slice());
        match Status::try_from(status).unwrap() {
            Status::Ok => Ok(body),
            s => Err(s),
        }
    }

    fn handle(&mut self, cmd: Cmd, args: &impl ByteValued) -> Result<u32, Status> {
        let body = self.cmd(cmd, args)?;
        Ok(read_struct::<RespHandle>(&body).unwrap().handle.to_native())
    }

    fn by_handle(&mut self, cmd: Cmd, h: u32) -> Result<Vec<u8>, Status> {
        self.cmd(cmd, &CmdHandle { handle: h.into(), reserved: 0.into() })
    }

    /// Allocates `n` fresh guest pages and writes their page list.
    fn pbl(&mut self, n: u32) -> u64 {
        let at = self.next_pbl;
        for i in 0..u64::from(n) {
            self.mem.write_obj(self.next_page.to_le(), GuestAddress(at + i * 8)).unwrap();
            self.next_page += VT3_PAGE_SIZE;
        }
        self.next_pbl += u64::from(n) * 8;
        at
    }

    fn status(&mut self) -> u64 {
        let at = self.next_status;
        self.next_status += 64;
        at
    }

    fn pd(&mut self) -> u32 {
        self.handle(Cmd::AllocPd, &zeroed::<CmdHandle>()).unwrap()
    }

    fn reg_mr_args(&mut self, pdn: u32, length: u64, access: u32) -> CmdRegMr {
        let npages = length.div_ceil(VT3_PAGE_SIZE) as u32;
        CmdRegMr {
            iova: 0x7f00_0000_0000u64.into(),
            length: length.into(),
            pbl_addr: self.pbl(npages).into(),
            npages: npages.into(),
            pdn: pdn.into(),
            access: access.into(),
            ..zeroed()
        }
    }

    fn cq_args(&mut self, depth: u32) -> CmdCreateCq {
        let npages = (depth * 32).div_ceil(VT3_PAGE_SIZE as u32);
        CmdCreateCq {
            ring_pbl_addr: self.pbl(npages).into(),
            status_addr: self.status().into(),
            ring_npages: npages.into(),
            depth: depth.into(),
        }
    }

    fn cq(&mut self, depth: u32) -> u32 {
        let a = self.cq_args(depth);
        self.handle(Cmd::CreateCq, &a).unwrap()
    }

    fn qp_args(&mut self, pdn: u32, scq: u32, rcq: u32, depth: u32) -> CmdCreateQp {
        let npages = (depth * 128).div_ceil(VT3_PAGE_SIZE as u32);
        CmdCreateQp {
            sq_pbl_addr: self.pbl(npages).into(),
            rq_pbl_addr: self.pbl(npages).into(),
            status_addr: self.status().into(),
            sq_npages: npages.into(),
            rq_npages: npages.into(),
            sq_depth: depth.into(),
            rq_depth: depth.into(),
            pdn: pdn.into(),
            send_cqn: scq.into(),
            recv_cqn: rcq.into(),
            max_send_sge: 4.into(),
            max_recv_sge: 4.into(),
            max_inline: 64.into(),
            ..zeroed()
        }
    }

    fn counts(&self) -> Counts {
        self.rnic.counts()
    }
}

mod query {
    use super::*;

    #[test]
    fn device_attributes_are_the_limits() {
        let mut d = Driver::new();
        let body = d.cmd(Cmd::QueryDevice, &[0u8; 0]).unwrap();
        let attr: DeviceAttr = read_struct(&body).unwrap();
        let l = Limits::default();
        assert_eq!(attr.max_qp.to_native(), l.max_qp);
        assert_eq!(attr.max_sge.to_native(), 4);
        assert_eq!(attr.max_inline.to_native(), 64);
        assert_eq!(attr.max_qp_rd_atom.to_native(), 8);
        assert_eq!(attr.vendor_id.to_native(), VT3_VENDOR_ID);
        assert_eq!(attr.page_size_cap.to_native(), 4096);
        let port: PortAttr = read_struct(&d.cmd(Cmd::QueryPort, &[0u8; 0]).unwrap()).unwrap();
        assert_eq!((port.mtu.to_native(), port.link_up.to_native()), (1500, 1));
    }
}

mod pd_and_mr {
    use super::*;

    #[test]
    fn register_and_deregister() {
        let mut d = Driver::new();
        let pdn = d.pd();
        let a = d.reg_mr_args(pdn, 3 * 4096 + 5, 7);
        let stag = d.handle(Cmd::RegMr, &a).unwrap();
        let mr = d.rnic.tpt().get(stag).unwrap();
        assert_eq!(mr.length, 3 * 4096 + 5);
        assert_eq!(d.by_handle(Cmd::DeallocPd, pdn), Err(Status::Busy), "PD still has an MR");
        d.by_handle(Cmd::DeregMr, stag).unwrap();
        assert_eq!(d.by_handle(Cmd::DeregMr, stag), Err(Status::NotFound));
        d.by_handle(Cmd::DeallocPd, pdn).unwrap();
        assert_eq!(d.counts(), Counts::default());
    }

    #[test]
    fn key_changes_on_reregistration() {
        let mut d = Driver::with_limits(Limits { max_mr: 1, ..Limits::default() });
        let pdn = d.pd();
        let a = d.reg_mr_args(pdn, 4096, 1);
        let first = d.handle(Cmd::RegMr, &a).unwrap();
        assert_eq!(d.handle(Cmd::RegMr, &a), Err(Status::NoResource), "max_mr enforced");
        d.by_handle(Cmd::DeregMr, first).unwrap();
        let second = d.handle(Cmd::RegMr, &a).unwrap();
        assert_eq!(first >> 8, second >> 8);
        assert_ne!(first, second);
        assert_eq!(d.by_handle(Cmd::DeregMr, first), Err(Status::NotFound), "stale STag");
    }

    fn dma_mr(pdn: u32, access: u32, flags: u32) -> CmdRegMr {
        CmdRegMr {
            iova: 0.into(),
            length: u64::MAX.into(),
            pdn: pdn.into(),
            access: access.into(),
            flags: flags.into(),
            ..zeroed()
        }
    }

    #[test]
    fn dma_mr_needs_no_page_list() {
        let mut d = Driver::new();
        let pdn = d.pd();
        let stag = d.handle(Cmd::RegMr, &dma_mr(pdn, Access::LocalWrite as u32, MrFlag::Dma as u32)).unwrap();
        let mr = d.rnic.tpt().get(stag).unwrap();
        assert!(matches!(mr.backing, crate::rnic::tpt::Backing::Dma), "{:?}", mr.backing);
        assert_eq!((mr.iova, mr.length, mr.access), (0, u64::MAX, Access::LocalWrite as u32));
    }

    /// Remote rights over all of guest memory only with the kernel's
    /// unsafe global rkey (IB_PD_UNSAFE_GLOBAL_RKEY).
    #[test]
    fn a_dma_mr_gets_remote_rights_only_with_an_unsafe_global_rkey() {
        let mut d = Driver::new();
        let pdn = d.pd();
        let dma = MrFlag::Dma as u32;
        let unsafe_rkey = dma | MrFlag::UnsafeGlobalRkey as u32;
        for remote in [Access::RemoteRead, Access::RemoteWrite, Access::MwBind] {
            let access = Access::LocalWrite as u32 | remote as u32;
            assert_eq!(d.handle(Cmd::RegMr, &dma_mr(pdn, access, dma)), Err(Status::Invalid), "{remote:?}");
            let stag = d.handle(Cmd::RegMr, &dma_mr(pdn, access, unsafe_rkey)).unwrap();
            assert_eq!(d.rnic.tpt().get(stag).unwrap().access, access);
        }
        assert_eq!(d.counts().mr, 3);
        // The flag means nothing without a DMA MR.
        let mut paged = d.reg_mr_args(pdn, 4096, 1);
        paged.flags = (MrFlag::UnsafeGlobalRkey as u32).into();
        assert_eq!(d.handle(Cmd::RegMr, &paged), Err(Status::Invalid));
    }

    #[test]
    fn hostile_registrations_are_refused() {
        let mut d = Driver::with_limits(Limits { max_pbl_pages: 16, pbl_budget: 20, ..Limits::default() });
        let pdn = d.pd();
        let good = d.reg_mr_args(pdn, 4096, 1);
        let mut cases: Vec<(CmdRegMr, Status)> = vec![
            (CmdRegMr { pdn: 99.into(), ..good }, Status::NotFound),
            (CmdRegMr { access: 0x10.into(), ..good }, Status::Invalid),
            (CmdRegMr { length: 0.into(), ..good }, Status::Invalid),
            (CmdRegMr { length: 4097.into(), ..good }, Status::Invalid),
            (CmdRegMr { page_offset: 1.into(), ..good }, Status::Invalid),
            (CmdRegMr { page_offset: 4096.into(), ..good }, Status::Invalid),
            (CmdRegMr { npages: 0.into(), ..good }, Status::Invalid),
            (CmdRegMr { npages: 17.into(), length: (17 * 4096).into(), ..good }, Status::Invalid),
            (CmdRegMr { pbl_addr: (MEM as u64 - 4).into(), ..good }, Status::BadAddress),
            (CmdRegMr { pbl_addr: u64::MAX.into(), ..good }, Status::BadAddress),
            (CmdRegMr { iova: u64::MAX.into(), ..good }, Status::Invalid),
            (CmdRegMr { flags: 2.into(), ..good }, Status::Invalid),
        ];
        // A page list naming an unaligned page, and one outside guest RAM.
        for page in [PAGES + 1, MEM as u64] {
            let at = d.next_pbl;
            d.mem.write_obj(page.to_le(), GuestAddress(at)).unwrap();
            d.next_pbl += 8;
            let status = if page % 4096 == 0 { Status::BadAddress } else { Status::Invalid };
            cases.push((CmdRegMr { pbl_addr: at.into(), ..good }, status));
        }
        for (args, want) in cases {
            assert_eq!(d.handle(Cmd::RegMr, &args), Err(want), "{args:?}");
        }
        // The PBL budget (20 pages) is enforced across registrations.
        let big = d.reg_mr_args(pdn, 16 * 4096, 1);
        d.handle(Cmd::RegMr, &big).unwrap();
        let more = d.reg_mr_args(pdn, 8 * 4096, 1);
        assert_eq!(d.handle(Cmd::RegMr, &more), Err(Status::NoResource));
        assert_eq!(d.counts().mr, 1, "nothing half-registered");
    }
}

mod cq_and_qp {
    use super::*;

    #[test]
    fn lifecycle_with_references() {
        let mut d = Driver::new();
        let pdn = d.pd();
        let (scq, rcq) = (d.cq(64), d.cq(16));
        let a = d.qp_args(pdn, scq, rcq, 128);
        let status_addr = a.status_addr.to_native();
        let qpn = d.handle(Cmd::CreateQp, &a).unwrap();
        assert_eq!(d.by_handle(Cmd::DestroyCq, scq), Err(Status::Busy));
        assert_eq!(d.by_handle(Cmd::DeallocPd, pdn), Err(Status::Busy));

        let attr: QpAttr = read_struct(&d.by_handle(Cmd::QueryQp, qpn).unwrap()).unwrap();
        assert_eq!((attr.state.to_native(), attr.sq_depth.to_native()), (QpState::Idle as u32, 128));

        // The driver may not move a QP to RTS (the connection does that).
        let to = |state: QpState| CmdModifyQp {
            qpn: qpn.into(),
            mask: (ModifyMask::State as u32).into(),
            state: (state as u32).into(),
            ..zeroed()
        };
        assert_eq!(d.cmd(Cmd::ModifyQp, &to(QpState::Rts)), Err(Status::State));
        d.cmd(Cmd::ModifyQp, &to(QpState::Error)).unwrap();
        let st: QpStatus = d.mem.read_obj(GuestAddress(status_addr)).unwrap();
        assert_eq!(st.state.to_native(), QpState::Error as u32);
        assert_eq!(st.flags.to_native() & QpStatusFlag::Error as u32, QpStatusFlag::Error as u32);
        d.cmd(Cmd::ModifyQp, &to(QpState::Idle)).unwrap();

        d.by_handle(Cmd::DestroyQp, qpn).unwrap();
        for cq in [scq, rcq] {
            d.by_handle(Cmd::DestroyCq, cq).unwrap();
        }
        d.by_handle(Cmd::DeallocPd, pdn).unwrap();
        assert_eq!(d.counts(), Counts::default());
    }

    #[test]
    fn arming_a_cq_with_waiting_cqes_raises_the_event_at_once() {
        let mut d = Driver::new();
        let a = d.cq_args(16);
        let status = a.status_addr.to_native();
        let cqn = d.handle(Cmd::CreateCq, &a).unwrap();
        let arm = CmdArmCq { cqn: cqn.into(), flags: (ArmFlag::Next as u32).into() };
        d.cmd(Cmd::ArmCq, &arm).unwrap();
        assert!(d.events.is_empty(), "empty CQ: no event yet");
        // vt3d wrote a CQE the consumer has not seen (prod 1, cons 0).
        d.mem.write_obj(vm_memory::Le32::from(1), GuestAddress(status)).unwrap();
        d.cmd(Cmd::ArmCq, &arm).unwrap();
        assert_eq!(d.events.len(), 1);
        let ev = &d.events[0];
        assert_eq!(&ev[..6], &GUEST);
        let hdr: CtrlHdr = read_struct(&ev[14..]).unwrap();
        assert_eq!((hdr.r#type, hdr.opcode.to_native()), (MsgType::Event as u8, EventType::CqCompletion as u16));
        let body: Event = read_struct(&ev[14 + std::mem::size_of::<CtrlHdr>()..]).unwrap();
        assert_eq!(body.handle.to_native(), cqn);
        assert_eq!(d.rnic.cqs().get(cqn).unwrap().arm_flags, 0, "one event, then disarmed");
    }

    #[test]
    fn rings_and_limits_are_checked() {
        let mut d = Driver::with_limits(Limits { max_cq: 2, ..Limits::default() });
        let pdn = d.pd();
        let good = d.cq_args(64);
        for (args, want) in [
            (CmdCreateCq { depth: 48.into(), ..good }, Status::Invalid),
            (CmdCreateCq { depth: 1.into(), ..good }, Status::Invalid),
            (CmdCreateCq { depth: (1 << 17).into(), ..good }, Status::Invalid),
            (CmdCreateCq { depth: 256.into(), ..good }, Status::Invalid), // ring too small
            (CmdCreateCq { status_addr: (MEM as u64 - 8).into(), ..good }, Status::BadAddress),
            (CmdCreateCq { status_addr: (STATUS + 4).into(), ..good }, Status::BadAddress),
        ] {
            assert_eq!(d.handle(Cmd::CreateCq, &args), Err(want), "{args:?}");
        }
        let c1 = d.cq(16);
        let c2 = d.cq(16);
        assert_eq!(d.handle(Cmd::CreateCq, &good), Err(Status::NoResource), "max_cq enforced");
        let q = d.qp_args(pdn, c1, c2, 64);
        for (args, want) in [
            (CmdCreateQp { send_cqn: 9.into(), ..q }, Status::NotFound),
            (CmdCreateQp { pdn: 9.into(), ..q }, Status::NotFound),
            (CmdCreateQp { max_send_sge: 5.into(), ..q }, Status::Invalid),
            (CmdCreateQp { max_inline: 65.into(), ..q }, Status::Invalid),
            (CmdCreateQp { sq_depth: 8192.into(), ..q }, Status::Invalid),
            (CmdCreateQp { rq_npages: 1.into(), ..q }, Status::Invalid),
            (CmdCreateQp { flags: 0x80.into(), ..q }, Status::Invalid),
        ] {
            assert_eq!(d.handle(Cmd::CreateQp, &args), Err(want), "{args:?}");
        }
        assert_eq!(d.counts().qp, 0);
    }

    #[test]
    fn ten_thousand_cycles_leave_nothing_behind() {
        let mut d = Driver::new();
        let pdn = d.pd();
        let mr = d.reg_mr_args(pdn, 64 * 1024, 7);
        let cq = d.cq_args(64);
        let stag0 = d.handle(Cmd::RegMr, &mr).unwrap();
        d.by_handle(Cmd::DeregMr, stag0).unwrap();
        let qp = d.qp_args(pdn, 0, 0, 16);
        for _ in 0..10_000 {
            let stag = d.handle(Cmd::RegMr, &mr).unwrap();
            let c = d.handle(Cmd::CreateCq, &cq).unwrap();
            let q = d.handle(Cmd::CreateQp, &CmdCreateQp { send_cqn: c.into(), recv_cqn: c.into(), ..qp }).unwrap();
            d.by_handle(Cmd::DestroyQp, q).unwrap();
            d.by_handle(Cmd::DestroyCq, c).unwrap();
            d.by_handle(Cmd::DeregMr, stag).unwrap();
        }
        d.by_handle(Cmd::DeallocPd, pdn).unwrap();
        assert_eq!(d.counts(), Counts::default());
        // The PBL accounting returned to zero as well: a large MR still fits.
        let pdn = d.pd();
        let big = d.reg_mr_args(pdn, 1 << 20, 1);
        d.handle(Cmd::RegMr, &big).unwrap();
    }
}

mod hostile {
    use super::*;

    #[test]
    fn unknown_opcode_is_unsupported_and_another_version_refused() {
        let mut d = Driver::new();
        assert_eq!(d.raw(999, &[]).0, Status::Unsupported as u16);
        let f = d.frame(VT3_CTRL_VERSION - 1, Cmd::AllocPd as u16, 0, &[]);
        assert_eq!(d.deliver(&f), Outcome::Refused(Refusal::Version));
        assert_eq!(d.chan.stats().refused(Refusal::Version), 1);
        assert_eq!(d.counts().pd, 0);
    }

    #[test]
    fn short_payloads_are_invalid() {
        let mut d = Driver::new();
        let no_args = |c: &&Cmd| matches!(c, Cmd::QueryDevice | Cmd::QueryPort | Cmd::AllocPd | Cmd::Reset);
        for cmd in Cmd::ALL.iter().filter(|c| !no_args(c) && !matches!(c, Cmd::Hello | Cmd::Prove)) {
            assert_eq!(d.raw(*cmd as u16, &[1, 2, 3]).0, Status::Invalid as u16, "{}", cmd.name());
        }
        // `len` claims more than the frame carries: nothing to check a MAC over.
        let f = d.frame(VT3_CTRL_VERSION, Cmd::DeallocPd as u16, 8, &[1, 0]);
        assert_eq!(d.deliver(&f), Outcome::Refused(Refusal::Short));
    }

    #[test]
    fn frames_that_are_not_commands_are_refused() {
        let mut d = Driver::new();
        assert_eq!(d.deliver(&[0u8; 20]), Outcome::Refused(Refusal::Short));
        d.seq += 1;
        let resp = header(MsgType::Resp, 1, d.seq, 0, 0);
        let f = build_frame(GUEST, GUEST, &d.end.seal(resp, &[]));
        assert_eq!(d.deliver(&f), Outcome::Refused(Refusal::NotCommand));
    }

    #[test]
    fn doorbells_are_silent_unless_wrong() {
        let mut d = Driver::new();
        let pdn = d.pd();
        let c = d.cq(16);
        let a = d.qp_args(pdn, c, c, 16);
        let qpn = d.handle(Cmd::CreateQp, &a).unwrap();
        let db = CmdDoorbell { qpn: qpn.into(), queues: 1.into() };
        let f = d.frame(VT3_CTRL_VERSION, Cmd::Doorbell as u16, 8, db.as_slice());
        assert_eq!(d.deliver(&f), Outcome::Silent);
        let bad = CmdDoorbell { qpn: (qpn + 1).into(), queues: 1.into() };
        assert_eq!(d.cmd(Cmd::Doorbell, &bad), Err(Status::NotFound));
    }

    /// Random frames: no panic, every reply well formed, and resources
    /// created by lucky frames are all accounted for.
    #[test]
    fn random_frames_never_panic() {
        let mut d = Driver::with_limits(Limits { max_pbl_pages: 64, pbl_budget: 4096, ..Limits::default() });
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 120) as usize;
            let f: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if next() % 2 == 0 {
                // Often a command the driver sealed, so execution is reached.
                let opcode = (next() % 36) as u16;
                let claimed = if next() % 8 == 0 { next() as u16 } else { len as u16 };
                let f = d.frame(VT3_CTRL_VERSION, opcode, claimed, &f);
                let _ = d.deliver(&f);
            } else {
                let _ = d.deliver(&f);
            }
        }
        let c = d.rnic.counts();
        assert!(c.pd <= 1024 && c.mr <= 16384);
    }
}

/// A guest process with a packet socket: it sends and sniffs frames but
/// cannot read kernel memory or learn guest-physical addresses.
mod forgery {
    use super::*;

    const ATTACKER_KEY: Key = [0xdead, 0xbeef];

    fn attacker() -> DriverEnd {
        DriverEnd::new(ATTACKER_KEY)
    }

    fn pd_args() -> CmdHandle {
        zeroed()
    }

    #[test]
    fn commands_before_any_hello_are_refused() {
        let mut d = Driver::without_session(Limits::default());
        let (_, f) = d.end.command(Cmd::AllocPd as u16, pd_args().as_slice());
        assert_eq!(d.deliver(&build_frame(GUEST, GUEST, &f)), Outcome::Refused(Refusal::NoSession));
        assert_eq!(d.chan.stats().refused(Refusal::NoSession), 1);
        assert_eq!(d.counts().pd, 0);
    }

    #[test]
    fn every_command_with_a_key_of_its_own_is_refused() {
        let mut d = Driver::new();
        let pdn = d.pd();
        let mut evil = attacker();
        for cmd in Cmd::ALL {
            let (_, f) = evil.command(*cmd as u16, &[0u8; 64]);
            let why = if matches!(cmd, Cmd::Hello | Cmd::Prove) { Refusal::Hello } else { Refusal::Mac };
            assert_eq!(d.deliver(&build_frame(GUEST, GUEST, &f)), Outcome::Refused(why), "{}", cmd.name());
        }
        // A DMA MR over all of guest RAM, the prize.
        let dma = CmdRegMr {
            length: u64::MAX.into(),
            pdn: pdn.into(),
            access: 7.into(),
            flags: (MrFlag::Dma as u32).into(),
            ..zeroed()
        };
        let (_, f) = evil.command(Cmd::RegMr as u16, dma.as_slice());
        assert_eq!(d.deliver(&build_frame(GUEST, GUEST, &f)), Outcome::Refused(Refusal::Mac));
        assert_eq!(d.chan.stats().refused(Refusal::Mac), Cmd::ALL.len() as u64 - 1);
        assert_eq!(d.chan.stats().refused(Refusal::Hello), 2);
        assert_eq!((d.counts().pd, d.counts().mr), (1, 0), "nothing but the driver's PD");
        // The driver's session goes on undisturbed.
        assert_eq!(d.pd(), pdn + 1);
    }

    #[test]
    fn replayed_and_modified_commands_are_refused() {
        let mut d = Driver::new();
        let f = d.frame(VT3_CTRL_VERSION, Cmd::AllocPd as u16, 8, pd_args().as_slice());
        assert_eq!(d.send(&f).0, Status::Ok as u16);
        assert_eq!(d.deliver(&f), Outcome::Refused(Refusal::Replay));
        assert_eq!(d.counts().pd, 1);
        // Sniffed and changed: DEALLOC_PD of the driver's PD 1, made from a
        // frame of the same length.
        let g = d.frame(VT3_CTRL_VERSION, Cmd::QueryQp as u16, 8, &[1, 0, 0, 0, 0, 0, 0, 0]);
        let mut changed = g.clone();
        changed[16] = Cmd::DeallocPd as u8;
        assert_eq!(d.deliver(&changed), Outcome::Refused(Refusal::Mac));
        assert_eq!(d.counts().pd, 1);
        assert_eq!(d.chan.stats().refused(Refusal::Replay), 1);
        // The genuine frame was never taken: it still goes through once.
        assert_eq!(d.send(&g).0, Status::NotFound as u16);
    }

    #[test]
    fn frames_of_several_cpus_may_overtake_each_other() {
        let mut d = Driver::new();
        let first = d.frame(VT3_CTRL_VERSION, Cmd::AllocPd as u16, 8, pd_args().as_slice());
        let second = d.frame(VT3_CTRL_VERSION, Cmd::AllocPd as u16, 8, pd_args().as_slice());
        assert_eq!(d.send(&second).0, Status::Ok as u16);
        assert_eq!(d.send(&first).0, Status::Ok as u16);
        assert_eq!(d.counts().pd, 2);
    }

    #[test]
    fn answers_and_events_are_sealed_for_the_driver_alone() {
        let mut d = Driver::new();
        let f = d.frame(VT3_CTRL_VERSION, Cmd::AllocPd as u16, 8, pd_args().as_slice());
        let Outcome::Reply(resp) = d.deliver(&f) else { panic!("no reply") };
        let frames = [resp];
        assert!(attacker().open(&frames[0][14..]).is_err(), "sealed with the session key");
        let mut driver = d.end.clone();
        assert!(driver.open(&frames[0][14..]).is_ok());
        assert_eq!(driver.open(&frames[0][14..]).unwrap_err(), Refusal::Replay, "taken once");
        // A forged event (what an attacker would send to vt3.ko).
        let ev = header(MsgType::Event, EventType::DeviceFatal as u16, 0, 0, 0);
        assert_eq!(d.end.open(&attacker().seal(ev, &[])).unwrap_err(), Refusal::Mac);
    }
}

/// `vt3d ctl fault mute-commands`: a hung command channel.
mod muted {
    use super::*;
    use vt3_iwarp::toe::Duration;

    fn at(d: &mut Driver, cmd: Cmd, payload: &[u8], ms_after: u64) -> Outcome {
        let f = d.frame(VT3_CTRL_VERSION, cmd as u16, payload.len() as u16, payload);
        d.chan.handle_frame(&mut d.rnic, &d.mem, &f, NOW + Duration::from_millis(ms_after))
    }

    #[test]
    fn commands_go_unanswered_and_undone_while_doorbells_and_arming_are_served_until_the_time_is_up() {
        let mut d = Driver::new();
        let cqn = d.cq(16);
        d.rnic.mute_commands(NOW, Duration::from_millis(1000)).unwrap();
        let b = d.cq_args(16);
        assert_eq!(at(&mut d, Cmd::CreateCq, b.as_slice(), 999), Outcome::Silent);
        assert_eq!(d.counts().cq, 1, "a dropped command is not carried out either");
        assert_eq!(at(&mut d, Cmd::QueryPort, &[], 500), Outcome::Silent, "liveness probes are lost too");
        let arm = CmdArmCq { cqn: cqn.into(), flags: (ArmFlag::Next as u32).into() };
        assert!(matches!(at(&mut d, Cmd::ArmCq, arm.as_slice(), 500), Outcome::Reply(_)), "arming is served");
        assert!(d.rnic.cqs().get(cqn).unwrap().arm_flags != 0);
        assert_eq!(d.rnic.fault_stats().muted_commands, 2);
        assert!(matches!(at(&mut d, Cmd::CreateCq, b.as_slice(), 1000), Outcome::Reply(_)), "answered again");
        assert_eq!(d.counts().cq, 2);
    }

    #[test]
    fn zero_lifts_it() {
        let mut d = Driver::new();
        d.rnic.mute_commands(NOW, Duration::from_secs(60)).unwrap();
        assert_eq!(at(&mut d, Cmd::QueryPort, &[], 1), Outcome::Silent);
        d.rnic.mute_commands(NOW, Duration::ZERO).unwrap();
        assert!(matches!(at(&mut d, Cmd::QueryPort, &[], 2), Outcome::Reply(_)));
        assert_eq!(d.rnic.fault_stats().mute_commands, 2);
    }
}

/// `vt3d ctl fault lose-reply`: one command carried out, its answer lost.
mod lost_reply {
    use super::*;

    fn send(d: &mut Driver, cmd: Cmd, payload: &[u8]) -> Outcome {
        let f = d.frame(VT3_CTRL_VERSION, cmd as u16, payload.len() as u16, payload);
        d.chan.handle_frame(&mut d.rnic, &d.mem, &f, NOW)
    }

    #[test]
    fn the_next_such_command_is_carried_out_unanswered_once_and_the_others_are_answered() {
        let mut d = Driver::new();
        d.rnic.lose_reply(Cmd::CreateCq).unwrap();
        assert!(matches!(send(&mut d, Cmd::QueryPort, &[]), Outcome::Reply(_)), "another command is answered");
        let b = d.cq_args(16);
        assert_eq!(send(&mut d, Cmd::CreateCq, b.as_slice()), Outcome::Silent);
        assert_eq!(d.counts().cq, 1, "the command was carried out");
        assert!(matches!(send(&mut d, Cmd::CreateCq, b.as_slice()), Outcome::Reply(_)), "only once");
        assert_eq!(d.counts().cq, 2);
        let stats = d.rnic.fault_stats();
        assert_eq!((stats.lose_reply, stats.lost_replies), (1, 1));
    }

    #[test]
    fn commands_without_a_reply_or_that_end_the_session_are_refused() {
        let mut d = Driver::new();
        for cmd in [Cmd::Doorbell, Cmd::ArmCq, Cmd::Hello, Cmd::Prove, Cmd::Reset] {
            assert!(d.rnic.lose_reply(cmd).is_err(), "{}", cmd.name());
        }
        assert_eq!(d.rnic.fault_stats().refused, 5);
        assert!(matches!(send(&mut d, Cmd::QueryPort, &[]), Outcome::Reply(_)));
    }
}

/// The first contact (docs/security.md, steps 1-4) against an attacker who sniffs
/// every frame, replays and changes them, and floods: only a driver that
/// holds the provisioned key starts a session, and nothing short of a
/// proven one touches the live session.
mod first_contact {
    use super::*;
    use vt3_iwarp::toe::Duration;

    fn hello_of(end: &mut DriverEnd) -> Vec<u8> {
        build_frame(GUEST, GUEST, &end.hello())
    }

    fn challenge(d: &mut Driver, hello: &[u8]) -> Vec<u8> {
        match d.deliver(hello) {
            Outcome::Reply(f) => f,
            other => panic!("HELLO not answered: {other:?}"),
        }
    }

    fn refused(d: &Driver, why: Refusal) -> u64 {
        d.chan.stats().refused(why)
    }

    /// A live session with one PD, and a second driver end that holds
    /// the key (a reloaded vt3.ko) or not (an attacker).
    fn live() -> (Driver, u32) {
        let mut d = Driver::new();
        let pdn = d.pd();
        (d, pdn)
    }

    /// The live session still works and still holds its PD.
    fn assert_undisturbed(d: &mut Driver, pdn: u32) {
        assert_eq!(d.sessions(), 1, "a session was replaced");
        assert_eq!(d.counts().pd, 1, "the session's objects were dropped");
        assert_eq!(d.pd(), pdn + 1, "the live session's commands go unanswered");
    }

    #[test]
    fn both_ends_prove_the_key_and_the_session_key_never_crosses_the_wire() {
        let mut d = Driver::without_session(Limits::default());
        let hello = hello_of(&mut d.end);
        let answer = challenge(&mut d, &hello);
        let (_, prove) = d.end.prove(&answer[14..]).unwrap();
        let resp: RespHello = read_struct(&answer[14 + 24..]).unwrap();
        let ks = session_key(&KEY, &resp.driver_nonce, &resp.device_nonce);
        for frame in [&hello[14..], &answer[14..], &prove[..]] {
            for key in [KEY, ks] {
                for w in key {
                    let needle = w.to_le_bytes();
                    assert!(!frame.windows(8).any(|x| x == needle), "a key word on the wire");
                }
            }
        }
        assert_eq!(d.send(&build_frame(GUEST, GUEST, &prove)).0, Status::Ok as u16);
        assert_eq!(d.sessions(), 1);
        d.pd();
        // Two first contacts, two challenges, two session keys.
        let mut again = Driver::without_session(Limits::default());
        let h = hello_of(&mut again.end);
        let other: RespHello = read_struct(&challenge(&mut again, &h)[14 + 24..]).unwrap();
        assert_ne!(other.device_nonce, resp.device_nonce);
    }

    #[test]
    fn a_driver_without_the_key_gets_no_challenge_and_no_session() {
        let (mut d, pdn) = live();
        let mut evil = DriverEnd::new([0xdead, 0xbeef]);
        assert_eq!(d.deliver(&hello_of(&mut evil)), Outcome::Refused(Refusal::Hello));
        assert_eq!(refused(&d, Refusal::Hello), 1);
        assert_undisturbed(&mut d, pdn);
    }

    /// What the mutant "accept an unproven HELLO" breaks: a HELLO under
    /// the key (a replay of an old one, or a reloaded driver that never
    /// finishes) gets a challenge and nothing else.
    #[test]
    fn a_hello_alone_never_touches_the_live_session() {
        let (mut d, pdn) = live();
        let mut reloaded = DriverEnd::new(KEY);
        let answer = challenge(&mut d, &hello_of(&mut reloaded));
        assert!(reloaded.prove(&answer[14..]).is_ok());
        assert_undisturbed(&mut d, pdn);
    }

    #[test]
    fn a_proven_session_replaces_the_old_one_and_drops_its_objects() {
        let (mut d, _) = live();
        let mut reloaded = DriverEnd::new(KEY);
        let answer = challenge(&mut d, &hello_of(&mut reloaded));
        let (seq, prove) = reloaded.prove(&answer[14..]).unwrap();
        let Outcome::Reply(resp) = d.deliver(&build_frame(GUEST, GUEST, &prove)) else { panic!("PROVE not answered") };
        let m = reloaded.open(&resp[14..]).unwrap();
        assert_eq!((m.hdr.seq.to_native(), m.hdr.counter.to_native()), (seq, 1));
        assert_eq!(d.counts().pd, 0, "objects belong to the session that made them");
        assert_eq!(d.sessions(), 2);
        let old = d.frame(VT3_CTRL_VERSION, Cmd::AllocPd as u16, 8, zeroed::<CmdHandle>().as_slice());
        assert_eq!(d.deliver(&old), Outcome::Refused(Refusal::Mac), "the old session's frames");
    }

    #[test]
    fn sniffed_first_contacts_replayed_are_refused() {
        let mut d = Driver::without_session(Limits::default());
        let hello = hello_of(&mut d.end);
        let answer = challenge(&mut d, &hello);
        let (_, prove) = d.end.prove(&answer[14..]).unwrap();
        let prove = build_frame(GUEST, GUEST, &prove);
        // Replayed before and after the PROVE.
        assert_eq!(d.deliver(&hello), Outcome::Refused(Refusal::HelloReplay));
        assert_eq!(d.send(&prove).0, Status::Ok as u16);
        let pdn = d.pd();
        assert_eq!(d.deliver(&hello), Outcome::Refused(Refusal::HelloReplay));
        assert_eq!(d.deliver(&prove), Outcome::Refused(Refusal::HelloReplay));
        // vt3d's own answer sent back: not a command.
        assert_eq!(d.deliver(&answer), Outcome::Refused(Refusal::NotCommand));
        assert_eq!(refused(&d, Refusal::HelloReplay), 3);
        assert_undisturbed(&mut d, pdn);
    }

    #[test]
    fn every_changed_byte_of_a_hello_or_prove_is_refused() {
        let mut d = Driver::without_session(Limits::default());
        let hello = hello_of(&mut d.end);
        let answer = challenge(&mut d, &hello);
        let (_, prove) = d.end.prove(&answer[14..]).unwrap();
        let prove = build_frame(GUEST, GUEST, &prove);
        // Slow enough for the bucket never to run dry (each check is made)
        // and quick enough for the challenge to stay valid.
        for frame in [&hello, &prove] {
            for byte in 14..frame.len() {
                let mut f = frame.clone();
                f[byte] ^= 0x01;
                d.now += Duration::from_millis(60);
                let Outcome::Refused(why) = d.deliver(&f) else { panic!("byte {byte} changed and answered") };
                assert!(
                    matches!(
                        why,
                        Refusal::Hello | Refusal::Version | Refusal::Short | Refusal::NotCommand | Refusal::NoSession
                    ),
                    "byte {byte}: {why:?}"
                );
            }
        }
        assert_eq!(refused(&d, Refusal::HelloLimited), 0);
        assert_eq!(d.sessions(), 0);
        // The genuine PROVE was never taken: it still goes through.
        assert_eq!(d.send(&prove).0, Status::Ok as u16);
    }

    #[test]
    fn a_prove_under_a_guessed_session_key_or_for_no_challenge_is_refused() {
        let (mut d, pdn) = live();
        // The attacker sniffed a real challenge but lacks the key.
        let mut reloaded = DriverEnd::new(KEY);
        let answer = challenge(&mut d, &hello_of(&mut reloaded));
        let resp: RespHello = read_struct(&answer[14 + 24..]).unwrap();
        let mut evil = DriverEnd::new([3, 4]);
        let prove = CmdProve { driver_nonce: resp.driver_nonce, device_nonce: resp.device_nonce };
        let (_, f) = evil.command(Cmd::Prove as u16, prove.as_slice());
        assert_eq!(d.deliver(&build_frame(GUEST, GUEST, &f)), Outcome::Refused(Refusal::Hello));
        // Nonces vt3d never issued.
        let made_up = CmdProve { driver_nonce: [1; 16], device_nonce: [2; 16] };
        let ks = session_key(&KEY, &made_up.driver_nonce, &made_up.device_nonce);
        let (_, f) = DriverEnd::new(ks).command(Cmd::Prove as u16, made_up.as_slice());
        assert_eq!(d.deliver(&build_frame(GUEST, GUEST, &f)), Outcome::Refused(Refusal::Hello));
        assert_eq!(refused(&d, Refusal::Hello), 2);
        assert_undisturbed(&mut d, pdn);
    }

    #[test]
    fn a_hello_needs_counter_zero_and_its_exact_size() {
        let mut d = Driver::without_session(Limits::default());
        let mut end = DriverEnd::new(KEY);
        // Sealed under the key, but as a session frame (counter 1).
        let (_, f) = end.command(Cmd::Hello as u16, CmdHello { driver_nonce: [5; 16] }.as_slice());
        assert_eq!(d.deliver(&build_frame(GUEST, GUEST, &f)), Outcome::Refused(Refusal::Hello));
        let (_, f) = end.command(Cmd::Hello as u16, &[5; 17]);
        assert_eq!(d.deliver(&build_frame(GUEST, GUEST, &f)), Outcome::Refused(Refusal::Hello));
        assert_eq!(refused(&d, Refusal::Hello), 2);
    }

    #[test]
    fn a_challenge_expires() {
        let mut d = Driver::without_session(Limits::default());
        let mut end = d.end.clone();
        let h = hello_of(&mut end);
        let answer = challenge(&mut d, &h);
        let (_, prove) = end.prove(&answer[14..]).unwrap();
        d.now += Duration::from_millis(VT3_CHALLENGE_TTL_MS + 1);
        assert_eq!(d.deliver(&build_frame(GUEST, GUEST, &prove)), Outcome::Refused(Refusal::Hello));
        assert_eq!(d.sessions(), 0);
        // A new first contact in time works.
        d.end = DriverEnd::new(KEY);
        d.handshake();
        assert_eq!(d.sessions(), 1);
    }

    /// Refusals spend a bucket of VT3_HELLO_BURST, refilled at
    /// VT3_HELLO_RATE a second; past it HELLOs are dropped unchecked.
    #[test]
    fn a_flood_of_hellos_is_limited_and_the_live_session_serves_on() {
        let (mut d, pdn) = live();
        let mut evil = DriverEnd::new([0xdead, 0xbeef]);
        let flood = 1000u64;
        for _ in 0..flood {
            let _ = d.deliver(&hello_of(&mut evil));
        }
        assert_eq!(refused(&d, Refusal::Hello), VT3_HELLO_BURST);
        assert_eq!(refused(&d, Refusal::HelloLimited), flood - VT3_HELLO_BURST);
        // While the bucket is dry even the key holder waits (the residual
        // risk vt3_hw.h names); the live session does not.
        let mut reloaded = DriverEnd::new(KEY);
        assert_eq!(d.deliver(&hello_of(&mut reloaded)), Outcome::Refused(Refusal::HelloLimited));
        assert_undisturbed(&mut d, pdn);
        // One second refills VT3_HELLO_RATE refusals.
        d.now += Duration::from_millis(1000);
        for _ in 0..VT3_HELLO_RATE {
            assert_eq!(d.deliver(&hello_of(&mut evil)), Outcome::Refused(Refusal::Hello));
        }
        assert_eq!(d.deliver(&hello_of(&mut evil)), Outcome::Refused(Refusal::HelloLimited));
        // Once refilled, a real first contact goes through at once.
        d.now += Duration::from_millis(1000 * VT3_HELLO_BURST / VT3_HELLO_RATE);
        let answer = challenge(&mut d, &hello_of(&mut reloaded));
        let (_, prove) = reloaded.prove(&answer[14..]).unwrap();
        assert!(matches!(d.deliver(&build_frame(GUEST, GUEST, &prove)), Outcome::Reply(_)));
        assert_eq!(d.sessions(), 2);
    }

    #[test]
    fn the_driver_end_takes_only_its_own_challenge() {
        let mut d = Driver::without_session(Limits::default());
        let mut end = DriverEnd::new(KEY);
        let answer = challenge(&mut d, &hello_of(&mut end));
        let mut other = DriverEnd::new(KEY);
        let _ = other.hello();
        assert_eq!(other.prove(&answer[14..]).unwrap_err(), Refusal::Hello, "another nonce");
        assert_eq!(DriverEnd::new([9, 9]).prove(&answer[14..]).unwrap_err(), Refusal::Hello, "no HELLO pending");
        let mut forged = answer.clone();
        let last = forged.len() - 1;
        forged[last] ^= 1;
        assert_eq!(end.prove(&forged[14..]).unwrap_err(), Refusal::Hello, "MAC");
        assert!(end.prove(&answer[14..]).is_ok());
    }
}
