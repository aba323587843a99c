//! `udp:LOCAL,REMOTE`: one frame per datagram, as QEMU's
//! `-netdev socket,udp=REMOTE,localaddr=LOCAL` sends them.

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, RawFd};

use super::{grow_socket_buffers, nonblocking, Uplink, SOCKET_BUFFER};

#[derive(Debug)]
pub struct UdpUplink {
    socket: UdpSocket,
}

impl UdpUplink {
    pub fn open(local: SocketAddr, remote: SocketAddr) -> io::Result<Self> {
        let socket = UdpSocket::bind(local)?;
        // Connecting filters what we receive to the configured peer.
        socket.connect(remote)?;
        socket.set_nonblocking(true)?;
        grow_socket_buffers(socket.as_raw_fd(), SOCKET_BUFFER);
        Ok(Self { socket })
    }
}

impl Uplink for UdpUplink {
    fn send(&self, frame: &[u8]) -> io::Result<()> {
        self.socket.send(frame).map(drop)
    }

    fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            match nonblocking(self.socket.recv(buf)) {
                // An ICMP port-unreachable from a peer that is not up yet
                // surfaces here; it is not a frame, so skip it.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                other => return other,
            }
        }
    }

    fn send_batch(&self, frames: &[&[u8]]) -> io::Result<usize> {
        match super::batch::sendmmsg(self.socket.as_raw_fd(), frames) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            other => other,
        }
    }

    fn recv_batch(&self, bufs: &mut [Vec<u8>], lens: &mut [usize]) -> io::Result<usize> {
        loop {
            match super::batch::recvmmsg(self.socket.as_raw_fd(), bufs, lens, None) {
                // An ICMP port-unreachable (see recv): not a frame.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                other => return other,
            }
        }
    }
}

impl AsRawFd for UdpUplink {
    fn as_raw_fd(&self) -> RawFd {
        self.socket.as_raw_fd()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::cast_possible_truncation)]
mod tests {
    use super::*;

    #[test]
    fn frames_cross_as_single_datagrams() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let up = UdpUplink::open("127.0.0.1:0".parse().unwrap(), peer.local_addr().unwrap())
            .unwrap();
        let up_addr = up.socket.local_addr().unwrap();

        let frame: Vec<u8> = (0..9014).map(|i| i as u8).collect();
        up.send(&frame).unwrap();
        let mut buf = vec![0u8; 65536];
        let (n, from) = peer.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&frame[..], up_addr));

        let mut buf = vec![0u8; 65536];
        assert_eq!(up.recv(&mut buf).unwrap(), None);
        peer.send_to(&frame[..60], up_addr).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(up.recv(&mut buf).unwrap(), Some(60));
        assert_eq!(&buf[..60], &frame[..60]);
    }

    #[test]
    fn datagrams_from_strangers_are_ignored() {
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        let stranger = UdpSocket::bind("127.0.0.1:0").unwrap();
        let up = UdpUplink::open("127.0.0.1:0".parse().unwrap(), peer.local_addr().unwrap())
            .unwrap();
        stranger.send_to(b"not for you", up.socket.local_addr().unwrap()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut buf = [0u8; 64];
        assert_eq!(up.recv(&mut buf).unwrap(), None);
    }
}
