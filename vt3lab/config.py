"""Where the lab's parts are (QEMU, the guest kernel and initramfs, vt3d)
and how guests are started. In order, the first that says:

    explicit arguments     lab_config(images=…, vt3d=…, …), the pytest
                           options --vt3-images, --vt3d, --vt3-qemu, …
    a bundle               lab_config(bundle=DIR) or --vt3-bundle DIR: what
                           `./run-vm.sh dist` unpacks (bin/vt3d, images/)
    the environment        VT3_BUNDLE, VT3_IMAGES, VT3_VT3D, VT3_QEMU,
                           VT3_ACCEL (what run-vm.sh sets)
    defaults               qemu-system-x86_64 on PATH; a vt3 checkout's
                           /var/cache/vt3 build caches

The accelerator is "tcg", "kvm" or "auto": KVM only when a short probe boot
proves it works (a /dev/kvm that exists may still hang or fail)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from .guest import LabConfig

DEFAULT_CACHE = Path("/var/cache/vt3")
BUNDLE_MANIFEST = "manifest.json"


class ConfigError(RuntimeError):
    """Something the lab needs is missing or wrong; the message says what."""


def qemu_major(qemu: str) -> int:
    try:
        out = subprocess.run([qemu, "--version"], capture_output=True, text=True, timeout=30).stdout
    except FileNotFoundError:
        raise ConfigError(f"QEMU not found: {qemu} (Debian: apt install qemu-system-x86)") from None
    m = re.search(r"version (\d+)\.", out)
    if not m:
        raise ConfigError(f"{qemu} --version: {out[:200]!r}")
    return int(m.group(1))


def kvm_works(qemu: str, kernel: Path) -> bool:
    """A probe boot under KVM: no root fs, so the kernel panics at once and
    -no-reboot ends QEMU. Never waited on for more than a few seconds
    (where KVM hangs, it hangs unkillably)."""
    if not os.access("/dev/kvm", os.R_OK | os.W_OK):
        return False
    probe = subprocess.Popen([qemu, "-accel", "kvm", "-M", "q35", "-m", "128M", "-display", "none", "-monitor",
                              "none", "-serial", "none", "-no-reboot", "-kernel", str(kernel), "-append", "panic=-1"],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        rc = probe.poll()
        if rc is not None:
            return rc == 0
        time.sleep(0.25)
    probe.kill()
    return False


def bundle_paths(bundle: Path) -> tuple[Path, Path]:
    """(images, vt3d) of an unpacked bundle."""
    if not (bundle / BUNDLE_MANIFEST).is_file():
        raise ConfigError(f"{bundle} is not a vt3 bundle (no {BUNDLE_MANIFEST}; ./run-vm.sh dist makes one)")
    return bundle / "images", bundle / "bin" / "vt3d"


def bundle_manifest(bundle: Path) -> dict:
    return json.loads((bundle / BUNDLE_MANIFEST).read_text())


def lab_config(images: str | Path | None = None, vt3d: str | Path | None = None, qemu: str | None = None,
               accel: str | None = None, bundle: str | Path | None = None, qemu_args: tuple[str, ...] = (),
               kernel_args: str = "", boot_timeout: float | None = None) -> LabConfig:
    """The lab's configuration (see the module's docstring for the order)."""
    env = os.environ
    bundle = bundle or env.get("VT3_BUNDLE")
    from_bundle = bundle_paths(Path(bundle)) if bundle else (None, None)
    images = Path(images or from_bundle[0] or env.get("VT3_IMAGES") or DEFAULT_CACHE / "images")
    vt3d = Path(vt3d or from_bundle[1] or env.get("VT3_VT3D") or DEFAULT_CACHE / "target/release/vt3d")
    qemu = qemu or env.get("VT3_QEMU") or shutil.which("qemu-system-x86_64") or "qemu-system-x86_64"
    # The uncompressed kernel boots ~5 s sooner under TCG (images/build.sh).
    kernel = images / "vmlinux"
    if not kernel.exists():
        kernel = images / "vmlinuz"
    for need in (kernel, images / "initramfs-vt3.cpio", vt3d):
        if not need.exists():
            raise ConfigError(f"{need} is missing: give a bundle (--vt3-bundle, VT3_BUNDLE) or build it "
                              f"with ./run-vm.sh in a vt3 checkout")
    accel = accel or env.get("VT3_ACCEL") or "auto"
    if accel not in ("auto", "tcg", "kvm"):
        raise ConfigError(f"accel must be auto, tcg or kvm, not {accel!r}")
    if accel != "tcg":
        works = kvm_works(qemu, kernel)
        if accel == "kvm" and not works:
            raise ConfigError("accel kvm: the KVM probe failed (/dev/kvm must be readable and writable: "
                              "the user must be in the kvm group, or run with accel tcg)")
        accel = "kvm" if works else "tcg"
    return LabConfig(qemu=qemu, qemu_major=qemu_major(qemu), accel=accel, kernel=kernel,
                     initrd=images / "initramfs-vt3.cpio", vt3d=vt3d,
                     boot_timeout=float(boot_timeout or env.get("VT3_BOOT_TIMEOUT", "240")),
                     qemu_args=tuple(qemu_args), kernel_args=kernel_args)


def config_from_env() -> LabConfig:
    """The configuration run-vm.sh's environment says."""
    return lab_config()
