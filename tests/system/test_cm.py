"""vt3.ko's connections between two guests: kernel and user rdma_cm,
graceful and abortive ends, a peer that times out, a device that stops
answering, rmmod under a live connection."""

import re
import signal
import time

from helpers import A_IP, count, no_objects, perftest, rping_between, summary, wait_rdma_listen
from vt3lab.tools import tail
from vt3lab import KMOD
from vt3lab.setups import debug_vt3, wait_device

_marks = iter(range(1, 1 << 30))


def kmark(g) -> str:
    """A line in G's kernel log; kmsg_since(g, mark) is what came after."""
    mark = f"vt3lab-mark-{int(time.time())}-{next(_marks)}"
    g.check(f"echo {mark} > /dev/kmsg", 10)
    return mark


def kmsg_since(g, mark: str) -> str:
    """G's kernel log after MARK, without the timestamps."""
    return g.check(f"dmesg | sed -n '/{mark}/,$p' | sed 's/^\\[[^]]*\\] //'", 20)


def wait_exit(g, tag: str, timeout: int):
    """A spawned command's exit status and the tail of its output (join
    would copy a long -v log over the serial line)."""
    r = g.run(f"i=0; while [ ! -e /tmp/{tag}.rc ] && [ $i -lt {timeout * 5} ]; do sleep 0.2; i=$((i+1)); done; "
              f"tail -n 30 /tmp/{tag}.out; [ -e /tmp/{tag}.rc ] || exit 255; exit $(cat /tmp/{tag}.rc)",
              timeout + 10)
    assert r.rc != 255 or g.run(f"[ -e /tmp/{tag}.rc ]", 10).ok, \
        f"{g.name}: '{tag}' still running after {timeout} s:\n{tail(r.out)}"
    return r


def pings_logged(g, log: str) -> int:
    return int(g.check(f"grep -c 'ping data' {log} || true", 10).strip() or 0)


def wait_pings(g, log: str, n: int, timeout: int = 120) -> int:
    """Until LOG (an rping -v log, block-buffered) shows N pings."""
    r = g.run(f"for i in $(seq {timeout * 5}); do [ $(grep -c 'ping data' {log}) -ge {n} ] && exit 0; sleep 0.2; done; "
              f"grep -c 'ping data' {log}; tail -n 5 {log}; exit 1", timeout + 10)
    assert r.ok, f"{g.name}: fewer than {n} pings in {log} after {timeout} s:\n{r.out}"
    return pings_logged(g, log)


def rping_long(setup) -> None:
    """A long rping from b (client, tag rping-cli) to a (server, tag
    rping-srv), pings flowing. The -v lines go to /tmp/rping-*.log; the
    spawned output keeps the errors and CM events."""
    a, b = setup.a, setup.b
    a.spawn(f"rping -s -a {A_IP} -v > /tmp/rping-srv.log", "rping-srv", 900)
    wait_rdma_listen(a, 7174)
    b.spawn(f"rping -c -a {A_IP} -C 100000 -v > /tmp/rping-cli.log", "rping-cli", 900)
    # stdout to a file is block-buffered (~50 lines a block): two blocks
    # on each side, and more after that, mean the pings flow.
    first = wait_pings(b, "/tmp/rping-cli.log", 100)
    wait_pings(a, "/tmp/rping-srv.log", 100)
    wait_pings(b, "/tmp/rping-cli.log", first + 50)
    assert a.running("rping-srv") and b.running("rping-cli"), "an rping ended on its own"


def rping_pid(g) -> str:
    pid = g.check("pidof rping", 10).split()
    assert len(pid) == 1, f"{g.name}: rping pids {pid}"
    return pid[0]


def assert_gone(g, tag: str, timeout: int, rc, messages: list[str], what: str, unwanted: tuple[str, ...] = ()):
    """The spawned command TAG ends within TIMEOUT with exit status RC (or
    one of them), prints every one of MESSAGES and none of UNWANTED."""
    r = wait_exit(g, tag, timeout)
    rcs = rc if isinstance(rc, (tuple, list, set)) else (rc,)
    assert r.rc in rcs, f"{g.name}: {what}: exit {r.rc}, want {rc}:\n{tail(r.out)}"
    for m in messages:
        assert m in r.out, f"{g.name}: {what}: no '{m}':\n{tail(r.out)}"
    for m in unwanted:
        assert m not in r.out, f"{g.name}: {what}: '{m}':\n{tail(r.out)}"
    return r


def retire(setup, guest: str, vt3d: str) -> None:
    """Powers GUEST off and stops VT3D for good, and takes both out of the
    setup: the health check reports a stopped guest or vt3d as a problem."""
    setup.guests.pop(guest).stop()
    setup.vt3d.pop(vt3d).stop()


# ----------------------------------------------------------------- cases

# How many CHECKs vt3_kcm passes when everything works (rounds=10), read
# off a good run: the client's refused connect (resolve, REJECTED, drained)
# and its connection (resolve, ESTABLISHED, RTS, 10 echoes, disconnect,
# ERR, drained); the server's accepted connection. A check that was
# skipped (a path not taken) is a failure too.
KCM_CLIENT_CHECKS = 22
KCM_SERVER_CHECKS = 6


def test_vt3_kcm(vt3_pair):
    """two vt3 guests: kernel rdma_cm client/server (reject, connect, 10 SENDs, disconnect)"""
    a, b = vt3_pair.a, vt3_pair.b
    ma, mb = kmark(a), kmark(b)
    a.check(f"insmod {KMOD}/vt3_kcm.ko server=1", 30)
    wait_rdma_listen(a, 7777)
    r = b.run(f"insmod {KMOD}/vt3_kcm.ko addr={A_IP}", 600)
    blog = kmsg_since(b, mb)
    assert r.rc == 0, f"insmod vt3_kcm (client): exit {r.rc}: {r.out}\n{tail(blog)}"
    passed, failed = summary(blog, "vt3_kcm: client:")
    fails = [line for line in blog.splitlines() if line.startswith("vt3_kcm: FAIL")]
    assert failed == 0 and not fails, f"client: {failed} failed:\n" + "\n".join(fails[:5])
    assert passed == KCM_CLIENT_CHECKS, f"client: {passed} passed, want {KCM_CLIENT_CHECKS}:\n{tail(blog, 30)}"
    assert count(blog, r"^vt3_kcm: ok ") == passed, f"client: ok lines differ from the summary:\n{tail(blog, 30)}"
    # The server logs its result when its connection's DISCONNECTED was drained.
    a.check("for i in $(seq 150); do dmesg | grep -q 'vt3_kcm: server: ' && exit 0; sleep 0.2; done; exit 1", 60,
            "no server summary")
    alog = kmsg_since(a, ma)
    passed, failed = summary(alog, "vt3_kcm: server:")
    fails = [line for line in alog.splitlines() if line.startswith("vt3_kcm: FAIL")]
    assert failed == 0 and not fails, f"server: {failed} failed:\n" + "\n".join(fails[:5])
    assert passed == KCM_SERVER_CHECKS, f"server: {passed} passed, want {KCM_SERVER_CHECKS}:\n{tail(alog, 30)}"
    b.check("rmmod vt3_kcm", 60)
    a.check("rmmod vt3_kcm", 60)
    no_objects(vt3_pair, "after the kernel test")


def test_vt3_rping(vt3_pair):
    """two vt3 guests: rping -C 10, both sides exit cleanly, vt3d ends with no objects"""
    rping_between(vt3_pair.a, vt3_pair.b, 10, verify=False)
    no_objects(vt3_pair, "after rping")


def test_listen_beside_tcp(vt3_pair):
    """a port the guest's TCP listens on: root's rdma_listen there takes the wire's connections (rping works, the
    TCP listener gets none, as on a T3 whose listening server steers the port's SYNs); nobody's gets EADDRINUSE"""
    a, b = vt3_pair.a, vt3_pair.b
    port = 5555
    mark = kmark(a)
    a.spawn(f"nc -l {a.ip} {port} > /tmp/nc.out", "nc", 300)
    a.check(f"for i in $(seq 100); do grep -qi ':{port:04X} 00000000:0000 0A' /proc/net/tcp && exit 0; sleep 0.1; "
            "done; exit 1", 30, "nc does not listen")
    # Root of a user namespace of its own: no CAP_NET_ADMIN over the guest's network.
    r = a.run(f"unshare -U -r rping -s -a {a.ip} -p {port} -C 1 2>&1", 60)
    assert r.rc != 0 and "rdma_listen: Address already in use" in r.out, \
        f"an unprivileged rping -s on a port the guest's TCP listens on: exit {r.rc}:\n{tail(r.out)}"
    rping_between(a, b, 5, port=port)
    assert a.running("nc"), "the guest's TCP listener ended"
    assert a.check("cat /tmp/nc.out", 10) == "", "the guest's TCP listener received data"
    log = kmsg_since(a, mark)
    assert count(log, rf"listening on port {port} beside a listener of the guest's TCP") == 1, tail(log)
    a.check("kill $(pidof nc)", 10)
    no_objects(vt3_pair, "after rping beside a TCP listener")


def test_vt3_disconnect(vt3_pair):
    """rdma_disconnect after the peer's close succeeds (ib_send_bw -R, 3 rounds)"""
    # librdmacm's rdma_disconnect() moves the QP to SQD first: after the
    # peer's close completed (CLOSE delivered, QP in ERR) that must still
    # succeed, or perftest says "Failed to disconnect RDMA CM connection."
    # (and may still exit 0).
    a, b = vt3_pair.a, vt3_pair.b
    for rnd in (1, 2, 3):
        # (perftest fails on any line of either end saying fail or error.)
        run = perftest(a, b, "ib_send_bw", 64, 50, setup=vt3_pair)
        for g, out in ((b, run.client), (a, run.server)):
            # All 50 messages, at a message rate above zero (BW in MB/s with
            # two decimals reads 0.00 for 64-byte messages on a busy host).
            rows = re.findall(r"^\s*64\s+50\s+[\d.]+\s+[\d.]+\s+([\d.]+)\s*$", out, re.M)
            assert rows and (float(rows[-1]) > 0 or run.clock_failed()), \
                f"round {rnd}: {g.name}: no result line:\n{tail(out)}"
    no_objects(vt3_pair, "after the runs")


def test_vt3_abort(vt3_pair):
    """rping client killed: RST, the server gets CLOSE and exits"""
    a, b = vt3_pair.a, vt3_pair.b
    ma = kmark(a)
    rping_long(vt3_pair)
    # The client dies: its QP is destroyed with the connection up (RST).
    b.check(f"kill -9 {rping_pid(b)}", 10)
    assert_gone(b, "rping-cli", 30, 137, [], "rping client after kill -9")
    srv = assert_gone(a, "rping-srv", 60, 0, ["server DISCONNECT EVENT..."], "rping server after the peer's RST")
    assert "cq completion failed" not in srv.out, f"a completion other than a flush:\n{tail(srv.out)}"
    alog = kmsg_since(a, ma)
    assert re.search(r"vt3_0: iw_cm CLOSE \(-104\)", alog), f"a: no CLOSE (-ECONNRESET):\n{tail(alog, 25)}"
    no_objects(vt3_pair, "after the abort")


# The client's vt3d killed without a word: a's vt3d (--tcp-timeout default
# 15 s: keep-alives after 5 s of silence, the end after 15 s with nothing
# heard; rping keeps data outstanding, so retransmissions go unanswered)
# must time the connection out between 2/3 of that and all of it after the
# last segment it heard, plus the guest's reaction under TCG.
TCP_TIMEOUT = 15
TIMEOUT_MIN, TIMEOUT_MAX = TCP_TIMEOUT * 2 / 3 - 1, TCP_TIMEOUT + 15


def test_vt3_timeout(fresh_vt3_pair):
    """the client's vt3d killed: the server's TCP times out, CLOSE, exit"""
    setup = fresh_vt3_pair
    a = setup.a
    ma = kmark(a)
    rping_long(setup)
    t0 = time.monotonic()
    setup.vt3b.kill(signal.SIGKILL)
    retire(setup, "b", "vt3b")
    srv = assert_gone(a, "rping-srv", 120, 0, ["server DISCONNECT EVENT..."], "rping server after the peer vanished")
    took = time.monotonic() - t0
    assert "cq completion failed" not in srv.out, f"a completion other than a flush:\n{tail(srv.out)}"
    alog = kmsg_since(a, ma)
    assert re.search(r"vt3_0: iw_cm CLOSE \(-110\)", alog), f"a: no CLOSE (-ETIMEDOUT):\n{tail(alog, 25)}"
    assert TIMEOUT_MIN <= took <= TIMEOUT_MAX, \
        f"the server ended {took:.1f} s after the peer's vt3d died, want {TIMEOUT_MIN:.0f}..{TIMEOUT_MAX:.0f} s"
    print(f"server gone after {took:.1f} s")
    no_objects(setup, "after the timeout")


def test_vt3_lost_conn(fresh_vt3_pair):
    """vt3d stops answering under a connection and a listener; re-probe"""
    setup = fresh_vt3_pair
    a, b = setup.a, setup.b
    ma = kmark(a)
    rping_long(setup)
    a.spawn(f"rping -s -a {A_IP} -p 7999", "rping2-srv", 900)
    wait_rdma_listen(a, 7999)
    setup.vt3a.kill(signal.SIGSTOP)
    try:
        # A verb vt3d will not answer: the driver declares the device lost.
        # GET_CONTEXT needs no answer; ALLOC_PD does, and times out.
        r = a.run("vt3-uverbs check", 120)
        assert r.rc == 1 and re.search(r"^FAIL ALLOC_PD \(-110\)", r.out, re.M), \
            f"vt3-uverbs check with vt3d stopped: exit {r.rc}, want 1 and ALLOC_PD -ETIMEDOUT:\n{tail(r.out)}"
        a.check("for i in $(seq 200); do ls /sys/class/infiniband/ | grep -q vt3 || exit 0; sleep 0.2; done; "
                "ls /sys/class/infiniband; exit 1", 60, "vt3_0 still registered")
        alog = kmsg_since(a, ma)
        assert re.search(r"vt3_0: \S+ \(seq \d+\) and 2 probes not answered in \d+ ms each: vt3d is gone", alog), \
            f"a: no 'vt3d is gone':\n{tail(alog, 25)}"
        removal = "cma detected device removal!!!!"
        # As under rmmod: DEVICE_REMOVAL only, never a DISCONNECTED first
        # (rping takes that for the peer's clean end, and may exit 0).
        disconnect = ("DISCONNECT EVENT",)
        assert_gone(a, "rping-srv", 60, 255, [removal], "connected rping server", disconnect)
        assert_gone(a, "rping2-srv", 60, 255, [removal], "listening rping server", disconnect)
    finally:
        setup.vt3a.kill(signal.SIGCONT)
    # The NIC's link cycled: vt3.ko probes vt3d again.
    a.check("ip link set eth0 down && ip link set eth0 up", 30)
    wait_device(a)
    debug_vt3(a)
    a.check("vt3-uverbs check", 120, "the re-probed device")
    # a's vt3d, answering again, was reset: b's connection ends.
    assert_gone(b, "rping-cli", 120, 0, ["client DISCONNECT EVENT..."],
                "rping client after the server's device was lost")
    no_objects(setup, "after the loss")


def test_vt3_rmmod_conn(fresh_vt3_pair):
    """rmmod vt3 under a live connection, on either side"""
    setup = fresh_vt3_pair
    a, b = setup.a, setup.b
    removal = "cma detected device removal!!!!"
    # The side removed sees DEVICE_REMOVAL only, never a DISCONNECTED
    # first (rping would take that for a clean end and exit 0).
    disconnect = ("DISCONNECT EVENT",)
    # The peer sees the connection end (DISCONNECT) and exits; rping's exit
    # status then depends on where its loop was: 0 waiting for the next
    # SEND, 255 with a READ in flight ("wait for RDMA_READ_COMPLETE state
    # 10"), a race inside rping, not vt3's.
    peer_rc = (0, 255)
    # The server's side.
    rping_long(setup)
    a.check("rmmod vt3 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null", 120)
    assert_gone(a, "rping-srv", 60, 255, [removal], "rping server under rmmod", disconnect)
    assert_gone(b, "rping-cli", 120, peer_rc, ["client DISCONNECT EVENT..."], "rping client after the peer's rmmod")
    no_objects(setup, "after rmmod on the server's side")
    a.check(f"insmod {KMOD}/vt3.ko", 60)
    wait_device(a)
    debug_vt3(a)
    # The client's side.
    rping_long(setup)
    b.check("rmmod vt3 && ! ls /sys/class/infiniband/vt3_0 2>/dev/null", 120)
    assert_gone(b, "rping-cli", 60, 255, [removal], "rping client under rmmod", disconnect)
    assert_gone(a, "rping-srv", 120, peer_rc, ["server DISCONNECT EVENT..."], "rping server after the peer's rmmod")
    no_objects(setup, "after rmmod on the client's side")
