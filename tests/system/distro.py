"""vt3's own test of a real distribution guest: the Debian 12 disk image of
images/distro/build.sh (systemd, udev, Debian's kernel; vt3 installed from
its packages), driven through the same agent as the busybox guests (a
systemd unit in the image runs it on the second serial port).

    DistroPair   a: the Debian guest behind vt3a; b: a busybox vt3 guest
                 behind vt3b, the two vt3d wired together
"""

from __future__ import annotations

import os
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

from vt3lab.guest import Guest, LabConfig, Nic
from vt3lab.setups import A_IP, A_MAC, B_IP, B_MAC, Setup, wait_device

REPO = Path(__file__).resolve().parents[2]
# The normal user of the image (images/distro/build.sh, GUEST_USER).
GUEST_USER = "vt3user"
# A cold image build (rdma-core .debs, mmdebstrap) takes many minutes.
IMAGE_BUILD_TIMEOUT = 3600


def build_distro_image(log: Path) -> Path:
    """Runs images/distro/build.sh (cached: seconds when nothing changed);
    returns the directory with disk.qcow2, vmlinuz and initrd.img."""
    args = [str(REPO / "images/distro/build.sh")]
    if os.environ.get("VT3_DISTRO_IMAGE"):
        args += ["--out", os.environ["VT3_DISTRO_IMAGE"]]
    with open(log, "w") as err:
        r = subprocess.run(args, stdout=subprocess.PIPE, stderr=err, text=True, timeout=IMAGE_BUILD_TIMEOUT)
    if r.returncode != 0:
        raise RuntimeError(f"images/distro/build.sh failed (exit {r.returncode}):\n"
                           + "\n".join(log.read_text(errors="replace").splitlines()[-20:]))
    return Path(r.stdout.strip().splitlines()[-1])


class DistroGuest(Guest):
    """The Debian guest: its own kernel and initrd (copies of the disk's
    /boot files) booted directly, root=/dev/vda on a throw-away snapshot
    of the disk. Its address comes from the image's own systemd-networkd
    configuration (10.77.0.1), not from the kernel command line."""

    # The processes in the agent's service (commands and what they left
    # behind): systemd's own services come and go.
    PROCESS_LISTING = ('for p in /proc/[0-9]*; do read -r g < $p/cgroup && case $g in *vt3-agent.service*) '
                       'read -r c < $p/comm && echo ${p#/proc/} $c;; esac; done 2>/dev/null; true')

    def __init__(self, cfg: LabConfig, workdir: Path, name: str, nic: Nic, ip: str, mac: str, image: Path):
        # systemd's boot under TCG takes minutes on a loaded host.
        cfg = replace(cfg, kernel=image / "vmlinuz", initrd=image / "initrd.img", memory="1G",
                      boot_timeout=max(cfg.boot_timeout, 600))
        super().__init__(cfg, workdir, name, nic, ip, mac)
        self.disk = image / "disk.qcow2"

    def qemu_argv(self) -> list[str]:
        args = super().qemu_argv()
        args[args.index("-append") + 1] = "console=ttyS0 root=/dev/vda rw panic=-1 loglevel=5 tsc=reliable"
        return args + ["-drive", f"file={self.disk},format=qcow2,if=virtio,snapshot=on"]

    def wait_ready(self, timeout: float | None = None) -> None:
        """The agent's @@READY, then the end of systemd's boot (whatever
        its outcome: the tests check it), then the baseline of processes.
        first_command_uptime: the guest's uptime when the harness's first
        command after the listing ran (what came up before came up alone)."""
        super().wait_ready(timeout)
        self.first_command_uptime = float(self.check("cat /proc/uptime", 30).split()[0])
        self.run("systemctl is-system-running --wait", 600)
        self.baseline_pids = set(self.user_processes())


class AsUser:
    """GUEST seen as a normal user: every command (run, check, spawn,
    join, kill) runs under `runuser -u USER`; the rest is GUEST's."""

    def __init__(self, guest: Guest, user: str = GUEST_USER):
        self.guest = guest
        self.user = user

    def run(self, cmd: str, timeout: int = 30):
        return self.guest.run(f"runuser -u {self.user} -- sh -c {shlex.quote(cmd)}", timeout)

    check = Guest.check
    spawn = Guest.spawn
    join = Guest.join
    running = Guest.running
    kill = Guest.kill

    def __getattr__(self, name: str):
        return getattr(self.guest, name)


class DistroPair(Setup):
    """a: the Debian 12 guest with vt3 from packages behind vt3a; b: a
    busybox vt3 guest behind vt3b."""
    kind = "distro-pair"

    def build(self) -> None:
        image = build_distro_image(self.dir / "distro-image-build.log")
        self.add_vt3d("vt3a", f"unix-dgram:{self.uplink_socket('vt3a')},{self.uplink_socket('vt3b')}", A_MAC)
        self.add_vt3d("vt3b", f"unix-dgram:{self.uplink_socket('vt3b')},{self.uplink_socket('vt3a')}", B_MAC)
        self.guests["a"] = DistroGuest(self.cfg, self.dir, "a", self.vt3a.nic(), A_IP, A_MAC, image)
        self.add_guest("b", self.vt3b.nic(), B_IP, B_MAC, "vt3.driver=1")

    def ready(self) -> None:
        wait_device(self.b)
        self.b.check(f"ping -c 2 -W 5 {A_IP}", 60)
