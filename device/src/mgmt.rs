//! The management socket (`vt3d serve --mgmt PATH`) and its client
//! (`vt3d ctl`): one request line per connection, one answer.
//!
//! Requests: `stats`, `tcb` (the TOE's TCB table, like cxgbtool's) and
//! `qps` (the QP table), each as `text` (the default) or `json`. Later:
//! CQ/MR tables, fault injection (DESIGN.md §6).

use std::fmt::Write as _;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use vt3_iwarp::toe::TcbInfo;

use crate::nic::Nic;
use crate::rnic::Rnic;

/// Longest request line accepted.
const MAX_REQUEST: u64 = 256;

/// Serves the management socket on a background thread for the life of
/// the process.
pub fn spawn(listener: UnixListener, nic: Arc<Nic>) -> io::Result<thread::JoinHandle<()>> {
    thread::Builder::new().name("vt3d-mgmt".into()).spawn(move || {
        for conn in listener.incoming() {
            match conn {
                Ok(stream) => {
                    if let Err(e) = serve_one(stream, &nic) {
                        log::debug!("mgmt: {e}");
                    }
                }
                Err(e) => log::warn!("mgmt accept: {e}"),
            }
        }
    })
}

fn serve_one(stream: UnixStream, nic: &Nic) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line)?;
    let answer = answer(line.trim(), nic);
    (&stream).write_all(answer.as_bytes())
}

/// One cell of a table.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Num(u64),
    Text(String),
    None,
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
        Value::Text(s) => s.clone(),
        Value::None => "-".to_owned(),
    }
}

fn json_cell(v: &Value) -> String {
    match v {
        Value::Num(n) => n.to_string(),
        Value::Text(s) => format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\"")),
        Value::None => "null".to_owned(),
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

fn json_object(row: &Row) -> String {
    let body: Vec<String> = row.iter().map(|(k, v)| format!("\"{k}\":{}", json_cell(v))).collect();
    format!("{{{}}}", body.join(","))
}

fn json_table(rows: &[Row]) -> String {
    let body: Vec<String> = rows.iter().map(json_object).collect();
    format!("[{}]\n", body.join(","))
}

/// The answer to one request line.
pub fn answer(request: &str, nic: &Nic) -> String {
    let words: Vec<&str> = request.split_whitespace().collect();
    let json = match words.get(1..) {
        Some([]) | Some(["text"]) => false,
        Some(["json"]) => true,
        _ => return unknown(request),
    };
    match words.first() {
        Some(&"stats") => {
            let rows = stats_rows(nic);
            if json {
                let body: Vec<String> = rows.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                format!("{{{}}}\n", body.join(","))
            } else {
                rows.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
            }
        }
        Some(&"tcb") => table(&tcb_rows(&nic.rnic()), json),
        Some(&"qps") => table(&qp_rows(&nic.rnic()), json),
        _ => unknown(request),
    }
}

fn unknown(request: &str) -> String {
    format!("error: unknown request {request:?} (try: stats|tcb|qps [text|json])\n")
}

fn table(rows: &[Row], json: bool) -> String {
    if json {
        json_table(rows)
    } else {
        text_table(rows)
    }
}

fn stats_rows(nic: &Nic) -> Vec<(String, u64)> {
    let mut rows: Vec<(String, u64)> =
        nic.stats.rows().iter().map(|(k, v)| (format!("nic.{k}"), *v)).collect();
    let rnic = nic.rnic();
    let c = rnic.counts();
    for (k, v) in [("pd", c.pd), ("mr", c.mr), ("cq", c.cq), ("qp", c.qp)] {
        rows.push((format!("rnic.{k}"), v as u64));
    }
    let e = rnic.offload().map(|o| o.engine().stats()).unwrap_or_default();
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
    ]
}

fn tcb_rows(rnic: &Rnic) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(offload) = rnic.offload() {
        offload.engine().for_each_tcb(&mut |t| rows.push(tcb_row(t)));
    }
    rows
}

fn qp_rows(rnic: &Rnic) -> Vec<Row> {
    let engine = rnic.offload().map(|o| o.engine());
    rnic.qps
        .iter()
        .map(|(qpn, qp)| {
            let info = engine.and_then(|e| e.qp_info(qpn));
            let tuple = info.and_then(|i| i.tuple).or(qp.tuple);
            let mpa = info.and_then(|i| i.negotiated).map(|n| format!("rev{}{}", n.revision, if n.crc { "+crc" } else { "" }));
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

    #[test]
    fn stats_over_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let spec: UplinkSpec = format!("unix-dgram:{},{}", dir.path().join("u").display(), dir.path().join("p").display())
            .parse()
            .unwrap();
        let nic = Arc::new(Nic::new(spec.open().unwrap(), None, 1500));
        let path = dir.path().join("mgmt");
        spawn(UnixListener::bind(&path).unwrap(), Arc::clone(&nic)).unwrap();

        let text = request(&path, "stats").unwrap();
        assert!(text.lines().any(|l| l == "rnic.qp 0"), "{text}");
        assert!(text.lines().any(|l| l == "nic.tx_frames 0"), "{text}");
        assert!(text.lines().any(|l| l == "iwarp.fpdus_tx 0"), "{text}");
        let json = request(&path, "stats json").unwrap();
        assert!(json.starts_with("{\"nic.tx_frames\":0,") && json.contains("\"rnic.pd\":0"), "{json}");
        // No engine yet: empty tables.
        assert_eq!(request(&path, "tcb").unwrap(), "");
        assert_eq!(request(&path, "qps json").unwrap(), "[]\n");
        let err = request(&path, "reboot").unwrap_err();
        assert!(err.to_string().contains("unknown request"));
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
    fn tcb_and_qp_tables_of_a_live_engine() {
        use crate::abi::{Cmd, CmdListen, CmdSetAddr, SockAddr};
        use crate::rnic::{Instant, Limits};
        use vm_memory::{ByteValued, GuestAddress, GuestMemoryMmap};

        let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap();
        let mut rnic = Rnic::new(Limits::default(), 1500);
        let now = Instant::from_millis(1);
        let addr = CmdSetAddr { mac: [0x52, 0x54, 0, 0, 0, 1], prefix_len: 24, reserved: 0, ipv4: [10, 0, 0, 1] };
        rnic.execute(&mem, now, Cmd::SetAddr, addr.as_slice()).unwrap();
        let listen = CmdListen {
            local: SockAddr { ipv4: [0; 4], port: 7174u16.to_be_bytes(), reserved: 0.into() },
            backlog: 2.into(),
            reserved: 0.into(),
        };
        rnic.execute(&mem, now, Cmd::Listen, listen.as_slice()).unwrap();
        let rows = tcb_rows(&rnic);
        assert_eq!(rows.len(), 2, "one listening socket per backlog slot");
        assert_eq!(rows[0][1], ("state", Value::from("LISTEN")));
        let text = text_table(&rows);
        assert!(text.starts_with("id ") && text.lines().count() == 3, "{text}");
        let json = json_table(&rows);
        assert!(json.contains("\"state\":\"LISTEN\"") && json.contains("\"srtt_us\":null"), "{json}");
        assert!(qp_rows(&rnic).is_empty());
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
