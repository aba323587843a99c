"""A small synchronous QMP client (QEMU Machine Protocol: JSON lines over a
unix socket). Enough for link up/down, status and quit."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path


class QmpError(Exception):
    pass


class Qmp:
    def __init__(self, path: Path, timeout: float = 10.0):
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
        self.file = self.sock.makefile("rwb", buffering=0)
        greeting = self._read()
        if "QMP" not in greeting:
            raise QmpError(f"not a QMP greeting: {greeting}")
        self.events: list[dict] = []
        self.execute("qmp_capabilities")

    def _read(self) -> dict:
        line = self.file.readline()
        if not line:
            raise QmpError("QMP connection closed")
        return json.loads(line)

    def execute(self, command: str, **arguments):
        msg = {"execute": command}
        if arguments:
            msg["arguments"] = arguments
        self.file.write(json.dumps(msg).encode() + b"\n")
        while True:
            reply = self._read()
            if "event" in reply:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise QmpError(f"{command}: {reply['error'].get('desc', reply['error'])}")
            return reply.get("return")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
