"""VT3_WRCHECK for programs run in a guest (docs/wrcheck.md): libvt3
accounts for every work request and reports, per process, the WRs that
never completed and those that completed twice, as JSON lines in a file.

    check = WrCheck(guest, "/tmp/wc.json")
    guest.check(f"{check.env} rping -c -a 10.77.0.2 -C 20 -V", 120)
    totals = check.totals()
    assert totals["processes"] == 1 and totals["lost"] == totals["duplicated"] == 0
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .guest import Guest

COUNTS = ("posted", "completed", "flushed", "lost", "duplicated", "unpolled", "unsignaled", "reset")


class WrCheck:
    def __init__(self, guest: "Guest", path: str):
        """Reports go to PATH in GUEST (emptied now); processes may share it."""
        self.guest = guest
        self.path = path
        guest.check(f"rm -f {path}", 10)

    @property
    def env(self) -> str:
        """What to put before a command to check it."""
        return f"VT3_WRCHECK=1 VT3_WRCHECK_FILE={self.path}"

    def records(self) -> list[dict]:
        """The process summaries and the lost and duplicated WRs reported
        (a QP's or SRQ's own report is in the file too, for people)."""
        out = self.guest.check(f"[ ! -e {self.path} ] || grep -E '\"wrcheck\":\"(summary|lost|duplicated)\"' "
                               f"{self.path} || true", 30)
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]

    def totals(self) -> dict:
        """The counts summed over every process that exited (`processes`:
        how many); WRs a process killed by a signal reported lost or
        duplicated as it saw them count too (it wrote no summary)."""
        records = self.records()
        summaries = [r for r in records if r["wrcheck"] == "summary"]
        totals = {k: sum(s[k] for s in summaries) for k in COUNTS}
        summed = {s["pid"] for s in summaries}
        for kind in ("lost", "duplicated"):
            totals[kind] += sum(1 for r in records if r["wrcheck"] == kind and r["pid"] not in summed)
        totals["processes"] = len(summaries)
        totals["lost_wr_ids"] = [r["wr_id"] for r in records if r["wrcheck"] == "lost"][:16]
        return totals
