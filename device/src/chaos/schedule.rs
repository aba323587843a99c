//! A chaos run's schedule: which fault, with which parameters, when, and
//! the draw `r` that picks its connection. The draws come from a ChaCha8
//! PRNG seeded with the run's seed and nothing else (never the device's
//! state), so a seed names one schedule: the same seed and the same order
//! of connections hit the same targets.

use std::str::FromStr;

use rand::rngs::ChaCha8Rng;
use rand::{RngExt, SeedableRng};
use serde_json::{json, Value};
use vt3_iwarp::engine::Fault;
use vt3_iwarp::toe::{Duration, Split};
use vt3_iwarp::wire::terminate::TermCode;

use super::ChaosError;

/// Highest `--rate`: at 100 faults/s the runner's 50 ms tick still sees
/// every connection between faults; more is a storm, not a schedule.
pub const MAX_RATE: f64 = 100.0;

/// Faults per second: finite, above 0, at most [`MAX_RATE`].
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd)]
pub struct Rate(f64);

// Never NaN: `Rate::new` refuses it, so equality is an equivalence.
impl Eq for Rate {}

impl Rate {
    pub fn new(per_s: f64) -> Result<Self, ChaosError> {
        if per_s.is_finite() && per_s > 0.0 && per_s <= MAX_RATE {
            Ok(Self(per_s))
        } else {
            Err(ChaosError::Rate(per_s.to_string()))
        }
    }

    pub fn per_s(self) -> f64 {
        self.0
    }
}

impl FromStr for Rate {
    type Err = ChaosError;

    fn from_str(s: &str) -> Result<Self, ChaosError> {
        let per_s: f64 = s.trim().parse().map_err(|_| ChaosError::Rate(s.to_owned()))?;
        Self::new(per_s).map_err(|_| ChaosError::Rate(s.to_owned()))
    }
}

/// A seed: a u64, decimal or `0x` hex.
pub fn parse_seed(s: &str) -> Result<u64, ChaosError> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    }
    .map_err(|_| ChaosError::Seed(s.to_owned()))
}

/// The per-connection faults a schedule draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Rst,
    Fin,
    Blackhole,
    Drop,
    Delay,
    Split,
    CorruptCrc,
    Terminate,
}

impl Kind {
    pub const ALL: [Kind; 8] = [
        Kind::Rst,
        Kind::Fin,
        Kind::Blackhole,
        Kind::Drop,
        Kind::Delay,
        Kind::Split,
        Kind::CorruptCrc,
        Kind::Terminate,
    ];

    /// Without `--kinds`: the faults every ULP must live through. drop
    /// only slows a connection, and corrupt-crc and terminate end it the
    /// way rst does, so they are opt-in.
    pub const DEFAULT: [Kind; 5] = [Kind::Rst, Kind::Fin, Kind::Blackhole, Kind::Delay, Kind::Split];

    /// Its name, as `vt3d ctl fault NAME` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Rst => "rst",
            Kind::Fin => "fin",
            Kind::Blackhole => "blackhole",
            Kind::Drop => "drop",
            Kind::Delay => "delay",
            Kind::Split => "split",
            Kind::CorruptCrc => "corrupt-crc",
            Kind::Terminate => "terminate",
        }
    }
}

impl FromStr for Kind {
    type Err = ChaosError;

    fn from_str(s: &str) -> Result<Self, ChaosError> {
        Kind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| ChaosError::Kind(s.to_owned()))
    }
}

/// The strengths and windows of the faults that last (`--window-ms`,
/// `--blackhole-ms`, `--delay-ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Windows {
    /// How long a blackhole lasts: well under the TCP timeout (15 s), so
    /// the connection can survive it, and under nvme-rdma's keep-alive (5 s).
    pub blackhole_ms: u32,
    /// How long drop, delay and split last.
    pub window_ms: u32,
    /// How long delay holds each frame.
    pub delay_ms: u32,
}

impl Default for Windows {
    fn default() -> Self {
        Self { blackhole_ms: 1000, window_ms: 2000, delay_ms: 100 }
    }
}

/// drop's share of frames lost (of each connection's frames, both ways).
pub const DROP_PERCENT: u8 = 20;
/// split's tail: 2 octets cut an FPDU's CRC in two (what siw gets wrong).
pub const SPLIT_TAIL: u16 = 2;
/// split's hold of the tail (the `fault split` default).
pub const SPLIT_HOLD_MS: u32 = 20;

/// One fault with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Rst,
    Fin,
    Blackhole { window_ms: u32 },
    Drop { percent: u8, seed: u64, window_ms: u32 },
    Delay { ms: u32, window_ms: u32 },
    Split { tail: u16, hold_ms: u32, window_ms: u32 },
    CorruptCrc,
    Terminate { code: TermCode },
}

fn ms(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}

impl Action {
    pub fn kind(&self) -> Kind {
        match self {
            Action::Rst => Kind::Rst,
            Action::Fin => Kind::Fin,
            Action::Blackhole { .. } => Kind::Blackhole,
            Action::Drop { .. } => Kind::Drop,
            Action::Delay { .. } => Kind::Delay,
            Action::Split { .. } => Kind::Split,
            Action::CorruptCrc => Kind::CorruptCrc,
            Action::Terminate { .. } => Kind::Terminate,
        }
    }

    /// The engine's fault that starts it.
    pub fn fault(&self) -> Fault {
        match *self {
            Action::Rst => Fault::SendRst,
            Action::Fin => Fault::SendFin,
            Action::Blackhole { .. } => Fault::Blackhole(true),
            Action::Drop { percent, seed, .. } => Fault::Drop { percent, seed },
            Action::Delay { ms: held, .. } => Fault::Delay(Some(ms(held))),
            Action::Split { tail, hold_ms, .. } => Fault::Split(Some(Split { tail, hold: ms(hold_ms) })),
            Action::CorruptCrc => Fault::CorruptCrc,
            Action::Terminate { code } => Fault::Terminate(code),
        }
    }

    /// How long it lasts, and the fault that ends it (sticky faults only).
    pub fn window(&self) -> Option<(u32, Fault)> {
        match *self {
            Action::Blackhole { window_ms } => Some((window_ms, Fault::Blackhole(false))),
            Action::Drop { seed, window_ms, .. } => Some((window_ms, Fault::Drop { percent: 0, seed })),
            Action::Delay { window_ms, .. } => Some((window_ms, Fault::Delay(None))),
            Action::Split { window_ms, .. } => Some((window_ms, Fault::Split(None))),
            Action::Rst | Action::Fin | Action::CorruptCrc | Action::Terminate { .. } => None,
        }
    }

    /// Its parameters as the log shows them (`params`).
    pub fn params(&self) -> Value {
        match *self {
            Action::Rst | Action::Fin | Action::CorruptCrc => json!({}),
            Action::Blackhole { window_ms } => json!({ "window_ms": window_ms }),
            Action::Drop { percent, seed, window_ms } => {
                json!({ "percent": percent, "seed": seed, "window_ms": window_ms })
            }
            Action::Delay { ms, window_ms } => json!({ "ms": ms, "window_ms": window_ms }),
            Action::Split { tail, hold_ms, window_ms } => {
                json!({ "tail": tail, "hold_ms": hold_ms, "window_ms": window_ms })
            }
            Action::Terminate { code } => {
                let (layer, etype, ecode) = code.fields();
                json!({ "layer": layer, "etype": etype, "ecode": ecode })
            }
        }
    }

    /// The action a log's `kind` and `params` describe, every number
    /// checked against what `vt3d ctl fault` accepts.
    pub fn from_params(kind: Kind, params: &Value) -> Result<Self, String> {
        let object = params.as_object().ok_or("params is not an object")?;
        let expected = Action::example(kind).params();
        let keys = expected.as_object().map(|o| o.keys().collect::<Vec<_>>()).unwrap_or_default();
        if let Some(extra) = object.keys().find(|k| !keys.contains(k)) {
            return Err(format!("{} has no parameter {extra:?}", kind.name()));
        }
        let num = |key: &str, min: u64, max: u64| -> Result<u64, String> {
            let v = object.get(key).ok_or_else(|| format!("{} needs params.{key}", kind.name()))?;
            v.as_u64()
                .filter(|n| (min..=max).contains(n))
                .ok_or_else(|| format!("params.{key} of {}: {v} is not a whole number in {min}..={max}", kind.name()))
        };
        // Bounds as the command line's (--window-ms, --blackhole-ms, --delay-ms, fault split).
        let window = |key: &str, max: u64| num(key, 1, max).map(|n| u32::try_from(n).unwrap_or(u32::MAX));
        Ok(match kind {
            Kind::Rst => Action::Rst,
            Kind::Fin => Action::Fin,
            Kind::CorruptCrc => Action::CorruptCrc,
            Kind::Blackhole => Action::Blackhole { window_ms: window("window_ms", MAX_BLACKHOLE_MS)? },
            Kind::Drop => Action::Drop {
                percent: u8::try_from(num("percent", 1, 100)?).unwrap_or(100),
                seed: num("seed", 0, u64::MAX)?,
                window_ms: window("window_ms", MAX_WINDOW_MS)?,
            },
            Kind::Delay => {
                Action::Delay { ms: window("ms", MAX_DELAY_MS)?, window_ms: window("window_ms", MAX_WINDOW_MS)? }
            }
            Kind::Split => Action::Split {
                tail: u16::try_from(num("tail", 1, 1400)?).unwrap_or(1400),
                hold_ms: u32::try_from(num("hold_ms", 0, 10_000)?).unwrap_or(10_000),
                window_ms: window("window_ms", MAX_WINDOW_MS)?,
            },
            Kind::Terminate => {
                let field = |key| num(key, 0, 255).map(|n| u8::try_from(n).unwrap_or(u8::MAX));
                let code = TermCode::registered_code(field("layer")?, field("etype")?, field("ecode")?)
                    .map_err(|e| format!("not an RFC 5040 TERMINATE code: {e}"))?;
                Action::Terminate { code }
            }
        })
    }

    /// An action of `kind` (its parameter names).
    fn example(kind: Kind) -> Self {
        let w = Windows::default();
        Self::of(kind, &w, 0, TermCode::LlpConnectionLost)
    }

    fn of(kind: Kind, w: &Windows, seed: u64, code: TermCode) -> Self {
        match kind {
            Kind::Rst => Action::Rst,
            Kind::Fin => Action::Fin,
            Kind::Blackhole => Action::Blackhole { window_ms: w.blackhole_ms },
            Kind::Drop => Action::Drop { percent: DROP_PERCENT, seed, window_ms: w.window_ms },
            Kind::Delay => Action::Delay { ms: w.delay_ms, window_ms: w.window_ms },
            Kind::Split => Action::Split { tail: SPLIT_TAIL, hold_ms: SPLIT_HOLD_MS, window_ms: w.window_ms },
            Kind::CorruptCrc => Action::CorruptCrc,
            Kind::Terminate => Action::Terminate { code },
        }
    }
}

/// Upper bounds of the windows (the options' and a replay's).
pub const MAX_WINDOW_MS: u64 = 60_000;
pub const MAX_BLACKHOLE_MS: u64 = 10_000;
pub const MAX_DELAY_MS: u64 = 5_000;

/// One scheduled fault: `t_ms` after the start, `action` on the
/// (r mod n)-th of the n matching connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Planned {
    pub t_ms: u64,
    pub action: Action,
    pub r: u64,
}

/// The endless schedule of a seed. Each fault takes its draws in this
/// order (a change reorders every schedule: the tests pin one): the gap
/// (exponential, mean 1/rate), the kind (uniform over the kinds), r, then
/// drop's seed or terminate's code.
#[derive(Debug)]
pub struct Schedule {
    rng: ChaCha8Rng,
    t_ms: u64,
    rate: Rate,
    kinds: Vec<Kind>,
    windows: Windows,
    codes: Vec<TermCode>,
}

impl Schedule {
    /// `kinds` must not be empty (the command line's parser sees to it).
    pub fn new(seed: u64, rate: Rate, kinds: &[Kind], windows: Windows) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
            t_ms: 0,
            rate,
            kinds: kinds.to_vec(),
            windows,
            codes: TermCode::registered().collect(),
        }
    }
}

impl Iterator for Schedule {
    type Item = Planned;

    fn next(&mut self) -> Option<Planned> {
        // Inverse transform: -ln(1 - U) is exponential with mean 1; U < 1.
        let u: f64 = self.rng.random();
        let gap_ms = -(1.0 - u).ln() / self.rate.per_s() * 1000.0;
        // A float-to-int `as` saturates; the gap is finite and not negative.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let gap_ms = gap_ms.round() as u64;
        self.t_ms = self.t_ms.saturating_add(gap_ms);
        let kind = *self.kinds.get(self.rng.random_range(0..self.kinds.len()))?;
        let r: u64 = self.rng.random();
        let seed = if kind == Kind::Drop { self.rng.random() } else { 0 };
        let code = if kind == Kind::Terminate {
            *self.codes.get(self.rng.random_range(0..self.codes.len()))?
        } else {
            TermCode::LlpConnectionLost
        };
        Some(Planned { t_ms: self.t_ms, action: Action::of(kind, &self.windows, seed, code), r })
    }
}
