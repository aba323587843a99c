"""python3 -m vt3lab demo|bench [--keep] | up N [--siw K] … | down — what
run-vm.sh runs after building everything (the environment of vt3lab.lab
says where it is)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .lab import config_from_env
from .proc import install_signal_handlers
from .setups import SEGMENT_MAX


def run_once(command: str, keep: bool) -> int:
    """demo or bench, in a run directory of its own."""
    install_signal_handlers()
    cfg = config_from_env()
    rundir = Path(tempfile.mkdtemp(prefix=f"vt3-{command}."))
    ok = False
    t0 = time.monotonic()
    try:
        if command == "demo":
            from .demo import run_demo
            from .setups import Vt3Pair
            setup = Vt3Pair(cfg, rundir).start()
            try:
                run_demo(setup, say=lambda s: print(s, flush=True))
            finally:
                setup.stop()
        else:
            from .bench import run_bench
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


def main() -> int:
    from . import interactive
    p = argparse.ArgumentParser(prog="vt3lab")
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("demo", "bench"):
        sub.add_parser(name).add_argument("--keep", action="store_true", help="keep the run directory")
    lab_dir = {"type": Path, "default": None, "help": f"the lab's run directory (default {interactive.default_dir()})"}
    up = sub.add_parser("up", help="boot N guests on one segment in the background (down stops them)")
    up.add_argument("n", type=int, help="how many guests")
    up.add_argument("--siw", type=int, default=0, help="how many of them are siw guests (the last ones)")
    up.add_argument("--share", type=Path, help="host directory mounted in every guest (default DIR/share)")
    up.add_argument("--dir", **lab_dir)
    up.add_argument("--hours", type=float, default=interactive.DEFAULT_HOURS, help="the lab stops by itself after")
    down = sub.add_parser("down", help="stop the lab that up started")
    down.add_argument("--dir", **lab_dir)
    daemon = sub.add_parser("lab-daemon", help="(internal) the background process of up")
    daemon.add_argument("n", type=int)
    daemon.add_argument("--siw", type=int, required=True)
    daemon.add_argument("--share", type=Path, required=True)
    daemon.add_argument("--dir", type=Path, required=True)
    daemon.add_argument("--hours", type=float, required=True)
    daemon.add_argument("--status-fd", type=int, required=True)
    args = p.parse_args()
    if args.command in ("demo", "bench"):
        return run_once(args.command, args.keep)
    if args.command == "up":
        if not 1 <= args.n <= SEGMENT_MAX or not 0 <= args.siw <= args.n:
            p.error(f"up N [--siw K]: 1 ≤ N ≤ {SEGMENT_MAX}, 0 ≤ K ≤ N")
        return interactive.up(args.n, args.siw, args.share, args.dir or interactive.default_dir(), args.hours)
    if args.command == "down":
        return interactive.down(args.dir or interactive.default_dir())
    return interactive.serve(args.n, args.siw, args.share, args.dir, args.hours, args.status_fd)


if __name__ == "__main__":
    sys.exit(main())
