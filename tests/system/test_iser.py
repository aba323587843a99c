"""iSCSI over RDMA (iSER) on vt3: LIO's ib_isert exports a RAM disk from
one vt3 guest, open-iscsi's ib_iser logs in from the other, fio writes and
verifies (crc32c) over several block sizes and queue depths, then both
sides tear down and leak nothing; the same with a siw initiator. The iSER portal shares its address and
port with LIO's iSCSI/TCP portal: vt3d takes the wire's connections to it
(vt3_cm.c, a privileged listener beside a guest TCP listener)."""

from __future__ import annotations

from helpers import count, no_objects
from test_cm import kmark, kmsg_since
from test_nvme import check_fio, fio_command, fio_figures, no_kernel_trouble
from vt3lab.scenarios.iser import RAM_MB, initiator_login, initiator_logout, target_down, target_up
from vt3lab.setups import wait_device
from vt3lab.tools import tail

FIO_JOBS = [
    ("bs4k-qd16", "randwrite", 4 << 10, 16, 2 << 20, "libaio"),
    ("bs64k-qd4", "write", 64 << 10, 4, 4 << 20, "libaio"),
    ("bs1m-qd2", "write", 1 << 20, 2, 8 << 20, "libaio"),
]
FIO_TIMEOUT = 300


def iser_over_rdma(setup, target, host, target_vt3: list[str], host_vt3: list[str]) -> None:
    """TARGET exports over iSER, HOST logs in to TARGET's address; the vt3d
    named in TARGET_VT3 / HOST_VT3 serve them (none for a siw side)."""
    assert sum(j[4] for j in FIO_JOBS) <= RAM_MB << 20
    for name, d in setup.vt3d.items():
        assert not d.held(), f"vt3d {name} holds {d.held()} before the test"
    marks = {g.name: kmark(g) for g in (target, host)}
    target_up(target, target.ip)
    if target.nic.kind == "vt3":
        tlog = kmsg_since(target, marks[target.name])
        assert count(tlog, r"listening on port 3260 beside a listener of the guest's TCP") == 1, \
            f"{target.name}: the iSER portal did not share the iSCSI port:\n{tail(tlog)}"
    dev = initiator_login(host, target.ip)
    # One RDMA connection for the session's one iSCSI connection.
    for name, d in setup.vt3d.items():
        n, want = d.objects()["qp"], (name in target_vt3) + (name in host_vt3)
        assert n == want, f"vt3d {name}: {n} QPs while logged in, want {want}"
    r = host.run(fio_command(dev, FIO_JOBS), FIO_TIMEOUT)
    report = check_fio(host, r.rc, r.out, FIO_JOBS)
    print(f"fio over iSER {host.name}→{target.name}: {fio_figures(report)}", flush=True)
    hlog = kmsg_since(host, marks[host.name])
    assert "iser" in hlog, f"{host.name}: no iser in the kernel log:\n{tail(hlog)}"
    initiator_logout(host, target.ip)
    target_down(target, target.ip)
    # What is left is the core's CQ pool (ib_cq_pool_get): one idle CQ per
    # role (isert's and iser's completion vector; vt3 has one), kept until
    # the device goes away.
    for name, d in setup.vt3d.items():
        roles = (name in target_vt3) + (name in host_vt3)
        want = {"pd": 0, "mr": 0, "cq": roles, "qp": 0, "srq": 0}
        held = d.wait_held(want)
        assert held == want, f"vt3d {name} holds {held} after logout and teardown, want {want}"
    for g in (target, host):
        if g.nic.kind == "vt3":
            g.check("rdma link del vt3_0 && rdma link add vt3_0 type vt3 netdev eth0", 60, "re-adding vt3_0")
            wait_device(g)
    no_objects(setup, "after the iSER logout and the target's teardown")
    for g in (target, host):
        no_kernel_trouble(g, marks[g.name])
        left = g.check("lsmod | grep -E '^(ib_isert|ib_iser|iscsi_target_mod|target_core|brd)' || true", 10).strip()
        assert not left, f"{g.name}: modules left: {left}"


def test_iser_vt3_vt3(vt3_pair):
    """LIO iSER target on vt3 (a), open-iscsi iSER initiator on vt3 (b): login, fio verify, logout, no leak"""
    iser_over_rdma(vt3_pair, vt3_pair.a, vt3_pair.b, ["vt3a"], ["vt3b"])


def test_iser_vt3_siw(vt3_siw):
    """LIO iSER target on vt3 (a), open-iscsi iSER initiator on siw (b): the same. (A siw target cannot
    be had: siw listens on a kernel TCP socket, and LIO's iSCSI/TCP portal holds the same port.)"""
    iser_over_rdma(vt3_siw, vt3_siw.a, vt3_siw.b, ["vt3a"], [])
