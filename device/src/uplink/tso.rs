//! TCP segmentation offload for the tap uplink (`IFF_VNET_HDR`): each
//! frame on the tap carries a virtio-net header.
//!
//! *Send:* consecutive TCP segments of one flow in a flush go as one
//! super-frame (`plan` + `super_header`): the first frame's headers with
//! the whole length, `gso_type` TCPV4/TCPV6, `gso_size` = the payload size
//! and a partial checksum (the pseudo-header sum); the kernel cuts it
//! (`tcp_gso_segment`) or hands it on whole to a peer that takes TSO.
//! *Receive:* the kernel may hand us such super-frames and frames whose
//! checksum it left partial; vt3d's consumers want MTU frames with full
//! checksums, so `segment` cuts them here and `complete_checksum` fills
//! the checksum in. Frames come from any guest on the bridge: everything
//! is bounds-checked and malformed headers are refused, never trusted.

use thiserror::Error;

use super::Received;

/// Size of the vnet header vt3d asks for (`virtio_net_hdr_mrg_rxbuf`).
pub(super) const VNET_HDR_LEN: usize = 12;

pub(super) const F_NEEDS_CSUM: u8 = 1;
pub(super) const GSO_NONE: u8 = 0;
pub(super) const GSO_TCPV4: u8 = 1;
pub(super) const GSO_TCPV6: u8 = 4;
#[cfg(test)]
pub(super) const GSO_ECN: u8 = 0x80;

/// Longest Ethernet + IP + TCP header vt3d coalesces or segments.
pub(super) const MAX_HEADER: usize = 14 + 60 + 60;
/// Buffers one received super-frame may fill once segmented: more means
/// a tiny `gso_size` (a hostile one: a 64 KiB frame with 1-octet
/// segments would be 3.6 MB of headers).
pub(super) const MAX_GSO_BUFS: usize = 4;
/// Frames coalesced into one super-frame at most (a flush is at most
/// `SEND_BATCH` frames anyway).
pub(super) const MAX_SEGMENTS: usize = 64;
/// Largest IP datagram (IPv4 total length, IPv6 payload length).
const MAX_IP_LEN: usize = 65_535;

const ETH_LEN: usize = 14;
const TCP_FIN: u8 = 0x01;
pub(super) const TCP_PSH: u8 = 0x08;
pub(super) const TCP_ACK: u8 = 0x10;
const TCP_CWR: u8 = 0x80;
/// Offset of the checksum in a TCP header.
const TCP_CSUM: usize = 16;
const TCP_CSUM_U16: u16 = 16;

/// `struct virtio_net_hdr` (host byte order: tun's legacy default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn to_bytes(self) -> [u8; VNET_HDR_LEN] {
        let [h0, h1] = self.hdr_len.to_ne_bytes();
        let [g0, g1] = self.gso_size.to_ne_bytes();
        let [s0, s1] = self.csum_start.to_ne_bytes();
        let [o0, o1] = self.csum_offset.to_ne_bytes();
        [self.flags, self.gso_type, h0, h1, g0, g1, s0, s1, o0, o1, 0, 0]
    }

    pub fn parse(b: &[u8; VNET_HDR_LEN]) -> Self {
        let [flags, gso_type, h0, h1, g0, g1, s0, s1, o0, o1, _, _] = *b;
        Self {
            flags,
            gso_type,
            hdr_len: u16::from_ne_bytes([h0, h1]),
            gso_size: u16::from_ne_bytes([g0, g1]),
            csum_start: u16::from_ne_bytes([s0, s1]),
            csum_offset: u16::from_ne_bytes([o0, o1]),
        }
    }
}

/// Why a received frame was dropped.
#[derive(Debug, Error, PartialEq, Eq)]
pub(super) enum GsoError {
    #[error("GSO type {0:#x} not supported (only TCPv4/TCPv6 without ECN)")]
    Unsupported(u8),
    #[error("gso_size 0")]
    ZeroSize,
    #[error("no Ethernet/IP/TCP headers matching the GSO type within the frame")]
    BadHeaders,
    #[error("GSO frame without payload")]
    NoPayload,
    #[error("segments need {0} buffers (more than allowed or available)")]
    TooManySegments(usize),
    #[error("checksum position {start}+{offset} past the frame")]
    BadChecksumPosition { start: usize, offset: usize },
}

/// Where the headers of an Ethernet/IPv4-or-IPv6/TCP frame are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TcpFrame {
    v6: bool,
    ip_len: usize,
    tcp_len: usize,
    /// The IP datagram's end (Ethernet padding may follow).
    end: usize,
}

impl TcpFrame {
    fn tcp(&self) -> usize {
        ETH_LEN + self.ip_len
    }
    fn payload(&self) -> usize {
        self.tcp() + self.tcp_len
    }
    fn payload_len(&self) -> usize {
        self.end - self.payload()
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    if let Some(d) = b.get_mut(at..at + 2) {
        d.copy_from_slice(&v.to_be_bytes());
    }
}

/// Parses an untagged Ethernet frame holding one unfragmented TCP
/// segment over IPv4 or IPv6 (no extension headers); `None` otherwise.
fn parse_tcp(frame: &[u8]) -> Option<TcpFrame> {
    let ip = frame.get(ETH_LEN..)?;
    let (v6, ip_len, end) = match be16(frame, 12)? {
        0x0800 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(be16(ip, 2)?);
            let unfragmented = be16(ip, 6)? & 0x3fff == 0;
            let ok = ip.first()? >> 4 == 4 && ihl >= 20 && total >= ihl && unfragmented && *ip.get(9)? == 6;
            ok.then_some((false, ihl, ETH_LEN + total))?
        }
        0x86dd => {
            let ok = ip.first()? >> 4 == 6 && *ip.get(6)? == 6;
            ok.then_some((true, 40, ETH_LEN + 40 + usize::from(be16(ip, 4)?)))?
        }
        _ => return None,
    };
    let tcp_len = usize::from(frame.get(ETH_LEN + ip_len + 12)? >> 4) * 4;
    let parsed = TcpFrame { v6, ip_len, tcp_len, end };
    let fits = tcp_len >= 20 && parsed.payload() <= end && end <= frame.len();
    fits.then_some(parsed)
}

/// One's-complement sum of `data` as big-endian 16-bit words (an odd
/// last octet padded with zero), added to `sum`, not yet folded.
fn add_words(mut sum: u64, data: &[u8]) -> u64 {
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        if let &[a, b, c, d] = w {
            sum += u64::from(u32::from_be_bytes([a, b, c, d]));
        }
    }
    let rest = words.remainder();
    let mut pairs = rest.chunks_exact(2);
    for p in &mut pairs {
        if let &[a, b] = p {
            sum += u64::from(u16::from_be_bytes([a, b]));
        }
    }
    if let [last] = pairs.remainder() {
        sum += u64::from(*last) << 8;
    }
    sum
}

/// Folds a sum to 16 bits (not complemented).
fn fold(mut sum: u64) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    u16::try_from(sum).unwrap_or(0xffff)
}

/// The pseudo-header sum of TCP over `frame`'s IP addresses with a TCP
/// length of `tcp_len`.
fn pseudo_header(frame: &[u8], p: &TcpFrame, tcp_len: usize) -> u64 {
    let ip = frame.get(ETH_LEN..).unwrap_or_default();
    let addrs = if p.v6 { ip.get(8..40) } else { ip.get(12..20) };
    add_words(6 + u64::try_from(tcp_len).unwrap_or(0), addrs.unwrap_or_default())
}

/// Writes the IPv4 header checksum of `frame`.
fn fix_ipv4_checksum(frame: &mut [u8], ip_len: usize) {
    put16(frame, ETH_LEN + 10, 0);
    let sum = add_words(0, frame.get(ETH_LEN..ETH_LEN + ip_len).unwrap_or_default());
    put16(frame, ETH_LEN + 10, !fold(sum));
}

/// Sets the IP length fields of `frame` for `tcp_octets` of TCP.
fn set_ip_length(frame: &mut [u8], p: &TcpFrame, tcp_octets: usize) {
    if p.v6 {
        put16(frame, ETH_LEN + 4, u16::try_from(tcp_octets).unwrap_or(u16::MAX));
    } else {
        put16(frame, ETH_LEN + 2, u16::try_from(p.ip_len + tcp_octets).unwrap_or(u16::MAX));
    }
}

/// How many of `frames`, from the first, go as one TCP super-frame (1:
/// the first goes alone). They must be one flow's consecutive segments:
/// the same headers but for IP id/length/checksum, TCP seq and checksum;
/// contiguous seq; payloads of the first's size but a shorter last; flags
/// ACK only (PSH allowed on the last); within 64 KiB of IP datagram.
pub(super) fn plan(frames: &[&[u8]]) -> usize {
    let frames = frames.get(..frames.len().min(MAX_SEGMENTS)).unwrap_or(frames);
    let Some(first) = frames.first() else { return 0 };
    let Some(p0) = parse_tcp(first) else { return 1 };
    let mss = p0.payload_len();
    if mss == 0 || first.len() != p0.end || first.get(p0.tcp() + 13) != Some(&TCP_ACK) {
        return 1;
    }
    let mut count = 1;
    let mut tcp_octets = p0.tcp_len + mss;
    let mut next_seq = be32(first, p0.tcp() + 4).unwrap_or(0).wrapping_add(u32::try_from(mss).unwrap_or(0));
    for frame in frames.iter().skip(1) {
        let Some(p) = parse_tcp(frame) else { break };
        let len = p.payload_len();
        let flags = frame.get(p.tcp() + 13).copied().unwrap_or(0);
        let joins = p == TcpFrame { end: p.end, ..p0 }
            && frame.len() == p.end
            && len > 0
            && len <= mss
            && (flags == TCP_ACK || flags == TCP_ACK | TCP_PSH)
            && be32(frame, p.tcp() + 4) == Some(next_seq)
            && p0.ip_len + tcp_octets + len <= MAX_IP_LEN
            && same_headers(first, frame, &p0);
        if !joins {
            break;
        }
        count += 1;
        tcp_octets += len;
        next_seq = next_seq.wrapping_add(u32::try_from(len).unwrap_or(0));
        if len < mss || flags != TCP_ACK {
            break; // a short or pushed segment ends the run
        }
    }
    count
}

/// Whether two frames with the layout `p` have the same headers outside
/// the fields a segment has of its own.
fn same_headers(a: &[u8], b: &[u8], p: &TcpFrame) -> bool {
    // (start, end) ranges of the header that must match.
    let ip = ETH_LEN;
    let tcp = p.tcp();
    let ranges: &[(usize, usize)] = if p.v6 {
        &[(0, ip + 4), (ip + 6, tcp + 4), (tcp + 8, tcp + 13), (tcp + 14, tcp + 16), (tcp + 18, p.payload())]
    } else {
        &[
            (0, ip + 2),
            (ip + 6, ip + 10),
            (ip + 12, tcp + 4),
            (tcp + 8, tcp + 13),
            (tcp + 14, tcp + 16),
            (tcp + 18, p.payload()),
        ]
    };
    ranges.iter().all(|&(s, e)| a.get(s..e).is_some() && a.get(s..e) == b.get(s..e))
}

/// Builds into `out` the headers of the super-frame of `frames` (a run
/// `plan` accepted, more than one frame); returns the vnet header and the
/// headers' length. The payloads follow in place.
pub(super) fn super_header(frames: &[&[u8]], out: &mut [u8; MAX_HEADER]) -> Option<(VnetHdr, usize)> {
    let first = frames.first()?;
    let last = frames.last()?;
    let p = parse_tcp(first)?;
    let header = p.payload();
    out.get_mut(..header)?.copy_from_slice(first.get(..header)?);
    let payload: usize = frames.iter().map(|f| parse_tcp(f).map_or(0, |q| q.payload_len())).sum();
    let tcp_octets = p.tcp_len + payload;
    set_ip_length(out, &p, tcp_octets);
    if !p.v6 {
        fix_ipv4_checksum(out, p.ip_len);
    }
    // The last segment's flags (PSH); the kernel clears them on the others.
    let lp = parse_tcp(last)?;
    *out.get_mut(p.tcp() + 13)? = *last.get(lp.tcp() + 13)?;
    // A partial checksum: the pseudo-header's sum, not complemented.
    let partial = fold(pseudo_header(out, &p, tcp_octets));
    put16(out, p.tcp() + TCP_CSUM, partial);
    let hdr = VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: if p.v6 { GSO_TCPV6 } else { GSO_TCPV4 },
        hdr_len: u16::try_from(header).ok()?,
        gso_size: u16::try_from(p.payload_len()).ok()?,
        csum_start: u16::try_from(p.tcp()).ok()?,
        csum_offset: TCP_CSUM_U16,
    };
    Some((hdr, header))
}

/// Completes the partial checksum of a received frame (NEEDS_CSUM): the
/// field at `csum_start + csum_offset` holds the pseudo-header sum; the
/// sum of everything from `csum_start` to the end replaces it, as the
/// kernel's `skb_checksum_help` does.
pub(super) fn complete_checksum(frame: &mut [u8], hdr: &VnetHdr) -> Result<(), GsoError> {
    let start = usize::from(hdr.csum_start);
    let offset = usize::from(hdr.csum_offset);
    let bad = GsoError::BadChecksumPosition { start, offset };
    if start + offset + 2 > frame.len() {
        return Err(bad);
    }
    let sum = add_words(0, frame.get(start..).ok_or(bad)?);
    let csum = match !fold(sum) {
        0 => 0xffff, // 0 would mean "no checksum" to UDP
        c => c,
    };
    put16(frame, start + offset, csum);
    Ok(())
}

/// What `segment` wrote: `frames` frames into the first `buffers` buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Segmented {
    pub buffers: usize,
    pub frames: usize,
}

/// Cuts the TCP super-frame `src` (received with `hdr`) into segments of
/// `gso_size` payload, written consecutively into `bufs` as runs of
/// equal-size frames (`received`, one per buffer used); every segment
/// gets its IP length, id and checksum, its seq, FIN/PSH only on the
/// last, CWR only on the first, and a full TCP checksum.
pub(super) fn segment(
    hdr: &VnetHdr,
    src: &[u8],
    bufs: &mut [Vec<u8>],
    received: &mut [Received],
) -> Result<Segmented, GsoError> {
    let want_v6 = match hdr.gso_type {
        GSO_TCPV4 => false,
        GSO_TCPV6 => true,
        other => return Err(GsoError::Unsupported(other)),
    };
    let mss = usize::from(hdr.gso_size);
    if mss == 0 {
        return Err(GsoError::ZeroSize);
    }
    let p = parse_tcp(src).filter(|p| p.v6 == want_v6).ok_or(GsoError::BadHeaders)?;
    let payload = src.get(p.payload()..p.end).ok_or(GsoError::BadHeaders)?;
    if payload.is_empty() {
        return Err(GsoError::NoPayload);
    }
    let header = p.payload();
    let full = header + mss.min(payload.len());
    let segments = payload.len().div_ceil(mss);
    let room = bufs.len().min(received.len()).min(MAX_GSO_BUFS);
    let per_buf = bufs.iter().take(room).map(|b| b.len() / full).min().unwrap_or(0);
    let needed = if per_buf == 0 { usize::MAX } else { segments.div_ceil(per_buf) };
    if needed > room {
        return Err(GsoError::TooManySegments(needed));
    }
    let id = be16(src, ETH_LEN + 4).unwrap_or(0);
    let seq = be32(src, p.tcp() + 4).unwrap_or(0);
    let flags = src.get(p.tcp() + 13).copied().unwrap_or(0);
    let headers = src.get(..header).ok_or(GsoError::BadHeaders)?;
    let mut chunks = payload.chunks(mss).enumerate();
    for (buf, slot) in bufs.iter_mut().zip(received.iter_mut()).take(needed) {
        let mut at = 0;
        for (j, chunk) in chunks.by_ref().take(per_buf) {
            let Some(out) = buf.get_mut(at..at + header + chunk.len()) else { break };
            let mut f = flags;
            if j + 1 < segments {
                f &= !(TCP_FIN | TCP_PSH);
            }
            if j > 0 {
                f &= !TCP_CWR;
            }
            let seq_j = seq.wrapping_add(u32::try_from(j * mss).unwrap_or(0));
            let id_j = id.wrapping_add(u16::try_from(j).unwrap_or(0));
            write_segment(out, &p, headers, chunk, id_j, seq_j, f);
            at += out.len();
        }
        *slot = Received { len: at, segment: full };
    }
    Ok(Segmented { buffers: needed, frames: segments })
}

/// Writes one segment into `out` (exactly its length): `headers`, then
/// `chunk`, with the fields of its own filled in.
fn write_segment(out: &mut [u8], p: &TcpFrame, headers: &[u8], chunk: &[u8], id: u16, seq: u32, flags: u8) {
    let (head, body) = out.split_at_mut(headers.len().min(out.len()));
    head.copy_from_slice(headers.get(..head.len()).unwrap_or_default());
    if body.len() == chunk.len() {
        body.copy_from_slice(chunk);
    }
    let tcp_octets = p.tcp_len + chunk.len();
    set_ip_length(out, p, tcp_octets);
    if !p.v6 {
        put16(out, ETH_LEN + 4, id);
        fix_ipv4_checksum(out, p.ip_len);
    }
    let tcp = p.tcp();
    if let Some(s) = out.get_mut(tcp + 4..tcp + 8) {
        s.copy_from_slice(&seq.to_be_bytes());
    }
    if let Some(f) = out.get_mut(tcp + 13) {
        *f = flags;
    }
    put16(out, tcp + TCP_CSUM, 0);
    let sum = add_words(pseudo_header(out, p, tcp_octets), out.get(tcp..).unwrap_or_default());
    put16(out, tcp + TCP_CSUM, !fold(sum));
}

#[cfg(test)]
#[path = "tso_tests.rs"]
pub(super) mod tests;
