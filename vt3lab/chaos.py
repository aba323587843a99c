"""Chaos on a vt3d for a test: a seeded fault schedule aimed at the
workload's port (`vt3d ctl chaos`, docs/chaos.md), run for the length of a
`with` block:

    with pair.vt3b.chaos(seed=7, rate=0.5, port=4420) as run:
        host.check(fio_command, 600)
    assert run.injected() >= 3

When the block raises (a failed assertion, a command that failed), the seed
and the log are printed with the failure and the log is kept in the run
directory, so the same schedule can be run again: `--vt3-chaos-seed S`
gives every chaos block that seed, `--vt3-chaos-replay LOG` replays a
log's faults at their offsets (the plugin's options)."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from .vt3d import Vt3d


@dataclass(frozen=True)
class ChaosOverride:
    """What the command line imposes on every chaos block of a run: a
    seed, or a log to replay."""
    seed: int | None = None
    replay: Path | None = None


def describe(log: dict) -> str:
    """A chaos log (`chaos log --json`) as lines for people."""
    head = (f"chaos seed {log.get('seed')} rate {log.get('rate')}/s kinds {','.join(log.get('kinds') or [])} "
            f"ports {','.join(map(str, log.get('ports') or [])) or 'all'}")
    lines = [head]
    for f in log.get("faults", []):
        where = f"QP {f['qp']} {f['local']} -> {f['remote']}" if f.get("qp") is not None else "no connection"
        params = " ".join(f"{k}={v}" for k, v in (f.get("params") or {}).items())
        error = f" error: {f['error']}" if f.get("error") else ""
        lines.append(f"  {f['t_ms'] / 1000:8.3f} s  {f['kind']:<11} {params:<24} r={f['r']} of {f['matching']}  "
                     f"{where}  -> {f['outcome']}{error}")
    return "\n".join(lines)


class ChaosRun:
    """A running (or finished) chaos schedule on one vt3d."""

    def __init__(self, vt3d: "Vt3d", seed: int | None, replay: Path | None, saved: Path):
        self.vt3d = vt3d
        self.seed = seed
        self.replay = replay
        # Where the log is kept after the block (a test's artefact).
        self.saved = saved
        self.final: dict | None = None

    def status(self) -> dict:
        return self.vt3d.ctl("chaos", "status")

    def log(self) -> dict:
        """The log: as it stands while the schedule runs, as it ended after
        the block."""
        return self.final if self.final is not None else self.vt3d.ctl("chaos", "log")

    def faults(self, *outcomes: str) -> list[dict]:
        """The faults injected (not the skipped ones), or those whose
        outcome is one of OUTCOMES."""
        done = [f for f in self.log()["faults"] if f["outcome"] != "skipped" and not f.get("error")]
        return [f for f in done if not outcomes or f["outcome"] in outcomes]

    def injected(self) -> int:
        return len(self.faults())

    def unrecovered(self, timeout: float = 0) -> list[dict]:
        """The faults whose connection neither survived nor came back,
        after waiting up to TIMEOUT s for them to (vt3d watches each for
        180 s after its connection ended, unless the run was stopped)."""
        deadline = time.monotonic() + timeout
        while True:
            left = [f for f in self.faults() if f["outcome"] not in ("recovered", "survived")]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(1)

    def recovery_ms(self) -> list[int]:
        """How long each broken connection took to come back."""
        return [f["recovered_ms"] - f["ended_ms"] for f in self.faults("recovered")]

    def wait_injected(self, n: int, timeout: float) -> int:
        """Until N faults were injected (or the schedule ended); how many."""
        deadline = time.monotonic() + timeout
        while True:
            got = self.injected()
            if got >= n or time.monotonic() > deadline or self.status()["state"] != "running":
                return got
            time.sleep(0.5)

    def stop(self) -> dict:
        """Stops the schedule (if it still runs) and keeps its final log."""
        if self.final is None:
            if self.status()["state"] == "running":
                self.vt3d.ctl("chaos", "stop")
            self.final = self.vt3d.ctl("chaos", "log")
            self.saved.write_text(json.dumps(self.final, indent=1) + "\n")
        return self.final

    def how_to_replay(self) -> str:
        again = f"--vt3-chaos-seed {self.seed}" if self.seed is not None else f"--vt3-chaos-replay {self.replay}"
        return (f"chaos on vt3d {self.vt3d.name}: to run this schedule again pass {again} to pytest "
                f"(in a vt3 checkout: VT3_PYTEST_ARGS='{again}' ./run-vm.sh test CASE), "
                f"or replay its log: vt3d ctl chaos start --replay {self.saved}")


def start_args(seed: int | None, rate: float, kinds, ports, duration: float | None,
               max_faults: int | None, replay: Path | None) -> list[str]:
    if replay is not None:
        return ["chaos", "start", "--replay", str(replay)]
    args = ["chaos", "start", "--seed", str(seed), "--rate", str(rate)]
    if kinds:
        args += ["--kinds", ",".join(kinds)]
    for p in ports:
        args += ["--port", str(p)]
    if duration is not None:
        args += ["--duration", str(duration)]
    if max_faults is not None:
        args += ["--max-faults", str(max_faults)]
    return args


@contextmanager
def chaos(vt3d: "Vt3d", seed: int | None = None, rate: float = 0.5, kinds=None, port: int | list[int] | None = None,
          duration: float | None = None, max_faults: int | None = None,
          replay: Path | None = None) -> Iterator[ChaosRun]:
    """Runs a chaos schedule on VT3D for the block: SEED (random unless
    given or imposed by --vt3-chaos-seed), RATE faults/s, KINDS (vt3d's
    default set unless given), aimed at connections with PORT at either
    end, for DURATION s or MAX_FAULTS faults at most; or REPLAY a saved log.
    The schedule is stopped when the block ends, its log kept beside
    vt3d's (NAME.chaos-N.json); when the block raises, the seed and the log
    are printed with the failure."""
    override: ChaosOverride = vt3d.chaos_override
    if override.replay is not None:
        replay, seed = override.replay, None
    elif replay is None:
        seed = override.seed if override.seed is not None else seed
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little")
    ports = [port] if isinstance(port, int) else list(port or [])
    vt3d.chaos_runs += 1
    saved = vt3d.log.with_name(f"{vt3d.name}.chaos-{vt3d.chaos_runs}.json")
    vt3d.ctl(*start_args(seed, rate, kinds, ports, duration, max_faults, replay))
    run = ChaosRun(vt3d, seed, replay, saved)
    print(f"chaos on vt3d {vt3d.name}: " + (f"seed {seed}" if seed is not None else f"replay of {replay}"),
          flush=True)
    try:
        yield run
    except BaseException:
        try:
            log = describe(run.stop())
        except Exception as e:  # the log never hides the failure
            log = f"(no chaos log: {e})"
        print(f"\n{run.how_to_replay()}\n{log}", flush=True)
        raise
    run.stop()
