//! The vhost-user relay's socket calls survive signals. A signal whose
//! handler was installed without SA_RESTART interrupts a blocking
//! `recvmsg` with EINTR; the relay must take that as "try again", not as
//! the end of QEMU's connection. (The `vhost_user_relay` fuzz target found
//! it: libFuzzer's timer signal interrupted a relay mid-message.) A test
//! binary of its own: the signal handler is process-wide.

#![allow(clippy::unwrap_used)]

use std::os::unix::net::UnixStream;
use std::os::unix::thread::JoinHandleExt;
use std::thread;
use std::time::Duration;

use vt3d::vhost::relay::Message;

extern "C" fn ignore(_: libc::c_int) {}

fn interrupt_with(signal: libc::c_int) {
    // SAFETY: all-zero bytes are a valid sigaction (no handler, no flags).
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    action.sa_sigaction = ignore as extern "C" fn(libc::c_int) as usize;
    // SAFETY: sa_mask is a sigset_t of ours to initialise.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: the handler does nothing, so it is async-signal-safe; no
    // SA_RESTART, so blocking calls see EINTR.
    assert_eq!(unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) }, 0);
}

#[test]
fn a_message_is_read_across_signals() {
    interrupt_with(libc::SIGUSR1);
    let (qemu, relay_end) = UnixStream::pair().unwrap();
    let reader =
        thread::spawn(move || Message::read_from(&relay_end).map(|m| m.map(|m| (m.request(), m.payload().to_vec()))));
    let thread = reader.as_pthread_t();
    // The reader blocks in recvmsg: interrupt it there, again and again.
    for _ in 0..20 {
        thread::sleep(Duration::from_millis(5));
        // SAFETY: the reader is alive (it returns only after the write
        // below), so its pthread_t is valid.
        assert_eq!(unsafe { libc::pthread_kill(thread, libc::SIGUSR1) }, 0);
    }
    let wrote = Message::new(24, 1, &7u64.to_le_bytes()).write_to(&qemu);
    let got = reader.join().unwrap();
    assert_eq!(got.unwrap(), Some((24, 7u64.to_le_bytes().to_vec())), "the message, after 20 interruptions");
    wrote.unwrap();
}
