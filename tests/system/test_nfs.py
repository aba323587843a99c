"""NFS over RDMA on vt3 (issue 13): the kernel's nfsd exports a tmpfs over
RDMA (rpcrdma, port 20049) from one vt3 guest, started with nfs-utils' own
tools (exportfs, rpc.mountd, rpc.nfsd --rdma; NFSv4 only, so no rpcbind,
lockd or statd); the other guest
mounts it with `proto=rdma` (mount.nfs), writes files of several sizes,
reads them back after dropping its page cache and compares checksums on
both sides, and unmounts. Once more with an RST on the connection in the
middle of a transfer: xprtrdma reconnects and the data arrives intact.
Both sides leak nothing and log no kernel warning."""

from __future__ import annotations

import re
import time

from helpers import count, no_objects
from test_chaos import ctl_fault
from test_cm import kmark, kmsg_since
from test_nvme import no_kernel_trouble
from vt3lab.tools import tail

NFS_RDMA_PORT = 20049
EXPORT = "/export"
MNT = "/mnt/nfs"
# name: size in KiB (sizes around the inline threshold, a page, RDMA READ
# and WRITE chunks, and a multi-MiB file).
FILES = {"f1k": 1, "f4k": 4, "f60k": 60, "f1m": 1024, "f8m": 8192}


def server_up(g) -> None:
    g.check("modprobe nfsd && modprobe rpcrdma && mkdir -p /proc/fs/nfsd /var/lib/nfs/rpc_pipefs "
            f"{EXPORT} && mount -t nfsd nfsd /proc/fs/nfsd && mount -t tmpfs -o size=64m tmpfs {EXPORT} && "
            f"echo '{EXPORT} *(rw,no_root_squash,insecure,fsid=0,no_subtree_check)' > /etc/exports && "
            ": > /var/lib/nfs/etab && exportfs -ra && rpc.mountd -N 3 && "
            # NFSv4 only (no lockd, statd); the shortest grace period a
            # fresh server makes its clients wait through.
            "echo 10 > /proc/fs/nfsd/nfsv4leasetime && echo 10 > /proc/fs/nfsd/nfsv4gracetime && "
            f"rpc.nfsd -N 3 --rdma={NFS_RDMA_PORT} 4", 60, "starting nfsd")
    ports = g.check("cat /proc/fs/nfsd/portlist", 10)
    assert re.search(rf"^rdma {NFS_RDMA_PORT}$", ports, re.M), f"nfsd listens on no RDMA port:\n{ports}"
    versions = g.check("cat /proc/fs/nfsd/versions", 10).split()
    assert "-3" in versions and "+4.2" in versions, f"nfsd serves {versions}, want 4.2 and not 3"


def server_down(g) -> None:
    g.check(f"rpc.nfsd 0 && exportfs -ua && killall rpc.mountd && umount {EXPORT} && umount /proc/fs/nfsd",
            60, "stopping nfsd")
    # No nfsd thread left: the RDMA listeners are gone with the service.
    left = g.check("rdma res show cm_id", 10)
    assert f":{NFS_RDMA_PORT}" not in left, f"nfsd's RDMA listener outlived it:\n{left}"


def client_mount(g, server_ip: str) -> None:
    g.check(f"modprobe nfs && modprobe nfsv4 && modprobe rpcrdma && mkdir -p {MNT} && "
            f"mount -t nfs -o vers=4.2,proto=rdma,port={NFS_RDMA_PORT},hard,timeo=100 {server_ip}:/ {MNT}",
            120, "mounting over RDMA")
    mounts = g.check(f"grep ' {MNT} ' /proc/mounts", 10)
    assert re.search(r"\bproto=rdma\b", mounts) and re.search(rf"\bport={NFS_RDMA_PORT}\b", mounts), \
        f"not mounted over RDMA:\n{mounts}"


def sums(g, d: str, names) -> dict[str, str]:
    out = g.check(f"cd {d} && md5sum {' '.join(names)}", 120)
    got = dict((n, s) for s, n in re.findall(r"^([0-9a-f]{32})\s+(\S+)$", out, re.M))
    assert sorted(got) == sorted(names), f"md5sum in {d}:\n{out}"
    return got


def write_files(g, files: dict[str, int]) -> dict[str, str]:
    """Writes random files of FILES' sizes through the mount; returns
    their checksums as written (taken from the local copies)."""
    for name, kib in files.items():
        g.check(f"dd if=/dev/urandom of=/tmp/{name} bs=1024 count={kib} 2>/dev/null && "
                f"cp /tmp/{name} {MNT}/{name}", 300, f"writing {name}")
    g.check("sync", 120)
    return sums(g, "/tmp", files)


def nfs_qps(setup) -> dict[str, list[int]]:
    return {n: [q["qpn"] for q in d.ctl("qps") if q["state"] == "RTS"] for n, d in setup.vt3d.items()}


def check_round_trip(server, client, files: dict[str, str]) -> None:
    """The server's tmpfs and the client's reads, after dropping its page
    cache, hold what was written."""
    assert sums(server, EXPORT, files) == files, "the server holds other data than was written"
    client.check("sync && echo 3 > /proc/sys/vm/drop_caches", 60)
    assert sums(client, MNT, files) == files, "the client reads other data than was written"


def nfs_teardown(setup, server, client, marks) -> None:
    # The modules stay: the NFSv4 client lets its lease go in the background.
    client.check(f"umount {MNT}", 120, "unmounting")
    server_down(server)
    no_objects(setup, "after the NFS unmount and nfsd's stop")
    for g in (server, client):
        no_kernel_trouble(g, marks[g.name])


def test_nfs_rdma(vt3_pair):
    """nfsd exports a tmpfs over RDMA (port 20049) from a; b mounts it proto=rdma, writes 1 KiB-8 MiB files,
    checksums them on both sides after dropping its cache, unmounts; no leak, no kernel warning"""
    a, b = vt3_pair.a, vt3_pair.b
    marks = {g.name: kmark(g) for g in (a, b)}
    server_up(a)
    client_mount(b, a.ip)
    qps = nfs_qps(vt3_pair)
    assert qps["vt3a"] and qps["vt3b"], f"no RDMA connection under the mount: {qps}"
    written = write_files(b, FILES)
    check_round_trip(a, b, written)
    log = kmsg_since(b, marks[b.name])
    assert not re.search(r"rpcrdma.*(disconnect|error)", log, re.I), f"the transport had trouble:\n{tail(log)}"
    nfs_teardown(vt3_pair, a, b, marks)


def test_nfs_rdma_fault(vt3_pair):
    """the same, with vt3d ctl fault rst on the client's connection while it writes 32 MiB: xprtrdma reconnects,
    every file arrives intact"""
    a, b = vt3_pair.a, vt3_pair.b
    marks = {g.name: kmark(g) for g in (a, b)}
    server_up(a)
    client_mount(b, a.ip)
    before = vt3_pair.vt3b.ctl("qps")
    victims = [q["qpn"] for q in before if q["state"] == "RTS"]
    assert victims, f"vt3b: no connection under the mount: {before}"
    b.check("dd if=/dev/urandom of=/tmp/big bs=1M count=32 2>/dev/null", 120)
    b.spawn(f"cp /tmp/big {MNT}/big && sync", "cp", 600)
    # Fault the busiest connection once data moves.
    moved: dict[int, int] = {}
    start = {q["qpn"]: q["sq_consumed"] for q in before}
    for _ in range(120):
        now = {q["qpn"]: q["sq_consumed"] for q in vt3_pair.vt3b.ctl("qps") if q["qpn"] in victims}
        moved = {n: now.get(n, 0) - start.get(n, 0) for n in victims}
        if max(moved.values(), default=0) >= 32:
            break
        assert b.running("cp"), f"the copy ended before the fault:\n{tail(b.join('cp', 10).out)}"
        time.sleep(0.5)
    victim = max(moved, key=lambda n: moved[n])
    assert moved[victim] >= 32, f"no connection moved data: {moved}"
    ctl_fault(vt3_pair.vt3b, "rst", qp=victim)
    r = b.join("cp", 600)
    assert r.rc == 0, f"the copy through the fault: exit {r.rc}:\n{tail(r.out)}"
    log = kmsg_since(b, marks[b.name])
    # The RST ended that connection; the mount goes on over a new one.
    connects = count(log, rf"^vt3_0: QP \d+: connecting {b.ip}:\d+ -> {a.ip}:{NFS_RDMA_PORT}$")
    assert connects == 2, f"{connects} connections to nfsd, want the mount's and one reconnect:\n{tail(log, 30)}"
    big = sums(b, "/tmp", ["big"])
    files = write_files(b, {"after1m": 1024}) | big
    check_round_trip(a, b, files)
    print(f"nfs-rdma-fault: RST on QP {victim} after {moved[victim]} WQEs; client log:\n{tail(log, 10)}")
    nfs_teardown(vt3_pair, a, b, marks)
