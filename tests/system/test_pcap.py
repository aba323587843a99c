"""Wire capture (`vt3d ctl capture start FILE | stop`, docs/vt3d-ctl.md)
read back by Wireshark's own iWARP dissectors (tshark: iwarp_mpa,
iwarp_ddp_rdmap).

On a vt3 pair, vt3a's uplink is captured once per operation, each file
from before its connection is set up (Wireshark finds MPA by its request
and reply, then dissects the FPDUs that follow), into the setup's
directory: a failed case's captures stay in the run directory and go into
failed-setups.tar.gz. tshark must find in each file

- RDMA WRITE (ib_write_bw, b writes into a): RDMAP opcode 0 from b, every
  tagged STag the one a's perftest advertised (RKey);
- RDMA READ (ib_read_bw, b reads from a): Read Requests (opcode 1) from b
  whose Data Source STag is a's RKey and Data Sink STag b's own; Read
  Responses (opcode 2) from a placed at b's STag;
- SEND (ib_send_bw, b sends to a): opcode 3 from b;
- TERMINATE (`vt3d ctl fault terminate` on a's vt3-flushtest server QP):
  opcode 7 from a, with exactly the layer/etype/ecode injected;

and in each an MPA request and an MPA reply; the direction flags of every
FPDU match its sender (inbound at vt3a: from b; outbound: from a). Counts
are exact where the tools fix them and > 0 otherwise; nothing passes on
a count it did not see.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from helpers import A_IP, B_IP, no_objects, perftest
from test_flush import fault, flush_server, injected
from vt3lab.tools import tail

SIZE, ITERS = 4096, 20
# The TERMINATE injected: RDMAP (0), remote operation (2), unexpected
# opcode (0x06); the client's event for it is QP_REQ_ERR.
TERM = (0, 2, 0x06)
INBOUND, OUTBOUND = 1, 2  # pcapng epb_flags direction, as tshark shows it

FIELDS = ("frame.number", "frame.packet_flags_direction", "ip.src", "iwarp_rdma.opcode", "iwarp_ddp.stag",
          "iwarp_rdma.sinkstag", "iwarp_rdma.srcstag", "iwarp_rdma.term_layer", "iwarp_rdma.term_etype_rdma",
          "iwarp_rdma.term_errcode_rdma")


def tshark_bin() -> str:
    path = shutil.which("tshark")
    assert path, "tshark not found: run-vm.sh installs it (Debian package tshark)"
    return path


def tshark(pcap: Path, display_filter: str, fields=FIELDS) -> list[dict[str, list[str]]]:
    """The frames of PCAP that DISPLAY_FILTER selects, each a dict of
    FIELDS -> every occurrence (a frame may carry several FPDUs)."""
    argv = [tshark_bin(), "-n", "-r", str(pcap), "--enable-heuristic", "iwarp_mpa", "-Y", display_filter,
            "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=;", "-E", "separator=/t"]
    for f in fields:
        argv += ["-e", f]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"tshark -Y '{display_filter}' {pcap.name}: exit {r.returncode}: {r.stderr[-800:]}"
    rows = []
    for line in r.stdout.splitlines():
        cells = line.split("\t")
        rows.append({f: [v for v in (cells[i] if i < len(cells) else "").split(";") if v] for i, f in enumerate(fields)})
    return rows


def num(v: str) -> int:
    return int(v, 0)


def rkeys(out: str, side: str) -> set[int]:
    """The RKeys perftest printed for SIDE ('local' or 'remote')."""
    keys = {int(k, 16) for k in re.findall(rf"^\s*{side} address:.*?RKey\s+0x([0-9a-fA-F]+)", out, re.M)}
    assert keys, f"perftest printed no {side} RKey:\n{tail(out)}"
    return keys


def opcode_count(rows, opcode: int) -> int:
    return sum(1 for r in rows for o in r["iwarp_rdma.opcode"] if num(o) == opcode)


def check_mpa(pcap: Path, what: str) -> None:
    """The connection's setup is in the file and Wireshark took it as MPA."""
    req = tshark(pcap, "iwarp_mpa.req", ("frame.number",))
    rep = tshark(pcap, "iwarp_mpa.rep", ("frame.number",))
    assert req and rep, f"{what}: {len(req)} MPA requests, {len(rep)} MPA replies decoded in {pcap}"


def check_directions(rows, what: str) -> None:
    """Every frame's direction flag agrees with its sender: vt3a's
    guest (A_IP) sends outbound, b inbound."""
    for r in rows:
        (src,), (direction,) = r["ip.src"], r["frame.packet_flags_direction"]
        want = OUTBOUND if src == A_IP else INBOUND
        assert num(direction) == want, f"{what}: frame {r['frame.number']} from {src} has direction {direction}"


class Capture:
    """vt3a's capture to one file of the setup's directory; stopped on the
    way out whatever happened (the answer checked when all went well)."""

    def __init__(self, setup, name: str):
        self.d = setup.vt3a
        self.path = (setup.dir / f"pcap-{name}.pcapng").resolve()
        self.done: dict | None = None

    def __enter__(self) -> "Capture":
        answer = self.d.ctl("capture", "start", str(self.path))
        assert answer == {"capture": "started", "file": str(self.path)}, f"capture start: {answer!r}"
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            try:
                self.d.ctl("capture", "stop")
            except Exception:
                pass
            return
        self.done = self.d.ctl("capture", "stop")
        assert self.done.get("capture") == "stopped" and self.done.get("file") == str(self.path), \
            f"capture stop: {self.done!r}"
        assert self.done["frames"] > 0 and self.done["dropped"] == 0 and self.done["error"] is None, \
            f"capture stop: {self.done!r}"


def test_pcap(vt3_pair):
    """vt3d ctl capture on a vt3 pair during an RDMA WRITE, a READ, a SEND and a TERMINATE; tshark's iWARP
    dissectors decode MPA setup, RDMAP opcodes 0/1/2/3/7, the advertised STags and the injected TERMINATE code"""
    p = vt3_pair
    tshark_bin()
    before = p.vt3a.stats()

    # RDMA WRITE: b writes into a's buffer (a's RKey, as b's perftest heard it).
    with Capture(p, "write") as cap:
        run = perftest(p.a, p.b, "ib_write_bw", SIZE, ITERS, setup=p)
    a_keys = rkeys(run.client, "remote")
    check_mpa(cap.path, "write")
    rows = tshark(cap.path, "iwarp_rdma.opcode == 0")
    check_directions(rows, "write")
    assert opcode_count(rows, 0) > 0, f"no RDMA WRITE decoded in {cap.path}"
    stags = {num(s) for r in rows for s in r["iwarp_ddp.stag"]}
    assert stags == a_keys, f"WRITE STags {sorted(map(hex, stags))}, a advertised {sorted(map(hex, a_keys))}"
    assert {s for r in rows for s in r["ip.src"]} == {B_IP}, "WRITEs from a, not b"

    # RDMA READ: b reads a's buffer into its own.
    with Capture(p, "read") as cap:
        run = perftest(p.a, p.b, "ib_read_bw", SIZE, ITERS, setup=p)
    a_keys, b_keys = rkeys(run.client, "remote"), rkeys(run.client, "local")
    check_mpa(cap.path, "read")
    req = tshark(cap.path, "iwarp_rdma.opcode == 1")
    check_directions(req, "read request")
    assert opcode_count(req, 1) >= ITERS, f"{opcode_count(req, 1)} Read Requests decoded, want ≥ {ITERS}"
    src = {num(s) for r in req for s in r["iwarp_rdma.srcstag"]}
    sink = {num(s) for r in req for s in r["iwarp_rdma.sinkstag"]}
    assert src == a_keys and sink == b_keys, \
        f"Read Request STags: source {sorted(map(hex, src))} (a's {sorted(map(hex, a_keys))}), " \
        f"sink {sorted(map(hex, sink))} (b's {sorted(map(hex, b_keys))})"
    resp = tshark(cap.path, "iwarp_rdma.opcode == 2")
    check_directions(resp, "read response")
    assert opcode_count(resp, 2) > 0, f"no Read Response decoded in {cap.path}"
    placed = {num(s) for r in resp for s in r["iwarp_ddp.stag"]}
    assert placed == b_keys, f"Read Responses placed at {sorted(map(hex, placed))}, b's sink is {sorted(map(hex, b_keys))}"
    assert {s for r in resp for s in r["ip.src"]} == {A_IP}, "Read Responses from b, not a"

    # SEND: b sends to a.
    with Capture(p, "send") as cap:
        perftest(p.a, p.b, "ib_send_bw", SIZE, ITERS, setup=p)
    check_mpa(cap.path, "send")
    sends = tshark(cap.path, "iwarp_rdma.opcode == 3")
    check_directions(sends, "send")
    from_b = sum(1 for r in sends if r["ip.src"] == [B_IP] for o in r["iwarp_rdma.opcode"] if num(o) == 3)
    assert from_b >= ITERS, f"{from_b} SENDs from b decoded, want ≥ {ITERS}"

    # TERMINATE: a's vt3d terminates the server QP of vt3-flushtest.
    layer, etype, ecode = TERM
    with Capture(p, "terminate") as cap:
        with flush_server(p.a) as srv:
            injected(p.b, A_IP, srv, "terminate", "poll", "QP_REQ_ERR",
                     lambda qpn, peer, rkey: fault(p.vt3a, "terminate", "--layer", layer, "--etype", etype,
                                                   "--ecode", ecode, qp=peer))
    check_mpa(cap.path, "terminate")
    terms = tshark(cap.path, "iwarp_rdma.opcode == 7")
    check_directions(terms, "terminate")
    assert opcode_count(terms, 7) > 0, f"no TERMINATE decoded in {cap.path}"
    for t in terms:
        got = tuple(num(v[0]) if len(v) == 1 else v for v in (
            t["iwarp_rdma.term_layer"], t["iwarp_rdma.term_etype_rdma"], t["iwarp_rdma.term_errcode_rdma"]))
        assert got == TERM, f"TERMINATE decoded as layer/etype/ecode {got}, injected {TERM}: {t}"
        assert t["ip.src"] == [A_IP], f"TERMINATE from {t['ip.src']}, not a"

    after = p.vt3a.stats()
    assert after["capture.active"] == 0 and after["capture.started"] - before["capture.started"] == 4, \
        f"capture counters: {before} -> {after}"
    assert after["capture.dropped"] == before["capture.dropped"] and \
        after["capture.write_errors"] == before["capture.write_errors"], "capture dropped frames or failed a write"
    no_objects(p, "after the captured operations")
