//! UDP segmentation offload for the udp uplink: a run of same-size frames
//! leaves in one `sendmsg` with `UDP_SEGMENT` (the kernel cuts it into one
//! datagram per frame, so the wire is unchanged), and with `UDP_GRO` one
//! receive may hold several same-size datagrams, cut apart again by the
//! segment size the kernel reports (`batch::Received`).
//!
//! Hand-written on `libc` rather than `quinn-udp`: quinn-udp sets DF
//! (`IP_PMTUDISC_PROBE`), wants each GSO send as one contiguous buffer (a
//! copy of frames the send queue already holds apart) and sends one
//! `sendmsg` per run, where one `sendmmsg` here carries every run of a
//! batch with its frames in place.

use std::io;
use std::os::fd::RawFd;

use super::{set_int_option, SEND_BATCH};

/// Datagrams the kernel cuts one send into at most (`UDP_MAX_SEGMENTS`).
pub(super) const MAX_SEGMENTS: usize = 64;
/// Octets one UDP send carries at most (IPv4: 65535 - IP and UDP headers).
pub(super) const MAX_UDP_PAYLOAD: usize = 65_507;

/// Consecutive frames sent in one message: `count` frames, cut every
/// `segment` octets by the kernel; `segment` 0 is a plain datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Run {
    pub count: usize,
    pub segment: usize,
}

/// Groups `frames` into runs: frames of one length (at most
/// `largest_segment`, the largest the path took with GSO) and then at
/// most one shorter frame (GSO's last datagram may be short), within the
/// kernel's limits of segments and octets per send.
pub(super) fn plan(frames: &[&[u8]], largest_segment: usize, runs: &mut Vec<Run>) {
    runs.clear();
    let mut rest = frames;
    while let Some(first) = rest.first() {
        let segment = first.len();
        let mut count = 1;
        if segment > 0 && segment <= largest_segment {
            let mut octets = segment;
            for frame in rest.iter().skip(1) {
                let len = frame.len();
                let fits = count < MAX_SEGMENTS && octets + len <= MAX_UDP_PAYLOAD;
                if !fits || len > segment || len == 0 {
                    break;
                }
                count += 1;
                octets += len;
                if len < segment {
                    break; // the short one ends the run
                }
            }
        }
        runs.push(Run { count, segment: if count > 1 { segment } else { 0 } });
        rest = rest.get(count..).unwrap_or_default();
    }
}

/// Whether `e`, the refusal of a GSO send, says the path will not take
/// that segment size with GSO (EINVAL: a segment plus headers exceeds the
/// path MTU; EMSGSIZE) or GSO at all (EIO: no checksum offload on the
/// route's device). `Some(largest segment still worth trying)`.
pub(super) fn refused_segment(e: &io::Error, segment: usize) -> Option<usize> {
    match e.raw_os_error()? {
        libc::EINVAL | libc::EMSGSIZE => Some(segment.saturating_sub(1)),
        libc::EIO => Some(0),
        _ => None,
    }
}

/// One `UDP_SEGMENT` control message as the kernel reads it: a cmsghdr,
/// then its data (on Linux CMSG_DATA is right after the header, which is
/// itself a multiple of the alignment), padded to CMSG_SPACE.
#[repr(C)]
#[derive(Clone, Copy)]
struct SegmentControl {
    header: libc::cmsghdr,
    segment: u16,
}

/// One `UDP_GRO` control message as the kernel writes it (a c_int).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct GroControl {
    header: libc::cmsghdr,
    segment: libc::c_int,
}

const _: () = assert!(std::mem::offset_of!(SegmentControl, segment) == std::mem::size_of::<libc::cmsghdr>());
const _: () = assert!(std::mem::offset_of!(GroControl, segment) == std::mem::size_of::<libc::cmsghdr>());

fn control_header(level: libc::c_int, kind: libc::c_int, data_len: usize) -> libc::cmsghdr {
    // cmsg_len is CMSG_LEN(data_len): the header and the data, unpadded.
    libc::cmsghdr { cmsg_len: std::mem::size_of::<libc::cmsghdr>() + data_len, cmsg_level: level, cmsg_type: kind }
}

impl GroControl {
    /// Room for the kernel to write into.
    pub(super) fn empty() -> Self {
        Self { header: control_header(0, 0, 0), segment: 0 }
    }

    /// The datagram size of a coalesced receive, given how much of the
    /// buffer the kernel filled (`msg_controllen`); `None` for a single
    /// datagram (no UDP_GRO message).
    pub(super) fn segment(&self, filled: usize) -> Option<usize> {
        let header = &self.header;
        let complete = filled >= header.cmsg_len && header.cmsg_len >= control_header(0, 0, 4).cmsg_len;
        let is_gro = header.cmsg_level == libc::SOL_UDP && header.cmsg_type == libc::UDP_GRO;
        (complete && is_gro).then(|| usize::try_from(self.segment).ok()).flatten().filter(|&s| s > 0)
    }
}

/// One `sendmmsg` of `frames` on a connected non-blocking socket, one
/// message per run of `runs` (which [`plan`] made for these frames): how
/// many messages the kernel took; an error only when the first was
/// refused.
pub(super) fn sendmmsg_runs(fd: RawFd, frames: &[&[u8]], runs: &[Run]) -> io::Result<usize> {
    let mut iovs = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; SEND_BATCH];
    // SAFETY: mmsghdr is plain old data; all-zero is a valid value.
    let mut msgs: [libc::mmsghdr; SEND_BATCH] = unsafe { std::mem::zeroed() };
    let unused = SegmentControl { header: control_header(0, 0, 0), segment: 0 };
    let mut controls = [unused; SEND_BATCH];
    for (iov, frame) in iovs.iter_mut().zip(frames) {
        // The kernel only reads through iov_base (a send).
        *iov = libc::iovec { iov_base: frame.as_ptr().cast_mut().cast(), iov_len: frame.len() };
    }
    let mut first = 0;
    let mut n = 0;
    for ((msg, control), run) in msgs.iter_mut().zip(controls.iter_mut()).zip(runs) {
        let Some(run_iovs) = iovs.get_mut(first..first + run.count) else {
            break;
        };
        msg.msg_hdr.msg_iov = run_iovs.as_mut_ptr();
        msg.msg_hdr.msg_iovlen = run.count;
        first += run.count;
        n += 1;
        match u16::try_from(run.segment) {
            Ok(segment) if segment > 0 => {
                *control = SegmentControl {
                    header: control_header(libc::SOL_UDP, libc::UDP_SEGMENT, std::mem::size_of::<u16>()),
                    segment,
                };
                msg.msg_hdr.msg_control = std::ptr::from_mut(control).cast();
                msg.msg_hdr.msg_controllen = std::mem::size_of::<SegmentControl>();
            }
            _ => {}
        }
    }
    let count = libc::c_uint::try_from(n).unwrap_or(0);
    // SAFETY: msgs holds `count` headers, each pointing at its run's
    // iovecs in iovs (live frames of `frames`) and at most at one control
    // message of controls with its size; all outlive the call.
    let rc = unsafe { libc::sendmmsg(fd, msgs.as_mut_ptr(), count, libc::MSG_DONTWAIT) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(rc).unwrap_or(0))
}

/// Turns on `UDP_GRO` for socket `fd`.
pub(super) fn enable_gro(fd: RawFd) -> io::Result<()> {
    set_int_option(fd, libc::SOL_UDP, libc::UDP_GRO, 1)
}

/// Whether the kernel knows `UDP_SEGMENT` (Linux 4.18 on): setting the
/// socket's default segment size to 0 (none) is accepted.
pub(super) fn gso_supported(fd: RawFd) -> bool {
    set_int_option(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn runs_of(lens: &[usize], largest: usize) -> Vec<(usize, usize)> {
        let frames: Vec<Vec<u8>> = lens.iter().map(|&l| vec![0; l]).collect();
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        let mut runs = Vec::new();
        plan(&refs, largest, &mut runs);
        assert_eq!(runs.iter().map(|r| r.count).sum::<usize>(), lens.len(), "every frame once");
        runs.iter().map(|r| (r.count, r.segment)).collect()
    }

    #[test]
    fn same_size_frames_share_a_send_and_a_short_one_ends_it() {
        assert_eq!(runs_of(&[1514, 1514, 1514, 60, 1514], usize::MAX), [(4, 1514), (1, 0)]);
        assert_eq!(runs_of(&[60, 1514, 1514], usize::MAX), [(1, 0), (2, 1514)]);
        assert_eq!(runs_of(&[1514, 60, 60], usize::MAX), [(2, 1514), (1, 0)]);
        assert_eq!(runs_of(&[], usize::MAX), []);
        assert_eq!(runs_of(&[0, 0], usize::MAX), [(1, 0), (1, 0)]);
    }

    #[test]
    fn runs_stay_within_the_kernels_limits() {
        // 64 segments at most.
        assert_eq!(runs_of(&[100; 70], usize::MAX), [(64, 100), (6, 100)]);
        // 65507 octets at most: seven 9014-octet frames, not eight.
        assert_eq!(runs_of(&[9014; 8], usize::MAX), [(7, 9014), (1, 0)]);
        // One 65014-octet frame per send.
        assert_eq!(runs_of(&[65_014; 2], usize::MAX), [(1, 0), (1, 0)]);
    }

    #[test]
    fn frames_larger_than_the_path_took_go_one_by_one() {
        assert_eq!(runs_of(&[1514, 1514, 60, 60], 1513), [(1, 0), (1, 0), (2, 60)]);
        assert_eq!(runs_of(&[60, 60], 0), [(1, 0), (1, 0)]);
    }

    #[test]
    fn only_gso_refusals_lower_the_segment_size() {
        let err = io::Error::from_raw_os_error;
        assert_eq!(refused_segment(&err(libc::EINVAL), 1514), Some(1513));
        assert_eq!(refused_segment(&err(libc::EIO), 1514), Some(0));
        assert_eq!(refused_segment(&err(libc::ECONNREFUSED), 1514), None);
        assert_eq!(refused_segment(&err(libc::EAGAIN), 1514), None);
    }
}
