"""vt3 as a user's CI gets it: a bundle (tools/dist.sh, what `./run-vm.sh
dist` writes) set up by an unprivileged user with tools/bundle-setup.sh
(the steps of action.yml: unpack, a fresh venv with the bundle's vt3lab
wheel, nothing downloaded), and the example suite (examples/ulp-suite)
run from a copy outside the checkout, with no VT3_* variable set
(docs/bundle.md)."""

import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# The unprivileged user the case makes (as root) and runs everything as.
USER = "vt3ci"
# What the user's environment holds: no VT3_* variable, no checkout path.
USER_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="module")
def bundle(vt3_config, tmp_path_factory) -> Path:
    """A bundle of this run's vt3d and guest images."""
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([str(ROOT / "tools/dist.sh"), "--images", str(vt3_config.initrd.parent),
                        "--vt3d", str(vt3_config.vt3d), "--out", str(out)],
                       capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHON": "/usr/bin/python3"})
    assert r.returncode == 0, f"tools/dist.sh: exit {r.returncode}:\n{r.stderr[-3000:]}"
    archive = Path(r.stdout.strip().splitlines()[-1])
    assert archive.is_file() and archive.name.endswith("-x86_64.tar.zst"), r.stdout
    return archive


@pytest.fixture(scope="module")
def user() -> pwd.struct_passwd:
    """An unprivileged user (made when the case runs as root, as in CI)."""
    if os.getuid() != 0:
        return pwd.getpwuid(os.getuid())
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True, timeout=60)
        return pwd.getpwnam(USER)


def as_user(user: pwd.struct_passwd, argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """ARGV as USER with a user's environment: HOME, PATH, LANG only."""
    env = [f"HOME={user.pw_dir}", f"PATH={USER_PATH}", "LANG=C.UTF-8", f"USER={user.pw_name}"]
    runner = ["runuser", "-u", user.pw_name, "--"] if os.getuid() == 0 else []
    return subprocess.run([*runner, "env", "-i", *env, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def kill_user_processes(uid: int) -> None:
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid == uid:
                os.kill(int(proc.name), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def test_user_suite(bundle, user):
    """An unprivileged user's CI: set up the bundle (a fresh venv with its wheel, no index), the example suite from a copy outside the checkout, vt3 demo from the bundle"""  # noqa: E501
    work = Path(tempfile.mkdtemp(prefix="vt3-user-suite."))
    try:
        os.chown(work, user.pw_uid, user.pw_gid)
        # The archive and the set-up script, where the user can read them.
        for f in (bundle, ROOT / "tools/bundle-setup.sh"):
            shutil.copy(f, work / f.name)
            os.chown(work / f.name, user.pw_uid, user.pw_gid)

        def step(*argv: str, timeout: float = 300, cwd: Path = work) -> str:
            r = as_user(user, list(argv), cwd, timeout)
            # A failed pytest run's own assertion lines first: its tail is the dump.
            said = "\n".join([line for line in r.stdout.splitlines() if line.startswith("E ")][:40])
            assert r.returncode == 0, (f"{' '.join(argv)}: exit {r.returncode}\n{said}\n--- tail ---\n"
                                       f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
            return r.stdout

        # What a user's CI does (action.yml runs the same script): unpack,
        # a venv with the bundle's wheel, pytest from the system.
        env = dict(line.split("=", 1) for line in
                   step("sh", "bundle-setup.sh", bundle.name, str(work / "vt3")).splitlines())
        unpacked, venv = Path(env["VT3_BUNDLE"]), Path(env["VT3_VENV"])
        assert (unpacked / "manifest.json").is_file() and (unpacked / "bin/vt3d").is_file()
        assert len(list(unpacked.glob("vt3lab-*-py3-none-any.whl"))) == 1
        step("cp", "-r", str(unpacked / "examples/ulp-suite"), str(work / "suite"))
        assert not (work / "suite").resolve().is_relative_to(ROOT)

        out = step(str(venv / "bin/python"), "-m", "pytest", "-p", "no:cacheprovider", "-v",
                   "--vt3-bundle", str(unpacked), str(work / "suite"), timeout=1200, cwd=work / "suite")
        assert re.search(r"^=+ 1 passed", out, re.M), out[-3000:]
        assert "test_wr_check.py::test_reset_mid_transfer PASSED" in out, out[-3000:]

        # The launcher, as the user runs it from the unpacked bundle (the
        # system's python3, vt3lab from the bundle's wheel).
        demo = step(str(unpacked / "bin/vt3"), "demo", timeout=300)
        assert "vt3-flushtest: 1 passed, 0 failed" in demo, demo[-3000:]
    finally:
        # A step that timed out leaves its guests and vt3d behind (they run
        # in sessions of their own): every process of the case's user goes.
        if os.getuid() == 0 and user.pw_uid != 0:
            kill_user_processes(user.pw_uid)
        # Whatever the user's run left (a failed run keeps its pytest tmp dirs).
        shutil.rmtree(work, ignore_errors=True)
