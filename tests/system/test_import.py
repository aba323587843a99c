"""A user context, PD and MR shared with another process
(ibv_import_device/pd/mr, libvt3's provider/import.c, vt3.ko's
vt3_import.c): vt3-import's exec'd importer moves data from the creator's
memory through the imported MR's lkey, on a QP of its own."""

import re

from helpers import summary
from vt3lab.tools import tail

# vt3-import's checks in the order they run (its header comment lists them).
CHECKS = ("import-device", "import-pd", "pd-not-a-pd", "pd-no-handle", "import-mr", "mr-not-an-mr", "pair",
          "posted", "received", "unimport", "importer-exit", "creator-owns")


def test_import(single_vt3):
    """an exec'd process imports vt3_0's context, PD and MR by the passed fd and handles (bad handles refused with EINVAL/ENOENT); its QP's WRITE and SEND from the imported lkey land in the creator's memory; unimporting leaves the creator's objects"""  # noqa: E501
    r = single_vt3.a.run("vt3-import --dev vt3_0 --timeout 30", 240)
    print("\n" + r.out)
    fails = [line for line in r.out.splitlines() if line.startswith("FAIL ")]
    assert not fails and r.rc == 0, f"vt3-import: exit {r.rc}:\n{tail(r.out)}"
    assert summary(r.out, "vt3-import") == (len(CHECKS), 0), f"vt3-import:\n{tail(r.out)}"
    assert re.findall(r"^ok   (\S+)$", r.out, re.M) == list(CHECKS), f"vt3-import: checks out of order:\n{tail(r.out)}"
