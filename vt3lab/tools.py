"""Runs of the usual RDMA tools between guests (rdma_cm listens, rping,
perftest), for tests, the demo and the bench. Each checks both ends."""

from __future__ import annotations

import re

from .guest import Guest
from .setups import Setup


def count(out: str, pattern: str) -> int:
    return len(re.findall(pattern, out, re.M))


def wait_rdma_listen(g: Guest, port: int | None = None, timeout: int = 60) -> None:
    """Until an rdma_cm id listens in G (on PORT when given)."""
    pat = "LISTEN" if port is None else f"LISTEN.*:{port}( |$)"
    g.check(f"for i in $(seq {timeout * 5}); do rdma res show cm_id | grep -Eq '{pat}' && exit 0; sleep 0.2; done; "
            "rdma res show cm_id; exit 1", timeout + 5, "no rdma_cm listen")


def rping_between(server: Guest, client: Guest, pings: int, verify: bool = True) -> str:
    """rping (-V: data verified) from CLIENT to SERVER; both ends must exit
    0 and the client must print every ping."""
    v = "-V" if verify else ""
    server.spawn(f"rping -s -a {server.ip} -C {pings} {v} -v", "rping-srv", 900)
    wait_rdma_listen(server)
    r = client.run(f"rping -c -a {server.ip} -C {pings} {v} -v", 900)
    assert r.rc == 0, f"rping client exit {r.rc}:\n{r.out[-800:]}"
    seen = count(r.out, r"ping data: ")
    assert seen == pings, f"rping client printed {seen} of {pings} pings"
    s = server.join("rping-srv", 60)
    assert s.rc == 0, f"rping server exit {s.rc}:\n{s.out[-800:]}"
    return r.out


def perftest(server: Guest, client: Guest, tool: str, size: int, iters: int, extra: str = "",
             setup: Setup | None = None) -> float:
    """One perftest run over rdma_cm (-R); both ends must exit 0. Returns
    BW average (MB/s) or, for latency tools, t_avg (µs)."""
    server.spawn(f"{tool} -R -F -s {size} -n {iters} {extra}", "pt-srv", 300)
    wait_rdma_listen(server)
    client.spawn(f"{tool} -R -F -s {size} -n {iters} {extra} {server.ip}", "pt-cli", 280)
    try:
        c = client.join("pt-cli", 270)
    except Exception:
        if setup is not None:
            (setup.dir / f"hang-{tool}-{size}.txt").write_text(setup.dump())
        raise
    s = server.join("pt-srv", 60)
    assert c.rc == 0 and s.rc == 0, (f"{tool} -s {size} {client.name}→{server.name}: client exit {c.rc}, "
                                      f"server exit {s.rc}\nclient:\n{c.out[-600:]}\nserver:\n{s.out[-600:]}")
    col = 5 if tool.endswith("_lat") else 3  # t_avg (µs) / BW average (MB/s)
    rows = [l.split() for l in c.out.splitlines() if l.split()[:1] == [str(size)]]
    rows = [r for r in rows if len(r) > col + 1]
    assert rows, f"{tool} -s {size}: no result line:\n{c.out[-600:]}"
    return float(rows[-1][col])
