"""vt3's full-system tests: the fixtures come from vt3lab (importable by
anyone's suite); helpers shared by the test files live in helpers.py."""

import sys
from importlib.metadata import entry_points
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# The plugin comes with the installed package (entry point pytest11); from
# a checkout it is named here.
if not any(ep.name == "vt3lab" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["vt3lab.plugin"]
