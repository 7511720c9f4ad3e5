"""Drops by place (the master's card, each host, each router port) and the mechanism claim on them."""

from __future__ import annotations

from qos.experiment import mechanism
from qos.experiment.cells import Cell
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


def _cells(fifo: list[tuple[int, int]], prio: list[tuple[int, int]], level: float = 16.0) -> dict:
    """FIFO and PQ cells whose runs lost (router port, hub station) urgent packets as given."""
    out = {}
    for name, runs in (("fifo", fifo), ("prio", prio)):
        c = Cell(name, level, "hubs", "urgent")
        c.records = [_record(router, card) for router, card in runs]
        c.times = [1.0] * len(runs)
        out[c.key] = c
    return out


def test_the_hub_claim_is_reproduced_when_fifo_loses_at_the_stations_and_pq_only_clears_the_ports():
    claim = mechanism.hub_claim(_cells(fifo=[(3, 40), (5, 52), (2, 47), (4, 61), (6, 38), (1, 55)],
                                       prio=[(0, 35), (0, 48), (1, 44), (0, 51), (0, 39), (0, 42)]), 16.0)
    assert claim["where"] == "hub stations" and 0.5 < claim["hub_share_ci"][0] <= claim["hub_share"]
    assert claim["pq_fewer_at_ports"] and claim["pq_stations_remain"] == "yes"
    assert claim["verdict"] == "reproduced" and claim["n_fifo"] == claim["n_pq"] == 6


def test_the_hub_claim_is_not_reproduced_when_fifo_loses_at_the_router_ports():
    claim = mechanism.hub_claim(_cells(fifo=[(40, 2), (52, 0), (47, 3), (61, 1), (38, 0), (55, 2)],
                                       prio=[(0, 0), (1, 1), (0, 0), (0, 2), (0, 0), (2, 0)]), 16.0)
    assert claim["where"] == "router ports" and claim["hub_share_ci"][1] < 0.5
    assert claim["verdict"] == "not reproduced"


def test_the_hub_claim_needs_enough_runs_and_the_per_station_counters():
    few = mechanism.hub_claim(_cells(fifo=[(40, 2), (0, 45)], prio=[(0, 3), (0, 0)]), 16.0)
    assert few["where"] == "not resolvable" and few["verdict"] == "not resolvable at this n"
    smoke = mechanism.hub_claim(_cells(fifo=[(23, 0), (44, 9)], prio=[(0, 6)]), 16.0)  # the smoke's FIFO@4
    assert smoke["hub_share_ci"][1] < 0.5 and smoke["verdict"] == "not resolvable at this n"
    old = _cells(fifo=[(1, 1)] * 3, prio=[(1, 1)] * 3)
    for c in old.values():
        c.records = [{"router_counters": {"rA:hub": {"urgent": {"drops": 10}}}}] * 3
    assert mechanism.hub_claim(old, 16.0)["verdict"].startswith("not testable: counters missing")
    assert mechanism.hub_claim(old, 8.0)["verdict"].startswith("not testable: no fifo")


def test_the_hosts_unclassed_fifo_drops_are_counted_apart():
    cells = _cells(fifo=[(3, 40)] * 3, prio=[(0, 40)] * 3)
    for c in cells.values():
        for r in c.records:
            r["router_counters"]["A2:A2-eth0"] = {"all": {"drops": 4}}
    claim = mechanism.hub_claim(cells, 16.0)
    assert claim["unclassed"] == 6 * 4 and claim["fifo_hub_median"] == 41  # A1's classed card FIFO: 1


def test_the_claim_takes_fifo_and_pq_as_the_experiment_names_them():
    meta = {"experiment": {"strategies": [
        {"name": "fifo", "discipline": "fifo"}, {"name": "host-pq", "discipline": "prio", "at": "hosts"},
        {"name": "adaptive-prio", "discipline": "prio", "adaptive": {"analyse": True}},
        {"name": "router-pq", "discipline": "prio", "at": "routers"}]}}
    assert mechanism.router_strategy(meta, "prio") == "router-pq"
    assert mechanism.router_strategy(meta, "fifo") == "fifo" and mechanism.router_strategy(meta, "wred") is None
