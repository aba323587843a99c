"""The launcher's side of the guest key (docs/security.md): each vt3d
and the guest behind it get the same file of 16 random bytes, mode 0600
(vt3d --key-file, QEMU -fw_cfg name=opt/vt3/key), every guest its own; a
restarted vt3d keeps its key; in the guest the key is where vt3.ko reads
it, for root only."""

from __future__ import annotations

import os
import stat

import pytest

from vt3lab import A_IP, A_MAC, B_IP, B_MAC, Guest, Vt3d, Vt3dError
from vt3lab.guest import FW_CFG_KEY, FW_CFG_KEY_RAW, fw_cfg_key_args
from vt3lab.vt3d import INSECURE, KEY_LEN, provision_key


def cmdline(pid: int) -> list[str]:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read().decode().split("\0")[:-1]


def fw_cfg_args(argv: list[str]) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-fw_cfg"]


def check_key_file(path) -> bytes:
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid(), \
        f"{path}: mode {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid}, want a regular file 0600 of ours"
    key = path.read_bytes()
    assert len(key) == KEY_LEN, f"{path}: {len(key)} bytes, want {KEY_LEN}"
    return key


def test_key_files(lab):
    """no guest booted: each vt3d's key file is 16 bytes 0600, the same path in vt3d's --key-file and its guest's QEMU -fw_cfg name=opt/vt3/key; two guests, two keys; a restarted vt3d keeps its key; a bad key file is refused"""  # noqa: E501
    base = lab.rundir / "key-files"
    base.mkdir(parents=True)
    cfg = lab.cfg
    vt3d = {n: Vt3d(cfg.vt3d, base, f"vt3{n}", f"unix-dgram:{base / f'vt3{n}.up'},{base / f'vt3{p}.up'}", mac)
            for n, p, mac in (("a", "b", A_MAC), ("b", "a", B_MAC))}
    try:
        keys = {}
        for n, ip, mac in (("a", A_IP, A_MAC), ("b", B_IP, B_MAC)):
            d = vt3d[n]
            assert d.key_file == base / f"vt3{n}.key", d.key_file
            keys[n] = check_key_file(d.key_file)
            argv = cmdline(d.pid)
            assert argv[argv.index("--key-file") + 1] == str(d.key_file), f"vt3d {n}: {argv}"
            qemu = Guest(cfg, base, n, d.nic(), ip, mac, "vt3.driver=1").qemu_argv()
            assert fw_cfg_args(qemu) == [f"name={FW_CFG_KEY},file={d.key_file}"], f"guest {n}'s QEMU: {qemu}"
            assert d.alive(), f"vt3d {n} exited with its key file:\n{d.log_tail()}"
        assert keys["a"] != keys["b"], "two guests got the same key"
        assert keys["a"] != bytes(KEY_LEN), "an all-zero key"

        # A vt3d restarted behind the same guest (ChaosPair.restart, the
        # guest's QEMU still running with the key) gets the same file.
        vt3d["a"].stop()
        vt3d["a"] = Vt3d(cfg.vt3d, base, "vt3a", f"unix-dgram:{base / 'vt3a.up'},{base / 'vt3b.up'}", A_MAC)
        assert check_key_file(vt3d["a"].key_file) == keys["a"], "the restarted vt3d got another key"
        argv = cmdline(vt3d["a"].pid)
        assert argv[argv.index("--key-file") + 1] == str(base / "vt3a.key"), argv
    finally:
        for d in vt3d.values():
            d.stop()

    # What provision_key will not take as a key file (and leaves as it was).
    loose = base / "loose.key"
    loose.write_bytes(os.urandom(KEY_LEN))
    loose.chmod(0o644)
    short = base / "short.key"
    short.write_bytes(os.urandom(KEY_LEN - 1))
    short.chmod(0o600)
    for bad in (loose, short):
        before = bad.read_bytes()
        with pytest.raises(Vt3dError, match="not a key file"):
            provision_key(bad)
        assert bad.read_bytes() == before
    assert not list(base.glob(".*.tmp")), "provision_key left temporary files"

    # No key: neither --key-file nor -fw_cfg.
    assert fw_cfg_key_args(base / "a,b.key") == ["-fw_cfg", f"name={FW_CFG_KEY},file={base}/a,,b.key"]
    insecure = Vt3d(cfg.vt3d, base, "vt3c", f"unix-dgram:{base / 'vt3c.up'},{base / 'nobody.up'}",
                    "52:54:00:77:00:03", INSECURE)
    try:
        assert insecure.key_file is None and "--key-file" not in cmdline(insecure.pid)
        assert fw_cfg_args(Guest(cfg, base, "c", insecure.nic(), "10.77.0.3", "52:54:00:77:00:03").qemu_argv()) == []
    finally:
        insecure.stop()


@pytest.mark.qemu10
@pytest.mark.kernel612
def test_fw_cfg_key(vt3_pair):
    """each guest's kernel has its own vt3d's key at /sys/firmware/qemu_fw_cfg/by_name/opt/vt3/key/raw (qemu_fw_cfg loaded by init), mode 0400 root"""  # noqa: E501
    for g, d in ((vt3_pair.a, vt3_pair.vt3a), (vt3_pair.b, vt3_pair.vt3b)):
        g.check("[ -d /sys/module/qemu_fw_cfg ]", 10, "qemu_fw_cfg is not loaded")
        assert g.fw_cfg_key() == d.key(), f"guest {g.name}'s key is not its vt3d's ({d.key_file})"
        assert g.check(f"stat -c '%a %u' {FW_CFG_KEY_RAW}", 10).split() == ["400", "0"], \
            f"guest {g.name}: {FW_CFG_KEY_RAW} is readable by others than root"
    assert vt3_pair.vt3a.key() != vt3_pair.vt3b.key()
