//! `tap:IFNAME`: a Linux tap interface (needs CAP_NET_ADMIN), no
//! packet-information prefix, a virtio-net header on every frame
//! (`IFF_VNET_HDR`) and checksum/TSO offloads (`TUNSETOFFLOAD`): a flush's
//! consecutive segments of one TCP flow leave in one write, and the
//! kernel's super-frames and partial checksums are completed on receive
//! (`tso.rs`). A kernel that refuses the vnet header or the offloads
//! gets plain frames (logged, `uplink.vnet_hdr`/`uplink.offloads`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::tso::{self, VnetHdr, MAX_GSO_BUFS, MAX_HEADER, VNET_HDR_LEN};
use super::{Received, Uplink, RECV_BUF_LEN, SEND_BATCH};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
/// The vnet header's size until TUNSETVNETHDRSZ changes it.
const DEFAULT_VNET_HDR_LEN: usize = 10;
/// Room after a receive buffer: a super-frame of a 65,535-octet IP
/// datagram (plus Ethernet and VLAN headers) is a little over 64 KiB.
const TAIL_LEN: usize = 256;

/// The part of `struct ifreq` TUNSETIFF reads, padded to its full size.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

#[derive(Debug, Default)]
struct Counters {
    tso_sends: AtomicU64,
    tso_frames: AtomicU64,
    tso_refused: AtomicU64,
    gso_receives: AtomicU64,
    segmented_frames: AtomicU64,
    csum_completed: AtomicU64,
    bad_gso: AtomicU64,
    oversize: AtomicU64,
}

fn bump(c: &AtomicU64, by: usize) {
    c.fetch_add(u64::try_from(by).unwrap_or(u64::MAX), Ordering::Relaxed);
}

#[derive(Debug)]
pub struct TapUplink {
    file: File,
    /// Octets of vnet header on each frame (0: the kernel refused it).
    vnet_hdr: usize,
    /// TUNSETOFFLOAD took checksum and TSO offloads.
    offloads: bool,
    /// Coalesced sends are on (off after the kernel refused one).
    tso: AtomicBool,
    /// A received super-frame, gathered from its buffer and the tail to
    /// be cut (one receiving thread: the lock is never contended).
    scratch: Mutex<Vec<u8>>,
    counters: Counters,
}

impl TapUplink {
    /// Opens (creating if needed) `ifname` with a vnet header and offloads.
    pub fn open(ifname: &str) -> io::Result<Self> {
        Self::open_with(ifname, true)
    }

    /// Opens `ifname` without a vnet header: one plain frame per read and
    /// write (what the tap was before offloads; tests' plain peers).
    pub fn open_plain(ifname: &str) -> io::Result<Self> {
        Self::open_with(ifname, false)
    }

    fn open_with(ifname: &str, vnet: bool) -> io::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")?;
        let fd = file.as_raw_fd();
        let mut vnet_hdr = 0;
        if vnet {
            match set_iff(fd, ifname, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR) {
                Ok(()) => vnet_hdr = DEFAULT_VNET_HDR_LEN,
                Err(e) if e.kind() == io::ErrorKind::InvalidInput && ifname.len() < libc::IFNAMSIZ => {
                    log::warn!("tap {ifname}: no IFF_VNET_HDR ({e}): plain frames, no offloads");
                }
                Err(e) => return Err(e),
            }
        }
        if vnet_hdr == 0 {
            set_iff(fd, ifname, IFF_TAP | IFF_NO_PI)?;
        }
        let mut offloads = false;
        if vnet_hdr != 0 {
            let size = libc::c_int::try_from(VNET_HDR_LEN).unwrap_or(12);
            // SAFETY: TUNSETVNETHDRSZ reads a c_int through the pointer,
            // which points at `size`, live across the call.
            if unsafe { libc::ioctl(fd, TUNSETVNETHDRSZ, &size as *const libc::c_int) } == 0 {
                vnet_hdr = VNET_HDR_LEN;
            } else {
                log::warn!("tap {ifname}: TUNSETVNETHDRSZ: {}", io::Error::last_os_error());
            }
            let wanted = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
            // SAFETY: TUNSETOFFLOAD takes its flags by value; fd is open.
            offloads = unsafe { libc::ioctl(fd, TUNSETOFFLOAD, wanted) } == 0;
            if !offloads {
                log::warn!(
                    "tap {ifname}: TUNSETOFFLOAD refused ({}): the kernel segments and checksums",
                    io::Error::last_os_error()
                );
            }
        }
        Ok(Self {
            file,
            vnet_hdr,
            offloads,
            tso: AtomicBool::new(vnet_hdr != 0),
            scratch: Mutex::new(if vnet_hdr != 0 { vec![0; RECV_BUF_LEN + TAIL_LEN] } else { Vec::new() }),
            counters: Counters::default(),
        })
    }

    /// Writes `iovs` as one frame.
    fn writev(&self, iovs: &[libc::iovec]) -> io::Result<()> {
        let count = libc::c_int::try_from(iovs.len()).unwrap_or(0);
        // SAFETY: every iovec describes a live buffer the caller holds
        // across the call; the kernel only reads them (a write).
        let rc = unsafe { libc::writev(self.file.as_raw_fd(), iovs.as_ptr(), count) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Sends `frame` alone with a zero vnet header (when there is one).
    fn write_single(&self, frame: &[u8]) -> io::Result<()> {
        let zero = [0u8; VNET_HDR_LEN];
        let hdr = zero.get(..self.vnet_hdr).unwrap_or_default();
        self.writev(&[iovec(hdr), iovec(frame)])
    }

    /// Sends `frames` (a run `tso::plan` accepted) as one super-frame:
    /// the vnet header, the built headers, then each payload in place.
    fn write_coalesced(&self, frames: &[&[u8]]) -> io::Result<()> {
        let mut head = [0u8; MAX_HEADER];
        let Some((hdr, header_len)) = tso::super_header(frames, &mut head) else {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        let vnet = hdr.to_bytes();
        let mut iovs = [iovec(&[]); SEND_BATCH + 2];
        let mut n = 0;
        let parts = [vnet.get(..self.vnet_hdr).unwrap_or_default(), head.get(..header_len).unwrap_or_default()];
        let payloads = frames.iter().map(|f| f.get(header_len..).unwrap_or_default());
        for (slot, part) in iovs.iter_mut().zip(parts.into_iter().chain(payloads)) {
            *slot = iovec(part);
            n += 1;
        }
        self.writev(iovs.get(..n).unwrap_or_default())
    }

    /// Reads one frame with its vnet header: the frame fills `buf`, then
    /// `tail`. `Ok(None)` when nothing is pending.
    fn readv(&self, hdr: &mut [u8; VNET_HDR_LEN], buf: &mut [u8], tail: &mut [u8]) -> io::Result<Option<usize>> {
        let mut iovs = [
            libc::iovec { iov_base: hdr.as_mut_ptr().cast(), iov_len: self.vnet_hdr },
            libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() },
            libc::iovec { iov_base: tail.as_mut_ptr().cast(), iov_len: tail.len() },
        ];
        // SAFETY: the iovecs describe `hdr` (vnet_hdr ≤ its size), `buf`
        // and `tail`, exclusively borrowed across the call.
        let rc = unsafe { libc::readv(self.file.as_raw_fd(), iovs.as_mut_ptr(), 3) };
        if rc < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
        }
        Ok(Some(usize::try_from(rc).unwrap_or(0)))
    }

    /// Handles a received frame of `len` octets (in `bufs[0]` and `tail`)
    /// with vnet header `hdr`: a super-frame is cut into `bufs`, a partial
    /// checksum completed. Returns the buffers filled (0: dropped).
    fn receive(
        &self,
        hdr: &VnetHdr,
        len: usize,
        tail: &[u8],
        bufs: &mut [Vec<u8>],
        received: &mut [Received],
    ) -> usize {
        let c = &self.counters;
        let in_buf = bufs.first().map_or(0, Vec::len);
        if len > in_buf + tail.len() {
            bump(&c.oversize, 1); // truncated by the read
            return 0;
        }
        if hdr.gso_type != tso::GSO_NONE {
            let Ok(mut scratch) = self.scratch.lock() else { return 0 };
            let (Some(src), Some(first)) = (scratch.get_mut(..len), bufs.first()) else {
                bump(&c.oversize, 1);
                return 0;
            };
            let (head, rest) = src.split_at_mut(len.min(in_buf));
            head.copy_from_slice(first.get(..head.len()).unwrap_or_default());
            rest.copy_from_slice(tail.get(..rest.len()).unwrap_or_default());
            return match tso::segment(hdr, src, bufs, received) {
                Ok(done) => {
                    bump(&c.gso_receives, 1);
                    bump(&c.segmented_frames, done.frames);
                    done.buffers
                }
                Err(e) => {
                    log::debug!("tap: dropped a GSO frame: {e}");
                    bump(&c.bad_gso, 1);
                    0
                }
            };
        }
        let (Some(buf), Some(slot)) = (bufs.first_mut(), received.first_mut()) else { return 0 };
        let Some(frame) = buf.get_mut(..len) else {
            bump(&c.oversize, 1);
            return 0;
        };
        if hdr.flags & tso::F_NEEDS_CSUM != 0 {
            if let Err(e) = tso::complete_checksum(frame, hdr) {
                log::debug!("tap: dropped a frame: {e}");
                bump(&c.bad_gso, 1);
                return 0;
            }
            bump(&c.csum_completed, 1);
        }
        *slot = Received::single(len);
        1
    }
}

/// An iovec for a buffer the kernel only reads.
fn iovec(b: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: b.as_ptr().cast_mut().cast(), iov_len: b.len() }
}

/// TUNSETIFF: attaches `fd` to tap `ifname` with `flags`.
fn set_iff(fd: RawFd, ifname: &str, flags: libc::c_short) -> io::Result<()> {
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags, _pad: [0; 22] };
    let name = ifname.as_bytes();
    // Leave room for the terminating NUL.
    let dst = req
        .name
        .get_mut(..name.len())
        .filter(|_| name.len() < libc::IFNAMSIZ)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "interface name too long"))?;
    dst.copy_from_slice(name);
    // SAFETY: TUNSETIFF reads a `struct ifreq`; `req` is a live, properly
    // sized and initialised value for the duration of the call.
    let ret = unsafe { libc::ioctl(fd, TUNSETIFF, &mut req as *mut IfReq) };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

impl Uplink for TapUplink {
    fn send(&self, frame: &[u8]) -> io::Result<()> {
        self.write_single(frame)
    }

    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let mut sent = 0;
        while let Some(rest) = frames.get(sent..).filter(|r| !r.is_empty()) {
            let count = if self.tso.load(Ordering::Relaxed) { tso::plan(rest).max(1) } else { 1 };
            let run = rest.get(..count).unwrap_or_default();
            let result = match run {
                [frame] => self.write_single(frame),
                _ => self.write_coalesced(run),
            };
            match result {
                Ok(()) => {
                    if count > 1 {
                        bump(&self.counters.tso_sends, 1);
                        bump(&self.counters.tso_frames, count);
                    }
                    sent += count;
                }
                Err(e) if count > 1 && e.raw_os_error() == Some(libc::EINVAL) => {
                    // The kernel takes no TSO from us: frames go one by one.
                    log::warn!("tap: coalesced send refused ({e}): TSO off");
                    self.tso.store(false, Ordering::Relaxed);
                    bump(&self.counters.tso_refused, 1);
                }
                Err(e) => {
                    return if sent == 0 && e.kind() != io::ErrorKind::WouldBlock { Err(e) } else { Ok(sent) };
                }
            }
        }
        Ok(sent)
    }

    fn recv_batch(&self, bufs: &mut [Vec<u8>], received: &mut [Received]) -> io::Result<usize> {
        let room = bufs.len().min(received.len());
        let mut filled = 0;
        let mut tail = [0u8; TAIL_LEN];
        // Bounded even when every frame is dropped: a flood of bad frames
        // must not keep the worker here.
        for _ in 0..room.saturating_mul(2) {
            // Stop while a segmented super-frame still surely fits.
            if filled >= room || (filled > 0 && room - filled < MAX_GSO_BUFS) {
                break;
            }
            let mut hdr = [0u8; VNET_HDR_LEN];
            let (Some(buf), Some(_)) = (bufs.get_mut(filled), received.get(filled)) else { break };
            let read = match self.readv(&mut hdr, buf, &mut tail) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(e) if filled == 0 => return Err(e),
                Err(_) => break,
            };
            let Some(len) = read.checked_sub(self.vnet_hdr) else { continue };
            let hdr = VnetHdr::parse(&hdr);
            let (Some(bufs), Some(received)) = (bufs.get_mut(filled..), received.get_mut(filled..)) else { break };
            filled += self.receive(&hdr, len, &tail, bufs, received);
        }
        Ok(filled)
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        vec![
            ("vnet_hdr", u64::try_from(self.vnet_hdr).unwrap_or(0)),
            ("offloads", u64::from(self.offloads)),
            ("tso_sends", get(&c.tso_sends)),
            ("tso_frames", get(&c.tso_frames)),
            ("tso_refused", get(&c.tso_refused)),
            ("gso_receives", get(&c.gso_receives)),
            ("segmented_frames", get(&c.segmented_frames)),
            ("csum_completed", get(&c.csum_completed)),
            ("bad_gso", get(&c.bad_gso)),
            ("oversize_drops", get(&c.oversize)),
        ]
    }
}

impl AsRawFd for TapUplink {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

#[cfg(test)]
#[path = "tap_tests.rs"]
mod tests;
