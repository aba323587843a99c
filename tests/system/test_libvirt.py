"""vt3 under libvirt: two domains defined from the user guide's XML
(docs/user-guide.md, section "libvirt": <interface type='vhostuser'> on
a vt3d's socket, memfd shared memory, the guest's key as the firmware
configuration file opt/vt3/key (<sysinfo type='fwcfg'>), direct kernel
boot of the lab's image) and started by a libvirtd the case runs itself,
rping between them with the data verified, then the domains destroyed
and libvirtd stopped, nothing left running.

The libvirtd is a session instance run as `nobody`, its configuration,
runtime and state under the case's run directory: the machine's libvirt
setup is neither used nor changed, and QEMU runs as nobody."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from contextlib import contextmanager
from pathlib import Path

from vt3lab import A_IP, A_MAC, B_IP, B_MAC, Guest, GuestDead, Vt3d
from vt3lab.guest import FW_CFG_KEY, fw_cfg_key_args
from vt3lab.interactive import start_time
from vt3lab.proc import Process, wait_for
from vt3lab.setups import wait_device
from vt3lab.tools import rping_between

ROOT = Path(__file__).resolve().parents[2]
QEMU_NS = "http://libvirt.org/schemas/domain/qemu/1.0"
PINGS = 10
USER = pwd.getpwnam("nobody")

# What the user guide's XML names, and what each domain of the case has instead.
README_GUEST = {"name": "<name>vt3-a</name>", "emulator": "<emulator>/usr/bin/qemu-system-x86_64</emulator>",
                "kernel": "<kernel>/var/cache/vt3/images/vmlinux</kernel>",
                "initrd": "<initrd>/var/cache/vt3/images/initramfs-vt3.cpio</initrd>",
                "args": "vt3.name=a vt3.ip=10.77.0.1/24", "mac": "<mac address='52:54:00:77:00:01'/>",
                "socket": "path='/run/vt3/a.sock'", "key": "file='/run/vt3/a.key'"}


def readme_xml() -> str:
    """The fenced xml block of docs/user-guide.md's "### libvirt" section."""
    text = (ROOT / "docs" / "user-guide.md").read_text()
    _, found, section = text.partition("\n### libvirt\n")
    assert found, "docs/user-guide.md has no '### libvirt' section"
    m = re.search(r"^```xml\n(.*?)^```", section.split("\n## ", 1)[0], re.S | re.M)
    assert m, "docs/user-guide.md's libvirt section has no ```xml block"
    return m.group(1)


def domain_xml(template: str, g: Guest, vhost: Path, accel: str) -> str:
    """The user guide's domain for guest G: its name, QEMU, kernel and image,
    address, MAC, vt3d socket and key file; the guide's pty console
    replaced by the harness's two serial ports (ttyS0 to a file, ttyS1 the
    command agent)."""
    cfg = g.cfg
    new = {"name": f"<name>vt3-{g.name}</name>", "emulator": f"<emulator>{cfg.qemu}</emulator>",
           "kernel": f"<kernel>{cfg.kernel}</kernel>", "initrd": f"<initrd>{cfg.initrd}</initrd>",
           "args": f"vt3.name={g.name} vt3.ip={g.ip}/24", "mac": f"<mac address='{g.mac}'/>",
           "socket": f"path='{vhost}'", "key": f"file='{g.nic.key_file}'"}
    for key, old in README_GUEST.items():
        assert template.count(old) == 1, f"the user guide's libvirt XML has {template.count(old)} × {old!r}, want 1"
        template = template.replace(old, new[key])
    ET.register_namespace("qemu", QEMU_NS)
    root = ET.fromstring(template)
    argv = g.qemu_argv()
    assert root.findtext("os/cmdline") == argv[argv.index("-append") + 1], \
        "the user guide's libvirt XML boots with other kernel arguments than the lab's guests"
    entries = [(e.get("name"), e.get("file")) for s in root.findall("sysinfo") if s.get("type") == "fwcfg"
               for e in s.findall("entry")]
    assert entries == [(FW_CFG_KEY, str(g.nic.key_file))], \
        f"the user guide's libvirt XML gives the guest {entries} as firmware configuration files, " \
        f"want the key: <sysinfo type='fwcfg'><entry name='{FW_CFG_KEY}' file='…'/></sysinfo>"
    # Without <acpi/> libvirt starts QEMU with -no-acpi: the guest kernel's
    # qemu_fw_cfg finds the device through ACPI (QEMU0002) only, and then
    # shows no key (seen: vt3.ko's "no key … (-ENOENT)").
    assert root.find("features/acpi") is not None, \
        "the user guide's libvirt XML has no <features><acpi/></features>: the guest would not see its key"
    if accel == "kvm":
        root.set("type", "kvm")
    devices = root.find("devices")
    for tag in ("serial", "console"):
        for e in devices.findall(tag):
            devices.remove(e)
    console = ET.SubElement(devices, "serial", type="file")
    ET.SubElement(console, "source", path=str(g.console))
    ET.SubElement(console, "target", port="0")
    agent = ET.SubElement(devices, "serial", type="unix")
    ET.SubElement(agent, "source", mode="bind", path=str(g.agent_path))
    ET.SubElement(agent, "target", port="1")
    return ET.tostring(root, encoding="unicode")


class DomainGuest(Guest):
    """A guest libvirt runs: no QEMU of ours; the agent on the domain's
    second serial port; alive while libvirt's QEMU process (its pid file)."""

    def __init__(self, *args, pidfile: Path, **kw):
        super().__init__(*args, **kw)
        self.pidfile = pidfile
        self.qemu: dict | None = None  # pid and start time, once running

    def start(self) -> "DomainGuest":
        if not wait_for(lambda: self.agent_path.exists() and self.pidfile.exists(), 30):
            raise GuestDead(self, "libvirt's QEMU made no agent socket or pid file")
        pid = int(self.pidfile.read_text())
        self.qemu = {"pid": pid, "start": start_time(pid)}
        self.attach_agent()
        return self

    def alive(self) -> bool:
        if self.qemu is None or self.qemu["start"] is None:
            return False
        return start_time(self.qemu["pid"]) == self.qemu["start"]

    def stop(self) -> None:
        if self.sock:
            self.sock.close()
            self.sock = None


class Libvirtd:
    """libvirtd in session mode as USER, every directory under BASE."""

    def __init__(self, base: Path, lifetime: float):
        self.base = base
        dirs = {k: base / k for k in ("config", "runtime", "cache", "data", "home")}
        (dirs["config"] / "libvirt").mkdir(parents=True)
        for d in dirs.values():
            d.mkdir(exist_ok=True)
        # QEMU's stdout/stderr to a file: no virtlogd.
        (dirs["config"] / "libvirt" / "qemu.conf").write_text('stdio_handler = "file"\n')
        for d in (base, *dirs.values(), dirs["config"] / "libvirt"):
            os.chown(d, USER.pw_uid, USER.pw_gid)
        os.chmod(dirs["runtime"], 0o700)
        self.env = {"HOME": str(dirs["home"]), "XDG_CONFIG_HOME": str(dirs["config"]),
                    "XDG_RUNTIME_DIR": str(dirs["runtime"]), "XDG_CACHE_HOME": str(dirs["cache"]),
                    "XDG_DATA_HOME": str(dirs["data"])}
        self.socket = dirs["runtime"] / "libvirt" / "libvirt-sock"
        self.qemu_run = dirs["runtime"] / "libvirt" / "qemu" / "run"
        self.log_dir = dirs["cache"] / "libvirt" / "qemu" / "log"
        binary = shutil.which("libvirtd", path=f"{os.environ.get('PATH', '')}:/usr/sbin")
        assert binary, "no libvirtd (Debian's libvirt-daemon; run-vm.sh installs it)"
        self.proc = Process("libvirtd", ["setpriv", f"--reuid={USER.pw_uid}", f"--regid={USER.pw_gid}",
                                         "--clear-groups", binary], base / "libvirtd.log", lifetime, env=self.env)
        if not wait_for(lambda: self.socket.exists() or not self.proc.alive(), 30):
            raise AssertionError(f"libvirtd made no socket within 30 s:\n{self.log_tail()}")
        assert self.proc.alive(), f"libvirtd exited:\n{self.log_tail()}"

    def log_tail(self) -> str:
        return "\n".join((self.base / "libvirtd.log").read_text(errors="replace").splitlines()[-20:])

    def virsh(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        # Through the socket: never a daemon of its own (no autostart).
        return subprocess.run(["virsh", "-c", f"qemu:///session?socket={self.socket}", *args],
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **self.env, "LIBVIRT_AUTOSTART": "0"})

    def check(self, *args: str, timeout: float = 120) -> str:
        r = self.virsh(*args, timeout=timeout)
        assert r.returncode == 0, f"virsh {' '.join(args)}: exit {r.returncode}: {r.stderr.strip()}\n" \
                                  f"--- libvirtd ---\n{self.log_tail()}\n--- QEMU ---\n{self.qemu_logs()}"
        return r.stdout

    def qemu_logs(self) -> str:
        return "\n".join(f"{f.name}: " + "\n".join(f.read_text(errors="replace").splitlines()[-8:])
                         for f in sorted(self.log_dir.glob("*.log")))

    def stop(self) -> int | None:
        return self.proc.stop(grace=15)


@contextmanager
def domains(lab, base: Path):
    """Two vt3d wired together and libvirtd; the two guests once their
    domains are defined and started from the user guide's XML."""
    cfg = lab.cfg
    vt3d = {n: Vt3d(cfg.vt3d, base, f"vt3{n}", f"unix-dgram:{base / f'vt3{n}.up'},{base / f'vt3{p}.up'}", mac)
            for n, p, mac in (("a", "b", A_MAC), ("b", "a", B_MAC))}
    libvirtd = guests = None
    try:
        for d in vt3d.values():  # QEMU runs as nobody: it connects to the socket, reads the key
            os.chown(d.socket, USER.pw_uid, USER.pw_gid)
            os.chown(d.key_file, USER.pw_uid, USER.pw_gid)
        libvirtd = Libvirtd(base, cfg.lifetime)
        template = readme_xml()
        guests = {n: DomainGuest(cfg, base, n, vt3d[n].nic(), ip, mac, "vt3.driver=1",
                                 pidfile=libvirtd.qemu_run / f"vt3-{n}.pid")
                  for n, ip, mac in (("a", A_IP, A_MAC), ("b", B_IP, B_MAC))}
        for n, g in guests.items():
            xml = base / f"vt3-{n}.xml"
            xml.write_text(domain_xml(template, g, vt3d[n].socket, cfg.accel))
            libvirtd.check("define", str(xml))
            libvirtd.check("start", f"vt3-{n}")
        for g in guests.values():
            g.start()
            # libvirt's QEMU got the key as the lab's QEMU does.
            argv = Path(f"/proc/{g.qemu['pid']}/cmdline").read_bytes().decode().split("\0")
            want = fw_cfg_key_args(g.nic.key_file)
            assert any(argv[i:i + 2] == want for i in range(len(argv))), \
                f"libvirt's QEMU for vt3-{g.name} has no {' '.join(want)}: {' '.join(argv)}"
        yield guests, vt3d
    except BaseException:
        lab.failed_dirs.append(base)
        raise
    finally:
        leftovers = []
        if libvirtd is not None:
            for n in ("a", "b"):
                libvirtd.virsh("destroy", f"vt3-{n}")
                libvirtd.virsh("undefine", f"vt3-{n}")
            for g in (guests or {}).values():
                g.stop()
                if g.alive():
                    leftovers.append(f"QEMU of vt3-{g.name} (pid {g.qemu['pid']})")
                    os.kill(g.qemu["pid"], 9)
            if libvirtd.stop() is None:
                leftovers.append("libvirtd")
        for d in vt3d.values():
            d.stop()
        assert not leftovers, f"still running after destroy and libvirtd's stop: {leftovers}"


def test_libvirt(lab):
    """two libvirt domains from docs/user-guide.md's vhostuser and fwcfg-key XML: rping between them, data verified"""
    base = lab.rundir / "libvirt"
    base.mkdir(parents=True)
    with domains(lab, base) as (guests, vt3d):
        a, b = guests["a"], guests["b"]
        for g in (a, b):
            g.wait_ready()
            assert g.fw_cfg_key() == vt3d[g.name].key(), f"vt3-{g.name} has not its vt3d's key (<sysinfo type='fwcfg'>)"
            wait_device(g)
        a.check(f"ping -c 2 -W 5 {b.ip}", 60, "the domains do not reach each other through their vt3d")
        rping_between(b, a, PINGS)
        for name, d in vt3d.items():
            assert d.stats()["iwarp.connections_established"] == 1, f"vt3d {name} did not carry the one connection"
            assert d.wait_no_objects() == {}, f"vt3d {name} still holds objects"
