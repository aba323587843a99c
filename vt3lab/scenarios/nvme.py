"""Kernel NVMe over RDMA between guests, for the tests and the bench:
nvmet-rdma exports a RAM disk (brd) from one guest, nvme-rdma connects to
it from another (or the same) guest. Each step checks what it did."""

from __future__ import annotations

import re

from ..guest import Guest

NQN = "nqn.2026-12.dev.vt3:ram0"
HOSTNQN = "nqn.2026-12.dev.vt3:host"
# A host is its NQN and its host ID together. Given an NQN alone, nvme-cli
# leaves the ID to the kernel, which takes its default host's random one;
# 6.12's nvme_fabrics refuses that (EINVAL, "found same hostid … but
# different hostnqn"; 6.1 had no such check): name both.
HOSTID = "8c3e5a1f-2d4b-4e6a-9f7c-7674330f0612"
PORT = 4420
CFS = "/sys/kernel/config/nvmet"
RAM_MB = 48
# The guests have one CPU, so --nr-io-queues gives one queue; a write
# queue of its own makes two (reads on one, writes on the other), and a
# poll queue three (polled I/O: its CQ is IB_POLL_DIRECT, never armed).
IO_QUEUES, WRITE_QUEUES, POLL_QUEUES = 1, 1, 1
QUEUES = IO_QUEUES + WRITE_QUEUES + POLL_QUEUES

# ------------------------------------------------------------------ target


def target_up(g: Guest, addr: str, srq: bool = False) -> None:
    """nvmet-rdma on G: subsystem NQN, namespace 1 on /dev/ram0, RDMA port
    on ADDR:4420; with SRQ, its queues receive from a shared receive queue
    (nvmet-rdma use_srq=1)."""
    g.check(f"modprobe brd rd_nr=1 rd_size={RAM_MB * 1024} max_part=0 && "
            f"modprobe nvmet-rdma{' use_srq=1' if srq else ''} && "
            "{ grep -q ' /sys/kernel/config ' /proc/mounts || mount -t configfs none /sys/kernel/config; } && "
            f"s={CFS}/subsystems/{NQN} && mkdir $s && echo 1 > $s/attr_allow_any_host && "
            "mkdir $s/namespaces/1 && echo -n /dev/ram0 > $s/namespaces/1/device_path && "
            "echo 1 > $s/namespaces/1/enable && "
            f"p={CFS}/ports/1 && mkdir $p && echo rdma > $p/addr_trtype && echo ipv4 > $p/addr_adrfam && "
            f"echo {addr} > $p/addr_traddr && echo {PORT} > $p/addr_trsvcid && "
            f"ln -s $s $p/subsystems/{NQN}", 60, "nvmet-rdma target setup")
    # The port listens once it is linked to a subsystem.
    g.check(f"for i in $(seq 100); do rdma res show cm_id | grep -Eq 'LISTEN.*:{PORT}( |$)' && exit 0; "
            "sleep 0.2; done; rdma res show cm_id; exit 1", 40, "nvmet-rdma does not listen")


# Modules the target and the host may share: on 6.12 nvmet needs
# nvme_core, nvme_auth and nvme_keyring too (on 6.1 only the host loads
# nvme_core). In the order they can go.
NVME_SHARED = ("nvme_core", "nvme_auth", "nvme_keyring")


def unload_shared(g, what: str) -> None:
    """Unloads each of NVME_SHARED that is loaded and that no other module
    still uses (in one guest, the other role may); rmmod failing fails the
    test. The cases end by checking that no nvme module is left."""
    g.check(f"for m in {' '.join(NVME_SHARED)}; do grep -q \"^$m \" /proc/modules || continue; "
            "[ -z \"$(ls /sys/module/$m/holders)\" ] || continue; rmmod $m || exit 1; done", 60, what)


def target_down(g) -> None:
    g.check(f"rm -f {CFS}/ports/1/subsystems/{NQN} && rmdir {CFS}/ports/1 && "
            f"echo 0 > {CFS}/subsystems/{NQN}/namespaces/1/enable && "
            f"rmdir {CFS}/subsystems/{NQN}/namespaces/1 && rmdir {CFS}/subsystems/{NQN} && "
            "rmmod nvmet_rdma nvmet brd", 120, "nvmet-rdma target teardown")
    unload_shared(g, "unloading the modules nvmet used")


# -------------------------------------------------------------------- host

def host_connect(g, addr: str, options: str = "") -> tuple[str, str]:
    """nvme discover and connect from G; the controller and the namespace's
    block device."""
    g.check("modprobe nvme-rdma", 30)
    d = g.check(f"nvme discover -t rdma -a {addr} -s {PORT} -q {HOSTNQN} --hostid {HOSTID}", 120, "nvme discover")
    assert re.search(rf"^subnqn:\s+{re.escape(NQN)}$", d, re.M), f"discovery log has no {NQN}:\n{d}"
    assert re.search(r"^trtype:\s+rdma$", d, re.M), f"discovery log entry is not rdma:\n{d}"
    assert re.search(rf"^traddr:\s+{re.escape(addr)}$", d, re.M), f"discovery log: wrong traddr:\n{d}"
    # discover connected a discovery controller and let it go again.
    assert g.check("ls /sys/class/nvme | wc -l", 10).strip() == "0", "discovery controller left behind"
    g.check(f"nvme connect -t rdma -a {addr} -s {PORT} -n {NQN} -q {HOSTNQN} --hostid {HOSTID} "
            f"--nr-io-queues {IO_QUEUES} --nr-write-queues {WRITE_QUEUES} --nr-poll-queues {POLL_QUEUES} {options}",
            120, "nvme connect")
    ctrl = g.check("for i in $(seq 100); do for c in /sys/class/nvme/nvme*; do [ -e $c/subsysnqn ] && "
                   f"[ $(cat $c/subsysnqn) = {NQN} ] && [ $(cat $c/state) = live ] && "
                   "{ echo ${c##*/}; exit 0; }; done; sleep 0.2; done; exit 1", 40, "no live controller").strip()
    assert g.check(f"cat /sys/class/nvme/{ctrl}/transport", 10).strip() == "rdma"
    assert g.check(f"cat /sys/class/nvme/{ctrl}/address", 10).strip() == f"traddr={addr},trsvcid={PORT}"
    # The namespace's head (multipath: nvme0n1), not its path (nvme0c0n1).
    dev = g.check("for i in $(seq 100); do for b in /sys/block/nvme*n1; do case ${b##*/} in *c*) continue;; esac; "
                  "[ -e $b ] && [ $(cat $b/size) -gt 0 ] && { echo /dev/${b##*/}; exit 0; }; done; sleep 0.2; done; "
                  "exit 1", 40, "no namespace block device").strip()
    size = int(g.check(f"cat /sys/block/{dev.removeprefix('/dev/')}/size", 10)) * 512
    assert size == RAM_MB << 20, f"{dev}: {size} bytes, want {RAM_MB} MiB"
    listing = g.check("nvme list", 30)
    assert dev in listing, f"nvme list does not show {dev}:\n{listing}"
    return ctrl, dev


def host_disconnect(g) -> None:
    out = g.check(f"nvme disconnect -n {NQN}", 120, "nvme disconnect")
    assert re.search(rf"NQN:{re.escape(NQN)} disconnected 1 controller\(s\)", out), f"nvme disconnect: {out}"
    assert g.check("ls /sys/class/nvme | wc -l", 10).strip() == "0", "a controller is left after disconnect"
    g.check("rmmod nvme_rdma nvme_fabrics", 60, "unloading nvme-rdma")
    unload_shared(g, "unloading the modules nvme-rdma used")
