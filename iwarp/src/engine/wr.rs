//! Work requests in, completions out. The device parses the guest's SQ/RQ
//! WQEs (`vt3_sq_wqe`, `vt3_rq_wqe`) into these and writes each
//! [`Completion`] it drains as a `vt3_cqe`. Fixed-size values: posting
//! and completing allocate nothing.

use core::fmt;

use super::window::MwBind;

/// `VT3_MAX_SGE`.
pub const MAX_SGE: usize = 4;
/// `VT3_MAX_INLINE`.
pub const MAX_INLINE: usize = 64;
/// Largest message (the DDP message offset is 32 bits).
pub const MAX_MESSAGE: u64 = u32::MAX as u64;

/// One scatter/gather element: `length` octets at `addr` of region `lkey`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// Up to [`MAX_SGE`] elements, inline.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub struct SgeList {
    sges: [Sge; MAX_SGE],
    len: u8,
}

impl SgeList {
    pub const EMPTY: SgeList = SgeList { sges: [Sge { addr: 0, length: 0, lkey: 0 }; MAX_SGE], len: 0 };

    /// `None` if there are more than [`MAX_SGE`] elements.
    pub fn new(sges: &[Sge]) -> Option<SgeList> {
        let mut list = SgeList::EMPTY;
        list.sges.get_mut(..sges.len())?.copy_from_slice(sges);
        list.len = u8::try_from(sges.len()).ok()?;
        Some(list)
    }

    pub fn single(sge: Sge) -> SgeList {
        SgeList::new(&[sge]).unwrap_or(SgeList::EMPTY)
    }

    pub fn as_slice(&self) -> &[Sge] {
        self.sges.get(..usize::from(self.len)).unwrap_or(&[])
    }

    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sum of the lengths (up to 4 × 2³² − 1, so a u64).
    pub fn total_len(&self) -> u64 {
        self.as_slice().iter().map(|sge| u64::from(sge.length)).sum()
    }
}

impl fmt::Debug for SgeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// Inline data of a SEND or WRITE (`VT3_WQE_INLINE`), at most [`MAX_INLINE`] octets.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct InlineData {
    bytes: [u8; MAX_INLINE],
    len: u8,
}

impl InlineData {
    pub fn new(data: &[u8]) -> Option<InlineData> {
        let mut inline = InlineData { bytes: [0; MAX_INLINE], len: u8::try_from(data.len()).ok()? };
        inline.bytes.get_mut(..data.len())?.copy_from_slice(data);
        Some(inline)
    }

    pub fn as_slice(&self) -> &[u8] {
        self.bytes.get(..usize::from(self.len)).unwrap_or(&[])
    }
}

impl fmt::Debug for InlineData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "InlineData({} octets)", self.len)
    }
}

/// Send-queue operations, with the values of `enum vt3_wr_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendOpcode {
    Send = 0,
    SendInvalidate = 1,
    SendSolicited = 2,
    SendSolicitedInvalidate = 3,
    Write = 4,
    Read = 5,
    /// Fast registration of a fast-reg MR ([`SendWr::fast_reg`]): local,
    /// nothing goes on the wire.
    RegMr = 6,
    /// Local invalidation of [`SendWr::invalidate_stag`]: local too.
    LocalInv = 7,
    /// RDMA READ that invalidates [`SendWr::invalidate_stag`] (a fast-reg
    /// MR of ours, normally the sink's) once its last response was placed
    /// (IB_WR_RDMA_READ_WITH_INV, what rdma_rw posts on iWARP).
    ReadInvalidate = 8,
    /// Bind of a memory window ([`SendWr::bind`]): local, like RegMr.
    BindMw = 9,
}

impl SendOpcode {
    pub const ALL: [SendOpcode; 10] = [
        SendOpcode::Send,
        SendOpcode::SendInvalidate,
        SendOpcode::SendSolicited,
        SendOpcode::SendSolicitedInvalidate,
        SendOpcode::Write,
        SendOpcode::Read,
        SendOpcode::RegMr,
        SendOpcode::LocalInv,
        SendOpcode::ReadInvalidate,
        SendOpcode::BindMw,
    ];

    pub fn from_wire(value: u8) -> Option<SendOpcode> {
        SendOpcode::ALL.into_iter().find(|&op| op as u8 == value)
    }

    /// The completion opcode.
    pub const fn wc_opcode(self) -> WcOpcode {
        match self {
            SendOpcode::Write => WcOpcode::Write,
            SendOpcode::Read | SendOpcode::ReadInvalidate => WcOpcode::Read,
            SendOpcode::RegMr => WcOpcode::RegMr,
            SendOpcode::LocalInv => WcOpcode::LocalInv,
            SendOpcode::BindMw => WcOpcode::BindMw,
            _ => WcOpcode::Send,
        }
    }

    /// An RDMA READ (with or without the local invalidation).
    pub const fn is_read(self) -> bool {
        matches!(self, SendOpcode::Read | SendOpcode::ReadInvalidate)
    }

    /// Executed by the RNIC itself, against its TPT, in SQ order.
    pub const fn is_local(self) -> bool {
        matches!(self, SendOpcode::RegMr | SendOpcode::LocalInv | SendOpcode::BindMw)
    }

    pub const fn is_send(self) -> bool {
        matches!(
            self,
            SendOpcode::Send
                | SendOpcode::SendInvalidate
                | SendOpcode::SendSolicited
                | SendOpcode::SendSolicitedInvalidate
        )
    }
}

/// What a REG_MR registers (`struct vt3_reg_mr_wqe`): the fast-reg MR
/// named by `stag`'s index gets `stag`'s key, the `npages` 4 KiB pages
/// listed at guest-physical `pbl_addr`, and bytes `[iova, iova + length)`
/// starting `iova % 4096` into the first page, with rights `access`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FastReg {
    pub stag: u32,
    pub iova: u64,
    pub length: u64,
    pub pbl_addr: u64,
    pub npages: u32,
    pub access: super::memory::Access,
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr {
    pub wr_id: u64,
    pub opcode: SendOpcode,
    /// Write a completion for it (the QP's SigAll already folded in).
    pub signaled: bool,
    /// Wait until every earlier RDMA READ completed.
    pub fence: bool,
    /// Local data: the source of SEND/WRITE, the sink of READ (one element).
    pub sges: SgeList,
    /// SEND/WRITE data carried in the WQE instead of `sges`.
    pub inline: Option<InlineData>,
    /// WRITE: the sink; READ: the source (peer's STag and tagged offset).
    pub remote_addr: u64,
    pub remote_stag: u32,
    /// SEND_INV, SEND_SE_INV: the peer's STag to invalidate; LOCAL_INV,
    /// READ_INV: ours.
    pub invalidate_stag: u32,
    /// REG_MR: the registration.
    pub fast_reg: FastReg,
    /// BIND_MW: the bind.
    pub bind: MwBind,
}

impl SendWr {
    /// A signaled request with no data.
    pub fn new(wr_id: u64, opcode: SendOpcode) -> SendWr {
        SendWr {
            wr_id,
            opcode,
            signaled: true,
            fence: false,
            sges: SgeList::EMPTY,
            inline: None,
            remote_addr: 0,
            remote_stag: 0,
            invalidate_stag: 0,
            fast_reg: FastReg { stag: 0, iova: 0, length: 0, pbl_addr: 0, npages: 0, access: 0 },
            bind: MwBind::default(),
        }
    }

    /// Message length: inline data or the SGE total.
    pub fn length(&self) -> u64 {
        match &self.inline {
            Some(inline) => inline.as_slice().len() as u64,
            None => self.sges.total_len(),
        }
    }
}

/// A receive-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    pub wr_id: u64,
    pub sges: SgeList,
}

/// Completion opcodes, the values of `enum vt3_wc_opcode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    Send = 0,
    Write = 1,
    Read = 2,
    Recv = 3,
    RegMr = 4,
    LocalInv = 5,
    BindMw = 6,
}

/// Completion statuses, the values of `enum vt3_wc_status`. The engine
/// never produces `WrFlushErr` (the provider or driver flushes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocProtErr = 3,
    WrFlushErr = 4,
    RemAccessErr = 5,
    RemOpErr = 6,
    GeneralErr = 7,
    BadRespErr = 8,
    RemInvReqErr = 9,
    /// A BIND_MW refused (IBV_WC_MW_BIND_ERR).
    MwBindErr = 10,
}

impl WcStatus {
    pub const fn name(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "flushed",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::GeneralErr => "general error",
            WcStatus::BadRespErr => "bad response",
            WcStatus::RemInvReqErr => "remote invalid request",
            WcStatus::MwBindErr => "memory window bind error",
        }
    }
}

/// Which queue a completion retires a WQE from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkQueue {
    Send,
    Recv,
}

/// One retired work request. Every posted WR is retired at most once, in
/// posting order per queue, until the QP reaches ERROR (then the provider
/// or driver flushes the rest). Unsignaled send WRs are retired too
/// (`signaled: false`): the device advances the SQ consumer index for them
/// but writes no CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub qpn: u32,
    pub queue: WorkQueue,
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub status: WcStatus,
    pub byte_len: u32,
    /// Receive of a Send with Invalidate: the STag it invalidated.
    pub invalidated_stag: Option<u32>,
    /// Receive of a solicited Send (`VT3_CQE_SOLICITED`).
    pub solicited: bool,
    pub signaled: bool,
    /// A receive into a WR of the QP's SRQ: its SRQ index.
    pub srq_idx: Option<u32>,
}
