"""CoDel (RFC 8289) in the emulator, checked against the published algorithm's behaviour:
bursts pass, a standing queue is dropped at INTERVAL / sqrt(count) spacing after one whole
INTERVAL above TARGET, dropping stops when the delay falls, a quick return resumes the old
drop rate; per DiffServ class, a light class keeps its delay while a heavy one is controlled."""

from __future__ import annotations

import math
import random

import pytest

from qos.emulator.classify import dscp_classifier
from qos.emulator.config import ConfigError, config_from_dict
from qos.emulator.disciplines import ClassCodel, Codel, Fifo
from qos.emulator.disciplines.codel import CODEL, CODEL_INTERVAL_MS, CODEL_LIMIT_PACKETS, CODEL_TARGET_MS
from qos.emulator.link import EmulatedLink
from qos.emulator.simulate import constant_rate, simulate, synthetic_packet

CLASSIFY = dscp_classifier()
URGENT, BULK = 34, 1
RATE = 10e6
PACKET_TIME = 1500 * 8 / RATE  # 1.2 ms on the wire
TARGET, INTERVAL = CODEL_TARGET_MS / 1000, CODEL_INTERVAL_MS / 1000


def run_transmitter(codel: Codel, arrivals: list[tuple[float, object]], until: float):
    """Serve `codel` as a RATE link would, one packet at a time, driving the discipline by
    hand (no link) so that each drop's time is known: ([drop times], [(send time, sojourn)])."""
    arrivals = sorted(arrivals, key=lambda a: a[0])
    drops, sent, i, t = [], [], 0, 0.0
    while t < until:
        while i < len(arrivals) and arrivals[i][0] <= t:
            pkt = arrivals[i][1]
            pkt.arrival = arrivals[i][0]
            codel.enqueue(pkt, arrivals[i][0])
            i += 1
        pkt = codel.dequeue(t)
        drops += [t for _ in codel.take_dropped()]
        if pkt is None:  # idle until the next arrival
            if i == len(arrivals):
                break
            t = arrivals[i][0]
            continue
        sent.append((t, t - pkt.arrival))
        t += pkt.length * 8 / RATE
    return drops, sent


def overload(rate_bps: float, duration: float, start: float = 0.0):
    return constant_rate(rate_bps, duration, start=start)


def test_a_burst_that_drains_within_an_interval_is_not_dropped():
    # 60 packets at once: the last waits 71 ms (> TARGET) but the queue is gone before INTERVAL.
    drops, sent = run_transmitter(Codel(), [(0.0, synthetic_packet()) for _ in range(60)], until=1.0)
    assert drops == [] and len(sent) == 60
    assert max(s for _, s in sent) > 10 * TARGET


def test_a_standing_queue_is_dropped_at_interval_over_sqrt_count():
    drops, sent = run_transmitter(Codel(), overload(1.5 * RATE, 3.0), until=3.0)
    # The first drop: not before the delay has been above TARGET (with more than an MTU
    # queued) for a whole INTERVAL.
    first_above = next(t for t, s in sent if s >= TARGET)
    assert first_above + INTERVAL <= drops[0] <= first_above + INTERVAL + 2 * PACKET_TIME
    # RFC 8289's control law, computed here independently: after the drop that made count
    # n, the next is due INTERVAL / sqrt(n) after the previous due time (the first: INTERVAL
    # after the first drop); a drop happens at the first departure at or after its due time.
    due = drops[0] + INTERVAL
    for n, t in enumerate(drops[1:12], start=1):
        assert due <= t < due + PACKET_TIME + 1e-9, (n, t, due)
        due += INTERVAL / math.sqrt(n + 1)
    gaps = [b - a for a, b in zip(drops, drops[1:12])]
    assert gaps == sorted(gaps, reverse=True) or max(gaps[5:]) < gaps[0]  # the drop rate grows


def test_dropping_stops_when_the_delay_falls_below_target():
    codel = Codel()
    drops, sent = run_transmitter(codel, overload(1.2 * RATE, 2.0) + overload(0.5 * RATE, 2.0, start=2.0),
                                  until=4.0)
    assert drops and max(drops) < 2.5
    assert not codel.codel.dropping
    late = [s for t, s in sent if t > 3.0]
    assert late and max(late) < TARGET  # the light phase's packets go through, undelayed


def test_a_quick_return_resumes_near_the_last_drop_rate():
    codel = Codel()
    _, sent = run_transmitter(codel, overload(1.2 * RATE, 2.0), until=3.0)
    assert sent[-1][0] < 3.0 and not codel.codel.dropping  # drained, and out of the dropping state
    count, lastcount = codel.codel.count, codel.codel.lastcount
    assert count - lastcount > 1
    # back within 16 intervals: count starts at the drops of the last episode, not at 1
    drops, _ = run_transmitter(codel, overload(1.5 * RATE, 1.0, start=3.0), until=4.0)
    delta = count - lastcount
    assert codel.codel.lastcount == delta
    assert drops[1] - drops[0] == pytest.approx(INTERVAL / math.sqrt(delta), abs=PACKET_TIME)


def test_a_queue_of_at_most_one_packet_is_never_dropped():
    # a slow trickle into an even slower link would wait long, but never more than 1 MTU queued
    codel = Codel()
    arrivals = [(i * 0.05, synthetic_packet()) for i in range(40)]
    drops, _ = run_transmitter(codel, arrivals, until=3.0)
    assert drops == []


def test_link_counts_codel_drops_and_releases_their_packets():
    class Handle:
        dropped = 0

        def drop(self):
            Handle.dropped += 1

    arrivals = overload(1.1 * RATE, 3.0)
    for _, p in arrivals:
        p.handle = Handle()
    codel_link = EmulatedLink(RATE, Codel(), CLASSIFY)
    out = simulate(codel_link, arrivals, until=3.0)
    stats = codel_link.stats.classes["default"]
    assert stats.drops.get(CODEL, 0) > 0 and set(stats.drops) <= {CODEL, "tail"}
    assert Handle.dropped == sum(stats.drops.values())
    assert stats.arrived_packets == len(out) + sum(stats.drops.values()) + codel_link.held()
    # against a plain FIFO of the same buffer, the standing queue at the end is far shorter
    fifo_link = EmulatedLink(RATE, Fifo(CODEL_LIMIT_PACKETS), CLASSIFY)
    simulate(fifo_link, overload(1.1 * RATE, 3.0), until=3.0)
    assert len(codel_link.scheduler) < len(fifo_link.scheduler) / 2


def test_class_codel_keeps_a_light_class_fast_while_controlling_a_heavy_one():
    link = EmulatedLink(RATE, ClassCodel({"urgent": 5, "bulk": 1}), CLASSIFY)
    arrivals = constant_rate(1.5 * RATE, 3.0, dscp=BULK) + constant_rate(0.05 * RATE, 3.0, dscp=URGENT, flow=1)
    out = simulate(link, arrivals, until=3.0)
    urgent, bulk_stats = link.stats.classes["urgent"], link.stats.classes["bulk"]
    assert urgent.drops == {} and urgent.sent_packets == sum(1 for _, p in out if p.klass == "urgent")
    assert urgent.delay_max < TARGET
    assert bulk_stats.drops.get(CODEL, 0) > 0


def test_codel_is_configured_by_file_and_checked():
    def one_link(**settings) -> dict:
        return {"link": {"l": {"rate_kbit": 10_000, **settings, "forward": {"queue": 1, "out": "eth0"}}}}

    built = config_from_dict(one_link(discipline="codel", codel={"target_ms": 2, "interval_ms": 50}))
    link = built.directions[0].build(random.Random(0))
    assert isinstance(link.scheduler, Codel)
    assert (link.scheduler.codel.target, link.scheduler.codel.interval) == (0.002, 0.05)
    assert link.scheduler.queue.limit == CODEL_LIMIT_PACKETS
    per_class = config_from_dict(one_link(discipline="class_codel", limit_packets=200,
                                          class_codel={"weights": {"urgent": 5, "bulk": 1}}))
    scheduler = per_class.directions[0].build(random.Random(0)).scheduler
    assert isinstance(scheduler, ClassCodel) and scheduler.weights == {"urgent": 5, "bulk": 1, "default": 1.0}
    assert scheduler.queues["bulk"].limit == 200
    with pytest.raises(ConfigError, match="below interval_ms"):
        config_from_dict(one_link(discipline="codel", codel={"target_ms": 100, "interval_ms": 100}))
    with pytest.raises(ConfigError, match="unknown class"):
        config_from_dict(one_link(discipline="class_codel", class_codel={"weights": {"vip": 2}}))
    with pytest.raises(ConfigError, match="discipline"):
        config_from_dict(one_link(discipline="fifo", codel={"target_ms": 5}))


def test_a_codel_station_on_a_shared_medium_hands_its_drops_to_the_link():
    from qos.emulator.disciplines import SharedMedium

    medium = SharedMedium({"master": Codel(), "router": Fifo(40)})
    link = EmulatedLink(RATE, medium, CLASSIFY)
    arrivals = overload(1.5 * RATE, 2.0)
    for _, p in arrivals:
        p.station = "master"
    out = simulate(link, arrivals, until=2.0)
    stats = link.stats.classes["default"]
    assert stats.drops.get(CODEL, 0) > 0
    assert stats.arrived_packets == len(out) + sum(stats.drops.values()) + link.held()
