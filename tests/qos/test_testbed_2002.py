"""The 2002 network profile (qos/testbed/hubs.py): 10 Mbit/s cards on half-duplex hubs.

The configuration tests need nothing; the physical check needs root and namespaces
(skipped elsewhere with the reason): two opposite flows share one 10 Mbit/s medium, one
flow alone gets at most 10."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from pathmaster.records import ConfigError
from qos import netns
from qos.emulator.config import build_links, config_from_dict
from qos.emulator.disciplines import Fifo, FlowWfq, Priority, SharedMedium
from qos.experiment import fidelity
from qos.testbed import Testbed, hubs, load_config
from qos.traffic.iperf import IperfServer, finish_client, start_client

HUB_BPS = 10_000_000


def router_station(strategy: str = "ios-wfq") -> dict:
    return hubs.station_settings({"strategy": strategy}, 10_000, 14)


def test_a_subnet_hub_is_one_medium_with_a_station_per_card_and_the_router():
    config = config_from_dict(hubs.subnet_hub("rA-lan", "rA", {"A1": "10.42.1.1", "A2": "10.42.1.2"},
                                              router_station()))
    links = build_links(config.directions, 0)
    assert len({id(link) for link in links}) == 1
    medium = links[0].scheduler
    assert isinstance(medium, SharedMedium) and links[0].rate_bps == HUB_BPS
    assert isinstance(medium.stations["rA.forward"], FlowWfq)           # the router's IOS fair-queue
    assert all(isinstance(medium.stations[f"A{k}.forward"], Fifo) for k in (1, 2))  # the cards
    matches = {d.name: d.match for d in config.directions}
    assert matches["rA.forward"] == ["-o", "rA-lan"]
    assert matches["A2.forward"] == ["-i", "rA-lan", "-s", "10.42.1.2"]


def test_the_routers_hub_has_a_station_per_router():
    config = config_from_dict(hubs.core_hub({"rA": "core-eth0", "rB": "core-eth1"}, router_station("ios-wred")))
    links = build_links(config.directions, 0)
    assert links[0] is links[1]
    assert [d.match for d in config.directions] == [["-i", "core-eth0"], ["-i", "core-eth1"]]


def test_the_profile_refuses_what_it_cannot_apply():
    config = load_config().with_network("2002")
    assert config.network == "2002" and load_config().network == "lan"
    with pytest.raises(ConfigError, match="lan_rate_kbit: the 2002 network"):
        config._remade(lan_rate_kbit=100_000)
    with pytest.raises(ConfigError, match="unknown IOS strategy"):
        config.with_bottleneck(discipline={"strategy": "ios-red"})
    with pytest.raises(ConfigError, match="network must be one of lan, 2002"):
        config.with_network("1999")


@pytest.fixture(scope="module")
def testbed_2002(netns_ok):
    pytest.importorskip("netfilterqueue")
    config = load_config().with_tag(netns.new_tag("hub")).with_network("2002")
    with Testbed(config.with_bottleneck(discipline={"strategy": "ios-fifo"})) as tb:
        yield tb


@pytest.mark.netns
@pytest.mark.timing
def test_one_flow_alone_gets_at_most_the_medium(testbed_2002):
    tb = testbed_2002
    with IperfServer(tb.host("B1"), 5201):
        alone = finish_client(start_client(tb.master, tb.ip("B1"), port=5201, seconds=3, omit=1), timeout=40)
    assert 5e6 < alone.frame_bps() <= 1.03 * HUB_BPS, f"{alone.frame_bps() / 1e6:.2f} Mbit/s"


@pytest.mark.netns
@pytest.mark.timing
def test_two_opposite_flows_share_the_medium(testbed_2002):
    """Upload A1 -> B1 and reply B1 -> A1 at once (one iperf3 --bidir test, so both start
    together) cross the same three hubs: on a full-duplex network each would get 10 Mbit/s,
    on the hubs they add up to 10."""
    tb = testbed_2002
    with IperfServer(tb.host("B1"), 5202):
        client = tb.master.popen(["iperf3", "-c", tb.ip("B1"), "-p", "5202", "-t", "4", "-O", "1", "--bidir", "-J"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, _ = client.communicate(timeout=60)
        finally:
            netns.stop_process(client, timeout=2)
    data = json.loads(out)
    mss = data["start"]["tcp_mss_default"]
    frames = (mss + 66) / mss  # 20 IP + 32 TCP with timestamps + 14 Ethernet per segment
    rates = [data["end"][k]["bits_per_second"] * frames for k in ("sum_received", "sum_received_bidir_reverse")]
    assert sum(rates) <= 1.05 * HUB_BPS, [f"{r / 1e6:.2f}" for r in rates]
    assert min(rates) > 0.15 * HUB_BPS, [f"{r / 1e6:.2f}" for r in rates]  # both get turns
    stats = tb.bottleneck_stats()
    assert {"rA:hub", "rB:hub", "core:core"} <= stats.keys()


def test_on_the_2002_network_a_strategy_is_for_every_router_in_user_space():
    tb = Testbed(load_config().with_tag("unbuilt").with_network("2002"))  # nothing is built
    with pytest.raises(ValueError, match="not backend 'kernel'"):
        tb.set_strategy({"strategy": "ios-wfq"}, backend="kernel")
    with pytest.raises(ValueError, match="give no subnets"):
        tb.set_strategy({"strategy": "ios-wfq"}, subnets=["A"])
    assert tb.emulators == {}


def test_a_strategy_at_the_hosts_runs_on_their_stations_and_the_routers_run_fifo():
    host = hubs.station_settings({"strategy": "ios-priority"}, 10_000, 14)
    config = config_from_dict(hubs.subnet_hub("rA-lan", "rA", {"A1": "10.42.1.1"}, router_station("ios-fifo"),
                                              host_settings=host))
    medium = build_links(config.directions, 0)[0].scheduler
    assert isinstance(medium.stations["A1.forward"], Priority)
    assert isinstance(medium.stations["rA.forward"], Fifo)
    tb = Testbed(load_config().with_tag("unbuilt"))  # the lan network: nothing is built
    with pytest.raises(ValueError, match='needs network = "2002"'):
        tb.set_strategy({"strategy": "priority"}, at="hosts")
    tb2002 = Testbed(load_config().with_tag("unbuilt").with_network("2002"))
    with pytest.raises(ValueError, match="routers or hosts"):
        tb2002.set_strategy({"strategy": "ios-priority"}, at="switches")
    assert tb2002.emulators == {}


def card_qdiscs(tb) -> str:
    intf = tb.master.interfaces[0].name
    return tb.master.cmd("tc", "qdisc", "show", "dev", intf)


URGENT_BPS = 2e6


def station_window(before: dict, after: dict, station: str) -> dict[str, dict[str, int]]:
    """{class: {"sent": packets, "dropped": packets}} of one station (a node's card on its hub)
    between two `Testbed.emulator_snapshots`: what its own queue sent on and dropped."""
    window: dict[str, dict[str, int]] = {}
    for name, snap in after.items():
        old = (before.get(name) or {}).get("directions", {})
        for dname, d in snap.get("directions", {}).items():
            for sname, by_class in d.get("stations", {}).items():
                if sname.split(".")[0] != station or window:
                    continue  # a medium's directions share its stations' counters: the first is all
                old_classes = ((old.get(dname) or {}).get("stations") or {}).get(sname) or {}
                for cls, c in by_class.items():
                    delta = {k: v - old_classes.get(cls, {}).get(k, 0) for k, v in c.items()}
                    window[cls] = {"sent": delta.get("sent_packets", 0),
                                   "dropped": sum(v for k, v in delta.items() if not k.startswith("sent_"))}
    return window


def two_flows_from_the_master(tb):
    """UDP from the master to B1 for 4 s, urgent (AF41) at 2 Mbit/s and bulk at 10 at once:
    (urgent, bulk, the master's station over the window: `station_window`); urgent reports
    every 0.1 s (`IperfResult.kept_pace`)."""
    before = tb.emulator_snapshots()
    with IperfServer(tb.host("B1"), 5203), IperfServer(tb.host("B1"), 5204):
        urgent = start_client(tb.master, tb.ip("B1"), port=5203, seconds=4, dscp=34, udp_bps=URGENT_BPS,
                              length=1400, interval=0.1)
        bulk = start_client(tb.master, tb.ip("B1"), port=5204, seconds=4, dscp=1, udp_bps=10e6, length=1400)
        urgent, bulk = finish_client(urgent, timeout=60), finish_client(bulk, timeout=60)
    after = tb.emulator_snapshots(newer_than=time.time())
    return urgent, bulk, station_window(before, after, tb.master.name)


@pytest.mark.netns
@pytest.mark.timing
def test_priority_at_the_hosts_schedules_the_masters_own_outgoing_queue(testbed_2002):
    """Two UDP flows leave the master at once, urgent at 2 Mbit/s and bulk at 10: together
    more than the 10 Mbit/s hub. With IOS priority queuing on the hosts' own queues (the
    routers FIFO), the master's station sends urgent first: urgent loses nothing, bulk what
    does not fit (with one FIFO both would lose the same share).

    The losses are the station's own counters, not iperf3's: a receiver that a busy machine
    left behind overflows its socket and reports losses no queue made. A window in which the
    emulator fell behind, or the urgent sender did (it then sends what it owes in one burst,
    longer than the 20-packet high queue), measured the machine, not the queue: it is
    measured again, as the experiment driver runs such a run again (fidelity.judge)."""
    tb = testbed_2002
    assert "htb" in card_qdiscs(tb)  # the router-side network: the card's kernel FIFO
    try:
        tb.set_strategy({"strategy": "ios-priority"}, at="hosts")
        assert tb.strategy_at == "hosts" and "htb" not in card_qdiscs(tb)  # its station is its queue
        (urgent, bulk, station), record = fidelity.measured(tb, lambda: two_flows_from_the_master(tb),
                                                            attempts=fidelity.MAX_ATTEMPTS,
                                                            usable=lambda flows: flows[0].kept_pace(URGENT_BPS))
        late = record["emulator"]["lateness_s"]
        assert record["valid"], (record["invalid_reasons"], late, record["machine"])
        assert urgent.kept_pace(URGENT_BPS), urgent.sent_per_interval()
        seen = (station, urgent.lost_percent, bulk.lost_percent, late)
        assert station["urgent"]["sent"] >= 0.99 * urgent.packets and station["urgent"]["dropped"] == 0, seen
        assert station["bulk"]["dropped"] > 0.10 * (station["bulk"]["sent"] + station["bulk"]["dropped"]), seen
    finally:
        tb.set_strategy({"strategy": "ios-fifo"})
    assert tb.strategy_at == "routers" and "htb" in card_qdiscs(tb)
