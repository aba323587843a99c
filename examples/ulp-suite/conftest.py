"""A user's suite: an RDMA program tested in vt3 guests. Copy this folder
into your repository, install the vt3lab wheel of a vt3 bundle (its
pytest plugin comes with it) and run:

    pytest --vt3-bundle ~/vt3-0.1.0-x86_64 .

The program (wr-check.c) is built on the host and reaches both guests
through a shared directory."""

import subprocess
from pathlib import Path

import pytest
from vt3lab.plugin import make_setup_fixture
from vt3lab.setups import SHARE_MOUNT, Vt3Pair

HERE = Path(__file__).resolve().parent


class SharedPair(Vt3Pair):
    """Two vt3 guests (a: 10.77.0.1, b: 10.77.0.2), each behind its own
    vt3d, with the suite's build directory at SHARE_MOUNT."""
    kind = "shared-pair"


@pytest.fixture(scope="session")
def wr_check(tmp_path_factory) -> str:
    """wr-check, built with the host's gcc, libibverbs-dev and
    librdmacm-dev; its path in the guests."""
    build = tmp_path_factory.mktemp("build")
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(build / "wr-check"), str(HERE / "wr-check.c"),
                    "-lrdmacm", "-libverbs"], check=True)
    # Before the setup boots: its guests mount this directory.
    SharedPair.share = build
    return f"{SHARE_MOUNT}/wr-check"


# Booted once for the session, health-checked after every test (vt3d
# holds nothing, no process left, no kernel warning).
shared_pair = make_setup_fixture("shared_pair", SharedPair, fresh=False)
