"""A shared medium (a hub): directions on one medium share one transmitter, so upload and
reply bytes add up against one rate; each sender keeps its own queue (virtual clock, no root)."""

from __future__ import annotations

import pytest

from pathmaster.records import ConfigError
from qos.emulator.config import build_links, config_from_dict
from qos.emulator.disciplines import Fifo, Priority, SharedMedium
from qos.emulator.simulate import constant_rate, simulate, synthetic_packet

URGENT, BULK = 34, 1


def hub(medium: str | None = "hubA", reverse: dict | None = None, **link) -> list:
    forward = {"queue": 0, "out": "e0"}
    back = {"queue": 1, "in": "e0", **(reverse or {})}
    if medium:
        forward["medium"] = back["medium"] = medium
    config = config_from_dict({"link": {"e0": {"rate_kbit": 10_000, **link, "forward": forward, "reverse": back}}})
    return build_links(config.directions, seed=0)


def offered(rate_bps: float, station: str, dscp: int = 0, flow: int = 0, seconds: float = 2.0) -> list:
    arrivals = constant_rate(rate_bps, seconds, dscp=dscp, flow=flow)
    for _, pkt in arrivals:
        pkt.station = station
    return arrivals


def rate_by_station(out, t0: float = 0.5, t1: float = 2.0) -> dict[str, float]:
    sent: dict[str, int] = {}
    for t, p in out:
        if t0 <= t < t1:
            sent[p.station] = sent.get(p.station, 0) + p.length
    return {k: v * 8 / (t1 - t0) for k, v in sent.items()}


def test_both_directions_share_one_transmitter():
    forward, reverse = hub()
    assert forward is reverse and isinstance(forward.scheduler, SharedMedium)
    out = simulate(forward, offered(8e6, "e0.forward") + offered(8e6, "e0.reverse", flow=1), until=2.0)
    rates = rate_by_station(out)
    assert sum(rates.values()) == pytest.approx(10e6, rel=0.03)   # 16 offered, 10 carried
    assert rates["e0.forward"] == pytest.approx(5e6, rel=0.05)      # turn about
    assert rates["e0.reverse"] == pytest.approx(5e6, rel=0.05)


def test_without_a_medium_each_direction_has_its_own_rate():
    forward, reverse = hub(medium=None)
    assert forward is not reverse
    out = simulate(forward, offered(8e6, "e0.forward"), until=2.0) + \
        simulate(reverse, offered(8e6, "e0.reverse", flow=1), until=2.0)
    assert sum(rate_by_station(out).values()) == pytest.approx(16e6, rel=0.03)


def test_one_flow_alone_gets_at_most_the_medium():
    link, _ = hub()
    out = simulate(link, offered(12e6, "e0.forward"), until=2.0)
    assert rate_by_station(out)["e0.forward"] == pytest.approx(10e6, rel=0.03)


def test_each_station_keeps_its_own_discipline():
    """The router's side runs IOS priority queuing; the hosts' side is a card's FIFO."""
    link, _ = hub(reverse={"discipline": "fifo", "limit_packets": 100}, discipline="priority")
    stations = link.scheduler.stations
    assert isinstance(stations["e0.forward"], Priority) and isinstance(stations["e0.reverse"], Fifo)
    for i in range(10):
        for dscp in (BULK, URGENT):
            pkt = synthetic_packet(1500, dscp, flow=dscp)
            pkt.station = "e0.forward"
            link.enqueue(pkt, 0.0)
    released = [p for _, p in link.advance(1.0)]
    assert [p.dscp for p in released[1:11]] == [URGENT] * 10  # after the one already on the wire


def test_one_medium_has_one_rate():
    with pytest.raises(ConfigError, match="one medium has one rate"):
        hub(reverse={"rate_kbit": 100_000})


def test_drops_are_counted_per_station_as_well_as_per_medium():
    """Overload one station only: its drops are its own, the other station's are 0, and the
    stations' drops add up to the medium's."""
    link, _ = hub(limit_packets=10)
    out = simulate(link, offered(12e6, "e0.forward") + offered(1e6, "e0.reverse", flow=1), until=2.0)
    assert out
    stats = link.stats.to_dict(samples=False)
    stations = stats["stations"]
    fwd = sum(v for c in stations["e0.forward"].values() for k, v in c.items() if not k.startswith("sent_"))
    rev = sum(v for c in stations.get("e0.reverse", {}).values() for k, v in c.items() if not k.startswith("sent_"))
    total = sum(c["dropped_packets"] for c in stats["classes"].values())
    assert fwd > 0 and rev == 0 and fwd + rev == total
    assert stations["e0.reverse"]["default"]["sent_packets"] > 0


def test_a_shaper_on_one_station_holds_that_station_only():
    """The study's shaping: rA's port toward the segment shapes bulk; rB's bulk is not held."""
    from qos.testbed import hubs

    table = {"strategy": "ios-shaping", "shaped_class": "bulk", "shaped_rate_kbit": 1000,
             "shaped_base": "wfq", "shaped_at": "router"}
    plain, where = hubs.split_shaping(table)
    assert plain == {"strategy": "ios-wfq"} and where == "router"
    shaped = hubs.station_settings(table, 10_000, 14)
    config = config_from_dict(hubs.core_hub({"rA": "core-eth1", "rB": "core-eth2"},
                                            hubs.station_settings(plain, 10_000, 14), {"rA": shaped}))
    (link, same) = build_links(config.directions, seed=0)
    assert link is same and set(link.shapers) == {("rA.forward", "bulk")}  # stations: their directions
    assert link.shapers[("rA.forward", "bulk")].burst == 1000 * 1000 * 0.125 / 8  # IOS Bc = CIR x 125 ms
    out = simulate(link, offered(6e6, "rA.forward", dscp=BULK) + offered(3e6, "rB.forward", dscp=BULK, flow=1),
                   until=2.0)
    rates = rate_by_station(out)
    assert rates["rA.forward"] == pytest.approx(1e6, rel=0.1)  # held to 1000 kbit/s
    assert rates["rB.forward"] == pytest.approx(3e6, rel=0.1)  # not shaped
