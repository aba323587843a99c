"""The pytest plugin of vt3lab: fixtures for vt3 guests. Installed with
the package (entry point pytest11), so in your own suite:

    def test_mine(vt3_pair):                  # shared boot, health-checked after
        vt3_pair.a.check("ibv_devinfo -d vt3_0")

Where the lab's parts are comes from --vt3-bundle DIR (what `./run-vm.sh
dist` made), or --vt3-images, --vt3d, --vt3-qemu, or the VT3_* variables
(vt3lab.config); --vt3-accel picks TCG or KVM, --vt3-qemu-arg and
--vt3-kernel-arg add to every guest's command lines. A conftest may
override the session fixture `vt3_config` to build the LabConfig itself.

Shared setups (`vt3_pair`, `vt3_siw`, `vt3_plain`, `single_vt3`) boot once
and serve every scenario that asks for them; after each scenario a health
check (vt3d holds no objects, no leftover guest processes, no kernel
warning since the scenario began) fails the scenario if something was left
behind, and a failed scenario gets the next one a new boot. `fresh_*`
fixtures boot a setup of their own (for destructive scenarios: vt3d
killed, device fatal, rmmod). Tests are run grouped by setup.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from .chaos import ChaosOverride
from .config import ConfigError, lab_config
from .guest import LabConfig
from .proc import install_signal_handlers
from .setups import (ChaosPair, OneCpuVt3, PoisonedVt3, PyverbsVt3Siw, Setup, SingleVt3, TwoHosts, Vt3Pair, Vt3Plain,
                     Vt3Siw, Vt3SiwTap, Vt3SiwUdp)

# The biggest sessions first: under pytest-xdist each starts on its own
# worker while the other takes the rest.
SHARED = {"vt3_pair": Vt3Pair, "chaos_pair": ChaosPair, "two_hosts": TwoHosts, "vt3_plain": Vt3Plain,
          "single_vt3": SingleVt3,
          "vt3_siw": Vt3Siw, "poisoned_vt3": PoisonedVt3, "one_cpu_vt3": OneCpuVt3,
          "pyverbs_vt3_siw": PyverbsVt3Siw,
          "vt3_siw_udp": Vt3SiwUdp, "vt3_siw_tap": Vt3SiwTap}
FRESH = {f"fresh_{k}": v for k, v in SHARED.items()}
SETUP_ORDER = list(SHARED) + list(FRESH)


def pytest_addoption(parser):
    g = parser.getgroup("vt3lab")
    g.addoption("--vt3-bundle", help="an unpacked vt3 bundle (./run-vm.sh dist): vt3d, guest kernel and images")
    g.addoption("--vt3-images", help="directory with the guest kernel (vmlinux or vmlinuz) and initramfs-vt3.cpio")
    g.addoption("--vt3d", help="the vt3d binary")
    g.addoption("--vt3-qemu", help="the QEMU binary (default qemu-system-x86_64 on PATH)")
    g.addoption("--vt3-accel", choices=("auto", "tcg", "kvm"),
                help="auto (default): KVM when a probe boot proves it works, else TCG")
    g.addoption("--vt3-qemu-arg", action="append", default=[], metavar="ARG",
                help="one more QEMU argument for every guest; repeatable (--vt3-qemu-arg=-device ...)")
    g.addoption("--vt3-kernel-arg", action="append", default=[], metavar="PARAM",
                help="one more guest kernel parameter; repeatable")
    g.addoption("--vt3-chaos-seed", type=int, metavar="SEED",
                help="every chaos block (vt3lab.chaos) runs the schedule of this seed")
    g.addoption("--vt3-chaos-replay", metavar="LOG",
                help="every chaos block replays this log (what a failed chaos block kept: NAME.chaos-N.json)")
    g.addoption("--vt3-run-dir", help="where setups keep consoles and logs (default: a new temp dir)")
    g.addoption("--vt3-keep", action="store_true", help="keep the run directory even when everything passed")
    g.addoption("--vt3-list", action="store_true", help="print the cases (name, setup, description) and exit")
    g.addoption("--case", action="append", default=[],
                help="run only this case (the test's name without test_, '-' for '_'); repeatable")


def case_name(item) -> str:
    return item.originalname.removeprefix("test_").replace("_", "-")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(session, config, items):
    wanted = config.getoption("--case")
    if wanted:
        known = {case_name(i) for i in items}
        unknown = [w for w in wanted if w not in known]
        if unknown:
            raise pytest.UsageError(f"unknown case(s) {unknown} (./run-vm.sh list)")
        keep = [i for i in items if case_name(i) in wanted]
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep

    def key(indexed):
        idx, item = indexed
        for n, fixture in enumerate(SETUP_ORDER):
            if fixture in item.fixturenames:
                return (n, idx)
        return (-1, idx)
    items[:] = [i for _, i in sorted(enumerate(items), key=key)]
    # pytest-xdist (--dist loadgroup): a shared setup's scenarios stay on
    # one worker, in this order; each fresh one may go anywhere.
    for item in items:
        fixture = setup_of(item)
        item.add_marker(pytest.mark.xdist_group(fixture if fixture in SHARED else item.name))


def setup_of(item) -> str:
    return next((f for f in SETUP_ORDER if f in item.fixturenames), "-")


def pytest_collection_finish(session):
    if not session.config.getoption("--vt3-list"):
        return
    seen = set()
    for item in session.items:
        name = case_name(item)
        if name in seen:
            continue
        seen.add(name)
        doc = (item.function.__doc__ or "").strip().splitlines()
        marks = ",".join(m.name for m in item.iter_markers() if m.name in ("qemu10", "kernel612", "soak"))
        print(f"{name:24s} {setup_of(item):18s} {doc[0] if doc else ''}{'  [' + marks + ']' if marks else ''}")
    pytest.exit("listed", 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
    if rep.when == "call" and rep.failed:
        # What vt3d and the guests hold, taken at once and printed with
        # the failure: CI keeps nothing else of a failed run.
        setups = [v for v in getattr(item, "funcargs", {}).values() if isinstance(v, Setup)]
        for setup in setups:
            try:
                item.vt3_dump = setup.dump()
            except Exception as e:  # a dump never hides the failure
                item.vt3_dump = f"dump failed: {e}"
            rep.sections.append((f"vt3lab: state of {setup.dir.name} at the failure", item.vt3_dump))


class Lab:
    """The session's setups: at most one shared setup lives at a time."""

    def __init__(self, cfg: LabConfig, rundir: Path):
        self.cfg = cfg
        self.rundir = rundir
        self.current: Setup | None = None
        self.failed_dirs: list[Path] = []
        self.timings: list[tuple[str, str, float]] = []  # (setup dir, what, seconds)

    def _boot(self, cls) -> Setup:
        t0 = time.monotonic()
        setup = cls(self.cfg, self.rundir)
        try:
            setup.start()
        except BaseException:
            self.failed_dirs.append(setup.dir)
            raise
        finally:
            self.timings.append((setup.dir.name, "boot", time.monotonic() - t0))
        return setup

    def shared(self, cls) -> Setup:
        if self.current is not None and (type(self.current) is not cls or self.current.broken):
            self.release(self.current)
        if self.current is None:
            self.current = self._boot(cls)
        return self.current

    def fresh(self, cls) -> Setup:
        if self.current is not None:
            self.release(self.current)
        return self._boot(cls)

    def release(self, setup: Setup) -> None:
        setup.stop()
        if self.current is setup:
            self.current = None

    def close(self) -> None:
        if self.current is not None:
            self.release(self.current)


@pytest.fixture(scope="session")
def vt3_config(request) -> LabConfig:
    """The lab's configuration, from the options and the environment
    (vt3lab.config); override it in a conftest to build your own."""
    opt = request.config.getoption
    try:
        return lab_config(images=opt("--vt3-images"), vt3d=opt("--vt3d"), qemu=opt("--vt3-qemu"),
                          accel=opt("--vt3-accel"), bundle=opt("--vt3-bundle"),
                          qemu_args=tuple(opt("--vt3-qemu-arg")), kernel_args=" ".join(opt("--vt3-kernel-arg")))
    except ConfigError as e:
        pytest.exit(f"vt3lab: {e}", 3)


@pytest.fixture(scope="session")
def lab(request, vt3_config):
    install_signal_handlers()
    opt = request.config.getoption("--vt3-run-dir")
    rundir = Path(opt) if opt else Path(tempfile.mkdtemp(prefix="vt3-run."))
    rundir.mkdir(parents=True, exist_ok=True)
    seed, replay = request.config.getoption("--vt3-chaos-seed"), request.config.getoption("--vt3-chaos-replay")
    if seed is not None or replay:
        # The command line wins over a conftest's own configuration.
        override = ChaosOverride(seed=seed, replay=Path(replay).resolve() if replay else None)
        vt3_config = dataclasses.replace(vt3_config, chaos=override)
    the_lab = Lab(vt3_config, rundir)
    request.config._vt3lab = the_lab
    yield the_lab
    the_lab.close()
    # For the summary, which under pytest-xdist runs in another process.
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    (rundir / f"lab-{worker}.json").write_text(json.dumps(
        {"timings": the_lab.timings, "failed_dirs": [str(d) for d in dict.fromkeys(the_lab.failed_dirs)]}))


def _scenario(lab: Lab, request, cls, fresh: bool):
    setup = lab.fresh(cls) if fresh else lab.shared(cls)
    setup.mark_scenario()
    name = request.node.name
    with open(setup.dir / "commands.log", "a") as f:
        f.write(f"\n===== [{time.strftime('%H:%M:%S')}] scenario {name}\n")
    t0 = time.monotonic()
    yield setup
    lab.timings.append((setup.dir.name, name, time.monotonic() - t0))
    rep = getattr(request.node, "rep_call", None)
    failed = rep is None or not rep.passed
    problems: list[str] = []
    if failed:
        (setup.dir / f"failure-{name}.txt").write_text(
            (rep.longreprtext if rep is not None else "no report") + "\n\n"
            + (getattr(request.node, "vt3_dump", None) or setup.dump()))
        lab.failed_dirs.append(setup.dir)
    else:
        try:
            problems = setup.health(setup.scenario_mark, destructive=fresh)
        except Exception as e:  # a dead guest or vt3d is a health problem too
            problems = [f"health check failed: {e}"]
    if fresh or failed or problems:
        setup.broken = True
        lab.release(setup)
    if problems:
        lab.failed_dirs.append(setup.dir)
        (setup.dir / f"health-{name}.txt").write_text("\n".join(problems))
        pytest.fail("after the scenario: " + "; ".join(problems), pytrace=False)


def make_setup_fixture(fixture: str, cls, fresh: bool):
    """A fixture named FIXTURE that gives each scenario a setup of class
    CLS: the shared boot, or (FRESH) a boot of its own; either is
    health-checked after the scenario. For a suite's own setups:

        my_pair = make_setup_fixture("my_pair", MyPair, fresh=False)
    """
    # Scenarios are ordered, grouped and listed by their setup fixture.
    if fixture not in SETUP_ORDER:
        SETUP_ORDER.append(fixture)
    if not fresh:
        SHARED.setdefault(fixture, cls)

    def fx(lab, request):
        yield from _scenario(lab, request, cls, fresh)
    fx.__name__ = fixture
    fx.__doc__ = f"{'A fresh' if fresh else 'The shared'} {cls.kind} setup ({cls.__doc__ or cls.kind})"
    return pytest.fixture(fx)


for _name, _cls in SHARED.items():
    globals()[_name] = make_setup_fixture(_name, _cls, False)
for _name, _cls in FRESH.items():
    globals()[_name] = make_setup_fixture(_name, _cls, True)


def pytest_configure(config):
    opt = config.getoption("--vt3-run-dir", None)
    config._vt3_rundir = Path(opt) if opt else None


# pytest-repeat's part of a test id: "[3-30]" alone or "[params-3-30]".
REPEAT_ID = re.compile(r"(?:^|-)\d+-\d+$")


def repeated_case(nodeid: str) -> str:
    """The case (and its parameters) a run of a repeated test belongs to."""
    name = nodeid.split("::")[-1].split("@")[0]
    base, _, params = name.partition("[")
    params = REPEAT_ID.sub("", params.removesuffix("]"))
    case = base.removeprefix("test_").replace("_", "-")
    return f"{case}[{params}]" if params else case


def write_tally(tr) -> None:
    """Runs, failures and stalls per case, for `--repeat` and the soak: a
    run fails when any of its phases does (a stall fails the health check,
    at teardown)."""
    runs: dict[str, dict[str, bool]] = {}
    for reports in tr.stats.values():
        for rep in reports:
            if not hasattr(rep, "when") or not hasattr(rep, "nodeid"):
                continue
            run = runs.setdefault(rep.nodeid, {"failed": False, "stalled": False, "skipped": False})
            run["failed"] |= rep.failed
            run["skipped"] |= rep.skipped
            run["stalled"] |= rep.failed and "stall: QP" in str(rep.longrepr)
    tally: dict[str, list[int]] = {}
    for nodeid, run in runs.items():
        row = tally.setdefault(repeated_case(nodeid), [0, 0, 0])
        row[0] += 1
        row[1] += run["failed"] or run["skipped"]
        row[2] += run["stalled"]
    tr.write_sep("-", "vt3lab tally")
    tr.write_line(f"{'case':40s} {'runs':>5s} {'failed':>7s} {'stalls':>7s}")
    for case, (n, failed, stalls) in sorted(tally.items()):
        tr.write_line(f"{case:40s} {n:5d} {failed:7d} {stalls:7d}")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller sums up
        return
    if (config.getoption("count", None) or 1) > 1:
        write_tally(terminalreporter)
    lab: Lab | None = getattr(config, "_vt3lab", None)
    rundir = lab.rundir if lab is not None else config._vt3_rundir
    if rundir is None or not rundir.is_dir():
        return
    timings, failed_dirs = [], []
    for record in sorted(rundir.glob("lab-*.json")):
        data = json.loads(record.read_text())
        timings += [tuple(t) for t in data["timings"]]
        failed_dirs += [Path(d) for d in data["failed_dirs"]]
    tr = terminalreporter
    # Figures the scenarios wrote (the fault soaks' tallies) outlive the run dir.
    for figures in sorted(rundir.glob("*-figures.txt")):
        tr.write_sep("-", f"vt3lab: {figures.name}")
        tr.write_line(figures.read_text().rstrip())
    if not timings:
        return
    tr.write_sep("-", "vt3lab timings")
    by_setup: dict[str, list[float]] = {}
    for d, what, secs in timings:
        row = by_setup.setdefault(d, [0.0, 0, 0.0])
        if what == "boot":
            row[0] += secs
        else:
            row[1] += 1
            row[2] += secs
    for d, (boot, n, secs) in sorted(by_setup.items()):
        tr.write_line(f"{d:32s} boot {boot:5.0f} s, {n:2d} scenario(s), {secs:6.0f} s of scenarios")
    if failed_dirs:
        artifact = rundir / "failed-setups.tar.gz"
        with tarfile.open(artifact, "w:gz") as tar:
            for d in dict.fromkeys(failed_dirs):
                for f in sorted(d.iterdir()):
                    if f.is_file() and (f.suffix in (".log", ".txt", ".pcapng") or ".console" in f.name):
                        tar.add(f, arcname=f"{d.name}/{f.name}")
        tr.write_line(f"vt3lab: failures kept in {rundir} (consoles, vt3d logs, commands.log, captures); "
                      f"compact artifact {artifact}")
    elif not config.getoption("--vt3-keep") and exitstatus == 0:
        # The setups' consoles and logs go; figures and timings stay.
        for d in rundir.iterdir():
            if d.is_dir():
                shutil.rmtree(d, ignore_errors=True)
    else:
        tr.write_line(f"vt3lab: run directory kept: {rundir}")
