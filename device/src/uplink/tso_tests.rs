//! Unit tests of `tso.rs` on crafted frames; checksums are checked with
//! a checksum written differently here (word by word, end-around carry
//! at each step) from the one under test.
#![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]

use super::*;

/// RFC 1071 checksum, the plain way: 0 over data that holds a valid one.
pub(crate) fn naive_csum(parts: &[&[u8]]) -> u16 {
    let data: Vec<u8> = parts.concat();
    let mut s: u32 = 0;
    for i in (0..data.len()).step_by(2) {
        let lo = if i + 1 < data.len() { data[i + 1] } else { 0 };
        s += (u32::from(data[i]) << 8) | u32::from(lo);
        if s > 0xffff {
            s = (s & 0xffff) + 1;
        }
    }
    !(s as u16)
}

/// The pseudo header of the TCP segment in `frame`.
pub(crate) fn pseudo(frame: &[u8]) -> Vec<u8> {
    let v6 = frame[12] == 0x86;
    let (addrs, tcp_len) = if v6 {
        (&frame[22..54], u16::from_be_bytes([frame[18], frame[19]]) as usize)
    } else {
        let ihl = usize::from(frame[14] & 15) * 4;
        (&frame[26..34], u16::from_be_bytes([frame[16], frame[17]]) as usize - ihl)
    };
    let mut p = addrs.to_vec();
    p.extend_from_slice(&[0, 6]);
    p.extend_from_slice(&(tcp_len as u16).to_be_bytes());
    if v6 {
        p = [&p[..32], &[0, 0], &(tcp_len as u16).to_be_bytes(), &[0, 0, 0, 6]].concat();
    }
    p
}

fn tcp_offset(frame: &[u8]) -> usize {
    if frame[12] == 0x86 {
        54
    } else {
        14 + usize::from(frame[14] & 15) * 4
    }
}

pub(crate) fn tcp_checksum_ok(frame: &[u8]) -> bool {
    let tcp = tcp_offset(frame);
    let end = if frame[12] == 0x86 {
        54 + u16::from_be_bytes([frame[18], frame[19]]) as usize
    } else {
        14 + u16::from_be_bytes([frame[16], frame[17]]) as usize
    };
    naive_csum(&[&pseudo(frame), &frame[tcp..end]]) == 0
}

pub(crate) fn ipv4_checksum_ok(frame: &[u8]) -> bool {
    let ihl = usize::from(frame[14] & 15) * 4;
    naive_csum(&[&frame[14..14 + ihl]]) == 0
}

#[derive(Clone, Copy)]
pub(crate) struct Flow {
    pub v6: bool,
    pub sport: u16,
    pub options: &'static [u8],
}

pub(crate) const V4: Flow = Flow { v6: false, sport: 4000, options: &[1, 1, 8, 10, 0, 0, 0, 7, 0, 0, 0, 9] };
pub(crate) const V6: Flow = Flow { v6: true, sport: 4000, options: &[] };

/// A complete Ethernet/IP/TCP frame with valid checksums.
pub(crate) fn frame(flow: Flow, seq: u32, id: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    let tcp_len = 20 + flow.options.len() + payload.len();
    if flow.v6 {
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&(tcp_len as u16).to_be_bytes());
        f.extend_from_slice(&[6, 64]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        f.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    } else {
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(&[0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
        let c = naive_csum(&[&f[14..34]]);
        f[24..26].copy_from_slice(&c.to_be_bytes());
    }
    f.extend_from_slice(&flow.sport.to_be_bytes());
    f.extend_from_slice(&5001u16.to_be_bytes());
    f.extend_from_slice(&seq.to_be_bytes());
    f.extend_from_slice(&77u32.to_be_bytes());
    let doff = ((20 + flow.options.len()) / 4) as u8;
    f.extend_from_slice(&[doff << 4, flags, 0x10, 0, 0, 0, 0, 0]);
    f.extend_from_slice(flow.options);
    f.extend_from_slice(payload);
    let tcp = tcp_offset(&f);
    let c = naive_csum(&[&pseudo(&f), &f[tcp..]]);
    f[tcp + 16..tcp + 18].copy_from_slice(&c.to_be_bytes());
    assert!(tcp_checksum_ok(&f));
    f
}

/// `n` consecutive segments of `mss` octets (the last `last` octets),
/// ACK only but PSH on the last, with consecutive IP ids.
pub(crate) fn segments(flow: Flow, n: usize, mss: usize, last: usize) -> Vec<Vec<u8>> {
    let mut seq = 1_000_000u32.wrapping_sub(5000);
    (0..n)
        .map(|i| {
            let len = if i + 1 == n { last } else { mss };
            let payload: Vec<u8> = (0..len).map(|k| (k * 7 + i * 13) as u8).collect();
            let flags = if i + 1 == n { TCP_ACK | TCP_PSH } else { TCP_ACK };
            let f = frame(flow, seq, 300 + i as u16, flags, &payload);
            seq = seq.wrapping_add(len as u32);
            f
        })
        .collect()
}

/// The super-frame the kernel would see: the built headers + payloads.
fn coalesce(frames: &[Vec<u8>]) -> (VnetHdr, Vec<u8>) {
    let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
    let mut head = [0; MAX_HEADER];
    let (hdr, len) = super_header(&refs, &mut head).unwrap();
    let mut out = head[..len].to_vec();
    for f in frames {
        out.extend_from_slice(&f[len..]);
    }
    (hdr, out)
}

fn cut(hdr: &VnetHdr, src: &[u8], nbufs: usize) -> Result<Vec<Vec<u8>>, GsoError> {
    let mut bufs = vec![vec![0xee; 65_536]; nbufs];
    let mut received = vec![Received::default(); nbufs];
    let done = segment(hdr, src, &mut bufs, &mut received)?;
    let mut frames = Vec::new();
    for (b, r) in bufs.iter().zip(&received).take(done.buffers) {
        frames.extend(r.frames(b).map(<[u8]>::to_vec));
    }
    assert_eq!(frames.len(), done.frames);
    Ok(frames)
}

pub(crate) fn refs(frames: &[Vec<u8>]) -> Vec<&[u8]> {
    frames.iter().map(Vec::as_slice).collect()
}

#[test]
fn vnet_header_round_trips() {
    let h = VnetHdr { flags: 1, gso_type: 4, hdr_len: 66, gso_size: 1448, csum_start: 34, csum_offset: 16 };
    assert_eq!(VnetHdr::parse(&h.to_bytes()), h);
    assert_eq!(h.to_bytes()[10..], [0, 0]);
}

#[test]
fn consecutive_segments_make_one_super_frame() {
    let frames = segments(V4, 40, 1448, 700);
    assert_eq!(plan(&refs(&frames)), 40);
    let (hdr, sup) = coalesce(&frames);
    let header = 14 + 20 + 32;
    assert_eq!(
        hdr,
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: header as u16,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16
        }
    );
    assert_eq!(sup.len(), header + 39 * 1448 + 700);
    assert_eq!(usize::from(u16::from_be_bytes([sup[16], sup[17]])), sup.len() - 14);
    assert!(ipv4_checksum_ok(&sup));
    assert_eq!(sup[18..20], frames[0][18..20], "the first frame's IP id");
    assert_eq!(sup[34 + 4..34 + 8], frames[0][34 + 4..34 + 8], "the first frame's seq");
    assert_eq!(sup[34 + 13], TCP_ACK | TCP_PSH, "the last frame's flags");
    // The partial checksum: the pseudo header over the whole segment, so
    // adding the segment's own sum gives the full checksum.
    let partial = u16::from_be_bytes([sup[34 + 16], sup[34 + 17]]);
    assert_eq!(!naive_csum(&[&pseudo(&sup)]), partial);
    let mut full = sup.clone();
    complete_checksum(&mut full, &hdr).unwrap();
    assert!(tcp_checksum_ok(&full));
}

#[test]
fn segmenting_a_super_frame_gives_back_the_frames() {
    for (flow, n, mss, last) in [(V4, 40, 1448, 700), (V6, 7, 8940, 8940), (V4, 2, 1448, 1), (V6, 45, 1440, 3)] {
        let frames = segments(flow, n, mss, last);
        assert_eq!(plan(&refs(&frames)), n);
        let (hdr, sup) = coalesce(&frames);
        assert_eq!(hdr.gso_type, if flow.v6 { GSO_TCPV6 } else { GSO_TCPV4 });
        let back = cut(&hdr, &sup, 4).unwrap();
        assert_eq!(back.len(), n);
        for (i, (a, b)) in back.iter().zip(&frames).enumerate() {
            assert_eq!(a, b, "frame {i} of {n}");
        }
    }
}

#[test]
fn small_segments_spill_into_the_next_buffer() {
    // 63,000 octets in 536-octet segments: 118 frames of 602 octets, 108
    // per 64 KiB buffer.
    let frames = segments(V4, 118, 536, 63_000 - 117 * 536);
    let (hdr, sup) = coalesce(&frames[..64]);
    let sup_rest = coalesce(&frames[64..]).1;
    assert!(cut(&hdr, &sup, 4).unwrap() == frames[..64], "the first 64 frames differ");
    // A kernel super-frame of all 118 (as GRO could make one).
    let mut all = sup.clone();
    all.extend_from_slice(&sup_rest[66..]);
    let ip_len = (all.len() - 14) as u16;
    all[16..18].copy_from_slice(&ip_len.to_be_bytes());
    all[34 + 13] = TCP_ACK | TCP_PSH;
    let mut bufs = vec![vec![0; 65_536]; 4];
    let mut received = vec![Received::default(); 4];
    let done = segment(&hdr, &all, &mut bufs, &mut received).unwrap();
    assert_eq!(done, Segmented { buffers: 2, frames: 118 });
    assert_eq!(received[0], Received { len: 108 * 602, segment: 602 });
    let mut back: Vec<Vec<u8>> = Vec::new();
    for (b, r) in bufs.iter().zip(&received).take(2) {
        back.extend(r.frames(b).map(<[u8]>::to_vec));
    }
    assert!(back == frames, "the 118 frames differ");
}

#[test]
fn segment_flags_fin_psh_last_cwr_first() {
    let frames = segments(V4, 3, 1000, 1000);
    let (hdr, mut sup) = coalesce(&frames);
    sup[34 + 13] = TCP_ACK | TCP_PSH | TCP_FIN | TCP_CWR;
    let back = cut(&hdr, &sup, 4).unwrap();
    let flags: Vec<u8> = back.iter().map(|f| f[34 + 13]).collect();
    assert_eq!(flags, [TCP_ACK | TCP_CWR, TCP_ACK, TCP_ACK | TCP_PSH | TCP_FIN]);
    assert!(back.iter().all(|f| tcp_checksum_ok(f) && ipv4_checksum_ok(f)));
}

#[test]
fn runs_end_where_the_flow_or_the_sizes_change() {
    let base = segments(V4, 6, 1000, 1000);
    let check = |frames: &[Vec<u8>], want: usize, why: &str| assert_eq!(plan(&refs(frames)), want, "{why}");
    check(&base, 6, "whole run");
    let mut f = base.clone();
    f[3] = segments(Flow { sport: 4001, ..V4 }, 6, 1000, 1000)[3].clone();
    check(&f, 3, "another port");
    let mut f = base.clone();
    f[2][34 + 4..34 + 8].copy_from_slice(&5u32.to_be_bytes());
    check(&f, 2, "seq gap");
    let mut f = base.clone();
    f[2][34 + 13] = TCP_ACK | TCP_PSH;
    check(&f, 3, "PSH ends the run with that frame");
    let mut f = base.clone();
    f[0][34 + 13] = TCP_ACK | TCP_PSH;
    check(&f, 1, "PSH on the first");
    let mut f = base.clone();
    f[4][34 + 13] = TCP_ACK | TCP_FIN;
    check(&f, 4, "FIN");
    let mut f = base.clone();
    f[1][34 + 14] = 0x11;
    check(&f, 1, "window differs");
    let mut f = base.clone();
    f[3][34 + 27] = 8;
    check(&f, 3, "options differ");
    let mut f = base.clone();
    f[5][15] = 0x10;
    check(&f, 5, "TOS differs");
    let mut f = base.clone();
    f[1][20] = 0x60;
    check(&f, 1, "fragment");
    let mut short_then_long = segments(V4, 3, 1000, 1000);
    short_then_long[1] = segments(V4, 2, 1000, 900)[1].clone();
    check(&short_then_long, 2, "a short segment ends the run");
    let mut longer = base.clone();
    longer[1] = frame(V4, 1_000_000u32.wrapping_sub(4000), 301, TCP_ACK, &[0; 1001]);
    check(&longer, 1, "a longer payload");
    check(&segments(V4, 70, 900, 900), 64, "at most 64 frames");
    check(&segments(V4, 60, 1448, 1448), 45, "at most 64 KiB of IP datagram");
    let mut udp = base.clone();
    udp[1][23] = 17;
    check(&udp, 1, "not TCP");
    check(&[base[0].clone(), base[1][..60].to_vec()], 1, "truncated frame");
    check(&[frame(V4, 1, 1, TCP_ACK, &[])], 1, "no payload");
    let mut v4v6 = segments(V6, 3, 1000, 1000);
    v4v6[1] = base[1].clone();
    check(&v4v6, 1, "IPv6 then IPv4");
}

#[test]
fn partial_checksums_are_completed() {
    let good = frame(V4, 9, 1, TCP_ACK | TCP_PSH, b"hello, partial world");
    let mut f = good.clone();
    let partial = !naive_csum(&[&pseudo(&f)]);
    f[34 + 16..34 + 18].copy_from_slice(&partial.to_be_bytes());
    let hdr = VnetHdr { flags: F_NEEDS_CSUM, csum_start: 34, csum_offset: 16, ..VnetHdr::default() };
    complete_checksum(&mut f, &hdr).unwrap();
    assert_eq!(f, good);
    let beyond = VnetHdr { csum_start: (f.len() - 1) as u16, ..hdr };
    assert_eq!(
        complete_checksum(&mut f, &beyond),
        Err(GsoError::BadChecksumPosition { start: f.len() - 1, offset: 16 })
    );
}

#[test]
fn hostile_gso_frames_are_refused() {
    let frames = segments(V4, 4, 1000, 1000);
    let (hdr, sup) = coalesce(&frames);
    let v6 = coalesce(&segments(V6, 2, 1000, 1000));
    let bad = |h: VnetHdr, src: &[u8]| cut(&h, src, 4).unwrap_err();
    assert_eq!(bad(VnetHdr { gso_size: 0, ..hdr }, &sup), GsoError::ZeroSize);
    assert_eq!(bad(VnetHdr { gso_type: 3, ..hdr }, &sup), GsoError::Unsupported(3), "UDP");
    assert_eq!(bad(VnetHdr { gso_type: 5, ..hdr }, &sup), GsoError::Unsupported(5), "UDP L4");
    assert_eq!(bad(VnetHdr { gso_type: GSO_TCPV4 | GSO_ECN, ..hdr }, &sup), GsoError::Unsupported(0x81));
    assert_eq!(bad(hdr, &v6.1), GsoError::BadHeaders, "TCPV4 on IPv6");
    assert_eq!(bad(v6.0, &sup), GsoError::BadHeaders, "TCPV6 on IPv4");
    assert_eq!(bad(hdr, &sup[..60]), GsoError::BadHeaders, "headers past the frame");
    assert_eq!(bad(hdr, &sup[..sup.len() - 1]), GsoError::BadHeaders, "IP length past the frame");
    let mut doff = sup.clone();
    doff[34 + 12] = 0x40;
    assert_eq!(bad(hdr, &doff), GsoError::BadHeaders, "TCP header under 20 octets");
    let mut doff = sup.clone();
    doff[34 + 12] = 0xf0;
    doff[16..18].copy_from_slice(&50u16.to_be_bytes());
    assert_eq!(bad(hdr, &doff), GsoError::BadHeaders, "TCP header past the IP datagram");
    let no_payload = frame(V4, 1, 1, TCP_ACK, &[]);
    assert_eq!(bad(hdr, &no_payload), GsoError::NoPayload);
    // 1-octet segments of 4000 octets: 4000 frames of 67 octets.
    assert_eq!(bad(VnetHdr { gso_size: 1, ..hdr }, &sup), GsoError::TooManySegments(5));
    // Fewer buffers than the segments need.
    // 2000 frames of 68 octets, 963 a buffer.
    assert_eq!(cut(&VnetHdr { gso_size: 2, ..hdr }, &sup, 1).unwrap_err(), GsoError::TooManySegments(3));
    assert_eq!(cut(&VnetHdr { gso_size: 2, ..hdr }, &sup, 3).unwrap().len(), 2000);
    // Segments larger than a buffer.
    let mut tiny = vec![vec![0; 100]; 4];
    let mut r = vec![Received::default(); 4];
    assert_eq!(segment(&hdr, &sup, &mut tiny, &mut r), Err(GsoError::TooManySegments(usize::MAX)));
}

#[test]
fn random_bytes_never_panic() {
    let (hdr, sup) = coalesce(&segments(V4, 4, 1000, 1000));
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut bufs = vec![vec![0; 65_536]; 4];
    let mut received = vec![Received::default(); 4];
    for round in 0..3000 {
        let mut f = sup.clone();
        // Flip a few header octets (or cut the frame) at random.
        for _ in 0..(next() % 4 + 1) {
            let at = (next() % 80) as usize;
            f[at] = next() as u8;
        }
        if round % 5 == 0 {
            f.truncate((next() % f.len() as u64) as usize);
        }
        let h = VnetHdr { gso_size: (next() % 3000) as u16, csum_start: (next() % 90) as u16, ..hdr };
        let _ = segment(&h, &f, &mut bufs, &mut received);
        let _ = complete_checksum(&mut f, &h);
        let _ = plan(&[&f, &sup[..], &f]);
    }
}
