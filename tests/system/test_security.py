"""Only vt3.ko drives vt3d, and only vt3d talks to vt3.ko (docs/security.md):
an attacker with a packet socket in the guest and one on the wire, against
the real driver moving data.

Issue 25's attacker (v4): a process with only a packet socket sniffed the
HELLO, sprayed key records over half of RAM, guessed HELLOs unlimited,
started a session of its own, replaced the driver's and registered a DMA MR
over all of RAM with remote rights. Here it tries the same against v5's
first contact, phase by phase, and every frame it sends must move exactly
the refusal counter vt3_hw.h's rules say (vt3-forge prints what it sent and
what each must move: want_*)."""

import re
import threading
from pathlib import Path

from helpers import count, no_objects, summary, wait_rdma_listen
from vt3lab import A_MAC, KMOD
from vt3lab.guest import FW_CFG_KEY_RAW
from vt3lab.proc import wait_for
from vt3lab.setups import debug_vt3, wait_device
from vt3lab.tools import PERFTEST_PORT, tail

REFUSALS = ("short", "version", "not_command", "no_session", "mac", "replay", "hello", "hello_replay",
            "hello_limited")
# Refusals of a HELLO or PROVE: checked and refused, or dropped unchecked past the bucket.
FIRST_CONTACT = ("hello", "hello_replay", "hello_limited")
DRIVER_REFUSALS = ("short", "version", "type", "no_session", "mac", "replay", "hello")
# Checks vt3_kforge runs: a count that differs means one did not run.
VT3_KFORGE_CHECKS = 7
HEADER = Path(__file__).resolve().parents[2] / "guest-driver/include/vt3_hw.h"
# The attacker's guesses, at full speed, as uid 65534 with CAP_NET_RAW only.
GUESS_SECONDS = 10
CAP_NET_RAW = 1 << 13
NOBODY = 65534
# Long enough for every phase to run while it moves data (TCG, one vCPU shared with the attacker).
PERFTEST_SECONDS = 90
HS_FILE = "/tmp/vt3-hs.bin"


def header_define(name: str) -> int:
    m = re.search(rf"^#define {name}\s+(\d+)", HEADER.read_text(), re.M)
    assert m, f"{name} is not in {HEADER}"
    return int(m.group(1))


def refused(vt3d) -> dict[str, int]:
    s = vt3d.stats()
    return {r: s[f"control.ctrl_refused_{r}"] for r in REFUSALS} | {"sessions": s["control.ctrl_sessions"],
                                                                    "wire": s["nic.rx_dropped_control"]}


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after}


def nothing() -> dict[str, int]:
    return dict.fromkeys((*REFUSALS, "sessions", "wire"), 0)


def driver_refused(guest) -> dict[str, int]:
    out = guest.check("cd /sys/class/infiniband/vt3_0/hw_counters && grep . ctrl_refused_*")
    got = {k: int(v) for k, v in re.findall(r"^ctrl_refused_(\w+):(\d+)$", out, re.M)}
    missing = set(DRIVER_REFUSALS) - set(got)
    assert not missing, f"vt3_0 hw_counters lack ctrl_refused_{sorted(missing)}: {out}"
    return got


def driver_refused_nothing(guest, when: str) -> None:
    got = driver_refused(guest)
    assert got == dict.fromkeys(got, 0), f"vt3.ko refused frames {when}: {got}"


def forge_counts(out: str) -> dict[str, int | str]:
    m = re.search(r"^vt3-forge: (.*)$", out, re.M)
    assert m, f"vt3-forge printed no counts:\n{tail(out)}"
    return {k: int(v) if re.fullmatch(r"-?\d+", v) else v for k, v in re.findall(r"(\w[\w-]*)=(\S+)", m.group(1))}


def forge(guest, args: str, timeout: int) -> dict[str, int | str]:
    r = guest.run(f"vt3-forge eth0 {args}", timeout)
    assert r.rc == 0, f"vt3-forge {args}: exit {r.rc}:\n{tail(r.out)}"
    return forge_counts(r.out)


def wait_file(guest, path: str, what: str) -> None:
    guest.check(f"for i in $(seq 150); do [ -e {path} ] && exit 0; sleep 0.1; done; exit 1", 30, what)


class MrWatch:
    """Samples vt3d's MR table while the attack runs: a DMA MR with remote
    rights (all of RAM to the peer) must never exist."""

    def __init__(self, vt3d):
        self.vt3d = vt3d
        self.samples = 0
        self.remote_dma: list[dict] = []
        self.errors: list[str] = []
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop_event.wait(0.3):
            try:
                mrs = self.vt3d.ctl("mrs")
            except Exception as e:  # noted, not raised in a thread
                self.errors.append(str(e))
                continue
            self.samples += 1
            self.remote_dma += [m for m in mrs if m.get("kind") == "dma" and
                                re.search(r"\br[wr]\b", str(m.get("access")))]

    def __enter__(self) -> "MrWatch":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(15)


def test_ctrl_forgery(vt3_siw):
    """a guest process with only a packet socket sniffs the driver's first contact during a reload and its commands,
    then forges every command kind, replays and changes the handshake and the commands, reflects vt3d's answers,
    sprays RAM with key records and guesses HELLOs and PROVEs at full speed as nobody; all refused and counted, none
    answered, no session of its own, the key out of its reach, perftest of the real driver unharmed"""
    a, b, vt3d = vt3_siw.a, vt3_siw.b, vt3_siw.vt3a
    burst, rate = header_define("VT3_HELLO_BURST"), header_define("VT3_HELLO_RATE")
    key = a.fw_cfg_key()
    assert key is not None and len(key) == 16, f"guest a has no 16-byte key at {FW_CFG_KEY_RAW}: {key!r}"
    driver_refused_nothing(a, "before any attack")
    start = refused(vt3d)
    figures: dict[str, object] = {}

    with MrWatch(vt3d) as mrs:
        # Phase 0: the driver reloaded under the sniffer's eyes; its first
        # contact costs no refusal and makes one session.
        a.check(f"rm -f {HS_FILE} /tmp/sniff.ready /tmp/forge.ready", 10)
        a.spawn(f"vt3-forge eth0 --sniff-handshake --capture-only --save {HS_FILE} --ready /tmp/sniff.ready "
                "--wait 120", "sniff", 200)
        wait_file(a, "/tmp/sniff.ready", "the sniffer never opened its socket")
        a.check(f"rmmod vt3 && insmod {KMOD}/vt3.ko", 120, "reloading vt3.ko")
        wait_device(a)
        debug_vt3(a)
        sniff = a.join("sniff", 150)
        assert sniff.rc == 0, f"vt3-forge --sniff-handshake exit {sniff.rc}:\n{tail(sniff.out)}"
        assert forge_counts(sniff.out)["sniffed_hs"] == 4, (
            f"the sniffer caught {forge_counts(sniff.out)['sniffed_hs']} of HELLO, RESP, PROVE, RESP:\n"
            f"{tail(sniff.out)}")
        reloaded = refused(vt3d)
        assert moved(start, reloaded) == nothing() | {"sessions": 1}, \
            f"the driver's reload moved vt3d's counters by {moved(start, reloaded)} (want one session, no refusal)"
        driver_refused_nothing(a, "after the reload")

        # The real driver at work: perftest a (vt3) → b (siw), WRITEs for
        # as long as the attack lasts.
        a.spawn("vt3-forge eth0 --commands 16 --wait 120 --ready /tmp/forge.ready", "forge", 200)
        wait_file(a, "/tmp/forge.ready", "vt3-forge never opened its socket")
        b.spawn(f"ib_write_bw -R -F -s 65536 -D {PERFTEST_SECONDS}", "pt-srv", 400)
        wait_rdma_listen(b, PERFTEST_PORT)
        a.spawn(f"ib_write_bw -R -F -s 65536 -D {PERFTEST_SECONDS} {b.ip}", "pt-cli", 400)

        # Phase 1: the driver's commands sniffed, then every command kind
        # forged, the commands replayed and changed, events forged.
        r = a.join("forge", 150)
        assert r.rc == 0, f"vt3-forge exit {r.rc}:\n{tail(r.out)}"
        assert a.running("pt-cli"), "the attack was over before perftest moved data"
        f = forge_counts(r.out)
        assert f["sniffed"] == 16, f"vt3-forge sniffed {f['sniffed']} of the driver's commands: {f}"
        assert (f["answered"], f["duplicated"]) == (0, 0), f"vt3d answered the attacker's commands: {f}"
        commands = refused(vt3d)
        want = nothing() | {"mac": f["forged"] + f["modified"], "hello": f["hello"], "replay": f["replayed"],
                            "not_command": f["events"]}
        assert moved(reloaded, commands) == want, \
            f"vt3d's refusal counters moved by {moved(reloaded, commands)}, want {want} (vt3-forge: {f})"

        # Phase 2: the sniffed first contact replayed, every byte of the
        # HELLO and the PROVE flipped, vt3d's answers reflected, HELLOs and
        # PROVEs crafted; paced below the refusal rate, so each is checked.
        hs = forge(a, f"--handshake {HS_FILE}", 180)
        assert (hs["answered"], hs["duplicated"]) == (0, 0), f"vt3d answered the attacker's first contact: {hs}"
        handshake = refused(vt3d)
        got = moved(commands, handshake)
        assert hs["replayed"] == 2 and hs["modified"] >= 100 and hs["reflected"] == 2, (
            f"vt3-forge sent too little: {hs}")
        want = nothing() | {r: hs[f"want_{r}"] for r in REFUSALS if f"want_{r}" in hs}
        assert got["sessions"] == 0, f"the attacker's first contact made a session: {got} (vt3-forge: {hs})"
        assert sum(got[k] for k in FIRST_CONTACT) == hs["bucketed"], \
            f"vt3d counted {sum(got[k] for k in FIRST_CONTACT)} HELLO/PROVE refusals of the {hs['bucketed']} sent: " \
            f"{got} (vt3-forge: {hs})"
        assert got["hello_limited"] == 0, f"HELLOs paced below the refill rate were dropped unchecked: {got}"
        assert got["hello_replay"] >= hs["replayed"], f"the replayed HELLO and PROVE were not refused as replays: {got}"
        assert hs["want_not_command"] == hs["reflected"] + 2  # and the HELLO's and the PROVE's type byte flipped
        assert got == want, f"vt3d's refusal counters moved by {got}, want {want} (vt3-forge: {hs})"
        figures["handshake"] = {k: v for k, v in got.items() if v}

        # Phase 3: as nobody with CAP_NET_RAW only: the key out of reach,
        # RAM sprayed with v4 key records and the captured frames, HELLOs
        # and PROVEs guessed at full speed.
        mem = dict(re.findall(r"^(MemTotal|MemAvailable):\s+(\d+) kB", a.check("cat /proc/meminfo", 10), re.M))
        spray_mb = int(min(int(mem["MemTotal"]) * 0.48, int(mem["MemAvailable"]) * 0.6)) // 1024
        g = forge(a, f"--as-nobody --frames {HS_FILE} --spray {spray_mb} --guess {GUESS_SECONDS}",
                  GUESS_SECONDS + 180)
        assert (g["uid"], g["gid"]) == (NOBODY, NOBODY), f"vt3-forge --as-nobody ran as {g['uid']}:{g['gid']}"
        assert (g["capeff"], g["capprm"], g["capbnd"]) == (CAP_NET_RAW,) * 3, \
            f"vt3-forge --as-nobody kept capabilities beyond CAP_NET_RAW: {g}"
        assert g["key_present"] == 1, f"no key at {FW_CFG_KEY_RAW} for the attacker to try: {g}"
        assert g["key_read"] == "denied", \
            f"the attacker's read of {FW_CFG_KEY_RAW}: {g['key_read']} (errno {g['key_errno']}), want EACCES"
        assert (g["answered"], g["duplicated"]) == (0, 0), f"vt3d answered the attacker's guesses: {g}"
        assert g["spray_mb"] == spray_mb and g["spray_intact_pages"] == g["spray_pages"] > 0, \
            f"the spray was not kept resident: {g}"
        guessed = g["guess_hello"] + g["guess_prove"]
        assert g["guess_ms"] >= GUESS_SECONDS * 1000 and guessed > burst + rate * GUESS_SECONDS, \
            f"vt3-forge did not flood: {g}"
        # vt3d counts what it has taken off the TX ring: wait for the last.
        seen: dict[str, int] = {}

        def counted() -> bool:
            nonlocal seen
            seen = moved(handshake, refused(vt3d))
            return sum(seen[k] for k in FIRST_CONTACT) >= guessed
        wait_for(counted, 30, 0.5)
        guesses = refused(vt3d)
        got = moved(handshake, guesses)
        assert got["sessions"] == 0, f"the attacker's guesses made a session: {got} (vt3-forge: {g})"
        assert sum(got[k] for k in FIRST_CONTACT) == guessed, \
            f"vt3d counted {sum(got[k] for k in FIRST_CONTACT)} HELLO/PROVE refusals of the {guessed} guessed: {got}"
        assert got["hello_replay"] == 0, f"random nonces refused as replays: {got}"
        assert got["hello_limited"] > 0, f"a flood of {guessed} HELLOs and PROVEs was never limited: {got}"
        # The bucket: at most a burst, then the refill rate, checked (a second of slack at each end).
        most = burst + rate * (g["guess_ms"] / 1000 + 2)
        assert got["hello"] <= most, f"vt3d checked {got['hello']} guesses in {g['guess_ms']} ms (at most {most:.0f})"
        assert got == nothing() | {k: got[k] for k in FIRST_CONTACT}, f"the guesses moved other counters: {got}"
        assert a.running("pt-cli"), "perftest was over before the guessing"
        figures["guess"] = {k: g[k] for k in ("guess_hello", "guess_prove", "guess_ms", "guess_rate", "busy",
                                              "spray_mb", "spray_locked")} | {k: got[k] for k in FIRST_CONTACT}

        # From the wire: device events and a response sent to a's MAC.
        wire = forge_counts(b.check(f"vt3-forge eth0 --events-to {A_MAC}", 30))

        c, s = a.join("pt-cli", 300), b.join("pt-srv", 60)
    assert (c.rc, s.rc) == (0, 0), f"perftest under attack: client exit {c.rc}, server exit {s.rc}\n{tail(c.out)}"
    rows = re.findall(r"^\s*65536\s+(\d+)\s+[\d.]+\s+([\d.]+)\s", c.out, re.M)
    assert rows and int(rows[-1][0]) > 0 and float(rows[-1][1]) > 0, f"perftest moved no data:\n{tail(c.out)}"
    figures["perftest"] = {"iterations": int(rows[-1][0]), "MB/s": float(rows[-1][1])}

    end = refused(vt3d)
    assert moved(guesses, end) == nothing() | {"wire": wire["wire-events"]}, \
        f"vt3d's refusal counters moved by {moved(guesses, end)} after the guesses (wire: {wire})"
    assert end["sessions"] - start["sessions"] == 1, \
        f"{end['sessions'] - start['sessions']} sessions began during the attack, want 1 (the driver's reload)"
    assert mrs.samples > 0, f"vt3d's MR table was never read: {mrs.errors[:3]}"
    assert not mrs.remote_dma, f"a DMA MR with remote rights existed during the attack: {mrs.remote_dma[:3]}"
    driver_refused_nothing(a, "during the attack (a genuine frame, or one of the attacker's reached it)")
    figures["refused"] = {k: v for k, v in moved(start, end).items() if v}
    print(f"ctrl-forgery figures: {figures}", flush=True)
    (vt3_siw.dir.parent / "ctrl-forgery-figures.txt").write_text(f"{figures}\n")

    # Frames put straight into vt3.ko's receive path (a bridge or a
    # forwarding device would deliver them): refused by the MAC and counter.
    out = a.check(f"dmesg -c > /dev/null; insmod {KMOD}/vt3_kforge.ko && "
                  "rmmod vt3_kforge && dmesg | grep vt3_kforge:", 60)
    passed, failed = summary(out, "vt3_kforge: vt3_0")
    assert (passed, failed) == (VT3_KFORGE_CHECKS, 0), f"vt3_kforge: {passed} passed, {failed} failed:\n{out}"
    assert count(out, r"vt3_kforge: ok ") == VT3_KFORGE_CHECKS
    got = driver_refused(a)
    # A forged event, a replayed and a changed answer, a HELLO answer to no HELLO.
    assert got == dict.fromkeys(got, 0) | {"mac": 2, "replay": 1, "hello": 1}, \
        f"vt3.ko's refusals of vt3_kforge's frames: {got}"
    no_objects(vt3_siw, "after the attack")
    # A fresh driver for what runs next on this setup (this case again,
    # under --repeat): its first check wants no refusal counted.
    a.check(f"rmmod vt3 && insmod {KMOD}/vt3.ko", 120, "reloading vt3.ko")
    wait_device(a)
    driver_refused_nothing(a, "after the closing reload")
