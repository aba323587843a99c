"""What vt3 needs of the virtual machine under it: a guest's atomic
read-modify-write and its full fence hold against vt3d, a host thread
working on the same words of guest memory (a QP status page's flags and
indices: the doorbell hand-off is a store, a fence and a load on each
side). Under TCG, QEMU makes a guest's locked instructions host atomics
only for a machine of more than one possible CPU (`-smp 1,maxcpus=2`,
docs/user-guide.md, "Under TCG"): the lab's guests have room for two,
and vt3.ko warns on a machine of one."""

import re
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What vt3.ko says when it attaches on such a machine.
ONE_CPU_WARNING = "QEMU TCG with one possible CPU does not make this guest's atomics atomic against vt3d"
# How long each race lasts in the guest: the host half runs all along, so
# on a busy 2-core host both run at once for much of it; with maxcpus=1
# that loses millions of adds (docs/field-notes.md).
SECONDS = 2


@pytest.fixture(scope="module")
def host_litmus(tmp_path_factory) -> Path:
    """vt3-litmus built for the host from the guest tool's source."""
    exe = tmp_path_factory.mktemp("litmus") / "vt3-litmus"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", "-o", str(exe), str(ROOT / "guest-tools/vt3-litmus.c")],
                   check=True, timeout=120)
    return exe


def litmus_page(g, timeout: float = 60) -> tuple[str, str]:
    """The page and nonce the spawned guest half printed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = g.run("cat /tmp/litmus.out", 10).out
        m = re.search(r"^page (0x[0-9a-f]+) nonce (\d+)$", out, re.M)
        if m:
            return m.group(1), m.group(2)
        assert g.running("litmus"), f"vt3-litmus ended before it printed its page:\n{out}"
        time.sleep(0.5)
    raise AssertionError(f"vt3-litmus printed no page in {timeout} s")


def race(setup, host_litmus) -> dict[str, tuple[int, int, int]]:
    """Runs both halves of vt3-litmus in SETUP's guest a and on the host;
    for each race ("adds", "lock"): (adds or entries of both sides, the
    counter, lost), and "overlaps" and the host half's exit status."""
    g = setup.a
    g.spawn(f"vt3-litmus guest {SECONDS}", "litmus", 300)
    page, nonce = litmus_page(g)
    host = subprocess.run([str(host_litmus), "host", str(g.proc.pid), page, nonce],
                          capture_output=True, text=True, timeout=300)
    guest = g.join("litmus", 60)
    assert guest.rc == 0, f"guest half: exit {guest.rc}:\n{guest.out}"
    m = re.search(r"^guest adds (\d+), lock entries (\d+), overlaps (\d+)$", guest.out, re.M)
    assert m, f"guest half:\n{guest.out}"
    said = list(map(int, m.groups()))
    races = {}
    for name, guest_count in zip(("adds", "lock"), said):
        r = re.search(rf"^{name}: host (\d+), guest (\d+), counter (\d+), lost (-?\d+)", host.stdout, re.M)
        assert r, f"host half: exit {host.returncode}:\n{host.stdout}{host.stderr}"
        h, gc, counter, lost = map(int, r.groups())
        # Both sides took part, and the host read what the guest counted.
        assert h > 0 and gc == guest_count > 0, (host.stdout, guest.out)
        assert counter == h + gc - lost, host.stdout
        races[name] = (h + gc, counter, lost)
    overlaps = re.search(r"overlaps (\d+)$", host.stdout, re.M)
    assert overlaps, host.stdout
    races["overlaps"] = (int(overlaps.group(1)),)
    races["rc"] = (host.returncode,)
    print(f"{setup.kind}: {host.stdout}", end="")
    return races


@pytest.mark.qemu10
def test_guest_atomics(single_vt3, host_litmus):
    """a guest as the lab boots it (maxcpus=2) and a host thread on the same words of guest RAM: lock xadd loses no add, Peterson's lock (store, fence, load) never lets both in"""  # noqa: E501
    r = race(single_vt3, host_litmus)
    assert r["adds"][2] == 0, f"{r['adds'][2]} of {r['adds'][0]} atomic adds lost between the guest and a host thread"
    assert (r["lock"][2], r["overlaps"][0]) == (0, 0), \
        f"a fence did not order the guest's store before its load: {r['overlaps'][0]} overlaps, " \
        f"{r['lock'][2]} entries lost"
    assert r["rc"] == (0,)
    assert ONE_CPU_WARNING not in single_vt3.a.check("dmesg", 10)


@pytest.mark.qemu10
def test_one_cpu_guest_atomics(one_cpu_vt3, host_litmus):
    """the same on a machine of one possible CPU (maxcpus=1): adds are lost (so the check above can fail), and vt3.ko warns of it"""  # noqa: E501
    r = race(one_cpu_vt3, host_litmus)
    assert r["adds"][2] > 0 and r["rc"] == (1,), f"no add lost with maxcpus=1: {r}"
    # vt3.ko told the user so.
    assert ONE_CPU_WARNING in one_cpu_vt3.a.check("dmesg", 10)


@pytest.mark.qemu10
def test_guest_clock(single_vt3):
    """the lab's guest (maxcpus=2) keeps the TSC as its clock: without tsc=reliable its kernel drops the TSC of QEMU's AMD model for the HPET, and perftest's calibration fails"""  # noqa: E501
    a = single_vt3.a
    source = a.check("cat /sys/devices/system/clocksource/clocksource0/current_clocksource", 10).strip()
    if source != "tsc":
        log = a.run("dmesg | grep -iE 'tsc|clocksource'", 10).out
        raise AssertionError(f"the guest's clocksource is {source}, not tsc:\n{log}")
    assert "tsc=reliable" in a.check("cat /proc/cmdline", 10).split()
