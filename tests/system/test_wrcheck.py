"""libvt3's VT3_WRCHECK=1 (docs/wrcheck.md): the provider's own account of
every WR posted and every completion handed back, read from the JSON
lines of VT3_WRCHECK_FILE. rping's protocol fixes its numbers: per ping
the client posts two SENDs and takes two receives, the server posts a
READ, a SEND, a WRITE and a SEND and takes two receives, all signaled;
each side keeps one receive posted, reposted after each one taken, and
that last receive is flushed when the connection ends."""

from __future__ import annotations

import json

from helpers import A_IP, wait_rdma_listen
from vt3lab.tools import RPING_CLEAN_END, RPING_TEARDOWN_RACE, tail

PORT = 7174
WC = "/tmp/wc.json"
ON = f"VT3_WRCHECK=1 VT3_WRCHECK_FILE={WC}"
COUNTS = ("posted", "completed", "flushed", "lost", "duplicated", "unpolled", "unsignaled", "reset")


def records(g, path: str = WC) -> list[dict]:
    """The JSON lines wrcheck wrote to PATH in guest G (none: no file)."""
    r = g.run(f"cat {path}", 10)
    return [json.loads(line) for line in r.out.splitlines() if line.strip()] if r.ok else []


def no_trouble(recs: list[dict], who: str) -> None:
    """No WR lost or completed twice: the immediate events first, with
    their wr_ids, then every report's counts."""
    bad = [r for r in recs if r["wrcheck"] in ("lost", "duplicated")]
    assert not bad, f"wrcheck on {who}: {len(bad)} WR(s) lost or duplicated: {bad[:4]}"
    for r in recs:
        if "lost" in r:
            assert (r["lost"], r["duplicated"]) == (0, 0), \
                f"wrcheck on {who}: {r['lost']} lost {r['lost_wr_ids']}, " \
                f"{r['duplicated']} duplicated {r['duplicated_wr_ids']}: {r}"


def reports(recs: list[dict], who: str) -> tuple[dict, dict]:
    """The one QP's report (at its destroy) and the process summary."""
    qps = [r for r in recs if r["wrcheck"] == "qp"]
    sums = [r for r in recs if r["wrcheck"] == "summary"]
    assert len(qps) == 1 and len(sums) == 1, f"wrcheck on {who}: want one QP report and one summary, got {recs}"
    qp, s = qps[0], sums[0]
    assert qp["at"] == "destroy", f"wrcheck on {who}: rping's QP was not destroyed: {qp}"
    assert (s["qps"], s["srqs"], s["alive"]) == (1, 0, 0), f"wrcheck on {who}: summary {s}"
    assert {k: s[k] for k in COUNTS} == {k: qp[k] for k in COUNTS}, \
        f"wrcheck on {who}: the summary is not its one QP's report:\n{qp}\n{s}"
    for q in ("sq", "rq"):
        c = qp[q]
        assert c["posted"] == c["completed"] + c["lost"] + c["unpolled"] + c["unsignaled"] + c["reset"], \
            f"wrcheck on {who}: {q} counts do not add up: {c}"
        assert c["flushed"] <= c["completed"], f"wrcheck on {who}: {q} flushes not counted as completions: {c}"
    return qp, s


def rping_pair(a, b, pings: int, env: str, client_bound: int = 600):
    """rping -V from b (client, tag wc-cli) to a (server, wc-srv), ENV
    before each; stderr apart in /tmp/TAG.err (written unbuffered between
    blocks of stdout, it would split a ping line)."""
    a.run(f"rm -f {WC}", 10)
    b.run(f"rm -f {WC}", 10)
    a.spawn(f"{env} rping -s -a {A_IP} -p {PORT} -C {pings} -V -v 2> /tmp/wc-srv.err", "wc-srv", 900)
    wait_rdma_listen(a, PORT)
    b.spawn(f"{env} rping -c -a {A_IP} -p {PORT} -C {pings} -V -v 2> /tmp/wc-cli.err", "wc-cli", client_bound)


def ended(g, tag: str, seconds: int = 60):
    """The spawned TAG's Result once it ended; exit status 200 if it still
    runs after SECONDS (left running: its wrcheck lines come first)."""
    return g.run(f"i=0; while [ ! -e /tmp/{tag}.rc ] && [ $i -lt {seconds * 5} ]; do sleep 0.2; i=$((i+1)); done; "
                 f"cat /tmp/{tag}.out; [ -e /tmp/{tag}.rc ] || exit 200; exit $(cat /tmp/{tag}.rc)", seconds + 20)


def stderr_lines(g, tag: str) -> list[str]:
    return g.check(f"cat /tmp/{tag}.err", 10).splitlines()


def test_wrcheck(vt3_pair):
    """rping -V with VT3_WRCHECK=1 on both ends, cut by vt3d ctl fault rst, then clean (-C 20): nothing lost
    or completed twice, flushes counted as completions, the clean run's counts exactly rping's"""
    p = vt3_pair
    a, b = p.a, p.b

    # Cut mid-run: the peer's RST ends both QPs in error, whatever was
    # outstanding is flushed (or left unpolled when rping's CQ thread
    # stopped at an error completion), never lost.
    rping_pair(a, b, 100000, ON)
    b.run("i=0; while [ $(grep -c 'ping data' /tmp/wc-cli.out) -lt 20 ] && [ $i -lt 600 ]; do "
          "sleep 0.2; i=$((i+1)); done", 130)
    assert b.running("wc-cli") and a.running("wc-srv"), \
        f"rping ended before the fault:\n{tail(b.check('cat /tmp/wc-cli.out', 10))}"
    p.vt3a.ctl("fault", "rst", "--port", str(PORT))
    c, s = ended(b, "wc-cli"), ended(a, "wc-srv")
    # wrcheck's word first: a WR lost may be why an rping never ends.
    for g, who in ((b, "client"), (a, "server")):
        no_trouble(records(g), f"rping {who} after the RST")
    for g, tag, r, who in ((b, "wc-cli", c, "client"), (a, "wc-srv", s, "server")):
        if r.rc == 200:
            g.kill(tag, "KILL")
        # rping takes the abort for the peer's end: it leaves its loop on
        # the DISCONNECTED event and exits 0, as after a clean close.
        assert r.rc == 0, f"rping {who} after the RST: exit {r.rc}:\n{tail(r.out)}"
        err = g.check(f"cat /tmp/{tag}.err", 10)
        assert f"{'server' if who == 'server' else 'client'} DISCONNECT EVENT" in err, \
            f"rping {who} after the RST: no DISCONNECT event:\n{tail(err)}"
        qp, _ = reports(records(g), f"rping {who} after the RST")
        # The one receive rping keeps posted was outstanding at the RST.
        assert qp["rq"]["flushed"] + qp["rq"]["unpolled"] >= 1, \
            f"rping {who} after the RST: its posted receive neither flushed nor unpolled: {qp}"
        assert qp["posted"] > 0 and qp["completed"] > 0, f"rping {who}: {qp}"

    # Clean: rping's exact numbers.
    pings = 20
    rping_pair(a, b, pings, ON)
    c = b.join("wc-cli", 600)
    s = a.join("wc-srv", 120)
    want = {
        "client": {"sq": 2 * pings, "rq": 2 * pings + 1},
        "server": {"sq": 4 * pings, "rq": 2 * pings + 1},
    }
    for g, r, who, tag in ((b, c, "client", "wc-cli"), (a, s, "server", "wc-srv")):
        recs = records(g)
        no_trouble(recs, f"rping {who}")
        lines = stderr_lines(g, tag)
        raced = RPING_TEARDOWN_RACE in lines
        assert r.rc == 0 or (raced and r.rc == 255), f"rping {who}: exit {r.rc}:\n{tail(r.out)}"
        assert sum("ping data" in line for line in r.out.splitlines()) == pings, f"rping {who}:\n{tail(r.out)}"
        qp, _ = reports(recs, f"rping {who}")
        for q in ("sq", "rq"):
            n = want[who][q]
            got = {k: qp[q][k] for k in ("posted", "completed", "flushed", "unpolled", "unsignaled")}
            flushed = 1 if q == "rq" else 0
            assert got == {"posted": n, "completed": n, "flushed": flushed, "unpolled": 0, "unsignaled": 0}, \
                f"rping {who} {q}: {got}, want {n} posted and completed ({flushed} flushed): {qp}"
        summary = [line for line in lines if line.startswith("libvt3 wrcheck: pid")]
        n = sum(want[who].values())
        assert len(summary) == 1 and f"posted {n}, completed {n} (1 flushed), lost 0, duplicated 0, unpolled 0" \
            in summary[0], f"rping {who}: wrcheck's stderr summary: {summary}"
        assert [x for x in lines if x not in summary and x != RPING_TEARDOWN_RACE] == RPING_CLEAN_END[who], \
            f"rping {who}'s stderr:\n{tail(chr(10).join(lines))}"


def test_wrcheck_unpolled(vt3_pair):
    """VT3_WRCHECK=1: receives posted (one wr_id for all) to a QP and an SRQ, destroyed without a poll, are
    unpolled at destroy, not lost (vt3-wrcheck-idle)"""
    a = vt3_pair.a
    a.run(f"rm -f {WC}", 10)
    r = a.run(f"{ON} vt3-wrcheck-idle 5 3", 60)
    assert r.rc == 0, f"vt3-wrcheck-idle: exit {r.rc}:\n{r.out}"
    recs = records(a)
    no_trouble(recs, "vt3-wrcheck-idle")
    by = {x["wrcheck"]: x for x in recs}
    assert sorted(x["wrcheck"] for x in recs) == ["qp", "srq", "summary"], f"wrcheck: {recs}"
    qp, srq, s = by["qp"], by["srq"], by["summary"]
    assert (qp["rq"]["posted"], qp["rq"]["unpolled"], qp["rq"]["completed"], qp["sq"]["posted"]) == (5, 5, 0, 0), \
        f"the QP's 5 receives are not reported unpolled: {qp}"
    assert (srq["posted"], srq["unpolled"], srq["completed"]) == (3, 3, 0), f"the SRQ's 3 receives: {srq}"
    assert (s["qps"], s["srqs"], s["alive"], s["posted"], s["unpolled"], s["lost"]) == (1, 1, 0, 8, 8, 0), \
        f"summary: {s}"
    assert f"QP {qp['qp_num']} (destroyed): posted 5, completed 0, lost 0, duplicated 0, unpolled 5" in r.out, \
        f"no stderr line for the QP:\n{r.out}"


def test_wrcheck_off(vt3_pair):
    """without VT3_WRCHECK=1 (unset or 0) libvt3 writes no wrcheck file and prints nothing, VT3_WRCHECK_FILE
    set or not; rping's stderr is its usual"""
    p = vt3_pair
    a, b = p.a, p.b
    for env in (f"VT3_WRCHECK_FILE={WC}", f"VT3_WRCHECK=0 VT3_WRCHECK_FILE={WC}"):
        a.run(f"rm -f {WC}", 10)
        r = a.run(f"{env} vt3-wrcheck-idle 5 3", 60)
        assert r.rc == 0 and r.out.startswith("qp_num ") and len(r.out.splitlines()) == 1, \
            f"{env} vt3-wrcheck-idle printed more than its line:\n{r.out}"
        assert not a.run(f"[ -e {WC} ]", 10).ok, f"{env}: {WC} was written"
    rping_pair(a, b, 5, f"VT3_WRCHECK_FILE={WC}")
    c = b.join("wc-cli", 600)
    s = a.join("wc-srv", 120)
    for g, r, who, tag in ((b, c, "client", "wc-cli"), (a, s, "server", "wc-srv")):
        lines = stderr_lines(g, tag)
        raced = lines[-1:] == [RPING_TEARDOWN_RACE]
        assert r.rc == 0 or (raced and r.rc == 255), f"rping {who}: exit {r.rc}:\n{tail(r.out)}"
        assert (lines[:-1] if raced else lines) == RPING_CLEAN_END[who], f"rping {who}'s stderr: {lines}"
        assert not g.run(f"[ -e {WC} ]", 10).ok, f"rping {who}: {WC} was written with VT3_WRCHECK unset"
