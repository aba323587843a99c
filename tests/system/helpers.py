"""Helpers shared by the full-system tests. Every check here fails with
the evidence; none passes on a timeout or on a count it did not see."""

from __future__ import annotations

import re

from vt3lab import A_IP, B_IP, Setup
from vt3lab.tools import count, perftest, rping_between, wait_rdma_listen


def no_objects(setup: Setup, when: str) -> None:
    """Every vt3d of SETUP holds no PD, MR, CQ or QP."""
    for name, d in setup.vt3d.items():
        held = d.wait_no_objects()
        assert not held, f"vt3d {name} still holds {held} {when}"


def summary(out: str, prog: str) -> tuple[int, int]:
    """(passed, failed) from a tool's closing 'PROG…: N passed, N failed'."""
    m = re.findall(rf"{re.escape(prog)}.*?(\d+) passed, (\d+) failed", out)
    assert m, f"{prog} printed no summary:\n{out[-1500:]}"
    return int(m[-1][0]), int(m[-1][1])


__all__ = ["A_IP", "B_IP", "count", "no_objects", "perftest", "rping_between", "summary", "wait_rdma_listen"]
