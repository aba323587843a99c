//! The management socket (`vt3d serve --mgmt PATH`) and its client
//! (`vt3d ctl`): one request line per connection, one answer.
//!
//! A request line is the words of a `vt3d ctl` command after `--mgmt
//! PATH` ([`CtlLine`]): `stats`, `tcb` (the TOE's TCB table, like
//! cxgbtool's), `qps`, `cqs`, `mrs`, `fault …` (docs/architecture.md §6) and
//! `capture start FILE | stop` (the wire capture, [`crate::capture`]) and
//! `chaos …` (random fault schedules, [`crate::chaos`]), with `--json` for JSON. Errors answer `error: MESSAGE`. docs/vt3d-ctl.md
//! documents every request and answer.

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vt3_iwarp::toe::TcbInfo;

use vt3_iwarp::engine::Fault;
use vt3_iwarp::toe::{Duration as EngineDuration, Split};
use vt3_iwarp::wire::terminate::TermCode;

use crate::abi;
use crate::chaos;
use crate::config::{Aim, CaptureRequest, CtlLine, CtlRequest, FaultRequest, Target};
use crate::rnic::fault::{FaultTarget, Injected};
use crate::rnic::{tpt, Rnic};
use crate::t3::{Device, T3};

/// Longest request line accepted.
const MAX_REQUEST: u64 = 256;

/// Clients served at once; one more is told the server is busy.
const MAX_CLIENTS: usize = 8;

/// Serves the management socket on a background thread for the life of
/// the process. Each client gets a thread of its own: one that connects
/// and says nothing must not hold up a test's `vt3d ctl fault` for the
/// length of its read timeout.
pub fn spawn(listener: UnixListener, device: Arc<T3>) -> io::Result<thread::JoinHandle<()>> {
    thread::Builder::new().name("vt3d-mgmt".into()).spawn(move || {
        let clients = Arc::new(AtomicUsize::new(0));
        let chaos = Arc::new(chaos::Control::default());
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => serve_on_thread(stream, &device, &chaos, &clients),
                Err(e) => log::warn!("mgmt accept: {e}"),
            }
        }
    })
}

fn serve_on_thread(stream: UnixStream, device: &Arc<T3>, chaos: &Arc<chaos::Control>, clients: &Arc<AtomicUsize>) {
    if clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
        clients.fetch_sub(1, Ordering::AcqRel);
        // Its request is read first (briefly: this is the accept loop), or
        // closing on unread data would reset the connection before the
        // client reads the answer.
        let _ = stream.set_read_timeout(Some(Duration::from_millis(100)));
        let _ = BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut String::new());
        let _ = (&stream).write_all(format!("error: busy ({MAX_CLIENTS} clients at once)\n").as_bytes());
        return;
    }
    let (device, chaos, done) = (Arc::clone(device), Arc::clone(chaos), Arc::clone(clients));
    let spawned = thread::Builder::new().name("vt3d-mgmt-client".into()).spawn(move || {
        if let Err(e) = serve_one(stream, &device, &chaos) {
            log::debug!("mgmt: {e}");
        }
        done.fetch_sub(1, Ordering::AcqRel);
    });
    if let Err(e) = spawned {
        clients.fetch_sub(1, Ordering::AcqRel);
        log::warn!("mgmt: no thread for a client: {e}");
    }
}

fn serve_one(stream: UnixStream, device: &Arc<T3>, chaos: &chaos::Control) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line)?;
    let answer = answer(line.trim(), device, chaos);
    (&stream).write_all(answer.as_bytes())
}

/// One cell of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Num(u64),
    Bool(bool),
    Text(String),
    None,
    /// A fault's QPs and its result per QP.
    List(Vec<Value>),
    Object(Row),
}

impl From<u64> for Value {
    fn from(v: u64) -> Self {
        Value::Num(v)
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Self {
        Value::Num(v.into())
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Text(v.to_owned())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Self {
        v.map_or(Value::None, Into::into)
    }
}

type Row = Vec<(&'static str, Value)>;

fn text_cell(v: &Value) -> String {
    match v {
        Value::Num(n) => n.to_string(),
        Value::Bool(b) => if *b { "yes" } else { "no" }.to_owned(),
        Value::Text(s) => s.clone(),
        Value::None => "-".to_owned(),
        Value::List(items) => items.iter().map(text_cell).collect::<Vec<_>>().join(","),
        Value::Object(row) => row.iter().map(|(k, v)| format!("{k}={}", text_cell(v))).collect::<Vec<_>>().join(" "),
    }
}

fn json_cell(v: &Value) -> serde_json::Value {
    match v {
        Value::Num(n) => (*n).into(),
        Value::Bool(b) => (*b).into(),
        Value::Text(s) => s.as_str().into(),
        Value::None => serde_json::Value::Null,
        Value::List(items) => items.iter().map(json_cell).collect(),
        Value::Object(row) => json_object(row),
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Bool(v)
    }
}

/// A table with a header line and aligned columns.
fn text_table(rows: &[Row]) -> String {
    let Some(first) = rows.first() else { return String::new() };
    let cells: Vec<Vec<String>> = std::iter::once(first.iter().map(|(k, _)| (*k).to_owned()).collect())
        .chain(rows.iter().map(|r| r.iter().map(|(_, v)| text_cell(v)).collect()))
        .collect();
    let widths: Vec<usize> = (0..first.len())
        .map(|i| cells.iter().filter_map(|line| line.get(i)).map(String::len).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in &cells {
        let padded: Vec<String> = line.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", padded.join(" ").trim_end());
    }
    out
}

fn json_object(row: &Row) -> serde_json::Value {
    row.iter().map(|(k, v)| ((*k).to_owned(), json_cell(v))).collect::<serde_json::Map<_, _>>().into()
}

fn json_table(rows: &[Row]) -> String {
    format!("{}\n", serde_json::Value::Array(rows.iter().map(json_object).collect()))
}

/// The answer to one request line (`chaos`: the socket's runs).
pub fn answer(request: &str, device: &Arc<T3>, chaos: &chaos::Control) -> String {
    let line = match CtlLine::parse(request) {
        Ok(line) => line,
        Err(e) => {
            return format!(
                "error: {e} (try: [--json] stats|tcb|qps|cqs|mrs|fault ...|capture start FILE|capture stop|chaos ...)\n"
            )
        }
    };
    let json = line.json;
    match line.request {
        CtlRequest::Stats => {
            let rows = stats_rows(device);
            if json {
                let object: serde_json::Map<_, _> = rows.into_iter().map(|(k, v)| (k, v.into())).collect();
                format!("{}\n", serde_json::Value::Object(object))
            } else {
                rows.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
            }
        }
        CtlRequest::Tcb => table(&tcb_rows(&device.rnic()), json),
        CtlRequest::Qps => table(&qp_rows(&device.rnic()), json),
        CtlRequest::Cqs => table(&cq_rows(&device.rnic()), json),
        CtlRequest::Mrs => table(&mr_rows(&device.rnic()), json),
        CtlRequest::Fault(fault) => {
            let (name, fields, result) = inject(device, fault);
            match result {
                Err(e) => format!("error: {e}\n"),
                Ok(done) if json => {
                    let mut row: Row = vec![("fault", name.into())];
                    row.extend(fields);
                    row.extend(done.fields);
                    format!("{}\n", json_object(&row))
                }
                Ok(done) => format!("{}\n", done.text),
            }
        }
        CtlRequest::Capture(request) => capture(device, &request, json),
        CtlRequest::Chaos(request) => chaos.answer(device, &request, json),
    }
}

/// `capture start FILE` / `capture stop`.
fn capture(device: &T3, request: &CaptureRequest, json: bool) -> String {
    let result = match request {
        CaptureRequest::Start { file } => device.eth().capture.start(file).map(|()| {
            let row: Row = vec![("capture", "started".into()), ("file", Value::Text(file.display().to_string()))];
            (row, format!("capturing every frame on the uplink to {}", file.display()))
        }),
        CaptureRequest::Stop => device.eth().capture.stop().map(|done| {
            let row: Row = vec![
                ("capture", "stopped".into()),
                ("file", Value::Text(done.path.display().to_string())),
                ("frames", done.frames.into()),
                ("dropped", done.dropped.into()),
                ("write_error", done.error.as_deref().into()),
            ];
            (row, done.to_string())
        }),
    };
    match result {
        Err(e) => format!("error: {e}\n"),
        Ok((row, _)) if json => format!("{}\n", json_object(&row)),
        Ok((_, text)) => format!("{text}\n"),
    }
}

/// What an injection did: fields for JSON, a line for people.
struct Done {
    fields: Row,
    text: String,
}

impl From<Injected> for Done {
    fn from(done: Injected) -> Self {
        Done { fields: vec![("state", done.state.into()), ("detail", done.detail.as_str().into())], text: done.detail }
    }
}

/// The target a fault's options name.
fn fault_target(target: &Target) -> FaultTarget {
    match (target.qp, target.port, target.peer) {
        (Some(qp), _, _) => FaultTarget::Qp(qp),
        (_, Some(port), _) => FaultTarget::Port(port),
        (_, _, Some(peer)) => FaultTarget::Peer(peer.addr, peer.port),
        _ => FaultTarget::All,
    }
}

/// A connection fault on every QP its aim matches (or armed for the next
/// connection on a port). One QP answers as before (`qp`, `state`,
/// `detail`); every answer lists the QPs hit (`qps`) and each result.
fn inject_connection(device: &T3, fault: Fault, aim: Aim) -> Result<Done, String> {
    let now = device.now().engine();
    let mut rnic = device.rnic();
    if aim.arm {
        let port = aim.target.port.ok_or("--arm needs --port P (the next connection on P)")?;
        let done = rnic.arm_fault(port, fault)?;
        let fields = vec![
            ("armed", Value::Bool(true)),
            ("port", u32::from(port).into()),
            ("detail", done.detail.as_str().into()),
        ];
        return Ok(Done { fields, text: done.detail });
    }
    let target = fault_target(&aim.target);
    let qps = rnic.fault_targets(target).inspect_err(|_| rnic.count_refused())?;
    let results: Vec<(u32, Result<Injected, String>)> =
        qps.iter().map(|&qpn| (qpn, rnic.inject(now, qpn, fault))).collect();
    drop(rnic);
    let hit: Vec<u32> = results.iter().filter(|(_, r)| r.is_ok()).map(|(qpn, _)| *qpn).collect();
    if let [(qpn, Ok(done))] = results.as_slice() {
        let mut single: Done = done.clone().into();
        single.fields.splice(0..0, [("qp", Value::from(*qpn)), ("qps", Value::List(vec![Value::from(*qpn)]))]);
        return Ok(single);
    }
    if hit.is_empty() {
        let why: Vec<String> = results.into_iter().filter_map(|(_, r)| r.err()).collect();
        return Err(why.join("; "));
    }
    let text: Vec<String> = results
        .iter()
        .map(|(qpn, r)| match r {
            Ok(done) => done.detail.clone(),
            Err(e) => format!("QP {qpn}: not injected: {e}"),
        })
        .collect();
    let each: Vec<Value> = results
        .iter()
        .map(|(qpn, r)| {
            let mut row: Row = vec![("qp", Value::from(*qpn))];
            match r {
                Ok(done) => row.extend([("state", done.state.into()), ("detail", done.detail.as_str().into())]),
                Err(e) => row.push(("error", e.as_str().into())),
            }
            Value::Object(row)
        })
        .collect();
    let fields = vec![("qps", Value::List(hit.into_iter().map(Value::from).collect())), ("results", Value::List(each))];
    Ok(Done { fields, text: text.join("\n") })
}

/// Runs one injection; returns its name, its parameters (for JSON) and
/// what it did. The worker is kicked so that the engine acts at once
/// (frames out, events to the driver).
fn inject(device: &T3, request: FaultRequest) -> (&'static str, Row, Result<Done, String>) {
    let on = |fault: Fault, aim: Aim, params: Row| (fault.name(), params, inject_connection(device, fault, aim));
    let (name, fields, result) = match request {
        FaultRequest::Rst { at } => on(Fault::SendRst, at, Vec::new()),
        FaultRequest::Fin { at } => on(Fault::SendFin, at, Vec::new()),
        FaultRequest::Blackhole { at, off } => on(Fault::Blackhole(!off), at, vec![("on", Value::Bool(!off))]),
        FaultRequest::Drop { at, percent, seed } => {
            on(Fault::Drop { percent, seed }, at, vec![("percent", u32::from(percent).into()), ("seed", seed.into())])
        }
        FaultRequest::Delay { at, ms } => {
            let delay = (ms > 0).then(|| EngineDuration::from_millis(u64::from(ms)));
            on(Fault::Delay(delay), at, vec![("ms", ms.into())])
        }
        FaultRequest::Split { at, tail, hold_ms } => {
            let hold = EngineDuration::from_millis(u64::from(hold_ms));
            let split = (tail > 0).then_some(Split { tail, hold });
            on(Fault::Split(split), at, vec![("tail", u32::from(tail).into()), ("hold_ms", hold_ms.into())])
        }
        FaultRequest::CorruptCrc { at } => on(Fault::CorruptCrc, at, Vec::new()),
        FaultRequest::Terminate { at, layer, etype, ecode } => {
            let fields = vec![
                ("layer", u32::from(layer).into()),
                ("etype", u32::from(etype).into()),
                ("ecode", u32::from(ecode).into()),
            ];
            match TermCode::registered_code(layer, etype, ecode) {
                Ok(code) => on(Fault::Terminate(code), at, fields),
                Err(e) => {
                    device.rnic().count_refused();
                    ("terminate", fields, Err(format!("not an RFC 5040 TERMINATE code: {e}")))
                }
            }
        }
        FaultRequest::InvalidateStag { stag } => {
            let result = device.rnic().invalidate_stag(stag).map(Done::from);
            ("invalidate-stag", vec![("stag", Value::Text(format!("{stag:#x}")))], result)
        }
        FaultRequest::DeviceFatal => ("device-fatal", Vec::new(), device.rnic().request_device_fatal().map(Done::from)),
        FaultRequest::MuteCommands { ms } => {
            let now = device.now().engine();
            let result = device.rnic().mute_commands(now, EngineDuration::from_millis(u64::from(ms))).map(Done::from);
            ("mute-commands", vec![("ms", ms.into())], result)
        }
        FaultRequest::LoseReply { command } => {
            let result = device.rnic().lose_reply(command).map(Done::from);
            ("lose-reply", vec![("command", Value::Text(command.name().to_owned()))], result)
        }
    };
    if result.is_ok() {
        device.kick();
    }
    (name, fields, result)
}

fn table(rows: &[Row], json: bool) -> String {
    if json {
        json_table(rows)
    } else {
        text_table(rows)
    }
}

fn stats_rows(device: &T3) -> Vec<(String, u64)> {
    let mut rows: Vec<(String, u64)> =
        device.eth().stats.rows().iter().map(|(k, v)| (format!("nic.{k}"), *v)).collect();
    rows.extend(device.control_stats.rows().into_iter().map(|(k, v)| (format!("control.{k}"), v)));
    let rnic = device.rnic();
    let c = rnic.counts();
    for (k, v) in [("pd", c.pd), ("mr", c.mr), ("cq", c.cq), ("qp", c.qp), ("srq", c.srq)] {
        rows.push((format!("rnic.{k}"), v as u64));
    }
    for (k, v) in rnic.ring_stats() {
        rows.push((format!("rnic.{k}"), v));
    }
    let e = rnic.engine_stats();
    for (k, v) in [
        ("fpdus_tx", e.fpdus_tx),
        ("fpdus_rx", e.fpdus_rx),
        ("bytes_sent", e.bytes_sent),
        ("bytes_placed", e.bytes_placed),
        ("read_requests_rx", e.read_requests_rx),
        ("terminates_tx", e.terminates_tx),
        ("terminates_rx", e.terminates_rx),
        ("protocol_errors", e.protocol_errors),
        ("wqe_errors", e.wqe_errors),
        ("connections_established", e.connections_established),
        ("connections_refused", e.connections_refused),
    ] {
        rows.push((format!("iwarp.{k}"), v));
    }
    let t = rnic.toe_fault_counters();
    for (k, v) in
        [("dropped", t.dropped), ("delayed", t.delayed), ("delay_overflow", t.delay_overflow), ("split", t.split)]
    {
        rows.push((format!("toe.fault_{k}"), v));
    }
    for (k, v) in rnic.fault_stats().rows() {
        rows.push((format!("fault.{k}"), v));
    }
    rows.push(("rnic.fatal".to_owned(), u64::from(rnic.fatal().is_some())));
    rows.push(("rnic.tcp_timeout_s".to_owned(), rnic.tcp_timeout().secs()));
    rows.extend(device.eth().capture.rows().into_iter().map(|(k, v)| (format!("capture.{k}"), v)));
    rows.extend(device.eth().uplink().counters().into_iter().map(|(k, v)| (format!("uplink.{k}"), v)));
    rows
}

fn tcb_row(t: &TcbInfo) -> Row {
    let micros = |d: Option<vt3_iwarp::toe::Duration>| d.map(|d| d.total_micros());
    vec![
        ("id", Value::Text(t.id.to_string())),
        ("state", t.state.name().into()),
        ("local", t.tuple.map(|u| u.local.to_string()).as_deref().into()),
        ("remote", t.tuple.map(|u| u.remote.to_string()).as_deref().into()),
        ("listen_port", t.listen_port.map(u32::from).into()),
        ("snd_una", t.snd_una.into()),
        ("snd_nxt", t.snd_nxt.into()),
        ("rcv_nxt", t.rcv_nxt.into()),
        ("snd_wnd", t.snd_wnd.into()),
        ("rcv_wnd", t.rcv_wnd.into()),
        ("mss", u32::from(t.local_mss).into()),
        ("peer_mss", t.peer_mss.map(u32::from).into()),
        ("srtt_us", micros(t.srtt).into()),
        ("rttvar_us", micros(t.rttvar).into()),
        ("retransmits", t.retransmits.into()),
        ("segs_in", t.segs_in.into()),
        ("segs_out", t.segs_out.into()),
        ("bytes_in", t.bytes_in.into()),
        ("bytes_out", t.bytes_out.into()),
        ("send_queue", (t.send_queue as u64).into()),
        ("recv_queue", (t.recv_queue as u64).into()),
        ("closed", t.close_reason.map(|r| r.name()).into()),
        ("blackhole", t.blackholed.into()),
        ("drop_pct", u32::from(t.drop_percent).into()),
        ("delay_ms", t.delay.map(|d| d.total_millis()).into()),
        ("split_tail", t.split.map(|s| u32::from(s.tail)).into()),
    ]
}

fn tcb_rows(rnic: &Rnic) -> Vec<Row> {
    let mut rows = Vec::new();
    rnic.for_each_tcb(&mut |t| rows.push(tcb_row(t)));
    rows
}

fn qp_rows(rnic: &Rnic) -> Vec<Row> {
    rnic.qps()
        .iter()
        .map(|(qpn, qp)| {
            let info = rnic.qp_info(qpn);
            let tuple = info.and_then(|i| i.tuple).or(qp.tuple);
            let mpa = info
                .and_then(|i| i.negotiated)
                .map(|n| format!("rev{}{}", n.revision, if n.crc { "+crc" } else { "" }));
            vec![
                ("qpn", qpn.into()),
                ("state", qp.state.name().trim_start_matches("VT3_QPS_").into()),
                ("pdn", qp.pdn.into()),
                ("send_cq", qp.send_cqn.into()),
                ("recv_cq", qp.recv_cqn.into()),
                ("sq_depth", qp.sq.depth.into()),
                ("rq_depth", qp.rq.depth.into()),
                ("sq_fetched", qp.sq_work.fetched.into()),
                ("sq_consumed", qp.sq_work.consumed.into()),
                ("rq_fetched", qp.rq_work.fetched.into()),
                ("rq_consumed", qp.rq_work.consumed.into()),
                ("ird", qp.ird.into()),
                ("ord", qp.ord.into()),
                ("local", tuple.map(|t| t.local.to_string()).as_deref().into()),
                ("remote", tuple.map(|t| t.remote.to_string()).as_deref().into()),
                ("mpa", mpa.as_deref().into()),
                ("engine_state", info.map(|i| i.state.name()).into()),
                ("sq_outstanding", info.map(|i| i.sq_outstanding as u64).into()),
                ("rq_posted", info.map(|i| i.rq_posted as u64).into()),
                ("reads_out", info.map(|i| i.reads_outstanding as u64).into()),
                ("reads_in", info.map(|i| i.reads_inbound as u64).into()),
            ]
        })
        .collect()
}

fn cq_rows(rnic: &Rnic) -> Vec<Row> {
    rnic.cqs()
        .iter()
        .map(|(cqn, cq)| {
            let arm = match (
                cq.arm_flags & abi::ArmFlag::Next as u32 != 0,
                cq.arm_flags & abi::ArmFlag::Solicited as u32 != 0,
            ) {
                (true, _) => Some("next"),
                (false, true) => Some("solicited"),
                (false, false) => None,
            };
            vec![
                ("cqn", cqn.into()),
                ("depth", cq.ring.depth.into()),
                ("prod", cq.prod.into()),
                ("armed", arm.into()),
                ("qps", cq.qp_users.into()),
                ("overflowed", cq.overflowed.into()),
                ("pages", (cq.ring.pages.len() as u64).into()),
            ]
        })
        .collect()
}

/// `vt3_access` bits as letters: lw (local write), rw (remote write), rr
/// (remote read), mw (bind); local read is always allowed.
fn access_text(access: u32) -> String {
    let names: Vec<&str> =
        [(tpt::LOCAL_WRITE, "lw"), (tpt::REMOTE_WRITE, "rw"), (tpt::REMOTE_READ, "rr"), (tpt::MW_BIND, "mw")]
            .iter()
            .filter(|(bit, _)| access & bit != 0)
            .map(|(_, name)| *name)
            .collect();
    if names.is_empty() {
        "lr".to_owned()
    } else {
        names.join(",")
    }
}

fn mr_rows(rnic: &Rnic) -> Vec<Row> {
    rnic.tpt()
        .iter_stags()
        .map(|(stag, mr)| {
            let (kind, pages) = match &mr.backing {
                tpt::Backing::Dma => ("dma", None),
                tpt::Backing::Pages { pages, .. } if mr.fast_reg.is_some() => ("fast-reg", Some(pages.len() as u64)),
                tpt::Backing::Pages { pages, .. } => ("pages", Some(pages.len() as u64)),
            };
            vec![
                ("stag", Value::Text(format!("{stag:#x}"))),
                ("pdn", mr.pdn.into()),
                ("access", Value::Text(access_text(mr.access))),
                ("iova", Value::Text(format!("{:#x}", mr.iova))),
                ("length", mr.length.into()),
                ("kind", kind.into()),
                ("pages", pages.into()),
                ("valid", mr.valid.into()),
            ]
        })
        .collect()
}

/// `vt3d ctl`: sends one request and returns the answer.
pub fn request(path: &Path, line: &str) -> io::Result<String> {
    let mut stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.write_all(format!("{line}\n").as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    if let Some(err) = answer.strip_prefix("error: ") {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, err.trim().to_owned()));
    }
    Ok(answer)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;
    use crate::uplink::UplinkSpec;

    /// A NIC on a unix-dgram uplink in DIR (peer `p`) and its management
    /// socket, served.
    fn serving(dir: &std::path::Path) -> (Arc<T3>, std::path::PathBuf) {
        let spec: UplinkSpec =
            format!("unix-dgram:{},{}", dir.join("u").display(), dir.join("p").display()).parse().unwrap();
        let device = Arc::new(T3::new(spec.open().unwrap(), None, 1500));
        let path = dir.join("mgmt");
        spawn(UnixListener::bind(&path).unwrap(), Arc::clone(&device)).unwrap();
        (device, path)
    }

    #[test]
    fn stats_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let (_nic, path) = serving(dir.path());

        let text = request(&path, "stats").unwrap();
        assert!(text.lines().any(|l| l == "rnic.qp 0"), "{text}");
        assert!(text.lines().any(|l| l == "nic.tx_frames 0"), "{text}");
        assert!(text.lines().any(|l| l == "iwarp.fpdus_tx 0"), "{text}");
        let json = request(&path, "stats json").unwrap();
        assert!(json.starts_with("{\"nic.tx_frames\":0,") && json.contains("\"rnic.pd\":0"), "{json}");
        // No engine yet: empty tables.
        assert_eq!(request(&path, "tcb").unwrap(), "");
        assert_eq!(request(&path, "qps json").unwrap(), "[]\n");
        assert_eq!(request(&path, "--json cqs").unwrap(), "[]\n");
        assert_eq!(request(&path, "mrs").unwrap(), "");
        // Faults over the socket: the answer or the error.
        let err = request(&path, "fault rst --qp 1").unwrap_err();
        assert_eq!(err.to_string(), "no QP 1");
        assert!(request(&path, "stats").unwrap().lines().any(|l| l == "fault.refused 1"));
        assert!(request(&path, "--json fault device-fatal").unwrap_err().to_string().contains("no driver attached"));
        let err = request(&path, "reboot").unwrap_err();
        assert!(err.to_string().contains("unrecognized subcommand 'reboot'"), "{err}");
        assert!(request(&path, "tcb xml").is_err());
        // An endless request line is cut off, not buffered: the answer is
        // an error (or a reset, the rest being unread), and the server
        // goes on serving.
        let mut s = UnixStream::connect(&path).unwrap();
        let _ = s.write_all(&[b'x'; 65536]);
        let mut answer = String::new();
        match s.read_to_string(&mut answer) {
            Ok(_) => assert!(answer.starts_with("error:"), "{answer}"),
            Err(e) => assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
        }
        assert!(request(&path, "stats").is_ok());
    }

    #[test]
    fn a_silent_client_holds_up_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let (_nic, path) = serving(dir.path());
        // Connected, request not yet sent: a server serving one client at
        // a time would answer the next only after this one's 5 s read
        // timeout, and this one would be gone by then.
        let mut silent = UnixStream::connect(&path).unwrap();
        assert!(request(&path, "stats").unwrap().lines().any(|l| l == "rnic.qp 0"));
        silent.write_all(b"qps\n").unwrap();
        let mut answer = String::new();
        silent.read_to_string(&mut answer).unwrap();
        assert_eq!(answer, "");
    }

    #[test]
    fn one_client_too_many_is_told_so() {
        // A server of its own: no earlier client's thread still counted.
        let dir = tempfile::tempdir().unwrap();
        let (_nic, path) = serving(dir.path());
        let held: Vec<UnixStream> = (0..MAX_CLIENTS).map(|_| UnixStream::connect(&path).unwrap()).collect();
        let err = request(&path, "stats").unwrap_err();
        assert_eq!(err.to_string(), format!("busy ({MAX_CLIENTS} clients at once)"));
        drop(held);
    }

    #[test]
    fn capture_over_the_socket() {
        use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketOption;
        use pcap_file::pcapng::{Block, PcapNgReader};
        use std::os::unix::net::UnixDatagram;

        let dir = tempfile::tempdir().unwrap();
        let peer = UnixDatagram::bind(dir.path().join("p")).unwrap();
        let (device, path) = serving(dir.path());
        let pcap = dir.path().join("wire.pcapng");

        assert_eq!(request(&path, "capture stop").unwrap_err().to_string(), "no capture is running");
        let err = request(&path, "capture start /nonexistent-vt3/x.pcapng").unwrap_err().to_string();
        assert!(err.starts_with("cannot create /nonexistent-vt3/x.pcapng: No such file"), "{err}");
        let started = request(&path, &format!("--json capture start {}", pcap.display())).unwrap();
        assert_eq!(started, format!("{{\"capture\":\"started\",\"file\":\"{}\"}}\n", pcap.display()));
        let again = request(&path, "capture start /tmp/other.pcapng").unwrap_err().to_string();
        assert!(again.starts_with("a capture is running already"), "{again}");
        assert!(request(&path, "stats").unwrap().lines().any(|l| l == "capture.active 1"));

        // One frame each way: the guest's out, the peer's in.
        let mut out = vec![0u8; 60];
        out[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
        assert_eq!(device.eth().from_guest(&out), crate::nic::GuestFrame::Uplink);
        let mut got = [0u8; 100];
        assert_eq!(peer.recv(&mut got).unwrap(), 60);
        let inbound = vec![0xabu8; 64];
        peer.send_to(&inbound, dir.path().join("u")).unwrap();
        let mut batch = crate::uplink::RecvBatch::default();
        let mut seen = None;
        for _ in 0..100 {
            if let Some(f) = batch.next_frame(device.eth().uplink()).unwrap() {
                seen = Some(f.to_vec());
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(seen.as_deref(), Some(&inbound[..]));

        let stopped = request(&path, "capture stop").unwrap();
        assert_eq!(stopped, format!("capture to {} stopped: 2 frames written\n", pcap.display()));
        let stats = request(&path, "stats").unwrap();
        for line in
            ["capture.active 0", "capture.started 1", "capture.frames 2", "capture.bytes 124", "capture.dropped 0"]
        {
            assert!(stats.lines().any(|l| l == line), "{line}: {stats}");
        }
        let mut reader = PcapNgReader::new(std::fs::File::open(&pcap).unwrap()).unwrap();
        let mut frames = Vec::new();
        while let Some(block) = reader.next_block() {
            if let Block::EnhancedPacket(epb) = block.unwrap() {
                let flags: Vec<u32> = epb
                    .options
                    .iter()
                    .filter_map(|o| if let EnhancedPacketOption::Flags(f) = o { Some(*f) } else { None })
                    .collect();
                frames.push((flags, epb.data.into_owned()));
            }
        }
        assert_eq!(frames, vec![(vec![2], out), (vec![1], inbound)]);
    }

    #[test]
    fn tcb_and_qp_tables_of_a_live_engine() {
        use crate::abi::{CmdListen, CmdSetAddr, SockAddr};
        use crate::control::Request;
        use crate::rnic::{Instant, Limits};
        use vm_memory::{GuestAddress, GuestMemoryMmap};

        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mut rnic = Rnic::new(Limits::default(), 1500);
        let now = Instant::from_millis(1);
        let addr = CmdSetAddr { mac: [0x52, 0x54, 0, 0, 0, 1], prefix_len: 24, reserved: 0, ipv4: [10, 0, 0, 1] };
        rnic.execute(&mem, now, &Request::SetAddr(addr)).unwrap();
        let listen = CmdListen {
            local: SockAddr { ipv4: [0; 4], port: 7174u16.to_be_bytes(), reserved: 0.into() },
            backlog: 2.into(),
            reserved: 0.into(),
        };
        rnic.execute(&mem, now, &Request::Listen(listen)).unwrap();
        let rows = tcb_rows(&rnic);
        assert_eq!(rows.len(), 1, "one listening socket, whatever the backlog");
        assert_eq!(rows[0][1], ("state", Value::from("LISTEN")));
        let text = text_table(&rows);
        assert!(text.starts_with("id ") && text.lines().count() == 2, "{text}");
        let json = json_table(&rows);
        assert!(json.contains("\"state\":\"LISTEN\"") && json.contains("\"srtt_us\":null"), "{json}");
        assert!(qp_rows(&rnic).is_empty());
    }

    /// A NIC whose guest set its address and made a PD, a CQ, a DMA MR and
    /// a QP (not connected).
    fn nic_with_resources(dir: &std::path::Path) -> (Arc<T3>, vm_memory::GuestMemoryMmap) {
        use crate::abi::{CmdCreateCq, CmdCreateQp, CmdRegMr, CmdSetAddr};
        use crate::control::Request;
        use crate::rnic::Instant;
        use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

        let spec: UplinkSpec =
            format!("unix-dgram:{},{}", dir.join("u").display(), dir.join("p").display()).parse().unwrap();
        let device = Arc::new(T3::new(spec.open().unwrap(), None, 1500));
        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        for (pbl, page) in [(0x1000u64, 0x4000u64), (0x1100, 0x5000), (0x1200, 0x6000)] {
            mem.write_obj(page.to_le(), GuestAddress(pbl)).unwrap();
        }
        let now = Instant::from_millis(1);
        let mut rnic = device.rnic();
        let addr = CmdSetAddr { mac: [0x52, 0x54, 0, 0, 0, 1], prefix_len: 24, reserved: 0, ipv4: [10, 0, 0, 1] };
        rnic.execute(&mem, now, &Request::SetAddr(addr)).unwrap();
        let handle = |r: Vec<u8>| abi::read_struct::<abi::RespHandle>(&r).unwrap().handle.to_native();
        let pdn = handle(rnic.execute(&mem, now, &Request::AllocPd).unwrap());
        let cq = CmdCreateCq {
            ring_pbl_addr: 0x1000.into(),
            status_addr: 0x3000.into(),
            ring_npages: 1.into(),
            depth: 16.into(),
        };
        let cqn = handle(rnic.execute(&mem, now, &Request::CreateCq(cq)).unwrap());
        let mr = CmdRegMr {
            iova: 0x10_0000.into(),
            length: 0x1000.into(),
            pdn: pdn.into(),
            access: 7.into(),
            flags: (abi::MrFlag::Dma as u32 | abi::MrFlag::UnsafeGlobalRkey as u32).into(),
            ..Default::default()
        };
        rnic.execute(&mem, now, &Request::RegMr(mr)).unwrap();
        let qp = CmdCreateQp {
            sq_pbl_addr: 0x1100.into(),
            rq_pbl_addr: 0x1200.into(),
            status_addr: 0x3100.into(),
            sq_npages: 1.into(),
            rq_npages: 1.into(),
            sq_depth: 16.into(),
            rq_depth: 16.into(),
            pdn: pdn.into(),
            send_cqn: cqn.into(),
            recv_cqn: cqn.into(),
            max_send_sge: 4.into(),
            max_recv_sge: 4.into(),
            ..Default::default()
        };
        rnic.execute(&mem, now, &Request::CreateQp(qp)).unwrap();
        drop(rnic);
        (device, mem)
    }

    #[test]
    fn cq_and_mr_tables() {
        let dir = tempfile::tempdir().unwrap();
        let (device, _mem) = nic_with_resources(dir.path());
        let chaos = chaos::Control::default();
        let answer = |line: &str, device: &Arc<T3>| answer(line, device, &chaos);
        let cqs = answer("cqs", &device);
        assert_eq!(cqs, "cqn depth prod armed qps overflowed pages\n1   16    0    -     2   no         1\n", "{cqs}");
        let json = answer("--json cqs", &device);
        assert_eq!(
            json,
            "[{\"cqn\":1,\"depth\":16,\"prod\":0,\"armed\":null,\"qps\":2,\"overflowed\":false,\"pages\":1}]\n"
        );
        let mrs = answer("mrs", &device);
        assert!(mrs.starts_with("stag  pdn access   iova     length kind pages valid\n0x101 1   lw,rw,rr 0x100000 4096   dma  -     yes\n"), "{mrs}");
        let json = answer("mrs json", &device);
        assert!(
            json.contains("\"stag\":\"0x101\",\"pdn\":1,\"access\":\"lw,rw,rr\"") && json.contains("\"valid\":true"),
            "{json}"
        );
        assert!(answer("qps", &device).contains("IDLE"));
    }

    #[test]
    fn fault_answers_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (device, mem) = nic_with_resources(dir.path());
        let chaos = chaos::Control::default();
        let ask = |line: &str| answer(line, &device, &chaos);
        // Errors name the problem, in both formats.
        assert_eq!(ask("fault rst --qp 9"), "error: no QP 9\n");
        assert_eq!(ask("--json fault fin --qp 9"), "error: no QP 9\n");
        assert_eq!(ask("fault blackhole --qp 1"), "error: QP 1 is IDLE: not connected\n");
        let bad = ask("fault terminate --qp 1 --layer 0 --etype 2 --ecode 0");
        assert!(
            bad.starts_with("error: not an RFC 5040 TERMINATE code: RDMAP error type 2 has no error code 0x00"),
            "{bad}"
        );
        assert!(ask("fault terminate --qp 1 --layer 3 --etype 0 --ecode 0").contains("layer 3 is none of"));
        assert!(ask("fault drop --qp 1 --percent 200").starts_with("error: "));
        assert!(ask("fault").starts_with("error: "));
        // By what a user knows: nothing matches, nothing is injected.
        assert_eq!(
            ask("fault rst --port 4420"),
            "error: no live connection matches --port 4420: nothing injected (vt3d ctl qps lists them)\n"
        );
        assert!(ask("fault rst --peer 10.0.0.9:7174").contains("no live connection matches --peer 10.0.0.9:7174"));
        assert!(ask("--json fault fin --all").contains("no live connection matches --all"));
        // Armed for the next connection on a port: answered at once.
        let armed = ask("--json fault rst --port 4420 --arm");
        assert!(armed.starts_with("{\"fault\":\"rst\",\"armed\":true,\"port\":4420,"), "{armed}");
        assert_eq!(device.rnic().armed().len(), 1);
        assert!(ask("fault rst --all --arm").contains("--port"));
        // Invalidate an STag: text, then JSON for another one.
        let text = ask("fault invalidate-stag --stag 0x101");
        assert!(text.starts_with("STag 0x101 (PD 1, iova 0x100000, 4096 octets) invalidated"), "{text}");
        assert_eq!(ask("fault invalidate-stag --stag 257"), "error: STag 0x101 is invalid already\n");
        assert!(ask("mrs").contains(" no\n"));
        // Device fatal: needs a driver to tell; JSON answer.
        assert!(ask("fault device-fatal").contains("no driver attached"));
        device.rnic().set_driver_mac([0x52, 0x54, 0, 0, 0, 1]);
        let json = ask("--json fault device-fatal");
        assert!(
            json.starts_with("{\"fault\":\"device-fatal\",\"state\":null,\"detail\":\"device fatal: 1 QPs -> ERROR"),
            "{json}"
        );
        // The worker carries it out at its next run.
        let mut frames = Vec::new();
        device.rnic().service(crate::rnic::Instant::from_millis(2), &mem, &mut |f: &[u8]| frames.push(f.to_vec()));
        assert!(ask("qps").contains("ERROR"));
        let stats = ask("stats");
        for line in [
            "fault.invalidate_stag 1",
            "fault.device_fatal 1",
            "fault.refused 10",
            "rnic.fatal 1",
            "rnic.tcp_timeout_s 15",
        ] {
            assert!(stats.lines().any(|l| l == line), "{line}: {stats}");
        }
        assert!(ask("fault rst --qp 1").contains("fatal"));
    }

    #[test]
    fn tables_render_as_text_and_json() {
        let rows: Vec<Row> = vec![
            vec![("qpn", 1u32.into()), ("state", "RTS".into()), ("remote", Value::None)],
            vec![("qpn", 12u32.into()), ("state", "a\"b".into()), ("remote", "10.0.0.2:7174".into())],
        ];
        assert_eq!(text_table(&rows), "qpn state remote\n1   RTS   -\n12  a\"b   10.0.0.2:7174\n");
        assert_eq!(
            json_table(&rows),
            "[{\"qpn\":1,\"state\":\"RTS\",\"remote\":null},{\"qpn\":12,\"state\":\"a\\\"b\",\"remote\":\"10.0.0.2:7174\"}]\n"
        );
    }
}
