//! Mirror of `guest-driver/include/vt3_hw.h`, the device interface shared
//! with vt3.ko and libvt3. The header is the source of truth:
//! `tests/abi_header.rs` compiles it and compares every struct's size and
//! field offsets, and every enum value, with [`struct_layouts`] and
//! [`enum_values`].

use vm_memory::{ByteValued, Le16, Le32, Le64};

pub const VT3_ETHERTYPE: u16 = 0x88b5;
pub const VT3_CTRL_VERSION: u8 = 5;
pub const VT3_CTRL_REPLAY_WINDOW: u64 = 64;
pub const VT3_CTRL_MAC_LEN: usize = 8;
pub const VT3_KEY_LEN: usize = 16;
pub const VT3_NONCE_LEN: usize = 16;
pub const VT3_FW_CFG_KEY: &str = "opt/vt3/key";
pub const VT3_CHALLENGE_TTL_MS: u64 = 10_000;
pub const VT3_HELLO_BURST: u64 = 64;
pub const VT3_HELLO_RATE: u64 = 16;
pub const VT3_KDF_LABEL_K0: &str = "vt3 session k0";
pub const VT3_KDF_LABEL_K1: &str = "vt3 session k1";
pub const VT3_PAGE_SHIFT: u32 = 12;
pub const VT3_PAGE_SIZE: u64 = 1 << VT3_PAGE_SHIFT;
pub const VT3_VENDOR_ID: u32 = 0x1425;
pub const VT3_VENDOR_PART_ID: u32 = 0x0031;
pub const VT3_MAX_SGE: usize = 4;
pub const VT3_MAX_INLINE: usize = 64;
pub const VT3_WQE_SIZE: usize = 128;
pub const VT3_MAX_PRIVATE_DATA: usize = 512;

/// Defines `#[repr(C)]` structs that can be read from and written to guest
/// memory, and their layout table for the header test.
macro_rules! abi_structs {
    ($( $(#[$meta:meta])* pub struct $name:ident = $cname:literal {
        $( pub $field:ident : $ty:ty ),* $(,)?
    } )*) => {
        $(
            $(#[$meta])*
            #[repr(C)]
            #[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
            pub struct $name { $( pub $field: $ty ),* }

            // SAFETY: a repr(C) struct of little-endian integers and arrays
            // of them; every bit pattern is a valid value.
            unsafe impl ByteValued for $name {}
        )*

        /// `(C struct name, size, [(field, offset)])` of every struct.
        pub fn struct_layouts() -> Vec<(&'static str, usize, Vec<(&'static str, usize)>)> {
            vec![$(
                ($cname, std::mem::size_of::<$name>(),
                 vec![$( (stringify!($field), std::mem::offset_of!($name, $field)) ),*]),
            )*]
        }
    };
}

/// Defines a C enum as a Rust enum with checked conversion, names, and its
/// values for the header test.
macro_rules! abi_enums {
    ($( $(#[$meta:meta])* pub enum $name:ident : $repr:ty {
        $( $variant:ident = $cname:literal = $value:literal ),* $(,)?
    } )*) => {
        $(
            $(#[$meta])*
            #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
            #[repr($repr)]
            pub enum $name { $( $variant = $value ),* }

            impl $name {
                pub const ALL: &'static [$name] = &[$( $name::$variant ),*];

                /// The C name, for logs and tables.
                pub fn name(self) -> &'static str {
                    match self { $( $name::$variant => $cname ),* }
                }
            }

            impl TryFrom<$repr> for $name {
                type Error = $repr;
                fn try_from(v: $repr) -> Result<Self, $repr> {
                    match v { $( $value => Ok($name::$variant), )* other => Err(other) }
                }
            }
        )*

        /// `(C name, value)` of every enum constant.
        pub fn enum_values() -> Vec<(&'static str, u64)> {
            vec![$( $( ($cname, $value as u64), )* )*]
        }
    };
}

// Two of these have a twin in vt3-iwarp's engine (`QpState`, `MwType`):
// these are the wire's, their values checked against vt3_hw.h and written
// into guest memory; the engine's are its own state (the crate knows
// nothing of vt3_hw.h). rnic converts at the boundary: QP states by a
// match (`rnic::offload`), window types from the wire (`MwType::from_wire`).
abi_enums! {
    pub enum MsgType: u8 {
        Cmd = "VT3_MSG_CMD" = 1,
        Resp = "VT3_MSG_RESP" = 2,
        Event = "VT3_MSG_EVENT" = 3,
    }

    pub enum Cmd: u16 {
        QueryDevice = "VT3_CMD_QUERY_DEVICE" = 1,
        QueryPort = "VT3_CMD_QUERY_PORT" = 2,
        SetAddr = "VT3_CMD_SET_ADDR" = 3,
        AllocPd = "VT3_CMD_ALLOC_PD" = 4,
        DeallocPd = "VT3_CMD_DEALLOC_PD" = 5,
        RegMr = "VT3_CMD_REG_MR" = 6,
        DeregMr = "VT3_CMD_DEREG_MR" = 7,
        CreateCq = "VT3_CMD_CREATE_CQ" = 8,
        DestroyCq = "VT3_CMD_DESTROY_CQ" = 9,
        ArmCq = "VT3_CMD_ARM_CQ" = 10,
        CreateQp = "VT3_CMD_CREATE_QP" = 11,
        ModifyQp = "VT3_CMD_MODIFY_QP" = 12,
        QueryQp = "VT3_CMD_QUERY_QP" = 13,
        DestroyQp = "VT3_CMD_DESTROY_QP" = 14,
        Doorbell = "VT3_CMD_DOORBELL" = 15,
        Reset = "VT3_CMD_RESET" = 16,
        Listen = "VT3_CMD_LISTEN" = 17,
        Unlisten = "VT3_CMD_UNLISTEN" = 18,
        Connect = "VT3_CMD_CONNECT" = 19,
        Accept = "VT3_CMD_ACCEPT" = 20,
        Reject = "VT3_CMD_REJECT" = 21,
        Disconnect = "VT3_CMD_DISCONNECT" = 22,
        Hello = "VT3_CMD_HELLO" = 23,
        AllocMr = "VT3_CMD_ALLOC_MR" = 24,
        CreateSrq = "VT3_CMD_CREATE_SRQ" = 25,
        ModifySrq = "VT3_CMD_MODIFY_SRQ" = 26,
        QuerySrq = "VT3_CMD_QUERY_SRQ" = 27,
        DestroySrq = "VT3_CMD_DESTROY_SRQ" = 28,
        PairQp = "VT3_CMD_PAIR_QP" = 29,
        AllocMw = "VT3_CMD_ALLOC_MW" = 30,
        DeallocMw = "VT3_CMD_DEALLOC_MW" = 31,
        ReregMr = "VT3_CMD_REREG_MR" = 32,
        ResizeSrq = "VT3_CMD_RESIZE_SRQ" = 33,
        Prove = "VT3_CMD_PROVE" = 34,
    }

    pub enum Status: u16 {
        Ok = "VT3_OK" = 0,
        Invalid = "VT3_ERR_INVALID" = 1,
        NoResource = "VT3_ERR_NO_RESOURCE" = 2,
        NotFound = "VT3_ERR_NOT_FOUND" = 3,
        Busy = "VT3_ERR_BUSY" = 4,
        BadAddress = "VT3_ERR_BAD_ADDRESS" = 5,
        Unsupported = "VT3_ERR_UNSUPPORTED" = 6,
        State = "VT3_ERR_STATE" = 7,
    }

    pub enum Access: u32 {
        LocalWrite = "VT3_ACCESS_LOCAL_WRITE" = 1,
        RemoteWrite = "VT3_ACCESS_REMOTE_WRITE" = 2,
        RemoteRead = "VT3_ACCESS_REMOTE_READ" = 4,
        MwBind = "VT3_ACCESS_MW_BIND" = 8,
    }

    pub enum MrFlag: u32 {
        Dma = "VT3_MR_DMA" = 1,
        UnsafeGlobalRkey = "VT3_MR_UNSAFE_GLOBAL_RKEY" = 2,
    }

    pub enum ReregChange: u32 {
        Translation = "VT3_REREG_TRANSLATION" = 1,
        Pd = "VT3_REREG_PD" = 2,
        Access = "VT3_REREG_ACCESS" = 4,
    }

    pub enum ArmFlag: u32 {
        Next = "VT3_ARM_NEXT" = 1,
        Solicited = "VT3_ARM_SOLICITED" = 2,
    }

    pub enum QpFlag: u32 {
        Kernel = "VT3_QP_KERNEL" = 1,
        SigAll = "VT3_QP_SIG_ALL" = 2,
    }

    pub enum QpState: u32 {
        Idle = "VT3_QPS_IDLE" = 0,
        Rts = "VT3_QPS_RTS" = 1,
        Closing = "VT3_QPS_CLOSING" = 2,
        Terminate = "VT3_QPS_TERMINATE" = 3,
        Error = "VT3_QPS_ERROR" = 4,
    }

    pub enum ModifyMask: u32 {
        State = "VT3_MODIFY_STATE" = 1,
        Ird = "VT3_MODIFY_IRD" = 2,
        Ord = "VT3_MODIFY_ORD" = 4,
    }

    pub enum DoorbellQueue: u32 {
        Sq = "VT3_DB_SQ" = 1,
        Rq = "VT3_DB_RQ" = 2,
        Srq = "VT3_DB_SRQ" = 4,
    }

    pub enum SrqModifyMask: u32 {
        Limit = "VT3_SRQ_MODIFY_LIMIT" = 1,
        Arm = "VT3_SRQ_MODIFY_ARM" = 2,
    }

    pub enum SrqStatusFlag: u32 {
        Idle = "VT3_SRQ_F_IDLE" = 1,
        Error = "VT3_SRQ_F_ERROR" = 2,
    }

    pub enum EventType: u16 {
        CqCompletion = "VT3_EV_CQ_COMPLETION" = 1,
        CqError = "VT3_EV_CQ_ERROR" = 2,
        Qp = "VT3_EV_QP" = 3,
        DeviceFatal = "VT3_EV_DEVICE_FATAL" = 4,
        ConnectRequest = "VT3_EV_CONNECT_REQUEST" = 5,
        ConnectReply = "VT3_EV_CONNECT_REPLY" = 6,
        Established = "VT3_EV_ESTABLISHED" = 7,
        SrqLimit = "VT3_EV_SRQ_LIMIT" = 8,
        SrqError = "VT3_EV_SRQ_ERROR" = 9,
    }

    pub enum QpEvent: u32 {
        CloseComplete = "VT3_QPE_CLOSE_COMPLETE" = 1,
        PeerClose = "VT3_QPE_PEER_CLOSE" = 2,
        Reset = "VT3_QPE_RESET" = 3,
        Timeout = "VT3_QPE_TIMEOUT" = 4,
        TerminateReceived = "VT3_QPE_TERMINATE_RECEIVED" = 5,
        TerminateSent = "VT3_QPE_TERMINATE_SENT" = 6,
        BadWqe = "VT3_QPE_BAD_WQE" = 7,
        LastWqeReached = "VT3_QPE_LAST_WQE_REACHED" = 8,
    }

    pub enum WrOpcode: u8 {
        Send = "VT3_WR_SEND" = 0,
        SendInv = "VT3_WR_SEND_INV" = 1,
        SendSe = "VT3_WR_SEND_SE" = 2,
        SendSeInv = "VT3_WR_SEND_SE_INV" = 3,
        Write = "VT3_WR_WRITE" = 4,
        Read = "VT3_WR_READ" = 5,
        RegMr = "VT3_WR_REG_MR" = 6,
        LocalInv = "VT3_WR_LOCAL_INV" = 7,
        ReadInv = "VT3_WR_READ_INV" = 8,
        BindMw = "VT3_WR_BIND_MW" = 9,
    }

    pub enum MwType: u32 {
        One = "VT3_MW_TYPE_1" = 1,
        Two = "VT3_MW_TYPE_2" = 2,
    }

    pub enum WqeFlag: u8 {
        Signaled = "VT3_WQE_SIGNALED" = 1,
        Inline = "VT3_WQE_INLINE" = 2,
        Fence = "VT3_WQE_FENCE" = 4,
    }

    pub enum WcOpcode: u8 {
        Send = "VT3_WC_SEND" = 0,
        Write = "VT3_WC_WRITE" = 1,
        Read = "VT3_WC_READ" = 2,
        Recv = "VT3_WC_RECV" = 3,
        RegMr = "VT3_WC_REG_MR" = 4,
        LocalInv = "VT3_WC_LOCAL_INV" = 5,
        BindMw = "VT3_WC_BIND_MW" = 6,
    }

    pub enum WcStatus: u8 {
        Success = "VT3_WC_SUCCESS" = 0,
        LocLenErr = "VT3_WC_LOC_LEN_ERR" = 1,
        LocQpOpErr = "VT3_WC_LOC_QP_OP_ERR" = 2,
        LocProtErr = "VT3_WC_LOC_PROT_ERR" = 3,
        WrFlushErr = "VT3_WC_WR_FLUSH_ERR" = 4,
        RemAccessErr = "VT3_WC_REM_ACCESS_ERR" = 5,
        RemOpErr = "VT3_WC_REM_OP_ERR" = 6,
        GeneralErr = "VT3_WC_GENERAL_ERR" = 7,
        BadRespErr = "VT3_WC_BAD_RESP_ERR" = 8,
        RemInvReqErr = "VT3_WC_REM_INV_REQ_ERR" = 9,
        MwBindErr = "VT3_WC_MW_BIND_ERR" = 10,
    }

    pub enum CqeFlag: u8 {
        Invalidated = "VT3_CQE_INVALIDATED" = 1,
        Solicited = "VT3_CQE_SOLICITED" = 2,
        Srq = "VT3_CQE_SRQ" = 4,
    }

    pub enum QpStatusFlag: u32 {
        Error = "VT3_QP_F_ERROR" = 1,
        SqIdle = "VT3_QP_F_SQ_IDLE" = 2,
        RqIdle = "VT3_QP_F_RQ_IDLE" = 4,
    }

    pub enum CqStatusFlag: u32 {
        Error = "VT3_CQ_F_ERROR" = 1,
        Overflow = "VT3_CQ_F_OVERFLOW" = 2,
        Frozen = "VT3_CQ_F_FROZEN" = 4,
    }
}

abi_structs! {
    pub struct CtrlHdr = "vt3_ctrl_hdr" {
        pub version: u8,
        pub r#type: u8,
        pub opcode: Le16,
        pub seq: Le32,
        pub status: Le16,
        pub len: Le16,
        pub reserved: Le32,
        pub counter: Le64,
    }

    pub struct CmdHello = "vt3_cmd_hello" {
        pub driver_nonce: [u8; VT3_NONCE_LEN],
    }

    pub struct RespHello = "vt3_resp_hello" {
        pub driver_nonce: [u8; VT3_NONCE_LEN],
        pub device_nonce: [u8; VT3_NONCE_LEN],
    }

    pub struct CmdProve = "vt3_cmd_prove" {
        pub driver_nonce: [u8; VT3_NONCE_LEN],
        pub device_nonce: [u8; VT3_NONCE_LEN],
    }

    pub struct KdfInput = "vt3_kdf_input" {
        pub label: [u8; 16],
        pub driver_nonce: [u8; VT3_NONCE_LEN],
        pub device_nonce: [u8; VT3_NONCE_LEN],
    }

    pub struct DeviceAttr = "vt3_device_attr" {
        pub fw_ver: Le64,
        pub max_mr_size: Le64,
        pub page_size_cap: Le64,
        pub vendor_id: Le32,
        pub vendor_part_id: Le32,
        pub hw_ver: Le32,
        pub max_qp: Le32,
        pub max_qp_wr: Le32,
        pub max_sge: Le32,
        pub max_sge_rd: Le32,
        pub max_cq: Le32,
        pub max_cqe: Le32,
        pub max_mr: Le32,
        pub max_pd: Le32,
        pub max_qp_rd_atom: Le32,
        pub max_qp_init_rd_atom: Le32,
        pub max_inline: Le32,
        pub max_pbl_pages: Le32,
        pub max_fast_reg_pages: Le32,
        pub max_srq: Le32,
        pub max_srq_wr: Le32,
        pub max_srq_sge: Le32,
        pub max_mw: Le32,
    }

    pub struct PortAttr = "vt3_port_attr" {
        pub max_msg_size: Le32,
        pub mtu: Le32,
        pub link_up: Le32,
        pub reserved: Le32,
    }

    pub struct CmdSetAddr = "vt3_cmd_set_addr" {
        pub mac: [u8; 6],
        pub prefix_len: u8,
        pub reserved: u8,
        pub ipv4: [u8; 4],
    }

    pub struct CmdHandle = "vt3_cmd_handle" {
        pub handle: Le32,
        pub reserved: Le32,
    }

    pub struct RespHandle = "vt3_resp_handle" {
        pub handle: Le32,
        pub reserved: Le32,
    }

    pub struct CmdRegMr = "vt3_cmd_reg_mr" {
        pub iova: Le64,
        pub length: Le64,
        pub pbl_addr: Le64,
        pub npages: Le32,
        pub pdn: Le32,
        pub access: Le32,
        pub flags: Le32,
        pub page_offset: Le32,
        pub reserved: Le32,
    }

    pub struct CmdAllocMr = "vt3_cmd_alloc_mr" {
        pub pdn: Le32,
        pub max_pages: Le32,
    }

    pub struct CmdReregMr = "vt3_cmd_rereg_mr" {
        pub stag: Le32,
        pub change: Le32,
        pub iova: Le64,
        pub length: Le64,
        pub pbl_addr: Le64,
        pub npages: Le32,
        pub pdn: Le32,
        pub access: Le32,
        pub page_offset: Le32,
    }

    pub struct CmdAllocMw = "vt3_cmd_alloc_mw" {
        pub pdn: Le32,
        pub mw_type: Le32,
    }

    pub struct CmdCreateCq = "vt3_cmd_create_cq" {
        pub ring_pbl_addr: Le64,
        pub status_addr: Le64,
        pub ring_npages: Le32,
        pub depth: Le32,
    }

    pub struct CmdArmCq = "vt3_cmd_arm_cq" {
        pub cqn: Le32,
        pub flags: Le32,
    }

    pub struct CmdCreateQp = "vt3_cmd_create_qp" {
        pub sq_pbl_addr: Le64,
        pub rq_pbl_addr: Le64,
        pub status_addr: Le64,
        pub sq_npages: Le32,
        pub rq_npages: Le32,
        pub sq_depth: Le32,
        pub rq_depth: Le32,
        pub pdn: Le32,
        pub send_cqn: Le32,
        pub recv_cqn: Le32,
        pub max_send_sge: Le32,
        pub max_recv_sge: Le32,
        pub max_inline: Le32,
        pub flags: Le32,
        pub srqn: Le32,
    }

    pub struct CmdModifyQp = "vt3_cmd_modify_qp" {
        pub qpn: Le32,
        pub mask: Le32,
        pub state: Le32,
        pub ird: Le32,
        pub ord: Le32,
        pub reserved: Le32,
    }

    pub struct QpAttr = "vt3_qp_attr" {
        pub state: Le32,
        pub ird: Le32,
        pub ord: Le32,
        pub sq_depth: Le32,
        pub rq_depth: Le32,
        pub reserved: Le32,
    }

    pub struct CmdDoorbell = "vt3_cmd_doorbell" {
        pub qpn: Le32,
        pub queues: Le32,
    }

    pub struct CmdCreateSrq = "vt3_cmd_create_srq" {
        pub ring_pbl_addr: Le64,
        pub status_addr: Le64,
        pub ring_npages: Le32,
        pub depth: Le32,
        pub pdn: Le32,
        pub max_sge: Le32,
        pub limit: Le32,
        pub reserved: Le32,
    }

    pub struct CmdModifySrq = "vt3_cmd_modify_srq" {
        pub srqn: Le32,
        pub mask: Le32,
        pub limit: Le32,
        pub reserved: Le32,
    }

    pub struct CmdResizeSrq = "vt3_cmd_resize_srq" {
        pub ring_pbl_addr: Le64,
        pub ring_npages: Le32,
        pub depth: Le32,
        pub srqn: Le32,
        pub reserved: Le32,
    }

    pub struct SrqAttr = "vt3_srq_attr" {
        pub depth: Le32,
        pub max_sge: Le32,
        pub limit: Le32,
        pub armed: Le32,
        pub qps: Le32,
        pub reserved: Le32,
    }

    pub struct SockAddr = "vt3_sockaddr" {
        pub ipv4: [u8; 4],
        pub port: [u8; 2],
        pub reserved: Le16,
    }

    pub struct CmdListen = "vt3_cmd_listen" {
        pub local: SockAddr,
        pub backlog: Le32,
        pub reserved: Le32,
    }

    pub struct CmdConnect = "vt3_cmd_connect" {
        pub local: SockAddr,
        pub remote: SockAddr,
        pub next_hop: [u8; 6],
        pub pd_len: Le16,
        pub qpn: Le32,
        pub ird: Le32,
        pub ord: Le32,
        pub reserved: Le32,
        pub private_data: PrivateData,
    }

    pub struct CmdAccept = "vt3_cmd_accept" {
        pub conn_id: Le32,
        pub qpn: Le32,
        pub ird: Le32,
        pub ord: Le32,
        pub pd_len: Le16,
        pub reserved0: Le16,
        pub reserved1: Le32,
        pub private_data: PrivateData,
    }

    pub struct CmdReject = "vt3_cmd_reject" {
        pub conn_id: Le32,
        pub pd_len: Le16,
        pub reserved: Le16,
        pub private_data: PrivateData,
    }

    pub struct CmdPairQp = "vt3_cmd_pair_qp" {
        pub qpn: Le32,
        pub peer_qpn: Le32,
        pub port: [u8; 2],
        pub reserved: Le16,
    }

    pub struct CmdDisconnect = "vt3_cmd_disconnect" {
        pub qpn: Le32,
        pub abort: Le32,
    }

    pub struct EventCm = "vt3_event_cm" {
        pub conn_id: Le32,
        pub qpn: Le32,
        pub status: Le32,
        pub ird: Le32,
        pub ord: Le32,
        pub pd_len: Le16,
        pub reserved: Le16,
        pub local: SockAddr,
        pub remote: SockAddr,
        pub private_data: PrivateData,
    }

    pub struct Event = "vt3_event" {
        pub handle: Le32,
        pub code: Le32,
        pub detail: Le32,
        pub reserved: Le32,
    }

    pub struct Sge = "vt3_sge" {
        pub addr: Le64,
        pub length: Le32,
        pub lkey: Le32,
    }

    /// `sge[]` and `inline_data[]` share the last 64 bytes (a C union).
    pub struct SqWqe = "vt3_sq_wqe" {
        pub wr_id: Le64,
        pub opcode: u8,
        pub flags: u8,
        pub num_sge: u8,
        pub reserved0: u8,
        pub invalidate_stag: Le32,
        pub remote_addr: Le64,
        pub remote_stag: Le32,
        pub inline_len: Le32,
        pub reserved1: [Le64; 4],
        pub inline_data: [Le64; 8],
    }

    /// The SQ slot of a VT3_WR_REG_MR.
    pub struct RegMrWqe = "vt3_reg_mr_wqe" {
        pub wr_id: Le64,
        pub opcode: u8,
        pub flags: u8,
        pub reserved0: [u8; 2],
        pub stag: Le32,
        pub iova: Le64,
        pub length: Le64,
        pub pbl_addr: Le64,
        pub npages: Le32,
        pub access: Le32,
        pub page_shift: Le32,
        pub reserved1: Le32,
        pub reserved2: [Le64; 9],
    }

    /// The SQ slot of a VT3_WR_BIND_MW.
    pub struct BindMwWqe = "vt3_bind_mw_wqe" {
        pub wr_id: Le64,
        pub opcode: u8,
        pub flags: u8,
        pub mw_type: u8,
        pub reserved0: u8,
        pub mw_stag: Le32,
        pub addr: Le64,
        pub length: Le64,
        pub mr_stag: Le32,
        pub access: Le32,
        pub reserved1: [Le64; 11],
    }

    pub struct RqWqe = "vt3_rq_wqe" {
        pub wr_id: Le64,
        pub num_sge: u8,
        pub reserved0: [u8; 7],
        pub reserved1: [Le64; 6],
        pub sge: [Sge; VT3_MAX_SGE],
    }

    pub struct Cqe = "vt3_cqe" {
        pub wr_id: Le64,
        pub qpn: Le32,
        pub opcode: u8,
        pub status: u8,
        pub flags: u8,
        pub reserved0: u8,
        pub byte_len: Le32,
        pub invalidated_stag: Le32,
        pub vendor_err: Le32,
        pub wqe_idx: Le32,
    }

    pub struct QpStatus = "vt3_qp_status" {
        pub sq_prod: Le32,
        pub rq_prod: Le32,
        pub sq_cons: Le32,
        pub rq_cons: Le32,
        pub flags: Le32,
        pub state: Le32,
        pub reserved: [Le32; 2],
    }

    pub struct CqStatus = "vt3_cq_status" {
        pub prod: Le32,
        pub cons: Le32,
        pub flags: Le32,
        pub frozen_prod: Le32,
    }

    pub struct SrqStatus = "vt3_srq_status" {
        pub prod: Le32,
        pub cons: Le32,
        pub flags: Le32,
        pub reserved: Le32,
    }
}

/// MPA private data carried by connection commands and events; `pd_len`
/// says how much of it is used.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrivateData(pub [u8; VT3_MAX_PRIVATE_DATA]);

impl Default for PrivateData {
    fn default() -> Self {
        Self([0; VT3_MAX_PRIVATE_DATA])
    }
}

// SAFETY: a byte array; every bit pattern is valid.
unsafe impl ByteValued for PrivateData {}

impl PrivateData {
    /// The used part, `len` clamped to the array.
    pub fn get(&self, len: u16) -> &[u8] {
        self.0.get(..usize::from(len)).unwrap_or(&self.0)
    }
}

/// Plain constants of the header, for the header test.
pub fn constant_values() -> Vec<(&'static str, u64)> {
    vec![
        ("VT3_ETHERTYPE", u64::from(VT3_ETHERTYPE)),
        ("VT3_CTRL_VERSION", u64::from(VT3_CTRL_VERSION)),
        ("VT3_CTRL_REPLAY_WINDOW", VT3_CTRL_REPLAY_WINDOW),
        ("VT3_CTRL_MAC_LEN", VT3_CTRL_MAC_LEN as u64),
        ("VT3_KEY_LEN", VT3_KEY_LEN as u64),
        ("VT3_NONCE_LEN", VT3_NONCE_LEN as u64),
        ("VT3_CHALLENGE_TTL_MS", VT3_CHALLENGE_TTL_MS),
        ("VT3_HELLO_BURST", VT3_HELLO_BURST),
        ("VT3_HELLO_RATE", VT3_HELLO_RATE),
        ("VT3_PAGE_SHIFT", u64::from(VT3_PAGE_SHIFT)),
        ("VT3_PAGE_SIZE", VT3_PAGE_SIZE),
        ("VT3_VENDOR_ID", u64::from(VT3_VENDOR_ID)),
        ("VT3_VENDOR_PART_ID", u64::from(VT3_VENDOR_PART_ID)),
        ("VT3_MAX_SGE", VT3_MAX_SGE as u64),
        ("VT3_MAX_INLINE", VT3_MAX_INLINE as u64),
        ("VT3_WQE_SIZE", VT3_WQE_SIZE as u64),
        ("VT3_MAX_PRIVATE_DATA", VT3_MAX_PRIVATE_DATA as u64),
    ]
}

/// String constants of the header, for the header test.
pub fn string_values() -> Vec<(&'static str, &'static str)> {
    vec![
        ("VT3_FW_CFG_KEY", VT3_FW_CFG_KEY),
        ("VT3_KDF_LABEL_K0", VT3_KDF_LABEL_K0),
        ("VT3_KDF_LABEL_K1", VT3_KDF_LABEL_K1),
    ]
}

/// Reads a `T` from the front of `bytes` (unaligned, copied).
pub fn read_struct<T: ByteValued + Default>(bytes: &[u8]) -> Option<T> {
    let mut value = T::default();
    let src = bytes.get(..std::mem::size_of::<T>())?;
    value.as_mut_slice().copy_from_slice(src);
    Some(value)
}
