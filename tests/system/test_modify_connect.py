"""Two QPs of one vt3 device connected by ibv_modify_qp alone (RTR naming
the peer's QPN, then RTS: no CM), vt3's extension for test suites and
one-VM setups (docs/modify-connect.md), checked by vt3-modify-connect."""

import re

from helpers import summary
from vt3lab.tools import tail

# vt3-modify-connect's checks (its header comment lists them).
CHECKS = ("new-init", "refuse-self", "refuse-qpn", "refuse-gid", "refuse-rts", "refuse-alone", "wait", "pair",
          "send-back", "write", "read", "destroy", "to-err", "pending")


def test_modify_connect(single_vt3):
    """two QPs of vt3_0 paired by modify_qp: a SEND waits for the pair, then data both ways (SEND, WRITE, READ); a destroyed or errored QP's peer gets QP_FATAL and its flush once; the refusals' errnos"""  # noqa: E501
    vt3d = single_vt3.vt3a
    before = vt3d.stats()["iwarp.connections_established"]
    r = single_vt3.a.run("vt3-modify-connect --dev vt3_0 --timeout 30", 240)
    print("\n" + r.out)
    fails = [line for line in r.out.splitlines() if line.startswith("FAIL ")]
    assert not fails and r.rc == 0, f"vt3-modify-connect: exit {r.rc}:\n{tail(r.out)}"
    assert summary(r.out, "vt3-modify-connect") == (len(CHECKS), 0), f"vt3-modify-connect:\n{tail(r.out)}"
    for name in CHECKS:
        assert re.search(rf"^ok   {name}$", r.out, re.M), f"vt3-modify-connect: no 'ok {name}':\n{tail(r.out)}"
    # The pairs that moved data were TCP and MPA connections inside vt3d,
    # counted at both of their ends.
    made = vt3d.stats()["iwarp.connections_established"] - before
    assert made >= 4, f"vt3d counted {made} connection ends established, want >= 4 (two pairs that moved data)"
