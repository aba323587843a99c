"""`./run-vm.sh bench`: perftest, and fio over NVMe/RDMA, between two vt3
guests and, as the anchor, between two siw guests in the same QEMU setup
(each guest behind its own vt3d, so siw's frames take the NIC path that
vt3's offload skips). A benchmark, not a test: a table,
build/bench/bench.{csv,txt,png}."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

from ..guest import LabConfig
from .nvme import host_connect, host_disconnect, target_down, target_up
from ..setups import SiwPair, Vt3Pair
from ..tools import perftest

BW_TOOLS = ("ib_write_bw", "ib_send_bw", "ib_read_bw")
LAT_TOOLS = ("ib_write_lat", "ib_send_lat", "ib_read_lat")
SIZES = tuple(int(s) for s in os.environ.get("BENCH_SIZES", "2 64 1024 4096 16384 65536 262144 1048576").split())


def iters_for(size: int) -> int:
    return 20 if size >= 1 << 20 else 50 if size >= 65536 else 500


# BENCH_PERFTEST=0: the fio rows only.
PERFTEST = os.environ.get("BENCH_PERFTEST", "1") != "0"


def measure(setup, device: str) -> dict[tuple[str, int], float]:
    a, b = setup.a, setup.b
    results = {}
    runs = [(t, s, iters_for(s)) for t in BW_TOOLS for s in SIZES] + [(t, 64, 200) for t in LAT_TOOLS]
    if not PERFTEST:
        runs = []
    for tool, size, iters in runs:
        try:
            results[(tool, size)] = perftest(a, b, tool, size, iters, f"-d {device}", setup=setup).value
        except Exception as e:  # a bench reports what it could measure
            print(f"bench: {setup.kind} {tool} {size}: {str(e).splitlines()[0]}", flush=True)
            for g in (a, b):
                g.kill("pt-srv", "KILL")
    return results


# fio over nvme-rdma (a exports, b reads): (row, fio job, figure).
FIO_RUNTIME = int(os.environ.get("BENCH_FIO_RUNTIME", "20"))
FIO_JOBS = (
    ("fio-randread-4k-qd32", "--rw=randread --bs=4k --iodepth=32", "iops"),
    ("fio-read-128k-qd16", "--rw=read --bs=128k --iodepth=16", "MB/s"),
)


def measure_nvme(setup) -> dict[tuple[str, int], float]:
    """nvmet-rdma in a, nvme-rdma in b; each fio job reads for FIO_RUNTIME s."""
    a, b = setup.a, setup.b
    results = {}
    target_up(a, a.ip)
    try:
        _, dev = host_connect(b, a.ip)
        try:
            for row, job, unit in FIO_JOBS:
                r = b.run(f"fio --name={row} --filename={dev} --direct=1 --ioengine=libaio {job} "
                          f"--time_based --runtime={FIO_RUNTIME} --output-format=json --output=/tmp/bench-fio.json",
                          FIO_RUNTIME + 120)
                if not r.ok:
                    print(f"bench: {setup.kind} {row}: fio exit {r.rc}: {r.out[-300:]}", flush=True)
                    continue
                js = b.check("cat /tmp/bench-fio.json", 30)
                read = json.loads(js[js.index("{"):])["jobs"][0]["read"]
                results[(row, 0)] = round(read["iops"]) if unit == "iops" else round(read["bw_bytes"] / 1e6, 1)
        finally:
            host_disconnect(b)
    finally:
        target_down(a)
    return results


def run_bench(cfg: LabConfig, rundir: Path) -> None:
    out = Path(os.environ.get("BENCH_OUT", "build/bench")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = {}
    for name, cls, device in (("vt3", Vt3Pair, "vt3_0"), ("siw", SiwPair, "siw0")):
        print(f"== bench: {name} ↔ {name}", flush=True)
        setup = cls(cfg, rundir).start()
        try:
            results[name] = measure(setup, device) | measure_nvme(setup)
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
            lines.append(f"{tool:12s} {size:8d} {v if v is not None else '-':>12} "
                         f"{s if s is not None else '-':>12} {ratio:>8s}")
    for row, _, unit in FIO_JOBS:
        v, s = results["vt3"].get((row, 0)), results["siw"].get((row, 0))
        ratio = f"{v / s:.2f}" if v is not None and s else "-"
        lines.append(f"{row:20s} {v if v is not None else '-':>12} "
                     f"{s if s is not None else '-':>12} {ratio:>8s}  ({unit})")
    lines.append("(bandwidth in MB/s, latency t_avg in µs; b → a, TCG, 1 vCPU per guest; "
                 f"fio: nvme-rdma in b reading a's nvmet-rdma RAM disk for {FIO_RUNTIME} s)")
    (out / "bench.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(out)
    print(f"wrote {out}/bench.csv, bench.txt{', bench.png' if (out / 'bench.png').exists() else ''}")


def plot(out: Path) -> None:
    """bench.png: MB/s on a log axis (every size visible, 1 KiB as well
    as 1 MiB) over a panel of vt3/siw per tool and size."""
    if not shutil.which("gnuplot"):
        print("gnuplot missing: no PNG")
        return
    csvf, ratiof = out / "bench.csv", out / "bench-ratio.csv"
    with open(csvf, newline="") as f:
        rows = {(r["setup"], r["tool"], int(r["bytes"])): float(r["value"]) for r in csv.DictReader(f)}
    with open(ratiof, "w", newline="") as f:
        w = csv.writer(f)
        for (setup, tool, size), v in sorted(rows.items()):
            s = rows.get(("siw", tool, size))
            if setup == "vt3" and tool in BW_TOOLS and s:
                w.writerow([tool, size, round(v / s, 3)])
    series, ratios = [], []
    for tool in BW_TOOLS:
        series.append(f"'< grep \"^vt3,{tool},\" {csvf}' using 3:4 with linespoints title 'vt3 {tool}'")
        series.append(f"'< grep \"^siw,{tool},\" {csvf}' using 3:4 with linespoints dashtype 2 title 'siw {tool}'")
        ratios.append(f"'< grep \"^{tool},\" {ratiof}' using 2:3 with linespoints title '{tool}'")
    script = f"""set terminal png size 1000,800
set output '{out / 'bench.png'}'
set datafile separator ','
set termoption noenhanced
set multiplot layout 2,1
set logscale x 2
set format x '%.0b %BB'
set grid
set key left top
set lmargin 10
set size 1,0.62
set origin 0,0.38
set logscale y 10
set ylabel 'MB/s (log)'
set title 'perftest -R between two QEMU (TCG) guests: vt3 offload vs siw'
plot {', '.join(series)}
set size 1,0.38
set origin 0,0
unset logscale y
set title ''
set xlabel 'message size'
set ylabel 'vt3 / siw'
set key left top
plot {', '.join(ratios)}, 1 with lines dashtype 3 linecolor 'black' notitle
unset multiplot
"""
    subprocess.run(["gnuplot"], input=script, text=True, check=False)
