"""`network = "2002"` in experiment files: what it applies, what it refuses, and its bound
(on hubs upload and reply bytes add up; the master's local site moves nothing over a wire)."""

import pytest

from pathmaster.records import InvalidInput
from qos.experiment.bound import SiteTransfer, lower_bound
from qos.experiment.spec import parse_spec

STUDY = {
    "experiment": {"name": "t"},
    "strategies": {"fifo": {"discipline": "fifo"}, "pq": {"discipline": "prio"}, "wfq": {"discipline": "wfq"},
                   "cbwfq": {"discipline": "cbwfq"}, "wred": {"discipline": "wred"},
                   "shape-200": {"discipline": "wfq", "shape_kbit": 200}},
    "links": [{"name": "hubs", "core_kbit": 10_000, "network": "2002"}],
}


def test_each_strategy_is_the_ios_one_on_the_2002_network():
    exp = parse_spec(STUDY)
    tables = {s.name: s.ios_table() for s in exp.strategies}
    assert tables == {"fifo": {"strategy": "ios-fifo"}, "pq": {"strategy": "ios-priority"},
                      "wfq": {"strategy": "ios-wfq"}, "cbwfq": {"strategy": "ios-cbwfq"},
                      "wred": {"strategy": "ios-wred"},
                      "shape-200": {"strategy": "ios-shaping", "shaped_class": "bulk", "shaped_rate_kbit": 200,
                                    "shaped_base": "wfq", "shaped_at": "router"}}
    link = exp.links[0]
    assert link.shared_medium and link.access_rate_kbit == 10_000


@pytest.mark.parametrize("link, words", [
    ({"access_kbit": 10_000}, ["access_kbit", "does not apply it"]),
    ({"queue_packets": 100}, ["queue_packets", "IOS"]),
    ({"delay_ms": 10}, ["delay_ms", "no propagation delay"]),
    ({"network": "1999"}, ["network", "lan, 2002"]),
])
def test_what_the_2002_network_cannot_apply_is_refused(link, words):
    data = {**STUDY, "links": [{**STUDY["links"][0], **link}]}
    with pytest.raises(InvalidInput) as err:
        parse_spec(data, source="x.toml")
    for word in words:
        assert word in str(err.value)


def test_access_kbit_is_refused_on_lan_too_and_cbwfq_needs_2002():
    with pytest.raises(InvalidInput, match="access_kbit"):
        parse_spec({**STUDY, "links": [{"name": "l", "core_kbit": 10_000, "access_kbit": 100_000}]})
    with pytest.raises(InvalidInput, match="cbwfq runs on network"):
        parse_spec({**STUDY, "links": [{"name": "l", "core_kbit": 10_000}]})
    with pytest.raises(InvalidInput, match="one network per experiment"):
        parse_spec({**STUDY, "strategies": {"f": {"discipline": "fifo"}},
                    "links": [{"name": "l", "core_kbit": 10_000}, STUDY["links"][0]]})


def test_on_hubs_upload_and_reply_bytes_add_up():
    # 1.25 MB up and 0.25 MB down per remote site: 1 s + 0.2 s at 10 Mbit/s; no work
    remote = [SiteTransfer(n, 1_250_000, 250_000, 0.0, True) for n in ("B1", "C1")]
    local = SiteTransfer("A1", 1_250_000, 250_000, 0.0, False)
    hubs = lower_bound(remote + [local], core_kbit=10_000, access_kbit=10_000, shared_medium=True)
    assert hubs.core_s == pytest.approx(2 * 1.2)           # both sites' bytes, both ways, one medium
    assert hubs.per_site_s == pytest.approx(1.0 + 0.2)
    assert hubs.total_s == pytest.approx(2.4) and hubs.limited_by == "core link"
    # Full duplex (lan's unshaped veths, 10 Mbit/s core): the replies overlap the uploads.
    duplex = lower_bound(remote + [local], core_kbit=10_000, access_kbit=float("inf"))
    assert duplex.total_s == pytest.approx(2.0 + 0.2) and duplex.total_s < hubs.total_s


def test_on_hubs_work_after_the_last_upload_still_counts():
    remote = [SiteTransfer(n, 1_250_000, 250_000, 5.0, True) for n in ("B1", "C1")]
    hubs = lower_bound(remote, core_kbit=10_000, access_kbit=10_000, shared_medium=True)
    assert hubs.core_s == pytest.approx(2.0 + 5.0 + 0.2)


def test_on_hubs_the_masters_own_site_moves_nothing():
    local = SiteTransfer("A1", 10_000_000, 10_000_000, 0.3, False)
    assert lower_bound([local], 10_000, 10_000, shared_medium=True).total_s == pytest.approx(0.3)


def test_the_bench_runs_the_ios_strategies_on_the_hubs():
    from services.experiment.bench import discipline_table

    exp = parse_spec(STUDY)
    assert discipline_table(exp.strategy("wfq"), exp.links[0]) == ({"strategy": "ios-wfq"}, "emulator")
    assert discipline_table(exp.strategy("shape-200"), exp.links[0])[0]["strategy"] == "ios-shaping"


def test_where_qos_lives_strategies_codel_and_placement_at_the_hosts():
    exp = parse_spec({**STUDY, "strategies": {
        "host-pq": {"discipline": "prio", "at": "hosts"},
        "codel": {"discipline": "codel"},
        "diffserv-codel": {"discipline": "class-codel"}}})
    by_name = {s.name: s for s in exp.strategies}
    assert by_name["host-pq"].at == "hosts" and by_name["codel"].at == "routers"
    assert by_name["host-pq"].ios_table() == {"strategy": "ios-priority"}  # the same scheduling, elsewhere
    assert by_name["codel"].ios_table() == {"strategy": "codel"}
    assert by_name["diffserv-codel"].ios_table() == {"strategy": "class_codel"}
    with pytest.raises(InvalidInput, match='at = "hosts" needs network = "2002"'):
        parse_spec({**STUDY, "strategies": {"h": {"discipline": "prio", "at": "hosts"}},
                    "links": [{"name": "l", "core_kbit": 10_000}]})
    with pytest.raises(InvalidInput, match="routers"):
        parse_spec({**STUDY, "strategies": {"h": {"discipline": "prio", "at": "switch"}}})
