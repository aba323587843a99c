//! Just enough Ethernet/IPv4/TCP header parsing for demux (`wants`) and
//! for observing the TCB state on the frames going through the TOE. Never
//! panics; checksums are smoltcp's business, but for the split fault's
//! frames ([`split_segment`]).

use std::net::{Ipv4Addr, SocketAddrV4};

use super::{FourTuple, MacAddr};

pub const ETHERNET_HEADER_LEN: usize = 14;
pub const ETHERTYPE_IPV4: u16 = 0x0800;
pub const ETHERTYPE_ARP: u16 = 0x0806;
pub const IP_PROTOCOL_TCP: u8 = 6;

/// TCP flags.
pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const ACK: u8 = 0x10;
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at + 2)?;
    Some(u16::from_be_bytes([*b.first()?, *b.get(1)?]))
}

fn be32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at + 4)?;
    <[u8; 4]>::try_from(b).ok().map(u32::from_be_bytes)
}

fn ipv4(bytes: &[u8], at: usize) -> Option<Ipv4Addr> {
    let b = bytes.get(at..at + 4)?;
    <[u8; 4]>::try_from(b).ok().map(Ipv4Addr::from)
}

/// The fields of one TCP segment in an Ethernet frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub dst_mac: MacAddr,
    pub src_mac: MacAddr,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    pub window: u16,
    pub payload_len: usize,
    /// Options of a SYN: MSS and window scale.
    pub mss: Option<u16>,
    pub wscale: Option<u8>,
}

impl Segment {
    pub fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// Sequence space the segment occupies (payload, SYN and FIN).
    pub fn seq_len(&self) -> u32 {
        let len = u32::try_from(self.payload_len).unwrap_or(u32::MAX);
        len.wrapping_add(u32::from(self.has(flags::SYN))).wrapping_add(u32::from(self.has(flags::FIN)))
    }

    /// The tuple as seen by the receiver of this segment.
    pub fn tuple_at_receiver(&self) -> FourTuple {
        FourTuple { local: self.dst, remote: self.src }
    }

    /// The tuple as seen by the sender of this segment.
    pub fn tuple_at_sender(&self) -> FourTuple {
        FourTuple { local: self.src, remote: self.dst }
    }
}

/// A unicast, non-zero MAC address.
pub fn is_unicast(mac: MacAddr) -> bool {
    mac[0] & 1 == 0 && mac != [0; 6]
}

/// The EtherType of a frame.
pub fn ethertype(frame: &[u8]) -> Option<u16> {
    be16(frame, 12)
}

/// Parses an unfragmented IPv4/TCP segment in an Ethernet II frame.
pub fn parse(frame: &[u8]) -> Option<Segment> {
    if ethertype(frame)? != ETHERTYPE_IPV4 {
        return None;
    }
    let dst_mac = <MacAddr>::try_from(frame.get(0..6)?).ok()?;
    let src_mac = <MacAddr>::try_from(frame.get(6..12)?).ok()?;
    let ip = frame.get(ETHERNET_HEADER_LEN..)?;
    let version_ihl = *ip.first()?;
    if version_ihl >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(version_ihl & 0x0f) * 4;
    let total_len = usize::from(be16(ip, 2)?);
    let fragment = be16(ip, 6)?;
    if ihl < 20 || total_len < ihl || total_len > ip.len() || fragment & 0x3fff != 0 {
        return None;
    }
    if *ip.get(9)? != IP_PROTOCOL_TCP {
        return None;
    }
    let src_ip = ipv4(ip, 12)?;
    let dst_ip = ipv4(ip, 16)?;
    let tcp = ip.get(ihl..total_len)?;
    let data_offset = usize::from(*tcp.get(12)? >> 4) * 4;
    if data_offset < 20 || data_offset > tcp.len() {
        return None;
    }
    let flags = *tcp.get(13)?;
    let mut segment = Segment {
        dst_mac,
        src_mac,
        src: SocketAddrV4::new(src_ip, be16(tcp, 0)?),
        dst: SocketAddrV4::new(dst_ip, be16(tcp, 2)?),
        seq: be32(tcp, 4)?,
        ack: be32(tcp, 8)?,
        flags,
        window: be16(tcp, 14)?,
        payload_len: tcp.len() - data_offset,
        mss: None,
        wscale: None,
    };
    if flags & flags::SYN != 0 {
        parse_options(tcp.get(20..data_offset)?, &mut segment);
    }
    Some(segment)
}

fn parse_options(mut options: &[u8], segment: &mut Segment) {
    while let Some((&kind, rest)) = options.split_first() {
        match kind {
            0 => return,
            1 => options = rest,
            _ => {
                let Some(&len) = rest.first() else { return };
                let len = usize::from(len);
                if len < 2 {
                    return;
                }
                let Some(body) = options.get(2..len) else {
                    return;
                };
                match (kind, body) {
                    (2, &[hi, lo]) => segment.mss = Some(u16::from_be_bytes([hi, lo])),
                    (3, &[shift]) => segment.wscale = Some(shift.min(14)),
                    _ => {}
                }
                options = options.get(len..).unwrap_or(&[]);
            }
        }
    }
}

/// (source, destination) of a bare IPv4/TCP packet (no Ethernet header).
pub fn ip_tcp_endpoints(packet: &[u8]) -> Option<(SocketAddrV4, SocketAddrV4)> {
    let version_ihl = *packet.first()?;
    if version_ihl >> 4 != 4 || *packet.get(9)? != IP_PROTOCOL_TCP {
        return None;
    }
    let tcp = packet.get(usize::from(version_ihl & 0x0f) * 4..)?;
    let src = SocketAddrV4::new(ipv4(packet, 12)?, be16(tcp, 0)?);
    let dst = SocketAddrV4::new(ipv4(packet, 16)?, be16(tcp, 2)?);
    Some((src, dst))
}

/// Writes an Ethernet II header for IPv4 into `header` (14 octets).
pub fn write_ethernet_header(header: &mut [u8], dst: MacAddr, src: MacAddr) {
    let mut bytes = [0u8; ETHERNET_HEADER_LEN];
    bytes[..6].copy_from_slice(&dst);
    bytes[6..12].copy_from_slice(&src);
    bytes[12..].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    if let Some(target) = header.get_mut(..ETHERNET_HEADER_LEN) {
        target.copy_from_slice(&bytes);
    }
}

/// An ARP reply `from_ip is-at from_mac` to `to_mac` (tests: a frame the
/// TOE must leave to the guest).
pub fn arp_reply(to_mac: MacAddr, to_ip: Ipv4Addr, from_mac: MacAddr, from_ip: Ipv4Addr) -> [u8; 42] {
    let mut frame = [0u8; 42];
    let mut put = |at: usize, bytes: &[u8]| {
        if let Some(target) = frame.get_mut(at..at + bytes.len()) {
            target.copy_from_slice(bytes);
        }
    };
    put(0, &to_mac);
    put(6, &from_mac);
    put(12, &ETHERTYPE_ARP.to_be_bytes());
    put(14, &[0, 1, 8, 0, 6, 4, 0, 2]); // Ethernet, IPv4, lengths, reply
    put(22, &from_mac);
    put(28, &from_ip.octets());
    put(32, &to_mac);
    put(38, &to_ip.octets());
    frame
}

/// Cuts the TCP segment in `frame` (Ethernet, IPv4, TCP) in two, `tail`
/// octets before the end of its payload, as a sender with another
/// segmentation would have sent it: `head` gets the first part of the
/// payload (no FIN, no PSH), `rest` the last `tail` octets (the sequence
/// number moved on, the original flags). Both with their IP length and
/// identification, and IP and TCP checksums, right. `false` (the buffers
/// untouched) when there is nothing to cut: no IPv4/TCP frame, a SYN, a
/// payload of `tail` octets or fewer, or a `tail` of 0.
pub fn split_segment(frame: &[u8], tail: usize, head: &mut Vec<u8>, rest: &mut Vec<u8>) -> bool {
    use smoltcp::wire::{IpAddress, Ipv4Packet, TcpPacket};

    let Some(ip) = frame.get(ETHERNET_HEADER_LEN..) else { return false };
    let Ok(packet) = Ipv4Packet::new_checked(ip) else { return false };
    let (ip_len, total) = (usize::from(packet.header_len()), usize::from(packet.total_len()));
    if packet.next_header() != smoltcp::wire::IpProtocol::Tcp {
        return false;
    }
    let (src, dst) = (IpAddress::Ipv4(packet.src_addr()), IpAddress::Ipv4(packet.dst_addr()));
    let ident = packet.ident();
    let Some(tcp_bytes) = ip.get(ip_len..total) else { return false };
    let Ok(tcp) = TcpPacket::new_checked(tcp_bytes) else { return false };
    let tcp_len = usize::from(tcp.header_len());
    let payload = tcp.payload().len();
    if tail == 0 || payload <= tail || tcp.syn() {
        return false;
    }
    let cut = payload - tail;
    let headers = ETHERNET_HEADER_LEN + ip_len + tcp_len;
    let seq = tcp.seq_number();
    let Some(header_bytes) = frame.get(..headers) else { return false };
    let Some(body) = frame.get(headers..headers + payload) else { return false };
    let (first, last) = body.split_at(cut);
    let build = |out: &mut Vec<u8>, part: &[u8], first_part: bool| -> Option<()> {
        out.clear();
        out.extend_from_slice(header_bytes);
        out.extend_from_slice(part);
        let ip = out.get_mut(ETHERNET_HEADER_LEN..)?;
        let mut packet = Ipv4Packet::new_unchecked(ip);
        packet.set_total_len(u16::try_from(ip_len + tcp_len + part.len()).ok()?);
        if !first_part {
            packet.set_ident(ident.wrapping_add(1));
        }
        packet.fill_checksum();
        let mut tcp = TcpPacket::new_unchecked(packet.payload_mut());
        if first_part {
            tcp.set_fin(false);
            tcp.set_psh(false);
        } else {
            tcp.set_seq_number(seq + cut);
        }
        tcp.fill_checksum(&src, &dst);
        Some(())
    };
    build(head, first, true).is_some() && build(rest, last, false).is_some()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    /// A data segment smoltcp would send, with PSH and FIN.
    fn data_segment(payload: &[u8]) -> Vec<u8> {
        use smoltcp::wire::{
            IpAddress, IpProtocol, Ipv4Address, Ipv4Packet, Ipv4Repr, TcpControl, TcpPacket, TcpRepr, TcpSeqNumber,
        };
        let (src, dst) = (Ipv4Address::new(10, 0, 0, 1), Ipv4Address::new(10, 0, 0, 2));
        let tcp = TcpRepr {
            src_port: 4791,
            dst_port: 40000,
            control: TcpControl::Fin,
            seq_number: TcpSeqNumber(0x7fff_fff0),
            ack_number: Some(TcpSeqNumber(99)),
            window_len: 1000,
            window_scale: None,
            max_seg_size: None,
            sack_permitted: false,
            sack_ranges: [None; 3],
            timestamp: None,
            payload,
        };
        let ip = Ipv4Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: IpProtocol::Tcp,
            payload_len: tcp.buffer_len(),
            hop_limit: 64,
        };
        let mut frame = vec![0u8; ETHERNET_HEADER_LEN + ip.buffer_len() + tcp.buffer_len()];
        frame[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
        let mut packet = Ipv4Packet::new_unchecked(&mut frame[ETHERNET_HEADER_LEN..]);
        ip.emit(&mut packet, &smoltcp::phy::ChecksumCapabilities::default());
        let mut segment = TcpPacket::new_unchecked(packet.payload_mut());
        tcp.emit(
            &mut segment,
            &IpAddress::Ipv4(src),
            &IpAddress::Ipv4(dst),
            &smoltcp::phy::ChecksumCapabilities::default(),
        );
        segment.set_psh(true);
        segment.fill_checksum(&IpAddress::Ipv4(src), &IpAddress::Ipv4(dst));
        frame
    }

    /// Checksums verified and the TCP fields (seq, flags, payload) of a frame.
    fn checked(frame: &[u8]) -> (u32, bool, bool, u16, Vec<u8>) {
        use smoltcp::wire::{IpAddress, Ipv4Packet, TcpPacket};
        let ip = Ipv4Packet::new_checked(&frame[ETHERNET_HEADER_LEN..]).unwrap();
        assert!(ip.verify_checksum(), "IP checksum");
        assert_eq!(usize::from(ip.total_len()), frame.len() - ETHERNET_HEADER_LEN);
        let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
        assert!(tcp.verify_checksum(&IpAddress::Ipv4(ip.src_addr()), &IpAddress::Ipv4(ip.dst_addr())), "TCP checksum");
        (tcp.seq_number().0 as u32, tcp.psh(), tcp.fin(), ip.ident(), tcp.payload().to_vec())
    }

    #[test]
    fn a_segment_splits_into_two_that_carry_the_same_stream() {
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7).to_le_bytes()[0]).collect();
        let frame = data_segment(&payload);
        let (seq, psh, fin, ident, _) = checked(&frame);
        assert!(psh && fin);
        let (mut head, mut rest) = (Vec::new(), Vec::new());
        assert!(split_segment(&frame, 2, &mut head, &mut rest));
        let (h_seq, h_psh, h_fin, h_ident, h_payload) = checked(&head);
        let (r_seq, r_psh, r_fin, r_ident, r_payload) = checked(&rest);
        assert_eq!((h_seq, h_psh, h_fin, h_ident), (seq, false, false, ident));
        assert_eq!((r_seq, r_psh, r_fin, r_ident), (seq.wrapping_add(998), true, true, ident.wrapping_add(1)));
        assert_eq!((h_payload.as_slice(), r_payload.as_slice()), payload.split_at(998));
        assert_eq!(parse(&rest).unwrap().seq_len(), 3, "two octets and the FIN");
        assert_eq!(head[..14], frame[..14]);
    }

    #[test]
    fn nothing_to_split_leaves_the_buffers_alone() {
        let frame = data_segment(&[1, 2]);
        let (mut head, mut rest) = (vec![9], vec![9]);
        assert!(!split_segment(&frame, 2, &mut head, &mut rest));
        assert!(!split_segment(&data_segment(&[1, 2, 3]), 0, &mut head, &mut rest));
        for len in 0..frame.len() {
            assert!(!split_segment(&frame[..len], 1, &mut head, &mut rest));
        }
        assert_eq!((head, rest), (vec![9], vec![9]));
    }

    #[test]
    fn parses_a_syn_with_options_and_refuses_garbage() {
        let mut frame = vec![0u8; 14 + 20 + 28];
        frame[12] = 0x08;
        frame[14] = 0x45;
        frame[16..18].copy_from_slice(&48u16.to_be_bytes());
        frame[23] = 6;
        frame[26..30].copy_from_slice(&[10, 0, 0, 1]);
        frame[30..34].copy_from_slice(&[10, 0, 0, 2]);
        let tcp = 34;
        frame[tcp..tcp + 2].copy_from_slice(&1234u16.to_be_bytes());
        frame[tcp + 2..tcp + 4].copy_from_slice(&4791u16.to_be_bytes());
        frame[tcp + 12] = 7 << 4;
        frame[tcp + 13] = flags::SYN;
        frame[tcp + 20..tcp + 28].copy_from_slice(&[2, 4, 0x05, 0xb4, 1, 3, 3, 7]);
        let segment = parse(&frame).unwrap();
        assert_eq!(segment.mss, Some(1460));
        assert_eq!(segment.wscale, Some(7));
        assert_eq!(segment.seq_len(), 1);
        assert_eq!(segment.dst.port(), 4791);
        for len in 0..frame.len() {
            let _ = parse(&frame[..len]);
        }
        frame[14] = 0x44;
        assert!(parse(&frame).is_none());
    }
}
