"""Hosts for the lab: network namespaces that stand for machines.

Each host is a namespace STEM-hI with a Linux bridge br0 that its guests'
taps join (a vt3 guest's vt3d opens its tap with a vnet header; a siw
guest's QEMU opens its own). The hosts reach each other through an
underlay: the namespace STEM-net holds a bridge (the hosts' switch) with
one veth to each host, whose end in the host is eth0 with 192.168.77.I/24.

    vxlan (default)  br0 carries its guests' frames to the other hosts in
                     VXLAN (VNI 77, UDP 4789) over eth0: vx0 is a port of
                     br0, with one all-zeros FDB entry per other host (head-
                     end replication, learning on). VXLAN over IPv4 takes
                     50 octets, so the guests and vt3d get MTU 1450.
    l2               eth0 itself is a port of br0 (one Ethernet segment
                     across the hosts, MTU 1500): the comparison.

These are the commands a real host runs (docs/hosts.md), each in its own
namespace (nsenter --net). Nothing here outlives the lab: `destroy()` kills whatever still
runs in the namespaces, deletes them (and with them every bridge, tap,
veth and VXLAN device) and says what, if anything, it could not remove. A
fabric whose owner died (the stem holds the owner's pid) is swept by the
next one made on the machine."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

STEM_PREFIX = "vt3f"
STEM = re.compile(rf"^{STEM_PREFIX}(\d+)x\d+-")
UNDERLAY = "192.168.77"
VXLAN_ID, VXLAN_PORT = 77, 4789
# Outer Ethernet 14 + IPv4 20 + UDP 8 + VXLAN 8 (the inner Ethernet
# header is not counted in an MTU).
VXLAN_OVERHEAD = 50
UNDERLAY_MTU = 1500
FABRICS = ("vxlan", "l2")
BRIDGE = "br0"
# Where `ip netns add` keeps its namespaces.
NETNS_DIR = "/run/netns"
MAX_HOSTS = 16

_serial = itertools.count(1)


class FabricError(RuntimeError):
    pass


def in_netns(ns: str) -> list[str]:
    """What runs a command in network namespace NS. nsenter enters the
    network namespace alone; `ip -n` and `ip netns exec` also make a mount
    namespace and remount /sys, which fails in a chroot (its / is no mount
    point) and which neither vt3d nor QEMU needs: a tap is found in the
    network namespace of the process that opens it."""
    return ["nsenter", f"--net={NETNS_DIR}/{ns}"]


def ip(*args: str, ns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    argv = [*(in_netns(ns) if ns else []), "ip", *args]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and r.returncode != 0:
        raise FabricError(f"{' '.join(argv)}: {r.stderr.strip()}")
    return r


def namespaces() -> list[str]:
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    return [line.split()[0] for line in r.stdout.splitlines() if line.strip()]


def pids_in(ns: str) -> list[int]:
    r = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def remove_namespace(ns: str) -> None:
    """Kills what runs in NS (it is the lab's by its name), then deletes
    it: the interfaces in it go with it."""
    for _ in range(50):
        pids = pids_in(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.1)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def sweep_stale() -> list[str]:
    """Removes the namespaces of fabrics whose owner is gone; their names."""
    stale = [ns for ns in namespaces()
             if (m := STEM.match(ns)) and not Path(f"/proc/{m.group(1)}").exists()]
    for ns in stale:
        remove_namespace(ns)
    return stale


class Fabric:
    def __init__(self, hosts: int, kind: str = "vxlan"):
        if kind not in FABRICS:
            raise FabricError(f"fabric {kind!r}: one of {', '.join(FABRICS)}")
        if not 1 <= hosts <= MAX_HOSTS:
            raise FabricError(f"{hosts} hosts: 1..{MAX_HOSTS}")
        if os.geteuid() != 0:
            raise FabricError("hosts as network namespaces need root (CAP_NET_ADMIN, CAP_SYS_ADMIN)")
        self.hosts, self.kind = hosts, kind
        self.stem = f"{STEM_PREFIX}{os.getpid()}x{next(_serial)}"
        self.net = f"{self.stem}-net"
        self.mtu = UNDERLAY_MTU - VXLAN_OVERHEAD if kind == "vxlan" else UNDERLAY_MTU
        self.made: list[str] = []

    def host(self, i: int) -> str:
        """Host I's namespace (1-based)."""
        if not 1 <= i <= self.hosts:
            raise FabricError(f"no host {i} (1..{self.hosts})")
        return f"{self.stem}-h{i}"

    def underlay_ip(self, i: int) -> str:
        return f"{UNDERLAY}.{i}"

    @property
    def uplink(self) -> str:
        """The device by which a host's bridge reaches the others."""
        return "vx0" if self.kind == "vxlan" else "eth0"

    def namespaces(self) -> list[str]:
        return [self.net, *(self.host(i) for i in range(1, self.hosts + 1))]

    def create(self) -> "Fabric":
        sweep_stale()
        try:
            self._create()
        except BaseException:
            self.destroy()
            raise
        return self

    def _create(self) -> None:
        for ns in self.namespaces():
            ip("netns", "add", ns)
            self.made.append(ns)
            ip("link", "set", "lo", "up", ns=ns)
        ip("link", "add", "sw", "type", "bridge", ns=self.net)
        ip("link", "set", "sw", "up", ns=self.net)
        for i in range(1, self.hosts + 1):
            h = self.host(i)
            ip("link", "add", f"h{i}", "mtu", str(UNDERLAY_MTU), "type", "veth", "peer", "name", "eth0",
               "netns", h, ns=self.net)
            ip("link", "set", f"h{i}", "master", "sw", "up", ns=self.net)
            ip("link", "set", "eth0", "mtu", str(UNDERLAY_MTU), ns=h)
            ip("link", "add", BRIDGE, "mtu", str(self.mtu), "type", "bridge", ns=h)
            if self.kind == "vxlan":
                ip("addr", "add", f"{self.underlay_ip(i)}/24", "dev", "eth0", ns=h)
                ip("link", "add", "vx0", "mtu", str(self.mtu), "type", "vxlan", "id", str(VXLAN_ID),
                   "dstport", str(VXLAN_PORT), "local", self.underlay_ip(i), "dev", "eth0", ns=h)
                for j in range(1, self.hosts + 1):
                    if j != i:
                        r = subprocess.run([*in_netns(h), "bridge", "fdb", "append", "00:00:00:00:00:00", "dev",
                                            "vx0", "dst", self.underlay_ip(j)],
                                           capture_output=True, text=True, timeout=30)
                        if r.returncode != 0:
                            raise FabricError(f"bridge fdb append (host {i} → {j}): {r.stderr.strip()}")
            ip("link", "set", self.uplink, "master", BRIDGE, ns=h)
            for dev in ("eth0", self.uplink, BRIDGE):
                ip("link", "set", dev, "up", ns=h)

    def add_tap(self, i: int, name: str) -> str:
        """A persistent tap NAME in host I's bridge, at the fabric's MTU
        (vt3d or QEMU attaches to it with a vnet header)."""
        h = self.host(i)
        ip("tuntap", "add", "dev", name, "mode", "tap", ns=h)
        ip("link", "set", name, "mtu", str(self.mtu), "master", BRIDGE, "up", ns=h)
        return name

    def exec_prefix(self, i: int) -> list[str]:
        """What runs a command in host I."""
        return in_netns(self.host(i))

    def set_uplink(self, i: int, up: bool) -> None:
        """Host I's way to the others down (every frame it would send or
        receive across is lost) or up again."""
        ip("link", "set", self.uplink, "up" if up else "down", ns=self.host(i))

    def link_stats(self, i: int, dev: str) -> dict:
        """`ip -s link` of DEV in host I: rx/tx packets, bytes, errors, dropped."""
        r = ip("-s", "-j", "link", "show", "dev", dev, ns=self.host(i))
        info = json.loads(r.stdout)[0]
        return {"mtu": info["mtu"], **{f"rx_{k}": v for k, v in info["stats64"]["rx"].items()},
                **{f"tx_{k}": v for k, v in info["stats64"]["tx"].items()}}

    def leftovers(self) -> list[str]:
        """What of this fabric is still there: namespaces, and processes in them."""
        left = []
        present = set(namespaces())
        for ns in self.namespaces():
            if ns in present:
                pids = pids_in(ns)
                left.append(f"namespace {ns}" + (f" (pids {pids})" if pids else ""))
        return left

    def destroy(self) -> list[str]:
        """Removes every namespace made (and all in them); what is left."""
        for ns in reversed(self.made):
            remove_namespace(ns)
        self.made = []
        return self.leftovers()

    def __repr__(self) -> str:
        return f"Fabric({self.stem}, {self.hosts} hosts, {self.kind}, mtu {self.mtu})"
