//! The driver's commands, decoded: an opcode and its payload (vt3_hw.h)
//! become one typed [`Request`] before the RNIC sees them, so the
//! resources never parse bytes. A payload shorter than its structure is
//! `VT3_STATUS_INVALID`; longer payloads are read up to the structure
//! (the ABI only ever appends fields).

use crate::abi::{
    self, Cmd, CmdAccept, CmdAllocMr, CmdAllocMw, CmdArmCq, CmdConnect, CmdCreateCq, CmdCreateQp, CmdCreateSrq,
    CmdDisconnect, CmdDoorbell, CmdHandle, CmdListen, CmdModifyQp, CmdModifySrq, CmdPairQp, CmdRegMr, CmdReject,
    CmdReregMr, CmdResizeSrq, CmdSetAddr, Status,
};
use vm_memory::ByteValued;

/// One command of a driver session. Commands that name one object carry
/// its handle (a PD, CQ, QP or SRQ number, or an STag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    QueryDevice,
    QueryPort,
    SetAddr(CmdSetAddr),
    AllocPd,
    DeallocPd { pdn: u32 },
    RegMr(CmdRegMr),
    AllocMr(CmdAllocMr),
    ReregMr(CmdReregMr),
    DeregMr { stag: u32 },
    AllocMw(CmdAllocMw),
    DeallocMw { stag: u32 },
    CreateCq(CmdCreateCq),
    DestroyCq { cqn: u32 },
    ArmCq(CmdArmCq),
    CreateQp(CmdCreateQp),
    ModifyQp(CmdModifyQp),
    QueryQp { qpn: u32 },
    DestroyQp { qpn: u32 },
    Doorbell(CmdDoorbell),
    Reset,
    Listen(CmdListen),
    Unlisten(CmdListen),
    Connect(CmdConnect),
    Accept(CmdAccept),
    Reject(CmdReject),
    Disconnect(CmdDisconnect),
    CreateSrq(CmdCreateSrq),
    ModifySrq(CmdModifySrq),
    QuerySrq { srqn: u32 },
    DestroySrq { srqn: u32 },
    ResizeSrq(CmdResizeSrq),
    PairQp(CmdPairQp),
}

fn args<T: ByteValued + Default>(payload: &[u8]) -> Result<T, Status> {
    abi::read_struct(payload).ok_or(Status::Invalid)
}

fn handle(payload: &[u8]) -> Result<u32, Status> {
    Ok(args::<CmdHandle>(payload)?.handle.to_native())
}

impl Request {
    /// Decodes command `cmd` with `payload`. HELLO and PROVE are the first
    /// contact's, never a command of a session: `Invalid`.
    pub fn decode(cmd: Cmd, payload: &[u8]) -> Result<Self, Status> {
        Ok(match cmd {
            Cmd::QueryDevice => Self::QueryDevice,
            Cmd::QueryPort => Self::QueryPort,
            Cmd::SetAddr => Self::SetAddr(args(payload)?),
            Cmd::AllocPd => Self::AllocPd,
            Cmd::DeallocPd => Self::DeallocPd { pdn: handle(payload)? },
            Cmd::RegMr => Self::RegMr(args(payload)?),
            Cmd::AllocMr => Self::AllocMr(args(payload)?),
            Cmd::ReregMr => Self::ReregMr(args(payload)?),
            Cmd::DeregMr => Self::DeregMr { stag: handle(payload)? },
            Cmd::AllocMw => Self::AllocMw(args(payload)?),
            Cmd::DeallocMw => Self::DeallocMw { stag: handle(payload)? },
            Cmd::CreateCq => Self::CreateCq(args(payload)?),
            Cmd::DestroyCq => Self::DestroyCq { cqn: handle(payload)? },
            Cmd::ArmCq => Self::ArmCq(args(payload)?),
            Cmd::CreateQp => Self::CreateQp(args(payload)?),
            Cmd::ModifyQp => Self::ModifyQp(args(payload)?),
            Cmd::QueryQp => Self::QueryQp { qpn: handle(payload)? },
            Cmd::DestroyQp => Self::DestroyQp { qpn: handle(payload)? },
            Cmd::Doorbell => Self::Doorbell(args(payload)?),
            Cmd::Reset => Self::Reset,
            Cmd::Listen => Self::Listen(args(payload)?),
            Cmd::Unlisten => Self::Unlisten(args(payload)?),
            Cmd::Connect => Self::Connect(args(payload)?),
            Cmd::Accept => Self::Accept(args(payload)?),
            Cmd::Reject => Self::Reject(args(payload)?),
            Cmd::Disconnect => Self::Disconnect(args(payload)?),
            Cmd::CreateSrq => Self::CreateSrq(args(payload)?),
            Cmd::ModifySrq => Self::ModifySrq(args(payload)?),
            Cmd::QuerySrq => Self::QuerySrq { srqn: handle(payload)? },
            Cmd::DestroySrq => Self::DestroySrq { srqn: handle(payload)? },
            Cmd::ResizeSrq => Self::ResizeSrq(args(payload)?),
            Cmd::PairQp => Self::PairQp(args(payload)?),
            Cmd::Hello | Cmd::Prove => return Err(Status::Invalid),
        })
    }
}

#[cfg(test)]
#[allow(clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_shorter_than_its_structure_is_invalid() {
        let full = CmdCreateQp::default();
        let bytes = full.as_slice();
        assert_eq!(Request::decode(Cmd::CreateQp, bytes), Ok(Request::CreateQp(full)));
        assert_eq!(Request::decode(Cmd::CreateQp, &bytes[..bytes.len() - 1]), Err(Status::Invalid));
        assert_eq!(Request::decode(Cmd::DestroyQp, &[1, 0, 0]), Err(Status::Invalid));
    }

    #[test]
    fn handles_are_little_endian_and_longer_payloads_are_read_up_to_the_structure() {
        assert_eq!(
            Request::decode(Cmd::DestroyCq, &[7, 1, 0, 0, 0, 0, 0, 0, 0xff, 0xff]),
            Ok(Request::DestroyCq { cqn: 0x107 })
        );
        assert_eq!(Request::decode(Cmd::AllocPd, &[]), Ok(Request::AllocPd), "no arguments");
    }

    #[test]
    fn the_first_contact_is_no_command_of_a_session() {
        assert_eq!(Request::decode(Cmd::Hello, &[0; 64]), Err(Status::Invalid));
        assert_eq!(Request::decode(Cmd::Prove, &[0; 64]), Err(Status::Invalid));
    }
}
