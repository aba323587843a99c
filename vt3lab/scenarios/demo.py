"""The demo (`./run-vm.sh`): two vt3 guests, each behind its own vt3d;
rping, perftest, vt3d's iWARP counters, then a normal close and a fatal
error with their events and flushes (docs/architecture.md §5). Every step
is checked: the demo fails loudly instead of printing a broken run."""

from __future__ import annotations

import re
import time
from typing import Callable

from ..setups import A_IP, B_IP, Vt3Pair
from ..tools import perftest, rping_between, wait_rdma_listen

FLUSH_PORT = 7471


def flushtest_injected(setup: Vt3Pair, scenario: str, style: str, expect: str, fault: list[str]) -> str:
    """One vt3-flushtest client run in b; once it is READY, FAULT goes to
    a's vt3d against a's end of the connection ({PEER})."""
    b = setup.b
    b.spawn(f"vt3-flushtest client --server {A_IP} --port {FLUSH_PORT} --scenario {scenario} "
            f"--style {style} --timeout 60 --expect {expect} -v", "ft-cli", 180)
    ready = None
    deadline = time.monotonic() + 60
    while ready is None and time.monotonic() < deadline:
        ready = re.search(r"^READY (\d+) (\d+) (0x[0-9a-f]+|0) ", b.run("cat /tmp/ft-cli.out", 10).out, re.M)
        if ready is None:
            time.sleep(0.5)
    if ready is None:
        raise AssertionError(f"vt3-flushtest client never READY:\n{b.run('cat /tmp/ft-cli.out', 10).out}")
    setup.vt3a.ctl(*[w.replace("{PEER}", ready.group(2)) for w in fault])
    r = b.join("ft-cli", 150)
    assert r.rc == 0, f"vt3-flushtest client exit {r.rc}:\n{r.out[-1200:]}"
    return r.out


def run_demo(setup: Vt3Pair, say: Callable[[str], None] = print) -> None:
    a, b = setup.a, setup.b
    say(f"== vt3 demo: guests a ({A_IP}) and b ({B_IP}), each with a vt3 RNIC behind its own vt3d ==")
    say("-- b: ibv_devinfo")
    say(b.check("ibv_devinfo -d vt3_0 | head -n 12"))
    say("-- rping -V, 10 verified pings, b → a")
    say("\n".join(rping_between(a, b, 10).splitlines()[-3:]))
    for tool, size, iters, unit in (("ib_write_bw", 65536, 100, "MB/s"), ("ib_read_bw", 65536, 100, "MB/s"),
                                    ("ib_send_lat", 64, 200, "µs")):
        say(f"-- {tool} -R, {size} bytes, b → a: {perftest(a, b, tool, size, iters, setup=setup).value:.2f} {unit}")
    say("-- vt3d ctl stats (a's vt3d, the iWARP counters)")
    stats = setup.vt3a.stats()
    say("\n".join(f"{k:36s} {v}" for k, v in stats.items() if k.startswith("iwarp.")))

    say("-- close and fatal events (docs/events.md): vt3-flushtest client in b, server in a")
    a.spawn(f"vt3-flushtest server --port {FLUSH_PORT} --timeout 600", "ft-srv", 900)
    wait_rdma_listen(a, FLUSH_PORT)
    try:
        say("   a normal close: b disconnects with work outstanding; vt3.ko posts LLP_CLOSE_COMPLETE")
        say("   and libvt3 flushes every receive when b reaps it")
        say(b.check(f"vt3-flushtest client --server {A_IP} --port {FLUSH_PORT} --scenario local-close "
                    "--style events --timeout 60 -v", 120))
        say("   a fatal error: `vt3d ctl fault rst` on a's end of the connection; b gets QP_FATAL")
        say("   and all its work back, flushed")
        say(flushtest_injected(setup, "rst", "events", "QP_FATAL", ["fault", "rst", "--qp", "{PEER}"]))
    finally:
        a.kill("ft-srv")
        a.join("ft-srv", 30)
