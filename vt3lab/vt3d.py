"""A vt3d process: `vt3d serve` with its management socket and its key
file, and `ctl`."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

from .chaos import ChaosOverride, chaos
from .guest import Nic
from .proc import Process, wait_for

RNIC_OBJECTS = ("pd", "mr", "cq", "qp", "srq")
# guest-driver/include/docs/security.md: VT3_KEY_LEN.
KEY_LEN = 16
INSECURE = "--insecure-no-key"


class Vt3dError(Exception):
    pass


def provision_key(path: Path) -> Path:
    """The key file PATH of one guest and its vt3d (vt3_hw.h, "Who may
    drive the device"): KEY_LEN random bytes, mode 0600. Made if missing
    (atomically: written to a file of its own, then linked to PATH, which
    fails if PATH appeared meanwhile), else kept as it is, so a restarted
    vt3d and a rebooted guest go on with the key they had. An existing
    PATH that is not a regular file of KEY_LEN bytes readable by its owner
    only is refused."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(os.urandom(KEY_LEN))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size != KEY_LEN or stat.S_IMODE(st.st_mode) & 0o077:
                raise Vt3dError(f"{path}: not a key file (a regular file of {KEY_LEN} bytes, mode 0600; "
                                f"it has mode {stat.S_IMODE(st.st_mode):04o}, {st.st_size} bytes)") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


class Vt3d:
    def __init__(self, binary: Path, workdir: Path, name: str, uplink: str, mac: str,
                 *extra: str, lifetime: float = 3600, key_file: Path | None = None,
                 chaos_override: ChaosOverride = ChaosOverride(), host: tuple[str, ...] = ()):
        """KEY_FILE (default WORKDIR/NAME.key) is made by provision_key
        unless it exists: the guest behind this vt3d gets the same file
        (nic()). With --insecure-no-key in EXTRA there is none.
        CHAOS_OVERRIDE: the seed or log every chaos() block must use.
        HOST: the command that runs vt3d on its host (a network namespace
        of vt3lab.fabric), none for this one."""
        self.binary = Path(binary)
        self.chaos_override = chaos_override
        self.chaos_runs = 0
        self.name = name
        self.socket = workdir / f"{name}.vhost"
        self.mgmt = workdir / f"{name}.mgmt"
        self.log = workdir / f"{name}.vt3d.log"
        self.key_file: Path | None = None
        key_args: list[str] = []
        if INSECURE not in extra:
            self.key_file = provision_key(key_file or workdir / f"{name}.key")
            key_args = ["--key-file", str(self.key_file)]
        argv = [str(self.binary), "serve", "--socket", str(self.socket), "--mgmt", str(self.mgmt),
                "--uplink", uplink, "--mac", mac, *key_args, *extra]
        self.argv = argv
        # Stalls (rnic.stalls) the health check has reported already.
        self.stalls_reported = 0
        self.proc = Process(f"vt3d {name}", [*host, *argv], self.log, lifetime,
                            env={"RUST_LOG": os.environ.get("RUST_LOG", "info")})
        if not wait_for(lambda: self.socket.exists() or not self.proc.alive(), 10):
            raise Vt3dError(f"vt3d {name}: no socket after 10 s")
        if not self.proc.alive():
            raise Vt3dError(f"vt3d {name} exited: {self.log_tail()}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def nic(self) -> Nic:
        """The NIC of the guest behind this vt3d: its socket and its key."""
        return Nic.vt3(self.socket, self.key_file)

    def key(self) -> bytes | None:
        return self.key_file.read_bytes() if self.key_file else None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def ctl_raw(self, *args: str, timeout: float = 10) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.binary), "ctl", "--mgmt", str(self.mgmt), "--json", *map(str, args)],
                              capture_output=True, text=True, timeout=timeout)

    def ctl(self, *args: str, timeout: float = 10):
        """`vt3d ctl --json ARGS`, parsed; raises Vt3dError with vt3d's
        reason when it answers an error."""
        r = self.ctl_raw(*args, timeout=timeout)
        try:
            value = json.loads(r.stdout) if r.stdout.strip() else None
        except json.JSONDecodeError:
            raise Vt3dError(f"ctl {' '.join(args)}: not JSON: {r.stdout[:200]!r} {r.stderr[:200]!r}") from None
        if r.returncode != 0 or (isinstance(value, dict) and "error" in value):
            reason = value.get("error") if isinstance(value, dict) else r.stderr.strip()
            raise Vt3dError(f"ctl {' '.join(args)}: exit {r.returncode}: {reason}")
        return value

    def stats(self) -> dict:
        return self.ctl("stats")

    def chaos(self, **schedule):
        """A chaos schedule for a `with` block (vt3lab.chaos.chaos)."""
        return chaos(self, **schedule)

    def objects(self) -> dict[str, int]:
        s = self.stats()
        return {k: s[f"rnic.{k}"] for k in RNIC_OBJECTS}

    def held(self) -> dict[str, int]:
        """The RDMA objects vt3d still holds (empty when none)."""
        return {k: n for k, n in self.objects().items() if n}

    def wait_no_objects(self, timeout: float = 15) -> dict[str, int]:
        """Until vt3d holds no PD/MR/CQ/QP (teardown is asynchronous);
        returns what is still held at the deadline."""
        held: dict[str, int] = {}

        def none():
            nonlocal held
            held = self.held()
            return not held
        wait_for(none, timeout, 0.5)
        return held

    def wait_held(self, want: dict[str, int], timeout: float = 15) -> dict[str, int]:
        """Until vt3d's PD/MR/CQ/QP counts are WANT (teardown is
        asynchronous); returns the counts at the end."""
        got: dict[str, int] = {}

        def reached():
            nonlocal got
            got = self.objects()
            return got == want
        wait_for(reached, timeout, 0.5)
        return got

    def threads(self) -> str:
        """Each thread's state, kernel wait channel and CPU time, sampled
        twice a second apart: a worker spinning (R, its CPU time growing)
        or stuck (S in a futex) shows here when vt3d stops answering."""
        def sample() -> dict[str, tuple[str, str, int]]:
            got = {}
            for task in sorted(Path(f"/proc/{self.pid}/task").glob("*")):
                try:
                    stat = (task / "stat").read_text()
                    wchan = (task / "wchan").read_text().strip() or "-"
                except OSError:
                    continue
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2:].split()
                got[task.name] = (f"{comm} {fields[0]}", wchan, int(fields[11]) + int(fields[12]))
            return got
        first = sample()
        time.sleep(1)
        second = sample()
        return "\n".join(f"  tid {tid} {what} wchan={wchan} cpu+{ticks - first.get(tid, ('', '', ticks))[2]} ticks/s"
                         for tid, (what, wchan, ticks) in second.items())

    def stall_lines(self) -> list[str]:
        """The progress watchdog's log lines (one per stall: the QP's,
        the engine's and the TCB's state)."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if "stall: QP" in line]

    def new_stalls(self) -> list[str]:
        """Stalls vt3d counted since the last call, as its log lines."""
        counted = self.stats().get("rnic.stalls", 0)
        if counted <= self.stalls_reported:
            return []
        lines = (self.stall_lines()[self.stalls_reported:counted] or
                 [f"{counted - self.stalls_reported} stall(s), no log line"])
        self.stalls_reported = counted
        return lines

    def dump(self) -> str:
        out = [f"=== {self.name} threads\n{self.threads()}", f"=== {self.name} log tail\n{self.log_tail(30)}"]
        stalls = self.stall_lines()
        if stalls:
            out.append(f"=== {self.name} stalls\n" + "\n".join(stalls))
        for table in ("qps", "cqs", "tcb", "stats"):
            try:
                out.append(f"=== {self.name} {table}\n{json.dumps(self.ctl(table), indent=1)}")
            except (Vt3dError, subprocess.TimeoutExpired) as e:
                out.append(f"=== {self.name} {table}: {e}")
        return "\n".join(out)

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.kill(self.proc.pid, sig)

    def alive(self) -> bool:
        return self.proc.alive()

    def stop(self) -> int | None:
        return self.proc.stop()
