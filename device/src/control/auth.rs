//! Who may drive the device (docs/security.md): the
//! first contact that proves both ends hold the provisioned key, the
//! session key it derives, and the counter and MAC every control frame
//! carries both ways. Any guest process can send and sniff raw frames and
//! fill guest memory, so no frame and no guest page counts for what it
//! says; only the key, which never crosses the wire, does.

use std::collections::VecDeque;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};

use siphasher::sip::SipHasher24;
use vm_memory::ByteValued;

use crate::abi::{
    self, CmdHello, CmdProve, CtrlHdr, KdfInput, MsgType, RespHello, Status, VT3_CHALLENGE_TTL_MS, VT3_CTRL_MAC_LEN,
    VT3_CTRL_REPLAY_WINDOW, VT3_CTRL_VERSION, VT3_HELLO_BURST, VT3_HELLO_RATE, VT3_KDF_LABEL_K0, VT3_KDF_LABEL_K1,
    VT3_KEY_LEN, VT3_NONCE_LEN,
};

/// SipHash-2-4 key words k0, k1.
pub type Key = [u64; 2];

/// A first contact's nonce, one per side.
pub type Nonce = [u8; VT3_NONCE_LEN];

/// The key words of `VT3_KEY_LEN` raw bytes (little endian).
pub fn key_from_bytes(bytes: &[u8; VT3_KEY_LEN]) -> Key {
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(bytes.get(i..i + 8).unwrap_or(&[0; 8]));
        u64::from_le_bytes(w)
    };
    [word(0), word(8)]
}

/// A fresh random nonce from the operating system; none if it has no
/// random bytes to give (then no challenge is issued: a fixed nonce would
/// make it predictable).
pub fn random_nonce() -> Option<Nonce> {
    let mut n = [0u8; VT3_NONCE_LEN];
    match getrandom::fill(&mut n) {
        Ok(()) => Some(n),
        Err(e) => {
            log::error!("no random bytes from the operating system: {e}");
            None
        }
    }
}

/// The session key both ends derive from the provisioned key and the two
/// nonces (`vt3_kdf_input`).
pub fn session_key(key: &Key, driver_nonce: &Nonce, device_nonce: &Nonce) -> Key {
    let word = |label: &str| {
        let mut input = KdfInput { driver_nonce: *driver_nonce, device_nonce: *device_nonce, ..Default::default() };
        for (dst, src) in input.label.iter_mut().zip(label.bytes()) {
            *dst = src;
        }
        mac(key, input.as_slice())
    };
    [word(VT3_KDF_LABEL_K0), word(VT3_KDF_LABEL_K1)]
}

const HDR: usize = std::mem::size_of::<CtrlHdr>();

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
    /// A HELLO or PROVE that fails its shape or its MAC, or a PROVE for
    /// no challenge vt3d issued (or one too old).
    Hello,
    /// A HELLO whose driver nonce vt3d has seen, or a PROVE of a challenge
    /// already used.
    HelloReplay,
    /// A HELLO or PROVE dropped unchecked: too many were refused lately.
    HelloLimited,
}

impl Refusal {
    pub const ALL: [Refusal; 9] = [
        Refusal::Short,
        Refusal::Version,
        Refusal::NotCommand,
        Refusal::NoSession,
        Refusal::Mac,
        Refusal::Replay,
        Refusal::Hello,
        Refusal::HelloReplay,
        Refusal::HelloLimited,
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
            Refusal::HelloReplay => "hello_replay",
            Refusal::HelloLimited => "hello_limited",
        }
    }
}

/// Counters of the control channel, shared with `vt3d ctl stats`.
#[derive(Debug, Default)]
pub struct ChannelStats {
    refused: [AtomicU64; Refusal::ALL.len()],
    /// Sessions started by a proven first contact.
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
    pub fn seal(&mut self, hdr: CtrlHdr, payload: &[u8]) -> Vec<u8> {
        self.sent += 1;
        self.seal_with_counter(hdr, payload, self.sent)
    }

    fn seal_with_counter(&self, mut hdr: CtrlHdr, payload: &[u8], counter: u64) -> Vec<u8> {
        hdr.counter = counter.into();
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

/// Seals a first-contact frame under the provisioned key: counter 0
/// (no session's counter), MAC under `key`.
fn seal_under(key: &Key, hdr: CtrlHdr, payload: &[u8]) -> Vec<u8> {
    Session::new(*key).seal_with_counter(hdr, payload, 0)
}

/// The refusals a first contact may cost before vt3d stops looking at
/// HELLOs and PROVEs: a bucket of `VT3_HELLO_BURST` tokens refilled at
/// `VT3_HELLO_RATE` a second (in thousandths of a token per ms).
#[derive(Debug, Clone, Copy)]
struct RefusalBucket {
    milli_tokens: u64,
    at_ms: u64,
}

impl RefusalBucket {
    const FULL: u64 = VT3_HELLO_BURST * 1000;

    fn new(now_ms: u64) -> Self {
        Self { milli_tokens: Self::FULL, at_ms: now_ms }
    }

    fn refill(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.at_ms);
        self.at_ms = self.at_ms.max(now_ms);
        self.milli_tokens = self.milli_tokens.saturating_add(elapsed.saturating_mul(VT3_HELLO_RATE)).min(Self::FULL);
    }

    /// Whether a refusal may still be afforded.
    fn has_token(&mut self, now_ms: u64) -> bool {
        self.refill(now_ms);
        self.milli_tokens >= 1000
    }

    fn spend(&mut self) {
        self.milli_tokens = self.milli_tokens.saturating_sub(1000);
    }
}

/// A challenge vt3d answered a HELLO with.
#[derive(Debug, Clone, Copy)]
struct Challenge {
    driver_nonce: Nonce,
    device_nonce: Nonce,
    issued_ms: u64,
    used: bool,
}

/// Challenges remembered: a replayed HELLO within the last this many is
/// known as one (older ones get a fresh challenge, which is as useless to
/// whoever lacks the key).
const RECENT_CHALLENGES: usize = 64;

/// The device's side of the first contact (docs/security.md, steps 1-4). It never
/// touches a live session: it hands the channel a new one only for a
/// PROVE of a challenge it issued.
#[derive(Debug)]
pub struct FirstContact {
    key: Key,
    recent: VecDeque<Challenge>,
    bucket: RefusalBucket,
}

impl FirstContact {
    pub fn new(key: Key, now_ms: u64) -> Self {
        Self { key, recent: VecDeque::with_capacity(RECENT_CHALLENGES), bucket: RefusalBucket::new(now_ms) }
    }

    /// Step 2: the answer to a HELLO (the control part of the frame), with
    /// `device_nonce` as the challenge.
    pub fn hello(&mut self, m: &Sealed<'_>, device_nonce: Nonce, now_ms: u64) -> Result<Vec<u8>, Refusal> {
        self.limited(now_ms, |this| this.check_hello(m, device_nonce, now_ms))
    }

    /// Step 4: the session a PROVE proves.
    pub fn prove(&mut self, m: &Sealed<'_>, now_ms: u64) -> Result<Session, Refusal> {
        self.limited(now_ms, |this| this.check_prove(m, now_ms))
    }

    /// Runs a check if the bucket affords a refusal; a refusal spends a
    /// token. Past the bucket, frames are dropped unchecked: a flood costs
    /// vt3d no more than counting.
    fn limited<T>(&mut self, now_ms: u64, check: impl FnOnce(&mut Self) -> Result<T, Refusal>) -> Result<T, Refusal> {
        if !self.bucket.has_token(now_ms) {
            return Err(Refusal::HelloLimited);
        }
        let result = check(self);
        if result.is_err() {
            self.bucket.spend();
        }
        result
    }

    fn check_hello(&mut self, m: &Sealed<'_>, device_nonce: Nonce, now_ms: u64) -> Result<Vec<u8>, Refusal> {
        let hello: CmdHello = exact_payload(m)?;
        if m.hdr.counter.to_native() != 0 || mac(&self.key, m.covered) != m.mac {
            return Err(Refusal::Hello);
        }
        if self.recent.iter().any(|c| c.driver_nonce == hello.driver_nonce) {
            return Err(Refusal::HelloReplay);
        }
        if self.recent.len() == RECENT_CHALLENGES {
            self.recent.pop_front();
        }
        self.recent.push_back(Challenge {
            driver_nonce: hello.driver_nonce,
            device_nonce,
            issued_ms: now_ms,
            used: false,
        });
        let answer = RespHello { driver_nonce: hello.driver_nonce, device_nonce };
        let hdr = header(
            MsgType::Resp,
            abi::Cmd::Hello as u16,
            m.hdr.seq.to_native(),
            Status::Ok as u16,
            std::mem::size_of::<RespHello>(),
        );
        Ok(seal_under(&self.key, hdr, answer.as_slice()))
    }

    fn check_prove(&mut self, m: &Sealed<'_>, now_ms: u64) -> Result<Session, Refusal> {
        let prove: CmdProve = exact_payload(m)?;
        let key = self.key;
        let challenge = self
            .recent
            .iter_mut()
            .find(|c| c.driver_nonce == prove.driver_nonce && c.device_nonce == prove.device_nonce)
            .ok_or(Refusal::Hello)?;
        if challenge.used {
            return Err(Refusal::HelloReplay);
        }
        if now_ms.saturating_sub(challenge.issued_ms) > VT3_CHALLENGE_TTL_MS {
            return Err(Refusal::Hello);
        }
        let mut session = Session::new(session_key(&key, &challenge.driver_nonce, &challenge.device_nonce));
        // The PROVE is the new session's first frame: counter 1, MAC under Ks.
        if m.hdr.counter.to_native() != 1 {
            return Err(Refusal::Hello);
        }
        session.open(m).map_err(|_| Refusal::Hello)?;
        challenge.used = true;
        Ok(session)
    }
}

/// A first-contact payload of exactly its struct's size.
fn exact_payload<T: ByteValued + Default>(m: &Sealed<'_>) -> Result<T, Refusal> {
    if m.payload.len() != std::mem::size_of::<T>() {
        return Err(Refusal::Hello);
    }
    abi::read_struct(m.payload).ok_or(Refusal::Hello)
}

/// The driver's end of a session, as vt3.ko keeps it: for tests and for
/// host-side synthetic guests. Until its first contact is proven it holds
/// only the provisioned key.
#[derive(Debug, Clone)]
pub struct DriverEnd {
    key: Key,
    /// The nonce of the HELLO waiting for its answer.
    pending: Option<Nonce>,
    session: Session,
    seq: u32,
}

impl DriverEnd {
    pub fn new(key: Key) -> Self {
        Self { key, pending: None, session: Session::new(key), seq: 0 }
    }

    /// Step 1: a HELLO with a fresh nonce (the control part of the frame).
    pub fn hello(&mut self) -> Vec<u8> {
        self.hello_with(random_nonce().unwrap_or_default())
    }

    /// A HELLO with a chosen nonce (for tests that replay one).
    pub fn hello_with(&mut self, driver_nonce: Nonce) -> Vec<u8> {
        self.pending = Some(driver_nonce);
        self.seq = self.seq.wrapping_add(1);
        let hello = CmdHello { driver_nonce };
        let hdr = header(MsgType::Cmd, abi::Cmd::Hello as u16, self.seq, 0, std::mem::size_of::<CmdHello>());
        seal_under(&self.key, hdr, hello.as_slice())
    }

    /// Step 3: checks vt3d's answer to the pending HELLO, starts the new
    /// session and returns its first command, the PROVE (control part).
    pub fn prove(&mut self, answer: &[u8]) -> Result<(u32, Vec<u8>), Refusal> {
        let m = unseal(answer)?;
        let resp: RespHello = exact_payload(&m)?;
        let pending = self.pending.ok_or(Refusal::Hello)?;
        if m.hdr.r#type != MsgType::Resp as u8
            || m.hdr.opcode.to_native() != abi::Cmd::Hello as u16
            || m.hdr.counter.to_native() != 0
            || mac(&self.key, m.covered) != m.mac
            || resp.driver_nonce != pending
        {
            return Err(Refusal::Hello);
        }
        self.pending = None;
        self.session = Session::new(session_key(&self.key, &pending, &resp.device_nonce));
        let prove = CmdProve { driver_nonce: pending, device_nonce: resp.device_nonce };
        Ok(self.command(abi::Cmd::Prove as u16, prove.as_slice()))
    }

    /// The whole first contact: `exchange` takes a control part to vt3d
    /// and gives back the control part of its answer, if one came.
    pub fn handshake(&mut self, mut exchange: impl FnMut(Vec<u8>) -> Option<Vec<u8>>) -> Result<(), Refusal> {
        let answer = exchange(self.hello()).ok_or(Refusal::Hello)?;
        let (_, prove) = self.prove(&answer)?;
        let reply = exchange(prove).ok_or(Refusal::Hello)?;
        let m = self.open(&reply)?;
        if m.hdr.status.to_native() != Status::Ok as u16 {
            return Err(Refusal::Hello);
        }
        Ok(())
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
