"""The harness's own checks must be able to fail: the health check between
scenarios sees leftover processes, objects vt3d still holds, and kernel
warnings (then forgets what this scenario did on purpose)."""

from vt3lab.guest import KERNEL_TROUBLE


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
    assert KERNEL_TROUBLE.search("[  1.0] general protection fault, probably for non-canonical address 0x1: 0000 [#1] SMP")
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
