"""The emulated link on a virtual clock: rate, overhead, delay, jitter, loss, FIFO, statistics."""

from __future__ import annotations

import random

import pytest

from qos.emulator.classify import dscp_classifier
from qos.emulator.disciplines import Fifo
from qos.emulator.link import EmulatedLink
from qos.emulator.packet import MalformedPacket, build_ipv4_header, parse_ipv4
from qos.emulator.simulate import constant_rate, simulate, synthetic_packet as packet

CLASSIFY = dscp_classifier()


def test_parse_ipv4_reads_dscp_length_and_ports():
    pkt = parse_ipv4(build_ipv4_header(length=1234, dscp=34, protocol=6, sport=40000, dport=5201, ecn=1))
    assert (pkt.length, pkt.dscp) == (1234, 34)
    assert pkt.flow[2:] == (6, 40000, 5201)
    assert pkt.flow[0] == bytes([10, 0, 0, 1])


def test_parse_ipv4_has_no_ports_for_icmp_and_rejects_garbage():
    assert parse_ipv4(build_ipv4_header(protocol=1)).flow[3:] == (0, 0)
    with pytest.raises(MalformedPacket, match="shorter"):
        parse_ipv4(b"\x45\x00")
    with pytest.raises(MalformedPacket, match="version 6"):
        parse_ipv4(b"\x60" + bytes(39))


def test_fifo_link_serialises_at_the_rate_then_adds_the_delay():
    link = EmulatedLink(10e6, Fifo(100), CLASSIFY, delay=0.020, overhead=0)
    out = simulate(link, [(0.0, packet(1250)) for _ in range(5)], until=1.0)
    # 1250 bytes at 10 Mbit/s is 1 ms each; releases at 21, 22, ... 25 ms.
    assert [round(t, 9) for t, _ in out] == [0.021, 0.022, 0.023, 0.024, 0.025]


def test_overhead_is_charged_per_packet():
    link = EmulatedLink(1e6, Fifo(100), CLASSIFY, overhead=125)
    out = simulate(link, [(0.0, packet(1125)), (0.0, packet(1125))], until=1.0)
    assert [round(t, 9) for t, _ in out] == [0.010, 0.020]  # (1125 + 125) B * 8 / 1 Mbit/s


def test_sustained_throughput_equals_the_rate_when_overloaded():
    link = EmulatedLink(10e6, Fifo(50), CLASSIFY)
    out = simulate(link, constant_rate(20e6, 2.0), until=2.0)
    sent = sum(p.length for t, p in out if 0.5 <= t < 2.0) * 8 / 1.5
    assert sent == pytest.approx(10e6, rel=0.01)
    stats = link.stats.classes["default"]
    assert stats.drops["tail"] > 0
    assert stats.arrived_packets == stats.enqueued_packets + stats.drops["tail"]


def test_tail_drop_counts_the_packet_in_transmission_out_of_the_buffer():
    link = EmulatedLink(10e6, Fifo(5), CLASSIFY)
    simulate(link, [(0.0, packet()) for _ in range(10)], until=0.0)
    assert link.stats.classes["default"].drops == {"tail": 4}  # 1 on the wire + 5 queued


def test_late_caller_gets_the_same_schedule_as_a_punctual_one():
    arrivals = constant_rate(15e6, 0.2, length=1000)
    punctual = EmulatedLink(10e6, Fifo(20), CLASSIFY, delay=0.005)
    times = []
    for t, pkt in arrivals:
        times += [r for r, _ in punctual.advance(t)]
        punctual.enqueue(pkt, t)
    times += [r for r, _ in punctual.advance(1.0)]
    late = EmulatedLink(10e6, Fifo(20), CLASSIFY, delay=0.005)
    late_times = [r for r, _ in simulate(late, [(t, packet(1000)) for t, _ in arrivals], until=1.0)]
    assert times == late_times


def test_jitter_stays_in_bounds_and_never_reorders():
    link = EmulatedLink(10e6, Fifo(1000), CLASSIFY, delay=0.020, jitter=0.005, rng=random.Random(3))
    arrivals = constant_rate(5e6, 1.0)
    out = simulate(link, arrivals, until=2.0)
    releases = [t for t, _ in out]
    assert releases == sorted(releases)
    extra = [t - p.arrival for t, p in out]
    assert min(extra) >= 0.015 and max(extra) <= 0.0262  # delay - jitter .. delay + jitter + tx
    assert max(extra) - min(extra) > 0.005  # there is jitter


def test_random_loss_hits_the_configured_fraction():
    link = EmulatedLink(100e6, Fifo(1000), CLASSIFY, loss=0.1, rng=random.Random(1))
    simulate(link, constant_rate(50e6, 1.0), until=2.0)
    s = link.stats.classes["default"]
    assert s.drops["loss"] / s.arrived_packets == pytest.approx(0.1, abs=0.015)


def test_queueing_delay_statistics():
    link = EmulatedLink(1e6, Fifo(10), CLASSIFY)
    simulate(link, [(0.0, packet(1250)) for _ in range(3)], until=1.0)
    s = link.stats.classes["default"].to_dict()
    # Each packet takes 10 ms: they wait 0, 10 and 20 ms.
    assert s["queueing_delay_mean_s"] == pytest.approx(0.010)
    assert s["queueing_delay_max_s"] == pytest.approx(0.020)
    assert s["sent_packets"] == 3 and s["sent_bytes"] == 3750


def test_drain_returns_every_held_packet():
    link = EmulatedLink(1e6, Fifo(10), CLASSIFY, delay=0.1)
    simulate(link, [(0.0, packet()) for _ in range(6)], until=0.05)
    assert link.held() == 6
    assert len(link.drain()) == 6 and link.held() == 0


def test_invalid_link_parameters_are_refused():
    with pytest.raises(ValueError, match="jitter"):
        EmulatedLink(1e6, Fifo(10), CLASSIFY, delay=0.01, jitter=0.02)
    with pytest.raises(ValueError, match="rate"):
        EmulatedLink(0, Fifo(10), CLASSIFY)
    with pytest.raises(ValueError, match="loss"):
        EmulatedLink(1e6, Fifo(10), CLASSIFY, loss=1.0)


def test_backlog_is_sampled_at_most_once_per_interval():
    from qos.emulator.disciplines import Wred, WredProfile
    from qos.emulator.stats import LinkStats

    stats = LinkStats(sample_interval=0.1)
    link = EmulatedLink(10e6, Wred({}, WredProfile(20, 40, 10), limit=100), CLASSIFY, stats=stats)
    simulate(link, constant_rate(12e6, 1.0), until=1.0)
    times = [s[0] for s in stats.samples]
    assert 9 <= len(times) <= 11 and all(b - a >= 0.1 - 1e-6 for a, b in zip(times, times[1:]))
    assert stats.sample_fields == ["t_s", "backlog_packets", "backlog_bytes", "wred_avg"]
    backlog = [s[1] for s in stats.samples]
    assert backlog[-1] > backlog[0]  # 12 Mbit/s into 10: the queue grows
    assert link.stats.to_dict(samples=False).keys() == {"classes"}
