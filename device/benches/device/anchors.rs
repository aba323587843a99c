//! The host's own numbers, measured in the same run as vt3d: TCP over
//! loopback, the raw datagram rate of each uplink and a datagram
//! ping-pong. All spin on non-blocking sockets, as vt3d's worker does not
//! (it waits in epoll): they are the ceiling, not a peer.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::vt3d::UplinkKind;

const MIB: usize = 1 << 20;

/// A connected, non-blocking datagram socket of either kind.
enum Dgram {
    Udp(UdpSocket),
    Unix(UnixDatagram),
}

impl Dgram {
    fn pair(kind: UplinkKind, dir: &Path, tag: &str) -> (Self, Self) {
        match kind {
            UplinkKind::Udp => {
                let a = UdpSocket::bind("127.0.0.1:0").expect("bind");
                let b = UdpSocket::bind("127.0.0.1:0").expect("bind");
                a.connect(b.local_addr().expect("addr")).expect("connect");
                b.connect(a.local_addr().expect("addr")).expect("connect");
                a.set_nonblocking(true).expect("nonblocking");
                b.set_nonblocking(true).expect("nonblocking");
                (Self::Udp(a), Self::Udp(b))
            }
            UplinkKind::Tap => panic!("no raw datagram anchor for a tap"),
            UplinkKind::UnixDgram => {
                let (pa, pb) = (dir.join(format!("{tag}.a")), dir.join(format!("{tag}.b")));
                let _ = (std::fs::remove_file(&pa), std::fs::remove_file(&pb));
                let a = UnixDatagram::bind(&pa).expect("bind");
                let b = UnixDatagram::bind(&pb).expect("bind");
                a.connect(&pb).expect("connect");
                b.connect(&pa).expect("connect");
                a.set_nonblocking(true).expect("nonblocking");
                b.set_nonblocking(true).expect("nonblocking");
                (Self::Unix(a), Self::Unix(b))
            }
        }
    }

    /// Sends one datagram, spinning while the queue is full (up to 2 ms).
    fn send(&self, data: &[u8]) -> bool {
        let start = Instant::now();
        loop {
            let r = match self {
                Self::Udp(s) => s.send(data),
                Self::Unix(s) => s.send(data),
            };
            match r {
                Ok(_) => return true,
                Err(e) if e.kind() == ErrorKind::WouldBlock && start.elapsed() < Duration::from_millis(2) => {
                    std::hint::spin_loop();
                }
                Err(_) => return false,
            }
        }
    }

    /// Blocking, but never for long: a sender left blocked on a full
    /// queue once its receiver stopped must still see the end.
    fn set_blocking(&self) {
        let limit = Some(Duration::from_millis(50));
        let r = match self {
            Self::Udp(s) => s
                .set_nonblocking(false)
                .and_then(|()| s.set_write_timeout(limit))
                .and_then(|()| s.set_read_timeout(limit)),
            Self::Unix(s) => s
                .set_nonblocking(false)
                .and_then(|()| s.set_write_timeout(limit))
                .and_then(|()| s.set_read_timeout(limit)),
        };
        r.expect("blocking socket");
    }

    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        match self {
            Self::Udp(s) => s.recv(buf).ok(),
            Self::Unix(s) => s.recv(buf).ok(),
        }
    }
}

/// TCP over loopback, 1 MiB writes: octets per second.
pub fn tcp_loopback(secs: f64) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let duration = Duration::from_secs_f64(secs);
    let writer = thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).expect("connect");
        let chunk = vec![0x5au8; MIB];
        let start = Instant::now();
        while start.elapsed() < duration + Duration::from_millis(300) {
            if stream.write_all(&chunk).is_err() {
                break;
            }
        }
    });
    let (mut stream, _) = listener.accept().expect("accept");
    let mut buf = vec![0u8; MIB];
    let warm = Instant::now();
    while warm.elapsed() < Duration::from_millis(100) {
        let _ = stream.read(&mut buf);
    }
    let start = Instant::now();
    let mut total = 0u64;
    while start.elapsed() < duration {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => total += n as u64,
        }
    }
    let rate = total as f64 / start.elapsed().as_secs_f64();
    drop(stream);
    let _ = writer.join();
    rate
}

/// Datagrams of `size` octets one way as fast as they go: received per
/// second. Blocking sockets, as a worker waiting in epoll: on a shared
/// machine two spinning threads measure the scheduler, not the socket.
pub fn datagram_rate(kind: UplinkKind, size: usize, secs: f64, dir: &Path) -> f64 {
    let (a, b) = Dgram::pair(kind, dir, &format!("rate{size}"));
    a.set_blocking();
    b.set_blocking();
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let frame = vec![0x33u8; size];
            while !stop.load(Ordering::Relaxed) {
                a.send(&frame);
            }
        })
    };
    let mut buf = vec![0u8; 65_536];
    let _ = b.recv(&mut buf); // the first one starts the clock
    let start = Instant::now();
    let mut frames = 0u64;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        if b.recv(&mut buf).is_some() {
            frames += 1;
        }
    }
    let rate = frames as f64 / start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let _ = sender.join();
    rate
}

/// 64-octet ping-pong, both sides spinning: median round trip, µs.
pub fn datagram_ping_pong(kind: UplinkKind, secs: f64, dir: &Path) -> f64 {
    let (a, b) = Dgram::pair(kind, dir, "pingpong");
    let stop = Arc::new(AtomicBool::new(false));
    let echo = {
        let stop = Arc::clone(&stop);
        thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while !stop.load(Ordering::Relaxed) {
                match b.recv(&mut buf) {
                    Some(n) => {
                        b.send(buf.get(..n).unwrap_or_default());
                    }
                    None => thread::yield_now(),
                }
            }
        })
    };
    let mut buf = [0u8; 2048];
    let ping = [7u8; 64];
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let sent = Instant::now();
        a.send(&ping);
        while a.recv(&mut buf).is_none() {
            if sent.elapsed() > Duration::from_secs(1) {
                break; // lost: not a sample
            }
            thread::yield_now();
        }
        samples.push(sent.elapsed().as_secs_f64() * 1e6);
    }
    stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
    crate::run::median(&mut samples)
}
