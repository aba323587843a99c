//! Ethernet/IPv4/TCP headers for demux (`wants`) and for observing the
//! TCB state on the frames going through the TOE, read and written with
//! `smoltcp::wire`. Never panics; checksums are smoltcp's business, but
//! for the split fault's frames ([`split_segment`]).

use std::net::{Ipv4Addr, SocketAddrV4};

use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol, EthernetRepr, IpProtocol,
    Ipv4Packet, TcpOption, TcpPacket,
};

use super::{FourTuple, MacAddr};

pub const ETHERNET_HEADER_LEN: usize = smoltcp::wire::ETHERNET_HEADER_LEN;

/// TCP flags, as [`Segment::flags`] holds them (the header's bit values).
pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
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
    EthernetAddress(mac).is_unicast() && mac != [0; 6]
}

/// The bits of [`flags`] a TCP header has set.
fn tcp_flags<T: AsRef<[u8]>>(tcp: &TcpPacket<T>) -> u8 {
    [
        (tcp.fin(), flags::FIN),
        (tcp.syn(), flags::SYN),
        (tcp.rst(), flags::RST),
        (tcp.psh(), flags::PSH),
        (tcp.ack(), flags::ACK),
        (tcp.urg(), flags::URG),
    ]
    .iter()
    .filter(|(set, _)| *set)
    .fold(0, |bits, (_, bit)| bits | bit)
}

/// An IPv4 packet that is whole (no fragment) and carries TCP.
fn ipv4_tcp(bytes: &[u8]) -> Option<Ipv4Packet<&[u8]>> {
    let ip = Ipv4Packet::new_checked(bytes).ok()?;
    let whole = !ip.more_frags() && ip.frag_offset() == 0;
    (ip.version() == 4 && whole && ip.next_header() == IpProtocol::Tcp).then_some(ip)
}

/// Parses an unfragmented IPv4/TCP segment in an Ethernet II frame.
pub fn parse(frame: &[u8]) -> Option<Segment> {
    let eth = EthernetFrame::new_checked(frame).ok()?;
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return None;
    }
    let ip = ipv4_tcp(eth.payload())?;
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    let mut segment = Segment {
        dst_mac: eth.dst_addr().0,
        src_mac: eth.src_addr().0,
        src: SocketAddrV4::new(ip.src_addr(), tcp.src_port()),
        dst: SocketAddrV4::new(ip.dst_addr(), tcp.dst_port()),
        // The header's bits, whatever smoltcp's signed arithmetic type.
        seq: tcp.seq_number().0 as u32,
        ack: tcp.ack_number().0 as u32,
        flags: tcp_flags(&tcp),
        window: tcp.window_len(),
        payload_len: tcp.payload().len(),
        mss: None,
        wscale: None,
    };
    if tcp.syn() {
        let mut options = tcp.options();
        while let Ok((rest, option)) = TcpOption::parse(options) {
            match option {
                TcpOption::EndOfList => break,
                TcpOption::MaxSegmentSize(mss) => segment.mss = Some(mss),
                TcpOption::WindowScale(shift) => segment.wscale = Some(shift.min(14)),
                _ => {}
            }
            options = rest;
        }
    }
    Some(segment)
}

/// (source, destination) of a bare IPv4/TCP packet (no Ethernet header).
pub fn ip_tcp_endpoints(packet: &[u8]) -> Option<(SocketAddrV4, SocketAddrV4)> {
    let ip = ipv4_tcp(packet)?;
    let tcp = TcpPacket::new_checked(ip.payload()).ok()?;
    Some((SocketAddrV4::new(ip.src_addr(), tcp.src_port()), SocketAddrV4::new(ip.dst_addr(), tcp.dst_port())))
}

/// Writes an Ethernet II header for IPv4 into `header` (14 octets; a
/// shorter one is left alone).
pub fn write_ethernet_header(header: &mut [u8], dst: MacAddr, src: MacAddr) {
    let repr = EthernetRepr {
        src_addr: EthernetAddress(src),
        dst_addr: EthernetAddress(dst),
        ethertype: EthernetProtocol::Ipv4,
    };
    if let Some(target) = header.get_mut(..ETHERNET_HEADER_LEN) {
        repr.emit(&mut EthernetFrame::new_unchecked(target));
    }
}

/// An ARP reply `from_ip is-at from_mac` to `to_mac` (tests: a frame the
/// TOE must leave to the guest).
pub fn arp_reply(to_mac: MacAddr, to_ip: Ipv4Addr, from_mac: MacAddr, from_ip: Ipv4Addr) -> [u8; 42] {
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Reply,
        source_hardware_addr: EthernetAddress(from_mac),
        source_protocol_addr: from_ip,
        target_hardware_addr: EthernetAddress(to_mac),
        target_protocol_addr: to_ip,
    };
    let eth = EthernetRepr {
        src_addr: EthernetAddress(from_mac),
        dst_addr: EthernetAddress(to_mac),
        ethertype: EthernetProtocol::Arp,
    };
    let mut frame = [0u8; 42];
    let mut packet = EthernetFrame::new_unchecked(frame.as_mut_slice());
    eth.emit(&mut packet);
    arp.emit(&mut ArpPacket::new_unchecked(packet.payload_mut()));
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
        frame[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
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
