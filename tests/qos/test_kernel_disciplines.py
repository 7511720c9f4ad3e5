"""The kernel backend (htb + pfifo + u32 on DSCP) validated with real iperf3 flows through the testbed.

Rates are compared in frames: iperf3's goodput x (MSS + 66) / MSS, where 66 bytes are
the IP (20), TCP with timestamps (32) and Ethernet (14) headers htb counts on a veth.
Flows go from the master A1 to hosts of subnet B, so they share rA's uplink egress.
Each flow runs 0.5 s (left out: slow start) + 2 s measured.
"""

from __future__ import annotations

import pytest

from qos.classes import DEFAULT_CLASSES
from qos.testbed import Testbed, kernel, load_config, netns
from qos.traffic.iperf import IperfServer, finish_client, start_client

pytestmark = pytest.mark.netns

RATE = 10_000_000
SECONDS, OMIT = 2.0, 0.5


@pytest.fixture(scope="module")
def testbed(netns_ok):
    missing = kernel.missing_for_kernel_backend()
    if missing:
        pytest.skip(f"kernel lacks qdiscs {missing}")
    with Testbed(load_config().with_tag(netns.new_tag("k"))) as tb:
        yield tb


def flows(tb: Testbed, specs: list[tuple[str, int]]) -> list:
    """Run one TCP flow per (destination host, DSCP) from A1 at once; return their results."""
    servers = [IperfServer(tb.host(dst), 5201).start() for dst, _ in specs]
    try:
        procs = [start_client(tb.master, tb.ip(dst), port=5201, seconds=SECONDS, omit=OMIT, dscp=dscp)
                 for dst, dscp in specs]
        return [finish_client(p, timeout=SECONDS + OMIT + 20) for p in procs]
    finally:
        for s in servers:
            s.stop()


def test_discipline_tables_are_checked():
    with pytest.raises(ValueError, match="unknown kernel strategy 'wred'"):
        kernel.from_config({"strategy": "wred"}, RATE)
    with pytest.raises(ValueError, match="needs shaped_rate_bps"):
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
    (result,) = flows(testbed, [("B1", 0)])
    frames = result.frame_bps()
    assert 0.95 * RATE <= frames <= 1.03 * RATE, f"{frames / 1e6:.2f} Mbit/s of frames"
    # The queue really is the htb pfifo on rA's uplink, and it counted the flow.
    counted = testbed.bottleneck_stats()["rA:rA-eth4"]["all"]["bytes"]
    assert counted >= result.received_bytes


def test_priority_keeps_the_marked_flow_against_greedy_best_effort(testbed):
    testbed.set_strategy({"strategy": "priority"})
    urgent = DEFAULT_CLASSES["urgent"].dscp
    marked, best_effort = flows(testbed, [("B1", urgent), ("B2", 0)])
    assert marked.frame_bps() >= 0.90 * RATE, f"marked {marked.frame_bps() / 1e6:.2f} Mbit/s"
    assert best_effort.frame_bps() <= 0.10 * RATE
    stats = testbed.bottleneck_stats()["rA:rA-eth4"]
    assert stats["urgent"]["bytes"] >= marked.received_bytes


def test_class_shares_follow_weights_3_to_1(testbed):
    testbed.set_strategy({"strategy": "shares", "weights": {"urgent": 3, "bulk": 1}})
    urgent, bulk = flows(testbed, [("B1", DEFAULT_CLASSES["urgent"].dscp), ("B2", DEFAULT_CLASSES["bulk"].dscp)])
    share = urgent.frame_bps() / (urgent.frame_bps() + bulk.frame_bps())
    assert abs(share - 0.75) <= 0.075, f"urgent share {share:.3f}"


def test_shaping_holds_the_competing_class_to_its_rate(testbed):
    shaped = 4_000_000
    testbed.set_strategy({"strategy": "shaping", "shaped_class": "bulk", "shaped_rate_bps": shaped})
    bulk, urgent = flows(testbed, [("B3", DEFAULT_CLASSES["bulk"].dscp), ("B1", DEFAULT_CLASSES["urgent"].dscp)])
    assert abs(bulk.frame_bps() - shaped) <= 0.05 * shaped, f"bulk {bulk.frame_bps() / 1e6:.2f} Mbit/s"
    # The rest of the link is left to the other classes, not wasted.
    assert urgent.frame_bps() >= 0.90 * (RATE - shaped)
