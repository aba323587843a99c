"""iSCSI over RDMA (iSER) between guests: LIO's iSCSI target with an iSER
portal (ib_isert) exports a RAM disk (brd) from one guest, open-iscsi's
initiator logs in over the iser transport (ib_iser) from another. LIO is
set up through configfs by hand (no targetcli in the image). Each step
checks what it did."""

from __future__ import annotations

import re

from ..guest import Guest

IQN = "iqn.2026-12.dev.vt3:ram0"
INITIATOR = "iqn.2026-12.dev.vt3:initiator"
PORT = 3260
RAM_MB = 48
CFS = "/sys/kernel/config/target"
TPG = f"{CFS}/iscsi/{IQN}/tpgt_1"
BACKSTORE = f"{CFS}/core/iblock_0/ram0"
TARGET_MODULES = ("ib_isert", "iscsi_target_mod", "target_core_iblock", "target_core_mod", "brd")
INITIATOR_MODULES = ("ib_iser", "libiscsi", "scsi_transport_iscsi", "sd_mod")


def portal(addr: str) -> str:
    return f"{TPG}/np/{addr}:{PORT}"


def target_up(g: Guest, addr: str) -> None:
    """LIO on G: /dev/ram0 as LUN 0 of IQN, a portal on ADDR:3260 with
    iSER on, open to any initiator (demo mode, no CHAP)."""
    g.check(f"modprobe brd rd_nr=1 rd_size={RAM_MB * 1024} max_part=0 && "
            "modprobe target_core_iblock && modprobe iscsi_target_mod && modprobe ib_isert && "
            "{ grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs none /sys/kernel/config; } && "
            f"mkdir -p {BACKSTORE} && echo udev_path=/dev/ram0 > {BACKSTORE}/control && "
            f"echo 1 > {BACKSTORE}/enable && "
            f"mkdir -p {TPG}/lun/lun_0 && ln -s {BACKSTORE} {TPG}/lun/lun_0/ram0 && "
            f"echo 0 > {TPG}/attrib/authentication && echo 1 > {TPG}/attrib/generate_node_acls && "
            f"echo 0 > {TPG}/attrib/demo_mode_write_protect && echo 1 > {TPG}/attrib/cache_dynamic_acls && "
            f"mkdir {portal(addr)} && echo 1 > {portal(addr)}/iser && echo 1 > {TPG}/enable",
            60, "LIO iSER target setup")
    on = g.check(f"cat {portal(addr)}/iser", 10).strip()
    assert on == "1", f"{g.name}: the portal's iser attribute reads {on!r} after enabling it"
    g.check(f"for i in $(seq 100); do rdma res show cm_id | grep -Eq 'LISTEN.*:{PORT}( |$)' && exit 0; "
            "sleep 0.2; done; rdma res show cm_id; exit 1", 40, "ib_isert does not listen")


def target_down(g: Guest, addr: str) -> None:
    g.check(f"echo 0 > {TPG}/enable && echo 0 > {portal(addr)}/iser && rmdir {portal(addr)} && "
            f"rm {TPG}/lun/lun_0/ram0 && rmdir {TPG}/lun/lun_0 && rmdir {TPG} && "
            f"rmdir {CFS}/iscsi/{IQN} && rmdir {CFS}/iscsi && "
            f"rmdir {BACKSTORE} && rmdir {CFS}/core/iblock_0 && "
            f"rmmod {' '.join(TARGET_MODULES)}", 120, "LIO iSER target teardown")


def initiator_login(g: Guest, addr: str) -> str:
    """iscsid and a login to IQN at ADDR over the iser transport; the SCSI
    disk it attached (/dev/sdX)."""
    # No udev in the guest to load sd_mod when the LUN appears.
    g.check(f"modprobe sd_mod && modprobe ib_iser && mkdir -p /etc/iscsi /run/lock/iscsi && "
            f"echo InitiatorName={INITIATOR} > /etc/iscsi/initiatorname.iscsi && iscsid", 60, "starting iscsid")
    # A node record by hand: sendtargets discovery would go over TCP.
    g.check(f"iscsiadm -m node -o new -T {IQN} -p {addr}:{PORT} -I iser && "
            f"iscsiadm -m node -T {IQN} -p {addr}:{PORT} -I iser --login", 120, "iSER login")
    # The LUN scan and sd's attach follow the login asynchronously.
    g.check("for i in $(seq 150); do iscsiadm -m session -P 3 | grep -q 'Attached scsi disk' && exit 0; "
            "sleep 0.2; done; exit 1", 60, "no disk attached after the login")
    s = g.check("iscsiadm -m session -P 3", 30)
    assert re.search(rf"^iser: \[\d+\] {re.escape(addr)}:{PORT},1 {re.escape(IQN)}", s, re.M) or \
        re.search(rf"^\s*Current Portal: {re.escape(addr)}:{PORT},1", s, re.M), f"no iSER session:\n{s}"
    assert re.search(r"^\s*Iface Transport: iser$", s, re.M), f"the session is not over iser:\n{s}"
    m = re.search(r"Attached scsi disk (sd[a-z]+)\s+State: running", s)
    assert m, f"the session attached no running disk:\n{s}"
    dev = f"/dev/{m.group(1)}"
    size = int(g.check(f"cat /sys/block/{m.group(1)}/size", 10).strip()) * 512
    assert size == RAM_MB << 20, f"{dev}: {size} bytes, want the target's {RAM_MB} MiB"
    return dev


def initiator_logout(g: Guest, addr: str) -> None:
    g.check(f"iscsiadm -m node -T {IQN} -p {addr}:{PORT} -I iser --logout && "
            f"iscsiadm -m node -o delete -T {IQN} -p {addr}:{PORT} -I iser", 120, "iSER logout")
    s = g.run("iscsiadm -m session", 30)
    assert s.rc == 21, f"sessions left after the logout (iscsiadm exit {s.rc}):\n{s.out}"
    g.check("iscsiadm -k 0 && for i in $(seq 50); do pidof iscsid >/dev/null || break; sleep 0.1; done; "
            "! pidof iscsid", 30, "stopping iscsid")
    g.check(f"for m in {' '.join(INITIATOR_MODULES)}; do grep -q \"^$m \" /proc/modules && {{ rmmod $m || exit 1; }}; "
            "done; true", 60, "unloading the initiator's modules")
