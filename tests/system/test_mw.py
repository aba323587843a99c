"""Memory windows (docs/memory-windows.md): vt3-mwtest between two
guests. The owner (guest a, vt3) binds type 1 and type 2 windows over an
MR that grants no remote access of its own; the peer (guest b: vt3, or
siw, which needs no MW support to use an rkey) WRITEs and READs through
them, invalidates them with SEND_WITH_INV, and sees its access refused
after every kind of invalidation. vt3d's log must name the TERMINATE each
refusal sent."""

import re

from helpers import A_IP, no_objects, summary, wait_rdma_listen
from vt3lab.tools import tail

PORT = 7481
# vt3-mwtest's checks (its header comment lists them).
OWNER_CHECKS = ("type1-bind", "type1-access", "type1-unbind", "type1-after-unbind",
                "type2-bind", "type2-access", "type2-local-inv", "type2-after-local-inv",
                "type2-rebind", "type2-access-again", "type2-remote-inv", "type2-after-remote-inv",
                "type1-rebind", "type1-remote-inv-refused", "type1-remote-inv-event",
                "rules-bind", "rules-dereg-busy", "rules-dealloc-dereg", "rules-type3",
                "rules-bind-err", "rules-bind-err-event", "rules-bind-err-qp")
PEER_CHECKS = ("peer-access", "type1-peer-read-fails", "peer-access", "type2-local-peer-read-fails",
               "peer-access", "type2-remote-peer-read-fails", "type1-remote-inv-peer")
# What the owner's vt3d logs for each refusal, in order: the peer's READs
# through an unbound or invalidated window (an invalid STag: RDMAP remote
# protection 0/1/00), the peer's SEND_WITH_INV of a type 1 window (0/1/09).
TERMINATES = (r"RDMA READ source: invalid STag: TERMINATE sent \(RdmapInvalidStag\)",) * 3 + (
    r"cannot invalidate the STag: access rights violation: TERMINATE sent "
    r"\(RdmapProtectionStagCannotBeInvalidated\)",)


def checks_of(out: str) -> list[str]:
    return re.findall(r"^ok   (\S+)$", out, re.M)


def mwtest(setup) -> None:
    a, b = setup.a, setup.b
    log = setup.vt3a.log
    start = log.stat().st_size
    a.spawn(f"vt3-mwtest owner --port {PORT} --timeout 60", "mwowner", 400)
    try:
        wait_rdma_listen(a, PORT)
        p = b.run(f"timeout 400 vt3-mwtest peer --server {A_IP} --port {PORT} --timeout 60 -v", 420)
        o = a.join("mwowner", 120)
    except BaseException:
        a.run("kill -KILL $(cat /tmp/mwowner.pid) 2>/dev/null; true", 10)
        raise
    print("\nowner:\n" + o.out + "\npeer:\n" + p.out)
    for prog, r, want in (("owner", o, OWNER_CHECKS), ("peer", p, PEER_CHECKS)):
        fails = [line for line in r.out.splitlines() if line.startswith("FAIL ")]
        assert not fails and r.rc == 0, f"vt3-mwtest {prog}: exit {r.rc}:\n" + "\n".join(fails) + "\n" + tail(r.out)
        assert summary(r.out, "vt3-mwtest") == (len(want), 0), f"vt3-mwtest {prog}:\n{tail(r.out)}"
        assert checks_of(r.out) == list(want), f"vt3-mwtest {prog}: checks {checks_of(r.out)}"
    with open(log, errors="replace") as f:
        f.seek(start)
        text = f.read()
    sent = re.findall(r"TERMINATE sent \(\w+\)", text)
    found = [bool(re.search(t, text)) for t in TERMINATES]
    assert all(found) and len(sent) == len(TERMINATES), \
        f"vt3d {setup.vt3a.name}: TERMINATEs sent {sent}, want {len(TERMINATES)} of {TERMINATES}"
    no_objects(setup, "after vt3-mwtest")


def test_mw(vt3_pair):
    """two vt3 guests: type 1 and type 2 memory windows, access through them, local and remote invalidation, the bind rules"""  # noqa: E501
    mwtest(vt3_pair)


def test_mw_siw(vt3_siw):
    """vt3 binds the windows, siw is the peer that WRITEs, READs and invalidates through them"""
    mwtest(vt3_siw)
