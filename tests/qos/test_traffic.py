"""Competing traffic: the Pareto model against scipy, and the generators through the testbed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from qos import netns
from qos.classes import DEFAULT_CLASSES
from qos.testbed import Testbed, load_config
from qos.traffic import pareto
from qos.traffic.iperf import client_argv, parse
from qos.traffic.competing import (BulkDownloads, ConstantRateUDP, FileFetches, ParetoBursts, from_spec,
                                   k_for_mean)

RATE = 10_000_000


def test_slot_rates_follow_scipys_pareto_below_the_cap():
    k, cap = pareto.scaled_to_link(RATE)
    assert k == pytest.approx(RATE * 40 / 155) and cap == RATE
    rates = pareto.slot_rates(20_000, k, cap_bps=np.inf, seed=7)
    assert rates.dtype == np.float64 and rates.min() >= k
    ks = stats.kstest(rates, stats.pareto(b=pareto.SEED_003_ALPHA, scale=k).cdf)
    assert ks.pvalue > 0.001
    capped = pareto.slot_rates(200_000, k, cap_bps=cap, seed=7)
    assert capped.max() == cap
    assert capped.mean() == pytest.approx(pareto.capped_mean(k, cap_bps=cap), rel=0.02)
    assert np.array_equal(pareto.slot_rates(10, k, cap_bps=cap, seed=3), pareto.slot_rates(10, k, cap_bps=cap, seed=3))


def udp_client_json(sent: list[tuple[float, int]]) -> str:
    """iperf3 -J output of a UDP client whose report intervals sent `sent` [(seconds, bytes)]."""
    return json.dumps({"start": {"test_start": {"protocol": "UDP"}},
                       "intervals": [{"sum": {"seconds": s, "bytes": b}} for s, b in sent],
                       "end": {"sum": {"seconds": sum(s for s, _ in sent), "bytes": sum(b for _, b in sent),
                                       "lost_percent": 0.0, "packets": 1}}})


def test_a_udp_client_kept_its_pace_unless_it_stalled_and_caught_up_in_a_burst():
    argv = client_argv("10.0.0.2", interval=0.1)
    assert argv[argv.index("-i") + 1] == "0.1" and "-i" not in client_argv("10.0.0.2")
    paced = parse(udp_client_json([(0.1, 25_000)] * 39 + [(0.01, 1_400)]))  # a last sliver of a report
    assert paced.sent_per_interval()[0] == (0.1, 25_000) and paced.kept_pace(2e6)
    stalled = parse(udp_client_json([(0.1, 25_000), (0.1, 0), (0.1, 50_000), (0.1, 25_000)]))
    assert not stalled.kept_pace(2e6) and stalled.kept_pace(2e6, within=1.0)
    assert not paced.kept_pace(5e6)  # 2 Mbit/s is not 5


def test_k_for_mean_inverts_the_capped_mean():
    k = k_for_mean(2e6, cap_bps=RATE)
    assert pareto.capped_mean(k, cap_bps=RATE) == pytest.approx(2e6, rel=1e-6)
    with pytest.raises(ValueError, match="below the cap"):
        k_for_mean(20e6, cap_bps=RATE)


@pytest.fixture(scope="module")
def testbed(netns_ok):
    with Testbed(load_config().with_tag(netns.new_tag("tr"))) as tb:
        yield tb


def run_for(seconds: float) -> None:
    """Let the traffic run for the measured period (a duration, not a synchronisation)."""
    time.sleep(seconds)


@pytest.mark.netns
@pytest.mark.timing
def test_bulk_downloads_fill_the_link_marked_as_bulk(testbed):
    testbed.set_strategy({"strategy": "priority"})
    with BulkDownloads(testbed, streams=2) as bulk:
        run_for(3)
    result = bulk.result
    assert len(result.flows) == 2 and result.dscp == DEFAULT_CLASSES["bulk"].dscp
    # Four long transfers share rA's 10 Mbit/s uplink: together they fill most of it.
    assert 0.80 * RATE <= result.bps * 1514 / 1448 <= 1.03 * RATE, f"{result.bps / 1e6:.2f} Mbit/s"
    # Each flow keeps iperf3's own JSON report, and the totals are what iperf3 said was received.
    assert set(result.iperf3) == {f["flow"] for f in result.flows}
    for flow in result.flows:
        client = result.iperf3[flow["flow"]]["client"]
        assert client["start"]["test_start"]["reverse"] == 1 and client["start"]["test_start"]["num_streams"] == 2
        assert client["end"]["sum_received"]["bytes"] == flow["bytes"] > 0
        assert client["intervals"]
    assert sum(r["client"]["end"]["sum_received"]["bytes"] for r in result.iperf3.values()) == result.bytes
    assert "iperf3" not in result.to_dict()  # the summary stays short; the raw JSON travels beside it
    counted = testbed.bottleneck_stats()["rA:rA-eth4"]
    assert counted["bulk"]["bytes"] >= result.bytes
    assert counted["routine"]["bytes"] < result.bytes / 100
    # Stopping removed the marking rules and the iperf3 servers.
    assert "DSCP" not in testbed.master.cmd("iptables", "-t", "mangle", "-S", "OUTPUT")
    assert "iperf3" not in [Path(f"/proc/{pid}/comm").read_text().strip()
                            for pid in netns.pids(testbed.master.namespace)]


@pytest.mark.netns
@pytest.mark.timing
def test_wget_fetches_loop_fill_the_link_and_clean_up(testbed):
    testbed.set_strategy({"strategy": "priority"})
    # 300 kB files: each process finishes several fetches in the period, so the loop is seen.
    traffic = from_spec(testbed, {"kind": "wget", "processes": 2, "file_bytes": 300_000})
    assert isinstance(traffic, FileFetches)
    with traffic:
        run_for(3)
    result = traffic.result
    assert result.kind == "wget" and result.dscp == DEFAULT_CLASSES["bulk"].dscp
    assert {f["flow"] for f in result.flows} == {"A1->B3", "A1->C3"}
    # Two targets' fetches share rA's 10 Mbit/s uplink; new connections (slow start) leave gaps.
    assert 0.5 * RATE <= result.bps <= 1.03 * RATE, f"{result.bps / 1e6:.2f} Mbit/s"
    for flow in result.flows:
        assert flow["fetches_completed_at_least"] >= 2  # fetched again and again
    counted = testbed.bottleneck_stats()["rA:rA-eth4"]
    assert counted["bulk"]["bytes"] >= 0.9 * result.bytes  # marked at the master's edge as bulk
    # Stopping removed the marking rule, the counters, the server and every wget.
    assert "DSCP" not in testbed.master.cmd("iptables", "-t", "mangle", "-S", "OUTPUT")
    assert "pm-count" not in testbed.host("B3").cmd("iptables", "-S", "INPUT")
    for node in (testbed.master, testbed.host("B3"), testbed.host("C3")):
        assert not {"wget", "python", "python3", "sh"} & {Path(f"/proc/{pid}/comm").read_text().strip()
                                                        for pid in netns.pids(node.namespace)}


@pytest.mark.netns
@pytest.mark.timing
def test_wget_fetches_refuse_bad_counts(testbed):
    with pytest.raises(ValueError, match="processes must be a whole number"):
        FileFetches(testbed, processes=1.5)
    with pytest.raises(ValueError, match="file_bytes must be >= 1"):
        FileFetches(testbed, processes=1, file_bytes=0)


@pytest.mark.netns
@pytest.mark.timing
def test_constant_rate_udp_achieves_its_rate(testbed):
    # What the generator sends and what is counted as arrived, on a path with room for the
    # catch-up burst of a sender that other work on the machine held up (iperf3 keeps its
    # average rate): 0.12 s of 4 Mbit/s overflows the routers' 40-packet hold queue. Over 1 %
    # was lost beside the rest of make test, never alone. 1000 packets hold about 3 s of it.
    testbed.set_strategy({"strategy": "fifo", "limit_packets": 1000})
    # 6 s: a sender held up for a few tenths of a second costs a 3 s run its 5 %; 3.7 of 4 Mbit/s was seen.
    with ConstantRateUDP(testbed, rate_bps=4e6) as udp:
        run_for(6)
    assert udp.result.bps == pytest.approx(4e6, rel=0.05)
    assert all(f["lost_percent"] < 1.0 for f in udp.result.flows), udp.result.flows
    for flow in udp.result.flows:  # the sender's iperf3 JSON is kept; it is what "sent_bytes" came from
        client = udp.result.iperf3[flow["flow"]]["client"]
        assert client["start"]["test_start"]["protocol"] == "UDP"
        assert client["end"]["sum"]["bytes"] == flow["sent_bytes"] > 0


@pytest.mark.netns
@pytest.mark.timing
def test_pareto_bursts_deliver_their_slot_rates(testbed):
    testbed.set_strategy({"strategy": "fifo"})
    traffic = from_spec(testbed, {"kind": "pareto", "mean_bps": 1.5e6, "targets": ["B3"], "seed": 5,
                                  "slot_s": 1.0})
    with traffic:
        run_for(2.3)
    (flow,) = traffic.result.flows
    # Each slot sent at its own planned rate for the time it was paced: the sender's record,
    # which leaves out what it skipped while a busy machine had it descheduled (it resumes
    # the pace rather than burst), so the rates hold however long that was.
    rates = flow["slot_rates_bps"]
    assert len(rates) >= 2 and rates[0] != rates[1]  # more than one slot, at different rates
    frame_bits = pareto.FRAME_BYTES * 8
    for rate, packets, paced in zip(rates, flow["slot_packets"], flow["slot_paced_s"]):
        if paced >= 0.2:
            assert packets * frame_bits == pytest.approx(rate * paced, rel=0.02, abs=2 * frame_bits), \
                f"{packets} packets in {paced:.3f} s paced, planned {rate / 1e6:.2f} Mbit/s: {flow}"
    assert sum(flow["slot_paced_s"][:2]) >= 0.5  # the check above had slots to check
    # And what it sent arrived (1.7 Mbit/s on average, well under the 10 Mbit/s link).
    assert flow["bytes"] >= 0.98 * flow["sent_bytes"] > 0


def test_bad_traffic_specs_are_named():
    with pytest.raises(ValueError, match="kind 'ftp' is not one of downloads, wget, udp, pareto"):
        from_spec(None, {"kind": "ftp"})
