"""Close, fault and flush events (docs/architecture.md §5, docs/events.md):
vt3-flushtest's server (the passive side, any provider) in one guest, its
client (vt3, the side under test) in the other; faults from the
application, the peer, or the host (`vt3d ctl fault …`, a killed vt3d).

Roles: in `vt3_pair` the server runs in a and the client in b; in `vt3_siw`
(a vt3, b siw) the siw server runs in b and the vt3 client in a.

The client prints "READY <qpn> <peer qpn> <rkey> SCENARIO STYLE" once its
work is posted, one "SCENARIO STYLE ok|FAIL: …" line per run and
"vt3-flushtest: N passed, N failed". Every check here counts the runs it
asked for: a run that silently does not happen fails.

VT3_FLUSH_STYLES (comma list, default every style) narrows a run, e.g.
    VT3_FLUSH_STYLES=events pytest tests/system/test_flush.py --case flush-rst
"""

from __future__ import annotations

import os
import re
import signal
import time
from contextlib import contextmanager

import pytest

from helpers import A_IP, B_IP, count, no_objects, wait_rdma_listen
from vt3lab import KMOD, Vt3d
from vt3lab.setups import wait_device

ALL_STYLES = ("events", "poll", "post", "cq-event", "idle")
STYLES = tuple(s for s in os.environ.get("VT3_FLUSH_STYLES", ",".join(ALL_STYLES)).replace(" ", ",").split(",") if s)
_bad = [s for s in STYLES if s not in ALL_STYLES]
if _bad or not STYLES:
    raise ValueError(f"VT3_FLUSH_STYLES: unknown style(s) {_bad or '(none given)'}; known: {','.join(ALL_STYLES)}")

PORT = 7471
SRV, CLI = "ft-srv", "ft-cli"
RUN_TIMEOUT = 60          # the client's --timeout, per run
# vt3-datapath's checks (vt3-datapath -l): on vt3_0 each one runs and passes.
DATAPATH_CHECKS = 24

# What the client expects by default per scenario (vt3-flushtest.c's table).
EVENTS = {
    "local-close": ["LLP_CLOSE_COMPLETE"],
    "peer-close": ["LLP_CLOSE_COMPLETE"],
    "peer-abort": ["QP_FATAL"],
    "bad-stag": ["QP_ACCESS_ERR"],
    "bad-wqe": ["QP_REQ_ERR"],
    "cq-overflow": ["CQ_ERR", "LLP_CLOSE_COMPLETE"],
}

RESULT = re.compile(r"^(?P<scen>\S+)\s+(?P<style>\S+)\s+(?P<verdict>ok|FAIL): (?P<rest>.*)$", re.M)
WRS = re.compile(r"^(\d+) WRs: (\d+) ok, (\d+) flushed, (\d+) error, (\d+) none; events (.*?)(?:;| -- |$)")
SUMMARY = re.compile(r"^vt3-flushtest: (\d+) passed, (\d+) failed$", re.M)


def tail(out: str, n: int = 25) -> str:
    return "\n".join(out.splitlines()[-n:])


# ------------------------------------------------------------------ results

def check_results(rc: int, out: str, runs: list[tuple[str, str]], expect: dict[str, list[str]],
                  what: str, extra: tuple[str, ...] = ()) -> list[dict]:
    """The client's output holds exactly RUNS (scenario, style), in order,
    each ok, the summary 'len(RUNS) passed, 0 failed' and exit status 0;
    every style but idle (which reads no events) got the events EXPECT
    names for its scenario and no other (but EXTRA); the WR accounting
    adds up. Returns the runs' parsed fields."""
    failed = [m.group(0) for m in RESULT.finditer(out) if m.group("verdict") == "FAIL"]
    assert not failed, f"{what}: {len(failed)} run(s) failed (exit {rc}):\n" + "\n".join(failed[:3]) + \
        f"\n--- client output tail ---\n{tail(out)}"
    got = [(m.group("scen"), m.group("style")) for m in RESULT.finditer(out)]
    assert got == runs, f"{what}: result lines for {got}, want {runs} (exit {rc}):\n{tail(out)}"
    sums = SUMMARY.findall(out)
    assert sums, f"{what}: no 'vt3-flushtest: N passed' summary (exit {rc}):\n{tail(out)}"
    passed, nfailed = map(int, sums[-1])
    assert (passed, nfailed) == (len(runs), 0), \
        f"{what}: summary {passed} passed, {nfailed} failed; want {len(runs)} passed, 0 failed:\n{tail(out)}"
    assert rc == 0, f"{what}: client exit status {rc} after {passed} passed, 0 failed:\n{tail(out)}"
    parsed = []
    for m in RESULT.finditer(out):
        scen, style, rest = m.group("scen"), m.group("style"), m.group("rest")
        w = WRS.match(rest)
        assert w, f"{what}: {scen}/{style}: unparsable result: {m.group(0)}"
        nwr, ok, flushed, error, none = map(int, w.groups()[:5])
        events = w.group(6).split()
        line = m.group(0)
        assert ok + flushed + error + none <= nwr, f"{what}: WR counts do not add up: {line}"
        if style == "idle":
            # Destroyed without reaping: nothing of the QP may come after
            # ibv_destroy_qp (the tool drains the CQ), so nothing is seen.
            assert ok + flushed + error == 0 and none > 0, \
                f"{what}: the idle style saw completions of its destroyed QP: {line}"
            assert events == ["-"], f"{what}: the idle style read events: {line}"
            parsed.append({"scen": scen, "style": style, "wrs": nwr, "ok": ok, "flushed": flushed,
                           "error": error, "none": none, "events": events, "line": line})
            continue
        # bad-wqe: exactly its one bad WRITE completes with its own error;
        # anything else allows SUCCESS or WR_FLUSH_ERR only.
        want_error = 1 if scen == "bad-wqe" else 0
        assert error == want_error, f"{what}: {error} WRs with an error status, want {want_error}: {line}"
        if scen != "cq-overflow":  # CQEs past the overflowed ring are lost by design
            assert none == 0, f"{what}: {none} WRs never completed: {line}"
        if scen != "crc":  # the four receives wait for a SEND that never comes: flushed
            assert flushed >= 4, f"{what}: only {flushed} WRs flushed (4 receives at least): {line}"
        missing = [e for e in expect[scen] if e not in events]
        assert not missing, f"{what}: {scen}/{style}: events {events}, {missing} missing: {line}"
        # Read until the expected ones came: anything else came first.
        stray = [e for e in events if e not in expect[scen] and e not in extra]
        assert not stray, f"{what}: {scen}/{style}: unexpected events {stray} (want {expect[scen]}): {line}"
        parsed.append({"scen": scen, "style": style, "wrs": nwr, "ok": ok, "flushed": flushed,
                       "error": error, "none": none, "events": events, "line": line})
    return parsed


# ------------------------------------------------------------------- server

class FlushServer:
    """vt3-flushtest server in guest G (it serves one client connection at
    a time, any number of them). `connections` counts what the clients of
    the test opened; stop() wants the server still running, kills it (exit
    143: our TERM) and finds exactly that many accepted."""

    def __init__(self, g):
        self.g = g
        self.connections = 0

    def start(self) -> "FlushServer":
        self.g.spawn(f"echo $$ > /tmp/{SRV}.spid; exec vt3-flushtest server --port {PORT} --timeout 600",
                     SRV, 900)
        try:
            wait_rdma_listen(self.g, PORT)
        except BaseException:
            self.stop(check=False)
            raise
        return self

    def stop(self, check: bool = True) -> str:
        g = self.g
        if check and not g.running(SRV):
            r = g.join(SRV, 10)
            raise AssertionError(f"flushtest server in {g.name} exited early (exit {r.rc}):\n{tail(r.out)}")
        g.run(f"kill -TERM $(cat /tmp/{SRV}.spid) 2>/dev/null; true", 10)
        try:
            r = g.join(SRV, 30)
        except Exception:
            if check:
                raise
            g.run(f"kill -KILL $(cat /tmp/{SRV}.spid) 2>/dev/null; true", 10)
            return ""
        if check:
            assert r.rc == 143, f"flushtest server in {g.name}: exit {r.rc}, want 143 (our TERM):\n{tail(r.out)}"
            assert re.search(rf"^SERVER LISTENING {PORT}$", r.out, re.M), f"server output:\n{tail(r.out)}"
            accepted = count(r.out, r"^SERVER ACCEPTED ")
            assert accepted == self.connections, (
                f"flushtest server accepted {accepted} connections, the clients opened {self.connections}:\n"
                f"{tail(r.out)}")
        return r.out


@contextmanager
def flush_server(g):
    """A FlushServer in G for the test's duration; on the way out it must
    still be running and have served every client (a failure inside wins:
    the server is then only stopped)."""
    srv = FlushServer(g).start()
    try:
        yield srv
    except BaseException:
        try:
            srv.stop(check=False)
        except Exception:
            pass
        raise
    srv.stop()


# ------------------------------------------------------------------- client

def client_cmd(server_ip: str, scenarios: str, styles: str, timeout: int = RUN_TIMEOUT, expect: str = "",
               options: str = "") -> str:
    return (f"vt3-flushtest client --server {server_ip} --port {PORT} --scenario {scenarios} --style {styles} "
            f"--timeout {timeout}" + (f" --expect {expect}" if expect else "") + (f" {options}" if options else ""))


def flush_run(client, server_ip: str, srv: FlushServer, scenarios: list[str], styles=STYLES,
              expect: str = "", options: str = "") -> list[dict]:
    """One client run of SCENARIOS × STYLES (no host action); every one
    ok, with its scenario's events (or, given, --expect EXPECT's)."""
    runs = [(s, y) for s in scenarios for y in styles]
    events = {s: expect.split(",") for s in scenarios} if expect else EVENTS
    srv.connections += len(runs)
    r = client.run(client_cmd(server_ip, ",".join(scenarios), ",".join(styles), expect=expect, options=options),
                   60 + len(runs) * 2 * RUN_TIMEOUT)
    return check_results(r.rc, r.out, runs, events, f"{','.join(scenarios)} × {','.join(styles)}")


def wait_ready(client, what: str, timeout: int = 60) -> tuple[int, int, str]:
    """The client's READY line: (its QP number, the server's, its rkey)."""
    r = client.run(f"i=0; while [ $i -lt {timeout * 10} ]; do grep -q '^READY' /tmp/{CLI}.out && break; "
                   f"[ -e /tmp/{CLI}.rc ] && break; sleep 0.1; i=$((i+1)); done; "
                   f"grep '^READY' /tmp/{CLI}.out || "
                   f"{{ cat /tmp/{CLI}.out; echo \"(exit $(cat /tmp/{CLI}.rc 2>/dev/null))\"; exit 1; }}",
                   timeout + 10)
    assert r.rc == 0, f"{what}: the client never printed READY:\n{tail(r.out)}"
    f = r.out.splitlines()[0].split()
    assert len(f) == 6, f"{what}: odd READY line {r.out!r}"
    return int(f[1]), int(f[2]), f[3]


def injected(client, server_ip: str, srv: FlushServer, scen: str, style: str, expect: str, action,
             timeout: int = RUN_TIMEOUT, extra: tuple[str, ...] = ()) -> dict:
    """One client run of SCEN in STYLE in the background; once it printed
    READY, ACTION(qpn, peer_qpn, rkey) runs on the host. The run must pass
    with the expected event (--expect EXPECT)."""
    what = f"{scen}/{style}"
    client.spawn(f"echo $$ > /tmp/{CLI}.spid; exec " + client_cmd(server_ip, scen, style, timeout, expect),
                 CLI, timeout + 60)
    srv.connections += 1
    try:
        qpn, peer, rkey = wait_ready(client, what)
        action(qpn, peer, rkey)
        r = client.join(CLI, timeout + 90)
    except BaseException:
        try:
            client.run(f"kill -KILL $(cat /tmp/{CLI}.spid) 2>/dev/null; true", 10)
        except Exception:
            pass
        raise
    return check_results(r.rc, r.out, [(scen, style)], {scen: expect.split(",")}, what, extra)[0]


def fault(d: Vt3d, name: str, *args, qp: int | None = None) -> dict:
    """`vt3d ctl fault NAME …` on D; the answer must be a success for that
    fault (Vt3d.ctl raises on an error answer) and name the QP given."""
    argv = ["fault", name, *map(str, args)] + (["--qp", str(qp)] if qp is not None else [])
    answer = d.ctl(*argv)
    assert isinstance(answer, dict) and answer.get("fault") == name, f"vt3d {d.name} {' '.join(argv)}: {answer!r}"
    if qp is not None:
        assert answer.get("qp") == qp, f"vt3d {d.name} {' '.join(argv)}: answered for QP {answer.get('qp')}: {answer!r}"
    return answer


def kill_vt3d(setup, name: str, sig: int) -> None:
    """Kills vt3d NAME of SETUP and sees it gone. The scenario wants it
    dead: it leaves the setup's vt3d table, so that the health check after
    the (fresh) scenario does not report it."""
    d = setup.vt3d[name]
    assert d.alive(), f"vt3d {name} was not running before the kill"
    d.kill(sig)
    deadline = time.monotonic() + 10
    while d.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not d.alive(), f"vt3d {name} still running 10 s after signal {sig}"
    del setup.vt3d[name]


# -------------------------------------------------------------------- tests

def test_flush_datapath(vt3_plain):
    """vt3-datapath on vt3_0: posting rules, ring full, the flush without a connection; every check runs, none skipped"""  # noqa: E501
    a = vt3_plain.a
    r = a.run("vt3-datapath -d vt3_0", 300)
    fails = [line for line in r.out.splitlines() if line.startswith("FAIL ")]
    assert not fails, f"vt3-datapath: {len(fails)} check(s) failed (exit {r.rc}):\n{tail(r.out)}"
    assert re.search(r"^vt3-datapath: vt3_0 \(vt3\): ", r.out, re.M), f"vt3_0 not recognized as vt3:\n{tail(r.out)}"
    m = re.findall(r"^vt3-datapath: vt3_0: (\d+) passed, (\d+) failed, (\d+) skipped$", r.out, re.M)
    assert m, f"vt3-datapath printed no summary (exit {r.rc}):\n{tail(r.out)}"
    got = tuple(map(int, m[-1]))
    assert got == (DATAPATH_CHECKS, 0, 0), (
        f"vt3-datapath: {got[0]} passed, {got[1]} failed, {got[2]} skipped; "
        f"want {DATAPATH_CHECKS}, 0, 0:\n{tail(r.out)}")
    assert count(r.out, r"^ok   \S+ ") == DATAPATH_CHECKS, f"ok lines do not match the summary:\n{tail(r.out)}"
    assert r.rc == 0, f"vt3-datapath exit {r.rc}:\n{tail(r.out)}"
    no_objects(vt3_plain, "after vt3-datapath")


@pytest.mark.qemu10
@pytest.mark.kernel612
def test_flush_local(vt3_pair):
    """local-close × styles between two vt3 guests: LLP_CLOSE_COMPLETE, receives flushed"""
    with flush_server(vt3_pair.a) as srv:
        flush_run(vt3_pair.b, A_IP, srv, ["local-close"])
    no_objects(vt3_pair, "after local-close")


def test_flush_decoy_qp(vt3_pair):
    """local-close × styles, each test QP created after a decoy QP whose address has the same low 32 bits where
    calloc could give it (vt3-flushtest --decoy-qp): LLP_CLOSE_COMPLETE reaches the right QP, both destroys return"""
    with flush_server(vt3_pair.a) as srv:
        flush_run(vt3_pair.b, A_IP, srv, ["local-close"], options="--decoy-qp")
    no_objects(vt3_pair, "after local-close with decoys")


def test_flush_local_siw(vt3_siw):
    """local-close × styles, vt3 client against a siw server"""
    with flush_server(vt3_siw.b) as srv:
        flush_run(vt3_siw.a, B_IP, srv, ["local-close"])
    no_objects(vt3_siw, "after local-close")


@pytest.mark.qemu10
def test_flush_peer(vt3_pair):
    """peer-close, peer-abort (RST), bad-stag × styles between two vt3 guests"""
    with flush_server(vt3_pair.a) as srv:
        flush_run(vt3_pair.b, A_IP, srv, ["peer-close", "peer-abort", "bad-stag"])
    no_objects(vt3_pair, "after the peer's close, abort and bad STag")


def test_flush_peer_siw(vt3_siw):
    """peer-close, bad-stag × styles against a siw server; peer-abort there is a FIN (LLP_CLOSE_COMPLETE)"""
    with flush_server(vt3_siw.b) as srv:
        flush_run(vt3_siw.a, B_IP, srv, ["peer-close", "bad-stag"])
        # siw closes its socket gracefully when its QP is destroyed with the
        # connection up (FIN, not RST): vt3 sees a peer close, not a reset.
        flush_run(vt3_siw.a, B_IP, srv, ["peer-abort"], expect="LLP_CLOSE_COMPLETE")
    no_objects(vt3_siw, "after the siw peer's close, abort and bad STag")


@pytest.mark.qemu10
def test_flush_bad_wqe(vt3_pair):
    """bad-wqe × styles: the bad WRITE's own error CQE, QP_REQ_ERR, the rest flushed"""
    with flush_server(vt3_pair.a) as srv:
        flush_run(vt3_pair.b, A_IP, srv, ["bad-wqe"])
    no_objects(vt3_pair, "after bad-wqe")


@pytest.mark.qemu10
def test_flush_cq_overflow(vt3_pair):
    """cq-overflow × styles: CQ_ERR, then the close flushes the receives"""
    with flush_server(vt3_pair.a) as srv:
        flush_run(vt3_pair.b, A_IP, srv, ["cq-overflow"])
    no_objects(vt3_pair, "after cq-overflow")


def test_flush_peer_gone(fresh_vt3_pair):
    """the server's vt3d killed (no RST, no FIN): the client's TCP times out, QP_FATAL, flush (events style)"""
    p = fresh_vt3_pair
    with flush_server(p.a) as srv:
        injected(p.b, A_IP, srv, "timeout", "events", "QP_FATAL",
                 lambda qpn, peer, rkey: kill_vt3d(p, "vt3a", signal.SIGKILL), timeout=90)
    no_objects(p, "after the peer's vt3d was killed")


@pytest.mark.qemu10
@pytest.mark.kernel612
@pytest.mark.parametrize("style", STYLES)
def test_flush_rst(vt3_pair, style):
    """vt3d ctl fault rst on the server's connection: the client gets QP_FATAL, everything flushed"""
    with flush_server(vt3_pair.a) as srv:
        injected(vt3_pair.b, A_IP, srv, "rst", style, "QP_FATAL",
                 lambda qpn, peer, rkey: fault(vt3_pair.vt3a, "rst", qp=peer))
    no_objects(vt3_pair, "after fault rst")


@pytest.mark.parametrize("style", STYLES)
def test_flush_fin(vt3_pair, style):
    """vt3d ctl fault fin on the server's connection: the client completes the close, LLP_CLOSE_COMPLETE"""
    with flush_server(vt3_pair.a) as srv:
        injected(vt3_pair.b, A_IP, srv, "fin", style, "LLP_CLOSE_COMPLETE",
                 lambda qpn, peer, rkey: fault(vt3_pair.vt3a, "fin", qp=peer))
    no_objects(vt3_pair, "after fault fin")


@pytest.mark.parametrize("style", STYLES)
def test_flush_blackhole(chaos_pair, style):
    """vt3d ctl fault blackhole on the server's connection: retransmit timeout (the pair's 4 s), QP_FATAL"""
    with flush_server(chaos_pair.a) as srv:
        injected(chaos_pair.b, A_IP, srv, "timeout", style, "QP_FATAL",
                 lambda qpn, peer, rkey: fault(chaos_pair.vt3a, "blackhole", qp=peer), timeout=90)
    no_objects(chaos_pair, "after fault blackhole")


# (name, layer, etype, ecode, style, the client's event): RDMAP etype 1
# remote protection, 2 remote operation, 0 catastrophic; DDP etype 1
# tagged, 2 untagged buffer; LLP (MPA) CRC. The styles spread over the
# codes as the old case did; a style VT3_FLUSH_STYLES leaves out becomes
# its first style, so every code still runs.
TERMINATE = [
    ("rdmap-protection", 0, 1, 0x00, "events", "QP_ACCESS_ERR"),
    ("rdmap-operation", 0, 2, 0x06, "poll", "QP_REQ_ERR"),
    ("rdmap-catastrophic", 0, 0, 0x00, "events", "QP_FATAL"),
    ("ddp-tagged", 1, 1, 0x00, "cq-event", "QP_ACCESS_ERR"),
    ("ddp-untagged", 1, 2, 0x01, "post", "QP_REQ_ERR"),
    ("llp-crc", 2, 0, 0x02, "idle", "QP_FATAL"),
    ("llp-crc", 2, 0, 0x02, "events", "QP_FATAL"),
]


def _terminate_params():
    seen, params = set(), []
    for name, layer, etype, ecode, style, ev in TERMINATE:
        style = style if style in STYLES else STYLES[0]
        if (name, style) in seen:
            continue
        seen.add((name, style))
        marks = [pytest.mark.qemu10] if name == "rdmap-protection" else []
        params.append(pytest.param(layer, etype, ecode, style, ev, id=f"{name}-{style}", marks=marks))
    return params


@pytest.mark.parametrize("layer,etype,ecode,style,event", _terminate_params())
def test_flush_terminate(vt3_pair, layer, etype, ecode, style, event):
    """vt3d ctl fault terminate from the server, by layer/etype: QP_ACCESS_ERR / QP_REQ_ERR / QP_FATAL"""
    with flush_server(vt3_pair.a) as srv:
        injected(vt3_pair.b, A_IP, srv, "terminate", style, event,
                 lambda qpn, peer, rkey: fault(vt3_pair.vt3a, "terminate", "--layer", layer, "--etype", etype,
                                               "--ecode", ecode, qp=peer))
    no_objects(vt3_pair, "after fault terminate")


@pytest.mark.parametrize("style", STYLES)
def test_flush_crc(vt3_pair, style):
    """vt3d ctl fault corrupt-crc on the server, whose SEND then arrives corrupted: QP_FATAL"""
    with flush_server(vt3_pair.a) as srv:
        injected(vt3_pair.b, A_IP, srv, "crc", style, "QP_FATAL",
                 lambda qpn, peer, rkey: fault(vt3_pair.vt3a, "corrupt-crc", qp=peer))
    no_objects(vt3_pair, "after fault corrupt-crc")


@pytest.mark.parametrize("style", STYLES)
def test_flush_stag(vt3_pair, style):
    """vt3d ctl fault invalidate-stag of the client's buffer, then the server WRITEs to it: QP_ACCESS_ERR"""
    with flush_server(vt3_pair.a) as srv:
        def invalidate(qpn, peer, rkey):
            answer = fault(vt3_pair.vt3b, "invalidate-stag", "--stag", rkey)
            assert answer.get("stag") == rkey, f"invalidate-stag answered for STag {answer.get('stag')}, not {rkey}"

        injected(vt3_pair.b, A_IP, srv, "stag", style, "QP_ACCESS_ERR", invalidate)
    no_objects(vt3_pair, "after fault invalidate-stag")


@pytest.mark.qemu10
def test_flush_device_fatal(fresh_vt3_pair):
    """vt3d ctl fault device-fatal on the client's vt3d × styles (vt3.ko reloaded between): DEVICE_FATAL, everything flushed"""  # noqa: E501
    p = fresh_vt3_pair

    def device_fatal(qpn, peer, rkey):
        answer = fault(p.vt3b, "device-fatal")
        assert answer.get("detail", "").startswith("device fatal: 1 QPs"), \
            f"device-fatal ended other than the client's one QP: {answer!r}"

    with flush_server(p.a) as srv:
        for n, style in enumerate(STYLES):
            if n:
                # The device stays dead until vt3.ko resets it: reload.
                p.b.check(f"rmmod vt3 && insmod {KMOD}/vt3.ko", 60)
                wait_device(p.b)
                assert p.vt3b.ctl("stats")["rnic.fatal"] == 0, "vt3d still fatal after vt3.ko's reset"
            injected(p.b, A_IP, srv, "device-fatal", style, "DEVICE_FATAL", device_fatal)
            no_objects(p, f"after fault device-fatal ({style})")


def test_flush_vt3d_killed(fresh_vt3_pair):
    """the client's own vt3d killed: vt3.ko loses the device, DEVICE_FATAL, everything flushed (events style)"""
    p = fresh_vt3_pair
    with flush_server(p.a) as srv:
        res = injected(p.b, A_IP, srv, "device-fatal", "events", "DEVICE_FATAL",
                       lambda qpn, peer, rkey: kill_vt3d(p, "vt3b", signal.SIGTERM), extra=("PORT_ERR",))
        # docs/events.md: PORT_ERR as the carrier goes, DEVICE_FATAL 5 s later.
        assert res["events"] == ["PORT_ERR", "DEVICE_FATAL"], f"events {res['events']}: {res['line']}"
    no_objects(p, "after the client's vt3d was killed")
