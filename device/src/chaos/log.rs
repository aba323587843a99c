//! A chaos run's log: every fault scheduled, whom it hit and what that
//! connection did next; as text for people and JSON for tools, and back
//! from JSON for `chaos start --replay`.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;

use serde_json::{json, Map, Value};
use vt3_iwarp::toe::FourTuple;

use super::schedule::{Action, Kind, Planned, Rate, MAX_RATE};
use super::{ChaosError, Params};

/// Entries kept at most: a run finishes when its log is full.
pub const MAX_ENTRIES: usize = 10_000;

/// Largest replay file read: a full log of [`MAX_ENTRIES`] is under 4 MiB.
pub const MAX_REPLAY_BYTES: u64 = 8 << 20;

/// What the connection a fault hit did next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Not known yet.
    Pending,
    /// Its QP went to ERROR: a reset, a timeout, a TERMINATE (or the QP was
    /// destroyed while connected).
    Err,
    /// An orderly close: the QP went back to IDLE.
    Closed,
    /// After it ended, a new connection between the same two addresses
    /// with the same port at one end (the service's) was established.
    Recovered,
    /// Still up (RTS) a while after the fault's window.
    Survived,
    /// Not injected: no connection matched, or the injection failed.
    Skipped,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Pending => "pending",
            Outcome::Err => "err",
            Outcome::Closed => "closed",
            Outcome::Recovered => "recovered",
            Outcome::Survived => "survived",
            Outcome::Skipped => "skipped",
        }
    }
}

/// The connection a fault hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    pub qpn: u32,
    /// Its establishment sequence number.
    pub seq: u64,
    pub tuple: FourTuple,
    /// The highest sequence number seen when it was hit: a recovery is a
    /// connection established after the fault.
    pub seen_seq: u64,
}

/// One scheduled fault and what came of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub planned: Planned,
    /// Connections that matched when it was due.
    pub matching: u32,
    pub hit: Option<Hit>,
    pub outcome: Outcome,
    /// Why the injection failed.
    pub error: Option<String>,
    /// When the window's end was carried out (sticky faults still up).
    pub off_ms: Option<u64>,
    /// Why turning it off failed.
    pub off_error: Option<String>,
    /// When the connection was seen ended (for `recovered`).
    pub ended_ms: Option<u64>,
    /// When its service's new connection was seen.
    pub recovered_ms: Option<u64>,
}

impl Entry {
    pub fn new(planned: Planned, matching: u32) -> Self {
        Self {
            planned,
            matching,
            hit: None,
            outcome: Outcome::Skipped,
            error: None,
            off_ms: None,
            off_error: None,
            ended_ms: None,
            recovered_ms: None,
        }
    }

    fn json(&self) -> Value {
        let p = &self.planned;
        let tuple = self.hit.map(|h| h.tuple);
        let mut o = Map::new();
        o.insert("t_ms".into(), p.t_ms.into());
        o.insert("kind".into(), p.action.kind().name().into());
        o.insert("params".into(), p.action.params());
        o.insert("r".into(), p.r.into());
        o.insert("matching".into(), self.matching.into());
        o.insert("qp".into(), self.hit.map(|h| h.qpn).into());
        o.insert("local".into(), tuple.map(|t| t.local.to_string()).into());
        o.insert("remote".into(), tuple.map(|t| t.remote.to_string()).into());
        o.insert("outcome".into(), self.outcome.name().into());
        if let Some(e) = &self.error {
            o.insert("error".into(), e.as_str().into());
        }
        o.insert("off_ms".into(), self.off_ms.into());
        o.insert("ended_ms".into(), self.ended_ms.into());
        o.insert("recovered_ms".into(), self.recovered_ms.into());
        if let Some(e) = &self.off_error {
            o.insert("off_error".into(), e.as_str().into());
        }
        o.into()
    }

    fn text(&self) -> String {
        let p = &self.planned;
        let params = match p.action.params() {
            Value::Object(o) => o.iter().map(|(k, v)| format!(" {k}={v}")).collect::<String>(),
            _ => String::new(),
        };
        let mut line =
            format!("{:>8} ms  {}{params}  r={} matching={}", p.t_ms, p.action.kind().name(), p.r, self.matching);
        if let Some(h) = self.hit {
            let _ = write!(line, "  qp {} {} -> {}", h.qpn, h.tuple.local, h.tuple.remote);
        }
        let _ = write!(line, "  {}", self.outcome.name());
        if let Some(e) = &self.error {
            let _ = write!(line, " ({e})");
        } else if self.hit.is_none() {
            line.push_str(" (no matching connection)");
        }
        if let (Some(ended), Some(back)) = (self.ended_ms, self.recovered_ms) {
            let _ = write!(line, " (ended at {ended} ms, back at {back} ms)");
        }
        if let Some(off) = self.off_ms {
            let _ = write!(line, "; off at {off} ms");
        }
        if let Some(e) = &self.off_error {
            let _ = write!(line, " (off failed: {e})");
        }
        line
    }
}

fn params_json(params: &Params) -> Map<String, Value> {
    let mut o = Map::new();
    o.insert("seed".into(), params.seed.into());
    o.insert("rate".into(), params.rate.per_s().into());
    o.insert("kinds".into(), params.kinds.iter().map(|k| k.name()).collect::<Vec<_>>().into());
    o.insert("ports".into(), params.ports.clone().into());
    o.insert("duration_s".into(), params.duration_s.into());
    o.insert("max_faults".into(), params.max_faults.into());
    o
}

/// `chaos log --json`: the run's parameters, then every entry.
pub fn json(params: Option<&Params>, entries: &[Entry]) -> Value {
    let mut o = params.map(params_json).unwrap_or_else(|| {
        let empty =
            json!({"seed": null, "rate": null, "kinds": [], "ports": [], "duration_s": null, "max_faults": null});
        empty.as_object().cloned().unwrap_or_default()
    });
    o.insert("faults".into(), entries.iter().map(Entry::json).collect());
    o.into()
}

/// A run's parameters in a line of text.
pub fn describe(params: &Params) -> String {
    let seed = params.seed.map_or_else(|| "-".to_owned(), |s| s.to_string());
    let kinds: Vec<&str> = params.kinds.iter().map(|k| k.name()).collect();
    let ports = if params.ports.is_empty() {
        "all".to_owned()
    } else {
        params.ports.iter().map(u16::to_string).collect::<Vec<_>>().join(",")
    };
    let duration = params.duration_s.map_or_else(|| "-".to_owned(), |d| format!("{d} s"));
    let max = params.max_faults.map_or_else(|| "-".to_owned(), |m| m.to_string());
    format!(
        "seed {seed}, rate {}/s, kinds {}, ports {ports}, duration {duration}, max faults {max}",
        params.rate.per_s(),
        kinds.join(",")
    )
}

/// `chaos log`: a header line, then one line per entry.
pub fn text(params: Option<&Params>, entries: &[Entry]) -> String {
    let Some(params) = params else { return "no chaos run yet\n".to_owned() };
    let mut out = format!("chaos {}: {} entries (at most {MAX_ENTRIES})\n", describe(params), entries.len());
    for e in entries {
        out.push_str(&e.text());
        out.push('\n');
    }
    out
}

/// Reads a log written by `chaos log --json` (a host path) for a replay.
pub fn read_replay(path: &Path) -> Result<(Params, Vec<Planned>), ChaosError> {
    let fail = |why: String| ChaosError::Replay { path: path.display().to_string(), why };
    let file = std::fs::File::open(path).map_err(|e| fail(e.to_string()))?;
    let mut text = String::new();
    file.take(MAX_REPLAY_BYTES + 1).read_to_string(&mut text).map_err(|e| fail(e.to_string()))?;
    if text.len() as u64 > MAX_REPLAY_BYTES {
        return Err(fail(format!("larger than {MAX_REPLAY_BYTES} octets")));
    }
    parse_replay(&text).map_err(fail)
}

/// A log's parameters and schedule, every field checked.
pub fn parse_replay(text: &str) -> Result<(Params, Vec<Planned>), String> {
    if text.trim().is_empty() {
        return Err("empty (want the JSON of `vt3d ctl chaos log --json`)".to_owned());
    }
    let log: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let top = log.as_object().ok_or("not a JSON object (want the JSON of `vt3d ctl chaos log --json`)")?;
    let field = |key: &str| top.get(key).ok_or_else(|| format!("no {key:?}"));
    let seed = match field("seed")? {
        Value::Null => None,
        v => Some(v.as_u64().ok_or_else(|| format!("seed {v} is not a u64"))?),
    };
    let rate = field("rate")?;
    let rate = rate
        .as_f64()
        .and_then(|r| Rate::new(r).ok())
        .ok_or_else(|| format!("rate {rate} is not faults/s above 0 and at most {MAX_RATE}"))?;
    let kinds = field("kinds")?
        .as_array()
        .ok_or("kinds is not an array")?
        .iter()
        .map(|k| {
            k.as_str()
                .ok_or_else(|| format!("kind {k} is not a string"))?
                .parse()
                .map_err(|e: ChaosError| e.to_string())
        })
        .collect::<Result<Vec<Kind>, String>>()?;
    if kinds.is_empty() {
        return Err("kinds is empty".to_owned());
    }
    let ports = field("ports")?
        .as_array()
        .ok_or("ports is not an array")?
        .iter()
        .map(|p| {
            p.as_u64()
                .and_then(|p| u16::try_from(p).ok())
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("port {p} is not 1-65535"))
        })
        .collect::<Result<Vec<u16>, String>>()?;
    let limit = |key: &str| match field(key)? {
        Value::Null => Ok(None),
        v => v.as_u64().filter(|n| *n > 0).map(Some).ok_or_else(|| format!("{key} {v} is not a positive whole number")),
    };
    let (duration_s, max_faults) = (limit("duration_s")?, limit("max_faults")?);
    let faults = field("faults")?.as_array().ok_or("faults is not an array")?;
    if faults.is_empty() {
        return Err("no faults to replay".to_owned());
    }
    if faults.len() > MAX_ENTRIES {
        return Err(format!("{} faults (at most {MAX_ENTRIES})", faults.len()));
    }
    let mut plan = Vec::with_capacity(faults.len());
    for (i, f) in faults.iter().enumerate() {
        let planned = planned(f).map_err(|e| format!("faults[{i}]: {e}"))?;
        if plan.last().is_some_and(|p: &Planned| p.t_ms > planned.t_ms) {
            return Err(format!("faults[{i}]: t_ms {} is before the fault ahead of it", planned.t_ms));
        }
        if !kinds.contains(&planned.action.kind()) {
            return Err(format!("faults[{i}]: kind {} is not in kinds", planned.action.kind().name()));
        }
        plan.push(planned);
    }
    let params = Params { seed, rate, kinds, ports, duration_s, max_faults, windows: Default::default() };
    Ok((params, plan))
}

fn planned(f: &Value) -> Result<Planned, String> {
    let o = f.as_object().ok_or("not an object")?;
    let get = |key: &str| o.get(key).ok_or_else(|| format!("no {key:?}"));
    let t_ms = get("t_ms")?.as_u64().ok_or("t_ms is not a whole number of ms")?;
    let kind: Kind =
        get("kind")?.as_str().ok_or("kind is not a string")?.parse().map_err(|e: ChaosError| e.to_string())?;
    let action = Action::from_params(kind, get("params")?)?;
    let r = get("r")?;
    let r = r.as_u64().ok_or_else(|| format!("r {r} is not a u64"))?;
    Ok(Planned { t_ms, action, r })
}
