"""The interactive lab: `vt3 up N [--siw K] [--hosts H]` (`./run-vm.sh up`
in a checkout) boots N guests on one Ethernet segment (setups.Segment), or
spread over H hosts (setups.Hosts: network namespaces joined by VXLAN), in a
background process and returns to the prompt once they are up, printing
how to reach each one; `vt3 down` stops everything that process started.

The run directory (--dir, default $VT3_LAB_DIR or /tmp/vt3-lab-UID) holds
the consoles, sockets and logs, and lab.json: the background process's pid
and every process it runs (hub, vt3d, QEMU), each with its start time, so
`down` can check by pid that nothing is left (and never signals a process
that merely reuses a pid), and the network namespaces of its hosts, so
`down` can check by name that none is left. The lab stops by itself
after --hours."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

from .config import config_from_env
from .fabric import namespaces, remove_namespace
from .proc import install_signal_handlers, wait_for
from .setups import SHARE_MOUNT, Hosts, Segment

STATE = "lab.json"
# Marks a directory as a lab's, so `up` may clear what an earlier lab left there.
MARKER = ".vt3-lab"
# Where the vt3lab package is imported from (a checkout, site-packages or a
# wheel): the lab's own processes import it from there.
PACKAGE_PATH = str(Path(__file__).resolve().parents[1])
# The command users type, in messages: set by vt3lab.cli.
PROG = "vt3"
DEFAULT_HOURS = 12.0
# Guests are quit over QMP, vt3d and the hub are TERMed: seconds each.
DOWN_TIMEOUT = 90


def python_path() -> str:
    """PYTHONPATH for the lab's own processes: vt3lab first."""
    return os.pathsep.join(filter(None, [PACKAGE_PATH, os.environ.get("PYTHONPATH")]))


def default_dir() -> Path:
    return Path(os.environ.get("VT3_LAB_DIR") or Path(tempfile.gettempdir()) / f"vt3-lab-{os.getuid()}")


# ------------------------------------------------------------ processes

def start_time(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), None when there
    is no such process or it is a zombie (it has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return None if fields[0] == "Z" else int(fields[19])


def identity(pid: int) -> dict:
    return {"pid": pid, "start": start_time(pid)}


def alive(proc: dict) -> bool:
    """Whether the process recorded as PROC still runs (the same one, not
    a later process with its pid)."""
    return proc["start"] is not None and start_time(proc["pid"]) == proc["start"]


# ---------------------------------------------------------------- state

def read_state(rundir: Path) -> dict | None:
    try:
        return json.loads((rundir / STATE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_state(rundir: Path, state: dict) -> None:
    tmp = rundir / f"{STATE}.tmp"
    tmp.write_text(json.dumps(state, indent=1))
    tmp.rename(rundir / STATE)


def lab_processes(state: dict) -> list[dict]:
    return [state["daemon"], *state.get("processes", [])]


def prepare_dir(rundir: Path, share: Path) -> None:
    """A lab's directory: new, empty, or an earlier lab's (whose files,
    but the shared directory, are removed)."""
    rundir.mkdir(parents=True, exist_ok=True)
    entries = [e for e in rundir.iterdir() if e != share]
    if entries and not (rundir / MARKER).exists():
        raise SystemExit(f"{PROG} up: {rundir} is not empty and not a lab's directory: choose another with --dir")
    for e in entries:
        if e.is_file() or e.is_socket() or e.is_symlink():
            e.unlink()
    (rundir / MARKER).touch()


# ------------------------------------------------------------------- up

def describe(state: dict) -> str:
    """What `up` prints: each guest's console and vt3d ctl, the share, how to stop."""
    vt3d = state["vt3d"]
    if state.get("hosts"):
        where = (f"on {state['hosts']} hosts (network namespaces {', '.join(state['namespaces'][1:])}; "
                 f"{state['fabric']}, MTU {state['mtu']}), one Ethernet segment (10.77.0.0/24)")
    else:
        where = "on one Ethernet segment (10.77.0.0/24)"
    lines = [f"vt3 lab up: {len(state['guests'])} guests {where}, run directory {state['dir']}"]
    for g in state["guests"]:
        host = f"host {g['host']} " if g.get("host") else ""
        lines.append(f"  {g['name']:4s} {host}{g['rdma']:5s} {g['ip']:10s} console: "
                     f"socat -,rawer,escape=0x1d UNIX-CONNECT:{g['console_socket']}")
        if g["mgmt"]:
            lines.append(f"  {'':22s} vt3d:    {vt3d} ctl --mgmt {g['mgmt']} stats")
    lines += [f"shared directory: {state['share']} (host) = {state['mount']} in every guest",
              "consoles: Ctrl-] leaves socat (the guest runs on); logs: NAME.console, NAME.vt3d.log"
              + ("" if state.get("hosts") else ", hub.log"),
              *([f"hosts: ip netns exec NAMESPACE …; each host's way to the others is its "
                 f"{'vx0 (VXLAN)' if state['fabric'] == 'vxlan' else 'eth0'} in bridge br0"]
                if state.get("hosts") else []),
              f"stop: {PROG} down{'' if Path(state['dir']) == default_dir() else ' --dir ' + state['dir']}"
              f"   (the lab stops by itself at {time.strftime('%H:%M', time.localtime(state['stops_at']))})"]
    return "\n".join(lines)


def up(n: int, siw: int, share: Path | None, rundir: Path, hours: float, hosts: int = 0,
       fabric: str = "vxlan") -> int:
    rundir = rundir.resolve()
    state = read_state(rundir)
    if state and any(alive(p) for p in lab_processes(state)):
        print(f"{PROG} up: a lab is already up in {rundir} ({PROG} down first)", file=sys.stderr)
        return 1
    share = (share or rundir / "share").resolve()
    prepare_dir(rundir, share)
    share.mkdir(parents=True, exist_ok=True)
    status_read, status_write = os.pipe()
    with open(rundir / "lab.log", "wb") as log:
        # Its own session: the lab outlives this command and the terminal.
        daemon = subprocess.Popen(
            [sys.executable, "-m", "vt3lab.cli", "lab-daemon", str(n), "--siw", str(siw), "--share", str(share),
             "--dir", str(rundir), "--hours", str(hours), "--status-fd", str(status_write),
             "--hosts", str(hosts), "--fabric", fabric],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, pass_fds=(status_write,),
            start_new_session=True, cwd=rundir,
            env={**os.environ, "PYTHONPATH": python_path()})
    os.close(status_write)
    kinds = f"{n - siw} vt3" + (f", {siw} siw" if siw else "")
    print(f"booting {n} guests ({kinds}) in {rundir}; under TCG about a minute", flush=True)
    try:
        # The daemon closes it when the lab is up, when it failed, or when it dies.
        with os.fdopen(status_read) as status:
            said = status.read().strip()
    except KeyboardInterrupt:
        daemon.terminate()
        daemon.wait(DOWN_TIMEOUT)
        raise
    if said == "ready":
        print(describe(read_state(rundir)), flush=True)
        return 0
    daemon.wait(DOWN_TIMEOUT)
    tail = "\n".join((rundir / "lab.log").read_text(errors="replace").splitlines()[-30:])
    print(f"{PROG} up: the lab did not come up: {said or f'the lab process exited ({daemon.returncode})'}\n"
          f"--- {rundir / 'lab.log'} ---\n{tail}", file=sys.stderr)
    return 1


def serve(n: int, siw: int, share: Path, rundir: Path, hours: float, status_fd: int, hosts: int = 0,
          fabric: str = "vxlan") -> int:
    """The background process of `up`: boots the segment, says "ready" (or
    why not) on STATUS_FD, and keeps the lab until it is signalled (down)
    or its hours are over; then stops everything."""
    install_signal_handlers()  # TERM, INT, HUP end the lab
    status = os.fdopen(status_fd, "w")
    stops_at = time.time() + hours * 3600
    cfg = config_from_env()
    # The processes' own deadline (proc.Process) comes after the lab's.
    cfg.lifetime = hours * 3600 + 300
    state = {"dir": str(rundir), "share": str(share), "mount": SHARE_MOUNT, "vt3d": str(cfg.vt3d),
             "daemon": identity(os.getpid()), "processes": [], "guests": [], "stops_at": stops_at}
    write_state(rundir, state)
    if hosts:
        setup = Hosts(cfg, rundir, n, siw, hosts, fabric, share, own_dir=False)
        # Recorded before they exist: a lab killed while it makes them leaves none behind after down.
        state.update(hosts=hosts, fabric=fabric, mtu=setup.fabric.mtu, namespaces=setup.fabric.namespaces())
        write_state(rundir, state)
    else:
        setup = Segment(cfg, rundir, n, siw, share, own_dir=False)
    rc = 0
    try:
        print(f"booting {n} guests ({siw} siw)", flush=True)
        setup.start()
        procs = [*setup.processes.values(), *(d.proc for d in setup.vt3d.values()),
                 *(g.proc for g in setup.guests.values())]
        state["processes"] = [{"what": p.name, **identity(p.pid)} for p in procs]
        state["guests"] = [{"name": g.name, "rdma": setup.device(g), "ip": g.ip, "mac": g.mac,
                            "console_socket": str(g.console_socket), "console_log": str(g.console),
                            "mgmt": str(setup.vt3d[g.name].mgmt) if g.name in setup.vt3d else None,
                            "host": getattr(setup, "host_of", {}).get(g.name)}
                           for g in setup.guests.values()]
        write_state(rundir, state)
        status.write("ready\n")
        status.close()
        print("ready", flush=True)
        while time.time() < stops_at:
            time.sleep(5)
        print(f"the lab's {hours} h are over", flush=True)
    except KeyboardInterrupt as e:
        print(f"stopping ({e})", flush=True)
    except Exception as e:
        traceback.print_exc()
        rc = 1
        if not status.closed:
            status.write(f"{e}\n")
    finally:
        if not status.closed:
            status.close()
        setup.stop()
        print("stopped", flush=True)
    return rc


# ----------------------------------------------------------------- down

def down(rundir: Path) -> int:
    rundir = rundir.resolve()
    state = read_state(rundir)
    if state is None:
        print(f"no lab in {rundir}: nothing to stop")
        return 0
    procs = lab_processes(state)
    if alive(state["daemon"]):
        os.kill(state["daemon"]["pid"], signal.SIGTERM)
    wait_for(lambda: not any(alive(p) for p in procs), DOWN_TIMEOUT, 0.2)
    # A lab process that outlived its daemon (killed with -9): its group,
    # by pid (each runs in a session of its own), only if it is still the one.
    for p in procs:
        if alive(p):
            print(f"killing {p.get('what', 'the lab process')} (pid {p['pid']}): it outlived the lab's stop",
                  file=sys.stderr)
            try:
                os.killpg(p["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
    wait_for(lambda: not any(alive(p) for p in procs), 10, 0.2)
    left = [p for p in procs if alive(p)]
    if left:
        print(f"{PROG} down: still running: " + ", ".join(f"{p.get('what', 'lab')} pid {p['pid']}" for p in left),
              file=sys.stderr)
        return 1
    # The hosts' namespaces (and all in them), if the lab could not remove them itself.
    ours = state.get("namespaces", [])
    for ns in set(ours) & set(namespaces()):
        print(f"removing network namespace {ns}: it outlived the lab's stop", file=sys.stderr)
        remove_namespace(ns)
    left_ns = set(ours) & set(namespaces())
    if left_ns:
        print(f"{PROG} down: network namespaces left: {', '.join(sorted(left_ns))}", file=sys.stderr)
        return 1
    (rundir / STATE).unlink(missing_ok=True)
    for sock in rundir.glob("*"):
        if sock.is_socket():
            sock.unlink()
    # The guests' keys (NAME.key) go with their guests and vt3d.
    for key in rundir.glob("*.key"):
        key.unlink()
    hosts = f" and {len(ours)} network namespaces" if ours else ""
    print(f"vt3 lab in {rundir} stopped ({len(procs)} processes{hosts}); logs kept there, "
          f"shared directory {state['share']}")
    return 0
