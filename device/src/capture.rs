//! Wire capture: a pcapng file of every frame on the uplink, both ways
//! (`vt3d serve --pcap FILE`, `vt3d ctl capture start FILE | stop`).
//!
//! The uplink is wrapped in a [`TappedUplink`], so a frame is recorded
//! where it really crosses the wire: every frame the guest sends, every
//! frame the TOE sends for an offloaded iWARP connection, every frame the
//! uplink delivers (whether the guest, the TOE or nobody takes it). Each
//! is an Enhanced Packet Block with a nanosecond timestamp and the
//! direction in its flags (inbound: from the wire, outbound: to it).
//!
//! The worker never waits for the file: it copies the frame into a
//! bounded queue ([`MAX_QUEUED_FRAMES`] frames, [`MAX_QUEUED_BYTES`]
//! octets) and a writer thread writes it with the `pcap-file` crate. A full
//! queue drops the frame (counted, `capture.dropped`); a write error is
//! logged and counted (`capture.write_errors`) and ends the capture, the
//! file holding what was written before it.

use std::borrow::Cow;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pcap_file::pcapng::blocks::enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption};
use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::{DataLink, PcapError};
use thiserror::Error;

use crate::uplink::{Received, Uplink};

/// Frames waiting for the writer thread at most.
pub const MAX_QUEUED_FRAMES: usize = 4096;
/// Octets of frames waiting for the writer thread at most.
pub const MAX_QUEUED_BYTES: usize = 16 << 20;
/// Longest frame stored whole (the uplink's receive buffer is 64 KiB; the
/// largest MTU is 65,000): longer ones are cut, with their real length.
pub const SNAPLEN: u32 = 65_535;

/// Which way a frame crossed the uplink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// From the wire to vt3d.
    Inbound,
    /// From vt3d to the wire.
    Outbound,
}

impl Direction {
    /// The EPB `epb_flags` word: bits 0-1 are the direction (1 inbound,
    /// 2 outbound), the rest unknown (0).
    pub fn epb_flags(self) -> u32 {
        match self {
            Self::Inbound => 1,
            Self::Outbound => 2,
        }
    }

    /// The direction an `epb_flags` word names, if any.
    pub fn from_epb_flags(flags: u32) -> Option<Self> {
        match flags & 3 {
            1 => Some(Self::Inbound),
            2 => Some(Self::Outbound),
            _ => None,
        }
    }
}

#[derive(Debug, Error)]
pub enum CaptureError {
    #[error("a capture is running already (to {})", .0.display())]
    Running(PathBuf),
    #[error("no capture is running")]
    NotRunning,
    #[error("cannot create {}: {source}", path.display())]
    Create { path: PathBuf, source: io::Error },
    #[error("cannot write the pcapng header to {}: {source}", path.display())]
    Header { path: PathBuf, source: io::Error },
    #[error("cannot start the capture writer: {0}")]
    Thread(io::Error),
}

/// The capture's counters (`capture.*` in `vt3d ctl stats`).
#[derive(Debug, Default)]
pub struct CaptureStats {
    /// Frames and octets written to capture files.
    pub frames: AtomicU64,
    pub bytes: AtomicU64,
    /// Frames not captured because the writer was behind (queue full).
    pub dropped: AtomicU64,
    /// Write errors (each ended its capture).
    pub write_errors: AtomicU64,
    /// Captures started.
    pub started: AtomicU64,
}

/// How one capture ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub path: PathBuf,
    /// Frames written to this file.
    pub frames: u64,
    /// Frames of this capture dropped because the writer was behind.
    pub dropped: u64,
    /// The write error that ended it early, if one did.
    pub error: Option<String>,
}

impl std::fmt::Display for Finished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "capture to {} stopped: {} frames written", self.path.display(), self.frames)?;
        if self.dropped > 0 {
            write!(f, ", {} dropped (writer behind)", self.dropped)?;
        }
        if let Some(e) = &self.error {
            write!(f, "; it had ended early on a write error: {e}")?;
        }
        Ok(())
    }
}

/// What the worker and the writer thread share.
#[derive(Debug, Default)]
struct Shared {
    /// A capture takes frames (false once its writer failed).
    active: AtomicBool,
    queued_bytes: AtomicUsize,
    /// Frames of the current capture dropped (queue full).
    session_dropped: AtomicU64,
    stats: CaptureStats,
}

/// One frame on its way to the file.
#[derive(Debug)]
struct Record {
    at: Duration,
    direction: Direction,
    data: Vec<u8>,
}

#[derive(Debug)]
struct Session {
    path: PathBuf,
    queue: SyncSender<Record>,
    writer: JoinHandle<Result<u64, (u64, String)>>,
}

/// The capture of one NIC's uplink: off, or writing one file.
#[derive(Debug, Default)]
pub struct Capture {
    shared: Arc<Shared>,
    session: Mutex<Option<Session>>,
    /// The uplink as the file's interface describes it (its spec).
    interface: Mutex<String>,
}

impl Capture {
    pub fn stats(&self) -> &CaptureStats {
        &self.shared.stats
    }

    /// A capture is taking frames.
    pub fn is_active(&self) -> bool {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// The file being written, if a capture runs.
    pub fn path(&self) -> Option<PathBuf> {
        self.session().as_ref().filter(|s| !s.writer.is_finished()).map(|s| s.path.clone())
    }

    /// Names the uplink in the files written from now on (e.g. its
    /// `--uplink` spec).
    pub fn describe(&self, interface: &str) {
        *self.interface.lock().unwrap_or_else(PoisonError::into_inner) = interface.to_owned();
    }

    fn session(&self) -> MutexGuard<'_, Option<Session>> {
        self.session.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts writing `path` (created or truncated). A capture that ended
    /// on a write error is reaped first.
    pub fn start(&self, path: &Path) -> Result<(), CaptureError> {
        self.begin(path, || File::create(path).map_err(|source| CaptureError::Create { path: path.to_owned(), source }))
    }

    /// [`Capture::start`] onto any writer (`path` only names it).
    pub fn start_with<W: Write + Send + 'static>(&self, path: &Path, out: W) -> Result<(), CaptureError> {
        self.begin(path, || Ok(out))
    }

    /// Opens the output with `open` once no other capture runs.
    fn begin<W: Write + Send + 'static>(
        &self,
        path: &Path,
        open: impl FnOnce() -> Result<W, CaptureError>,
    ) -> Result<(), CaptureError> {
        let mut session = self.session();
        if let Some(running) = session.as_ref() {
            if !running.writer.is_finished() {
                return Err(CaptureError::Running(running.path.clone()));
            }
        }
        if let Some(old) = session.take() {
            log::info!("{}", self.reap(old));
        }
        let out = open()?;
        let mut interface = self.interface.lock().unwrap_or_else(PoisonError::into_inner).clone();
        if interface.is_empty() {
            interface = "vt3d uplink".to_owned();
        }
        let header = |source| CaptureError::Header { path: path.to_owned(), source };
        let mut writer = PcapNgWriter::new(BufWriter::new(out)).map_err(|e| header(io_error(e)))?;
        let idb = InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: SNAPLEN,
            options: vec![
                InterfaceDescriptionOption::IfName(Cow::Borrowed("vt3d-uplink")),
                InterfaceDescriptionOption::IfDescription(Cow::Owned(interface)),
                // Timestamps in nanoseconds (the crate writes them so).
                InterfaceDescriptionOption::IfTsResol(9),
            ],
        };
        writer.write_pcapng_block(idb).map_err(|e| header(io_error(e)))?;
        writer.get_mut().flush().map_err(header)?;
        let (queue, frames) = mpsc::sync_channel(MAX_QUEUED_FRAMES);
        let shared = Arc::clone(&self.shared);
        let name = path.display().to_string();
        let writer = thread::Builder::new()
            .name("vt3d-capture".into())
            .spawn(move || write_frames(writer, &frames, &shared, &name))
            .map_err(CaptureError::Thread)?;
        self.shared.queued_bytes.store(0, Ordering::Relaxed);
        self.shared.session_dropped.store(0, Ordering::Relaxed);
        self.shared.stats.started.fetch_add(1, Ordering::Relaxed);
        self.shared.active.store(true, Ordering::Release);
        *session = Some(Session { path: path.to_owned(), queue, writer });
        log::info!("capturing the uplink to {}", path.display());
        Ok(())
    }

    /// Stops the capture: what was queued is written and the file closed.
    pub fn stop(&self) -> Result<Finished, CaptureError> {
        let old = {
            let mut session = self.session();
            self.shared.active.store(false, Ordering::Release);
            session.take().ok_or(CaptureError::NotRunning)?
        };
        let finished = self.reap(old);
        log::info!("{finished}");
        Ok(finished)
    }

    fn reap(&self, session: Session) -> Finished {
        let Session { path, queue, writer } = session;
        drop(queue);
        let (frames, error) = match writer.join() {
            Ok(Ok(frames)) => (frames, None),
            Ok(Err((frames, e))) => (frames, Some(e)),
            Err(_) => (0, Some("the writer thread panicked".to_owned())),
        };
        Finished { path, frames, dropped: self.shared.session_dropped.load(Ordering::Relaxed), error }
    }

    /// Records one frame if a capture runs; never waits, never fails (a
    /// frame the writer has no room for is dropped and counted).
    pub fn record(&self, direction: Direction, frame: &[u8]) {
        if !self.shared.active.load(Ordering::Acquire) {
            return;
        }
        let at = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        let len = frame.len();
        let queued = self.shared.queued_bytes.fetch_add(len, Ordering::Relaxed);
        if queued.saturating_add(len) > MAX_QUEUED_BYTES {
            self.shared.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            self.count_dropped();
            return;
        }
        let record = Record { at, direction, data: frame.to_vec() };
        let sent = match self.session().as_ref() {
            Some(session) => session.queue.try_send(record),
            None => Err(TrySendError::Disconnected(record)),
        };
        match sent {
            Ok(()) => {}
            // The writer is behind: this frame is not captured.
            Err(TrySendError::Full(_)) => {
                self.shared.queued_bytes.fetch_sub(len, Ordering::Relaxed);
                self.count_dropped();
            }
            // The capture ended under us (stopped, or its writer failed).
            Err(TrySendError::Disconnected(_)) => {
                self.shared.queued_bytes.fetch_sub(len, Ordering::Relaxed);
            }
        }
    }

    fn count_dropped(&self) {
        self.shared.stats.dropped.fetch_add(1, Ordering::Relaxed);
        self.shared.session_dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// The counters as `(name, value)` rows.
    pub fn rows(&self) -> [(&'static str, u64); 6] {
        let s = &self.shared.stats;
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("active", u64::from(self.is_active())),
            ("started", g(&s.started)),
            ("frames", g(&s.frames)),
            ("bytes", g(&s.bytes)),
            ("dropped", g(&s.dropped)),
            ("write_errors", g(&s.write_errors)),
        ]
    }
}

/// The I/O error inside the crate's error (its own text says "reading"
/// for every I/O error).
fn io_error(e: PcapError) -> io::Error {
    match e {
        PcapError::IoError(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

/// The writer thread: writes queued frames until the queue is closed,
/// flushing whenever it runs dry (so the file is current while idle).
/// Returns the frames written, and the error that ended it early.
fn write_frames<W: Write>(
    mut writer: PcapNgWriter<BufWriter<W>>,
    frames: &Receiver<Record>,
    shared: &Shared,
    name: &str,
) -> Result<u64, (u64, String)> {
    let mut written = 0u64;
    let fail = |written: u64, e: io::Error| {
        shared.active.store(false, Ordering::Release);
        shared.stats.write_errors.fetch_add(1, Ordering::Relaxed);
        log::error!("capture to {name}: write error, capture stopped after {written} frames: {e}");
        Err((written, e.to_string()))
    };
    loop {
        let record = match frames.try_recv() {
            Ok(record) => record,
            Err(TryRecvError::Empty) => {
                if let Err(e) = writer.get_mut().flush() {
                    return fail(written, e);
                }
                match frames.recv() {
                    Ok(record) => record,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        let len = record.data.len();
        shared.queued_bytes.fetch_sub(len, Ordering::Relaxed);
        let original_len = u32::try_from(len).unwrap_or(u32::MAX);
        let kept = record.data.get(..len.min(SNAPLEN as usize)).unwrap_or_default();
        let epb = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: record.at,
            original_len,
            data: Cow::Borrowed(kept),
            options: vec![EnhancedPacketOption::Flags(record.direction.epb_flags())],
        };
        if let Err(e) = writer.write_pcapng_block(epb) {
            return fail(written, io_error(e));
        }
        written += 1;
        shared.stats.frames.fetch_add(1, Ordering::Relaxed);
        shared.stats.bytes.fetch_add(len as u64, Ordering::Relaxed);
    }
    if let Err(e) = writer.get_mut().flush() {
        return fail(written, e);
    }
    Ok(written)
}

/// An uplink whose frames are also recorded by a [`Capture`]: the frames
/// it sends (outbound) and the frames it receives (inbound).
#[derive(Debug)]
pub struct TappedUplink {
    inner: Box<dyn Uplink>,
    capture: Arc<Capture>,
}

impl TappedUplink {
    pub fn new(inner: Box<dyn Uplink>, capture: Arc<Capture>) -> Self {
        Self { inner, capture }
    }
}

impl AsRawFd for TappedUplink {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl Uplink for TappedUplink {
    fn send(&self, frame: &[u8]) -> io::Result<()> {
        self.inner.send(frame)?;
        self.capture.record(Direction::Outbound, frame);
        Ok(())
    }

    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        let sent = self.inner.send_batch(frames)?;
        for frame in frames.iter().take(sent) {
            self.capture.record(Direction::Outbound, frame);
        }
        Ok(sent)
    }

    fn recv_batch(&self, bufs: &mut [Vec<u8>], received: &mut [Received]) -> io::Result<usize> {
        let n = self.inner.recv_batch(bufs, received)?;
        for (buf, got) in bufs.iter().zip(received.iter()).take(n) {
            for frame in got.frames(buf) {
                self.capture.record(Direction::Inbound, frame);
            }
        }
        Ok(n)
    }

    fn counters(&self) -> Vec<(&'static str, u64)> {
        self.inner.counters()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;
    use pcap_file::pcapng::{Block, PcapNgReader};

    /// Reads a capture file back: (direction, frame) per packet.
    fn read_back(path: &Path) -> Vec<(Direction, Vec<u8>)> {
        let mut reader = PcapNgReader::new(File::open(path).unwrap()).unwrap();
        let mut out = Vec::new();
        while let Some(block) = reader.next_block() {
            if let Block::EnhancedPacket(epb) = block.unwrap() {
                let flags = epb.options.iter().find_map(|o| match o {
                    EnhancedPacketOption::Flags(f) => Some(*f),
                    _ => None,
                });
                assert_eq!(epb.original_len as usize, epb.data.len());
                assert!(epb.timestamp > Duration::from_secs(1_600_000_000), "a wall-clock timestamp");
                out.push((Direction::from_epb_flags(flags.unwrap()).unwrap(), epb.data.into_owned()));
            }
        }
        assert_eq!(reader.interfaces().len(), 1);
        assert_eq!(reader.interfaces()[0].linktype, DataLink::ETHERNET);
        assert!(reader.interfaces()[0].options.contains(&InterfaceDescriptionOption::IfTsResol(9)));
        out
    }

    fn frame(n: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| n.wrapping_add(i as u8)).collect()
    }

    /// An uplink that hands out queued frames and keeps what it is sent.
    #[derive(Debug, Default)]
    struct Wire {
        incoming: Mutex<Vec<Vec<u8>>>,
        sent: Mutex<Vec<Vec<u8>>>,
    }

    impl AsRawFd for Wire {
        fn as_raw_fd(&self) -> RawFd {
            -1
        }
    }

    impl Uplink for Wire {
        fn send(&self, frame: &[u8]) -> io::Result<()> {
            self.sent.lock().unwrap().push(frame.to_vec());
            Ok(())
        }
        fn recv_batch(&self, bufs: &mut [Vec<u8>], received: &mut [Received]) -> io::Result<usize> {
            crate::uplink::receive_one(bufs, received, |buf| {
                let mut incoming = self.incoming.lock().unwrap();
                if incoming.is_empty() {
                    return Ok(None);
                }
                let f = incoming.remove(0);
                buf[..f.len()].copy_from_slice(&f);
                Ok(Some(f.len()))
            })
        }
    }

    #[test]
    fn frames_in_both_directions_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wire.pcapng");
        let capture = Arc::new(Capture::default());
        let wire = Wire::default();
        wire.incoming.lock().unwrap().extend([frame(1, 60), frame(2, 1514), frame(3, 61)]);
        let uplink = TappedUplink::new(Box::new(wire), Arc::clone(&capture));

        uplink.send(&frame(9, 100)).unwrap(); // before the capture: not recorded
        capture.describe("unix-dgram:/a,/b");
        capture.start(&path).unwrap();
        assert!(capture.is_active());
        assert_eq!(capture.path(), Some(path.clone()));
        uplink.send(&frame(10, 64)).unwrap();
        let mut bufs = vec![vec![0; 2048]; 4];
        let mut received = vec![Received::default(); 4];
        assert_eq!(uplink.recv_batch(&mut bufs, &mut received).unwrap(), 1);
        assert_eq!(received[0], Received::single(60));
        assert_eq!(uplink.send_batch(&[&frame(11, 70), &frame(12, 9014)]).unwrap(), 2);
        assert_eq!(uplink.recv_batch(&mut bufs, &mut received).unwrap(), 1);
        let finished = capture.stop().unwrap();
        assert_eq!((finished.frames, finished.dropped, finished.error.as_deref()), (5, 0, None));
        assert!(!capture.is_active());
        uplink.send(&frame(13, 100)).unwrap(); // after: not recorded

        let got = read_back(&path);
        let want = vec![
            (Direction::Outbound, frame(10, 64)),
            (Direction::Inbound, frame(1, 60)),
            (Direction::Outbound, frame(11, 70)),
            (Direction::Outbound, frame(12, 9014)),
            (Direction::Inbound, frame(2, 1514)),
        ];
        assert_eq!(got, want);
        let rows = capture.rows();
        assert_eq!(rows[2], ("frames", 5));
        assert_eq!(rows[3], ("bytes", 64 + 60 + 70 + 9014 + 1514));
    }

    #[test]
    fn start_stop_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a.pcapng"), dir.path().join("b.pcapng"));
        let capture = Capture::default();
        assert!(matches!(capture.stop(), Err(CaptureError::NotRunning)));
        capture.start(&a).unwrap();
        capture.record(Direction::Outbound, &frame(1, 60));
        let err = capture.start(&b).unwrap_err();
        assert!(matches!(&err, CaptureError::Running(p) if *p == a), "{err}");
        assert!(err.to_string().contains("a.pcapng"));
        assert!(!b.exists(), "a refused start creates nothing");
        assert_eq!(capture.stop().unwrap().frames, 1);
        assert!(matches!(capture.stop(), Err(CaptureError::NotRunning)));
        capture.record(Direction::Inbound, &frame(2, 60)); // off: ignored
        capture.start(&b).unwrap();
        capture.record(Direction::Inbound, &frame(3, 60));
        capture.record(Direction::Outbound, &frame(4, 61));
        assert_eq!(capture.stop().unwrap().frames, 2);
        // The same file again: truncated, a new capture.
        capture.start(&a).unwrap();
        capture.record(Direction::Inbound, &frame(5, 62));
        capture.stop().unwrap();
        assert_eq!(read_back(&a), vec![(Direction::Inbound, frame(5, 62))]);
        assert_eq!(read_back(&b), vec![(Direction::Inbound, frame(3, 60)), (Direction::Outbound, frame(4, 61))]);
        assert_eq!(capture.rows()[1], ("started", 3));
    }

    #[test]
    fn an_unwritable_path_is_a_clear_error() {
        let capture = Capture::default();
        let path = Path::new("/nonexistent-vt3-dir/x.pcapng");
        let err = capture.start(path).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, CaptureError::Create { .. }));
        assert!(
            text.contains("cannot create /nonexistent-vt3-dir/x.pcapng") && text.contains("No such file"),
            "{text}"
        );
        assert!(!capture.is_active());
        // A full disk at the start: the header cannot be written.
        let err = capture.start(Path::new("/dev/full")).unwrap_err();
        assert!(matches!(err, CaptureError::Header { .. }), "{err}");
        assert!(err.to_string().contains("No space left"), "{err}");
        assert!(!capture.is_active());
    }

    /// A writer that takes `room` octets, then fails like a full disk.
    #[derive(Debug)]
    struct FillsUp {
        room: usize,
    }

    impl Write for FillsUp {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::from_raw_os_error(libc::ENOSPC));
            }
            let n = buf.len().min(self.room);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_error_stops_the_capture_cleanly() {
        let capture = Capture::default();
        capture.start_with(Path::new("full.pcapng"), FillsUp { room: 20_000 }).unwrap();
        // The worker goes on recording; the writer fails once the room is
        // used and the capture turns itself off.
        for i in 0..200u8 {
            capture.record(Direction::Outbound, &frame(i, 1514));
            if !capture.is_active() {
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
        for _ in 0..500 {
            if !capture.is_active() {
                break;
            }
            thread::sleep(Duration::from_millis(2));
        }
        assert!(!capture.is_active());
        assert_eq!(capture.path(), None);
        assert_eq!(capture.stats().write_errors.load(Ordering::Relaxed), 1);
        capture.record(Direction::Outbound, &frame(0, 60)); // ignored, no panic
        let finished = capture.stop().unwrap();
        assert!(finished.error.as_deref().unwrap().contains("No space left"), "{finished}");
        assert!(finished.frames < 20, "{finished}");
        // A new capture can start after the failed one.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("again.pcapng");
        capture.start(&path).unwrap();
        capture.record(Direction::Inbound, &frame(7, 60));
        capture.stop().unwrap();
        assert_eq!(read_back(&path), vec![(Direction::Inbound, frame(7, 60))]);
    }

    /// A writer that blocks until told to go on (a stalled disk).
    #[derive(Debug)]
    struct Stalled(Arc<(Mutex<bool>, std::sync::Condvar)>);

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (lock, cv) = &*self.0;
            let mut go = lock.lock().unwrap();
            while !*go {
                go = cv.wait(go).unwrap();
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_writer_never_holds_up_the_worker() {
        let gate = Arc::new((Mutex::new(true), std::sync::Condvar::new()));
        let capture = Capture::default();
        capture.start_with(Path::new("stalled.pcapng"), Stalled(Arc::clone(&gate))).unwrap();
        *gate.0.lock().unwrap() = false;
        // Far more than the queue holds, by frames and by octets: every
        // call returns at once; the excess is dropped and counted.
        let big = frame(0, 9000);
        for _ in 0..(MAX_QUEUED_BYTES / big.len() + 100) {
            capture.record(Direction::Inbound, &big);
        }
        for _ in 0..(MAX_QUEUED_FRAMES + 100) {
            capture.record(Direction::Inbound, &frame(1, 60));
        }
        let dropped = capture.stats().dropped.load(Ordering::Relaxed);
        assert!(dropped >= 200, "dropped {dropped}");
        *gate.0.lock().unwrap() = true;
        gate.1.notify_all();
        let finished = capture.stop().unwrap();
        assert_eq!(finished.dropped, dropped);
        assert!(finished.frames > 0 && finished.error.is_none(), "{finished}");
    }
}
