//! The virtio-net datapath on split virtqueues: TX drain and RX delivery
//! (with `VIRTIO_NET_F_MRG_RXBUF`, a frame may span several RX chains).
//!
//! Everything here works on a bare [`Queue`] and any [`GuestMemory`], so the
//! same code runs under vhost-user and under `MockSplitQueue` in the tests.
//! Descriptor chains come from the guest and are untrusted: a malformed
//! chain is returned to the guest with used length 0 and counted.

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;

use thiserror::Error;
use virtio_queue::{DescriptorChain, Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, Permissions};

/// `struct virtio_net_hdr_v1` (virtio 1.x, or legacy with MRG_RXBUF).
pub const VNET_HDR_LEN: usize = 12;
/// Legacy header without `num_buffers`.
pub const VNET_HDR_LEN_LEGACY: usize = 10;
/// Byte offset of `num_buffers` (le16) in the header.
const NUM_BUFFERS_OFFSET: usize = 10;

/// Why a descriptor chain was refused.
#[derive(Debug, Error, Clone, Copy, PartialEq, Eq)]
pub enum ChainError {
    #[error("device-writable descriptor in a TX chain")]
    WritableInTx,
    #[error("device-readable descriptor in an RX chain")]
    ReadableInRx,
    #[error("descriptor outside guest memory")]
    BadAddress,
    #[error("chain ends in a dangling NEXT (bad index or loop)")]
    Truncated,
    #[error("TX chain shorter than the virtio-net header")]
    TooShort,
    #[error("TX frame of {len} bytes: longer than the configured MTU allows")]
    TooLong { len: usize },
    #[error("RX chain has no writable space")]
    Empty,
}

/// What the guest negotiated that shapes the datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetLayout {
    /// Size of the virtio-net header on every frame.
    pub hdr_len: usize,
    /// `VIRTIO_NET_F_MRG_RXBUF`: a frame may use several RX chains.
    pub mergeable: bool,
    /// Largest Ethernet frame (without the virtio-net header) accepted.
    pub max_frame: usize,
}

/// Result of one [`deliver_rx`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxOutcome {
    /// The frame is in guest memory, spread over this many chains.
    Delivered { buffers: u16 },
    /// Not enough RX buffers: nothing was consumed, retry after a kick.
    NoBuffers,
    /// The guest's buffers could not hold the frame (malformed chain in the
    /// middle of a frame, or a frame larger than one chain without
    /// MRG_RXBUF); every chain taken was returned with length 0.
    Dropped,
}

/// Counters reported by the datapath functions.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ChainStats {
    pub frames: u64,
    pub bytes: u64,
    pub malformed: u64,
    /// TX frames longer than the MTU allows (not malformed: refused), and
    /// the length of the last one.
    pub oversize: u64,
    pub oversize_len: usize,
    /// Deliveries that found no buffer (RX; the guest's kick resumes them).
    pub ring_empty: u64,
}

/// Reusable scratch space so the datapath allocates nothing per frame.
#[derive(Debug, Default)]
pub struct Scratch {
    frame: Vec<u8>,
    used: Vec<(u16, u32)>,
}

/// Why a queue can no longer be served. The guest broke the ring; only
/// re-initialising it (the frontend stops the ring and sets it up again)
/// makes it usable.
#[derive(Debug, Error)]
pub enum QueueError {
    #[error("available index {avail} is {ahead} entries ahead of the next one to take ({next}), in a ring of {size}")]
    AvailIndexBeyondRing { avail: u16, next: u16, ahead: u16, size: u16 },
    #[error("available index {avail} announces chains the ring does not give")]
    MissingChain { avail: u16 },
    #[error("ring access: {0}")]
    Ring(#[from] virtio_queue::Error),
}

/// How many chains the guest made available and the device has not taken
/// yet. More than the ring holds is impossible for a well-behaved driver:
/// the queue is broken (taking chains anyway would reprocess old entries,
/// and virtio-queue refuses them, so a retry loop would spin).
pub fn pending_chains<M: GuestMemory>(queue: &Queue, mem: &M) -> Result<u16, QueueError> {
    let avail = queue.avail_idx(mem, Ordering::Acquire)?.0;
    let next = queue.next_avail();
    let ahead = avail.wrapping_sub(next);
    let size = queue.size();
    if ahead > size {
        return Err(QueueError::AvailIndexBeyondRing { avail, next, ahead, size });
    }
    Ok(ahead)
}

/// Result of one [`drain_tx`] call.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TxDrain {
    /// Chains were returned (the caller then signals if
    /// `needs_notification` says so).
    pub used_any: bool,
    /// Stopped early (budget spent, or the sink asked to stop) with chains
    /// possibly left: guest notifications stay disabled and the caller
    /// must come back without waiting for a kick.
    pub more: bool,
}

/// Drains up to `budget` chains from the TX queue, handing each frame
/// (virtio-net header stripped) to `sink`, which may ask to stop after its
/// frame. Runs the EVENT_IDX-safe loop: notifications stay off while
/// draining and the queue is re-checked after re-enabling them. An
/// impossible available index is an error, never a retry.
pub fn drain_tx<M, F>(
    queue: &mut Queue,
    mem: &M,
    layout: &NetLayout,
    scratch: &mut Scratch,
    stats: &mut ChainStats,
    budget: usize,
    mut sink: F,
) -> Result<TxDrain, QueueError>
where
    M: GuestMemory,
    F: FnMut(&[u8]) -> ControlFlow<()>,
{
    let mut done = TxDrain::default();
    let mut taken = 0usize;
    loop {
        queue.disable_notification(mem)?;
        while pending_chains(queue, mem)? > 0 {
            if taken >= budget {
                done.more = true;
                return Ok(done);
            }
            let Some(chain) = queue.pop_descriptor_chain(mem) else {
                return Err(QueueError::MissingChain { avail: queue.avail_idx(mem, Ordering::Relaxed)?.0 });
            };
            taken += 1;
            let head = chain.head_index();
            let flow = match read_tx_chain(chain, mem, layout, &mut scratch.frame) {
                Ok(frame) => {
                    stats.frames += 1;
                    stats.bytes += frame.len() as u64;
                    sink(frame)
                }
                Err(ChainError::TooLong { len }) => {
                    stats.oversize += 1;
                    stats.oversize_len = len.saturating_sub(layout.hdr_len);
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    log::debug!("TX chain {head} refused: {e}");
                    stats.malformed += 1;
                    ControlFlow::Continue(())
                }
            };
            queue.add_used(mem, head, 0)?;
            done.used_any = true;
            if flow.is_break() {
                done.more = true;
                return Ok(done);
            }
        }
        if !queue.enable_notification(mem)? {
            return Ok(done);
        }
    }
}

/// Copies one TX chain into `buf` and returns the Ethernet frame in it. A
/// chain longer than the MTU allows is read to its end (to learn its
/// length, copying nothing more) and refused as `TooLong`.
fn read_tx_chain<'b, M>(
    chain: DescriptorChain<&M>,
    mem: &M,
    layout: &NetLayout,
    buf: &'b mut Vec<u8>,
) -> Result<&'b [u8], ChainError>
where
    M: GuestMemory,
{
    let limit = layout.hdr_len + layout.max_frame;
    buf.clear();
    let mut last_has_next = false;
    let mut total = 0usize;
    for desc in chain {
        if desc.is_write_only() {
            return Err(ChainError::WritableInTx);
        }
        let start = total;
        total = total.saturating_add(desc.len() as usize);
        last_has_next = desc.has_next();
        if total > limit {
            continue;
        }
        buf.resize(total, 0);
        let dst = buf.get_mut(start..total).ok_or(ChainError::TooShort)?;
        mem.read_slice(dst, desc.addr()).map_err(|_| ChainError::BadAddress)?;
    }
    if last_has_next {
        return Err(ChainError::Truncated);
    }
    if total > limit {
        return Err(ChainError::TooLong { len: total });
    }
    buf.get(layout.hdr_len..).ok_or(ChainError::TooShort)
}

/// Writes `frame` (prefixed by a virtio-net header) into as many RX chains
/// as it needs. Nothing is consumed when the ring runs dry before the frame
/// fits, so the caller can keep the frame and retry after the next kick.
/// Malformed chains met before the frame's first good chain are returned
/// with length 0 and skipped.
pub fn deliver_rx<M>(
    queue: &mut Queue,
    mem: &M,
    layout: &NetLayout,
    scratch: &mut Scratch,
    stats: &mut ChainStats,
    frame: &[u8],
) -> Result<RxOutcome, QueueError>
where
    M: GuestMemory,
{
    let header = [0u8; VNET_HDR_LEN];
    let header = header.get(..layout.hdr_len).unwrap_or(&header);
    let src = TwoPart { head: header, tail: frame };
    let total = src.len();

    scratch.used.clear();
    let mut first_good: Option<u16> = None;
    let mut written = 0usize;
    let mut num_buffers_at = [None::<GuestAddress>; 2];

    while written < total {
        let position = queue.next_avail();
        let chain = match pending_chains(queue, mem) {
            Ok(0) => None,
            Ok(_) => match queue.pop_descriptor_chain(mem) {
                Some(chain) => Some(chain),
                None => return Err(QueueError::MissingChain { avail: queue.avail_idx(mem, Ordering::Relaxed)?.0 }),
            },
            Err(e) => return Err(e),
        };
        let Some(chain) = chain else {
            if let Some(p) = first_good {
                queue.set_next_avail(p);
            }
            return Ok(RxOutcome::NoBuffers);
        };
        let head = chain.head_index();
        match write_rx_chain(chain, mem, &src, written, &mut num_buffers_at) {
            Ok(n) => {
                first_good.get_or_insert(position);
                scratch.used.push((head, n));
                written += n as usize;
                if written < total && !layout.mergeable {
                    return return_all(queue, mem, scratch, None, stats);
                }
            }
            Err(e) => {
                log::debug!("RX chain {head} refused: {e}");
                if first_good.is_some() {
                    return return_all(queue, mem, scratch, Some(head), stats);
                }
                stats.malformed += 1;
                queue.add_used(mem, head, 0)?;
            }
        }
    }

    let buffers = u16::try_from(scratch.used.len()).unwrap_or(u16::MAX);
    if layout.hdr_len >= VNET_HDR_LEN {
        for (addr, byte) in num_buffers_at.iter().zip(buffers.to_le_bytes()) {
            if let Some(addr) = addr {
                // Checked writable when the chain was validated.
                let _ = mem.write_obj(byte, *addr);
            }
        }
    }
    for &(head, len) in &scratch.used {
        queue.add_used(mem, head, len)?;
    }
    stats.frames += 1;
    stats.bytes += frame.len() as u64;
    Ok(RxOutcome::Delivered { buffers })
}

/// Gives back every chain taken for a frame that cannot be delivered.
fn return_all<M>(
    queue: &mut Queue,
    mem: &M,
    scratch: &mut Scratch,
    bad_head: Option<u16>,
    stats: &mut ChainStats,
) -> Result<RxOutcome, QueueError>
where
    M: GuestMemory,
{
    for &(head, _) in &scratch.used {
        queue.add_used(mem, head, 0)?;
    }
    if let Some(head) = bad_head {
        stats.malformed += 1;
        queue.add_used(mem, head, 0)?;
    }
    Ok(RxOutcome::Dropped)
}

/// Header and frame seen as one byte stream without copying them together.
struct TwoPart<'a> {
    head: &'a [u8],
    tail: &'a [u8],
}

impl TwoPart<'_> {
    fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// The longest contiguous piece starting at `offset`, at most `max` long.
    fn piece(&self, offset: usize, max: usize) -> &[u8] {
        let (part, at) = match offset.checked_sub(self.head.len()) {
            None => (self.head, offset),
            Some(at) => (self.tail, at),
        };
        let rest = part.get(at..).unwrap_or(&[]);
        rest.get(..max.min(rest.len())).unwrap_or(rest)
    }
}

/// Fills one RX chain from `src` starting at `offset`; returns the bytes
/// written. Records where the `num_buffers` bytes landed.
fn write_rx_chain<M>(
    chain: DescriptorChain<&M>,
    mem: &M,
    src: &TwoPart<'_>,
    offset: usize,
    num_buffers_at: &mut [Option<GuestAddress>; 2],
) -> Result<u32, ChainError>
where
    M: GuestMemory,
{
    let mut capacity = 0usize;
    let mut pos = offset;
    let mut last_has_next = false;
    for desc in chain {
        if !desc.is_write_only() {
            return Err(ChainError::ReadableInRx);
        }
        let len = desc.len() as usize;
        if !mem.check_range(desc.addr(), len, Permissions::Write) {
            return Err(ChainError::BadAddress);
        }
        capacity += len;
        let mut done = 0usize;
        while done < len && pos < src.len() {
            let piece = src.piece(pos, len - done);
            let addr = desc.addr().checked_add(done as u64).ok_or(ChainError::BadAddress)?;
            for (i, slot) in num_buffers_at.iter_mut().enumerate() {
                let field = NUM_BUFFERS_OFFSET + i;
                if (pos..pos + piece.len()).contains(&field) {
                    *slot = addr.checked_add((field - pos) as u64);
                }
            }
            mem.write_slice(piece, addr).map_err(|_| ChainError::BadAddress)?;
            done += piece.len();
            pos += piece.len();
        }
        last_has_next = desc.has_next();
    }
    if last_has_next {
        return Err(ChainError::Truncated);
    }
    if capacity == 0 {
        return Err(ChainError::Empty);
    }
    u32::try_from(pos - offset).map_err(|_| ChainError::BadAddress)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use virtio_bindings::bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
    use virtio_queue::desc::{split::Descriptor as SplitDescriptor, RawDescriptor};
    use virtio_queue::mock::MockSplitQueue;
    use vm_memory::GuestMemoryMmap;

    const QSIZE: u16 = 16;
    const DATA: u64 = 0x10_0000;

    fn memory() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x100_0000)]).unwrap()
    }

    fn layout(mergeable: bool) -> NetLayout {
        NetLayout { hdr_len: VNET_HDR_LEN, mergeable, max_frame: 9018 }
    }

    fn desc(addr: u64, len: u32, flags: u32) -> RawDescriptor {
        RawDescriptor::from(SplitDescriptor::new(addr, len, flags as u16, 0))
    }

    /// Adds one chain per `lens` entry, each chain of one writable buffer.
    fn add_rx_buffers(q: &MockSplitQueue<GuestMemoryMmap>, lens: &[u32]) {
        let descs: Vec<_> = lens
            .iter()
            .enumerate()
            .map(|(i, &len)| desc(DATA + i as u64 * 0x1_0000, len, VRING_DESC_F_WRITE))
            .collect();
        q.add_desc_chains(&descs, 0).unwrap();
    }

    fn used(q: &MockSplitQueue<GuestMemoryMmap>, i: u16) -> (u32, u32) {
        let e = q.used().ring().ref_at(i as usize).unwrap().load();
        (e.id(), e.len())
    }

    fn frame(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    /// Runs `f` on its own thread and fails the test if it does not
    /// return within seconds: a regression to a spinning loop fails
    /// instead of hanging the suite.
    pub(super) fn with_watchdog<T: Send + 'static>(
        mem: GuestMemoryMmap,
        f: impl FnOnce(&GuestMemoryMmap) -> T + Send + 'static,
    ) -> T {
        let (done, result) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = done.send(f(&mem));
        });
        result
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("the datapath did not return: it spins on the ring")
    }

    mod rx {
        use super::*;

        #[test]
        fn single_buffer_frame() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_rx_buffers(&mq, &[2048]);
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let f = frame(1514);
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &f).unwrap();
            assert_eq!(out, RxOutcome::Delivered { buffers: 1 });
            assert_eq!(used(&mq, 0), (0, (VNET_HDR_LEN + 1514) as u32));
            let mut got = vec![0u8; VNET_HDR_LEN + 1514];
            mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
            assert_eq!(u16::from_le_bytes([got[10], got[11]]), 1);
            assert_eq!(&got[VNET_HDR_LEN..], &f[..]);
            assert_eq!(st, ChainStats { frames: 1, bytes: 1514, ..ChainStats::default() });
        }

        #[test]
        fn jumbo_frame_spans_mergeable_buffers() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_rx_buffers(&mq, &[1526; 8]);
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let f = frame(9014);
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &f).unwrap();
            // 12 + 9014 bytes in 1526-byte buffers: 6 buffers.
            assert_eq!(out, RxOutcome::Delivered { buffers: 6 });
            let mut got = Vec::new();
            for i in 0..6u16 {
                let (id, len) = used(&mq, i);
                assert_eq!(id, u32::from(i));
                let mut part = vec![0u8; len as usize];
                mem.read_slice(&mut part, GuestAddress(DATA + u64::from(i) * 0x1_0000)).unwrap();
                got.extend_from_slice(&part);
            }
            assert_eq!(u16::from_le_bytes([got[10], got[11]]), 6);
            assert_eq!(&got[VNET_HDR_LEN..], &f[..]);
            assert_eq!(q.next_avail(), 6);
        }

        #[test]
        fn header_split_across_descriptors() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            // One chain of three writable descriptors: 4 + 7 + 4096 bytes,
            // so num_buffers straddles the first two.
            let w = VRING_DESC_F_WRITE | VRING_DESC_F_NEXT;
            let descs = [desc(DATA, 4, w), desc(DATA + 0x100, 7, w), desc(DATA + 0x200, 4096, VRING_DESC_F_WRITE)];
            let mut descs = descs.to_vec();
            // Chain them: 0 -> 1 -> 2.
            descs[0] = RawDescriptor::from(SplitDescriptor::new(DATA, 4, w as u16, 1));
            descs[1] = RawDescriptor::from(SplitDescriptor::new(DATA + 0x100, 7, w as u16, 2));
            mq.add_desc_chains(&descs, 0).unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let f = frame(100);
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &f).unwrap();
            assert_eq!(out, RxOutcome::Delivered { buffers: 1 });
            let mut b10 = [0u8; 1];
            mem.read_slice(&mut b10, GuestAddress(DATA + 0x100 + 6)).unwrap();
            let mut b11 = [0u8; 1];
            mem.read_slice(&mut b11, GuestAddress(DATA + 0x200)).unwrap();
            assert_eq!((b10[0], b11[0]), (1, 0));
            let mut body = vec![0u8; 100];
            mem.read_slice(&mut body, GuestAddress(DATA + 0x201)).unwrap();
            assert_eq!(body, f);
        }

        #[test]
        fn too_few_buffers_consumes_nothing() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_rx_buffers(&mq, &[1526; 2]);
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(9000)).unwrap();
            assert_eq!(out, RxOutcome::NoBuffers);
            assert_eq!(q.next_avail(), 0);
            assert_eq!(mq.used().idx().load(), 0);
            // The same buffers still take a small frame afterwards.
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(60)).unwrap();
            assert_eq!(out, RxOutcome::Delivered { buffers: 1 });
        }

        #[test]
        fn empty_ring_is_no_buffers() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(60)).unwrap();
            assert_eq!(out, RxOutcome::NoBuffers);
        }

        #[test]
        fn too_short_buffer_without_mergeable_drops_frame() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_rx_buffers(&mq, &[64, 2048]);
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let out = deliver_rx(&mut q, &mem, &layout(false), &mut s, &mut st, &frame(1000)).unwrap();
            assert_eq!(out, RxOutcome::Dropped);
            assert_eq!(used(&mq, 0), (0, 0));
            let out = deliver_rx(&mut q, &mem, &layout(false), &mut s, &mut st, &frame(1000)).unwrap();
            assert_eq!(out, RxOutcome::Delivered { buffers: 1 });
            assert_eq!(used(&mq, 1), (1, 1012));
        }

        #[test]
        fn readable_chain_is_returned_and_skipped() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            let descs = [desc(DATA, 2048, 0), desc(DATA + 0x1_0000, 2048, VRING_DESC_F_WRITE)];
            mq.add_desc_chains(&descs, 0).unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(60)).unwrap();
            assert_eq!(out, RxOutcome::Delivered { buffers: 1 });
            assert_eq!(used(&mq, 0), (0, 0));
            assert_eq!(used(&mq, 1), (1, 72));
            assert_eq!(st.malformed, 1);
        }

        #[test]
        fn buffer_outside_guest_memory_is_returned() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            let descs = [desc(0xffff_ffff_0000, 2048, VRING_DESC_F_WRITE), desc(DATA, 2048, VRING_DESC_F_WRITE)];
            mq.add_desc_chains(&descs, 0).unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(60)).unwrap();
            assert_eq!(out, RxOutcome::Delivered { buffers: 1 });
            assert_eq!(used(&mq, 0), (0, 0));
            assert_eq!(st.malformed, 1);
        }

        #[test]
        fn malformed_chain_inside_a_frame_drops_it_whole() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            let descs = [
                desc(DATA, 1526, VRING_DESC_F_WRITE),
                desc(DATA + 0x1_0000, 1526, 0),
                desc(DATA + 0x2_0000, 1526, VRING_DESC_F_WRITE),
            ];
            mq.add_desc_chains(&descs, 0).unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(3000)).unwrap();
            assert_eq!(out, RxOutcome::Dropped);
            assert_eq!((used(&mq, 0), used(&mq, 1)), ((0, 0), (1, 0)));
            assert_eq!(mq.used().idx().load(), 2);
        }

        #[test]
        fn dangling_next_is_malformed() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            // NEXT points past the end of the descriptor table.
            let bad = RawDescriptor::from(SplitDescriptor::new(
                DATA,
                2048,
                (VRING_DESC_F_WRITE | VRING_DESC_F_NEXT) as u16,
                QSIZE + 5,
            ));
            mq.add_desc_chains(&[bad], 0).unwrap();
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let out = deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(60)).unwrap();
            assert_eq!(out, RxOutcome::NoBuffers);
            assert_eq!(used(&mq, 0), (0, 0));
            assert_eq!(st.malformed, 1);
        }

        #[test]
        fn rx_avail_index_beyond_ring_is_an_error() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_rx_buffers(&mq, &[2048; 2]);
            mq.avail().idx().store(2 + QSIZE);
            let mut q: Queue = mq.create_queue().unwrap();
            let result = with_watchdog(mem.clone(), move |mem| {
                let (mut s, mut st) = (Scratch::default(), ChainStats::default());
                deliver_rx(&mut q, mem, &layout(true), &mut s, &mut st, &frame(60))
            });
            assert!(matches!(result, Err(QueueError::AvailIndexBeyondRing { ahead: 18, .. })), "{result:?}");
            assert_eq!(mq.used().idx().load(), 0);
        }

        #[test]
        fn event_idx_notification_follows_used_event() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_rx_buffers(&mq, &[2048; 4]);
            let mut q: Queue = mq.create_queue().unwrap();
            q.set_event_idx(true);
            // The mock lays the used ring over the avail ring's used_event
            // slot; move the used ring out of the way.
            q.set_used_ring_address(Some(0x8000), Some(0));
            // used_event = 1: notify once the used index passes 1.
            let used_event = mq.avail_addr().unchecked_add(4 + 2 * u64::from(QSIZE));
            mem.write_obj(1u16, used_event).unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(60)).unwrap();
            assert!(!q.needs_notification(&mem).unwrap());
            deliver_rx(&mut q, &mem, &layout(true), &mut s, &mut st, &frame(60)).unwrap();
            assert!(q.needs_notification(&mem).unwrap());
        }
    }

    mod tx {
        use super::*;

        fn drain(
            mq: &MockSplitQueue<GuestMemoryMmap>,
            mem: &GuestMemoryMmap,
            layout: &NetLayout,
        ) -> (Vec<Vec<u8>>, ChainStats, bool) {
            let mut q: Queue = mq.create_queue().unwrap();
            q.set_event_idx(true);
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let mut frames = Vec::new();
            let done = drain_tx(&mut q, mem, layout, &mut s, &mut st, usize::MAX, |f| {
                frames.push(f.to_vec());
                ControlFlow::Continue(())
            })
            .unwrap();
            assert!(!done.more);
            (frames, st, done.used_any)
        }

        /// Adds `n` good one-descriptor TX chains of 72 bytes (60-byte frames).
        fn add_tx_frames(mq: &MockSplitQueue<GuestMemoryMmap>, mem: &GuestMemoryMmap, n: u16) {
            let descs: Vec<_> = (0..n)
                .map(|i| {
                    let addr = DATA + u64::from(i) * 0x1000;
                    put(mem, addr, &[i as u8; 72]);
                    desc(addr, 72, 0)
                })
                .collect();
            mq.add_desc_chains(&descs, 0).unwrap();
        }

        #[test]
        fn tx_avail_index_beyond_ring_marks_queue_broken() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_tx_frames(&mq, &mem, 2);
            // One write by the guest: the available index a ring and more ahead.
            mq.avail().idx().store(QSIZE + 3);
            let mut q: Queue = mq.create_queue().unwrap();
            q.set_event_idx(true);
            let result = with_watchdog(mem.clone(), move |mem| {
                let (mut s, mut st) = (Scratch::default(), ChainStats::default());
                drain_tx(&mut q, mem, &layout(true), &mut s, &mut st, usize::MAX, |_| ControlFlow::Continue(()))
                    .map(|_| ())
            });
            assert!(
                matches!(result, Err(QueueError::AvailIndexBeyondRing { avail: 19, next: 0, ahead: 19, size: QSIZE })),
                "{result:?}"
            );
            assert_eq!(mq.used().idx().load(), 0, "nothing taken from a broken ring");
        }

        #[test]
        fn budget_leaves_the_rest_for_the_next_call() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_tx_frames(&mq, &mem, 10);
            let mut q: Queue = mq.create_queue().unwrap();
            q.set_event_idx(true);
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let mut frames = 0;
            let mut count = |_: &[u8]| {
                frames += 1;
                ControlFlow::Continue(())
            };
            let done = drain_tx(&mut q, &mem, &layout(true), &mut s, &mut st, 4, &mut count).unwrap();
            assert_eq!(done, TxDrain { used_any: true, more: true });
            assert_eq!((mq.used().idx().load(), q.next_avail()), (4, 4));
            let done = drain_tx(&mut q, &mem, &layout(true), &mut s, &mut st, 4, &mut count).unwrap();
            assert_eq!(done, TxDrain { used_any: true, more: true });
            let done = drain_tx(&mut q, &mem, &layout(true), &mut s, &mut st, 4, &mut count).unwrap();
            assert_eq!(done, TxDrain { used_any: true, more: false });
            assert_eq!(frames, 10);
            assert_eq!(mq.used().idx().load(), 10);
        }

        #[test]
        fn sink_can_stop_the_drain_after_its_frame() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            add_tx_frames(&mq, &mem, 5);
            let mut q: Queue = mq.create_queue().unwrap();
            let (mut s, mut st) = (Scratch::default(), ChainStats::default());
            let mut seen = 0;
            let done = drain_tx(&mut q, &mem, &layout(true), &mut s, &mut st, usize::MAX, |_| {
                seen += 1;
                if seen == 2 {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .unwrap();
            assert_eq!((done.more, seen, mq.used().idx().load()), (true, 2, 2));
        }

        fn put(mem: &GuestMemoryMmap, addr: u64, bytes: &[u8]) {
            mem.write_slice(bytes, GuestAddress(addr)).unwrap();
        }

        #[test]
        fn frames_are_stripped_of_the_header() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            let f = frame(1514);
            let mut with_hdr = vec![0u8; VNET_HDR_LEN];
            with_hdr.extend_from_slice(&f);
            put(&mem, DATA, &with_hdr);
            // Header and frame split over two descriptors of one chain.
            let descs = [
                RawDescriptor::from(SplitDescriptor::new(DATA, 20, VRING_DESC_F_NEXT as u16, 1)),
                desc(DATA + 20, (with_hdr.len() - 20) as u32, 0),
            ];
            mq.add_desc_chains(&descs, 0).unwrap();
            let (frames, st, used_any) = drain(&mq, &mem, &layout(true));
            assert!(used_any);
            assert_eq!(frames, vec![f]);
            assert_eq!(st, ChainStats { frames: 1, bytes: 1514, ..ChainStats::default() });
            assert_eq!(used(&mq, 0), (0, 0));
        }

        #[test]
        fn malformed_chains_are_returned_with_zero_length() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            put(&mem, DATA + 0x3_0000, &[0u8; 72]);
            let descs = [
                desc(DATA, 100, VRING_DESC_F_WRITE), // writable in TX
                desc(0xffff_ffff_0000, 100, 0),      // outside memory
                desc(DATA + 0x2_0000, 8, 0),         // shorter than the header
                desc(DATA, 12 + 9018 + 1, 0),        // longer than the MTU
                desc(DATA + 0x3_0000, 72, 0),        // good
            ];
            mq.add_desc_chains(&descs, 0).unwrap();
            let (frames, st, _) = drain(&mq, &mem, &layout(true));
            assert_eq!(frames.len(), 1);
            assert_eq!(frames[0].len(), 60);
            // The frame over the MTU is not malformed: refused, with its length.
            assert_eq!((st.malformed, st.oversize, st.oversize_len), (3, 1, 9019));
            for i in 0..5u16 {
                assert_eq!(used(&mq, i), (u32::from(i), 0));
            }
        }

        #[test]
        fn empty_queue_uses_nothing() {
            let mem = memory();
            let mq = MockSplitQueue::new(&mem, QSIZE);
            let (frames, _, used_any) = drain(&mq, &mem, &layout(true));
            assert!(frames.is_empty());
            assert!(!used_any);
        }

        #[test]
        fn indirect_chain_is_read() {
            // The mock puts indirect tables at 0x3000_0000.
            let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 0x3100_0000)]).unwrap();
            let mut mq = MockSplitQueue::new(&mem, QSIZE);
            // The mock builds an indirect chain of 3 descriptors of 0x1000
            // readable bytes at its own addresses; we only check the size.
            mq.add_indirect_chain(3).unwrap();
            let big = NetLayout { max_frame: 16384, ..layout(true) };
            let (frames, st, _) = drain(&mq, &mem, &big);
            assert_eq!(st.malformed, 0, "{st:?}");
            assert_eq!(frames.len(), 1);
            assert_eq!(frames[0].len(), 3 * 0x1000 - VNET_HDR_LEN);
        }
    }
}
