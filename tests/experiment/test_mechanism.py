"""Drops by place (the master's card, each host, each router port) and the mechanism claim on them."""

from __future__ import annotations

from qos.experiment import mechanism
from qos.experiment.report import Cell
from qos.testbed.testbed import _emulated_counters


def _directions(router_drops: int, card_drops: int) -> dict:
    stations = {"rA.forward": {"urgent": {"sent_packets": 10, "sent_bytes": 15000, "tail": router_drops}},
                "A1.forward": {"urgent": {"sent_packets": 20, "sent_bytes": 30000, "tail": card_drops}}}
    classes = {"urgent": {"sent_bytes": 45000, "sent_packets": 30, "dropped_packets": router_drops + card_drops,
                          "enqueued_bytes": 45000, "enqueued_packets": 30}}
    return {name: {"medium": "hub", "classes": classes, "stations": stations} for name in ("rA", "A1")}


def test_the_testbed_reports_each_station_of_a_medium_apart():
    out = _emulated_counters("rA", _directions(3, 7))
    assert out["rA:hub"]["urgent"]["drops"] == 10  # the medium's total, once
    assert out["rA:hub/rA"]["urgent"]["drops"] == 3 and out["rA:hub/A1"]["urgent"]["drops"] == 7
    assert out["rA:hub/A1"]["urgent"]["drops_by_reason"] == {"tail": 7}


def _record(router: int, card: int) -> dict:
    counters = _emulated_counters("rA", _directions(router, card))
    counters["A1:A1-eth0"] = {"urgent": {"drops": 1}}
    return {"router_counters": counters}


def test_drops_by_place_counts_a_medium_once_and_tells_router_ports_from_cards():
    places = mechanism.drops_by_place(_record(3, 7), "urgent")
    assert places == {"router port": 3, "host card": 8, "medium (not split)": None}
    old = {"router_counters": {"rA:hub": {"urgent": {"drops": 10}}}}
    assert mechanism.drops_by_place(old, "urgent")["medium (not split)"] == 10


def test_the_mechanism_claim_can_come_out_either_way():
    def cell(name, router_drops):
        c = Cell(name, 16.0, "hubs", "urgent")
        c.records = [_record(d, 5) for d in router_drops]
        c.times = [1.0] * len(router_drops)
        return c

    cells = {c.key: c for c in (cell("fifo", [40, 50, 45, 60, 55, 52]), cell("prio", [0, 1, 0, 2, 0, 1]),
                                cell("wred", [45, 58, 41, 62, 50, 49]))}
    rows = {r["strategy"]: r for r in mechanism.mechanism_tests(cells, 16.0)}
    assert rows["prio"]["fewer_at_routers"] and not rows["wred"]["fewer_at_routers"]
    assert mechanism.split_counters(cells)
