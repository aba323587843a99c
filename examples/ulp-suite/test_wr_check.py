"""wr-check under a connection reset: both ends see the connection end and
get every work request back exactly once."""

import re

from vt3lab.setups import B_IP

PORT = 7471


def result(out: str) -> dict[str, str]:
    m = re.search(r"^RESULT (.*)$", out, re.M)
    assert m, f"no RESULT line in:\n{out}"
    return dict(field.split("=", 1) for field in m.group(1).split())


def wait_for_line(guest, tag: str, line: str, timeout: int) -> None:
    guest.check(f"for i in $(seq {timeout * 5}); do grep -qx {line} /tmp/{tag}.out && exit 0; sleep 0.2; done; "
                f"cat /tmp/{tag}.out; exit 1", timeout + 10, f"no {line} from {tag}")


def test_reset_mid_transfer(shared_pair, wr_check):
    """A TCP RST injected by vt3d mid-transfer: DISCONNECTED and QP_FATAL on
    both ends, every WR completed once: the client's WRITEs (those the
    device had sent complete, the others flush), the server's receives
    (never consumed: all flushed)."""
    a, b = shared_pair.a, shared_pair.b
    b.spawn(f"{wr_check} server {PORT}", "server", lifetime=300)
    wait_for_line(b, "server", "LISTENING", 30)
    a.spawn(f"{wr_check} client {B_IP} {PORT}", "client", lifetime=300)
    wait_for_line(a, "client", "FLOWING", 120)

    # The connection as the test knows it: by its port.
    answer = shared_pair.vt3a.ctl("fault", "rst", "--port", str(PORT))
    assert len(answer["qps"]) == 1, answer

    ends = {}
    for guest, tag in ((a, "client"), (b, "server")):
        r = guest.join(tag, 120)
        got = ends[tag] = result(r.out)
        assert r.rc == 0, f"{tag} lost or duplicated work requests (exit {r.rc}):\n{r.out}"
        assert got["posted"] == got["completed"] and got["duplicates"] == "0", f"{tag}: {got}"
        assert got["cm_event"] == "RDMA_CM_EVENT_DISCONNECTED", f"{tag}: {got}"
        assert got["async_event"] == "QP_FATAL", f"{tag}: {got}"
    client, server = ends["client"], ends["server"]
    assert int(client["ok"]) >= 200 and client["other"] == "0", client
    assert server["flushed"] == server["posted"] == "64" and server["ok"] == "0", server
