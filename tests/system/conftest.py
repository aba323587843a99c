"""vt3's full-system tests: the fixtures come from vt3lab (importable by
anyone's suite); helpers shared by the test files live in helpers.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

pytest_plugins = ["vt3lab.fixtures"]
