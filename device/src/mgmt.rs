//! The management socket (`vt3d serve --mgmt PATH`) and its client
//! (`vt3d ctl`): one request line per connection, one answer.
//!
//! Requests: `stats text` | `stats json`. Later: TCB dump, QP/CQ/MR tables,
//! fault injection (DESIGN.md §6).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use crate::nic::Nic;

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

/// The answer to one request line.
pub fn answer(request: &str, nic: &Nic) -> String {
    let rows = stats_rows(nic);
    match request.split_whitespace().collect::<Vec<_>>().as_slice() {
        ["stats"] | ["stats", "text"] => {
            rows.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
        }
        ["stats", "json"] => {
            let body: Vec<String> = rows.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}\n", body.join(","))
        }
        _ => format!("error: unknown request {request:?} (try: stats [text|json])\n"),
    }
}

fn stats_rows(nic: &Nic) -> Vec<(String, u64)> {
    let mut rows: Vec<(String, u64)> =
        nic.stats.rows().iter().map(|(k, v)| (format!("nic.{k}"), *v)).collect();
    let c = nic.rnic().counts();
    for (k, v) in [("pd", c.pd), ("mr", c.mr), ("cq", c.cq), ("qp", c.qp)] {
        rows.push((format!("rnic.{k}"), v as u64));
    }
    rows
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
#[allow(clippy::unwrap_used)]
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
        let json = request(&path, "stats json").unwrap();
        assert!(json.starts_with("{\"nic.tx_frames\":0,") && json.contains("\"rnic.pd\":0"), "{json}");
        let err = request(&path, "reboot").unwrap_err();
        assert!(err.to_string().contains("unknown request"));
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
}
