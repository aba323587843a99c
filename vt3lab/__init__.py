"""vt3lab: boot vt3 guests under QEMU from Python (pytest fixtures in
vt3lab.fixtures). See docs/tests.md."""

from .guest import CommandFailed, CommandTimeout, Guest, GuestDead, GuestError, LabConfig, Nic, Result
from .lab import config_from_env
from .setups import (A_IP, A_MAC, B_IP, B_MAC, KMOD, SETUPS, Segment, SingleVt3, SiwPair, Setup, Vt3Pair, Vt3Plain,
                     Vt3Siw)
from .vt3d import Vt3d, Vt3dError

__all__ = [
    "A_IP", "A_MAC", "B_IP", "B_MAC", "KMOD", "SETUPS", "CommandFailed", "CommandTimeout", "Guest",
    "GuestDead", "GuestError", "LabConfig", "Nic", "Result", "Segment", "Setup", "SingleVt3", "SiwPair", "Vt3Pair",
    "Vt3Plain", "Vt3Siw", "Vt3d", "Vt3dError", "config_from_env",
]
