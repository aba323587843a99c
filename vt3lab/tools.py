"""Runs of the usual RDMA tools between guests (rdma_cm listens, rping,
perftest), for tests, the demo and the bench. Each checks both ends."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .guest import Guest
from .setups import Setup


def count(out: str, pattern: str) -> int:
    return len(re.findall(pattern, out, re.M))


def wait_rdma_listen(g: Guest, port: int | None = None, timeout: int = 60) -> None:
    """Until an rdma_cm id listens in G (on PORT when given)."""
    pat = "LISTEN" if port is None else f"LISTEN.*:{port}( |$)"
    g.check(f"for i in $(seq {timeout * 5}); do rdma res show cm_id | grep -Eq '{pat}' && exit 0; sleep 0.2; done; "
            "rdma res show cm_id; exit 1", timeout + 5, "no rdma_cm listen")


# What rping prints on stderr at a clean end, and nothing else.
# rping's own race at its end (rdma-core's librdmacm/examples/rping.c):
# main destroys the event channel while cm_thread, back from the
# DISCONNECTED it just handled, calls rdma_get_cm_event on it again; that
# read finds the fd closed, and cm_thread prints this and calls exit(-1),
# racing main's exit(0). Only the process's own fd takes part, after
# every ping was printed (and verified). Seen once in 30 runs of
# rping-vt3-siw, on the siw guest's server: no vt3 code runs there.
RPING_TEARDOWN_RACE = "rdma_get_cm_event: Bad file descriptor"
RPING_CLEAN_END = {
    "client": ["client DISCONNECT EVENT..."],
    "server": ["server DISCONNECT EVENT...", "wait for RDMA_READ_ADV state 10"],
}


def tail(text: str, n: int = 15) -> str:
    return "\n".join(text.splitlines()[-n:])


def ping_numbers(out: str, prefix: str) -> list[int]:
    return [int(n) for n in re.findall(rf"^{prefix}ping data: rdma-ping-(\d+): ", out, re.M)]


def rping_between(server: Guest, client: Guest, pings: int, verify: bool = True, port: int = 7174) -> str:
    """rping (-V: data verified) from CLIENT to SERVER: both ends exit 0,
    each prints pings 0..PINGS-1 once and in order, and nothing on stderr
    but its clean end. (stderr is kept apart: written unbuffered between
    two blocks of stdout, it would split a ping line in two.) Returns the
    client's output."""
    v = "-V" if verify else ""
    # The server outlives the client's bound: a client that hangs is
    # killed (124) with the server still there to be looked at.
    server.spawn(f"rping -s -a {server.ip} -p {port} -C {pings} {v} -v 2> /tmp/rping-srv.err", "rping-srv", 960)
    wait_rdma_listen(server, port)
    c = client.run(f"rping -c -a {server.ip} -p {port} -C {pings} {v} -v 2> /tmp/rping-cli.err", 900)
    # A client that failed, was killed or ended early: both ends' TCP and
    # QPs as they are now, before the server is reaped (a fixture's dump
    # comes later, after the test's own clean-up): was anything in flight?
    done = c.rc == 0 and ping_numbers(c.out, "") == list(range(pings))
    stuck = "" if done else "\n".join(
        f"=== {g.name}:\n" + g.run("ss -tino; grep ^Tcp: /proc/net/snmp; rdma res show qp", 20).out
        for g in (client, server))
    c_err = client.check("cat /tmp/rping-cli.err", 10)
    s = server.join("rping-srv", 60)
    s_err = server.check("cat /tmp/rping-srv.err", 10)
    for who, g, r, err, prefix in (("client", client, c, c_err, ""), ("server", server, s, s_err, "server ")):
        lines = err.splitlines()
        raced = lines[-1:] == [RPING_TEARDOWN_RACE]
        if raced:
            lines = lines[:-1]
        assert r.rc == 0 or (raced and r.rc == 255), \
            f"rping {who} on {g.name}: exit {r.rc}:\n{tail(r.out, 5)}\n{err}{stuck}"
        seen = ping_numbers(r.out, prefix)
        assert seen == list(range(pings)), \
            f"rping {who} printed {len(seen)} pings, want 0..{pings - 1} in order:\n{tail(r.out, 5)}\n{err}{stuck}"
        assert lines == RPING_CLEAN_END[who], f"rping {who}'s stderr:\n{tail(err)}"
    return c.out


# perftest -R opens two rdma_cm connections: first its out-of-band
# exchange, then the data QP, which the server listens for (a new cm_id)
# only after the exchange. Under TCG the client's second connect can come
# before that listen exists; the SYN gets an RST, as any TCP answers a port
# nobody listens on, and perftest fails with this (then crashes in
# librdmacm). That is perftest's race, not the device's: it is retried
# once, and only when the server has shown the second listen (so the
# first connection did work), with a note in the log.
PERFTEST_PORT = 18515
# What the client says: a vt3 client (the TOE reports an RST to its SYN as
# a reset, as iw_cxgb4 does), a siw one (Linux TCP: refused).
PERFTEST_RACE = ("Event: RDMA_CM_EVENT_REJECTED; error: -104.", "ERRNO: Connection refused.")


def listen_ids(g: Guest, port: int, wait: int = 0) -> set[str]:
    """The cm-idn of every rdma_cm id listening on PORT in G; with WAIT,
    first until one does, up to WAIT s (one agent round trip either way)."""
    out = g.check(f"for i in $(seq {wait * 10}); do l=$(rdma res show cm_id); "
                  f"echo \"$l\" | grep -Eq 'LISTEN.*:{port}( |$)' && {{ echo \"$l\"; exit 0; }}; sleep 0.1; done; "
                  f"rdma res show cm_id; [ {wait} = 0 ]", wait + 10, "no rdma_cm listen")
    return set(re.findall(rf"cm-idn (\d+) state LISTEN .*:{port}\b", out))


# perftest times its runs with the CPU's cycle counter, calibrated against
# the clock at start; on a loaded TCG host the calibration can fail, and
# then every rate it prints is 0 for a run that moved all its data.
PERFTEST_CLOCK_FAILED = "Correlation coefficient r^2"


@dataclass
class PerftestRun:
    """One perftest run: its figure (BW average in MB/s, or t_avg in µs
    for latency tools) and what each end printed."""
    value: float
    client: str
    server: str

    def clock_failed(self) -> bool:
        """Whether the rates are 0 because perftest could not calibrate
        its clock (the message counts still hold). Either end: a
        write/read bw server reports the client's measurement."""
        return PERFTEST_CLOCK_FAILED in self.client or PERFTEST_CLOCK_FAILED in self.server


def perftest(server: Guest, client: Guest, tool: str, size: int, iters: int, extra: str = "",
             setup: Setup | None = None, retry_race: bool = True) -> PerftestRun:
    """One perftest run over rdma_cm (-R): both ends exit 0, the client
    prints its result line, and no line of either says fail or error
    (perftest reports some failures, e.g. "Failed to disconnect RDMA CM
    connection.", and exits 0)."""
    server.spawn(f"{tool} -R -F -s {size} -n {iters} {extra}", "pt-srv", 300)
    first_listen = listen_ids(server, PERFTEST_PORT, wait=60)
    try:
        c = client.run(f"{tool} -R -F -s {size} -n {iters} {extra} {server.ip}", 270)
    except Exception:
        if setup is not None:
            (setup.dir / f"hang-{tool}-{size}.txt").write_text(setup.dump())
        raise
    if c.rc != 0 and retry_race and any(m in c.out for m in PERFTEST_RACE) and server.running("pt-srv"):
        later = listen_ids(server, PERFTEST_PORT)
        if later and not later & first_listen:
            server.kill("pt-srv")
            server.join("pt-srv", 30)
            server._log(f"  (perftest's data-connect race: a new listen {sorted(later)} after {sorted(first_listen)}; "
                        "the client connected before it; retried once)\n")
            print(f"{tool} -s {size}: perftest's data-connect race, retried once", flush=True)
            return perftest(server, client, tool, size, iters, extra, setup, retry_race=False)
    s = server.join("pt-srv", 60)
    what = f"{tool} -s {size} {client.name}→{server.name}"
    assert c.rc == 0 and s.rc == 0, (f"{what}: client exit {c.rc}, server exit {s.rc}\n"
                                     f"client:\n{c.out[-600:]}\nserver:\n{s.out[-600:]}")
    for who, out in (("client", c.out), ("server", s.out)):
        bad = [line for line in out.splitlines() if re.search(r"fail|error", line, re.I)]
        assert not bad, f"{what}: {who}: " + "; ".join(bad[:3])
    col = 5 if tool.endswith("_lat") else 3  # t_avg (µs) / BW average (MB/s)
    rows = [line.split() for line in c.out.splitlines() if line.split()[:1] == [str(size)]]
    rows = [r for r in rows if len(r) > col + 1]
    assert rows, f"{tool} -s {size}: no result line:\n{c.out[-600:]}"
    return PerftestRun(float(rows[-1][col]), c.out, s.out)
