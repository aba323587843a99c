"""The interactive lab as a user drives it: `./run-vm.sh up 3 --siw 1`
returns to the prompt with three guests on one segment; a program of the
user's own, put in the shared directory, runs in two guests typed at the
consoles `up` printed; `vt3d ctl` as printed answers; `./run-vm.sh down`
stops every process of the lab (checked by pid)."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PINGS = 8

# The user's program: rping between two lab guests, data verified (-V);
# each end leaves what it printed and its exit status in the shared
# directory, named after its guest.
PROGRAM = f"""#!/bin/sh
role=$1 server=$2
out=/mnt/share/$(hostname).$role
case $role in
server) rping -s -a "$server" -V -v -C {PINGS} ;;
client) rping -c -a "$server" -V -v -C {PINGS} ;;
esac >"$out" 2>&1
rc=$?
echo "exit $rc" >>"$out"
exit $rc
"""


class Console:
    """A guest's serial console as a user at socat has it: lines typed in,
    whatever the guest prints read back (echo, prompts and kernel messages
    included)."""

    def __init__(self, path: str, name: str):
        self.name = name
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(0.5)
        self.seen = ""
        self.seq = 0

    def run(self, cmd: str, timeout: float) -> tuple[int, str]:
        """Types CMD and a line that prints its exit status; returns that
        status and what the console showed meanwhile. The status line
        cannot be mistaken for the typed line's echo (that has quotes)."""
        self.seq += 1
        tag = f"{self.name}-{self.seq}"
        self.seen = ""
        self.sock.sendall(f'{cmd}; echo "@@END" "$?" "{tag}"\n'.encode())
        end = re.compile(rf"@@END (\d+) {re.escape(tag)}\r?\n")
        deadline = time.monotonic() + timeout
        while not (m := end.search(self.seen)):
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}'s console: `{cmd}` did not finish within {timeout} s; "
                                     f"it showed:\n{self.seen[-1500:]}")
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            assert data, f"{self.name}'s console closed during `{cmd}`:\n{self.seen[-1500:]}"
            self.seen += data.decode(errors="replace")
        return int(m.group(1)), self.seen[:m.start()]

    def check(self, cmd: str, timeout: float = 30) -> str:
        rc, out = self.run(cmd, timeout)
        assert rc == 0, f"{self.name}: `{cmd}` exited {rc}:\n{out[-1500:]}"
        return out

    def close(self) -> None:
        self.sock.close()


def run_vm(cfg, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """./run-vm.sh ARGS with the QEMU and guest kernel of this run (its
    images, VT3_IMAGES, are for that kernel)."""
    kernel = ".".join((cfg.kernel.parent / "kver").read_text().split(".")[:2])
    return subprocess.run([str(ROOT / "run-vm.sh"), "--qemu", cfg.qemu, "--kernel", kernel, *args],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def still_running(procs: list[dict]) -> list[str]:
    """The lab's processes (pid and start time, from lab.json) still running."""
    left = []
    for p in procs:
        try:
            stat = Path(f"/proc/{p['pid']}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[19]) == p["start"]:
            left.append(f"{p.get('what', 'lab daemon')} (pid {p['pid']})")
    return left


def lab_down(lab, rundir: Path, consoles: list[Console]) -> subprocess.CompletedProcess:
    """Leaves the consoles and runs `./run-vm.sh down` for the lab in RUNDIR."""
    for c in consoles:
        c.close()
    return run_vm(lab.cfg, "down", "--dir", str(rundir), timeout=180)


def rping_numbers(text: str, prefix: str) -> list[int]:
    return [int(n) for n in re.findall(rf"^{prefix}ping data: rdma-ping-(\d+): ", text, re.M)]


def test_lab(lab):
    """./run-vm.sh up 3 --siw 1: a program from the shared directory runs vt3↔siw at the printed consoles; down leaves nothing running"""  # noqa: E501
    rundir = lab.rundir / "interactive-lab"
    share = rundir / "share"
    boot = lab.cfg.boot_timeout + 120
    t0 = time.monotonic()
    upped = run_vm(lab.cfg, "up", "3", "--siw", "1", "--dir", str(rundir), "--share", str(share), timeout=boot)
    assert upped.returncode == 0, f"up exited {upped.returncode}:\n{upped.stdout[-2000:]}\n{upped.stderr[-3000:]}"
    print(f"up returned in {time.monotonic() - t0:.0f} s:\n{upped.stdout}")
    state = json.loads((rundir / "lab.json").read_text())
    procs = [state["daemon"], *state["processes"]]
    assert sorted(p["what"] for p in state["processes"]) == ["hub", "qemu vm1", "qemu vm2", "qemu vm3",
                                                             "vt3d vm1", "vt3d vm2"], state["processes"]
    consoles: list[Console] = []
    try:
        guests = {m[0]: (m[1], m[2], m[3]) for m in re.findall(
            r"^\s+(vm\d+)\s+(vt3_0|siw0)\s+(\S+)\s+console: socat \S+ UNIX-CONNECT:(\S+)$", upped.stdout, re.M)}
        assert sorted(guests.items()) == [("vm1", ("vt3_0", "10.77.0.1", str(rundir / "vm1.console.sock"))),
                                          ("vm2", ("vt3_0", "10.77.0.2", str(rundir / "vm2.console.sock"))),
                                          ("vm3", ("siw0", "10.77.0.3", str(rundir / "vm3.console.sock")))], \
            f"up printed:\n{upped.stdout}"
        ctl = {m[1]: m[0] for m in re.findall(r"^\s+vt3d:\s+(\S+ ctl --mgmt \S+/(vm\d+)\.mgmt stats)$",
                                              upped.stdout, re.M)}
        assert sorted(ctl) == ["vm1", "vm2"], f"up printed no vt3d ctl line for each vt3 guest:\n{upped.stdout}"

        (share / "labping.sh").write_text(PROGRAM)
        vm1, vm2, vm3 = (Console(guests[n][2], n) for n in ("vm1", "vm2", "vm3"))
        consoles += [vm1, vm2, vm3]
        # One segment: the two guests vm1 did not ping while booting reach each other.
        vm2.check(f"ping -c 1 -W 10 {guests['vm3'][1]}", 30)
        # The user's program, server on the siw guest, client on a vt3 guest.
        vm3.check(f"sh /mnt/share/labping.sh server {guests['vm3'][1]} & server=$!", 10)
        # (No `exit` at a console: it would end the guest's shell.)
        vm3.check("for i in $(seq 100); do rdma res show cm_id | grep -q LISTEN && break; sleep 0.2; done; "
                  "rdma res show cm_id | grep LISTEN", 40)
        client_rc, client_console = vm1.run(f"sh /mnt/share/labping.sh client {guests['vm3'][1]}", 180)
        server_rc, server_console = vm3.run("wait $server", 60)
        client_out = (share / "vm1.client").read_text()
        server_out = (share / "vm3.server").read_text()
        assert (client_rc, server_rc) == (0, 0), (
            f"client exit {client_rc}, server exit {server_rc}\n"
            f"client:\n{client_out[-800:]}\nserver:\n{server_out[-800:]}")
        assert client_out.endswith("exit 0\n") and server_out.endswith("exit 0\n"), (client_out, server_out)
        assert rping_numbers(client_out, "") == list(range(PINGS)), client_out[-800:]
        assert rping_numbers(server_out, "server ") == list(range(PINGS)), server_out[-800:]
        # vt3d ctl as printed: vm1's vt3d carried the one connection and holds no QP now.
        stats = subprocess.run(shlex.split(ctl["vm1"].replace(" ctl ", " ctl --json ", 1)), capture_output=True,
                               text=True, timeout=30)
        assert stats.returncode == 0, stats.stderr
        counters = json.loads(stats.stdout)
        assert counters["iwarp.connections_established"] == 1 and counters["rnic.qp"] == 0, counters
    except BaseException:
        lab.failed_dirs.append(rundir)
        raise
    finally:
        downed = lab_down(lab, rundir, consoles)
    assert downed.returncode == 0, f"down exited {downed.returncode}:\n{downed.stdout}\n{downed.stderr}"
    left = still_running(procs)
    assert not left, f"still running after down: {left}"
    assert not (rundir / "lab.json").exists() and not list(rundir.glob("*.sock")) and \
        not list(rundir.glob("hub.vm*")), sorted(os.listdir(rundir))
    # The hub's closing report: each guest's MAC learnt on its own port.
    learnt = re.search(r"^learnt: (.*)$", (rundir / "hub.log").read_text(), re.M)
    assert learnt and sorted(learnt.group(1).split(", ")) == [
        f"52:54:00:77:00:0{i} on vm{i}" for i in (1, 2, 3)], (rundir / "hub.log").read_text()


def test_hub(tmp_path):
    """the lab's hub floods broadcast and unknown unicast to every other port, and a learnt MAC's frames to its port alone"""  # noqa: E501
    peers = {name: socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) for name in ("p1", "p2", "p3")}
    for name, sock in peers.items():
        sock.bind(str(tmp_path / f"{name}.peer"))
    hub = subprocess.Popen([sys.executable, "-m", "vt3lab.hub", str(tmp_path),
                            *(f"{n}={tmp_path / n}.peer" for n in peers)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert hub.stdout.readline().startswith("hub: 3 ports"), "the hub did not start"

        def mac(i: int) -> bytes:
            return bytes([0x52, 0x54, 0, 0, 0, i])

        def send(port: str, dst: bytes, src: bytes, payload: bytes) -> bytes:
            frame = dst + src + b"\x08\x00" + payload
            peers[port].sendto(frame, str(tmp_path / f"hub.{port}"))
            return frame

        def expect(frame: bytes, at: set[str]) -> None:
            """FRAME arrives at the peers of ports AT, and nothing else anywhere."""
            for name, sock in peers.items():
                sock.settimeout(10 if name in at else 0.2)
                got = []
                while True:
                    try:
                        got.append(sock.recv(65536))
                    except socket.timeout:
                        break
                    sock.settimeout(0.2)
                assert got == ([frame] if name in at else []), (
                    f"port {name} got {got}, want {frame if name in at else None}")

        expect(send("p1", b"\xff" * 6, mac(1), b"who is there"), {"p2", "p3"})
        expect(send("p2", mac(3), mac(2), b"to 3, not learnt yet"), {"p1", "p3"})
        expect(send("p3", mac(1), mac(3), b"to 1, learnt from its broadcast"), {"p1"})
        expect(send("p1", mac(3), mac(1), b"to 3, learnt by now"), {"p3"})
        peers["p2"].sendto(b"\x01" * 13, str(tmp_path / "hub.p2"))  # a runt: nowhere
        expect(b"", set())
    finally:
        hub.terminate()
        out, _ = hub.communicate(timeout=10)
    assert hub.returncode == 0 and "rx_runt 1" in out, out


def test_lab_hosts(lab):
    """./run-vm.sh up 2 --hosts 2 --fabric l2: each guest, its vt3d and QEMU on its own host (namespace), the hosts on one Ethernet segment (MTU 1500); rping -V across at the printed consoles; down leaves no process (by pid) and no namespace (by name)"""  # noqa: E501
    rundir = lab.rundir / "interactive-hosts"
    # The l2 fabric here; two_hosts (test_hosts.py) has VXLAN.
    upped = run_vm(lab.cfg, "up", "2", "--hosts", "2", "--fabric", "l2", "--dir", str(rundir),
                   timeout=lab.cfg.boot_timeout + 120)
    assert upped.returncode == 0, f"up exited {upped.returncode}:\n{upped.stdout[-2000:]}\n{upped.stderr[-3000:]}"
    state = json.loads((rundir / "lab.json").read_text())
    procs = [state["daemon"], *state["processes"]]
    hosts = state["namespaces"][1:]
    consoles: list[Console] = []
    try:
        assert (state["hosts"], state["fabric"], state["mtu"], len(hosts)) == (2, "l2", 1500, 2), state
        guests = {m[0]: (int(m[1]), m[2], m[3], m[4]) for m in re.findall(
            r"^\s+(vm\d+)\s+host (\d+) (vt3_0|siw0)\s+(\S+)\s+console: socat \S+ UNIX-CONNECT:(\S+)$",
            upped.stdout, re.M)}
        assert sorted(guests) == ["vm1", "vm2"] and [guests[n][0] for n in ("vm1", "vm2")] == [1, 2], \
            f"up printed:\n{upped.stdout}"
        # Every guest's QEMU and vt3d run in its host's namespace.
        for p in state["processes"]:
            name = p["what"].split()[-1]
            ns = hosts[guests[name][0] - 1]
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            assert str(p["pid"]) in pids, f"{p['what']} (pid {p['pid']}) is not in {ns}: {pids}"
        vm1, vm2 = (Console(guests[n][3], n) for n in ("vm1", "vm2"))
        consoles += [vm1, vm2]
        server = guests["vm1"][2]
        vm1.check(f"rping -s -a {server} -V -v -C {PINGS} > /tmp/srv.out 2>&1 & server=$!", 10)
        vm1.check("for i in $(seq 100); do rdma res show cm_id | grep -q LISTEN && break; sleep 0.2; done; "
                  "rdma res show cm_id | grep LISTEN", 40)
        client_rc, client_out = vm2.run(f"rping -c -a {server} -V -v -C {PINGS}", 180)
        server_rc, _ = vm1.run("wait $server", 60)
        server_out = vm1.check("cat /tmp/srv.out", 10)
        assert (client_rc, server_rc) == (0, 0), \
            f"client exit {client_rc}, server exit {server_rc}:\n{client_out[-800:]}"
        assert rping_numbers(client_out, "") == list(range(PINGS)), client_out[-800:]
        assert rping_numbers(server_out, "server ") == list(range(PINGS)), server_out[-800:]
    except BaseException:
        lab.failed_dirs.append(rundir)
        raise
    finally:
        downed = lab_down(lab, rundir, consoles)
    assert downed.returncode == 0, f"down exited {downed.returncode}:\n{downed.stdout}\n{downed.stderr}"
    assert "and 3 network namespaces" in downed.stdout, downed.stdout
    left = still_running(procs)
    assert not left, f"still running after down: {left}"
    ns_left = set(state["namespaces"]) & set(subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                            text=True).stdout.split())
    assert not ns_left, f"namespaces left after down: {ns_left}"
