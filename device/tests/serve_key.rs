//! `vt3d serve` and the provisioned key (docs/security.md): no key, no
//! device, unless told to run unauthenticated.

#![allow(clippy::unwrap_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn vt3d() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vt3d"));
    c.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    c
}

fn serve_args(dir: &std::path::Path) -> Vec<String> {
    let socket = dir.join("g.vhost");
    let uplink = format!("unix-dgram:{},{}", dir.join("up").display(), dir.join("peer").display());
    vec!["serve".into(), "--socket".into(), socket.display().to_string(), "--uplink".into(), uplink]
}

#[test]
fn without_a_key_vt3d_refuses_to_start_and_says_what_to_add() {
    let dir = tempfile::tempdir().unwrap();
    let out = vt3d().args(serve_args(dir.path())).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for needle in ["--key-file", "-fw_cfg name=opt/vt3/key,file=", "--insecure-no-key"] {
        assert!(err.contains(needle), "no {needle:?} in: {err}");
    }
    assert!(!dir.path().join("g.vhost").exists(), "it listened anyway");
}

#[test]
fn a_key_file_of_the_wrong_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("g.key");
    std::fs::write(&key, b"short").unwrap();
    let out = vt3d().args(serve_args(dir.path())).arg("--key-file").arg(&key).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("holds 5 bytes, not 16"), "{err}");
    assert_eq!(std::fs::read(&key).unwrap(), b"short");
}

/// A missing key file is made (0600) and vt3d serves.
#[test]
fn a_missing_key_file_is_made_private_and_vt3d_serves() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("g.key");
    let mut child = vt3d().args(serve_args(dir.path())).arg("--key-file").arg(&key).spawn().unwrap();
    let start = Instant::now();
    while !dir.path().join("g.vhost").exists() {
        assert!(child.try_wait().unwrap().is_none(), "vt3d exited");
        assert!(start.elapsed() < Duration::from_secs(20), "vt3d did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let meta = std::fs::metadata(&key).unwrap();
    assert_eq!((meta.len(), meta.permissions().mode() & 0o777), (16, 0o600));
    child.kill().unwrap();
    child.wait().unwrap();
}
