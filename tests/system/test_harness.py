"""The harness's own checks must be able to fail: the health check between
scenarios sees leftover processes, objects vt3d still holds, and kernel
warnings (then forgets what this scenario did on purpose). And what a
user's suite configures reaches the guests."""

import dataclasses

import pytest
from vt3lab.guest import KERNEL_TROUBLE, Guest, Nic
from vt3lab.proc import wait_for
from vt3lab.qmp import QmpError
from vt3lab.setups import A_IP, SingleVt3
from vt3lab.tools import wait_rdma_listen


def test_health_check(vt3_plain):
    """the health check between scenarios catches a leftover process, objects in vt3d and a kernel warning"""
    s, a = vt3_plain, vt3_plain.a
    mark = s.mark()
    assert s.health(mark) == [], "the health check is not clean before the scenario"
    a.spawn("nc -l -p 9999", "stray", 120)
    a.spawn("vt3-uverbs hold", "holder", 120)
    a.check("for i in $(seq 100); do grep -q holding /tmp/holder.out && exit 0; sleep 0.1; done; exit 1", 20)
    a.check("echo '<4>WARNING: vt3lab health-check probe' > /dev/kmsg", 10)
    problems = "\n".join(s.health(mark))
    assert "leftover processes" in problems and "'nc'" in problems, problems
    assert "vt3-uverbs" in problems, problems
    assert "vt3d vt3a still holds" in problems, problems
    assert "kernel trouble" in problems and "health-check probe" in problems, problems
    # health() killed the leftovers: vt3d's objects go with them.
    assert a.join("holder", 30).rc == 137 and a.join("stray", 30).rc == 137
    assert s.vt3a.wait_no_objects() == {}
    assert KERNEL_TROUBLE.search("[  1.0] general protection fault, probably for non-canonical address 0x1: "
                                 "0000 [#1] SMP")
    assert not KERNEL_TROUBLE.search("traps: rping[99] general protection fault ip:7f sp:7ff error:0 in librdmacm.so")
    s.mark_scenario()  # the probe's warning was on purpose


def test_agent_output(vt3_plain):
    """the agent gives a command's output byte for byte, with or without a last newline, and its exit status"""
    a = vt3_plain.a
    for cmd, out in (("true", ""), ("printf abc", "abc"), ("printf 'abc\\n'", "abc"),
                     ("printf 'abc\\n\\n'", "abc\n"), ("printf '\\n\\nx'", "\n\nx"), ("echo a; echo b >&2", "a\nb")):
        r = a.run(cmd)
        assert (r.rc, r.out) == (0, out), f"{cmd!r}: {r}"
    assert a.run("echo gone; exit 3") == a.run("echo gone; exit 3") and a.run("exit 3").rc == 3


def test_health_sees_a_stall(vt3_pair):
    """a send posted with no doorbell (VT3_TEST_NO_DOORBELL) is a stall: vt3d logs and counts it once, the health check reports it"""  # noqa: E501
    s, a, b = vt3_pair, vt3_pair.a, vt3_pair.b
    mark = s.mark()
    before = {n: d.stats()["rnic.stalls"] for n, d in s.vt3d.items()}
    a.spawn(f"rping -s -a {A_IP} -p 7990 -C 1 -v", "stall-srv", 120)
    wait_rdma_listen(a, 7990)
    # b's client connects, then posts its first SEND, which vt3d never
    # hears of: nothing else will move on the connection.
    b.spawn(f"VT3_TEST_NO_DOORBELL=1 rping -c -a {A_IP} -p 7990 -C 1 -v", "stall-cli", 120)
    assert wait_for(lambda: s.vt3b.stats()["rnic.stalls"] > before["vt3b"], 60), \
        f"vt3b counted no stall: {s.vt3b.ctl('qps')}"
    problems = s.health(mark)
    stalls = [p for p in problems if "stall: QP" in p]
    assert len(stalls) == 1 and stalls[0].startswith("vt3d vt3b: ") and \
        "vt3d to take posted send WQEs" in stalls[0] and "sq_prod: 1, sq_fetched: 0" in stalls[0], problems
    # Counted once; a only waits for b, which is no stall of a's.
    after = {n: d.stats()["rnic.stalls"] for n, d in s.vt3d.items()}
    assert after == before | {"vt3b": before["vt3b"] + 1}, (before, after)
    assert s.health(mark) == [], "reported once"
    s.mark_scenario()


def test_guest_options_and_qmp_events(vt3_config, tmp_path):
    """A suite's own kernel parameter and QEMU device reach every guest (LabConfig kernel_args, qemu_args: --vt3-kernel-arg, --vt3-qemu-arg); QMP waits for events"""  # noqa: E501
    cfg = dataclasses.replace(vt3_config, kernel_args="vt3lab.probe=42",
                              qemu_args=("-device", "virtio-rng-pci,id=suite-rng"))
    setup = SingleVt3(cfg, tmp_path).start()
    try:
        g = setup.a
        assert "vt3lab.probe=42" in g.check("cat /proc/cmdline").split()
        peripherals = [p["name"] for p in g.qmp.execute("qom-list", path="/machine/peripheral")]
        assert "suite-rng" in peripherals, peripherals
        g.qmp.execute("stop")
        assert g.qmp.wait_event("STOP", 10)["event"] == "STOP"
        assert g.status() == "paused"
        g.qmp.execute("cont")
        g.qmp.wait_event("RESUME", 10)
        g.check("true")
        with pytest.raises(QmpError, match="no SHUTDOWN event"):
            g.qmp.wait_event("SHUTDOWN", 1)
    finally:
        setup.stop()


def test_kvm_guest_argv(vt3_config, tmp_path):
    """Under KVM a guest gets the host's CPU model (-accel kvm -cpu host); under TCG QEMU's default (no guest boots)"""  # noqa: E501
    nic = Nic.dgram(tmp_path / "peer.dgram")
    for accel, cpu in (("kvm", ["-cpu", "host"]), ("tcg", [])):
        argv = Guest(dataclasses.replace(vt3_config, accel=accel), tmp_path, "a", nic, A_IP, "52:54:00:77:00:01"
                     ).qemu_argv()
        at = argv.index("-accel")
        assert argv[at + 1] == accel and argv[at + 2:at + 2 + len(cpu)] == cpu, argv[:8]
        assert ("-cpu" in argv) == bool(cpu), argv
