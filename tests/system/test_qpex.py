"""libvt3's extended verbs: ibv_qp_ex (ibv_wr_* posting), ibv_cq_ex
(ibv_start_poll ... ibv_wc_read_*), parent and thread domains with the
application's allocators, and an SRQ slot held by a completion a QP's
destroy discarded: vt3-qpex over a loopback connection in one vt3 guest
(guest-tools/vt3-qpex.c lists its checks)."""

from helpers import A_IP, no_objects, summary
from vt3lab.tools import tail

PORT = 7476
# vt3-qpex's checks, in the order it makes them.
QPEX_CHECKS = ("refuse-ops", "refuse-wc", "empty", "allocators", "not-connected", "batch", "mixed",
               "abort", "too-many-sges", "inline-too-long", "read-inline", "setter-first", "ring-full",
               "still-works", "srq-arrived", "local-inv", "srq-forget", "srq-full-again",
               "domain-free", "busy")


def test_qpex(single_vt3):
    """vt3-qpex: ibv_wr_* batches of every op (SGE lists, inline, abort, ENOMEM/EINVAL at wr_complete, nothing half-posted), ibv_cq_ex and ibv_poll_cq mixed on one CQ with each completion once, parent-domain allocators, an SRQ slot freed by a QP's destroy"""  # noqa: E501
    a = single_vt3.a
    r = a.run(f"vt3-qpex --addr {A_IP} --port {PORT} --timeout 60", 240)
    fails = [line for line in r.out.splitlines() if line.startswith("FAIL")]
    assert not fails, f"vt3-qpex: {len(fails)} check(s) failed (exit {r.rc}):\n{tail(r.out)}"
    oks = [line[5:] for line in r.out.splitlines() if line.startswith("ok   ")]
    assert tuple(oks) == QPEX_CHECKS, f"vt3-qpex checks {oks}, want {QPEX_CHECKS}:\n{tail(r.out)}"
    assert summary(r.out, "vt3-qpex") == (len(QPEX_CHECKS), 0), f"vt3-qpex:\n{tail(r.out)}"
    assert r.rc == 0, f"vt3-qpex exit {r.rc}:\n{tail(r.out)}"
    no_objects(single_vt3, "after vt3-qpex")
