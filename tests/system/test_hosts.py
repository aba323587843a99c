"""Across hosts (docs/hosts.md): vt3 guests on two hosts, each a network
namespace with a Linux bridge, the bridges joined by VXLAN (VNI 77, UDP
4789) over an underlay (vt3lab.fabric). Each vt3d runs on its guest's host
with a tap uplink (vnet header, offloads) in that host's bridge; the siw
guest's QEMU has a tap of its own. VXLAN leaves MTU 1450: vt3d (--mtu),
the guests (vt3.mtu) and the TOE's MSS follow it.

TwoHosts: vm1 (vt3, 10.77.0.1) and vm3 (siw, 10.77.0.3) on host 1, vm2
(vt3, 10.77.0.2) on host 2."""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

import pytest

from helpers import count, no_objects, perftest, rping_between, wait_rdma_listen
from test_cm import kmark, kmsg_since
from test_nvme import (FAULT_JOBS, busiest_io_queue, check_fio, controller_lost, fio_command, no_kernel_trouble,
                       nvme_over_rdma, recovered_under_fio)
from test_pcap import TSHARK_OPTS, tshark_bin
from vt3lab.fabric import Fabric, namespaces, pids_in, sweep_stale
from vt3lab.proc import Process, wait_for
from vt3lab.scenarios.nvme import host_connect, target_down, target_up, unload_shared
from vt3lab.setups import HOSTS_TCP_TIMEOUT, Hosts, wait_device
from vt3lab.tools import tail

MTU = 1450
MSS = MTU - 40
# An Ethernet frame at MTU 1450 (no VLAN tag).
MAX_FRAME = MTU + 14


def fabric_packets(h) -> dict[int, int]:
    """Frames each host's VXLAN device sent to the others."""
    return {i: h.fabric.link_stats(i, "vx0")["tx_packets"] for i in (1, 2)}


def nic(d, row: str) -> int:
    return d.stats()[f"nic.{row}"]


def live_tcbs(d, port: int) -> list[dict]:
    return [t for t in d.ctl("tcb") if t["state"] == "ESTABLISHED" and port in
            (int(t["local"].rsplit(":", 1)[1]), int(t["remote"].rsplit(":", 1)[1]))]


def test_hosts_rping(two_hosts):
    """rping -V across hosts through VXLAN: vt3↔vt3 (vm2 → vm1) and vt3↔siw (vm2 → vm3, vm3 → vm2); MTU 1450 everywhere, MSS 1410 both ways, nothing over the MTU"""  # noqa: E501
    h = two_hosts
    assert h.host_of == {"vm1": 1, "vm2": 2, "vm3": 1}, h.host_of
    for g in h.guests.values():
        mtu = g.check("cat /sys/class/net/eth0/mtu", 10).strip()
        assert mtu == str(MTU), f"{g.name}: eth0 mtu {mtu}, want {MTU}"
    for i in (1, 2):
        stats = h.fabric.link_stats(i, "vx0")
        assert stats["mtu"] == MTU, f"host {i}: vx0 mtu {stats['mtu']}"
    before = fabric_packets(h)
    # The TCBs are sampled while each connection lives: a slow rping
    # server (-S large pings) keeps it open long enough to look.
    rping_between(h.vm1, h.vm2, 200)
    rping_between(h.vm3, h.vm2, 200, port=7175)
    rping_between(h.vm2, h.vm3, 200, port=7176)
    after = fabric_packets(h)
    for i in (1, 2):
        # Each ping is a SEND, a READ and a WRITE each way at least.
        assert after[i] - before[i] >= 3 * 600, f"host {i}: only {after[i] - before[i]} frames through VXLAN"
    for name, d in h.vt3d.items():
        oversize = (nic(d, "tx_dropped_oversize"), nic(d, "rx_dropped_oversize"))
        assert oversize == (0, 0), f"vt3d {name}: frames over the MTU (tx, rx): {oversize}"
        assert d.stats()["uplink.oversize_drops"] == 0, f"vt3d {name}: the tap gave frames over the MTU"
    print(f"VXLAN frames sent: host 1 {after[1] - before[1]}, host 2 {after[2] - before[2]}")


def test_hosts_mss(two_hosts):
    """a connection across hosts, vt3↔vt3 and vt3↔siw, agrees on MSS 1410 (MTU 1450 less 40) at both ends"""
    h = two_hosts
    for server, port in ((h.vm1, 7177), (h.vm3, 7178)):
        # Pings enough to keep the connection up while vt3d's TCBs are read.
        server.spawn(f"rping -s -a {server.ip} -p {port} -C 400", "mss-srv", 300)
        wait_rdma_listen(server, port)
        h.vm2.spawn(f"rping -c -a {server.ip} -p {port} -C 400", "mss-cli", 300)
        seen: list[dict] = []
        deadline = time.monotonic() + 60
        while not seen and time.monotonic() < deadline and h.vm2.running("mss-cli"):
            seen = live_tcbs(h.vt3d["vm2"], port)
            time.sleep(0.1)
        for tag, g in (("mss-cli", h.vm2), ("mss-srv", server)):
            r = g.join(tag, 240)
            assert r.rc == 0, f"rping {tag} on {g.name}: exit {r.rc}:\n{tail(r.out)}"
        assert seen, f"no established connection to {server.name}:{port} seen in vt3d vm2"
        assert (seen[0]["mss"], seen[0]["peer_mss"]) == (MSS, MSS), f"vm2 → {server.name}: {seen[0]}"


def test_hosts_mtu(two_hosts):
    """a guest frame over the fabric's MTU is never sent silently: vt3d drops it, counts it (nic.tx_dropped_oversize) and logs why; at the MTU it passes"""  # noqa: E501
    h = two_hosts
    d = h.vt3d["vm1"]
    before = nic(d, "tx_dropped_oversize")
    # 1422 octets of ICMP data: 1450-byte IP packets, that fit; at MTU
    # 1500, 1472 octets make 1514-byte frames (busybox ping sets no DF:
    # the guest would fragment anything larger).
    h.vm1.check(f"ping -c 3 -W 5 -s {MTU - 28} {h.vm2.ip}", 60, "pings at the MTU")
    assert nic(d, "tx_dropped_oversize") == before
    h.vm1.check("ip link set eth0 mtu 1500", 10)
    try:
        r = h.vm1.run(f"ping -c 3 -W 2 -s 1472 {h.vm2.ip}", 60)
    finally:
        h.vm1.check(f"ip link set eth0 mtu {MTU}", 10)
    assert r.rc != 0 and "3 packets transmitted, 0 packets received" in r.out, f"1500-byte pings:\n{r.out}"
    dropped = nic(d, "tx_dropped_oversize") - before
    assert dropped == 3, f"vt3d vm1 counted {dropped} oversize frames, want the 3 pings"
    log = d.log.read_text(errors="replace")
    want = f"dropped a 1514-byte frame from the guest: over the uplink's MTU {MTU} (frames up to {MTU + 18} bytes)"
    assert want in log, f"vt3d vm1's log does not say why:\n{d.log_tail()}"


def test_hosts_perftest(two_hosts):
    """ib_write_bw (64 KiB) and ib_send_lat (64 B) vt3↔vt3 across hosts (vm2 → vm1): the data crosses VXLAN; figures printed"""  # noqa: E501
    h = two_hosts
    size, iters = 65536, 200
    tx0 = h.fabric.link_stats(2, "vx0")["tx_bytes"]
    bw = perftest(h.vm1, h.vm2, "ib_write_bw", size, iters, setup=h)
    crossed = h.fabric.link_stats(2, "vx0")["tx_bytes"] - tx0
    assert crossed >= size * iters, f"host 2's vx0 sent {crossed} bytes, less than the {size * iters} written"
    lat = perftest(h.vm1, h.vm2, "ib_send_lat", 64, 200, setup=h)
    print(f"across hosts (VXLAN, MTU {MTU}): ib_write_bw {size} B {bw.value:.1f} MB/s; "
          f"ib_send_lat 64 B t_avg {lat.value:.1f} µs; host 2's vx0 sent {crossed} bytes", flush=True)


COMPARE_ROUNDS = 3
COMPARED = (("one host, bridge", 1, "l2"), ("two hosts, VXLAN", 2, "vxlan"), ("two hosts, L2", 2, "l2"))


@pytest.mark.soak
def test_hosts_perftest_compare(lab):
    """ib_write_bw 64 KiB and ib_send_lat 64 B between two vt3 guests on one host (taps in one bridge), on two hosts over VXLAN and over one L2 segment: the medians of 3 rounds each, side by side"""  # noqa: E501
    rows = []
    for label, hosts, fabric in COMPARED:
        def make(cfg, rundir, hosts=hosts, fabric=fabric):
            return Hosts(cfg, rundir, 2, hosts=hosts, fabric=fabric)
        setup = lab.fresh(make)
        try:
            bw, lat = [], []
            for _ in range(COMPARE_ROUNDS):
                bw.append(perftest(setup.vm1, setup.vm2, "ib_write_bw", 65536, 200, setup=setup).value)
                lat.append(perftest(setup.vm1, setup.vm2, "ib_send_lat", 64, 200, setup=setup).value)
            rows.append(f"{label:18s} MTU {setup.fabric.mtu}: ib_write_bw {statistics.median(bw):7.1f} MB/s "
                        f"({min(bw):.1f}–{max(bw):.1f}), ib_send_lat t_avg {statistics.median(lat):7.1f} µs "
                        f"({min(lat):.1f}–{max(lat):.1f})")
        finally:
            lab.release(setup)
            assert setup.left == [], f"{label}: left behind: {setup.left}"
    print("\n".join(["vt3↔vt3, medians of 3 (min–max):", *rows]), flush=True)


# ------------------------------------------------------------------ nvme

# The fabric's outages: shorter than vt3d's TCP timeout (retransmitted
# over), and one held until nvme-rdma gives the controller up.
SHORT_OUTAGE = 1.5
RECONNECT_DELAY, CTRL_LOSS_TMO = 1, 2
LOSS_WAIT = 120


def short_outage(h, host, ctrl: str, dev: str, jobs):
    """fio writes; host 2's VXLAN device goes down for SHORT_OUTAGE s and
    up again: vt3d retransmits, no queue breaks, no reconnect, fio's
    verify passes."""
    mark = kmark(host)
    d = h.vt3d[host.name]
    host.spawn(fio_command(dev, jobs), "fio", 600)
    busiest_io_queue(d, host)
    retrans = sum(t["retransmits"] for t in d.ctl("tcb"))
    h.fabric.set_uplink(2, False)
    time.sleep(SHORT_OUTAGE)
    h.fabric.set_uplink(2, True)
    r = host.join("fio", 600)
    log = kmsg_since(host, mark)
    assert count(log, r"starting error recovery") == 0, f"a {SHORT_OUTAGE} s outage broke a queue:\n{tail(log, 30)}"
    later = sum(t["retransmits"] for t in d.ctl("tcb"))
    assert later > retrans, f"no retransmission over a {SHORT_OUTAGE} s outage ({retrans} → {later})"
    assert host.check(f"cat /sys/class/nvme/{ctrl}/state", 10).strip() == "live"
    print(f"{SHORT_OUTAGE} s outage: {later - retrans} retransmissions, no reconnect", flush=True)
    return r


def rst_then_short_outage(h, host, ctrl: str, dev: str, jobs, mark: str):
    r = recovered_under_fio(h.vt3d[host.name], host, ctrl, dev, jobs, "rst")
    check_fio(host, r.rc, r.out, jobs)
    return short_outage(h, host, ctrl, dev, jobs)


def long_outage(h, target, host) -> None:
    """fio writes; host 2's VXLAN device goes down and stays down past
    vt3d's TCP timeout: the queues end in QP_FATAL, every reconnect fails,
    and after ctrl-loss-tmo nvme-rdma removes the controller (fio: EIO).
    Then the link comes back, nothing is left in either vt3d but the pool
    CQs, and no kernel warning."""
    marks = {g.name: kmark(g) for g in (target, host)}
    target_up(target, target.ip)
    ctrl, dev = host_connect(host, target.ip, f"--reconnect-delay {RECONNECT_DELAY} --ctrl-loss-tmo {CTRL_LOSS_TMO}")
    host.spawn(fio_command(dev, FAULT_JOBS), "fio", 600)
    busiest_io_queue(h.vt3d[host.name], host)
    t0 = time.monotonic()
    h.fabric.set_uplink(2, False)
    try:
        host.check(f"for i in $(seq {LOSS_WAIT * 5}); do [ -e /sys/class/nvme/{ctrl} ] || exit 0; "
                   "sleep 0.2; done; exit 1", LOSS_WAIT + 30, f"{ctrl} still there after {LOSS_WAIT} s")
    finally:
        down_for = time.monotonic() - t0
        h.fabric.set_uplink(2, True)
    assert down_for > HOSTS_TCP_TIMEOUT, f"the controller was gone after {down_for:.1f} s, before the TCP timeout"
    failed = controller_lost(host, ctrl, marks[host.name])
    host.check("rmmod nvme_rdma nvme_fabrics", 60, "unloading nvme-rdma")
    unload_shared(host, "unloading the modules nvme-rdma used")
    # The target's side timed out too: nvmet let its queues go.
    target_down(target)
    for g in (target, host):
        held = h.vt3d[g.name].wait_held({"pd": 0, "mr": 0, "cq": 1, "qp": 0, "srq": 0}, timeout=60)
        assert held == {"pd": 0, "mr": 0, "cq": 1, "qp": 0, "srq": 0}, \
            f"vt3d {g.name} holds {held} after the controller loss, want the pool CQ and nothing else"
        g.check("rdma link del vt3_0 && rdma link add vt3_0 type vt3 netdev eth0", 60, "re-adding vt3_0")
        wait_device(g)
        no_kernel_trouble(g, marks[g.name])
    print(f"fabric down {down_for:.1f} s: {failed} failed reconnect attempt(s), then the controller was removed",
          flush=True)


def test_hosts_nvme(two_hosts):
    """nvme-rdma across hosts under fio verify (target vm1 on host 1, host vm2 on host 2): an RST (one reconnect), the VXLAN device down 1.5 s (retransmitted over, no reconnect), then down past the TCP timeout (controller loss, EIO); no leak, no warning"""  # noqa: E501
    h = two_hosts
    nvme_over_rdma(h, h.vm1, h.vm2, ["vm1"], ["vm2"], fault=rst_then_short_outage, jobs=FAULT_JOBS)
    long_outage(h, h.vm1, h.vm2)
    # The fabric is back: the guests reach each other again.
    h.vm2.check(f"ping -c 2 -W 5 {h.vm1.ip}", 60, "no way back across the fabric")
    no_objects(h, "after the controller loss")


# ------------------------------------------------------------------ pcap

def dumpcap(h, host: int, dev: str, path: Path) -> Process:
    p = Process(f"dumpcap {dev}", [*h.fabric.exec_prefix(host), "dumpcap", "-q", "-i", dev, "-w", str(path)],
                path.with_suffix(".log"), 300)
    assert wait_for(lambda: path.exists() and path.stat().st_size > 0 or not p.alive(), 20), \
        f"dumpcap on {dev} did not start: {path.with_suffix('.log').read_text()[-500:]}"
    assert p.alive(), f"dumpcap on {dev} exited: {path.with_suffix('.log').read_text()[-500:]}"
    return p


def tshark_fields(pcap: Path, display_filter: str, *fields: str) -> list[list[str]]:
    argv = [tshark_bin(), "-n", "-r", str(pcap), *TSHARK_OPTS, "-Y", display_filter, "-T", "fields",
            "-E", "occurrence=a", "-E", "aggregator=;"]
    for f in fields:
        argv += ["-e", f]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"tshark -Y '{display_filter}' {pcap.name}: exit {r.returncode}: {r.stderr[-800:]}"
    return [line.split("\t") for line in r.stdout.splitlines()]


def test_hosts_pcap(two_hosts):
    """captures on host 2's underlay (eth0) and VXLAN device (vx0) during rping vm2 → vm1 decode in tshark: VXLAN VNI 77 around TCP around MPA/DDP/RDMAP (SEND, READ request and response, WRITE), no frame malformed, none over the MTU"""  # noqa: E501
    h = two_hosts
    caps = {dev: h.dir / f"host2-{dev}.pcapng" for dev in ("eth0", "vx0")}
    procs = {dev: dumpcap(h, 2, dev, path) for dev, path in caps.items()}
    try:
        rping_between(h.vm1, h.vm2, 20, port=7179)
    finally:
        for p in procs.values():
            p.stop()
    ops = {"0x00": "WRITE", "0x01": "READ request", "0x02": "READ response", "0x03": "SEND"}
    for dev, path in caps.items():
        vxlan = dev == "eth0"
        base = "vxlan.vni == 77 && " if vxlan else ""
        rows = tshark_fields(path, f"{base}iwarp_rdma", "iwarp_rdma.opcode")
        seen = {op for row in rows for op in row[0].split(";") if op}
        assert set(ops) <= seen, f"{dev}: RDMAP opcodes {sorted(seen)}, want {sorted(ops)} ({ops})"
        for step in ("req", "rep"):
            assert tshark_fields(path, f"{base}iwarp_mpa.{step}", "frame.number"), f"{dev}: no MPA {step}"
        bad = tshark_fields(path, "_ws.malformed || _ws.expert.severity == error", "frame.number", "_ws.col.Info")
        assert not bad, f"{dev}: frames malformed or in error: {bad[:5]}"
        # The inner frames keep to the MTU (eth0 frames carry 50 octets of VXLAN more).
        limit = MAX_FRAME + (50 if vxlan else 0)
        big = tshark_fields(path, f"frame.len > {limit}", "frame.number", "frame.len")
        assert not big, f"{dev}: frames over {limit} octets: {big[:5]}"
        print(f"{dev}: {len(rows)} frames with RDMAP, opcodes {sorted(seen)}", flush=True)


# --------------------------------------------------------------- clean-up

def test_hosts_cleanup(vt3_config, tmp_path):
    """a fabric with vt3d running in a host, left by a failing block, leaves nothing (namespace, bridge, tap, veth, VXLAN device, process), checked by name and pid; one whose owner was killed is swept by the next"""  # noqa: E501
    f = Fabric(2)
    vt3d = None
    try:
        f.create()
        tap = f.add_tap(1, "tap-x")
        vt3d = Process("vt3d", [*f.exec_prefix(1), str(vt3_config.vt3d), "serve", "--socket", str(tmp_path / "s"),
                                "--uplink", f"tap:{tap}", "--mtu", str(f.mtu), "--insecure-no-key"],
                       tmp_path / "vt3d.log", 60)
        assert wait_for(lambda: (tmp_path / "s").exists() or not vt3d.alive(), 10), "vt3d made no socket"
        assert pids_in(f.host(1)) == [vt3d.pid], f"host 1 runs {pids_in(f.host(1))}, want vt3d {vt3d.pid}"
        raise RuntimeError("a test failing with the fabric up")
    except RuntimeError as e:
        assert "failing" in str(e), e
    finally:
        left = f.destroy()
    assert left == [], f"left behind: {left}"
    assert vt3d is not None and not vt3d.alive(), "vt3d outlived its host's namespace"
    vt3d.stop()
    assert not [ns for ns in namespaces() if ns.startswith(f.stem)], namespaces()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert "tap-x" not in links and "vx0" not in links, f"interfaces left in the host:\n{links}"
    # The owner killed with -9: its namespaces stay until the next fabric sweeps them.
    child = subprocess.run(
        ["python3", "-c", "import os, sys, signal; sys.path.insert(0, sys.argv[1]); from vt3lab.fabric import Fabric; "
         "f = Fabric(2).create(); print(f.stem, flush=True); os.kill(os.getpid(), signal.SIGKILL)",
         str(Path(__file__).resolve().parents[2])], capture_output=True, text=True, timeout=60)
    stem = child.stdout.strip()
    assert child.returncode == -9 and stem, f"child: exit {child.returncode}, {child.stdout} {child.stderr}"
    orphans = [ns for ns in namespaces() if ns.startswith(stem + "-")]
    assert len(orphans) == 3, f"the killed owner's namespaces: {orphans}"
    swept = sweep_stale()
    assert sorted(swept) == sorted(orphans), f"swept {swept}, want {orphans}"
    assert not [ns for ns in namespaces() if ns.startswith(stem)], namespaces()
