"""The lab's configuration, from the environment run-vm.sh sets up:

    VT3_QEMU     QEMU binary (default qemu-system-x86_64)
    VT3_ACCEL    tcg or kvm (run-vm.sh probes; default tcg)
    VT3_IMAGES   directory with vmlinux (or vmlinuz) and initramfs-vt3.cpio
    VT3_VT3D     the vt3d binary
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from .guest import LabConfig


def qemu_major(qemu: str) -> int:
    out = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.search(r"version (\d+)\.", out)
    if not m:
        raise RuntimeError(f"{qemu} --version: {out[:200]!r}")
    return int(m.group(1))


def config_from_env() -> LabConfig:
    qemu = os.environ.get("VT3_QEMU") or shutil.which("qemu-system-x86_64") or "qemu-system-x86_64"
    images = Path(os.environ.get("VT3_IMAGES", "/var/cache/vt3/images"))
    vt3d = Path(os.environ.get("VT3_VT3D", "/var/cache/vt3/target/release/vt3d"))
    # The uncompressed kernel boots ~5 s sooner under TCG (images/build.sh).
    kernel = images / "vmlinux"
    if not kernel.exists():
        kernel = images / "vmlinuz"
    for need in (kernel, images / "initramfs-vt3.cpio", vt3d):
        if not need.exists():
            raise RuntimeError(f"{need} is missing: run the tests through ./run-vm.sh, which builds it")
    return LabConfig(qemu=qemu, qemu_major=qemu_major(qemu), accel=os.environ.get("VT3_ACCEL", "tcg"),
                     kernel=kernel, initrd=images / "initramfs-vt3.cpio", vt3d=vt3d,
                     boot_timeout=float(os.environ.get("VT3_BOOT_TIMEOUT", "240")))
