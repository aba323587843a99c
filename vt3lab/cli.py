"""The `vt3` command: the lab from a shell, where run-vm.sh built it or a
bundle holds it.

    vt3 [--bundle DIR] [--accel auto|tcg|kvm] demo [--keep]
    vt3 … up N [--siw K] [--hosts H [--fabric vxlan|l2]] [--share DIR] [--dir DIR] [--hours H]
    vt3 … down [--dir DIR]
    vt3 … shell                 one vt3 guest, its console on this terminal
    vt3 … bench                 perftest and fio, vt3 beside siw (a checkout's)

Where vt3d and the guest images are: --bundle, else vt3lab.config's
order (VT3_BUNDLE, VT3_IMAGES, …). Nothing here needs root but --hosts
(network namespaces): state goes to the run directory (--dir, default $VT3_LAB_DIR or /tmp/vt3-lab-UID)."""

from __future__ import annotations

import argparse
import os
import select
import shutil
import socket
import sys
import tempfile
import termios
import time
import tty
from pathlib import Path

from . import interactive
from .config import ConfigError, config_from_env
from .fabric import FABRICS, MAX_HOSTS
from .proc import install_signal_handlers
from .setups import SEGMENT_MAX, Segment

# Ctrl-]: leaves `vt3 shell`, as telnet and socat's escape.
ESCAPE = b"\x1d"


def run_once(command: str, keep: bool) -> int:
    """demo or bench, in a run directory of its own."""
    install_signal_handlers()
    cfg = config_from_env()
    rundir = Path(tempfile.mkdtemp(prefix=f"vt3-{command}."))
    ok = False
    t0 = time.monotonic()
    try:
        if command == "demo":
            from .scenarios.demo import run_demo
            from .setups import Vt3Pair
            setup = Vt3Pair(cfg, rundir).start()
            try:
                run_demo(setup, say=lambda s: print(s, flush=True))
            finally:
                setup.stop()
        else:
            from .scenarios.bench import run_bench
            run_bench(cfg, rundir)
        ok = True
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        took = time.monotonic() - t0
        if ok and not keep:
            shutil.rmtree(rundir, ignore_errors=True)
            print(f"{command} done in {took:.0f} s", file=sys.stderr)
        else:
            print(f"{command} {'done' if ok else 'FAILED'} in {took:.0f} s; logs in {rundir}", file=sys.stderr)
    return 0 if ok else 1


def relay(console: Path) -> None:
    """This terminal to and from the console socket, raw, until Ctrl-]."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(console))
    stdin = sys.stdin.fileno()
    saved = termios.tcgetattr(stdin) if os.isatty(stdin) else None
    if saved is not None:
        tty.setraw(stdin)
    try:
        while True:
            ready, _, _ = select.select([stdin, sock], [], [])
            if sock in ready:
                data = sock.recv(65536)
                if not data:
                    return
                os.write(sys.stdout.fileno(), data)
            if stdin in ready:
                data = os.read(stdin, 1024)
                if not data or ESCAPE in data:
                    return
                sock.sendall(data)
    finally:
        if saved is not None:
            termios.tcsetattr(stdin, termios.TCSADRAIN, saved)
        sock.close()


def shell(keep: bool) -> int:
    """One vt3 guest (vt3.ko loaded, 10.77.0.1) with its console here."""
    install_signal_handlers()
    cfg = config_from_env()
    rundir = Path(tempfile.mkdtemp(prefix="vt3-shell."))
    setup = Segment(cfg, rundir, 1, own_dir=False)
    print(f"booting one vt3 guest in {rundir}; under TCG about a minute", file=sys.stderr, flush=True)
    try:
        setup.start()
        guest = setup.guests["vm1"]
        print(f"vt3 guest up (vt3_0, {guest.ip}); vt3d: {cfg.vt3d} ctl --mgmt {setup.vt3d['vm1'].mgmt} stats\n"
              "Ctrl-] leaves (and powers the guest off)\r", file=sys.stderr, flush=True)
        relay(guest.console_socket)
    except KeyboardInterrupt:
        pass
    finally:
        setup.stop()
    if not keep:
        shutil.rmtree(rundir, ignore_errors=True)
    return 0


def parser(prog: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description="vt3 guests under QEMU: the demo, a lab, a shell")
    p.add_argument("--bundle", type=Path, help="an unpacked vt3 bundle (default: $VT3_BUNDLE, or a checkout's build)")
    p.add_argument("--accel", choices=("auto", "tcg", "kvm"), help="default auto: KVM when a probe boot proves it")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("demo", "bench", "shell"):
        sub.add_parser(name).add_argument("--keep", action="store_true", help="keep the run directory")
    lab_dir = {"type": Path, "default": None, "help": f"the lab's run directory (default {interactive.default_dir()})"}
    up = sub.add_parser("up", help="boot N guests on one segment in the background (down stops them)")
    up.add_argument("n", type=int, help="how many guests")
    up.add_argument("--siw", type=int, default=0, help="how many of them are siw guests (the last ones)")
    up.add_argument("--share", type=Path, help="host directory mounted in every guest (default DIR/share)")
    up.add_argument("--dir", **lab_dir)
    up.add_argument("--hours", type=float, default=interactive.DEFAULT_HOURS, help="the lab stops by itself after")
    up.add_argument("--hosts", type=int, default=0,
                    help="spread the guests over H hosts: network namespaces, each with a Linux bridge, "
                         "joined by VXLAN (root; docs/hosts.md)")
    up.add_argument("--fabric", choices=FABRICS, default="vxlan",
                    help="with --hosts: how the hosts' bridges are joined (l2: one Ethernet segment, MTU 1500)")
    down = sub.add_parser("down", help="stop the lab that up started")
    down.add_argument("--dir", **lab_dir)
    daemon = sub.add_parser("lab-daemon", help="(internal) the background process of up")
    daemon.add_argument("n", type=int)
    daemon.add_argument("--siw", type=int, required=True)
    daemon.add_argument("--share", type=Path, required=True)
    daemon.add_argument("--dir", type=Path, required=True)
    daemon.add_argument("--hours", type=float, required=True)
    daemon.add_argument("--status-fd", type=int, required=True)
    daemon.add_argument("--hosts", type=int, default=0)
    daemon.add_argument("--fabric", choices=FABRICS, default="vxlan")
    return p


def main(argv: list[str] | None = None, prog: str = "vt3") -> int:
    p = parser(prog)
    args = p.parse_args(argv)
    # The lab's processes (up's daemon) inherit these.
    if args.bundle:
        os.environ["VT3_BUNDLE"] = str(args.bundle.resolve())
    if args.accel:
        os.environ["VT3_ACCEL"] = args.accel
    interactive.PROG = prog
    try:
        if args.command in ("demo", "bench"):
            return run_once(args.command, args.keep)
        if args.command == "shell":
            return shell(args.keep)
        if args.command == "up":
            if not 1 <= args.n <= SEGMENT_MAX or not 0 <= args.siw <= args.n:
                p.error(f"up N [--siw K]: 1 ≤ N ≤ {SEGMENT_MAX}, 0 ≤ K ≤ N")
            if not 0 <= args.hosts <= min(args.n, MAX_HOSTS):
                p.error(f"up N --hosts H: 1 ≤ H ≤ N (and ≤ {MAX_HOSTS})")
            if args.hosts and os.geteuid() != 0:
                p.error("up --hosts: hosts are network namespaces, which need root")
            return interactive.up(args.n, args.siw, args.share, args.dir or interactive.default_dir(), args.hours,
                                  args.hosts, args.fabric)
        if args.command == "down":
            return interactive.down(args.dir or interactive.default_dir())
        return interactive.serve(args.n, args.siw, args.share, args.dir, args.hours, args.status_fd, args.hosts,
                                 args.fabric)
    except ConfigError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
