"""Shared receive queues (docs/architecture.md §3.4, docs/events.md):
vt3-srqtest's conformance run of a user SRQ under two QPs, with an RST on
one of them injected from the host, and the kernel SRQ scenario of
vt3_ktest.ko."""

import re

from helpers import A_IP, B_IP, count, no_objects, summary, wait_rdma_listen
from test_cm import kmark, kmsg_since
from vt3lab import KMOD
from vt3lab.setups import wait_device
from vt3lab.tools import tail

PORT = 7475
# vt3-srqtest srq's checks (its header comment lists them).
SRQ_CHECKS = ("create", "query", "modify", "shared", "limit-not-yet", "limit",
              "limit-once", "limit-query", "limit-rearm", "limit-data", "last-wqe", "no-flush",
              "survive", "exactly-once", "resize-einval", "resize", "resize-post", "resize-traffic",
              "resize-smaller", "busy", "destroy")


def wait_line(g, tag: str, pattern: str, timeout: int = 120) -> re.Match:
    """The first line of /tmp/TAG.out matching PATTERN (an ERE), within
    TIMEOUT; fails with the output when the program ended without one."""
    r = g.run(f"i=0; while [ $i -lt {timeout * 10} ]; do grep -Eq '{pattern}' /tmp/{tag}.out && break; "
              f"[ -e /tmp/{tag}.rc ] && break; sleep 0.1; i=$((i+1)); done; "
              f"grep -E '{pattern}' /tmp/{tag}.out || "
              f"{{ cat /tmp/{tag}.out; echo \"(exit $(cat /tmp/{tag}.rc 2>/dev/null))\"; exit 1; }}",
              timeout + 10)
    m = re.search(pattern, r.out, re.M)
    assert r.rc == 0 and m, f"{g.name}: no '{pattern}' from {tag}:\n{tail(r.out)}"
    return m


def sides(setup):
    """(the SRQ side: a vt3 guest, its vt3d, its IP; the peer guest): b
    of a vt3 pair, a of vt3-siw (whose b is the siw peer)."""
    if "vt3b" in setup.vt3d:
        return setup.b, setup.vt3b, B_IP, setup.a
    return setup.a, setup.vt3a, A_IP, setup.b


def run_srqtest(setup, lost: bool = False, errored: bool = False):
    """vt3-srqtest srq in the SRQ side (on vt3), its peer in the other
    guest; on the srq side's READY line the host faults the SRQ side's
    vt3d: an RST on QP 1's connection, or (LOST) device-fatal, with both
    QPs moved to ERR before it if ERRORED. Returns (srq side, peer) results."""
    b, vt3d, srq_ip, a = sides(setup)
    b.spawn(f"vt3-srqtest srq --port {PORT} --timeout 60 --fault-wait 60" +
            (" --lost-errored" if errored else " --lost" if lost else ""), "srq", 400)
    try:
        wait_rdma_listen(b, PORT)
        a.spawn(f"vt3-srqtest peer --server {srq_ip} --port {PORT} --timeout 60", "srqpeer", 400)
        if lost or errored:
            wait_line(b, "srq", r"^READY-LOST ([0-9]+) ([0-9]+)$")
            answer = vt3d.ctl("fault", "device-fatal")
            assert isinstance(answer, dict) and answer.get("detail", "").startswith("device fatal: 2 QPs"), \
                f"vt3d {vt3d.name} fault device-fatal: {answer!r}"
        else:
            m = wait_line(b, "srq", r"^READY ([0-9]+) ([0-9]+)$")
            qpn1 = int(m.group(1))
            # The srq side's own vt3d resets QP 1's connection: RST sent, QP 1 in ERROR.
            answer = vt3d.ctl("fault", "rst", "--qp", str(qpn1))
            assert isinstance(answer, dict) and answer.get("fault") == "rst" and answer.get("qp") == qpn1, \
                f"vt3d {vt3d.name} fault rst --qp {qpn1}: {answer!r}"
        s = b.join("srq", 300)
        p = a.join("srqpeer", 120)
    except BaseException:
        for g, tag in ((b, "srq"), (a, "srqpeer")):
            try:
                g.run(f"kill -KILL $(cat /tmp/{tag}.pid) 2>/dev/null; true", 10)
            except Exception:
                pass
        raise
    print("\n" + s.out)
    return s, p


def check_srqtest(s, checks) -> None:
    fails = [line for line in s.out.splitlines() if line.startswith("FAIL ")]
    assert not fails, f"vt3-srqtest srq: {len(fails)} check(s) failed (exit {s.rc}):\n{tail(s.out)}"
    assert summary(s.out, "vt3-srqtest") == (len(checks), 0), f"vt3-srqtest srq:\n{tail(s.out)}"
    for name in checks:
        assert count(s.out, rf"^ok   {re.escape(name)}$") == 1, f"check {name} did not pass once:\n{tail(s.out)}"
    assert s.rc == 0, f"vt3-srqtest srq exit {s.rc}:\n{tail(s.out)}"


def test_srq(vt3_pair):
    """vt3-srqtest: one SRQ, two QPs over it, verified data, exact wr_id accounting, the limit event once per arm, RST on one QP (LAST_WQE_REACHED, nothing flushed, the other QP consumes the rest), destroy BUSY while in use"""  # noqa: E501
    s, p = run_srqtest(vt3_pair)
    check_srqtest(s, SRQ_CHECKS)
    assert p.rc == 0 and "vt3-srqtest peer: done" in p.out, f"vt3-srqtest peer exit {p.rc}:\n{tail(p.out)}"
    no_objects(vt3_pair, "after vt3-srqtest")


def test_srq_siw(vt3_siw):
    """vt3-srqtest as in srq, the SRQ on vt3, the peer on siw"""
    s, p = run_srqtest(vt3_siw)
    check_srqtest(s, SRQ_CHECKS)
    assert p.rc == 0 and "vt3-srqtest peer: done" in p.out, f"vt3-srqtest peer exit {p.rc}:\n{tail(p.out)}"
    no_objects(vt3_siw, "after vt3-srqtest")


# vt3_ksrq's CHECKs when everything works (msgs=10), read off its source:
# create, query, 32 posted, QP 1 and QP 2 on the SRQ, destroy refused
# while in use, the control SEND, a resize below the 32 posted refused,
# a resize to twice the size while the peer sends, 2 + 20 receives, DONE, LAST_WQE_REACHED once
# per QP, no SRQ receive flushed by the QPs' error, nothing after the
# destroy, the SRQ destroyed.
KSRQ_CHECKS = 15
KSRQ_PORT = 7476


def check_ksrq_log(log: str, want: int) -> None:
    """vt3_ksrq's kernel log: no FAIL line, exactly WANT checks passed, one ok line each."""
    passed, failed = summary(log, "vt3_ksrq:")
    fails = [line for line in log.splitlines() if line.startswith("vt3_ksrq: FAIL")]
    assert failed == 0 and not fails, f"vt3_ksrq: {failed} failed:\n" + "\n".join(fails[:5]) + f"\n{tail(log, 30)}"
    assert passed == want, f"vt3_ksrq: {passed} passed, want {want}:\n{tail(log, 30)}"
    assert count(log, r"^vt3_ksrq: ok ") == passed, f"ok lines differ from the summary:\n{tail(log, 30)}"


def kill_ksrq_peer(a) -> None:
    """Ends the vt3-srqtest peer of a failed kernel SRQ case (a dead guest is fine)."""
    try:
        a.run("kill -KILL $(cat /tmp/ksrqpeer.pid) 2>/dev/null; true", 10)
    except Exception:
        pass


def run_ksrq(setup) -> None:
    b, _, srq_ip, a = sides(setup)
    mb = kmark(b)
    b.spawn(f"insmod {KMOD}/vt3_ksrq.ko port={KSRQ_PORT}", "ksrq", 300)
    try:
        wait_rdma_listen(b, KSRQ_PORT)
        a.spawn(f"vt3-srqtest peer --server {srq_ip} --port {KSRQ_PORT} --timeout 60", "ksrqpeer", 300)
        k = b.join("ksrq", 240)
        p = a.join("ksrqpeer", 120)
    except BaseException:
        kill_ksrq_peer(a)
        raise
    log = kmsg_since(b, mb)
    assert k.rc == 0, f"insmod vt3_ksrq: exit {k.rc}: {k.out}\n{tail(log)}"
    check_ksrq_log(log, KSRQ_CHECKS)
    assert p.rc == 0 and "vt3-srqtest peer: done (11 + 11 SENDs)" in p.out, \
        f"vt3-srqtest peer exit {p.rc}:\n{tail(p.out)}"
    b.check("rmmod vt3_ksrq", 30)
    no_objects(setup, "after vt3_ksrq")


def test_vt3_ksrq(vt3_pair):
    """kernel SRQ (vt3_ksrq.ko) under two kernel QPs, a vt3-srqtest peer sending on both: wc->qp, data, wr_ids once, LAST_WQE_REACHED, destroy"""  # noqa: E501
    run_ksrq(vt3_pair)


def test_vt3_ksrq_siw(vt3_siw):
    """kernel SRQ (vt3_ksrq.ko) on vt3 as in vt3-ksrq, the vt3-srqtest peer on siw"""
    run_ksrq(vt3_siw)


LOST_CHECKS = ("create", "query", "modify", "shared", "limit-not-yet", "lost-events",
               "lost-post", "lost-flush", "lost-once")


def test_srq_device_fatal(fresh_vt3_pair):
    """vt3-srqtest --lost: vt3d ctl fault device-fatal under a user SRQ of two QPs: LAST_WQE_REACHED on both, DEVICE_FATAL, every SRQ WR (also one posted after the loss) flushed once on one QP (vt3_hw.h's device-loss rule)"""  # noqa: E501
    p = fresh_vt3_pair
    s, peer = run_srqtest(p, lost=True)
    check_srqtest(s, LOST_CHECKS)
    assert peer.rc == 0 and "vt3-srqtest peer: ended by the other side" in peer.out, \
        f"vt3-srqtest peer exit {peer.rc}:\n{tail(peer.out)}"
    # A fatal device still destroys (DESTROY_SRQ among them): nothing held.
    no_objects(p, "after device-fatal under a user SRQ")
    p.b.check(f"rmmod vt3 && insmod {KMOD}/vt3.ko", 60)
    wait_device(p.b)
    no_objects(p, "after vt3.ko's reload")


def test_srq_device_fatal_errored(fresh_vt3_pair):
    """vt3-srqtest --lost-errored: both QPs of a user SRQ moved to ERR and their errors noted by libvt3 (nothing of the SRQ flushed), then vt3d ctl fault device-fatal: every SRQ WR still flushed once on one QP"""  # noqa: E501
    p = fresh_vt3_pair
    s, peer = run_srqtest(p, errored=True)
    check_srqtest(s, LOST_CHECKS[:5] + ("lost-errored",) + LOST_CHECKS[5:])
    assert peer.rc == 0, f"vt3-srqtest peer exit {peer.rc}:\n{tail(peer.out)}"
    no_objects(p, "after device-fatal under a user SRQ of QPs in ERR")
    p.b.check(f"rmmod vt3 && insmod {KMOD}/vt3.ko", 60)
    wait_device(p.b)
    no_objects(p, "after vt3.ko's reload")


# lost=1: the first 10 checks, then DEVICE_FATAL with LAST_WQE_REACHED on
# both QPs, the post after the loss, the 12 receives flushed once on one
# QP, nothing more; then the 4 of the teardown (no DONE: the device is dead).
KSRQ_LOST_CHECKS = 18


def test_vt3_ksrq_device_fatal(fresh_vt3_pair):
    """kernel SRQ (vt3_ksrq.ko lost=1): vt3d ctl fault device-fatal under two kernel QPs of one SRQ: LAST_WQE_REACHED on both, every SRQ receive not completed (one posted after the loss too) flushed once on one QP"""  # noqa: E501
    p = fresh_vt3_pair
    a, b = p.a, p.b
    mb = kmark(b)
    b.spawn(f"insmod {KMOD}/vt3_ksrq.ko port={KSRQ_PORT} lost=1", "ksrq", 300)
    try:
        wait_rdma_listen(b, KSRQ_PORT)
        a.spawn(f"vt3-srqtest peer --server {B_IP} --port {KSRQ_PORT} --timeout 60", "ksrqpeer", 300)
        b.check("for i in $(seq 600); do dmesg | grep -q 'vt3_ksrq: READY-LOST' && exit 0; "
                "[ -e /tmp/ksrq.rc ] && break; sleep 0.1; done; dmesg | tail -30; exit 1", 70,
                "vt3_ksrq never READY-LOST")
        answer = p.vt3b.ctl("fault", "device-fatal")
        assert isinstance(answer, dict) and answer.get("detail", "").startswith("device fatal: 2 QPs"), \
            f"vt3d vt3b fault device-fatal: {answer!r}"
        k = b.join("ksrq", 240)
        peer = a.join("ksrqpeer", 120)
    except BaseException:
        kill_ksrq_peer(a)
        raise
    log = kmsg_since(b, mb)
    assert k.rc == 0, f"insmod vt3_ksrq lost=1: exit {k.rc}: {k.out}\n{tail(log)}"
    check_ksrq_log(log, KSRQ_LOST_CHECKS)
    assert peer.rc == 0 and "vt3-srqtest peer: ended by the other side (11 + 11 SENDs)" in peer.out, \
        f"vt3-srqtest peer exit {peer.rc}:\n{tail(peer.out)}"
    # A fatal device still destroys (DESTROY_SRQ among them): nothing held.
    no_objects(p, "after device-fatal under a kernel SRQ")
    b.check(f"rmmod vt3_ksrq && rmmod vt3 && insmod {KMOD}/vt3.ko", 60)
    wait_device(b)
    no_objects(p, "after vt3.ko's reload")
