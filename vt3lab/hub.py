"""One Ethernet segment for the lab's guests: a learning switch between
unix datagram sockets, one frame per datagram (what vt3d's unix-dgram
uplink and QEMU's -netdev dgram exchange).

    python3 -m vt3lab.hub DIR NAME=PEER [NAME=PEER ...]

Port NAME is the socket DIR/hub.NAME; its peer PEER is the socket of a
vt3d uplink (unix-dgram:PEER,DIR/hub.NAME) or of a QEMU NIC
(-netdev dgram,local…=PEER,remote…=DIR/hub.NAME). A port takes frames
from its peer only. A frame's source MAC is learnt on the port it came
in on; a frame for a learnt unicast MAC leaves by that port alone (or
nowhere, if that is where it came from), any other (broadcast, multicast,
unknown unicast) is flooded to every other port. A peer that is not
there or whose queue is full loses the frame, as on a real switch; the
counters go to the log at the end (SIGTERM/SIGINT)."""

from __future__ import annotations

import argparse
import selectors
import signal
import socket
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ETH_HEADER = 14
MAX_FRAME = 65536
SOCKET_BUFFER = 4 << 20


@dataclass(eq=False)
class Port:
    name: str
    peer: str
    sock: socket.socket
    counters: Counter = field(default_factory=Counter)

    def send(self, frame: bytes) -> None:
        try:
            self.sock.sendto(frame, self.peer)
            self.counters["tx"] += 1
        except BlockingIOError:
            self.counters["tx_dropped_full"] += 1
        except (FileNotFoundError, ConnectionRefusedError):
            self.counters["tx_dropped_no_peer"] += 1


def is_group(mac: bytes) -> bool:
    """Broadcast or multicast: the I/G bit of the first octet."""
    return bool(mac[0] & 1)


class Hub:
    def __init__(self, directory: Path, peers: dict[str, str]):
        self.ports: list[Port] = []
        self.learnt: dict[bytes, Port] = {}
        self.selector = selectors.DefaultSelector()
        for name, peer in peers.items():
            path = directory / f"hub.{name}"
            path.unlink(missing_ok=True)
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(str(path))
            sock.setblocking(False)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
            port = Port(name, peer, sock)
            self.ports.append(port)
            self.selector.register(sock, selectors.EVENT_READ, port)

    def forward(self, ingress: Port, frame: bytes) -> None:
        if len(frame) < ETH_HEADER:
            ingress.counters["rx_runt"] += 1
            return
        dst, src = frame[0:6], frame[6:12]
        if not is_group(src):
            self.learnt[src] = ingress
        egress = None if is_group(dst) else self.learnt.get(dst)
        if egress is ingress:
            ingress.counters["rx_filtered"] += 1
        elif egress is not None:
            egress.send(frame)
        else:
            ingress.counters["rx_flooded"] += 1
            for port in self.ports:
                if port is not ingress:
                    port.send(frame)

    def serve(self) -> None:
        while True:
            for key, _ in self.selector.select():
                port: Port = key.data
                while True:
                    try:
                        frame, sender = port.sock.recvfrom(MAX_FRAME)
                    except BlockingIOError:
                        break
                    if sender != port.peer:
                        port.counters["rx_stranger"] += 1
                        continue
                    port.counters["rx"] += 1
                    self.forward(port, frame)

    def report(self) -> str:
        lines = [f"port {p.name} (peer {p.peer}): " + ", ".join(f"{k} {v}" for k, v in sorted(p.counters.items()))
                 for p in self.ports]
        lines.append("learnt: " + ", ".join(f"{mac.hex(':')} on {p.name}" for mac, p in self.learnt.items()))
        return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(prog="vt3lab.hub", description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path, help="where the hub's sockets (hub.NAME) go")
    ap.add_argument("ports", nargs="+", metavar="NAME=PEER", help="a port and its peer's socket")
    args = ap.parse_args()
    peers = {}
    for spec in args.ports:
        name, sep, peer = spec.partition("=")
        if not sep or not name or not peer:
            ap.error(f"'{spec}' is not NAME=PEER")
        peers[name] = peer
    hub = Hub(args.directory, peers)

    def stop(signum, _frame):
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"hub: {len(peers)} ports in {args.directory}", flush=True)
    try:
        hub.serve()
    finally:
        print(hub.report(), flush=True)
        for port in hub.ports:
            (args.directory / f"hub.{port.name}").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
