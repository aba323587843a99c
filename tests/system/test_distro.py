"""vt3 in a real distribution guest: Debian 12 with systemd, udev and
Debian's 6.1 kernel, vt3 installed from packages (images/distro/build.sh:
vt3-dkms, whose DKMS build made vt3.ko against the image's own headers,
and rdma-core 55 .debs with libvt3 over Debian's rdma-core), against a
busybox vt3 guest behind its own vt3d. The key reaches vt3.ko as on any
QEMU (-fw_cfg name=opt/vt3/key) through Debian's own qemu_fw_cfg module."""

import re

import pytest

from helpers import perftest, rping_between
from distro import GUEST_USER, AsUser, DistroPair
from vt3lab.guest import FW_CFG_KEY_RAW
from vt3lab.plugin import make_setup_fixture
from vt3lab.setups import wait_device

# The Debian guest boots for its one scenario (images/distro/build.sh
# builds its image from this checkout).
distro_pair = make_setup_fixture("distro_pair", DistroPair, fresh=True)

# The image's packages (images/distro/build.sh) and what DKMS made of vt3-dkms.
OUR_RDMA_CORE = ("rdma-core", "libibverbs1", "ibverbs-providers", "librdmacm1", "rdmacm-utils", "ibverbs-utils")
DKMS_MODULE = "vt3/0.1"


def kernel_seconds(line: str) -> float:
    return float(re.match(r"\[\s*(\d+\.\d+)\]", line).group(1))


@pytest.mark.soak
def test_distro_guest(distro_pair):
    """Debian 12 guest, vt3 from its packages (vt3-dkms, rdma-core .debs): vt3_0 up by udev alone; ibv_devinfo, rping -V both ways, ib_write_bw -R both ways as a normal user against a busybox vt3 guest"""  # noqa: E501
    root, b = distro_pair.a, distro_pair.b
    user = AsUser(root)

    # systemd finished its boot with no failed unit.
    state = root.run("systemctl is-system-running", 30)
    failed = root.run("systemctl --failed --no-legend", 30).out
    assert state.out.strip() == "running", f"systemd says {state.out.strip()!r}; failed units:\n{failed}"

    # vt3.ko is DKMS's build for this kernel, from the vt3-dkms package, and
    # the module loaded is that file.
    kver = root.check("uname -r", 10).strip()
    dkms = root.check(f"dkms status {DKMS_MODULE} -k {kver}", 30)
    assert re.search(rf"^vt3/0\.1, {re.escape(kver)}, x86_64: installed", dkms, re.M), dkms
    path = root.check("modinfo -n vt3", 10).strip()
    assert path == f"/lib/modules/{kver}/updates/dkms/vt3.ko", path
    root.check(f"objcopy -O binary --only-section=.note.gnu.build-id {path} /tmp/vt3.build-id && "
               "cmp /tmp/vt3.build-id /sys/module/vt3/notes/.note.gnu.build-id", 10,
               "the loaded vt3 is not DKMS's build")
    root.check("dpkg-query -W -f '${Status}' vt3-dkms | grep -qx 'install ok installed'", 10, "vt3-dkms not installed")

    # The key: Debian's qemu_fw_cfg module (nothing of ours loads it) shows
    # vt3a's key file to root only.
    fw_cfg = root.check("modinfo -n qemu_fw_cfg", 10).strip()
    assert re.fullmatch(rf"/lib/modules/{re.escape(kver)}/kernel/drivers/firmware/qemu_fw_cfg\.ko(\.xz)?",
                        fw_cfg), fw_cfg
    root.check("[ -d /sys/module/qemu_fw_cfg ]", 10, "qemu_fw_cfg is not loaded")
    assert root.fw_cfg_key() == distro_pair.vt3a.key(), "the Debian guest has not vt3a's key"
    r = user.run(f"cat {FW_CFG_KEY_RAW}", 10)
    assert r.rc != 0 and "Permission denied" in r.out, f"{GUEST_USER} reads the key: exit {r.rc}"

    # udev loaded it (the rule shipped in vt3-dkms) before the harness ran
    # anything in the guest but a read-only process listing; vt3_0 came up
    # on the NIC by itself.
    rule = root.check("dpkg -L vt3-dkms | grep '/udev/rules.d/'", 10).strip()
    assert root.check(f"cat {rule}", 10).count("kmod load vt3") == 1, f"{rule} does not load vt3"
    first_vt3_line = root.check("dmesg | grep -m1 ' vt3: '", 10)
    assert kernel_seconds(first_vt3_line) < root.first_command_uptime, \
        f"vt3 loaded at {first_vt3_line!r}, after the first agent command at {root.first_command_uptime} s"
    wait_device(root)

    # User space: our rdma-core packages replaced Debian's; Debian's
    # perftest runs on our libibverbs.
    versions = root.check("dpkg-query -W -f '${Package} ${Version}\\n' " + " ".join(OUR_RDMA_CORE) + " perftest", 10)
    for pkg in OUR_RDMA_CORE:
        assert re.search(rf"^{pkg} 55\.0-1\+vt3$", versions, re.M), f"{pkg} is not ours:\n{versions}"
    assert root.check("dpkg -S /usr/lib/x86_64-linux-gnu/libibverbs/libvt3-rdmav34.so", 10).startswith(
        "ibverbs-providers:")
    assert re.search(r"libibverbs\.so\.1 => /lib/x86_64-linux-gnu/libibverbs\.so\.1 ",
                     root.check("ldd /usr/bin/ib_write_bw", 10))

    # As a normal user.
    assert user.check("id -un", 10).strip() == GUEST_USER and user.check("id -u", 10).strip() != "0"
    info = user.check("ibv_devinfo -d vt3_0", 60)
    for want in (r"hca_id:\s+vt3_0", r"transport:\s+iWARP \(1\)", r"state:\s+PORT_ACTIVE \(4\)"):
        assert re.search(want, info), f"ibv_devinfo lacks {want}:\n{info}"
    rping_between(b, user, 20)
    rping_between(user, b, 20)
    perftest(b, user, "ib_write_bw", 65536, 200, setup=distro_pair)
    perftest(user, b, "ib_write_bw", 65536, 200, setup=distro_pair)
