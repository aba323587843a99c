"""Processes the lab owns: each in its own process group, with a bounded
lifetime, stopped TERM → KILL, and never outliving the lab (even on Ctrl-C
or when the lab itself is killed: PR_SET_PDEATHSIG)."""

from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_LIVE: "set[Process]" = set()
_LOCK = threading.Lock()


def _child_setup() -> None:
    # Runs in the child between fork and exec: die with the lab. The lab
    # spawns only from its main thread, whose exit is the lab's exit.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class Process:
    """A child in its own session (so its whole group can be signalled),
    killed after `lifetime` seconds whatever happens."""

    def __init__(self, name: str, argv: list[str], log: Path, lifetime: float,
                 env: dict[str, str] | None = None, stdin=subprocess.DEVNULL):
        self.name = name
        self.argv = argv
        self.log = log
        self._logf = open(log, "ab")
        self.popen = subprocess.Popen(
            argv, stdin=stdin, stdout=self._logf, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=_child_setup,
            env={**os.environ, **(env or {})})
        self.pid = self.popen.pid
        self.expired = False
        self._timer = threading.Timer(lifetime, self._expire)
        self._timer.daemon = True
        self._timer.start()
        with _LOCK:
            _LIVE.add(self)

    def _expire(self) -> None:
        self.expired = True
        self.signal(signal.SIGKILL)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except ProcessLookupError:
            pass

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, grace: float = 5.0) -> int | None:
        """TERM the group, KILL it after `grace` seconds; returns the exit
        status (negative: the signal)."""
        if self.alive():
            self.signal(signal.SIGTERM)
            if self.wait(grace) is None:
                self.signal(signal.SIGKILL)
                self.wait(10)
        # The group may hold children of the main process: make sure.
        self.signal(signal.SIGKILL)
        self._timer.cancel()
        self._logf.close()
        with _LOCK:
            _LIVE.discard(self)
        return self.popen.returncode

    def __repr__(self) -> str:
        return f"Process({self.name}, pid {self.pid})"


def stop_all() -> None:
    with _LOCK:
        live = list(_LIVE)
    for p in live:
        p.stop(grace=2.0)


atexit.register(stop_all)


def _on_signal(signum, _frame):
    # Let pytest and the fixtures unwind (KeyboardInterrupt), then atexit.
    raise KeyboardInterrupt(f"signal {signum}")


def install_signal_handlers() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_signal)  # even when started with SIGINT ignored
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGHUP, _on_signal)


def wait_for(predicate, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
