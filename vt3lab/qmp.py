"""A small synchronous QMP client (QEMU Machine Protocol: JSON lines over a
unix socket): commands, and the events QEMU sends (kept in order, waited
for by name). Hand-written rather than qemu.qmp (PyPI): Debian 12 has no
package of it, and a bundle's lab must need nothing downloaded."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any


class QmpError(Exception):
    pass


class Qmp:
    def __init__(self, path: Path, timeout: float = 10.0):
        self.timeout = timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                self.sock.settimeout(timeout)
                self.sock.connect(str(path))
                break
            except (FileNotFoundError, ConnectionRefusedError):
                self.sock.close()
                if time.monotonic() > deadline:
                    raise QmpError(f"no QMP socket at {path}") from None
                time.sleep(0.05)
        # Bytes received and not yet a whole line: a wait that times out
        # mid-line keeps them for the next read.
        self._buf = b""
        greeting = self._read()
        if "QMP" not in greeting:
            raise QmpError(f"not a QMP greeting: {greeting}")
        self.events: list[dict] = []
        self.execute("qmp_capabilities")

    def _read(self) -> dict:
        while b"\n" not in self._buf:
            data = self.sock.recv(65536)
            if not data:
                raise QmpError("QMP connection closed")
            self._buf += data
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def execute(self, command: str, **arguments):
        msg = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        self.sock.sendall(json.dumps(msg).encode() + b"\n")
        while True:
            reply = self._read()
            if "event" in reply:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise QmpError(f"{command}: {reply['error'].get('desc', reply['error'])}")
            return reply.get("return")

    def wait_event(self, name: str, timeout: float = 30.0, **data: Any) -> dict:
        """The first event NAME (whose "data" holds DATA, e.g.
        device="n0") received since the last one taken, removed from
        `events`; QmpError after TIMEOUT seconds."""
        def matches(event: dict) -> bool:
            return event.get("event") == name and all(event.get("data", {}).get(k) == v for k, v in data.items())

        deadline = time.monotonic() + timeout
        while True:
            for i, event in enumerate(self.events):
                if matches(event):
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            if left <= 0:
                raise QmpError(f"no {name} event {data or ''} within {timeout:.0f} s")
            self.sock.settimeout(left)
            try:
                message = self._read()
            except socket.timeout:
                continue
            finally:
                self.sock.settimeout(self.timeout)
            if "event" in message:
                self.events.append(message)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
