"""vt3lab: boot vt3 guests under QEMU from Python; its pytest plugin
(vt3lab.plugin) gives a suite the lab's fixtures. See docs/vt3lab.md."""

from .guest import CommandFailed, CommandTimeout, Guest, GuestDead, GuestError, LabConfig, Nic, Result
from .config import ConfigError, config_from_env, lab_config
from .setups import (A_IP, A_MAC, B_IP, B_MAC, KMOD, SETUPS, Segment, SingleVt3, SiwPair, Setup, Vt3Pair, Vt3Plain,
                     Vt3Siw)
from .vt3d import Vt3d, Vt3dError

__all__ = [
    "A_IP", "A_MAC", "B_IP", "B_MAC", "KMOD", "SETUPS", "CommandFailed", "CommandTimeout", "Guest",
    "GuestDead", "GuestError", "LabConfig", "Nic", "Result", "Segment", "Setup", "SingleVt3", "SiwPair", "Vt3Pair",
    "Vt3Plain", "Vt3Siw", "Vt3d", "Vt3dError", "ConfigError", "config_from_env", "lab_config",
]
