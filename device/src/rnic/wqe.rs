//! Work queue entries from the guest's rings into the engine's work
//! requests, and the engine's completions into CQEs. WQEs are untrusted:
//! every field is checked against the ABI and the QP's own limits.

use thiserror::Error;
use vm_memory::ByteValued;
use vt3_iwarp::engine::{
    Completion, FastReg, InlineData, MwBind, MwType, RecvWr, SendOpcode, SendWr, Sge, SgeList, WcStatus, WorkQueue,
};

use crate::abi::{self, BindMwWqe, CqeFlag, RegMrWqe, RqWqe, SqWqe, WqeFlag, VT3_MAX_SGE, VT3_PAGE_SHIFT};

/// What a QP allows in its WQEs (from CREATE_QP, which keeps them within
/// VT3_MAX_SGE and VT3_MAX_INLINE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WqeLimits {
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline: u32,
    /// VT3_QP_SIG_ALL: every send WQE is signaled.
    pub sig_all: bool,
}

/// Why a WQE was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum BadWqe {
    #[error("unknown opcode {0}")]
    Opcode(u8),
    #[error("unknown flags {0:#x}")]
    Flags(u8),
    #[error("{0} SGEs is more than the QP allows")]
    NumSge(u8),
    #[error("{0} octets of inline data is more than the QP allows")]
    InlineLen(u32),
    #[error("the WQE could not be read from guest memory")]
    Unreadable,
    #[error("REG_MR page shift {0}: only VT3_PAGE_SHIFT is supported")]
    PageShift(u32),
    #[error("BIND_MW of window type {0}: not a vt3_mw_type")]
    MwType(u8),
}

const KNOWN_FLAGS: u8 = WqeFlag::Signaled as u8 | WqeFlag::Inline as u8 | WqeFlag::Fence as u8;
/// Where `sge[]` / `inline_data[]` start in `vt3_sq_wqe`.
const SQ_PAYLOAD: usize = std::mem::offset_of!(SqWqe, inline_data);
/// Where `sge[]` starts in `vt3_rq_wqe`.
const RQ_SGES: usize = std::mem::offset_of!(RqWqe, sge);

fn sges(bytes: &[u8], count: u8) -> SgeList {
    let mut list = [Sge::default(); VT3_MAX_SGE];
    for (sge, raw) in list.iter_mut().zip(bytes.chunks_exact(std::mem::size_of::<abi::Sge>())) {
        if let Some(s) = abi::read_struct::<abi::Sge>(raw) {
            *sge = Sge { addr: s.addr.to_native(), length: s.length.to_native(), lkey: s.lkey.to_native() };
        }
    }
    SgeList::new(list.get(..usize::from(count)).unwrap_or_default()).unwrap_or(SgeList::EMPTY)
}

/// Parses a send WQE.
pub fn send_wr(wqe: &SqWqe, limits: &WqeLimits) -> Result<SendWr, BadWqe> {
    let opcode = SendOpcode::from_wire(wqe.opcode).ok_or(BadWqe::Opcode(wqe.opcode))?;
    if wqe.flags & !KNOWN_FLAGS != 0 {
        return Err(BadWqe::Flags(wqe.flags));
    }
    if opcode.is_local() {
        return local_wr(wqe, opcode, limits);
    }
    let payload = wqe.as_slice().get(SQ_PAYLOAD..).unwrap_or_default();
    let (sge_list, inline) = if wqe.flags & WqeFlag::Inline as u8 != 0 {
        let len = wqe.inline_len.to_native();
        if len > limits.max_inline {
            return Err(BadWqe::InlineLen(len));
        }
        let data = payload.get(..len as usize).unwrap_or_default();
        (SgeList::EMPTY, Some(InlineData::new(data).ok_or(BadWqe::InlineLen(len))?))
    } else {
        if u32::from(wqe.num_sge) > limits.max_send_sge {
            return Err(BadWqe::NumSge(wqe.num_sge));
        }
        (sges(payload, wqe.num_sge), None)
    };
    Ok(SendWr {
        wr_id: wqe.wr_id.to_native(),
        opcode,
        signaled: limits.sig_all || wqe.flags & WqeFlag::Signaled as u8 != 0,
        fence: wqe.flags & WqeFlag::Fence as u8 != 0,
        sges: sge_list,
        inline,
        remote_addr: wqe.remote_addr.to_native(),
        remote_stag: wqe.remote_stag.to_native(),
        invalidate_stag: wqe.invalidate_stag.to_native(),
        fast_reg: FastReg::default(),
        bind: MwBind::default(),
    })
}

/// REG_MR (a `vt3_reg_mr_wqe` in the slot), BIND_MW (a `vt3_bind_mw_wqe`)
/// and LOCAL_INV: no data, no inline. What the registration or bind may do
/// is the TPT's to check, when the engine reaches the WQE in SQ order.
fn local_wr(wqe: &SqWqe, opcode: SendOpcode, limits: &WqeLimits) -> Result<SendWr, BadWqe> {
    if wqe.flags & WqeFlag::Inline as u8 != 0 {
        return Err(BadWqe::Flags(wqe.flags));
    }
    let mut wr = SendWr::new(wqe.wr_id.to_native(), opcode);
    wr.signaled = limits.sig_all || wqe.flags & WqeFlag::Signaled as u8 != 0;
    wr.fence = wqe.flags & WqeFlag::Fence as u8 != 0;
    if opcode == SendOpcode::LocalInv {
        wr.invalidate_stag = wqe.invalidate_stag.to_native();
        return Ok(wr);
    }
    if opcode == SendOpcode::BindMw {
        let bind = abi::read_struct::<BindMwWqe>(wqe.as_slice()).ok_or(BadWqe::Unreadable)?;
        wr.bind = MwBind {
            mw_stag: bind.mw_stag.to_native(),
            mr_stag: bind.mr_stag.to_native(),
            addr: bind.addr.to_native(),
            length: bind.length.to_native(),
            access: bind.access.to_native(),
            mw_type: MwType::from_wire(bind.mw_type).ok_or(BadWqe::MwType(bind.mw_type))?,
        };
        return Ok(wr);
    }
    let reg = abi::read_struct::<RegMrWqe>(wqe.as_slice()).ok_or(BadWqe::Unreadable)?;
    let page_shift = reg.page_shift.to_native();
    if page_shift != VT3_PAGE_SHIFT {
        return Err(BadWqe::PageShift(page_shift));
    }
    wr.fast_reg = FastReg {
        stag: reg.stag.to_native(),
        iova: reg.iova.to_native(),
        length: reg.length.to_native(),
        pbl_addr: reg.pbl_addr.to_native(),
        npages: reg.npages.to_native(),
        access: reg.access.to_native(),
    };
    Ok(wr)
}

impl BadWqe {
    /// The status the WQE completes with (in posting order, through
    /// [`vt3_iwarp::engine::Engine::post_refused`]; docs/architecture.md §5,
    /// bad local WQE): every malformed field (opcode, flags, SGE count, inline
    /// length) is an operation error, as the verbs name a WR the QP cannot
    /// carry out; an lkey, STag or bounds error is found by the engine
    /// (VT3_WC_LOC_PROT_ERR) when it uses the WR.
    pub fn status(&self) -> WcStatus {
        match self {
            BadWqe::Opcode(_)
            | BadWqe::Flags(_)
            | BadWqe::NumSge(_)
            | BadWqe::InlineLen(_)
            | BadWqe::Unreadable
            | BadWqe::PageShift(_) => WcStatus::LocQpOpErr,
            // A bind the device cannot read is a bind that failed.
            BadWqe::MwType(_) => WcStatus::MwBindErr,
        }
    }
}

/// Parses a receive WQE.
pub fn recv_wr(wqe: &RqWqe, limits: &WqeLimits) -> Result<RecvWr, BadWqe> {
    if u32::from(wqe.num_sge) > limits.max_recv_sge {
        return Err(BadWqe::NumSge(wqe.num_sge));
    }
    let payload = wqe.as_slice().get(RQ_SGES..).unwrap_or_default();
    Ok(RecvWr { wr_id: wqe.wr_id.to_native(), sges: sges(payload, wqe.num_sge) })
}

/// The CQE for a completion of the WQE at index `wqe_idx` of its queue
/// (a WQE of an SRQ names its SRQ index instead).
pub fn cqe(c: &Completion, wqe_idx: u32) -> abi::Cqe {
    let mut flags = 0;
    if c.invalidated_stag.is_some() {
        flags |= CqeFlag::Invalidated as u8;
    }
    if c.solicited {
        flags |= CqeFlag::Solicited as u8;
    }
    if c.srq_idx.is_some() {
        flags |= CqeFlag::Srq as u8;
    }
    abi::Cqe {
        wr_id: c.wr_id.into(),
        qpn: c.qpn.into(),
        opcode: c.opcode as u8,
        status: c.status as u8,
        flags,
        byte_len: c.byte_len.into(),
        invalidated_stag: c.invalidated_stag.unwrap_or(0).into(),
        wqe_idx: c.srq_idx.unwrap_or(wqe_idx).into(),
        ..Default::default()
    }
}

/// Whether a completion needs a CQE: every receive, and signaled sends
/// (errors are always signaled by the engine).
pub fn writes_cqe(c: &Completion) -> bool {
    c.queue == WorkQueue::Recv || c.signaled
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use crate::abi::{Sge as AbiSge, WrOpcode};
    use vt3_iwarp::engine::{WcOpcode, WcStatus};

    const LIMITS: WqeLimits = WqeLimits { max_send_sge: 3, max_recv_sge: 2, max_inline: 32, sig_all: false };

    fn sge(addr: u64, length: u32, lkey: u32) -> AbiSge {
        AbiSge { addr: addr.into(), length: length.into(), lkey: lkey.into() }
    }

    fn sq(opcode: u8, flags: u8, sges: &[AbiSge]) -> SqWqe {
        let mut w = SqWqe {
            wr_id: 0xfeed_0001.into(),
            opcode,
            flags,
            num_sge: sges.len() as u8,
            invalidate_stag: 0x1234.into(),
            remote_addr: 0x7f00_0000_1000u64.into(),
            remote_stag: 0x0305.into(),
            ..Default::default()
        };
        for (i, s) in sges.iter().enumerate() {
            let at = SQ_PAYLOAD + i * 16;
            w.as_mut_slice()[at..at + 16].copy_from_slice(s.as_slice());
        }
        w
    }

    #[test]
    fn send_wqes_become_send_wrs() {
        let w = sq(WrOpcode::Write as u8, WqeFlag::Fence as u8, &[sge(0x1000, 10, 0x101), sge(0x2000, 20, 0x102)]);
        let wr = send_wr(&w, &LIMITS).unwrap();
        assert_eq!((wr.wr_id, wr.opcode, wr.signaled, wr.fence), (0xfeed_0001, SendOpcode::Write, false, true));
        assert_eq!(
            wr.sges.as_slice(),
            &[Sge { addr: 0x1000, length: 10, lkey: 0x101 }, Sge { addr: 0x2000, length: 20, lkey: 0x102 }]
        );
        assert_eq!((wr.remote_addr, wr.remote_stag, wr.invalidate_stag), (0x7f00_0000_1000, 0x0305, 0x1234));
        assert_eq!(wr.inline, None);
        // SIG_ALL folds into every WR.
        let all = WqeLimits { sig_all: true, ..LIMITS };
        assert!(send_wr(&w, &all).unwrap().signaled);
        // (REG_MR and BIND_MW have slot layouts of their own:
        // `reg_mr_and_local_inv_wqes`, `bind_mw_wqes`.)
        for op in WrOpcode::ALL.iter().filter(|op| !matches!(op, WrOpcode::RegMr | WrOpcode::BindMw)) {
            let wr = send_wr(&sq(*op as u8, WqeFlag::Signaled as u8, &[]), &LIMITS).unwrap();
            assert_eq!((wr.opcode as u8, wr.signaled), (*op as u8, true));
        }
    }

    #[test]
    fn inline_data_is_copied_out_of_the_wqe() {
        let mut w = sq(WrOpcode::Send as u8, WqeFlag::Inline as u8, &[]);
        w.inline_len = 5.into();
        w.as_mut_slice()[SQ_PAYLOAD..SQ_PAYLOAD + 8].copy_from_slice(b"hello!!!");
        let wr = send_wr(&w, &LIMITS).unwrap();
        assert_eq!(wr.inline.unwrap().as_slice(), b"hello");
        assert!(wr.sges.is_empty());
        assert_eq!(wr.length(), 5);
        w.inline_len = 32.into();
        assert_eq!(send_wr(&w, &LIMITS).unwrap().length(), 32);
    }

    #[test]
    fn hostile_send_wqes_are_refused() {
        let five: Vec<AbiSge> = (0..4).map(|i| sge(i, 1, 1)).collect();
        let cases = [
            (sq(10, 0, &[]), BadWqe::Opcode(10)),
            (sq(0xff, 0, &[]), BadWqe::Opcode(0xff)),
            (sq(0, 0x08, &[]), BadWqe::Flags(0x08)),
            (sq(0, 0xff, &[]), BadWqe::Flags(0xff)),
            (sq(0, 0, &five), BadWqe::NumSge(4)),
            (SqWqe { num_sge: 0xff, ..sq(0, 0, &[]) }, BadWqe::NumSge(0xff)),
            (SqWqe { inline_len: 33.into(), ..sq(0, WqeFlag::Inline as u8, &[]) }, BadWqe::InlineLen(33)),
            (SqWqe { inline_len: u32::MAX.into(), ..sq(0, WqeFlag::Inline as u8, &[]) }, BadWqe::InlineLen(u32::MAX)),
        ];
        for (w, want) in cases {
            assert_eq!(send_wr(&w, &LIMITS), Err(want), "{w:?}");
        }
        // A QP created with the ABI maxima still refuses more than them.
        let max = WqeLimits { max_send_sge: 4, max_recv_sge: 4, max_inline: 64, sig_all: false };
        let w = SqWqe { inline_len: 65.into(), ..sq(0, WqeFlag::Inline as u8, &[]) };
        assert_eq!(send_wr(&w, &max), Err(BadWqe::InlineLen(65)));
        assert_eq!(send_wr(&SqWqe { num_sge: 5, ..sq(0, 0, &[]) }, &max), Err(BadWqe::NumSge(5)));
        // Random WQEs: parsed or refused, never a panic, never more than allowed.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            let mut w = SqWqe::default();
            for b in w.as_mut_slice() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            w.num_sge &= 7;
            if let Ok(wr) = send_wr(&w, &max) {
                assert!(wr.sges.len() <= 4 && wr.inline.map_or(0, |i| i.as_slice().len()) <= 64);
            }
        }
    }

    #[test]
    fn reg_mr_and_local_inv_wqes() {
        let reg = RegMrWqe {
            wr_id: 0x77.into(),
            opcode: WrOpcode::RegMr as u8,
            flags: WqeFlag::Fence as u8,
            stag: 0x1234_5602.into(),
            iova: 0x7000_0100u64.into(),
            length: 9000u64.into(),
            pbl_addr: 0x4000u64.into(),
            npages: 3.into(),
            access: 6.into(),
            page_shift: VT3_PAGE_SHIFT.into(),
            ..Default::default()
        };
        let slot = abi::read_struct::<SqWqe>(reg.as_slice()).unwrap();
        let wr = send_wr(&slot, &LIMITS).unwrap();
        assert_eq!((wr.wr_id, wr.opcode, wr.signaled, wr.fence), (0x77, SendOpcode::RegMr, false, true));
        assert_eq!(
            wr.fast_reg,
            FastReg { stag: 0x1234_5602, iova: 0x7000_0100, length: 9000, pbl_addr: 0x4000, npages: 3, access: 6 }
        );
        assert!(wr.sges.is_empty() && wr.inline.is_none());
        for shift in [0, 11, 13, 21, u32::MAX] {
            let bad = RegMrWqe { page_shift: shift.into(), ..reg };
            let slot = abi::read_struct::<SqWqe>(bad.as_slice()).unwrap();
            assert_eq!(send_wr(&slot, &LIMITS), Err(BadWqe::PageShift(shift)));
        }
        let inline = RegMrWqe { flags: WqeFlag::Inline as u8, ..reg };
        assert_eq!(send_wr(&abi::read_struct(inline.as_slice()).unwrap(), &LIMITS), Err(BadWqe::Flags(2)));
        // LOCAL_INV names its STag in invalidate_stag; SGEs are ignored.
        let inv = send_wr(&sq(WrOpcode::LocalInv as u8, WqeFlag::Signaled as u8, &[sge(1, 2, 3)]), &LIMITS).unwrap();
        assert_eq!(
            (inv.opcode, inv.invalidate_stag, inv.signaled, inv.sges.len()),
            (SendOpcode::LocalInv, 0x1234, true, 0)
        );
        assert_eq!(inv.opcode.wc_opcode() as u8, abi::WcOpcode::LocalInv as u8);
        assert_eq!(SendOpcode::RegMr.wc_opcode() as u8, abi::WcOpcode::RegMr as u8);
        let sig_all = WqeLimits { sig_all: true, ..LIMITS };
        assert!(send_wr(&slot_of(&reg), &sig_all).unwrap().signaled);
    }

    #[test]
    fn bind_mw_wqes() {
        let bind = BindMwWqe {
            wr_id: 0x99.into(),
            opcode: WrOpcode::BindMw as u8,
            flags: WqeFlag::Signaled as u8,
            mw_type: abi::MwType::One as u8,
            mw_stag: 0x4407.into(),
            addr: 0x7000_0100u64.into(),
            length: 4096u64.into(),
            mr_stag: 0x1203.into(),
            access: 6.into(),
            ..Default::default()
        };
        let wr = send_wr(&abi::read_struct::<SqWqe>(bind.as_slice()).unwrap(), &LIMITS).unwrap();
        assert_eq!((wr.wr_id, wr.opcode, wr.signaled, wr.fence), (0x99, SendOpcode::BindMw, true, false));
        assert_eq!(
            wr.bind,
            MwBind {
                mw_stag: 0x4407,
                mr_stag: 0x1203,
                addr: 0x7000_0100,
                length: 4096,
                access: 6,
                mw_type: MwType::One
            }
        );
        assert_eq!(wr.opcode.wc_opcode() as u8, abi::WcOpcode::BindMw as u8);
        for bad_type in [0u8, 3, 0xff] {
            let bad = BindMwWqe { mw_type: bad_type, ..bind };
            let refused = send_wr(&abi::read_struct::<SqWqe>(bad.as_slice()).unwrap(), &LIMITS);
            assert_eq!(refused, Err(BadWqe::MwType(bad_type)));
            assert_eq!(BadWqe::MwType(bad_type).status() as u8, abi::WcStatus::MwBindErr as u8);
        }
        let inline = BindMwWqe { flags: WqeFlag::Inline as u8, ..bind };
        assert_eq!(send_wr(&abi::read_struct(inline.as_slice()).unwrap(), &LIMITS), Err(BadWqe::Flags(2)));
    }

    fn slot_of(reg: &RegMrWqe) -> SqWqe {
        abi::read_struct::<SqWqe>(reg.as_slice()).unwrap()
    }

    #[test]
    fn receive_wqes() {
        let mut w = RqWqe { wr_id: 9.into(), num_sge: 2, ..Default::default() };
        w.sge[0] = sge(0x3000, 100, 0x201);
        w.sge[1] = sge(0x5000, 50, 0x202);
        let wr = recv_wr(&w, &LIMITS).unwrap();
        assert_eq!((wr.wr_id, wr.sges.total_len()), (9, 150));
        assert_eq!(recv_wr(&RqWqe { num_sge: 0, ..w }, &LIMITS).unwrap().sges.len(), 0);
        for n in [3, 4, 5, 0xff] {
            assert_eq!(recv_wr(&RqWqe { num_sge: n, ..w }, &LIMITS), Err(BadWqe::NumSge(n)));
        }
    }

    #[test]
    fn malformed_fields_are_operation_errors() {
        for bad in
            [BadWqe::Opcode(9), BadWqe::Flags(0x80), BadWqe::NumSge(5), BadWqe::InlineLen(65), BadWqe::Unreadable]
        {
            assert_eq!(bad.status(), WcStatus::LocQpOpErr, "{bad}");
        }
    }

    #[test]
    fn completions_become_cqes() {
        let c = Completion {
            qpn: 3,
            queue: WorkQueue::Recv,
            wr_id: 0xabcd,
            opcode: WcOpcode::Recv,
            status: WcStatus::Success,
            byte_len: 1000,
            invalidated_stag: Some(0x4407),
            solicited: true,
            signaled: true,
            srq_idx: None,
        };
        let e = cqe(&c, 41);
        assert_eq!((e.wr_id.to_native(), e.qpn.to_native(), e.byte_len.to_native()), (0xabcd, 3, 1000));
        assert_eq!(e.wqe_idx.to_native(), 41);
        assert_eq!((e.opcode, e.status), (3, 0));
        assert_eq!(e.flags, CqeFlag::Invalidated as u8 | CqeFlag::Solicited as u8);
        assert_eq!(e.invalidated_stag.to_native(), 0x4407);
        let send = Completion {
            queue: WorkQueue::Send,
            opcode: WcOpcode::Read,
            status: WcStatus::LocProtErr,
            invalidated_stag: None,
            solicited: false,
            signaled: false,
            ..c
        };
        let e = cqe(&send, 7);
        assert_eq!((e.opcode, e.status, e.flags, e.invalidated_stag.to_native()), (2, 3, 0, 0));
        assert!(writes_cqe(&c) && !writes_cqe(&send));
        assert!(writes_cqe(&Completion { signaled: false, ..c }), "receives always complete");
        // A WQE of an SRQ: its SRQ index, flagged.
        let e = cqe(&Completion { srq_idx: Some(9), invalidated_stag: None, ..c }, 41);
        assert_eq!((e.wqe_idx.to_native(), e.flags), (9, CqeFlag::Solicited as u8 | CqeFlag::Srq as u8));
    }
}
