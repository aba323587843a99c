"""Only vt3.ko drives vt3d, and only vt3d talks to vt3.ko (vt3_hw.h, "Who
may drive the device"): an attacker with a packet socket in the guest and
one on the wire, against the real driver moving data."""

import re

from helpers import count, no_objects, summary, wait_rdma_listen
from vt3lab import A_MAC, KMOD
from vt3lab.tools import PERFTEST_PORT, tail

REFUSALS = ("short", "version", "not_command", "no_session", "mac", "replay", "hello")
DRIVER_REFUSALS = ("short", "version", "type", "no_session", "mac", "replay")
# Checks vt3_kforge runs: a count that differs means one did not run.
VT3_KFORGE_CHECKS = 6


def refused(vt3d) -> dict[str, int]:
    s = vt3d.stats()
    return {r: s[f"control.ctrl_refused_{r}"] for r in REFUSALS} | {"sessions": s["control.ctrl_sessions"],
                                                                   "wire": s["nic.rx_dropped_control"]}


def driver_refused(guest) -> dict[str, int]:
    out = guest.check("cd /sys/class/infiniband/vt3_0/hw_counters && grep . ctrl_refused_*")
    got = dict(re.findall(r"^ctrl_refused_(\w+):(\d+)$", out, re.M))
    assert sorted(got) == sorted(DRIVER_REFUSALS), f"vt3_0 hw_counters: {out}"
    return {k: int(v) for k, v in got.items()}


def forge_counts(out: str) -> dict[str, int]:
    m = re.search(r"^vt3-forge: (.*)$", out, re.M)
    assert m, f"vt3-forge printed no counts:\n{tail(out)}"
    return {k: int(v) for k, v in re.findall(r"(\w[\w-]*)=(\d+)", m.group(1))}


def test_ctrl_forgery(vt3_siw):
    """a guest process with only a packet socket sniffs the driver, then forges every command kind, a HELLO of its own,
    replays and changes the driver's commands, forges events both ways; all refused and counted, none answered,
    perftest of the real driver unharmed"""
    a, b, vt3d = vt3_siw.a, vt3_siw.b, vt3_siw.vt3a
    before = refused(vt3d)
    assert driver_refused(a) == dict.fromkeys(DRIVER_REFUSALS, 0), "vt3.ko refused a frame before any attack"

    # The real driver at work: perftest a (vt3) → b (siw), 15 s of WRITEs.
    a.spawn("vt3-forge eth0 --commands 16 --wait 120", "forge", 200)
    b.spawn("ib_write_bw -R -F -s 65536 -D 15", "pt-srv", 300)
    wait_rdma_listen(b, PERFTEST_PORT)
    a.spawn(f"ib_write_bw -R -F -s 65536 -D 15 {b.ip}", "pt-cli", 300)
    forge = a.join("forge", 150)
    assert forge.rc == 0, f"vt3-forge exit {forge.rc}:\n{tail(forge.out)}"
    assert a.running("pt-cli"), "the attack was over before perftest moved data"
    f = forge_counts(forge.out)
    assert f["sniffed"] == 16, f"vt3-forge sniffed {f['sniffed']} of the driver's commands: {f}"
    assert (f["answered"], f["duplicated"]) == (0, 0), f"vt3d answered the attacker: {f}"

    # From the wire: device events and a response sent to a's MAC.
    wire = forge_counts(b.check(f"vt3-forge eth0 --events-to {A_MAC}", 30))

    c, s = a.join("pt-cli", 120), b.join("pt-srv", 60)
    assert (c.rc, s.rc) == (0, 0), f"perftest under attack: client exit {c.rc}, server exit {s.rc}\n{tail(c.out)}"
    rows = re.findall(r"^\s*65536\s+(\d+)\s+[\d.]+\s+([\d.]+)\s", c.out, re.M)
    assert rows and int(rows[-1][0]) > 0 and float(rows[-1][1]) > 0, f"perftest moved no data:\n{tail(c.out)}"

    after = refused(vt3d)
    delta = {k: after[k] - before[k] for k in after}
    want = dict.fromkeys(delta, 0) | {
        "mac": f["forged"] + f["modified"],
        "hello": f["hello"],
        "replay": f["replayed"],
        "not_command": f["events"],
        "wire": wire["wire-events"],
    }
    assert delta == want, f"vt3d's refusal counters moved by {delta}, want {want} (vt3-forge: {f})"
    assert driver_refused(a) == dict.fromkeys(DRIVER_REFUSALS, 0), "vt3.ko refused a genuine frame, or saw a forged one"

    # Frames put straight into vt3.ko's receive path (a bridge or a
    # forwarding device would deliver them): refused by the MAC and counter.
    out = a.check(f"dmesg -c > /dev/null; insmod {KMOD}/vt3_kforge.ko && rmmod vt3_kforge && dmesg | grep vt3_kforge:", 60)
    passed, failed = summary(out, "vt3_kforge: vt3_0")
    assert (passed, failed) == (VT3_KFORGE_CHECKS, 0), f"vt3_kforge: {passed} passed, {failed} failed:\n{out}"
    assert count(out, r"vt3_kforge: ok ") == VT3_KFORGE_CHECKS
    assert driver_refused(a) == dict.fromkeys(DRIVER_REFUSALS, 0) | {"mac": 2, "replay": 1}
    no_objects(vt3_siw, "after the attack")
