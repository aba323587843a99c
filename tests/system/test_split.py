"""The split fault (`vt3d ctl fault split`): every data segment of a
connection leaves vt3d as two TCP segments, the last octets of its payload
some milliseconds after the rest, as a sender with another segmentation
(a middlebox, a retransmission) would send it. An FPDU ends its segment,
so a tail of 2 cuts its CRC in two: the receiver's MPA must reassemble a
trailer that arrives in two pieces."""

import threading

from helpers import no_objects
from test_flush import fault
from vt3lab.tools import rping_between, tail

PINGS = 100


class SplitEveryQp:
    """While in its `with`, puts the split fault on each QP of vt3d D that
    reaches RTS (rping's connection, once it is up)."""

    def __init__(self, d, tail_octets: int, hold_ms: int):
        self.d, self.args = d, ("--tail", tail_octets, "--hold-ms", hold_ms)
        self.stop, self.split, self.errors = threading.Event(), [], []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.1):
            try:
                for q in self.d.ctl("qps"):
                    if q["state"] == "RTS" and q["qpn"] not in self.split:
                        fault(self.d, "split", *self.args, qp=q["qpn"])
                        self.split.append(q["qpn"])
            except Exception as e:  # a QP gone between the table and the fault
                self.errors.append(repr(e))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


def split_rping(setup, server, client, d) -> tuple[int, int]:
    """rping -V with every vt3 QP of D split: returns the segments cut and
    vt3d's retransmissions."""
    before = d.stats()
    with SplitEveryQp(d, 2, 20) as s:
        rping_between(server, client, PINGS)
    after = d.stats()
    assert s.split, f"no QP of vt3d {d.name} reached RTS to split: {s.errors}"
    cut = after["toe.fault_split"] - before["toe.fault_split"]
    return cut, after["fault.split"] - before["fault.split"]


def test_split_vt3_vt3(vt3_pair):
    """rping -V between two vt3 guests with every data segment of the client's vt3d cut in two, its FPDU's CRC split: all pings verified"""
    cut, faults = split_rping(vt3_pair, vt3_pair.b, vt3_pair.a, vt3_pair.vt3a)
    # rping -V: each ping is a SEND, an RDMA READ and its response, a
    # WRITE and a SEND each way; vt3a's data segments were cut.
    assert cut >= PINGS, f"{cut} segments cut for {PINGS} pings"
    assert faults >= 1
    no_objects(vt3_pair, "after rping with split segments")


def test_split_vt3_siw(vt3_siw):
    """EXPERIMENT: rping -V, vt3 client, siw server, vt3's segments split"""
    try:
        cut, faults = split_rping(vt3_siw, vt3_siw.b, vt3_siw.a, vt3_siw.vt3a)
        print(f"\nrping passed, {cut} cut")
    finally:
        print(vt3_siw.b.check("dmesg | grep -i siw | tail -20", 10))
