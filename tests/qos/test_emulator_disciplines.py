"""Queueing disciplines on the virtual clock: priority, class WFQ, flow FQ, WRED, shaping."""

from __future__ import annotations

import random

import pytest

from qos.emulator.classify import dscp_classifier
from qos.emulator.disciplines import (SEED003_AF1, ClassWfq, Fifo, FlowFq, Priority,
                                      TokenBucketShaper, Wred, WredProfile)
from qos.emulator.link import EmulatedLink
from qos.emulator.simulate import constant_rate, simulate, synthetic_packet

CLASSIFY = dscp_classifier()
URGENT, ROUTINE, TEACHING, BULK = 34, 18, 10, 1
AF11, AF12, AF13 = 10, 12, 14


def bytes_by_class(out, t0: float, t1: float) -> dict[str, int]:
    sent: dict[str, int] = {}
    for t, p in out:
        if t0 <= t < t1:
            sent[p.klass] = sent.get(p.klass, 0) + p.length
    return sent


def test_classifier_maps_af_siblings_to_their_class():
    assert [CLASSIFY(d) for d in (34, 18, 10, 12, 14, 1, 0, 46)] == [
        "urgent", "routine", "teaching", "teaching", "teaching", "bulk", "default", "default"]


def test_priority_serves_the_marked_class_first_and_starves_bulk():
    bands = {"urgent": "high", "routine": "medium", "teaching": "normal", "bulk": "low"}
    link = EmulatedLink(10e6, Priority(bands), CLASSIFY)
    arrivals = constant_rate(9e6, 2.0, dscp=URGENT) + constant_rate(9e6, 2.0, dscp=BULK, flow=1)
    sent = bytes_by_class(simulate(link, arrivals, until=2.0), 0.2, 2.0)
    assert sent["urgent"] * 8 / 1.8 == pytest.approx(9e6, rel=0.02)   # everything it offers
    assert sent["bulk"] * 8 / 1.8 == pytest.approx(1e6, rel=0.1)      # only the leftover
    assert link.stats.classes["urgent"].drops == {}
    assert link.stats.classes["bulk"].drops["tail"] > 0


def test_priority_order_of_four_bands_and_cisco_default_limits():
    prio = Priority({"urgent": "high", "routine": "medium", "bulk": "low"})
    pkts = []
    for dscp in (BULK, 0, ROUTINE, URGENT):  # default (0) goes to "normal"
        p = synthetic_packet(dscp=dscp)
        p.klass = CLASSIFY(dscp)
        prio.enqueue(p, 0.0)
        pkts.append(p)
    assert [prio.dequeue(0.0).klass for _ in range(4)] == ["urgent", "routine", "default", "bulk"]
    assert [q.limit for q in prio.queues] == [20, 40, 60, 80]
    with pytest.raises(ValueError, match="unknown priority band 'top'"):
        Priority({"urgent": "top"})


@pytest.mark.parametrize("sizes", [(1500, 1500), (1500, 300)])
def test_class_wfq_shares_follow_weights_3_to_1(sizes):
    link = EmulatedLink(10e6, ClassWfq({"urgent": 3, "bulk": 1}, limit=100), CLASSIFY)
    arrivals = (constant_rate(10e6, 3.0, length=sizes[0], dscp=URGENT)
                + constant_rate(10e6, 3.0, length=sizes[1], dscp=BULK, flow=1))
    sent = bytes_by_class(simulate(link, arrivals, until=3.0), 0.5, 3.0)
    share = sent["urgent"] / (sent["urgent"] + sent["bulk"])
    assert share == pytest.approx(0.75, abs=0.01)  # byte shares, whatever the packet sizes


def test_class_wfq_gives_an_idle_class_share_to_the_others():
    link = EmulatedLink(10e6, ClassWfq({"urgent": 3, "bulk": 1}), CLASSIFY)
    arrivals = constant_rate(2e6, 2.0, dscp=URGENT) + constant_rate(15e6, 2.0, dscp=BULK, flow=1)
    sent = bytes_by_class(simulate(link, arrivals, until=2.0), 0.5, 2.0)
    assert sent["urgent"] * 8 / 1.5 == pytest.approx(2e6, rel=0.03)
    assert sent["bulk"] * 8 / 1.5 == pytest.approx(8e6, rel=0.03)  # work conserving


def test_flow_fq_protects_a_thin_flow_from_a_greedy_one():
    link = EmulatedLink(10e6, FlowFq(limit=50), CLASSIFY)
    thin = constant_rate(1e6, 2.0, flow=1)
    greedy = constant_rate(30e6, 2.0, flow=2)
    out = simulate(link, thin + greedy, until=2.5)
    delivered_thin = sum(1 for _, p in out if p.flow[3] == 1)
    assert delivered_thin == len(thin)   # no drop for the flow below its fair share
    by_flow = {}
    for t, p in out:
        if 0.3 <= t < 2.0:
            by_flow[p.flow[3]] = by_flow.get(p.flow[3], 0) + p.length
    assert by_flow[2] * 8 / 1.7 == pytest.approx(9e6, rel=0.03)


def test_flow_fq_equal_shares_between_greedy_flows_under_the_cap():
    fq = FlowFq(limit=30)
    link = EmulatedLink(10e6, fq, CLASSIFY)
    arrivals = [a for f in range(3) for a in constant_rate(8e6, 2.0, flow=f)]
    out = simulate(link, arrivals, until=2.0)
    assert len(fq) <= 30
    by_flow = {}
    for t, p in out:
        if 0.3 <= t < 2.0:
            by_flow[p.flow[3]] = by_flow.get(p.flow[3], 0) + p.length
    shares = [b / sum(by_flow.values()) for b in by_flow.values()]
    assert shares == pytest.approx([1 / 3] * 3, abs=0.02)
    assert sum(link.stats.classes["default"].drops.values()) > 0


def test_wred_average_follows_cisco_ewma():
    wred = Wred({}, WredProfile(1000, 2000, 10), limit=5000, weight_exponent=2)
    for i in range(3):
        p = synthetic_packet()
        wred.enqueue(p, 0.0)
    # avg <- avg + (q - avg) / 4 with q = 0, 1, 2 on the three arrivals
    expected = 0.0
    for q in (0, 1, 2):
        expected += (q - expected) / 4
    assert wred.avg == pytest.approx(expected)


def test_wred_early_drop_rate_matches_floyds_uniformised_probability():
    profile = WredProfile(10, 30, 10)
    wred = Wred({}, profile, limit=10_000, weight_exponent=0, rng=random.Random(5))
    for _ in range(20):  # queue of 20: average 20 with weight 1, half way between the thresholds
        wred.queue.push(synthetic_packet())
    drops = 0
    n = 20_000
    for _ in range(n):
        p = synthetic_packet()
        if wred.enqueue(p, 0.0):
            drops += 1
        else:
            wred.queue.pop_tail()  # keep the queue at 20
    pb = 0.5 / 10
    # Count-based spreading makes inter-drop gaps uniform on 1..1/pb: rate 2 pb / (1 + pb).
    assert drops / n == pytest.approx(2 * pb / (1 + pb), rel=0.08)


def test_wred_higher_drop_precedence_loses_first_with_seed003_profiles():
    wred = Wred(SEED003_AF1, limit=200, weight_exponent=4, packet_time=1500 * 8 / 10e6,
                rng=random.Random(2))
    link = EmulatedLink(10e6, wred, CLASSIFY)
    arrivals = []
    for flow, dscp in enumerate((AF11, AF12, AF13)):
        arrivals += constant_rate(5e6, 3.0, dscp=dscp, flow=flow)
    delivered = {AF11: 0, AF12: 0, AF13: 0}
    for _, p in simulate(link, arrivals, until=4.0):
        delivered[p.dscp] += 1
    offered = len(arrivals) // 3
    loss = {d: 1 - n / offered for d, n in delivered.items()}
    assert loss[AF13] > loss[AF12] > loss[AF11]
    assert loss[AF13] > 0.9  # {3, 4, 1}: AF13 gets through only when the queue is nearly empty
    drops = link.stats.classes["teaching"].drops  # AF11/12/13 are one class
    assert drops["wred_early"] > 0 and drops["wred_forced"] > 0


def test_wred_forced_drop_above_max_and_tail_drop_at_the_buffer():
    wred = Wred({}, WredProfile(2, 4, 1000), limit=10, weight_exponent=0)
    reasons = [r for _ in range(12) for _, r in wred.enqueue(synthetic_packet(), 0.0)]
    assert reasons[-1] == "wred_forced" and len(wred) <= 5
    small = Wred({}, WredProfile(50, 60, 10), limit=3, weight_exponent=0)
    reasons = [r for _ in range(5) for _, r in small.enqueue(synthetic_packet(), 0.0)]
    assert reasons == ["tail", "tail"]


def test_wred_average_decays_while_idle():
    wred = Wred({}, WredProfile(5, 15, 10), limit=100, weight_exponent=3, packet_time=0.001)
    for _ in range(40):
        wred.enqueue(synthetic_packet(), 0.0)
    while wred.dequeue(0.0):
        pass
    high = wred.avg
    wred.enqueue(synthetic_packet(), 1.0)  # one second = 1000 packet times idle
    assert high > 10 and wred.avg < 0.01


def test_shaper_holds_the_class_to_its_rate_and_leaves_others_alone():
    shaper = TokenBucketShaper(1e6, burst=3000, limit=1000)
    link = EmulatedLink(10e6, Fifo(100), CLASSIFY, shapers={"bulk": shaper})
    arrivals = constant_rate(5e6, 4.0, dscp=BULK) + constant_rate(3e6, 4.0, dscp=URGENT, flow=1)
    out = simulate(link, arrivals, until=4.0)
    sent = bytes_by_class(out, 1.0, 4.0)
    assert sent["bulk"] * 8 / 3.0 == pytest.approx(1e6, rel=0.01)
    assert sent["urgent"] * 8 / 3.0 == pytest.approx(3e6, rel=0.01)
    assert link.stats.classes["bulk"].drops["shaper"] > 0


def test_shaper_lets_a_burst_through_at_line_rate():
    shaper = TokenBucketShaper(1e6, burst=15000)
    link = EmulatedLink(10e6, Fifo(100), CLASSIFY, shapers={"bulk": shaper})
    out = simulate(link, [(0.0, synthetic_packet(1500, BULK)) for _ in range(12)], until=1.0)
    times = [t for t, _ in out]
    assert times[9] == pytest.approx(0.012)  # 10 packets fit the bucket: back to back, 1.2 ms each
    # then the bucket refills 1500 B at 1 Mbit/s (12 ms) per packet
    assert times[10] == pytest.approx(0.0132) and times[11] - times[10] == pytest.approx(0.012)


def test_shaping_combines_with_wfq():
    shaper = TokenBucketShaper(2e6, burst=3000, limit=1000)
    link = EmulatedLink(10e6, ClassWfq({"urgent": 1, "bulk": 1}), CLASSIFY, shapers={"bulk": shaper})
    arrivals = constant_rate(10e6, 3.0, dscp=BULK) + constant_rate(10e6, 3.0, dscp=URGENT, flow=1)
    sent = bytes_by_class(simulate(link, arrivals, until=3.0), 0.5, 3.0)
    assert sent["bulk"] * 8 / 2.5 == pytest.approx(2e6, rel=0.02)
    assert sent["urgent"] * 8 / 2.5 == pytest.approx(8e6, rel=0.02)


def test_wred_average_keeps_decaying_while_arrivals_are_dropped_on_an_empty_queue():
    wred = Wred({}, WredProfile(5, 10, 10), limit=100, weight_exponent=3, packet_time=0.01)
    wred.avg = 1000.0  # far above max: arrivals are dropped and the queue stays empty
    # Each 0.1 s idle shrinks the average by (7/8)**10 = 0.26: 263, 69, 18, then below 5.
    assert [bool(wred.enqueue(synthetic_packet(), t)) for t in (0.1, 0.2, 0.3, 0.4)] == [
        True, True, True, False]
