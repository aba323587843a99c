"""The RDMA control plane of one vt3 guest: the ib device, resources,
raw uverbs and kernel verbs, listens, unloading, a vt3d that goes away.
Guest a of `vt3_plain` has vt3_0; b is a plain guest (no vt3d behind it)."""

import re

import pytest

from helpers import A_IP, count, no_objects, summary, wait_rdma_listen
from test_chaos import ctl_fault
from test_cm import kmark, kmsg_since
from vt3lab import KMOD
from vt3lab.setups import wait_device
from vt3lab.tools import tail

# Exact numbers of checks the guest tools run: a check that silently stops
# running makes the count differ and the test fail.
VT3_UVERBS_CHECKS = 36
VT3_KTEST_CHECKS = 30


@pytest.mark.qemu10
@pytest.mark.kernel612
def test_devinfo(vt3_plain):
    """ibv_devices/ibv_devinfo -v show vt3_0: iWARP, PORT_ACTIVE, the device limits"""
    a = vt3_plain.a
    assert re.search(r"^\s+vt3_0\s", a.check("ibv_devices"), re.M), "ibv_devices does not list vt3_0"
    info = a.check("ibv_devinfo -v -d vt3_0")
    want = {"transport": "iWARP (1)", "state": "PORT_ACTIVE (4)", "max_qp": "16384", "max_qp_wr": "4095",
            "max_sge": "4", "max_cq": "2048", "max_cqe": "65535", "max_mr": "16384", "max_pd": "1024",
            "max_qp_rd_atom": "8", "max_qp_init_rd_atom": "8", "vendor_id": "0x1425"}
    for key, value in want.items():
        m = re.search(rf"^\s*{key}:\s*(.+?)\s*$", info, re.M)
        assert m and m.group(1) == value, f"ibv_devinfo -v: {key} is {m.group(1) if m else 'missing'}, want {value}"
    assert "link vt3_0/1 state ACTIVE" in a.check("rdma link show"), "rdma link: vt3_0 not ACTIVE"


def resources(vt3_plain, rounds):
    a = vt3_plain.a
    out = a.check(f"vt3-resources -d vt3_0 -n {rounds}", 60 + rounds)
    m = re.search(r"vt3-resources: (\d+) iterations, 0 errors, (\d+) objects created", out)
    assert m and int(m.group(1)) == rounds, f"vt3-resources did not report {rounds} clean iterations:\n{out[-500:]}"
    no_objects(vt3_plain, "after vt3-resources")
    return int(m.group(2))


def test_resources(vt3_plain):
    """300 create/destroy rounds of PD, MRs, CQs, QPs (every 8-bit STag key wraps); vt3d counts back to zero"""
    resources(vt3_plain, 300)


@pytest.mark.soak
def test_resources_soak(vt3_plain):
    """10,000 create/destroy rounds; vt3d counts back to zero"""
    resources(vt3_plain, 10000)


def test_verbs(vt3_plain):
    """PD/MR/CQ/QP through raw uverbs and from a kernel module; vt3d ends with none"""
    a = vt3_plain.a
    out = a.check("vt3-uverbs check", 60)
    ok, fail = count(out, r"^ok "), count(out, r"^FAIL ")
    assert fail == 0 and "0 failure(s)" in out, out
    assert ok == VT3_UVERBS_CHECKS, f"vt3-uverbs ran {ok} checks, want {VT3_UVERBS_CHECKS}"
    out = a.check(f"dmesg -c > /dev/null; insmod {KMOD}/vt3_ktest.ko && "
                  "rmmod vt3_ktest && dmesg | grep vt3_ktest:", 120)
    passed, failed = summary(out, "vt3_ktest: vt3_0")
    assert (passed, failed) == (VT3_KTEST_CHECKS, 0), f"vt3_ktest: {passed} passed, {failed} failed:\n{out[-1500:]}"
    no_objects(vt3_plain, "after the checks")


def hold(g):
    """vt3-uverbs hold in the background, until it holds its objects."""
    g.spawn("vt3-uverbs hold", "hold", 600)
    g.check("for i in $(seq 100); do grep -q holding /tmp/hold.out && exit 0; sleep 0.1; done; "
            "cat /tmp/hold.out; exit 1", 20)


def test_rdma_res(vt3_plain):
    """rdma res show pd|mr|cq|qp lists a live program's objects, and vt3d holds them"""
    a = vt3_plain.a
    hold(a)
    held = vt3_plain.vt3a.objects()
    for kind in ("pd", "mr", "cq", "qp"):
        assert "vt3_0" in a.check(f"rdma res show {kind}"), f"rdma res show {kind}: nothing on vt3_0"
        assert held[kind] > 0, f"vt3d holds no {kind} while vt3-uverbs does"
    a.kill("hold")
    assert a.join("hold", 20).rc == 143, "vt3-uverbs hold did not end by its SIGTERM"
    a.check("for i in $(seq 50); do rdma res show qp | grep -q vt3_0 || exit 0; sleep 0.1; done; exit 1", 10)
    no_objects(vt3_plain, "after the holder exited")


def test_create_qp_efault(fresh_poisoned_vt3):
    """a user QP whose create response cannot reach user space (EFAULT) is gone before anyone finds it: a device loss right after trips over nothing (freed memory poisoned)"""  # noqa: E501
    p = fresh_poisoned_vt3
    a = p.a
    mark = kmark(a)
    a.spawn("vt3-uverbs efault", "efault", 120)
    a.check("for i in $(seq 400); do grep -q creating /tmp/efault.out && exit 0; sleep 0.05; done; "
            "cat /tmp/efault.out; exit 1", 40, "vt3-uverbs efault did not start")
    # A device loss walks every QP vt3.ko can find: the failed one must not be among them.
    ctl_fault(p.vt3a, "device-fatal")
    r = a.join("efault", 60)
    assert r.rc == 0 and "ok   CREATE_QP with an unwritable response (-14): EFAULT" in r.out, \
        f"vt3-uverbs efault: exit {r.rc}:\n{tail(r.out)}"
    log = kmsg_since(a, mark)
    assert count(log, r"vt3_0: device fatal$") == 1, f"vt3.ko did not see the device loss:\n{tail(log)}"
    a.check(f"rmmod vt3 && insmod {KMOD}/vt3.ko", 120, "reloading vt3.ko after the device loss")
    wait_device(a)
    assert p.vt3a.stats()["rnic.fatal"] == 0, "vt3d still fatal after vt3.ko's reset"
    trouble = a.kernel_trouble_since(p.scenario_mark["a"])
    assert not trouble, f"kernel trouble after the failed create and the loss: {trouble[:3]}"
    no_objects(p, "after the failed create and vt3.ko's reset")


def listening(g, port, devices):
    """rdma res show cm_id has a LISTEN on PORT for each of DEVICES."""
    out = g.check("rdma res show cm_id")
    for dev in devices:
        assert re.search(rf"^link {dev}/\S* .*state LISTEN .*src-addr \S*:{port}\b", out, re.M), \
            f"no LISTEN on port {port} for {dev}:\n{out}"


def listen_and_stop(g, args, port, devices):
    """rping -s ARGS listens (on every device in DEVICES) until killed."""
    g.spawn(f"rping -s {args} -p {port} -v", "listen", 120)
    wait_rdma_listen(g, port, 30)
    listening(g, port, devices)
    g.kill("listen")
    r = g.join("listen", 20)
    assert r.rc == 143, f"rping -s {args} ended with {r.rc} before its SIGTERM:\n{r.out}"


def test_vt3_listen(vt3_plain):
    """rdma listens: ports guest TCP holds, wildcard (with siw beside) and IPv6 listens"""
    a = vt3_plain.a
    a.spawn("nc -l -p 7174", "nc", 300)
    a.check("for i in $(seq 50); do netstat -ltn | grep -q ':7174 ' && exit 0; sleep 0.1; done; exit 1", 10)
    # An address-bound listen on a port the guest's TCP holds is refused
    # without CAP_NET_ADMIN (root's takes the port: test_cm's
    # listen-beside-tcp)...
    r = a.run(f"unshare -U -r rping -s -a {A_IP} -p 7174 -v", 30)
    assert r.rc != 0 and "rdma_listen" in r.out and "Address already in use" in r.out, \
        f"an unprivileged rping -s on a port guest TCP holds: exit {r.rc}:\n{r.out}"
    # ...a wildcard one is not (the guest's TCP may own the port on other devices).
    listen_and_stop(a, "-a 0.0.0.0", 7174, ["vt3_0"])
    a.kill("nc")
    a.join("nc", 10)
    listen_and_stop(a, "-a ::", 7200, ["vt3_0"])
    # The port is free for the guest's TCP again once the listen ended.
    a.spawn("nc -l -p 7200", "nc", 30)
    a.check("for i in $(seq 50); do netstat -ltn | grep -q ':7200 ' && exit 0; sleep 0.1; done; "
            "cat /tmp/nc.out; exit 1", 10)
    a.kill("nc")
    a.join("nc", 10)
    # A wildcard listen reaches every iWARP device: vt3 must not break siw's.
    a.check("rdma link add siw0 type siw netdev eth0", 30)
    try:
        listen_and_stop(a, "-a 0.0.0.0", 7201, ["vt3_0", "siw0"])
    finally:
        a.run("rdma link del siw0", 30)


def test_driver_probe(vt3_plain):
    """vt3.ko attaches to vt3d's NIC only; the port follows the link"""
    a, b = vt3_plain.a, vt3_plain.b
    b.check("dmesg -c > /dev/null", 10)
    b.check(f"insmod {KMOD}/vt3.ko", 60)
    # The probe of a NIC without vt3d behind it times out quietly.
    b.check("sleep 8; ! ls /sys/class/infiniband/ 2>/dev/null | grep -q vt3", 30, "vt3.ko took a plain NIC")
    b.check("rmmod vt3", 30)
    r = b.run("dmesg | grep -i vt3", 10)
    assert not re.search(r"error|fail|warn", r.out, re.I), f"vt3.ko complained on a plain NIC:\n{r.out}"
    assert re.search(r"vt3_0/1 state ACTIVE .*netdev eth0", a.check("rdma link show vt3_0/1"))
    assert a.check("cat /sys/class/infiniband/vt3_0/node_type").startswith("4: RNIC")
    assert "node_type rnic" in a.check("rdma dev show vt3_0")
    state = "/sys/class/infiniband/vt3_0/ports/1/state"
    try:
        a.check("ip link set eth0 down", 10)
        a.check(f"for i in $(seq 50); do grep -q DOWN {state} && exit 0; sleep 0.1; done; cat {state}; exit 1", 10)
        # The carrier from QEMU's side too (QMP set_link), as a cable pull.
        a.check("ip link set eth0 up", 10)
        a.check(f"for i in $(seq 50); do grep -q ACTIVE {state} && exit 0; sleep 0.1; done; cat {state}; exit 1", 10)
        vt3_plain.a.set_link(False)
        a.check(f"for i in $(seq 30); do grep -q DOWN {state} && exit 0; sleep 0.1; done; cat {state}; exit 1", 10)
        vt3_plain.a.set_link(True)
        a.check(f"for i in $(seq 50); do grep -q ACTIVE {state} && exit 0; sleep 0.1; done; cat {state}; exit 1", 10)
    finally:
        vt3_plain.a.set_link(True)
        a.run("ip link set eth0 up", 10)


def test_driver_unload(fresh_single_vt3):
    """rmmod vt3 with live resources, reload, rdma link del/add"""
    s = fresh_single_vt3
    a = s.a
    hold(a)
    a.check("rmmod vt3 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null", 60)
    no_objects(s, "after rmmod")
    a.kill("hold")
    a.join("hold", 20)
    a.check(f"insmod {KMOD}/vt3.ko", 60)
    wait_device(a)
    r = a.run("rdma link add vt3x type vt3 netdev eth0", 30)
    assert r.rc != 0 and "File exists" in r.out, f"a second vt3 link on eth0 (want EEXIST): exit {r.rc}: {r.out}"
    a.check("rdma link del vt3_0 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null", 30)
    a.check("rdma link add vt3x type vt3 netdev eth0", 30)
    wait_device(a, "vt3x")
    out = a.check("vt3-uverbs check", 60)
    assert count(out, r"^FAIL ") == 0 and count(out, r"^ok ") == VT3_UVERBS_CHECKS, out


def mem_counters(g) -> dict[str, int]:
    """vt3.ko's memory counters: vt3_pages alive, and those kept as orphans."""
    out = g.check("cd /sys/class/infiniband/vt3_0/hw_counters && grep . mem_live mem_orphaned", 10)
    return {k: int(v) for k, v in re.findall(r"^(mem_\w+):(\d+)$", out, re.M)}


# The verb vt3-resources calls for each command, and the memory vt3.ko
# handed over for that object alone (CQ: ring, status page; QP: SQ, RQ,
# status page; MR: the pinned region).
UNKNOWN_OUTCOMES = {"create-cq": ("ibv_create_cq", 2), "create-qp": ("ibv_create_qp", 3), "reg-mr": ("ibv_reg_mr", 1)}


@pytest.mark.parametrize("command", UNKNOWN_OUTCOMES)
def test_unknown_outcome(fresh_single_vt3, command):
    """vt3d carries out a create but its reply is lost (fault lose-reply): the verb fails with ETIMEDOUT, the
    memory vt3.ko handed over stays allocated as an orphan (vt3d may write into it), a RESET frees it"""
    s = fresh_single_vt3
    a = s.a
    verb, own = UNKNOWN_OUTCOMES[command]
    base = mem_counters(a)
    assert base["mem_orphaned"] == 0, f"orphans before the fault: {base}"
    s.vt3a.ctl("fault", "lose-reply", "--command", command)
    r = a.run("dmesg -c > /dev/null; vt3-resources -n 1", 60)
    assert r.rc == 1 and re.search(rf"{verb}(\([^)]*\))? failed: .*\(errno 110\)", r.out), \
        f"vt3-resources with the {command} reply lost (want {verb} ETIMEDOUT): exit {r.rc}:\n{r.out[-800:]}"
    assert s.vt3a.stats()["fault.lost_replies"] == 1, "vt3d did not drop the reply"
    assert "outcome unknown" in a.check("dmesg", 10), "vt3.ko did not report the unknown outcome"
    held = s.vt3a.objects()
    assert held.get(command.split("-")[1], 0) >= 1, f"vt3d does not hold the object whose reply was lost: {held}"
    got = mem_counters(a)
    # The object's memory and whatever vt3d refused to let go of because of
    # it stay; everything else the process had is freed.
    assert got["mem_orphaned"] >= own, f"{command}: vt3.ko kept {got} (want >= {own} orphans over {base})"
    assert got["mem_live"] - base["mem_live"] == got["mem_orphaned"], f"{command}: leaked or freed: {base} -> {got}"
    a.check("rdma link del vt3_0 && rdma link add vt3_0 type vt3 netdev eth0", 60)
    wait_device(a)
    no_objects(s, "after the RESET")
    assert mem_counters(a) == base, "the RESET vt3d confirmed did not free the orphans"


def test_vt3d_lost(fresh_single_vt3):
    """vt3d stops answering (device unregistered), then exits (port DOWN, rmmod)"""
    s = fresh_single_vt3
    a = s.a
    s.vt3a.kill(19)  # SIGSTOP
    r = a.run("vt3-uverbs check", 60)
    # The first command vt3d must answer times out (ETIMEDOUT), nothing else.
    assert r.rc == 1 and re.search(r"^FAIL \S+ \(-110\)", r.out, re.M), \
        f"vt3-uverbs against a stopped vt3d: exit {r.rc}:\n{r.out[-800:]}"
    a.check("for i in $(seq 40); do ls /sys/class/infiniband/ | grep -q vt3 || exit 0; sleep 1; done; exit 1", 60,
            "vt3_0 still registered with vt3d stopped")
    s.vt3a.kill(18)  # SIGCONT
    # No link flap: vt3.ko keeps probing the lost device's NIC (every 2 s,
    # then every 10 s), and the vt3d that answers again gets a new vt3_0.
    wait_device(a)
    assert "vt3d is back on eth0" in a.check("dmesg | grep 'vt3d is back' || true", 10), "no 'vt3d is back' line"
    hold(a)
    s.vt3a.kill(15)
    assert s.vt3a.proc.wait(10) == 0, "vt3d did not exit cleanly on SIGTERM"
    a.check("for i in $(seq 20); do grep -q DOWN /sys/class/infiniband/vt3_0/ports/1/state && exit 0; "
            "sleep 1; done; exit 1", 30, "port not DOWN after vt3d exited")
    a.check("rmmod vt3", 60)
    a.kill("hold")
    a.join("hold", 20)
