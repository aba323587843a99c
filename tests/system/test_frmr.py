"""Fast registration (memory management extensions) as kernel storage ULPs
use it: vt3_kfrmr between two guests. The server (a, always vt3) owns the
fast-reg MRs and enforces the rules; the client (b) is the peer: vt3, or
siw (which supports FRMR) for interoperability."""

from helpers import A_IP, count, no_objects, summary, wait_rdma_listen
from test_cm import kmark, kmsg_since
from vt3lab import KMOD
from vt3lab.tools import tail

# How many CHECKs vt3_kfrmr passes when everything works, counted from its
# source (guest-driver/tests/vt3_kfrmr.c), scenario by scenario:
#   server: 0: map, REG_MR, WITH_INVALIDATE of the rkey, data placed,
#              re-registered under a new key, data placed through it,
#              LOCAL_INV, ACCESS_ERR for the old rkey, nothing placed (9);
#           1: registered, LOCAL_INV, ACCESS_ERR for the READ (3);
#           2, 3: REM_INV_REQ_ERR and ACCESS_ERR (2 each);
#           4: registered, LOC_QP_OP_ERR, REG_MR and LOCAL_INV flushed (4);
#           5: registered (1).
#   client: 0: sink registered, READ, its data, WRITE, SEND_WITH_INV, a
#              new rkey, WRITE through it, LOCAL_INV, the end (9);
#           1: the READ fails, the end (2); 2, 3, 4: the end (1 each);
#           5: sink registered, READ_WITH_INV, its data, a second READ
#              into the sink fails, the end (5).
# A check that was skipped (a path not taken) is a failure too.
KFRMR_SERVER_CHECKS = 21
KFRMR_CLIENT_CHECKS = 19
KFRMR_SCENARIOS = 6


def kfrmr(setup) -> None:
    a, b = setup.a, setup.b
    ma, mb = kmark(a), kmark(b)
    a.check(f"insmod {KMOD}/vt3_kfrmr.ko server=1", 30)
    wait_rdma_listen(a, 7779)
    r = b.run(f"insmod {KMOD}/vt3_kfrmr.ko addr={A_IP}", 900)
    blog = kmsg_since(b, mb)
    assert r.rc == 0, f"insmod vt3_kfrmr (client): exit {r.rc}: {r.out}\n{tail(blog)}"
    # The server logs a summary after each connection's teardown.
    done = a.run("for i in $(seq 300); do "
                 f"[ $(dmesg | grep -c 'vt3_kfrmr: server: ') -ge {KFRMR_SCENARIOS} ] && exit 0; "
                 "sleep 0.2; done; exit 1", 90).ok
    alog = kmsg_since(a, ma)
    fails = [line for log in (blog, alog) for line in log.splitlines() if line.startswith("vt3_kfrmr: FAIL")]
    passed, failed = summary(blog, "vt3_kfrmr: client:")
    assert failed == 0 and not fails, f"client: {failed} failed; client and server FAILs:\n" + "\n".join(fails[:12])
    assert passed == KFRMR_CLIENT_CHECKS, f"client: {passed} passed, want {KFRMR_CLIENT_CHECKS}:\n{tail(blog, 40)}"
    assert count(blog, r"^vt3_kfrmr: ok ") == passed, f"client: ok lines differ from the summary:\n{tail(blog, 40)}"
    assert done, f"fewer server summaries than scenarios:\n{tail(alog, 40)}"
    passed, failed = summary(alog, "vt3_kfrmr: server:")
    assert failed == 0, f"server: {failed} failed:\n{tail(alog, 40)}"
    assert passed == KFRMR_SERVER_CHECKS, f"server: {passed} passed, want {KFRMR_SERVER_CHECKS}:\n{tail(alog, 40)}"
    assert count(alog, r"^vt3_kfrmr: ok ") == passed, f"server: ok lines differ from the summary:\n{tail(alog, 40)}"
    b.check("rmmod vt3_kfrmr", 60)
    a.check("rmmod vt3_kfrmr", 60)
    no_objects(setup, "after the fast registration test")


def test_vt3_kfrmr(vt3_pair):
    """two vt3 guests: fast registration, READ into a fast-reg sink, SEND_WITH_INV, LOCAL_INV, key rotation, the rules"""  # noqa: E501
    kfrmr(vt3_pair)


def test_vt3_kfrmr_siw(vt3_siw):
    """vt3 owns fast-reg MRs, siw is the peer: the same scenarios"""
    kfrmr(vt3_siw)
