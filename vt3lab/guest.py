"""A QEMU guest of the vt3 test image: QEMU in its own process group, QMP,
and the command agent of images/init (protocol: images/README.md) on its
second serial port, reached through a unix socket."""

from __future__ import annotations

import os
import queue
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from .chaos import ChaosOverride
from .proc import Process, wait_for
from .qmp import Qmp, QmpError

# Serial transfer and TCG slowness on top of a command's own timeout.
AGENT_MARGIN = 30
# Kernel trouble, not a user-space crash ("traps: prog[pid] general protection fault … in lib…").
# "BUG kmalloc-1k (Not tainted): Poison overwritten": SLUB's own reports.
KERNEL_TROUBLE = re.compile(r"WARNING:|BUG:|BUG [\w.-]+ \(|Oops|Call Trace|"
                            r"general protection fault.*\[#\d+\]|Kernel panic")
# What the agent itself runs for a command; never a leftover of a scenario.
AGENT_COMMS = {"sh", "timeout", "cat", "sleep"}
# vt3_hw.h VT3_FW_CFG_KEY: the firmware configuration file that carries a
# vt3 guest's key, and where the guest kernel's qemu_fw_cfg shows it.
FW_CFG_KEY = "opt/vt3/key"
FW_CFG_KEY_RAW = f"/sys/firmware/qemu_fw_cfg/by_name/{FW_CFG_KEY}/raw"


class GuestError(Exception):
    """A guest problem, with the tail of its console."""

    def __init__(self, guest: "Guest", what: str):
        self.guest = guest
        super().__init__(f"{guest.name}: {what}\n--- {guest.name} console tail ---\n{guest.console_tail()}")


class GuestDead(GuestError):
    pass


class CommandTimeout(GuestError):
    pass


class CommandFailed(AssertionError):
    def __init__(self, guest: "Guest", cmd: str, result: "Result", what: str = ""):
        tail = "\n".join(result.out.splitlines()[-12:])
        super().__init__(f"{guest.name}: {what or 'command failed'} (exit {result.rc}): {cmd}\n{tail}")
        self.result = result


@dataclass
class Result:
    rc: int
    out: str

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def lines(self) -> list[str]:
        return self.out.splitlines()


@dataclass
class Nic:
    """vt3: vhost-user to a vt3d, and the key file that vt3d has (given to
    the guest as the firmware configuration file FW_CFG_KEY; None: no key,
    for a vt3d run with --insecure-no-key); dgram: a plain QEMU virtio-net
    on a unix datagram socket pair; udp: the same on UDP ports of
    127.0.0.1; tap: the same on an existing tap interface, with a vnet
    header (offloads)."""
    kind: str
    vhost_socket: Path | None = None
    key_file: Path | None = None
    peer_socket: Path | None = None
    local_port: int | None = None
    peer_port: int | None = None
    ifname: str | None = None

    @staticmethod
    def vt3(vhost_socket: Path, key_file: Path | None) -> "Nic":
        return Nic("vt3", vhost_socket=vhost_socket, key_file=key_file)

    @staticmethod
    def dgram(peer_socket: Path) -> "Nic":
        return Nic("dgram", peer_socket=peer_socket)

    @staticmethod
    def udp(local_port: int, peer_port: int) -> "Nic":
        return Nic("udp", local_port=local_port, peer_port=peer_port)

    @staticmethod
    def tap(ifname: str) -> "Nic":
        return Nic("tap", ifname=ifname)


def fw_cfg_key_args(key_file: Path) -> list[str]:
    """QEMU's options that give the guest KEY_FILE as FW_CFG_KEY (QEMU reads
    the file when it starts: it must exist by then)."""
    # QEMU's option syntax: a comma in a value is written twice.
    return ["-fw_cfg", f"name={FW_CFG_KEY},file={str(key_file).replace(',', ',,')}"]


@dataclass
class LabConfig:
    qemu: str
    qemu_major: int
    accel: str
    kernel: Path          # vmlinux (ELF, booted by its PVH entry) or a bzImage
    initrd: Path
    vt3d: Path
    memory: str = "512M"
    boot_timeout: float = 240
    lifetime: float = 3600
    # Added to every guest's QEMU command line and kernel command line
    # (a suite's own devices, disks, kernel parameters).
    qemu_args: tuple[str, ...] = ()
    kernel_args: str = ""
    # A seed or log every chaos block of the run must use (vt3lab.chaos).
    chaos: ChaosOverride = ChaosOverride()


class Guest:
    def __init__(self, cfg: LabConfig, workdir: Path, name: str, nic: Nic, ip: str, mac: str,
                 kernel_args: str = "", share: Path | None = None, console_socket: bool = False,
                 qemu_args: tuple[str, ...] = (), host: tuple[str, ...] = ()):
        """SHARE: a host directory shared into the guest (9p, mount_tag
        vt3share; vt3.share=DIR mounts it). CONSOLE_SOCKET: the console
        (ttyS0) is also a unix socket (NAME.console.sock) a user connects
        to, e.g. with socat; NAME.console logs it either way. KERNEL_ARGS
        and QEMU_ARGS: this guest's own, after the configuration's. HOST:
        the command that runs QEMU on the guest's host (a network
        namespace of vt3lab.fabric: `nsenter --net=/run/netns/NS`), none for this one."""
        self.cfg = cfg
        self.name = name
        self.ip = ip
        self.mac = mac
        self.nic = nic
        self.workdir = workdir
        self.share = share
        self.console = workdir / f"{name}.console"
        self.console_socket = workdir / f"{name}.console.sock" if console_socket else None
        self.commands_log = workdir / "commands.log"
        self.agent_path = workdir / f"{name}.agent"
        self.qmp_path = workdir / f"{name}.qmp"
        self.kernel_args = kernel_args
        self.qemu_args = tuple(qemu_args)
        self.host = tuple(host)
        # One vCPU with room for a second: under TCG only maxcpus > 1
        # makes the guest's locked instructions host atomics and its
        # fences host fences, which the doorbell hand-off with vt3d (and
        # virtio's own with any vhost-user backend) needs
        # (tests/system/test_platform.py).
        self.max_cpus = 2
        self._lines: "queue.Queue[str | None]" = queue.Queue()
        self._seq = 0
        self.sock: socket.socket | None = None
        self.qmp: Qmp | None = None
        self.proc: Process | None = None
        self.baseline_pids: set[int] = set()

    # ------------------------------------------------------------ lifecycle

    def qemu_argv(self) -> list[str]:
        c = self.cfg
        # Under KVM the host's CPU model (TCG emulates QEMU's default one).
        cpu = ["-cpu", "host"] if c.accel == "kvm" else []
        args = [c.qemu, "-accel", c.accel, *cpu, "-M", "q35", "-smp", f"1,maxcpus={self.max_cpus}", "-m", c.memory,
                "-display", "none", "-monitor", "none", "-no-reboot", "-nodefaults",
                "-kernel", str(c.kernel), "-initrd", str(c.initrd),
                # no_timer_check: under TCG on a loaded host the kernel's
                # IO-APIC timer check can fail and panic the boot.
                # tsc=reliable: with room for a second CPU, the kernel
                # trusts no TSC of a non-Intel CPU (QEMU's default model)
                # and falls back to the HPET, an MMIO exit per clock read
                # under TCG: gettimeofday turns slow and noisy.
                "-append", " ".join(filter(None, [
                    f"console=ttyS0 panic=-1 loglevel=5 no_timer_check tsc=reliable vt3.name={self.name} "
                    f"vt3.ip={self.ip}/24", c.kernel_args, self.kernel_args])),
                *self.console_args(),
                "-chardev", f"socket,id=agent,path={self.agent_path},server=on,wait=off",
                "-serial", "chardev:agent",
                "-qmp", f"unix:{self.qmp_path},server=on,wait=off"]
        if self.share is not None:
            args += ["-virtfs", f"local,path={self.share},mount_tag=vt3share,security_model=none,id=share"]
        if self.nic.kind == "vt3":
            # QEMU 7.2 under TCG segfaults in msix_set_vector_notifiers for a
            # vhost-user virtio-net-pci with MSI-X; later QEMUs are fine.
            intx = ",vectors=0" if c.qemu_major < 8 else ""
            args += ["-object", f"memory-backend-memfd,id=mem,size={c.memory},share=on",
                     "-numa", "node,memdev=mem",
                     "-chardev", f"socket,id=vhost,path={self.nic.vhost_socket}",
                     "-netdev", "vhost-user,id=n0,chardev=vhost",
                     "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},romfile={intx}"]
            if self.nic.key_file is not None:
                args += fw_cfg_key_args(self.nic.key_file)
        elif self.nic.kind == "udp":
            args += ["-netdev", f"dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port={self.nic.local_port},"
                                f"remote.type=inet,remote.host=127.0.0.1,remote.port={self.nic.peer_port}",
                     "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},romfile="]
        elif self.nic.kind == "tap":
            args += ["-netdev", f"tap,id=n0,ifname={self.nic.ifname},script=no,downscript=no,vnet_hdr=on",
                     "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},romfile="]
        else:
            args += ["-netdev", f"dgram,id=n0,local.type=unix,local.path={self.workdir / (self.name + '.dgram')},"
                                f"remote.type=unix,remote.path={self.nic.peer_socket}",
                     "-device", f"virtio-net-pci,netdev=n0,mac={self.mac},romfile="]
        return args + list(c.qemu_args) + list(self.qemu_args)

    def console_args(self) -> list[str]:
        if self.console_socket is None:
            return ["-serial", f"file:{self.console}"]
        # Output nobody reads is dropped by the socket but kept in the log.
        return ["-chardev", f"socket,id=console,path={self.console_socket},server=on,wait=off,logfile={self.console}",
                "-serial", "chardev:console"]

    def start(self) -> "Guest":
        """Starts QEMU and connects to the agent and QMP; does not wait for
        the boot (see wait_ready), so several guests boot in parallel."""
        for p in (self.agent_path, self.qmp_path, self.console_socket):
            if p is not None:
                p.unlink(missing_ok=True)
        self.proc = Process(f"qemu {self.name}", [*self.host, *self.qemu_argv()],
                            self.workdir / f"{self.name}.qemu.log", self.cfg.lifetime)
        if not wait_for(lambda: self.agent_path.exists() or not self.proc.alive(), 15, 0.02):
            raise GuestDead(self, "QEMU made no agent socket")
        if not self.proc.alive():
            raise GuestDead(self, f"QEMU exited at once: {self.qemu_log_tail()}")
        self.attach_agent()
        try:
            self.qmp = Qmp(self.qmp_path)
        except (QmpError, OSError) as e:
            raise GuestDead(self, f"QMP: {e}") from None
        return self

    def attach_agent(self) -> None:
        """Connects to the agent's socket (QEMU has made it) and reads its
        lines from then on."""
        self._lines = queue.Queue()
        self.sock = self._connect_agent()
        threading.Thread(target=self._reader, args=(self.sock, self._lines), daemon=True).start()

    def _connect_agent(self, timeout: float = 15) -> socket.socket:
        # QEMU binds the socket before it listens: a refused connect in
        # between is retried.
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(str(self.agent_path))
                return sock
            except ConnectionRefusedError:
                sock.close()
                if time.monotonic() > deadline or not self.alive():
                    raise GuestDead(self, "the agent socket refused every connection") from None
                time.sleep(0.02)

    @staticmethod
    def _reader(sock: socket.socket, lines: "queue.Queue[str | None]") -> None:
        buf = b""
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                data = b""
            if not data:
                lines.put(None)
                return
            buf += data
            *complete, buf = buf.split(b"\n")
            for line in complete:
                lines.put(line.decode(errors="replace").rstrip("\r"))

    def wait_ready(self, timeout: float | None = None) -> None:
        timeout = timeout or self.cfg.boot_timeout
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise GuestDead(self, f"no agent @@READY within {timeout:.0f} s")
            try:
                line = self._lines.get(timeout=min(left, 1))
            except queue.Empty:
                if not self.alive():
                    raise GuestDead(self, f"QEMU exited during boot: {self.qemu_log_tail()}") from None
                continue
            if line is None:
                raise GuestDead(self, "agent socket closed during boot")
            if line == "@@READY":
                break
        errors = [console_line for console_line in self.console_text().splitlines()
                  if "vt3-init: ERROR" in console_line]
        if errors:
            raise GuestDead(self, "init reported errors: " + "; ".join(errors))
        self.baseline_pids = set(self.user_processes())

    def alive(self) -> bool:
        return self.proc is not None and self.proc.alive()

    def stop(self) -> None:
        """Powers the guest off (quit over QMP, then the process group)."""
        if self.qmp:
            try:
                if self.alive():
                    self.qmp.execute("quit")
            except (QmpError, OSError):
                pass
            self.qmp.close()
            self.qmp = None
        if self.sock:
            self.sock.close()
            self.sock = None
        if self.proc:
            self.proc.wait(3)
            self.proc.stop()

    # ------------------------------------------------------------- commands

    def _log(self, text: str) -> None:
        with open(self.commands_log, "a") as f:
            f.write(text)

    def run(self, cmd: str, timeout: int = 30) -> Result:
        """Runs CMD (one line, `sh -c`) in the guest under `timeout`;
        returns its exit status (124/143: the guest-side timeout killed
        it) and output. Raises GuestDead or CommandTimeout (no answer
        within timeout + AGENT_MARGIN) with the console tail."""
        if "\n" in cmd or not cmd.strip():
            raise ValueError("one non-empty line, please")
        if not self.alive() or self.sock is None:
            raise GuestDead(self, f"not running (for: {cmd})")
        self._seq += 1
        rid = f"{self.name}.{self._seq}.{time.monotonic_ns() % 100000}"
        t0 = time.time()
        self._log(f"[{time.strftime('%H:%M:%S', time.localtime(t0))}] [{self.name}]$ {cmd}\n")
        self.sock.sendall(f"{rid} {int(timeout)} {cmd}\n".encode())
        deadline = time.monotonic() + timeout + AGENT_MARGIN
        out: list[str] = []
        begun = False
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                self._log(f"  (no answer within {timeout + AGENT_MARGIN} s)\n")
                raise CommandTimeout(self, f"no answer within {timeout + AGENT_MARGIN} s to: {cmd}")
            try:
                line = self._lines.get(timeout=min(left, 1))
            except queue.Empty:
                if not self.alive():
                    raise GuestDead(self, f"QEMU exited during: {cmd}") from None
                continue
            if line is None:
                raise GuestDead(self, f"agent connection closed during: {cmd}")
            if not begun:
                # Lines before our @@BEGIN belong to earlier, timed-out requests.
                begun = line == f"@@BEGIN {rid}"
                continue
            m = re.fullmatch(rf"@@END {re.escape(rid)} (\d+)", line)
            if m:
                # The agent puts a newline before @@END: an empty last line is that.
                if out and out[-1] == "":
                    out.pop()
                result = Result(int(m.group(1)), "\n".join(out))
                body = "".join(f"  {out_line}\n" for out_line in out)
                self._log(f"{body}  (exit {result.rc}, {time.time() - t0:.1f} s)\n")
                return result
            out.append(line)

    def check(self, cmd: str, timeout: int = 30, what: str = "") -> str:
        """Like run, but a non-zero exit status fails (CommandFailed);
        returns the output."""
        r = self.run(cmd, timeout)
        if r.rc != 0:
            raise CommandFailed(self, cmd, r, what)
        return r.out

    def spawn(self, cmd: str, tag: str, lifetime: int = 900) -> None:
        """Starts CMD in the background in the guest, bounded by `lifetime`;
        its output goes to /tmp/TAG.out, its exit status to /tmp/TAG.rc."""
        quoted = cmd.replace("'", "'\\''")
        self.check(f"rm -f /tmp/{tag}.rc; (timeout {lifetime} sh -c '{quoted}' > /tmp/{tag}.out 2>&1; "
                   f"echo $? > /tmp/{tag}.rc) & echo $! > /tmp/{tag}.pid", 10)

    def join(self, tag: str, timeout: int) -> Result:
        """Waits for a spawned command; its exit status and output. A
        command still running at the timeout is a CommandTimeout."""
        r = self.run(f"i=0; while [ ! -e /tmp/{tag}.rc ] && [ $i -lt {timeout * 5} ]; do sleep 0.2; i=$((i+1)); done; "
                     f"cat /tmp/{tag}.out; [ -e /tmp/{tag}.rc ] || exit 255; exit $(cat /tmp/{tag}.rc)",
                     timeout + 10)
        if r.rc == 255 and not self.run(f"[ -e /tmp/{tag}.rc ]", 10).ok:
            raise CommandTimeout(self, f"'{tag}' still running after {timeout} s:\n{r.out[-2000:]}")
        return r

    def running(self, tag: str) -> bool:
        return not self.run(f"[ -e /tmp/{tag}.rc ]", 10).ok

    def kill(self, tag: str, sig: str = "TERM") -> None:
        """Signals a spawned command: every process under its wrapper
        (which lives on to record the exit status)."""
        # No pgrep in the image: children from /proc/PID/stat (field 4 is the parent).
        self.check("kids() { for p in /proc/[0-9]*; do read -r _ _ _ pp _ < $p/stat 2>/dev/null && "
                   "[ \"$pp\" = $1 ] && echo ${p#/proc/}; done; }; "
                   f"k() {{ for c in $(kids $1); do k $c; done; [ $1 = $top ] || kill -{sig} $1 2>/dev/null; }}; "
                   f"top=$(cat /tmp/{tag}.pid) && k $top; true", 10)

    # --------------------------------------------------------- observation

    # "PID COMM" of every user-space process (kernel threads have an empty
    # cmdline). Shell builtins only (a fork per process costs seconds under
    # TCG); procfs files have size 0, so read the cmdline rather than test -s.
    PROCESS_LISTING = ('for p in /proc/[0-9]*; do read -r x < $p/cmdline; [ -n "$x" ] && read -r c < $p/comm && '
                       'echo ${p#/proc/} $c; done 2>/dev/null; true')

    def user_processes(self) -> dict[int, str]:
        """pid → comm of every process PROCESS_LISTING lists."""
        out = self.check(self.PROCESS_LISTING, 20)
        procs = {}
        for line in out.splitlines():
            pid, _, comm = line.partition(" ")
            if pid.isdigit():
                procs[int(pid)] = comm
        return procs

    def leftover_processes(self) -> dict[int, str]:
        return {pid: comm for pid, comm in self.user_processes().items()
                if pid not in self.baseline_pids and comm not in AGENT_COMMS}

    def console_text(self) -> str:
        try:
            return self.console.read_text(errors="replace")
        except OSError:
            return ""

    def console_mark(self) -> tuple[int, int]:
        """Where the console is now: (inode, size); a rebooted guest has a
        new console file."""
        try:
            st = self.console.stat()
            return (st.st_ino, st.st_size)
        except OSError:
            return (0, 0)

    def console_since(self, mark: tuple[int, int]) -> str:
        try:
            with open(self.console, "rb") as f:
                if os.fstat(f.fileno()).st_ino == mark[0]:
                    f.seek(mark[1])
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def kernel_trouble_since(self, mark: tuple[int, int]) -> list[str]:
        return [line for line in self.console_since(mark).splitlines() if KERNEL_TROUBLE.search(line)]

    def console_tail(self, lines: int = 25) -> str:
        return "\n".join(self.console_text().splitlines()[-lines:])

    def qemu_log_tail(self, lines: int = 5) -> str:
        try:
            return "\n".join((self.workdir / f"{self.name}.qemu.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def fw_cfg_key(self) -> bytes | None:
        """The key the guest kernel has (FW_CFG_KEY_RAW, as root), None when
        there is none (no -fw_cfg of it, or qemu_fw_cfg not loaded)."""
        r = self.run(f"[ -e {FW_CFG_KEY_RAW} ] || exit 3; od -An -v -tx1 {FW_CFG_KEY_RAW}", 20)
        if r.rc == 3:
            return None
        if r.rc != 0:
            raise CommandFailed(self, f"od {FW_CFG_KEY_RAW}", r, "the key is there but unreadable")
        return bytes.fromhex("".join(r.out.split()))

    def set_link(self, up: bool) -> None:
        """The NIC's link as the guest sees it (QMP set_link)."""
        assert self.qmp
        self.qmp.execute("set_link", name="n0", up=up)

    def status(self) -> str:
        assert self.qmp
        return self.qmp.execute("query-status")["status"]

    def __repr__(self) -> str:
        return f"Guest({self.name}, {self.ip})"
