"""`./run-vm.sh bench`: perftest between two vt3 guests and, as the anchor,
between two siw guests in the same QEMU setup (each guest behind its own
vt3d, so siw's frames take the NIC path that vt3's offload skips). A
benchmark, not a test: a table, build/bench/bench.{csv,txt,png}."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
from pathlib import Path

from .guest import LabConfig
from .setups import SiwPair, Vt3Pair
from .tools import perftest

BW_TOOLS = ("ib_write_bw", "ib_send_bw", "ib_read_bw")
LAT_TOOLS = ("ib_write_lat", "ib_send_lat", "ib_read_lat")
SIZES = tuple(int(s) for s in os.environ.get("BENCH_SIZES", "2 64 1024 4096 16384 65536 262144 1048576").split())


def iters_for(size: int) -> int:
    return 20 if size >= 1 << 20 else 50 if size >= 65536 else 500


def measure(setup, device: str) -> dict[tuple[str, int], float]:
    a, b = setup.a, setup.b
    results = {}
    runs = [(t, s, iters_for(s)) for t in BW_TOOLS for s in SIZES] + [(t, 64, 200) for t in LAT_TOOLS]
    for tool, size, iters in runs:
        try:
            results[(tool, size)] = perftest(a, b, tool, size, iters, f"-d {device}", setup=setup).value
        except Exception as e:  # a bench reports what it could measure
            print(f"bench: {setup.kind} {tool} {size}: {str(e).splitlines()[0]}", flush=True)
            for g in (a, b):
                g.kill("pt-srv", "KILL")
    return results


def run_bench(cfg: LabConfig, rundir: Path) -> None:
    out = Path(os.environ.get("BENCH_OUT", "build/bench")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, cls, device in (("vt3", Vt3Pair, "vt3_0"), ("siw", SiwPair, "siw0")):
        print(f"== bench: {name} ↔ {name}", flush=True)
        setup = cls(cfg, rundir).start()
        try:
            results[name] = measure(setup, device)
        finally:
            setup.stop()
    with open(out / "bench.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["setup", "tool", "bytes", "value"])
        for name, rows in results.items():
            for (tool, size), v in rows.items():
                w.writerow([name, tool, size, v])
    lines = [f"{'tool':12s} {'bytes':>8s} {'vt3':>12s} {'siw':>12s} {'vt3/siw':>8s}"]
    for tool in BW_TOOLS + LAT_TOOLS:
        for size in (SIZES if tool in BW_TOOLS else (64,)):
            v, s = results["vt3"].get((tool, size)), results["siw"].get((tool, size))
            ratio = f"{v / s:.2f}" if v is not None and s else "-"
            lines.append(f"{tool:12s} {size:8d} {v if v is not None else '-':>12} {s if s is not None else '-':>12} {ratio:>8s}")
    lines.append("(bandwidth in MB/s, latency t_avg in µs; b → a, TCG, 1 vCPU per guest)")
    (out / "bench.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out)
    print(f"wrote {out}/bench.csv, bench.txt{', bench.png' if (out / 'bench.png').exists() else ''}")


def plot(out: Path) -> None:
    if not shutil.which("gnuplot"):
        print("gnuplot missing: no PNG")
        return
    csvf = out / "bench.csv"
    series = []
    for tool in BW_TOOLS:
        series.append(f"'< grep \"^vt3,{tool},\" {csvf}' using 3:4 with linespoints title 'vt3 {tool}'")
        series.append(f"'< grep \"^siw,{tool},\" {csvf}' using 3:4 with linespoints dashtype 2 title 'siw {tool}'")
    script = f"""set terminal png size 1000,600
set output '{out / 'bench.png'}'
set datafile separator ','
set logscale x 2
set termoption noenhanced
set format x '%.0b %BB'
set xlabel 'message size'
set ylabel 'MB/s'
set key left top
set grid
set title 'perftest -R between two QEMU (TCG) guests: vt3 offload vs siw'
plot {', '.join(series)}
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=False)
