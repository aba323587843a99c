"""python3 -m vt3lab demo|bench|shell [--keep] — what run-vm.sh runs after
building everything (the environment of vt3lab.lab says where it is)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from .lab import config_from_env
from .proc import install_signal_handlers


def main() -> int:
    p = argparse.ArgumentParser(prog="vt3lab")
    p.add_argument("command", choices=["demo", "bench", "up"])
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    p.add_argument("--setup", default="vt3-pair", help="for up: the setup to boot (vt3-pair, vt3-siw, …)")
    args = p.parse_args()
    install_signal_handlers()
    cfg = config_from_env()
    rundir = Path(tempfile.mkdtemp(prefix=f"vt3-{args.command}."))
    ok = False
    t0 = time.monotonic()
    try:
        if args.command == "demo":
            from .demo import run_demo
            from .setups import Vt3Pair
            setup = Vt3Pair(cfg, rundir).start()
            try:
                run_demo(setup, say=lambda s: print(s, flush=True))
            finally:
                setup.stop()
        elif args.command == "bench":
            from .bench import run_bench
            run_bench(cfg, rundir)
        else:
            from .setups import SETUPS
            setup = SETUPS[args.setup](cfg, rundir).start()
            print(f"{args.setup} is up in {rundir}: consoles, logs, sockets; guests "
                  + ", ".join(f"{g.name} {g.ip}" for g in setup.guests.values())
                  + ". Ctrl-C ends it.", flush=True)
            try:
                while all(g.alive() for g in setup.guests.values()):
                    time.sleep(1)
            finally:
                setup.stop()
        ok = True
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
    finally:
        took = time.monotonic() - t0
        if ok and not args.keep:
            shutil.rmtree(rundir, ignore_errors=True)
            print(f"{args.command} done in {took:.0f} s", file=sys.stderr)
        else:
            print(f"{args.command} {'done' if ok else 'FAILED'} in {took:.0f} s; logs in {rundir}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
