//! Who may drive the device (vt3_hw.h, "Who may drive the device"): the
//! session a HELLO starts, and the counter and MAC every control frame
//! carries both ways. Any guest process can send and sniff raw frames, so
//! no frame counts for what it says; only the guest kernel knows the
//! session key (in a kernel page) and the virtqueue addresses that prove
//! a HELLO came from it.

use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip::SipHasher24;
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemory};

use crate::abi::{
    self, CmdHello, CtrlHdr, MsgType, RingAddrs, SessionPage, VT3_CTRL_MAC_LEN, VT3_CTRL_REPLAY_WINDOW,
    VT3_CTRL_VERSION, VT3_SESSION_MAGIC,
};

/// SipHash-2-4 key words k0, k1.
pub type Key = [u64; 2];

const HDR: usize = std::mem::size_of::<CtrlHdr>();

/// The guest's virtqueues as vt3d was told over vhost-user: what a HELLO
/// must name to prove it comes from the guest kernel.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct QueueAddrs {
    pub rx: RingAddrs,
    pub tx: RingAddrs,
}

/// Why a control frame was refused. Each has a counter in
/// `vt3d ctl stats` (`ctrl_refused_<name>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Too short for its header, payload and MAC.
    Short,
    /// Another control protocol version.
    Version,
    /// Not a command (vt3d sends responses and events; it takes none).
    NotCommand,
    /// A command before any session.
    NoSession,
    /// The MAC does not match the session key.
    Mac,
    /// A counter already taken, or too far behind.
    Replay,
    /// A HELLO that names the wrong virtqueues or no valid session page.
    Hello,
}

impl Refusal {
    pub const ALL: [Refusal; 7] = [
        Refusal::Short,
        Refusal::Version,
        Refusal::NotCommand,
        Refusal::NoSession,
        Refusal::Mac,
        Refusal::Replay,
        Refusal::Hello,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Refusal::Short => "short",
            Refusal::Version => "version",
            Refusal::NotCommand => "not_command",
            Refusal::NoSession => "no_session",
            Refusal::Mac => "mac",
            Refusal::Replay => "replay",
            Refusal::Hello => "hello",
        }
    }
}

/// Counters of the control channel, shared with `vt3d ctl stats`.
#[derive(Debug, Default)]
pub struct ChannelStats {
    refused: [AtomicU64; Refusal::ALL.len()],
    /// Sessions started by a valid HELLO.
    pub sessions: AtomicU64,
}

impl ChannelStats {
    /// Counts a refusal; returns how many of its kind there are now.
    pub fn refuse(&self, why: Refusal) -> u64 {
        self.refused.get(why as usize).map_or(0, |c| c.fetch_add(1, Ordering::Relaxed) + 1)
    }

    pub fn refused(&self, why: Refusal) -> u64 {
        self.refused.get(why as usize).map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub fn rows(&self) -> Vec<(String, u64)> {
        let mut rows = vec![("ctrl_sessions".to_string(), self.sessions.load(Ordering::Relaxed))];
        rows.extend(Refusal::ALL.iter().map(|r| (format!("ctrl_refused_{}", r.name()), self.refused(*r))));
        rows
    }
}

/// SipHash-2-4 of `bytes` under `key`, as the kernel's `siphash()`.
pub fn mac(key: &Key, bytes: &[u8]) -> u64 {
    let mut h = SipHasher24::new_with_keys(key[0], key[1]);
    h.write(bytes);
    h.finish()
}

/// The counters a receiver has taken: the highest, and which of the
/// [`VT3_CTRL_REPLAY_WINDOW`] below it (bit i: highest - i).
#[derive(Debug, Clone, Copy)]
pub struct ReplayWindow {
    highest: u64,
    seen: u64,
}

impl Default for ReplayWindow {
    /// Counter 0 counts as taken: senders start at 1.
    fn default() -> Self {
        Self { highest: 0, seen: 1 }
    }
}

impl ReplayWindow {
    /// Takes `counter` if it is new and not too old.
    pub fn take(&mut self, counter: u64) -> bool {
        if counter > self.highest {
            let shift = counter - self.highest;
            self.seen = if shift >= VT3_CTRL_REPLAY_WINDOW { 0 } else { self.seen << shift };
            self.seen |= 1;
            self.highest = counter;
            return true;
        }
        let behind = self.highest - counter;
        if behind >= VT3_CTRL_REPLAY_WINDOW || self.seen & (1 << behind) != 0 {
            return false;
        }
        self.seen |= 1 << behind;
        true
    }
}

/// One end's keys and counters.
#[derive(Debug, Clone)]
pub struct Session {
    key: Key,
    received: ReplayWindow,
    sent: u64,
}

/// A control message as it arrived: header and payload, not yet checked.
#[derive(Debug, Clone, Copy)]
pub struct Sealed<'a> {
    pub hdr: CtrlHdr,
    pub payload: &'a [u8],
    covered: &'a [u8],
    mac: u64,
}

/// Splits the control part of a frame (after the Ethernet header) into
/// header, payload and MAC; Ethernet padding may follow.
pub fn unseal(ctrl: &[u8]) -> Result<Sealed<'_>, Refusal> {
    let hdr: CtrlHdr = abi::read_struct(ctrl).ok_or(Refusal::Short)?;
    if hdr.version != VT3_CTRL_VERSION {
        return Err(Refusal::Version);
    }
    let end = HDR + usize::from(hdr.len.to_native());
    let covered = ctrl.get(..end).ok_or(Refusal::Short)?;
    let tag = ctrl.get(end..end + VT3_CTRL_MAC_LEN).ok_or(Refusal::Short)?;
    let mut mac = [0u8; VT3_CTRL_MAC_LEN];
    mac.copy_from_slice(tag);
    Ok(Sealed { hdr, payload: covered.get(HDR..).unwrap_or_default(), covered, mac: u64::from_le_bytes(mac) })
}

impl Session {
    pub fn new(key: Key) -> Self {
        Self { key, received: ReplayWindow::default(), sent: 0 }
    }

    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Checks a message's MAC, then takes its counter.
    pub fn open(&mut self, m: &Sealed<'_>) -> Result<(), Refusal> {
        if mac(&self.key, m.covered) != m.mac {
            return Err(Refusal::Mac);
        }
        if !self.received.take(m.hdr.counter.to_native()) {
            return Err(Refusal::Replay);
        }
        Ok(())
    }

    /// The control part of a frame: `hdr` as given but for the next
    /// counter, then `payload` (its length is the caller's `hdr.len`) and
    /// the MAC of both.
    pub fn seal(&mut self, mut hdr: CtrlHdr, payload: &[u8]) -> Vec<u8> {
        self.sent += 1;
        hdr.counter = self.sent.into();
        let mut out = Vec::with_capacity(HDR + payload.len() + VT3_CTRL_MAC_LEN);
        out.extend_from_slice(hdr.as_slice());
        out.extend_from_slice(payload);
        let tag = mac(&self.key, &out);
        out.extend_from_slice(&tag.to_le_bytes());
        out
    }
}

/// A header of this protocol version for `len` payload bytes (the
/// counter is the sealer's).
pub fn header(kind: MsgType, opcode: u16, seq: u32, status: u16, len: usize) -> CtrlHdr {
    CtrlHdr {
        version: VT3_CTRL_VERSION,
        r#type: kind as u8,
        opcode: opcode.into(),
        seq: seq.into(),
        status: status.into(),
        len: u16::try_from(len).unwrap_or(u16::MAX).into(),
        reserved: 0.into(),
        counter: 0.into(),
    }
}

/// Checks a HELLO against the guest's virtqueues and reads its session
/// key from the page it names. vt3d wipes the page's magic once it has
/// the key, so a HELLO replayed while the page still exists is refused.
pub fn accept_hello<M: GuestMemory>(mem: &M, m: &Sealed<'_>, queues: &QueueAddrs) -> Result<Session, Refusal> {
    let hello: CmdHello = abi::read_struct(m.payload).ok_or(Refusal::Hello)?;
    if hello.rx != queues.rx || hello.tx != queues.tx {
        return Err(Refusal::Hello);
    }
    let at = GuestAddress(hello.session_page.to_native());
    let page: SessionPage = mem.read_obj(at).map_err(|_| Refusal::Hello)?;
    if page.magic.to_native() != VT3_SESSION_MAGIC || page.version.to_native() != u32::from(VT3_CTRL_VERSION) {
        return Err(Refusal::Hello);
    }
    let mut session = Session::new([page.key[0].to_native(), page.key[1].to_native()]);
    session.open(m).map_err(|_| Refusal::Hello)?;
    if let Err(e) = mem.write_obj(0u32, at) {
        log::warn!("could not wipe the session page at {:#x}: {e}", at.0);
    }
    Ok(session)
}

/// The driver's end of a session, as vt3.ko keeps it: for tests and for
/// host-side synthetic guests.
#[derive(Debug, Clone)]
pub struct DriverEnd {
    session: Session,
    seq: u32,
}

impl DriverEnd {
    pub fn new(key: Key) -> Self {
        Self { session: Session::new(key), seq: 0 }
    }

    /// Writes the session page at `page` and returns the HELLO's control
    /// part.
    pub fn hello<M: GuestMemory>(&mut self, mem: &M, page: u64, queues: &QueueAddrs) -> Vec<u8> {
        let key = self.session.key;
        let sp = SessionPage {
            magic: VT3_SESSION_MAGIC.into(),
            version: u32::from(VT3_CTRL_VERSION).into(),
            key: [key[0].into(), key[1].into()],
            reserved: 0.into(),
        };
        if let Err(e) = mem.write_obj(sp, GuestAddress(page)) {
            log::warn!("session page at {page:#x}: {e}");
        }
        let hello = CmdHello { session_page: page.into(), rx: queues.rx, tx: queues.tx };
        self.command(abi::Cmd::Hello as u16, hello.as_slice()).1
    }

    /// A sealed command: (its seq, the control part of the frame).
    pub fn command(&mut self, opcode: u16, payload: &[u8]) -> (u32, Vec<u8>) {
        self.seq = self.seq.wrapping_add(1);
        let hdr = header(MsgType::Cmd, opcode, self.seq, 0, payload.len());
        (self.seq, self.session.seal(hdr, payload))
    }

    /// Seals any header as the driver would (for hostile tests).
    pub fn seal(&mut self, hdr: CtrlHdr, payload: &[u8]) -> Vec<u8> {
        self.session.seal(hdr, payload)
    }

    /// Checks a response or event from vt3d (control part).
    pub fn open<'a>(&mut self, ctrl: &'a [u8]) -> Result<Sealed<'a>, Refusal> {
        let m = unseal(ctrl)?;
        self.session.open(&m)?;
        Ok(m)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    #[test]
    fn siphash_is_the_reference_siphash_2_4() {
        // The SipHash paper's vector: key 00..0f, message 00..0e.
        let key = [0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908];
        let msg: Vec<u8> = (0u8..15).collect();
        assert_eq!(mac(&key, &msg), 0xa129_ca61_49be_45e5);
        assert_eq!(mac(&key, &[]), 0x726f_db47_dd0e_0e31);
    }

    #[test]
    fn replay_window_takes_each_counter_once() {
        let mut w = ReplayWindow::default();
        assert!(!w.take(0), "0 is never sent");
        assert!(w.take(1));
        assert!(!w.take(1));
        assert!(w.take(5));
        assert!(w.take(3), "overtaken but new");
        assert!(!w.take(3));
        assert!(w.take(2) && w.take(4));
        assert!(w.take(100));
        assert!(!w.take(100 - VT3_CTRL_REPLAY_WINDOW), "too old");
        assert!(w.take(100 - VT3_CTRL_REPLAY_WINDOW + 1));
        assert!(w.take(100 + 2 * VT3_CTRL_REPLAY_WINDOW));
        assert!(!w.take(100), "fell out of the window");
    }

    #[test]
    fn sealed_frames_open_once_and_not_when_changed() {
        let key = [1, 2];
        let mut tx = Session::new(key);
        let mut rx = Session::new(key);
        let hdr = header(MsgType::Cmd, 4, 1, 0, 7);
        let f = tx.seal(hdr, b"payload");
        let m = unseal(&f).unwrap();
        assert_eq!(m.payload, b"payload");
        assert_eq!(rx.open(&m), Ok(()));
        assert_eq!(rx.open(&unseal(&f).unwrap()), Err(Refusal::Replay));
        for byte in 0..f.len() {
            let mut g = f.clone();
            g[byte] ^= 0x20;
            let refused = unseal(&g).and_then(|m| rx.open(&m));
            assert!(refused.is_err(), "byte {byte} flipped and still taken");
        }
        let mut other = Session::new([1, 3]);
        assert_eq!(other.open(&unseal(&tx.seal(header(MsgType::Cmd, 4, 2, 0, 1), b"x")).unwrap()), Err(Refusal::Mac));
        assert_eq!(unseal(&f[..f.len() - 1]).unwrap_err(), Refusal::Short);
    }
}
