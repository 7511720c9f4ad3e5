"""The 2002 routers' disciplines (qos.emulator.ios): IOS's defaults, and how each behaves on
crafted packet sequences (virtual clock, no namespaces, no root)."""

from __future__ import annotations

import random

import pytest

from pathmaster.records import ConfigError
from qos.emulator import ios
from qos.emulator.config import config_from_dict
from qos.emulator.disciplines import (CISCO_PRECEDENCE_DEFAULTS, ClassWfq, Fifo, FlowWfq, Priority, Wred,
                                      ios_weight)
from qos.emulator.launch import interface_config
from qos.emulator.simulate import synthetic_packet

URGENT, ROUTINE, TEACHING, BULK, UNMARKED = 34, 18, 10, 1, 0


def build(strategy: str, **extra):
    """The emulator link the testbed would run for an "ios-..." strategy table."""
    config = config_from_dict(interface_config(["eth0"], {"rate_kbit": 10_000, "strategy": "ios-" + strategy,
                                                          **extra}))
    return config.directions[0].build(random.Random(1))


def classify(pkt, klass: str):
    pkt.klass = klass
    return pkt


def test_fifo_is_the_hold_queue_of_40():
    link = build("fifo")
    assert isinstance(link.scheduler, Fifo) and link.scheduler.queue.limit == 40
    fifo = Fifo()  # the class's own default is IOS's too
    drops = [d for i in range(45) for d in fifo.enqueue(synthetic_packet(1500, flow=i), 0.0)]
    assert len(fifo) == 40 and [reason for _, reason in drops] == ["tail"] * 5


def test_priority_limits_are_20_40_60_80_and_service_is_strict():
    pq = build("priority").scheduler
    assert isinstance(pq, Priority)
    assert [q.limit for q in pq.queues] == [20, 40, 60, 80]
    admitted = {}
    for klass, dscp in (("bulk", BULK), ("teaching", TEACHING), ("routine", ROUTINE), ("urgent", URGENT)):
        admitted[klass] = sum(not pq.enqueue(classify(synthetic_packet(1500, dscp), klass), 0.0) for _ in range(100))
    assert admitted == {"urgent": 20, "routine": 40, "teaching": 60, "bulk": 80}
    order = [pq.dequeue(0.0).klass for _ in range(200)]
    assert order == ["urgent"] * 20 + ["routine"] * 40 + ["teaching"] * 60 + ["bulk"] * 80
    # unclassified traffic goes to "normal", with the teaching class
    assert pq.enqueue(classify(synthetic_packet(1500, UNMARKED), "default"), 0.0) == []
    assert len(pq.queues[2]) == 1


def test_ios_weights_follow_precedence():
    assert [ios_weight(d) for d in (0, 1, 10, 18, 34, 46, 56)] == [32384, 32384, 16192, 10794, 6476, 5397, 4048]
    assert ios.precedence_weights() == {"urgent": 5, "routine": 3, "teaching": 2, "bulk": 1, "default": 1}


def test_flow_wfq_shares_by_precedence_plus_one():
    wfq = build("wfq").scheduler
    assert isinstance(wfq, FlowWfq)
    assert (wfq.congestive_discard, wfq.dynamic_queues, wfq.hold_limit) == (64, 256, 1000)
    for _ in range(60):  # two backlogged conversations, under the discard threshold
        wfq.enqueue(synthetic_packet(1500, URGENT, flow=1), 0.0)
        wfq.enqueue(synthetic_packet(1500, UNMARKED, flow=2), 0.0)
    sent = [wfq.dequeue(0.0).dscp for _ in range(60)]
    assert sent.count(URGENT) == 50 and sent.count(UNMARKED) == 10  # 5 : 1


def test_flow_wfq_is_per_flow_not_per_class():
    """Two bulk flows against one: a class-based scheduler would give the class one share; IOS's
    fair-queue gives each conversation its own, and a thin flow's small packets go first."""
    wfq = FlowWfq()
    for _ in range(30):
        for flow in (1, 2, 3):
            wfq.enqueue(synthetic_packet(1500, BULK, flow=flow), 0.0)
    wfq.enqueue(synthetic_packet(64, BULK, flow=9), 0.0)  # a small packet of a fourth, idle flow
    first = [wfq.dequeue(0.0) for _ in range(31)]
    assert first[0].length == 64
    per_flow = [sum(p.flow[3] == f for p in first[1:]) for f in (1, 2, 3)]
    assert per_flow == [10, 10, 10]


def test_flow_wfq_congestive_discard_and_modified_tail_drop():
    wfq = FlowWfq(congestive_discard=64)
    bulk = [wfq.enqueue(synthetic_packet(1500, BULK, flow=1), 0.0) for _ in range(70)]
    assert sum(bool(d) for d in bulk) == 6 and len(wfq) == 64  # the greedy conversation alone loses
    for _ in range(64):
        assert wfq.enqueue(synthetic_packet(1500, URGENT, flow=2), 0.0) == []
    # The urgent conversation is at its threshold too, but its next packet's sequence number is
    # lower than the bulk conversation's last: that one is dropped instead.
    drops = wfq.enqueue(synthetic_packet(1500, URGENT, flow=2), 0.0)
    assert len(drops) == 1 and drops[0][0].dscp == BULK and drops[0][1] == "overflow"
    assert len(wfq) == 128


def test_flow_wfq_hold_limit_comes_from_the_file():
    link = build("wfq", flow_wfq={"hold_limit": 16})
    wfq = link.scheduler
    drops = [d for i in range(20) for d in wfq.enqueue(synthetic_packet(1500, BULK, flow=i), 0.0)]
    assert len(wfq) == 16 and len(drops) == 4


def test_cbwfq_is_its_own_strategy_with_precedence_weights():
    cbwfq = build("cbwfq").scheduler
    assert isinstance(cbwfq, ClassWfq)
    assert cbwfq.weights == {"urgent": 5, "routine": 3, "teaching": 2, "bulk": 1, "default": 1}
    assert all(q.limit == 64 for q in cbwfq._drr.queues.values())  # IOS queue-limit


def test_shaping_is_wfq_with_the_competing_class_shaped_at_ios_default_burst():
    link = build("shaping", shaped_rate_kbit=4000, shaped_base="wfq")
    assert isinstance(link.scheduler, FlowWfq)
    assert link.shapers["bulk"].rate_bytes == pytest.approx(4000e3 / 8)
    assert link.shapers["bulk"].burst == 62_500  # IOS: Bc = CIR x 125 ms
    assert isinstance(build("shaping", shaped_rate_kbit=200).scheduler, ClassWfq)  # or class-based
    assert build("shaping", shaped_rate_kbit=200, shaped_burst_bytes=3028).shapers["bulk"].burst == 3028
    with pytest.raises(ConfigError, match="shaped_rate_kbit"):
        build("shaping")


def test_wred_precedence_profiles_and_averaging_weight():
    wred = build("wred").scheduler
    assert isinstance(wred, Wred)
    assert wred.weight == 2 ** -9 and wred.queue.limit == 40
    mins = [CISCO_PRECEDENCE_DEFAULTS[p << 3].min_th for p in range(8)]
    assert mins == [20, 22, 24, 26, 28, 31, 33, 35]
    assert {(p.max_th, p.mark_denominator) for p in CISCO_PRECEDENCE_DEFAULTS.values()} == {(40, 10)}
    assert wred.profiles[URGENT].min_th == 28 and wred.profiles[BULK].min_th == 20  # AF41 is precedence 4


def test_wred_drops_low_precedence_first():
    """Keep the queue at 39-40 packets: the average climbs at 1/512 per arrival; while it is
    between 20 and 28, precedence 0 is dropped early and precedence 4 (AF41) never is."""
    wred = Wred(CISCO_PRECEDENCE_DEFAULTS, limit=40, rng=random.Random(3))
    for i in range(39):
        wred.enqueue(synthetic_packet(1500, UNMARKED, flow=i), 0.0)
    assert wred.avg == pytest.approx(sum(range(39)) / 512, rel=0.05)  # weight 2^-9 per arrival
    early = {UNMARKED: 0, URGENT: 0}
    arrivals = 0
    while wred.avg < 27.5:
        for dscp in (UNMARKED, URGENT):
            drops = wred.enqueue(synthetic_packet(1500, dscp), 0.0)
            arrivals += 1
            early[dscp] += sum(reason == "wred_early" for _, reason in drops)
            if not drops:
                wred.dequeue(0.0)
        assert arrivals < 5000
    assert early[URGENT] == 0 and early[UNMARKED] > 0


def test_unknown_ios_strategy_is_refused_by_name():
    with pytest.raises(ConfigError, match="unknown IOS strategy 'red'"):
        build("red")
