"""The randomized fault soak (docs/architecture.md §5 and §7.5, issue 12):
vt3-chaos's server in guest a, its client (the side under test) in guest b,
two vt3 guests whose vt3d time a silent connection out after
TCP_TIMEOUT s (a blackhole ends in seconds, not 15).

The client runs a batch of runs, seed S, S+1, …; each run connects 4-16
QPs on shared CQs (in half of the runs some or all of them on one or two
shared receive queues), streams verified SEND/WRITE/READ traffic from 2-4
threads in random styles, and takes one fault at a random moment. Faults
the host does (every `vt3d ctl fault` kind, killing the server, either
vt3d, rmmod) the client announces with

    READY <run> <seed> <fault> <side> <qpn> <peer qpn> <stag> <a1> <a2> <a3>

and keeps its traffic flowing until the harness, having done the fault,
writes the run number into ACK. Each run prints one "RUN <i> seed <s>
fault <f> … ok|FAIL: …" line (every WR accounted for exactly once, order,
no completion after destroy, the fault's events, no hang), then
"vt3-chaos: N passed, N failed". Every batch here counts what it asked
for: a run that silently does not happen fails.

Destructive faults (the device or the peer gone for the rest of the
batch) run one per batch at the end, and the setup is brought back
(vt3.ko reloaded, the server restarted, a vt3d and its guest restarted).

VT3_CHAOS_SEED fixes the first seed (default: from the clock, printed).
Replay one run in the guests by hand:
    vt3-chaos server &                                   (in a)
    vt3-chaos client --server 10.77.0.1 --seed S --runs 1 --faults F --ack /tmp/chaos.ack --tcp-timeout 4
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from helpers import A_IP, no_objects, wait_rdma_listen
from vt3lab import KMOD
from vt3lab.setups import SHORT_TCP_TIMEOUT as TCP_TIMEOUT, ChaosPair, wait_device
from vt3lab.vt3d import Vt3d

PORT = 7472
SRV, CLI = "chaos-srv", "chaos-cli"
ACK = "/tmp/chaos.ack"
DURATION_MS = 1500

NON_DESTRUCTIVE = ("disconnect", "abort", "bad-wqe", "peer-close", "peer-abort", "rst", "fin", "blackhole",
                   "drop", "delay", "split", "corrupt-crc", "terminate", "invalidate-stag")
# mute-commands: our vt3d drops commands while its data path runs on, so
# vt3.ko declares the device lost (CQs frozen) with CQEs still coming.
CHEAP_DESTRUCTIVE = ("device-fatal", "rmmod", "peer-killed", "mute-commands")
MUTE_MS = 40000  # beyond vt3.ko's 15 s (a command and two probes); lifted at recovery
REBOOTING = ("peer-vt3d-killed", "vt3d-killed")
ALL_FAULTS = NON_DESTRUCTIVE + CHEAP_DESTRUCTIVE + REBOOTING
HOST_FAULTS = set(ALL_FAULTS) - {"disconnect", "abort", "bad-wqe", "peer-close", "peer-abort"}

RUN = re.compile(r"^RUN (?P<run>\d+) seed (?P<seed>\d+) fault (?P<fault>\S+) side (?P<side>\d) target q(?P<target>\d+) "
                 r"qps (?P<qps>\d+) cqs (?P<cqs>\d+) threads (?P<threads>\d+) styles (?P<styles>\S+); "
                 r"(?P<secs>[\d.]+) s: (?P<verdict>ok|FAIL): (?P<rest>.*)$", re.M)
COUNTS = re.compile(r"^sq (\d+) posted (\d+) ok (\d+) flushed (\d+) error (\d+) silent; "
                    r"rq (\d+) posted (\d+) ok (\d+) flushed (\d+) error; ")
# vt3-chaos's shared receive queues (a run's QPs may have none).
SRQ_COUNTS = re.compile(r"; srqs (\d+): (\d+) posted (\d+) ok (\d+) flushed (\d+) error (\d+) left (\d+) dropped"
                        r" (\d+) taken(?P<unproven> unproven)?; ")
# Exploration only (e.g. --signaled-flush-only); the case passes nothing.
EXTRA_ARGS = os.environ.get("VT3_CHAOS_ARGS", "")


class Client:
    """The side under test: vt3-chaos (user QPs) or vt3_kchaos.ko (kernel
    QPs, the same server, the same lines)."""

    def __init__(self, name: str, faults: tuple[str, ...]):
        self.name = name
        self.faults = faults
        self.summary = re.compile(rf"^{name}: (\d+) passed, (\d+) failed$", re.M)

    def command(self, seed: int, runs: int, faults: tuple[str, ...]) -> str:
        raise NotImplementedError

    def ack_command(self, run: str) -> str:
        raise NotImplementedError


class UserClient(Client):
    def command(self, seed, runs, faults):
        return (f"rm -f {ACK}; exec vt3-chaos client --server {A_IP} --port {PORT} --seed {seed} --runs {runs} "
                f"--faults {','.join(faults)} --cycle --ack {ACK} --duration {DURATION_MS} --tcp-timeout {TCP_TIMEOUT}"
                f"{' ' + EXTRA_ARGS if EXTRA_ARGS else ''}")

    def ack_command(self, run):
        return f"echo {run} > {ACK}"


class KernelClient(Client):
    """insmod runs the batch in a kthread; /proc/vt3_kchaos streams its
    lines until the last run; the exit status says whether one failed."""

    def command(self, seed, runs, faults):
        return (f"insmod {KMOD}/vt3_kchaos.ko addr={A_IP} port={PORT} seed={seed} runs={runs} "
                f"faults={','.join(faults)} duration_ms={DURATION_MS} || exit 2; cat /proc/vt3_kchaos; "
                f"f=$(cat /sys/module/vt3_kchaos/parameters/failed); rmmod vt3_kchaos || exit 4; [ \"$f\" = 0 ]")

    def ack_command(self, run):
        return f"echo {run} > /sys/module/vt3_kchaos/parameters/ack"


# vt3_kchaos's faults (guest-driver/tests/vt3_kchaos.c): all but bad-wqe (a
# kernel ULP posts no bad lkey); invalidate-stag of the peer's STag only.
# The device's end (rmmod, vt3d-killed) reaches the module as rdma_cm's
# DEVICE_REMOVAL, where it drains and destroys each id's QP as ULPs do.
KERNEL_NON_DESTRUCTIVE = tuple(f for f in NON_DESTRUCTIVE if f not in ("bad-wqe", "split"))
KERNEL_DESTRUCTIVE = ("device-fatal", "peer-killed", "rmmod", "mute-commands")
KERNEL_REBOOTING = REBOOTING
USER = UserClient("vt3-chaos", ALL_FAULTS)
KERNEL = KernelClient("vt3_kchaos", KERNEL_NON_DESTRUCTIVE + KERNEL_DESTRUCTIVE + KERNEL_REBOOTING)


def tail(out: str, n: int = 25) -> str:
    return "\n".join(out.splitlines()[-n:])


# ------------------------------------------------------------------- server

def start_server(g) -> None:
    g.spawn(f"echo $$ > /tmp/{SRV}.spid; exec vt3-chaos server --port {PORT} --timeout 3000", SRV, 4000)
    wait_rdma_listen(g, PORT)


def stop_server(g, killed: bool = False) -> str:
    """Ends the server; it must have run until now (or been KILLED by the
    fault) and found no wrong data."""
    if not killed:
        assert g.running(SRV), f"vt3-chaos server exited early:\n{tail(g.join(SRV, 10).out)}"
        g.run(f"kill -TERM $(cat /tmp/{SRV}.spid) 2>/dev/null; true", 10)
    r = g.join(SRV, 60)
    want = 137 if killed else 143
    assert r.rc == want, f"vt3-chaos server: exit {r.rc}, want {want}:\n{tail(r.out)}"
    bad = [line for line in r.out.splitlines() if line.startswith("SERVER BAD")]
    assert not bad, f"the server received wrong data ({len(bad)} connection(s)):\n" + "\n".join(bad[:5])
    return r.out


# -------------------------------------------------------------- host faults

def ctl_fault(d: Vt3d, name: str, *args, qp: int | None = None) -> dict:
    argv = ["fault", name, *map(str, args)] + (["--qp", str(qp)] if qp is not None else [])
    answer = d.ctl(*argv)
    assert isinstance(answer, dict) and answer.get("fault") == name, f"vt3d {d.name} {' '.join(argv)}: {answer!r}"
    return answer


def kill_vt3d(p: ChaosPair, name: str) -> None:
    d = p.vt3d[name]
    d.kill(signal.SIGKILL)
    deadline = time.monotonic() + 10
    while d.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not d.alive(), f"vt3d {name} still running 10 s after SIGKILL"


def do_fault(p: ChaosPair, ready: list[str]) -> None:
    """The host's part of the fault a READY line names."""
    _, run, seed, name, side, qpn, peer_qpn, stag, a1, a2, a3 = ready
    d, qp = (p.vt3a, int(peer_qpn)) if side == "0" else (p.vt3b, int(qpn))
    if name in ("rst", "fin", "blackhole", "corrupt-crc"):
        ctl_fault(d, name, qp=qp)
    elif name == "drop":
        ctl_fault(d, name, "--percent", a1, "--seed", a2, qp=qp)
    elif name == "delay":
        ctl_fault(d, name, "--ms", a1, qp=qp)
    elif name == "split":
        ctl_fault(d, name, "--tail", a1, "--hold-ms", a2, qp=qp)
    elif name == "terminate":
        ctl_fault(d, name, "--layer", a1, "--etype", a2, "--ecode", a3, qp=qp)
    elif name == "invalidate-stag":
        answer = ctl_fault(d, name, "--stag", stag)
        assert int(answer.get("stag", "0"), 16) == int(stag, 16), f"invalidate-stag answered {answer!r}, asked {stag}"
    elif name == "device-fatal":
        ctl_fault(p.vt3b, name)
    elif name == "mute-commands":
        ctl_fault(p.vt3b, name, "--ms", MUTE_MS)
    elif name == "rmmod":
        p.b.check("rmmod vt3", 120, "rmmod vt3 under traffic")
    elif name == "peer-killed":
        p.a.check(f"kill -KILL $(cat /tmp/{SRV}.spid)", 10)
    elif name == "peer-vt3d-killed":
        kill_vt3d(p, "vt3a")
    elif name == "vt3d-killed":
        kill_vt3d(p, "vt3b")
    else:
        raise AssertionError(f"READY for a fault the harness does not know: {' '.join(ready)}")


# ------------------------------------------------------------------ batches

class Tally:
    def __init__(self):
        self.runs = 0
        self.faults: dict[str, int] = {}
        self.seconds = 0.0
        self.wrs = 0
        self.srq_runs = 0      # runs with QPs on a shared receive queue
        self.srq_target = 0    # of them, runs whose fault hit a QP of an SRQ
        self.srq_wrs = 0
        self.srq_left = 0      # SRQ WRs still posted at a run's end, proved by its drain
        self.srq_taken = 0     # SRQ WQEs a QP had taken when it failed (completed in error on it)

    def __str__(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.faults.items()))
        srq = (f"; {self.srq_runs} SRQ runs ({self.srq_target} with the fault's QP on the SRQ), "
               f"{self.srq_wrs} SRQ WRs, {self.srq_left} left and drained, "
               f"{self.srq_taken} taken by a failing QP") if self.srq_runs else ""
        return f"{self.runs} runs, {len(self.faults)} fault kinds ({kinds}), {self.wrs} WRs{srq}, {self.seconds:.0f} s"


def batch(p: ChaosPair, tally: Tally, seed: int, runs: int, faults: tuple[str, ...],
          client: Client = USER) -> list[str]:
    """RUNS runs of CLIENT from SEED over FAULTS, the host faults done as
    READY lines come; every run reported, every count adds up. Returns the
    runs that failed (their lines)."""
    b = p.b
    what = f"{client.name} seed {seed} × {runs} ({','.join(faults)})"
    unknown = [f for f in faults if f not in client.faults]
    assert not unknown, f"{what}: {client.name} does not do {unknown}"
    b.spawn(client.command(seed, runs, faults), CLI, 120 + runs * 120)
    t0 = time.monotonic()
    handled = 0
    try:
        while True:
            # The next READY line, or nothing once the client is done.
            r = b.run(f"i=0; while [ $i -lt 3000 ]; do [ $(grep -c '^READY' /tmp/{CLI}.out) -gt {handled} ] && break; "
                      f"[ -e /tmp/{CLI}.rc ] && break; sleep 0.1; i=$((i+1)); done; "
                      f"grep '^READY' /tmp/{CLI}.out | sed -n '{handled + 1}p'", 330)
            line = r.out.strip()
            if not line:
                break
            ready = line.split()
            assert len(ready) == 11, f"{what}: odd READY line {line!r}"
            do_fault(p, ready)
            handled += 1
            b.check(client.ack_command(ready[1]), 10)
        res = b.join(CLI, 60)
    except BaseException:
        try:
            b.run(f"kill -KILL $(cat /tmp/{CLI}.pid) 2>/dev/null; true", 10)
        except Exception:
            pass
        raise
    secs = time.monotonic() - t0
    out = res.out
    failed = [m.group(0) for m in RUN.finditer(out) if m.group("verdict") == "FAIL"]
    hung = [line for line in out.splitlines() if line.startswith("RUN ") and " FAIL: hangs in " in line]
    assert not hung, f"{what}: a run hung (the tool's watchdog ended it):\n" + "\n".join(hung) + \
        f"\n--- client output tail ---\n{tail(out, 8)}"
    got = [(int(m.group("run")), int(m.group("seed"))) for m in RUN.finditer(out)]
    assert got == [(i, seed + i) for i in range(runs)], \
        f"{what}: result lines for {got[:5]}…, want runs 0..{runs - 1} (exit {res.rc}):\n{tail(out)}"
    sums = client.summary.findall(out)
    assert sums and tuple(map(int, sums[-1])) == (runs - len(failed), len(failed)), \
        f"{what}: summary {sums[-1] if sums else 'missing'}, {len(failed)} FAIL lines of {runs}:\n{tail(out)}"
    assert res.rc == (1 if failed else 0), f"{what}: client exit {res.rc} with {len(failed)} failed:\n{tail(out)}"
    parsed = []
    for m in RUN.finditer(out):
        c = COUNTS.match(m.group("rest"))
        assert c, f"{what}: unparsable counts: {m.group(0)}"
        sq_posted, sq_ok, sq_flush, sq_err, sq_silent, rq_posted, rq_ok, rq_flush, rq_err = map(int, c.groups())
        # Each WR at most once, in one of the counts (the tool checks each one).
        assert sq_ok + sq_flush + sq_err + sq_silent <= sq_posted and rq_ok + rq_flush + rq_err <= rq_posted, \
            f"{what}: counts exceed what was posted: {m.group(0)}"
        srq = SRQ_COUNTS.search(m.group("rest")) if client is USER else None
        assert srq or client is not USER, f"{what}: no SRQ counts: {m.group(0)}"
        nsrq, srq_posted, srq_ok, srq_flush, srq_err, srq_left, srq_dropped, srq_taken = \
            map(int, srq.groups()[:8]) if srq else (0,) * 8
        if nsrq:
            # posted = completed + left (the drain proves "left"; "dropped": taken by an aborted QP).
            accounted = srq_ok + srq_flush + srq_err + srq_left + srq_dropped
            assert accounted == srq_posted or (srq.group("unproven") and accounted <= srq_posted), \
                f"{what}: SRQ counts do not add up ({accounted} of {srq_posted}): {m.group(0)}"
            tally.srq_runs += 1
            target = int(m.group("target"))
            tally.srq_target += "+srq" in m.group("styles").split(",")[target]
            tally.srq_wrs += srq_posted
            tally.srq_left += srq_left
            # Each QP's taken WQE completes in error once (the tool checks which).
            assert srq_taken <= srq_flush + srq_err, f"{what}: more taken than failed: {m.group(0)}"
            tally.srq_taken += srq_taken
        assert sq_ok > 0 and (rq_ok > 0 or rq_posted == 0) and (srq_ok > 0 or not nsrq), \
            f"{what}: no traffic completed before the fault: {m.group(0)}"
        tally.faults[m.group("fault")] = tally.faults.get(m.group("fault"), 0) + 1
        tally.wrs += sq_posted + rq_posted + srq_posted
        parsed.append({"fault": m.group("fault"), "line": m.group(0)})
    host = sum(1 for r in parsed if r["fault"] in HOST_FAULTS)
    assert handled == host, f"{what}: {handled} READY lines handled, {host} runs with a host fault"
    tally.runs += runs
    tally.seconds += secs
    return failed


def kernel_clean(p: ChaosPair, when: str) -> None:
    for g in p.guests.values():
        trouble = g.kernel_trouble_since(p.scenario_mark.get(g.name, (0, 0)))
        assert not trouble, f"guest {g.name}: kernel trouble {when}: {trouble[:3]}"


def recover(p: ChaosPair, fault: str) -> None:
    """The setup as before a destructive fault."""
    kernel_clean(p, f"after {fault}")
    if fault == "device-fatal":
        p.b.check(f"rmmod vt3 && insmod {KMOD}/vt3.ko", 120)
        wait_device(p.b)
        assert p.vt3b.stats()["rnic.fatal"] == 0, "vt3d still fatal after vt3.ko's reset"
    elif fault == "rmmod":
        p.b.check(f"insmod {KMOD}/vt3.ko", 120)
        wait_device(p.b)
    elif fault == "mute-commands":
        ctl_fault(p.vt3b, fault, "--ms", 0)
        p.b.check(f"rmmod vt3 && insmod {KMOD}/vt3.ko", 120)
        wait_device(p.b)
    elif fault == "peer-killed":
        stop_server(p.a, killed=True)
        start_server(p.a)
    elif fault == "peer-vt3d-killed":
        p.restart("a")
        start_server(p.a)
    elif fault == "vt3d-killed":
        p.restart("b")


def chaos(p: ChaosPair, seed: int, rounds: list[tuple], client: Client = USER) -> Tally:
    """ROUNDS of (runs, faults[, fixed seed]) of CLIENT: a batch each,
    destructive ones recovered from; objects back to zero and the kernels
    clean after each. Batches without a fixed seed take theirs from SEED on."""
    tally = Tally()
    failures: list[str] = []
    start_server(p.a)
    try:
        for runs, faults, *fixed in rounds:
            first = fixed[0] if fixed else seed
            failures += batch(p, tally, first, runs, faults, client)
            if not fixed:
                seed += runs
            if any(f not in NON_DESTRUCTIVE for f in faults):
                assert len(faults) == 1 and runs == 1, f"a destructive fault ends a batch: {faults}"
                recover(p, faults[0])
            no_objects(p, f"after the batch ending with seed {first + runs - 1}")
            kernel_clean(p, f"after the batch ending with seed {first + runs - 1}")
    except BaseException:
        print(f"vt3-chaos figures until the failure: {tally}")
        p.a.run(f"kill -KILL $(cat /tmp/{SRV}.spid) 2>/dev/null; true", 10) if p.a.alive() else None
        raise
    stop_server(p.a)
    print(f"vt3-chaos figures: {tally}, {len(failures)} failed")
    # Beside the run directories (removed when everything passed), so a
    # soak's figures outlive it: RESULTS/system/<test>-figures.txt.
    name = os.environ.get("PYTEST_CURRENT_TEST", "chaos").split("::")[-1].split(" ")[0].split("@")[0]
    (p.dir.parent / f"{name}-figures.txt").write_text(
        f"{client.name}: {tally}, {len(failures)} failed\n" + "\n".join(failures) + "\n")
    # Every run was made (a failure does not hide the rest); each is owed.
    assert not failures, f"{len(failures)} of {tally.runs} runs failed (replay: --seed S --runs 1 --faults F):\n" + \
        "\n".join(failures[:8])
    return tally


def first_seed() -> int:
    seed = int(os.environ.get("VT3_CHAOS_SEED", "0")) or int(time.time()) % 1000000 * 1000
    print(f"vt3-chaos: first seed {seed} (VT3_CHAOS_SEED={seed} replays this case)")
    return seed


def plan_from_env(default: list[tuple[int, tuple[str, ...]]]) -> list[tuple[int, tuple[str, ...]]]:
    """VT3_CHAOS_PLAN="N:F,F;1:rmmod" instead of the case's batches (to
    replay or narrow a run: a destructive fault alone in its batch)."""
    text = os.environ.get("VT3_CHAOS_PLAN", "")
    if not text:
        return default
    rounds = []
    for part in text.split(";"):
        n, _, faults = part.partition(":")
        rounds.append((int(n), tuple(faults.split(",")) if faults else NON_DESTRUCTIVE))
    unknown = [f for _, fs in rounds for f in fs if f not in ALL_FAULTS]
    if unknown:
        raise ValueError(f"VT3_CHAOS_PLAN: unknown fault(s) {unknown}; known: {','.join(ALL_FAULTS)}")
    return rounds


# Runs this soak found failing, replayed exactly (--seed S --runs 1 --faults F).
REGRESSIONS = [
    (1, ("disconnect",), 3000),     # unsignaled sends were never flushed (libvt3)
    (1, ("abort",), 3027),          # a destroyed QP's completions came after ibv_destroy_qp
    (1, ("rmmod",), 131153047),     # rmmod destroyed QPs nobody had put in error: nothing flushed
]


# The CI form: every kind that does not reboot a guest, each twice (the
# rest of each run's plan random), besides the regressions.
CI_RUNS_PER_KIND = 2


def test_chaos(chaos_pair):
    """33 fault runs (the regressions' seeds, then each kind but the two that reboot a guest twice, the rest of
    each plan random; the soak runs them all by the thousand), ≥ 6 with QPs on shared receive queues, exactly-once
    accounting of every WR (SRQ WRs too: what an SRQ holds at the end drained and counted), objects back to zero"""
    p = chaos_pair
    # rmmod is a regression seed already; mute-commands (40 s) is the soak's.
    cheap = [(1, (f,)) for f in CHEAP_DESTRUCTIVE if f not in ("rmmod", "mute-commands")]
    per_kind = [(CI_RUNS_PER_KIND, (f,)) for f in NON_DESTRUCTIVE]
    rounds = plan_from_env(REGRESSIONS + per_kind + cheap)
    tally = chaos(p, first_seed(), rounds)
    if os.environ.get("VT3_CHAOS_PLAN"):
        return  # a narrowed run: the counts below are the full case's
    want = len(REGRESSIONS) + CI_RUNS_PER_KIND * len(NON_DESTRUCTIVE) + len(cheap)
    assert tally.runs == want, f"{tally.runs} runs, want {want}: {tally}"
    missing = [f for f in NON_DESTRUCTIVE + CHEAP_DESTRUCTIVE if f not in tally.faults and f != "mute-commands"]
    assert not missing, f"fault kinds never hit: {missing} ({tally})"
    # Half of the plans put QPs on SRQs: 16 of 33 expected, fewer than 6
    # about once in 10^4.
    assert tally.srq_runs >= 6 and tally.srq_target >= 1, f"too few SRQ runs: {tally}"


@pytest.mark.soak
def test_chaos_soak(chaos_pair):
    """≥ 1000 randomized fault runs, every fault kind many times, ≥ 400 with SRQs; 0 lost, 0 duplicated, 0 hangs"""
    p = chaos_pair
    rounds = list(REGRESSIONS)
    for n in range(16):
        rounds.append((60, NON_DESTRUCTIVE))
        rounds += [(1, (f,)) for f in CHEAP_DESTRUCTIVE]
        if n % 4 == 3:
            rounds += [(1, (f,)) for f in REBOOTING]
    tally = chaos(p, first_seed(), rounds)
    assert tally.runs >= 1000, f"only {tally}"
    few = [f for f in ALL_FAULTS if tally.faults.get(f, 0) < 4]
    assert not few, f"fault kinds hit fewer than 4 times: {few} ({tally})"
    assert tally.srq_runs >= 400 and tally.srq_target >= 200, f"too few SRQ runs: {tally}"


def kchaos_probes(p: ChaosPair) -> None:
    """vt3_kchaos's probes: the lost wake-up (a CQ event answering an older
    arm must not swallow the driver's next kick: one connection to the
    server, softirqs held back so that the event comes after the re-arm),
    and the busy CQ drain (ib_drain_qp of one QP returns while another
    keeps their shared CQ's ring fuller than a poll batch)."""
    start_server(p.a)
    try:
        r = p.b.run(f"insmod {KMOD}/vt3_kchaos.ko addr={A_IP} port={PORT} probe=1 runs=0 || exit 2; "
                    f"cat /proc/vt3_kchaos; rmmod vt3_kchaos", 120)
    finally:
        stop_server(p.a)
    assert r.rc == 0, f"vt3_kchaos probe: exit {r.rc}:\n{r.out}"
    assert re.search(r"^PROBE late-cq-event ok: ", r.out, re.M), f"the late CQ event probe failed:\n{r.out}"
    assert re.search(r"^PROBE busy-drain ok: ", r.out, re.M), f"the busy CQ drain probe failed:\n{r.out}"
    assert KERNEL.summary.findall(r.out) == [("2", "0")], f"vt3_kchaos probes: summary:\n{r.out}"


def test_kchaos(chaos_pair):
    """kernel QPs as ULPs use them (vt3_kchaos.ko: rdma_cm, softirq/workqueue CQs shared by QPs, wr_cqe, ib_drain_qp):
    a late CQ event loses no wake-up, a drain returns on a busy shared CQ; fault runs of every kind it does,
    exactly-once accounting, wc->qp right, nothing after destroy, drains return"""
    p = chaos_pair
    kchaos_probes(p)
    # device-fatal and peer-killed (a recovery each) are the soak's.
    # mute-commands: vt3d retires WRs whose CQEs come after vt3.ko froze
    # the CQ; every one of 4 runs lost some before the flush started after
    # the last CQE taken (vt3_cqe.wqe_idx) instead of vt3d's consumer index.
    destructive = ("rmmod", "mute-commands")
    rounds = plan_from_env([(len(KERNEL_NON_DESTRUCTIVE), KERNEL_NON_DESTRUCTIVE)] + [(1, (f,)) for f in destructive])
    tally = chaos(p, first_seed(), rounds, KERNEL)
    if os.environ.get("VT3_CHAOS_PLAN"):
        return
    assert tally.runs == len(KERNEL_NON_DESTRUCTIVE) + len(destructive), f"only {tally}"
    missing = [f for f in KERNEL_NON_DESTRUCTIVE + destructive if f not in tally.faults]
    assert not missing, f"fault kinds never hit: {missing} ({tally})"


@pytest.mark.soak
def test_kchaos_soak(chaos_pair):
    """≥ 300 kernel-QP fault runs (vt3_kchaos.ko); 0 lost, 0 duplicated, 0 hangs"""
    p = chaos_pair
    rounds = []
    for n in range(10):
        rounds += [(30, KERNEL_NON_DESTRUCTIVE)] + [(1, (f,)) for f in KERNEL_DESTRUCTIVE]
        if n % 2:
            rounds += [(1, (f,)) for f in KERNEL_REBOOTING]
    tally = chaos(p, first_seed(), rounds, KERNEL)
    assert tally.runs >= 300, f"only {tally}"
    few = [f for f in KERNEL_NON_DESTRUCTIVE + KERNEL_DESTRUCTIVE + KERNEL_REBOOTING if tally.faults.get(f, 0) < 4]
    assert not few, f"fault kinds hit fewer than 4 times: {few} ({tally})"
