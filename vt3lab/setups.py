"""Ready setups of vt3d processes and guests, for the lab's tests and for
anyone's pytest suite:

    Vt3Pair    two vt3 guests, each behind its own vt3d, the vt3d wired together
    Vt3Siw     a vt3 guest (a) and a siw guest (b) on a plain QEMU NIC
    Vt3SiwUdp  Vt3Siw on UDP (vt3d's udp uplink, QEMU's -netdev dgram inet)
    Vt3SiwTap  Vt3Siw on two taps in a Linux bridge (vt3d's tap uplink, QEMU's
               -netdev tap with vnet_hdr; root)
    PyverbsVt3Siw  Vt3Siw booted from the pyverbs image (python3, pyverbs and
               rdma-core's tests/: images/overlay.sh)
    Vt3Plain   a vt3 guest (a, vt3.ko loaded) beside a plain QEMU guest (b)
    SingleVt3  one vt3 guest whose uplink leads nowhere
    PoisonedVt3  a SingleVt3 whose kernel poisons freed memory (slub_debug=P)
    OneCpuVt3    a SingleVt3 on a machine of one possible CPU (maxcpus=1)
    SiwPair    two siw guests, each behind its own vt3d (the bench's anchor)
    ChaosPair  a Vt3Pair whose vt3d time a silent connection out in 4 s, and
               whose vt3d and guests can be restarted (the fault soak's)
    Segment    N guests on one Ethernet segment (a learning hub), vt3 or siw
               each, with consoles to type in and a shared host directory
               (the interactive lab of ./run-vm.sh up)
    Hosts      a Segment spread over H hosts (network namespaces, a Linux
               bridge each, joined by VXLAN: vt3lab.fabric; ./run-vm.sh up
               N --hosts H)
    TwoHosts   Hosts of 3 guests on 2 hosts: vm1 (vt3) and vm3 (siw) on
               host 1, vm2 (vt3) on host 2

A setup boots its guests in parallel; `health()` says what a scenario left
behind (objects in vt3d, processes in a guest, kernel warnings), so one
boot can serve many scenarios."""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import subprocess
import sys
from pathlib import Path

from .fabric import Fabric, FabricError
from .guest import Guest, LabConfig, Nic
from .proc import Process, wait_for
from .vt3d import Vt3d

A_IP, B_IP = "10.77.0.1", "10.77.0.2"
A_MAC, B_MAC = "52:54:00:77:00:01", "52:54:00:77:00:02"
KMOD = "/lib/modules/$(uname -r)/extra"
# Where guests mount a setup's shared host directory (Setup.share).
SHARE_MOUNT = "/mnt/share"

_serial = itertools.count(1)


class Setup:
    kind = "setup"
    # A host directory every guest mounts on SHARE_MOUNT (9p), e.g. a
    # suite's own programs: set it in a subclass or on the instance.
    share: Path | None = None

    def __init__(self, cfg: LabConfig, rundir: Path, own_dir: bool = True):
        """Files go to a new directory under RUNDIR, or (OWN_DIR false) to
        RUNDIR itself."""
        self.cfg = cfg
        # pytest-xdist workers share the run directory: gw0-01-vt3-pair, …
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        self.dir = rundir / f"{worker + '-' if worker else ''}{next(_serial):02d}-{self.kind}" if own_dir else rundir
        self.dir.mkdir(parents=True, exist_ok=not own_dir)
        self.vt3d: dict[str, Vt3d] = {}
        self.guests: dict[str, Guest] = {}
        self.processes: dict[str, Process] = {}  # others the setup runs (the lab's hub)
        self.broken = False

    # Subclasses: build() makes vt3ds and guests (not started), ready() after boot.
    def build(self) -> None:
        raise NotImplementedError

    def ready(self) -> None:
        pass

    def start(self) -> "Setup":
        try:
            self.build()
            for g in self.guests.values():
                g.start()
            for g in self.guests.values():
                g.wait_ready()
            self.ready()
        except BaseException:
            self.stop()
            raise
        return self

    def add_vt3d(self, name: str, uplink: str, mac: str, *extra: str, host: tuple[str, ...] = ()) -> Vt3d:
        d = Vt3d(self.cfg.vt3d, self.dir, name, uplink, mac, *extra, lifetime=self.cfg.lifetime,
                 chaos_override=self.cfg.chaos, host=host)
        self.vt3d[name] = d
        return d

    def add_guest(self, name: str, nic: Nic, ip: str, mac: str, kernel_args: str = "", **options) -> Guest:
        if self.share is not None and "share" not in options:
            options["share"] = self.share
            kernel_args = f"{kernel_args} vt3.share={SHARE_MOUNT}".strip()
        g = Guest(self.cfg, self.dir, name, nic, ip, mac, kernel_args, **options)
        self.guests[name] = g
        return g

    def uplink_socket(self, name: str) -> str:
        """The unix datagram socket of vt3d NAME's uplink."""
        return str(self.dir / f"{name}.up")

    def __getattr__(self, name: str):
        # setup.a, setup.b: the guests; setup.vt3a: a vt3d.
        guests = self.__dict__.get("guests", {})
        if name in guests:
            return guests[name]
        vt3d = self.__dict__.get("vt3d", {})
        if name in vt3d:
            return vt3d[name]
        raise AttributeError(name)

    def restart_guest(self, name: str) -> Guest:
        """Powers guest NAME off and boots it again with the same NIC."""
        old = self.guests[name]
        old.stop()
        n = len(list(self.dir.glob(f"{name}.console*")))
        old.console.rename(self.dir / f"{name}.console.{n}")
        new = Guest(self.cfg, self.dir, name, old.nic, old.ip, old.mac, old.kernel_args, old.share,
                    old.console_socket is not None, old.qemu_args, old.host)
        self.guests[name] = new
        new.start()
        new.wait_ready()
        return new

    # ---------------------------------------------------------- scenarios

    def mark(self) -> dict[str, tuple[int, int]]:
        """Where every guest's console is now; the fixtures keep the mark
        of the running scenario in `scenario_mark` (a scenario that makes
        kernel noise on purpose moves it on with mark_scenario())."""
        return {n: g.console_mark() for n, g in self.guests.items()}

    def mark_scenario(self) -> None:
        self.scenario_mark = self.mark()

    def health(self, mark: dict[str, tuple[int, int]], destructive: bool = False) -> list[str]:
        """What the last scenario left behind; empty when the setup is as
        it was. Leftover processes are killed. After a DESTRUCTIVE scenario
        a vt3d or guest it stopped is no problem (the setup is discarded);
        kernel trouble and leftovers in the guests that run still are."""
        problems = []
        for name, d in self.vt3d.items():
            if not d.alive():
                if not destructive:
                    problems.append(f"vt3d {name} is not running")
                continue
            held = d.wait_no_objects()
            if held:
                problems.append(f"vt3d {name} still holds {held}")
            # A connection that stopped with work waiting is vt3's bug.
            problems += [f"vt3d {name}: {line}" for line in d.new_stalls()]
        for name, g in self.guests.items():
            if not g.alive():
                if not destructive:
                    problems.append(f"guest {name} is not running")
                continue
            status = g.status()
            if status != "running":
                problems.append(f"guest {name}: QEMU says {status}")
            left = g.leftover_processes()
            if left:
                problems.append(f"guest {name}: leftover processes {sorted(left.items())}")
                g.run("kill -9 " + " ".join(map(str, left)) + " 2>/dev/null; true", 10)
            trouble = g.kernel_trouble_since(mark.get(name, (0, 0)))
            if trouble:
                problems.append(f"guest {name}: kernel trouble: {trouble[0]}")
        return problems

    def dump(self) -> str:
        """What every vt3d and guest holds (for a failure, taken at once)."""
        out = []
        for d in self.vt3d.values():
            if d.alive():
                out.append(d.dump())
        for g in self.guests.values():
            if g.alive():
                try:
                    r = g.run("rdma res show qp; rdma res show cm_id; ps; tc -s qdisc show dev eth0; "
                              "ip -s link show eth0; dmesg | grep -E 'detail 0x[1-9a-f]' | tail -n 20; "
                              "dmesg | tail -n 30", 20)
                    out.append(f"=== guest {g.name}\n{r.out}")
                    # An oops long before the failure scrolls out of dmesg's tail.
                    trouble = g.kernel_trouble_since((0, 0))
                    if trouble:
                        out.append(f"=== guest {g.name} kernel trouble (console)\n" + "\n".join(trouble[:10]))
                except Exception as e:  # a dump never hides the failure
                    out.append(f"=== guest {g.name}: {e}")
        return "\n".join(out)

    def stop(self) -> None:
        for g in self.guests.values():
            g.stop()
        for d in self.vt3d.values():
            d.stop()
        for p in self.processes.values():
            p.stop()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.dir})"


def free_udp_ports(count: int) -> list[int]:
    """COUNT UDP ports of 127.0.0.1 nobody holds now (the kernel's choice)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_device(g: Guest, device: str = "vt3_0") -> None:
    g.check(f"for i in $(seq 100); do [ -e /sys/class/infiniband/{device} ] && exit 0; sleep 0.2; done; "
            "dmesg | tail -20; exit 1", 40, f"no {device}")


def debug_vt3(g: Guest) -> None:
    """vt3.ko's dynamic debug messages into the log (for failures)."""
    g.check("grep -q ' /sys/kernel/debug debugfs ' /proc/mounts || mount -t debugfs none /sys/kernel/debug; "
            "echo 'module vt3 +p' > /sys/kernel/debug/dynamic_debug/control", 10)


class Vt3Pair(Setup):
    kind = "vt3-pair"

    def build(self) -> None:
        self.add_vt3d("vt3a", f"unix-dgram:{self.uplink_socket('vt3a')},{self.uplink_socket('vt3b')}", A_MAC)
        self.add_vt3d("vt3b", f"unix-dgram:{self.uplink_socket('vt3b')},{self.uplink_socket('vt3a')}", B_MAC)
        self.add_guest("a", self.vt3a.nic(), A_IP, A_MAC, "vt3.driver=1")
        self.add_guest("b", self.vt3b.nic(), B_IP, B_MAC, "vt3.driver=1")

    def ready(self) -> None:
        for g in (self.a, self.b):
            wait_device(g)
            debug_vt3(g)
        self.a.check(f"ping -c 2 -W 5 {B_IP}", 60)


class Vt3Siw(Setup):
    """a: vt3 (vt3.ko on vt3d's NIC); b: siw on a plain QEMU NIC."""
    kind = "vt3-siw"

    def build(self) -> None:
        self.add_vt3d("vt3a", f"unix-dgram:{self.uplink_socket('vt3a')},{self.dir / 'b.dgram'}", A_MAC)
        self.add_guest("a", self.vt3a.nic(), A_IP, A_MAC, "vt3.driver=1")
        self.add_guest("b", Nic.dgram(Path(self.uplink_socket("vt3a"))), B_IP, B_MAC, "vt3.siw=1")

    def ready(self) -> None:
        wait_device(self.a)
        debug_vt3(self.a)
        wait_device(self.b, "siw0")


class Vt3SiwUdp(Vt3Siw):
    """Vt3Siw meeting on UDP: vt3d's udp uplink, QEMU's -netdev dgram on
    inet addresses. vt3d sends with UDP GSO and receives with GRO, QEMU
    one datagram per frame (and drops what its socket cannot hold)."""
    kind = "vt3-siw-udp"

    def build(self) -> None:
        vt3d_port, qemu_port = free_udp_ports(2)
        self.add_vt3d("vt3a", f"udp:127.0.0.1:{vt3d_port},127.0.0.1:{qemu_port}", A_MAC)
        self.add_guest("a", self.vt3a.nic(), A_IP, A_MAC, "vt3.driver=1")
        self.add_guest("b", Nic.udp(qemu_port, vt3d_port), B_IP, B_MAC, "vt3.siw=1")


class Vt3SiwTap(Vt3Siw):
    """Vt3Siw meeting in a Linux bridge of its own: vt3d's tap uplink and
    QEMU's -netdev tap (vnet_hdr=on), both on taps made beforehand
    (persistent) so they are in the bridge when vt3d and QEMU attach.
    Offloads are on at both ends: vt3d coalesces its segments into TSO
    writes; the siw guest's TSO super-frames reach vt3d whole and are cut
    there. Needs root (CAP_NET_ADMIN); stop() removes the interfaces."""
    kind = "vt3-siw-tap"

    def build(self) -> None:
        # Short unique names (15 characters at most): vt<pid><n>{b,d,q}.
        stem = f"vt{os.getpid() % 100000}{next(_serial) % 100}"
        self.bridge, self.vt3d_tap, self.qemu_tap = stem + "b", stem + "d", stem + "q"
        self.links: list[str] = []
        ip("link", "add", self.bridge, "type", "bridge")
        self.links.append(self.bridge)
        for tap in (self.vt3d_tap, self.qemu_tap):
            ip("tuntap", "add", "dev", tap, "mode", "tap")
            self.links.append(tap)
            ip("link", "set", tap, "master", self.bridge)
        for link in self.links:
            ip("link", "set", link, "up")
        self.add_vt3d("vt3a", f"tap:{self.vt3d_tap}", A_MAC)
        self.add_guest("a", self.vt3a.nic(), A_IP, A_MAC, "vt3.driver=1")
        self.add_guest("b", Nic.tap(self.qemu_tap), B_IP, B_MAC, "vt3.siw=1")

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            for link in reversed(getattr(self, "links", [])):
                subprocess.run(["ip", "link", "del", link], capture_output=True)


def ip(*args: str) -> None:
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")


class PyverbsVt3Siw(Vt3Siw):
    """Vt3Siw whose guests boot initramfs-pyverbs.cpio: the vt3 image
    with python3, pyverbs and rdma-core's tests/ (images/overlay.sh), ~30 MB
    that no other setup needs to unpack."""
    kind = "pyverbs-vt3-siw"

    def __init__(self, cfg: LabConfig, rundir: Path):
        initrd = cfg.initrd.with_name("initramfs-pyverbs.cpio")
        if not initrd.exists():
            raise RuntimeError(f"{initrd} is missing: run the tests through ./run-vm.sh (images/overlay.sh builds it)")
        super().__init__(dataclasses.replace(cfg, initrd=initrd), rundir)


class Vt3Plain(Setup):
    """a: vt3 guest with vt3.ko, vt3d carrying up to 9000-byte MTUs; b: a
    plain QEMU guest on the same segment."""
    kind = "vt3-plain"
    vt3d_args: tuple[str, ...] = ("--mtu", "9000")

    def build(self) -> None:
        self.add_vt3d("vt3a", f"unix-dgram:{self.uplink_socket('vt3a')},{self.dir / 'b.dgram'}", A_MAC, *self.vt3d_args)
        self.add_guest("a", self.vt3a.nic(), A_IP, A_MAC, "vt3.driver=1")
        self.add_guest("b", Nic.dgram(Path(self.uplink_socket("vt3a"))), B_IP, B_MAC)

    def ready(self) -> None:
        wait_device(self.a)


class SingleVt3(Setup):
    """One vt3 guest with vt3.ko; its uplink leads nowhere."""
    kind = "single-vt3"

    def build(self) -> None:
        self.add_vt3d("vt3a", f"unix-dgram:{self.uplink_socket('vt3a')},{self.dir / 'nobody.dgram'}", A_MAC)
        self.add_guest("a", self.vt3a.nic(), A_IP, A_MAC, "vt3.driver=1")

    def ready(self) -> None:
        wait_device(self.a)


class PoisonedVt3(SingleVt3):
    """SingleVt3 whose guest kernel poisons freed slab objects (slub_debug=P):
    a use after free reads 0x6b…, which a pointer or lock in it turns into
    an oops, and a write into a freed object is reported at its next
    allocation (Debian's kernel has no KASAN; this is the nearest)."""
    kind = "poisoned-vt3"

    def build(self) -> None:
        super().build()
        self.a.kernel_args += " slub_debug=P"


class OneCpuVt3(SingleVt3):
    """SingleVt3 on a machine of one possible CPU (maxcpus=1): under TCG
    the guest's atomics and fences are then plain accesses to vt3d
    (tests/system/test_platform.py shows what that breaks)."""
    kind = "one-cpu-vt3"

    def build(self) -> None:
        super().build()
        self.a.max_cpus = 1


class SiwPair(Vt3Pair):
    """Two siw guests, each behind its own vt3d (vt3d only as their NIC)."""
    kind = "siw-pair"

    def build(self) -> None:
        super().build()
        for g in self.guests.values():
            g.kernel_args = "vt3.siw=1"

    def ready(self) -> None:
        for g in (self.a, self.b):
            wait_device(g, "siw0")
        self.a.check(f"ping -c 2 -W 5 {B_IP}", 60)


# ChaosPair's vt3d --tcp-timeout: a blackhole ends in seconds, not 15.
SHORT_TCP_TIMEOUT = 4


class ChaosPair(Vt3Pair):
    """Vt3Pair with a short TCP timeout in both vt3d; a vt3d and its guest
    can be restarted (after a fault killed the vt3d)."""
    kind = "chaos-pair"

    def vt3d_args(self, name: str) -> tuple[str, ...]:
        peer = "vt3b" if name == "vt3a" else "vt3a"
        mac = A_MAC if name == "vt3a" else B_MAC
        return (name, f"unix-dgram:{self.uplink_socket(name)},{self.uplink_socket(peer)}", mac,
                "--tcp-timeout", str(SHORT_TCP_TIMEOUT))

    def build(self) -> None:
        for name in ("vt3a", "vt3b"):
            self.add_vt3d(*self.vt3d_args(name))
        self.add_guest("a", self.vt3a.nic(), A_IP, A_MAC, "vt3.driver=1")
        self.add_guest("b", self.vt3b.nic(), B_IP, B_MAC, "vt3.driver=1")

    def restart(self, guest: str) -> None:
        """A new vt3d behind GUEST and a fresh boot of GUEST (QEMU loses
        its vhost-user backend for good when vt3d dies)."""
        name = "vt3" + guest
        old = self.vt3d.pop(name, None)
        if old is not None:
            old.stop()
        self.add_vt3d(*self.vt3d_args(name))
        g = self.restart_guest(guest)
        wait_device(g)
        debug_vt3(g)
        self.a.check(f"ping -c 2 -W 5 {self.b.ip}", 60)


# Beyond this many guests the 10.77.0.0/24 addresses and MACs would still
# do, but not the host: each TCG guest takes a core while it boots.
SEGMENT_MAX = 16


def segment_ip(i: int) -> str:
    return f"10.77.0.{i}"


def segment_mac(i: int) -> str:
    return f"52:54:00:77:00:{i:02x}"


class Segment(Setup):
    """N guests vm1…vmN on one Ethernet segment: a learning hub
    (vt3lab/hub.py) between their uplinks. The first N-SIW each have a vt3
    NIC (vt3.ko) behind their own vt3d, whose unix-dgram uplink is a hub
    port; the last SIW have siw on a plain QEMU NIC whose -netdev dgram is
    a hub port. Every console is a socket to type in, and SHARE (a host
    directory) is mounted on SHARE_MOUNT in every guest."""
    kind = "segment"

    def __init__(self, cfg: LabConfig, rundir: Path, n: int, siw: int = 0, share: Path | None = None,
                 own_dir: bool = True):
        if not 1 <= n <= SEGMENT_MAX or not 0 <= siw <= n:
            raise ValueError(f"a segment has 1..{SEGMENT_MAX} guests, of which 0..N are siw (got {n}, siw {siw})")
        super().__init__(cfg, rundir, own_dir)
        self.n, self.siw = n, siw
        self.share = share

    def build(self) -> None:
        hub_ports = {}
        for i in range(1, self.n + 1):
            name = f"vm{i}"
            hub_port = str(self.dir / f"hub.{name}")
            args = "vt3.shell=1"
            options = {"console_socket": True}
            if i <= self.n - self.siw:
                d = self.add_vt3d(name, f"unix-dgram:{self.uplink_socket(name)},{hub_port}", segment_mac(i))
                self.add_guest(name, d.nic(), segment_ip(i), segment_mac(i), f"vt3.driver=1 {args}",
                               **options)
                hub_ports[name] = self.uplink_socket(name)
            else:
                self.add_guest(name, Nic.dgram(Path(hub_port)), segment_ip(i), segment_mac(i), f"vt3.siw=1 {args}",
                               **options)
                hub_ports[name] = str(self.dir / f"{name}.dgram")
        # The hub imports vt3lab from where this process did (a checkout,
        # site-packages or a wheel).
        package_path = str(Path(__file__).resolve().parents[1])
        hub = Process("hub", [sys.executable, "-m", "vt3lab.hub", str(self.dir),
                              *(f"{k}={v}" for k, v in hub_ports.items())],
                      self.dir / "hub.log", self.cfg.lifetime, env={"PYTHONPATH": package_path})
        self.processes["hub"] = hub
        if not wait_for(lambda: all((self.dir / f"hub.{k}").exists() for k in hub_ports) or not hub.alive(), 10):
            raise RuntimeError(f"the hub made no sockets within 10 s: {(self.dir / 'hub.log').read_text()[-500:]}")
        if not hub.alive():
            raise RuntimeError(f"the hub exited: {(self.dir / 'hub.log').read_text()[-500:]}")

    def device(self, g: Guest) -> str:
        return "vt3_0" if g.name in self.vt3d else "siw0"

    def ready(self) -> None:
        for g in self.guests.values():
            wait_device(g, self.device(g))
        first, *others = self.guests.values()
        for g in others:
            first.check(f"ping -c 1 -W 10 {g.ip}", 30,
                        f"{first.name} cannot reach {g.name} ({g.ip}) through the hub")


class Hosts(Segment):
    """A Segment over HOSTS hosts (vt3lab.fabric: network namespaces,
    each with a Linux bridge, joined by VXLAN or, FABRIC "l2", by one
    Ethernet segment). Guest vmI lives on host ((I-1) mod HOSTS) + 1: its
    vt3d and QEMU run there, vt3d's tap uplink (vnet header, offloads) in
    that host's bridge, or a siw guest's QEMU on a tap of its own. vt3d
    (--mtu) and every guest (vt3.mtu) get the MTU the fabric leaves.
    TCP_TIMEOUT: vt3d's --tcp-timeout. Root only; stop() removes the
    namespaces and all in them, and fails (FabricError) naming what it
    could not remove (also in `left`)."""
    kind = "hosts"

    def __init__(self, cfg: LabConfig, rundir: Path, n: int, siw: int = 0, hosts: int = 2, fabric: str = "vxlan",
                 share: Path | None = None, own_dir: bool = True, tcp_timeout: int | None = None):
        super().__init__(cfg, rundir, n, siw, share, own_dir)
        self.fabric = Fabric(hosts, fabric)
        self.tcp_timeout = tcp_timeout
        self.host_of: dict[str, int] = {}
        self.left: list[str] = []

    def build(self) -> None:
        f = self.fabric
        f.create()
        timeout = ("--tcp-timeout", str(self.tcp_timeout)) if self.tcp_timeout else ()
        for i in range(1, self.n + 1):
            name = f"vm{i}"
            h = self.host_of[name] = (i - 1) % f.hosts + 1
            tap = f.add_tap(h, f"tap-{name}")
            host = tuple(f.exec_prefix(h))
            args = f"vt3.shell=1 vt3.mtu={f.mtu}"
            if i <= self.n - self.siw:
                d = self.add_vt3d(name, f"tap:{tap}", segment_mac(i), "--mtu", str(f.mtu), *timeout, host=host)
                self.add_guest(name, d.nic(), segment_ip(i), segment_mac(i), f"vt3.driver=1 {args}",
                               console_socket=True, host=host)
            else:
                self.add_guest(name, Nic.tap(tap), segment_ip(i), segment_mac(i), f"vt3.siw=1 {args}",
                               console_socket=True, host=host)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            self.left = self.fabric.destroy()
        if self.left:
            raise FabricError(f"{self}: left behind after the stop: {'; '.join(self.left)}")


class TwoHosts(Hosts):
    """Hosts: vm1 (vt3) and vm3 (siw) on host 1, vm2 (vt3) on host 2,
    joined by VXLAN (MTU 1450); vt3d times a silent connection out in
    HOSTS_TCP_TIMEOUT seconds."""
    kind = "two-hosts"

    def __init__(self, cfg: LabConfig, rundir: Path):
        super().__init__(cfg, rundir, 3, siw=1, hosts=2, tcp_timeout=HOSTS_TCP_TIMEOUT)


# TwoHosts' vt3d --tcp-timeout: a fabric outage longer than this ends
# the connections, a shorter one is retransmitted over.
HOSTS_TCP_TIMEOUT = 6


SETUPS = {cls.kind: cls for cls in (Vt3Pair, Vt3Siw, PyverbsVt3Siw, Vt3Plain, SingleVt3, PoisonedVt3, OneCpuVt3,
                                    SiwPair, ChaosPair, TwoHosts)}
