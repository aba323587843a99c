"""The README's demo, run in CI on the shared pair: it must work as shown."""

from vt3lab.scenarios.demo import run_demo


def test_demo(vt3_pair):
    """the demo (./run-vm.sh): rping, perftest, counters, a normal close and a fatal error"""
    lines = []
    run_demo(vt3_pair, say=lines.append)
    text = "\n".join(lines)
    assert "vt3-flushtest: 1 passed, 0 failed" in text \
        and text.count("vt3-flushtest: 1 passed, 0 failed") == 2, text[-2000:]
