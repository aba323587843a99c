"""Wire capture (`vt3d ctl capture start FILE | stop`, docs/vt3d-ctl.md)
read back by Wireshark's own iWARP dissectors (tshark: iwarp_mpa,
iwarp_ddp_rdmap).

On a vt3 pair, vt3a's uplink is captured once per operation, each file
from before its connection is set up (Wireshark finds MPA by its request
and reply, then dissects the FPDUs that follow), into the setup's
directory: a failed case's captures stay in the run directory and go into
failed-setups.tar.gz. tshark must find in each file

- RDMA WRITE (ib_write_bw, b writes into a): RDMAP opcode 0 from b, every
  WRITE with data to one STag, an MR of a's with remote write (perftest
  over rdma_cm prints no RKey: both vt3ds' MR tables are sampled while it
  runs), and MPA rev2's zero-length ready-to-receive WRITE with STag 0;
- RDMA READ (ib_read_bw, b reads from a): Read Requests (opcode 1) from b
  of the size asked, their Data Source STag an MR of a's with remote read,
  their Data Sink STag one of b's with remote write; Read Responses
  (opcode 2) from a placed at that sink STag, with every octet asked for;
- SEND (ib_send_bw, b sends to a): opcode 3 from b;
- TERMINATE (`vt3d ctl fault terminate` on a's vt3-flushtest server QP):
  opcode 7 from a, with exactly the layer/etype/ecode injected;

and in each an MPA request and an MPA reply, no frame malformed or in
error (MPA CRCs good); the direction flags of every FPDU match its sender
(inbound at vt3a: from b; outbound: from a). Counts are at least what the
tools sent; nothing passes on a count it did not see.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

from helpers import A_IP, B_IP, no_objects, perftest
from test_flush import fault, flush_server, injected

SIZE, ITERS = 4096, 20
# The TERMINATE injected: RDMAP (0), remote operation (2), unexpected
# opcode (0x06); the client's event for it is QP_REQ_ERR.
TERM = (0, 2, 0x06)
INBOUND, OUTBOUND = 1, 2  # pcapng epb_flags direction, as tshark shows it
# A tagged FPDU's ULPDU without data: the DDP tagged header and the RDMAP
# control byte (14 octets, as Wireshark counts it).
DDP_RDMAP_TAGGED = 14

FIELDS = ("frame.number", "frame.packet_flags_direction", "ip.src", "iwarp_mpa.ulpdulength", "iwarp_ddp.tagged_flag",
          "iwarp_ddp.stag", "iwarp_rdma.opcode", "iwarp_rdma.sinkstag", "iwarp_rdma.rdmardsz", "iwarp_rdma.srcstag",
          "iwarp_rdma.term_layer", "iwarp_rdma.term_etype_rdma", "iwarp_rdma.term_errcode_rdma")
# Wireshark's dissectors: MPA over TCP (found from the MPA request and
# reply), DDP/RDMAP under it; the heuristics that would read perftest's
# SEND payloads as RPC-over-RDMA or SMB Direct are off (they call the
# small SENDs malformed).
TSHARK_OPTS = ("--enable-heuristic", "iwarp_mpa_tcp", "--disable-heuristic", "rpcrdma_iwarp",
               "--disable-heuristic", "smb_direct_iwarp")


def tshark_bin() -> str:
    path = shutil.which("tshark")
    assert path, "tshark not found: run-vm.sh installs it (Debian package tshark)"
    return path


def tshark(pcap: Path, display_filter: str, fields=FIELDS) -> list[dict[str, list[str]]]:
    """The frames of PCAP that DISPLAY_FILTER selects, each a dict of
    FIELDS -> every occurrence (a frame may carry several FPDUs)."""
    argv = [tshark_bin(), "-n", "-r", str(pcap), *TSHARK_OPTS, "-Y", display_filter,
            "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=;", "-E", "separator=/t"]
    for f in fields:
        argv += ["-e", f]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"tshark -Y '{display_filter}' {pcap.name}: exit {r.returncode}: {r.stderr[-800:]}"
    rows = []
    for line in r.stdout.splitlines():
        cells = line.split("\t")
        rows.append({f: [v for v in (cells[i] if i < len(cells) else "").split(";") if v]
                     for i, f in enumerate(fields)})
    return rows


def num(v: str) -> int:
    return int(v, 0)


def fpdus(pcap: Path) -> list[dict]:
    """Every FPDU tshark decoded as RDMAP in PCAP, in order: its frame,
    sender, direction flag, MPA ULPDU length, RDMAP opcode, and what its
    kind carries (tagged: the DDP STag; Read Request: sink and source
    STag and size; TERMINATE: layer, etype, ecode). Each FPDU has an
    opcode, a tagged flag and a ULPDU length; the other fields occur only
    for their kinds, in the same order."""
    out = []
    for r in tshark(pcap, "iwarp_rdma"):
        what = f"{pcap.name} frame {r['frame.number']}"
        ops, tagged, lens = r["iwarp_rdma.opcode"], r["iwarp_ddp.tagged_flag"], r["iwarp_mpa.ulpdulength"]
        assert len(ops) == len(tagged) == len(lens), f"{what}: fields do not line up: {r}"
        stags = iter(r["iwarp_ddp.stag"])
        reads = iter(zip(r["iwarp_rdma.sinkstag"], r["iwarp_rdma.rdmardsz"], r["iwarp_rdma.srcstag"]))
        terms = iter(zip(r["iwarp_rdma.term_layer"], r["iwarp_rdma.term_etype_rdma"],
                         r["iwarp_rdma.term_errcode_rdma"]))
        for op, tag, ln in zip(ops, tagged, lens):
            f = {"frame": num(r["frame.number"][0]), "src": r["ip.src"][0],
                 "direction": num(r["frame.packet_flags_direction"][0]), "opcode": num(op), "len": num(ln)}
            if tag in ("1", "True"):
                f["stag"] = num(next(stags, "-1"))
            if f["opcode"] == 1:
                f["sink"], f["size"], f["source"] = (num(v) for v in next(reads, ("-1", "-1", "-1")))
            if f["opcode"] == 7:
                f["code"] = tuple(num(v) for v in next(terms, ()))
            out.append(f)
    return out


class MrWatch:
    """Samples both vt3ds' MR tables (`vt3d ctl mrs`) every 20 ms while a
    tool runs: the STags each side registered, with their rights (perftest
    over rdma_cm does not print its RKeys). `remote(d, right)`: the STags
    of vt3d D that allowed RIGHT (rw, rr) to the peer."""

    def __init__(self, setup):
        self.vt3d = {"a": setup.vt3a, "b": setup.vt3b}
        self.seen: dict[str, set[tuple[int, str]]] = {k: set() for k in self.vt3d}
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for k, d in self.vt3d.items():
                try:
                    for mr in d.ctl("mrs") or []:
                        self.seen[k].add((int(mr["stag"], 16), mr["access"]))
                except Exception as e:  # noqa: BLE001 (kept and reported)
                    self.errors.append(f"{k}: {e}")
            self.stop.wait(0.02)

    def __enter__(self) -> "MrWatch":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)

    def remote(self, side: str, right: str) -> set[int]:
        stags = {stag for stag, access in self.seen[side] if right in access.split(",")}
        assert stags, f"no MR of vt3{side} with {right} seen while the tool ran ({sorted(self.seen[side])}; " \
                      f"errors {self.errors[:3]})"
        return stags


def check_file(pcap: Path, what: str) -> list[dict]:
    """The connection's setup is in the file and Wireshark took it as MPA;
    nothing is malformed or in error (bad CRC, bad header); every FPDU's
    direction flag agrees with its sender (vt3a's guest, A_IP, sends
    outbound; b inbound). Returns the FPDUs."""
    req = tshark(pcap, "iwarp_mpa.req", ("frame.number",))
    rep = tshark(pcap, "iwarp_mpa.rep", ("frame.number",))
    assert req and rep, f"{what}: {len(req)} MPA requests, {len(rep)} MPA replies decoded in {pcap}"
    bad = tshark(pcap, "_ws.malformed or _ws.expert.severity >= error", ("frame.number", "_ws.expert.message"))
    assert not bad, f"{what}: {len(bad)} frames malformed or in error in {pcap}: {bad[:3]}"
    found = fpdus(pcap)
    assert found, f"{what}: no FPDU decoded in {pcap}"
    for f in found:
        want = OUTBOUND if f["src"] == A_IP else INBOUND
        assert f["direction"] == want, (
            f"{what}: {pcap.name} frame {f['frame']} from {f['src']}: direction {f['direction']}")
    return found


def hexes(values) -> list[str]:
    return sorted(hex(v) for v in values)


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
        assert self.done["frames"] > 0 and self.done["dropped"] == 0 and self.done["write_error"] is None, \
            f"capture stop: {self.done!r}"


def test_pcap(vt3_pair):
    """vt3d ctl capture on a vt3 pair during an RDMA WRITE, a READ, a SEND and a TERMINATE; tshark's iWARP
    dissectors decode MPA setup, RDMAP opcodes 0/1/2/3/7, the advertised STags and the injected TERMINATE code"""
    p = vt3_pair
    tshark_bin()
    before = p.vt3a.stats()

    # RDMA WRITE: b writes into a's buffer (an STag a's perftest registered
    # with remote write).
    with Capture(p, "write") as cap, MrWatch(p) as mrs:
        perftest(p.a, p.b, "ib_write_bw", SIZE, ITERS, setup=p)
    writes = [f for f in check_file(cap.path, "write") if f["opcode"] == 0]
    # MPA rev2's ready-to-receive is a zero-length WRITE with STag 0, one
    # per connection; every WRITE with data goes to one STag of a's.
    data = [f for f in writes if f["len"] > DDP_RDMAP_TAGGED]
    rtr = [f for f in writes if f["len"] == DDP_RDMAP_TAGGED]
    assert len(data) >= ITERS, f"{len(data)} RDMA WRITE FPDUs with data decoded, want ≥ {ITERS}"
    stags = {f["stag"] for f in data}
    a_rw = mrs.remote("a", "rw")
    assert len(stags) == 1 and stags <= a_rw, f"WRITE STags {hexes(stags)}; a's MRs with remote write {hexes(a_rw)}"
    assert {f["src"] for f in data} == {B_IP}, f"WRITEs from {sorted({f['src'] for f in data})}, want b only"
    assert rtr and all(f["stag"] == 0 for f in rtr), f"zero-length WRITEs (RTR): {rtr}"
    assert len(data) + len(rtr) == len(writes)
    print(f"write: {len(data)} WRITE FPDUs to STag {hexes(stags)}, {len(rtr)} zero-length (RTR)")

    # RDMA READ: b reads a's buffer into its own.
    with Capture(p, "read") as cap, MrWatch(p) as mrs:
        perftest(p.a, p.b, "ib_read_bw", SIZE, ITERS, setup=p)
    found = check_file(cap.path, "read")
    req = [f for f in found if f["opcode"] == 1 and f["size"] > 0]
    assert len(req) >= ITERS, f"{len(req)} Read Requests decoded, want ≥ {ITERS}"
    source, sink = {f["source"] for f in req}, {f["sink"] for f in req}
    a_rr, b_rw = mrs.remote("a", "rr"), mrs.remote("b", "rw")
    assert len(source) == 1 and source <= a_rr, (
        f"Read Request source STags {hexes(source)}; a's with remote read {hexes(a_rr)}")
    assert len(sink) == 1 and sink <= b_rw, (
        f"Read Request sink STags {hexes(sink)}; b's with remote write {hexes(b_rw)}")
    assert {f["src"] for f in req} == {B_IP} and all(f["size"] == SIZE for f in req), f"Read Requests: {req[:3]}"
    resp = [f for f in found if f["opcode"] == 2 and f["len"] > DDP_RDMAP_TAGGED]
    assert resp, f"no Read Response with data decoded in {cap.path}"
    placed = {f["stag"] for f in resp}
    assert placed == sink, f"Read Responses placed at {hexes(placed)}, the requests' sink is {hexes(sink)}"
    # At least every octet asked for (a TCP retransmission may show twice).
    assert sum(f["len"] - DDP_RDMAP_TAGGED for f in resp) >= SIZE * len(req), \
        f"Read Responses carry {sum(f['len'] - DDP_RDMAP_TAGGED for f in resp)} octets for {len(req)} × {SIZE}"
    assert {f["src"] for f in resp} == {A_IP}, f"Read Responses from {sorted({f['src'] for f in resp})}, want a only"
    print(f"read: {len(req)} Read Requests (source {hexes(source)}, sink {hexes(sink)}), "
          f"{len(resp)} Read Response FPDUs")

    # SEND: b sends to a.
    with Capture(p, "send") as cap:
        perftest(p.a, p.b, "ib_send_bw", SIZE, ITERS, setup=p)
    sends = [f for f in check_file(cap.path, "send") if f["opcode"] == 3 and f["src"] == B_IP]
    assert len(sends) >= ITERS, f"{len(sends)} SEND FPDUs from b decoded, want ≥ {ITERS}"
    assert all("stag" not in f for f in sends), f"tagged SENDs: {[f for f in sends if 'stag' in f][:3]}"
    print(f"send: {len(sends)} SEND FPDUs from b")

    # TERMINATE: a's vt3d terminates the server QP of vt3-flushtest.
    layer, etype, ecode = TERM
    with Capture(p, "terminate") as cap:
        with flush_server(p.a) as srv:
            injected(p.b, A_IP, srv, "terminate", "poll", "QP_REQ_ERR",
                     lambda qpn, peer, rkey: fault(p.vt3a, "terminate", "--layer", layer, "--etype", etype,
                                                   "--ecode", ecode, qp=peer))
    terms = [f for f in check_file(cap.path, "terminate") if f["opcode"] == 7]
    assert terms, f"no TERMINATE decoded in {cap.path}"
    for t in terms:
        assert t["code"] == TERM and t["src"] == A_IP, f"TERMINATE decoded as {t}, injected {TERM} from a"
    print(f"terminate: {len(terms)} TERMINATE from a, layer/etype/ecode {terms[0]['code']}")

    after = p.vt3a.stats()
    assert after["capture.active"] == 0 and after["capture.started"] - before["capture.started"] == 4, \
        f"capture counters: {before} -> {after}"
    assert after["capture.dropped"] == before["capture.dropped"] and \
        after["capture.write_errors"] == before["capture.write_errors"], "capture dropped frames or failed a write"
    no_objects(p, "after the captured operations")
