"""ibv_rereg_mr (docs/rereg-mr.md): vt3-rereg on two QPs of one
vt3 guest paired by ibv_modify_qp. The peer's WRITEs land in the new
translation and are refused at the old addresses, after the rights were
narrowed and in another PD; an MR with a bound window is EBUSY. vt3d's
log must name the TERMINATE each refusal sent, and it holds nothing after."""

import re

from helpers import no_objects, summary
from vt3lab.tools import tail

# vt3-rereg's checks (its header comment lists them); new-range twice
# (the new buffer written, the old one untouched).
CHECKS = ("write", "rereg-trans", "new-range", "new-range", "old-range", "rereg-access", "narrowed", "rereg-pd",
          "other-pd", "pd-back", "busy", "unbound")
# The responder's TERMINATEs, in order: the old range (DDP tagged base or
# bounds 1/1/01), the narrowed rights (1/1/00, as siw answers rights), the
# other PD (STag not associated, 1/1/02).
TERMINATES = ("DdpTaggedBaseOrBoundsViolation", "DdpTaggedInvalidStag", "DdpTaggedStagNotAssociated")


def test_rereg(single_vt3):
    """ibv_rereg_mr of translation, rights and PD with the peer's WRITEs checked after each; EBUSY with a bound window"""  # noqa: E501
    log = single_vt3.vt3a.log
    start = log.stat().st_size
    r = single_vt3.a.run("vt3-rereg --dev vt3_0 --timeout 30", 240)
    print("\n" + r.out)
    fails = [line for line in r.out.splitlines() if line.startswith("FAIL ")]
    assert not fails and r.rc == 0, f"vt3-rereg: exit {r.rc}:\n{tail(r.out)}"
    assert summary(r.out, "vt3-rereg") == (len(CHECKS), 0), f"vt3-rereg:\n{tail(r.out)}"
    got = re.findall(r"^ok   (\S+)$", r.out, re.M)
    assert got == list(CHECKS), f"vt3-rereg: checks {got}"
    with open(log, errors="replace") as f:
        f.seek(start)
        sent = re.findall(r"TERMINATE sent \((\w+)\)", f.read())
    assert sent == list(TERMINATES), f"vt3d: TERMINATEs sent {sent}, want {list(TERMINATES)}"
    no_objects(single_vt3, "after vt3-rereg")
