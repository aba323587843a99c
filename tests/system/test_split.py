"""The split fault (`vt3d ctl fault split`): every data segment of a
connection leaves vt3d as two TCP segments, the last octets of its payload
some milliseconds after the rest, as a sender with another segmentation
(a middlebox, a retransmission) would send it. An FPDU ends its segment,
so a tail of 2 cuts its CRC in two: the receiver's MPA must reassemble a
trailer that arrives in two pieces."""

import threading

from helpers import no_objects
from test_flush import fault
from vt3lab.tools import ping_numbers, rping_between, tail, wait_rdma_listen

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


def test_split_vt3_vt3(vt3_pair):
    """rping -V between two vt3 guests with every data segment of both vt3d cut in two, each FPDU's CRC split: all pings verified, no TERMINATE"""  # noqa: E501
    daemons = (vt3_pair.vt3a, vt3_pair.vt3b)
    before = [d.stats() for d in daemons]
    with SplitEveryQp(daemons[0], 2, 20) as sa, SplitEveryQp(daemons[1], 2, 20) as sb:
        rping_between(vt3_pair.b, vt3_pair.a, PINGS)
    for d, s, was in zip(daemons, (sa, sb), before):
        now = d.stats()
        assert s.split, f"no QP of vt3d {d.name} reached RTS to split: {s.errors}"
        # rping -V: per ping a SEND each way, an RDMA READ response from
        # the client, a WRITE from the server: each side cut ≥ 1 per ping.
        cut = now["toe.fault_split"] - was["toe.fault_split"]
        assert cut >= PINGS, f"vt3d {d.name}: {cut} segments cut for {PINGS} pings"
        assert now["fault.split"] - was["fault.split"] == len(s.split)
        for key in ("iwarp.terminates_rx", "iwarp.terminates_tx", "iwarp.protocol_errors"):
            assert now[key] == was[key], f"vt3d {d.name}: {key} {was[key]} -> {now[key]}"
    no_objects(vt3_pair, "after rping with split segments")


def siw_crc_errors(g) -> int:
    return int(g.check("dmesg | grep -c 'siw: crc error' || true", 10).strip() or 0)


def test_split_vt3_siw(vt3_siw):
    """siw's MPA receive against split segments: a tail of 7 (the CRC whole, the payload's last octets apart) passes rping -V; a tail of 2 cuts the CRC and siw, which copies each piece of a split trailer to its start (siw_get_trailer), reports a CRC error and TERMINATEs: reproduced on demand"""  # noqa: E501
    a, b, d = vt3_siw.a, vt3_siw.b, vt3_siw.vt3a
    before = d.stats()
    with SplitEveryQp(d, 7, 20) as s:
        rping_between(b, a, PINGS)
    assert s.split, f"no QP reached RTS to split: {s.errors}"
    middle = d.stats()
    assert middle["toe.fault_split"] - before["toe.fault_split"] >= PINGS, (before, middle)
    assert middle["iwarp.terminates_rx"] == before["iwarp.terminates_rx"], (before, middle)
    crc_before = siw_crc_errors(b)

    # A tail of 2: the first segment that ends an FPDU loses the connection.
    b.spawn(f"rping -s -a {b.ip} -p 7175 -C {PINGS} -V -v", "rping-split", 300)
    wait_rdma_listen(b, 7175)
    with SplitEveryQp(d, 2, 20) as s:
        c = a.run(f"rping -c -a {b.ip} -p 7175 -C {PINGS} -V -v", 120)
    if b.running("rping-split"):
        b.kill("rping-split")
    b.join("rping-split", 30)
    after = d.stats()
    crc_errors = siw_crc_errors(b) - crc_before
    print(f"\nsplit tail 2: rping client exit {c.rc} after {len(ping_numbers(c.out, ''))} of {PINGS} pings, "
          f"{crc_errors} siw CRC error(s), "
          f"{after['iwarp.terminates_rx'] - middle['iwarp.terminates_rx']} TERMINATE(s) to vt3\n"
          + b.check("dmesg | grep 'siw: crc error' | tail -3", 10))
    assert s.split, f"no QP reached RTS to split: {s.errors}"
    assert after["toe.fault_split"] > middle["toe.fault_split"], (middle, after)
    # rping's exit status does not say (it exits 0 after "wait for
    # RDMA_WRITE_ADV state 10"): its pings do.
    pings = len(ping_numbers(c.out, ""))
    assert pings < PINGS, ("rping passed with split CRCs: was siw's split-trailer copy fixed? "
                           f"(exit {c.rc})\n{tail(c.out)}")
    assert crc_errors == 1, f"{crc_errors} 'siw: crc error' lines in b's dmesg, want 1"
    assert after["iwarp.terminates_rx"] - middle["iwarp.terminates_rx"] == 1, (middle, after)

    # Only that connection was lost: the pair works as before.
    rping_between(b, a, 10)
    no_objects(vt3_siw, "after the split rping")
