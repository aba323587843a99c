//! Tests of the tap uplink; those on real taps need CAP_NET_ADMIN (CI
//! runs as root).
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use super::*;

#[test]
fn rejects_overlong_name() {
    let err = TapUplink::open("0123456789abcdefg").unwrap_err();
    assert!(matches!(
        err.kind(),
        io::ErrorKind::InvalidInput | io::ErrorKind::NotFound | io::ErrorKind::PermissionDenied
    ));
}

/// Needs CAP_NET_ADMIN (CI runs as root): the interface appears while
/// the uplink is open and reading it without traffic does not block.
#[test]
fn creates_the_interface() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("creates_the_interface: not root, cannot create a tap");
        return;
    }
    let name = format!("vt3t{}", std::process::id() % 100_000);
    let tap = TapUplink::open(&name).unwrap();
    assert!(std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
    let mut batch = crate::uplink::RecvBatch::default();
    assert_eq!(batch.next_frame(&tap).unwrap(), None);
    drop(tap);
    assert!(!std::path::Path::new(&format!("/sys/class/net/{name}")).exists());
}
