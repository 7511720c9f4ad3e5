"""The kernel backend (htb + pfifo + u32 on DSCP) validated with real iperf3 flows through the testbed.

Flows go from the master A1 to hosts of subnet B, so they share rA's uplink egress.

One flow alone is measured by iperf3, its goodput converted to frames: x (MSS + 66) / MSS,
66 bytes being the IP (20), TCP with timestamps (32) and Ethernet (14) headers htb counts
on a veth. Competing flows are measured by the per-class byte counters of that queue over
one common window while all of them run: each iperf3 reports over its own start and end,
which on a loaded machine do not line up, and a flow measured while its competitor was not
yet started would pass or fail for the wrong reason.
"""

from __future__ import annotations

import time

import pytest

from qos import netns
from qos.classes import DEFAULT_CLASSES
from qos.experiment import fidelity
from qos.testbed import Testbed, kernel, load_config
from qos.traffic.iperf import IperfServer, finish_client, run_client, start_client

pytestmark = [pytest.mark.netns, pytest.mark.timing]

RATE = 10_000_000
BOTTLENECK = "rA:rA-eth4"
WINDOW_S = 2.0
STARTED_BYTES = 250_000  # a class has sent this much since the flows began, or holds a queue: it is running
BUSY = 0.90  # of RATE: the greedy flows together carried at least this in a window that measured the link
# The hypervisor's share of the CPU past which a window measured the machine, not the kernel's
# queue (in the contested experiment's pilot the emulators missed their time from 5 % of steal).
STOLEN = 0.05


@pytest.fixture(scope="module")
def testbed(netns_ok):
    missing = kernel.missing_for_kernel_backend()
    if missing:
        pytest.skip(f"kernel lacks qdiscs {missing}")
    with Testbed(load_config().with_tag(netns.new_tag("k"))) as tb:
        yield tb


def _snapshot(tb: Testbed) -> tuple[float, dict]:
    """(time, per-class counters) of the bottleneck queue, timed at the middle of the read."""
    node, dev = BOTTLENECK.split(":")
    t0 = time.monotonic()
    stats = kernel.stats(tb.host(node), dev, tb.disciplines[BOTTLENECK])
    return (t0 + time.monotonic()) / 2, stats


def class_rates(tb: Testbed, specs: list[tuple[str, str]], timeout: float = 20.0) -> tuple[dict, dict]:
    """Run one TCP flow per (destination host, request class) from A1 together; return each
    class's rate in bit/s of frames over a common `WINDOW_S` window, and the counters at its end.

    The flows are greedy, so a work-conserving discipline keeps the link busy: a window in
    which it carried under BUSY of its rate measured the machine (the kernel did not send),
    not the discipline, and is measured again, at most fidelity.MAX_ATTEMPTS in all, as the
    experiment driver reruns a run whose emulator fell behind. The last window is returned."""
    for _ in range(fidelity.MAX_ATTEMPTS):
        rates, end = one_window(tb, specs, timeout)
        if sum(rates.values()) >= BUSY * RATE:
            break
    return rates, end


def one_window(tb: Testbed, specs: list[tuple[str, str]], timeout: float) -> tuple[dict, dict]:
    """One measurement of `class_rates`: the flows started, a window measured, the flows ended."""
    servers = [IperfServer(tb.host(dst), 5201).start() for dst, _ in specs]
    procs = []
    try:
        _, first = _snapshot(tb)
        procs = [start_client(tb.master, tb.ip(dst), port=5201, seconds=timeout,
                              dscp=DEFAULT_CLASSES[cls].dscp) for dst, cls in specs]
        deadline = time.monotonic() + timeout / 2
        while True:  # wait until every flow is under way (TCP connected, past slow start)
            _, now = _snapshot(tb)
            if all(now[cls]["bytes"] - first[cls]["bytes"] >= STARTED_BYTES or now[cls]["qlen"] > 0
                   for _, cls in specs):
                break
            assert time.monotonic() < deadline, f"flows did not start: {now}"
            time.sleep(0.05)
        t_a, a = _snapshot(tb)
        time.sleep(WINDOW_S)  # the measured period, not a synchronisation
        t_b, b = _snapshot(tb)
        assert all(p.poll() is None for p in procs), "a flow ended inside the measured window"
    finally:
        for p in procs:
            finish_client(p, interrupt=True)
        for server in servers:
            server.stop()
    return {cls: (b[cls]["bytes"] - a[cls]["bytes"]) * 8 / (t_b - t_a) for cls in b}, b


def test_discipline_tables_are_checked():
    with pytest.raises(ValueError, match="unknown kernel strategy 'wred'"):
        kernel.from_config({"strategy": "wred"}, RATE)
    with pytest.raises(ValueError, match="needs shaped_rate_kbit"):
        kernel.from_config({"strategy": "shaping", "shaped_class": "bulk"}, RATE)
    with pytest.raises(KeyError, match="unknown request class 'gold'"):
        kernel.from_config({"strategy": "shares", "weights": {"gold": 2}}, RATE)
    with pytest.raises(ValueError, match="unknown settings limt"):
        kernel.from_config({"strategy": "fifo", "limt": 3}, RATE)
    d = kernel.shares(RATE, {"urgent": 3, "bulk": 1})
    assert sum(qc.rate_bps for qc in d.classes) <= RATE
    assert {qc.name: qc.rate_bps for qc in d.classes}["urgent"] == 5_000_000


def test_one_tcp_flow_fills_a_shaped_link(testbed):
    testbed.set_strategy({"strategy": "fifo", "limit_packets": 100})
    # A flow short of the rate while the hypervisor took STOLEN of the CPU measured the machine:
    # measured again, at most fidelity.MAX_ATTEMPTS in all (the last is judged).
    for _ in range(fidelity.MAX_ATTEMPTS):
        before = fidelity.machine_sample()
        with IperfServer(testbed.host("B1"), 5201):
            result = run_client(testbed.master, testbed.ip("B1"), port=5201, seconds=2.0, omit=0.5)
        stolen = fidelity.machine_window(before, fidelity.machine_sample())["cpu_steal"] or 0.0
        frames = result.frame_bps()
        if frames >= 0.95 * RATE or stolen < STOLEN:
            break
    assert 0.95 * RATE <= frames <= 1.03 * RATE, f"{frames / 1e6:.2f} Mbit/s of frames, steal {stolen:.3f}"
    # The queue really is the htb pfifo on rA's uplink, and it counted the flow.
    counted = testbed.bottleneck_stats()[BOTTLENECK]["all"]["bytes"]
    assert counted >= result.received_bytes


def test_priority_keeps_the_marked_flow_against_greedy_best_effort(testbed):
    testbed.set_strategy({"strategy": "priority"})
    # Unmarked (DSCP 0) traffic goes to the third queue, "teaching": send the greedy flow there.
    rates, end = class_rates(testbed, [("B2", "teaching"), ("B1", "urgent")])
    assert rates["urgent"] >= 0.90 * RATE, {cls: f"{bps / 1e6:.2f} Mbit/s" for cls, bps in rates.items()}
    # The best-effort flow was there all along, wanting more: its queue still holds packets.
    assert end["teaching"]["qlen"] > 0 or end["teaching"]["drops"] > 0
    assert rates["teaching"] <= 0.05 * RATE


def test_class_shares_follow_weights_3_to_1(testbed):
    testbed.set_strategy({"strategy": "shares", "weights": {"urgent": 3, "bulk": 1}})
    rates, _ = class_rates(testbed, [("B1", "urgent"), ("B2", "bulk")])
    share = rates["urgent"] / (rates["urgent"] + rates["bulk"])
    assert abs(share - 0.75) <= 0.075, f"urgent share {share:.3f}"
    assert rates["urgent"] + rates["bulk"] >= 0.95 * RATE  # and together they use the link


def test_shaping_holds_the_competing_class_to_its_rate(testbed):
    shaped = 4_000_000
    testbed.set_strategy({"strategy": "shaping", "shaped_class": "bulk", "shaped_rate_kbit": shaped / 1000})
    rates, _ = class_rates(testbed, [("B3", "bulk"), ("B1", "urgent")])
    assert abs(rates["bulk"] - shaped) <= 0.05 * shaped, f"bulk {rates['bulk'] / 1e6:.2f} Mbit/s"
    # The rest of the link is left to the other classes, not wasted.
    assert rates["urgent"] >= 0.90 * (RATE - shaped)


def test_a_bad_strategy_is_refused_and_the_link_keeps_its_discipline(testbed):
    testbed.set_strategy({"strategy": "priority"})
    with pytest.raises(ValueError, match="unknown kernel strategy 'wrde'"):
        testbed.set_strategy({"strategy": "wrde"})
    with pytest.raises(ValueError, match="shaped_rate_kbit"):
        testbed.set_strategy({"strategy": "shaping", "shaped_class": "bulk"})
    assert {d.strategy for d in testbed.disciplines.values()} == {"priority"}
    assert "htb" in testbed.host("rA").cmd("tc", "qdisc", "show", "dev", "rA-eth4")
