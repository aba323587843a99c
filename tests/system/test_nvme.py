"""Kernel NVMe over RDMA on vt3 (issue 13): nvmet-rdma exports a RAM disk
(brd) from one guest, nvme-rdma connects to it from the other (or from the
same guest, over its own address), and fio writes and verifies (crc32c)
over several block sizes and queue depths on more than one I/O queue.
Then both sides tear down and leak nothing: vt3d holds no object, no kernel
warning in either guest. The peer may be siw, either way round."""

from __future__ import annotations

import json
import re
import time

import pytest

from helpers import count, no_objects
from test_cm import kmark, kmsg_since
from test_chaos import ctl_fault, kill_vt3d
from vt3lab.guest import KERNEL_TROUBLE
from vt3lab.scenarios.nvme import (IO_QUEUES, NQN, POLL_QUEUES, QUEUES, RAM_MB, WRITE_QUEUES, host_connect,
                                   host_disconnect, target_down, target_up, unload_shared)
from vt3lab.setups import wait_device
from vt3lab.tools import tail

# fio jobs, run side by side on disjoint ranges of the namespace:
# (name, rw, block size, queue depth, bytes, engine). 4 KiB writes go
# inline with the command (SEND with several SGEs), larger ones through
# fast-registered MRs that the target READs (READ_WITH_INV); reads come
# back as WRITEs plus SEND_WITH_INV. The polled jobs (hipri) use the poll
# queue.
POLLED = "hipri=1"
FIO_JOBS = [
    ("bs4k-qd1", "randwrite", 4 << 10, 1, 1 << 20, "libaio"),
    ("bs4k-qd16", "randwrite", 4 << 10, 16, 2 << 20, "libaio"),
    ("bs16k-qd8", "write", 16 << 10, 8, 2 << 20, "libaio"),
    ("bs128k-qd4", "write", 128 << 10, 4, 4 << 20, "libaio"),
    ("bs1m-qd2", "write", 1 << 20, 2, 8 << 20, "libaio"),
    ("bs8k-polled", "randwrite", 8 << 10, 1, 1 << 20, f"pvsync2 {POLLED}"),
    ("bs64k-qd8-polled", "write", 64 << 10, 8, 2 << 20, f"io_uring {POLLED}"),
]
# fio moves 21 MiB: seconds on an idle machine, a minute on a loaded one.
# Past this the I/O is stuck, and the time is better spent on the dump.
FIO_TIMEOUT = 300


def fio_command(dev: str, jobs=FIO_JOBS, out: str = "/tmp/fio.json") -> str:
    args = [f"fio --output-format=json --output={out} --filename={dev} --direct=1",
            "--verify=crc32c --do_verify=1 --verify_fatal=1 --verify_backlog=0 --randrepeat=1"]
    offset = 0
    for name, rw, bs, qd, size, engine in jobs:
        args.append(f"--name={name} --ioengine={engine.replace(' ', ' --')} --rw={rw} --bs={bs} --iodepth={qd} "
                    f"--offset={offset} --size={size}")
        offset += size
    assert offset <= RAM_MB << 20
    return " ".join(args)


def check_fio(g, rc: int, out: str, jobs=FIO_JOBS) -> dict:
    """fio exited 0, every job reported, none had an error, and each wrote
    its range and read all of it back to verify it."""
    assert rc == 0, f"fio on {g.name}: exit {rc}:\n{tail(out, 30)}"
    js = g.check("cat /tmp/fio.json", 30)
    try:
        report = json.loads(js[js.index("{"):])
    except (ValueError, json.JSONDecodeError) as e:
        raise AssertionError(f"fio on {g.name}: no JSON report ({e}):\n{tail(js, 20)}") from None
    seen = {j["jobname"]: j for j in report["jobs"]}
    assert sorted(seen) == sorted(j[0] for j in jobs), f"fio reported jobs {sorted(seen)}"
    for name, rw, bs, qd, size, _ in jobs:
        j = seen[name]
        assert j["error"] == 0, f"fio job {name}: err={j['error']}"
        assert j["write"]["io_bytes"] == size, f"fio job {name}: wrote {j['write']['io_bytes']} bytes, want {size}"
        # The verify pass reads back everything written.
        assert j["read"]["io_bytes"] == size, f"fio job {name}: verify read {j['read']['io_bytes']} bytes, want {size}"
    return report


def fio_figures(report: dict) -> str:
    return ", ".join(f"{j['jobname']} w {j['write']['bw'] / 1024:.1f} MiB/s {j['write']['iops']:.0f} IOPS "
                     f"r {j['read']['bw'] / 1024:.1f} MiB/s" for j in report["jobs"])


def vt3d_qps(setup) -> dict[str, int]:
    return {n: d.objects()["qp"] for n, d in setup.vt3d.items()}


def no_kernel_trouble(g, mark: str) -> None:
    log = kmsg_since(g, mark)
    bad = [line for line in log.splitlines() if KERNEL_TROUBLE.search(line) or re.search(r"call trace", line, re.I)]
    assert not bad, f"{g.name}: kernel trouble:\n" + "\n".join(bad[:10]) + f"\n{tail(log, 30)}"


def nvme_over_rdma(setup, target, host, target_vt3: list[str], host_vt3: list[str], fault=None,
                   jobs=FIO_JOBS, srq: bool = False) -> None:
    """TARGET exports, HOST connects to TARGET's address; the vt3d named
    in TARGET_VT3 / HOST_VT3 serve them (none for a siw side)."""
    for name, d in setup.vt3d.items():
        assert not d.held(), f"vt3d {name} holds {d.held()} before the test"
    guests = {g.name: g for g in (target, host)}.values()
    marks = {g.name: kmark(g) for g in guests}
    target_up(target, target.ip, srq)
    ctrl, dev = host_connect(host, target.ip, "--reconnect-delay 1 --ctrl-loss-tmo 120" if fault else "")
    # One QP per queue on each side: admin and the I/O queues.
    qps = vt3d_qps(setup)
    for name in setup.vt3d:
        want = (1 + QUEUES) * ((name in target_vt3) + (name in host_vt3))
        assert qps[name] == want, f"vt3d {name}: {qps[name]} QPs while connected, want {want}"
    if srq:
        # nvmet-rdma: one SRQ per completion vector (vt3 has one) for all its queues.
        for name in target_vt3:
            n = setup.vt3d[name].objects()["srq"]
            assert n == 1, f"vt3d {name}: {n} SRQs under nvmet-rdma use_srq=1, want 1"
    hlog = kmsg_since(host, marks[host.name])
    assert count(hlog, rf"^nvme {ctrl}: creating {QUEUES} I/O queues\.$") == 1, \
        f"{host.name}: no 'creating {QUEUES} I/O queues':\n{tail(hlog)}"
    mapped = f"{WRITE_QUEUES}/{IO_QUEUES}/{POLL_QUEUES} default/read/poll"
    assert count(hlog, rf"^nvme {ctrl}: mapped {mapped} queues\.$") == 1, f"{host.name}: not {mapped}:\n{tail(hlog)}"
    if fault is None:
        r = host.run(fio_command(dev, jobs), FIO_TIMEOUT)
    else:
        r = fault(setup, host, ctrl, dev, jobs, marks[host.name])
    report = check_fio(host, r.rc, r.out, jobs)
    if host_vt3 and any(POLLED in j[5] for j in jobs):
        # The poll queue's CQ (its QP's send and receive queue, never
        # armed) carried the polled jobs' completions.
        direct = [c for c in setup.vt3d[host_vt3[0]].ctl("cqs") if c["armed"] is None and c["qps"] == 2]
        assert len(direct) == 1 and direct[0]["prod"] > 0, f"no poll queue CQ with completions: {direct}"
    print(f"fio {host.name}→{target.name}: {fio_figures(report)}", flush=True)
    host_disconnect(host)
    target_down(target)
    # What is left is the core's CQ pool (ib_cq_pool_get): one idle CQ per
    # poll context used (nvme-rdma: softirq, nvmet-rdma: workqueue) and
    # comp vector (vt3 has one), kept until the device goes away.
    for name, d in setup.vt3d.items():
        roles = (name in target_vt3) + (name in host_vt3)
        held = d.wait_held({"pd": 0, "mr": 0, "cq": roles, "qp": 0, "srq": 0})
        assert held == {"pd": 0, "mr": 0, "cq": roles, "qp": 0, "srq": 0}, \
            f"vt3d {name} holds {held} after the teardown, want {roles} pool CQ(s) and nothing else"
        busy = [c for c in d.ctl("cqs") if c["qps"]]
        assert not busy, f"vt3d {name}: CQs still fed by QPs: {busy}"
    # Unregistering the device frees the pool; vt3_0 comes back as it was.
    for g in guests:
        if g.nic.kind != "vt3":
            continue
        g.check("rdma link del vt3_0 && rdma link add vt3_0 type vt3 netdev eth0", 60, "re-adding vt3_0")
        wait_device(g)
    no_objects(setup, "after nvme disconnect, the target's teardown and the device's release")
    for g in guests:
        no_kernel_trouble(g, marks[g.name])
        assert not g.check("lsmod | grep -E '^(nvme|brd)' || true", 10).strip(), f"{g.name}: modules left"


@pytest.mark.kernel612
def test_nvme_vt3_vt3(vt3_pair):
    """nvmet-rdma on vt3 (a), nvme-rdma on vt3 (b): discover, connect, fio verify, disconnect, no leak"""
    nvme_over_rdma(vt3_pair, vt3_pair.a, vt3_pair.b, ["vt3a"], ["vt3b"])


def test_nvme_srq(vt3_pair):
    """nvmet-rdma use_srq=1 on vt3 (a: every queue receives from one kernel SRQ), nvme-rdma on vt3 (b): the same"""
    nvme_over_rdma(vt3_pair, vt3_pair.a, vt3_pair.b, ["vt3a"], ["vt3b"], srq=True)


def test_nvme_vt3_siw(vt3_siw):
    """nvmet-rdma on vt3 (a), nvme-rdma on siw (b): the same"""
    nvme_over_rdma(vt3_siw, vt3_siw.a, vt3_siw.b, ["vt3a"], [])


def test_nvme_siw_vt3(vt3_siw):
    """nvmet-rdma on siw (b), nvme-rdma on vt3 (a): the same"""
    nvme_over_rdma(vt3_siw, vt3_siw.b, vt3_siw.a, [], ["vt3a"])


def test_nvme_loopback(single_vt3):
    """nvmet-rdma and nvme-rdma in one vt3 guest over its own address (inside the TOE)"""
    nvme_over_rdma(single_vt3, single_vt3.a, single_vt3.a, ["vt3a"], ["vt3a"])


# ------------------------------------------------------------------- fault

# Long enough that a fault lands in the middle of the writes.
FAULT_JOBS = [
    ("bs4k-qd16", "randwrite", 4 << 10, 16, 4 << 20, "libaio"),
    ("bs128k-qd4", "write", 128 << 10, 4, 24 << 20, "libaio"),
]
# Error recovery retries every second; after this long without the
# target the controller is given up (the controller-loss path).
RECONNECT_DELAY, CTRL_LOSS_TMO = 1, 4


def busiest_io_queue(d, host) -> int:
    """fio is writing: the QP number (in D, the host's vt3d) of the I/O
    queue that moves. The admin queue is the first QP, the I/O queues follow."""
    qps = sorted((q for q in d.ctl("qps") if q["state"] == "RTS"), key=lambda q: q["qpn"])
    assert len(qps) == 1 + QUEUES, f"vt3d {d.name}: QPs {qps}"
    io = {q["qpn"]: q["sq_consumed"] for q in qps[1:]}
    moved: dict[int, int] = {}
    for _ in range(60):
        now = {q["qpn"]: q["sq_consumed"] for q in d.ctl("qps") if q["qpn"] in io}
        moved = {n: now.get(n, 0) - io[n] for n in io}
        if max(moved.values()) >= 64:
            break
        assert host.running("fio"), f"fio ended before the fault:\n{tail(host.join('fio', 10).out)}"
        time.sleep(0.5)
    victim = max(moved, key=lambda n: moved[n])
    assert moved[victim] >= 64, f"no I/O queue moved: {moved}"
    return victim


def recovered_under_fio(d, host, ctrl: str, dev: str, jobs, fault: str):
    """fio in the background; FAULT (an RST, or a blackhole that the
    pair's short TCP timeout turns into QP_FATAL) on the host's busiest I/O
    queue (in D, the host's vt3d) while it writes; nvme-rdma's error recovery reconnects once, and
    fio's requests are retried on the new queues: fio completes and its
    verify passes. fio's result."""
    mark = kmark(host)
    host.spawn(fio_command(dev, jobs), "fio", 600)
    ctl_fault(d, fault, qp=busiest_io_queue(d, host))
    assert host.running("fio"), f"fio ended at the fault ({fault})"
    r = host.join("fio", 600)
    log = kmsg_since(host, mark)
    assert count(log, rf"^nvme {ctrl}: starting error recovery$") == 1, f"{fault}: no error recovery:\n{tail(log, 30)}"
    assert count(log, rf"^nvme {ctrl}: Successfully reconnected \(1 attempts\)$") == 1, \
        f"{fault}: not one reconnect:\n{tail(log, 30)}"
    state = host.check(f"cat /sys/class/nvme/{ctrl}/state", 10).strip()
    assert state == "live", f"{ctrl} is {state} after the recovery from {fault}"
    return r


def blackhole(setup, host, ctrl: str, dev: str, jobs, mark: str):
    # An RST's recovery is hosts-nvme's (test_hosts.py) and chaos-nvme's.
    return recovered_under_fio(setup.vt3b, host, ctrl, dev, jobs, "blackhole")


def controller_lost(host, ctrl: str, mark: str) -> int:
    """fio (spawned as "fio") failed with EIO; since MARK, HOST's kernel log
    shows one error recovery, failed reconnects and CTRL's removal, and no
    reconnect; no controller is left. How many reconnects failed."""
    r = host.join("fio", 300)
    assert r.rc != 0, f"fio passed although its target went away:\n{tail(r.out, 20)}"
    assert "Input/output error" in r.out, f"fio: not EIO after the controller loss:\n{tail(r.out, 20)}"
    log = kmsg_since(host, mark)
    assert count(log, rf"^nvme {ctrl}: starting error recovery$") == 1, f"no error recovery:\n{tail(log, 30)}"
    failed = count(log, rf"^nvme {ctrl}: Failed reconnect attempt \d+$")
    assert failed >= 1, f"no failed reconnect attempt:\n{tail(log, 30)}"
    assert count(log, rf'^nvme {ctrl}: Removing ctrl: NQN "{re.escape(NQN)}"$') == 1, \
        f"the controller was not removed:\n{tail(log, 30)}"
    assert count(log, r"Successfully reconnected") == 0, f"reconnected to an unreachable target:\n{tail(log, 30)}"
    assert host.check("ls /sys/class/nvme | wc -l", 10).strip() == "0", "a controller is left after the loss"
    return failed


def target_vt3d_killed(p, target, host) -> None:
    """The target's vt3d killed under fio: the host's connections time out
    (the pair's short TCP timeout), error recovery finds no target until
    ctrl-loss-tmo, and nvme-rdma removes the controller. fio's I/O fails
    with EIO (nothing hangs); no kernel warning in either guest; the host's
    vt3d ends up holding nothing but the core's pool CQ."""
    marks = {g.name: kmark(g) for g in (target, host)}
    target_up(target, target.ip)
    ctrl, dev = host_connect(host, target.ip, f"--reconnect-delay {RECONNECT_DELAY} --ctrl-loss-tmo {CTRL_LOSS_TMO}")
    host.spawn(fio_command(dev, FAULT_JOBS), "fio", 600)
    busiest_io_queue(p.vt3b, host)
    kill_vt3d(p, "vt3a")
    failed = controller_lost(host, ctrl, marks[host.name])
    host.check("rmmod nvme_rdma nvme_fabrics", 60, "unloading nvme-rdma")
    unload_shared(host, "unloading the modules nvme-rdma used")
    held = p.vt3b.wait_held({"pd": 0, "mr": 0, "cq": 1, "qp": 0, "srq": 0})
    assert held == {"pd": 0, "mr": 0, "cq": 1, "qp": 0, "srq": 0}, \
        f"vt3d vt3b holds {held} after the controller loss, want the pool CQ and nothing else"
    host.check("rdma link del vt3_0 && rdma link add vt3_0 type vt3 netdev eth0", 60, "re-adding vt3_0")
    wait_device(host)
    for g in (target, host):
        no_kernel_trouble(g, marks[g.name])
    print(f"target's vt3d killed: {failed} failed reconnect attempt(s), then the controller was removed", flush=True)
    # The target guest lost its NIC's backend for good: a new vt3d and boot.
    p.restart(target.name)


def test_nvme_fault(chaos_pair):
    """nvme-rdma vt3↔vt3 under fio: a blackhole on a live I/O queue (its timeout breaks the queue, error recovery reconnects, fio's verify passes); then the target's vt3d killed (controller loss, EIO, no warning, no leak)"""  # noqa: E501
    p = chaos_pair
    nvme_over_rdma(p, p.a, p.b, ["vt3a"], ["vt3b"], fault=blackhole, jobs=FAULT_JOBS)
    target_vt3d_killed(p, p.a, p.b)
    no_objects(p, "after the controller loss and the target's restart")
