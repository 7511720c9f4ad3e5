"""An experiment file's [classes] table is the run's one source of request classes: the spec
checks request_classes against it and records it; in transfer mode the master agent and the
transfer sites mark with its DSCPs (here on loopback: no namespaces needed). Each check fails
if the workload used qos.classes.DEFAULT_CLASSES (urgent is CS5 here, not AF41)."""

from __future__ import annotations

import json
import subprocess
import sys

import grpc
import pytest

import qos.channels
from pathmaster.records import InvalidInput
from qos.classes import DEFAULT_CLASSES
from qos.experiment.spec import parse_spec
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

CLASSES = {
    "urgent": {"dscp": 40, "priority": 0, "description": "frozen section (CS5)"},
    "second-opinion": {"dscp": 26, "priority": 1, "description": "second opinion (AF31)"},
}

ARP_FRAME_BYTES = 42  # Ethernet header 14 + ARP for IPv4 28, as a queue counts it (no padding)


def spec(request_classes=("urgent", "second-opinion"), classes=CLASSES) -> dict:
    data = {"experiment": {"name": "remapped", "request_classes": list(request_classes)},
            "strategies": {"fifo": {"discipline": "fifo"}},
            "links": [{"name": "10M", "core_kbit": 10000}]}
    if classes is not None:
        data["classes"] = classes
    return data


def test_the_experiment_file_carries_the_runs_class_table():
    experiment = parse_spec(spec())
    assert experiment.classes["urgent"].dscp == 40 and experiment.classes.names() == ["urgent", "second-opinion"]
    assert experiment.to_dict()["classes"] == CLASSES  # recorded in every run's metadata
    assert parse_spec(spec(["urgent"], classes=None)).classes == DEFAULT_CLASSES
    with pytest.raises(InvalidInput, match="'bulk'; known: urgent, second-opinion"):
        parse_spec(spec(["bulk"]))
    with pytest.raises(InvalidInput, match=r"\[classes\.urgent\] dscp: DSCP 99 is outside 0-63"):
        parse_spec(spec(classes={"urgent": {"dscp": 99}}))
    assert parse_spec(spec()).fingerprint() != parse_spec(spec(classes={**CLASSES, "urgent": {"dscp": 34}})).fingerprint()


def test_transfer_master_and_sites_mark_with_the_runs_table(monkeypatch):
    from services.experiment.workload import Master, make_cells, serve_transfer_site

    opened = []
    real = qos.channels.open_channel
    monkeypatch.setattr(qos.channels, "open_channel",
                        lambda address, dscp=None, *a, **k: opened.append((address, dscp)) or real(address, dscp, *a, **k))
    classes = parse_spec(spec()).classes
    site = serve_transfer_site("A1", "127.0.0.1", 0, 100, classes)
    master = Master({"A1": f"127.0.0.1:{site.port}"}, classes)
    try:
        assert site.class_dscp == {"urgent": 40, "second-opinion": 26}  # replies marked by the table
        master.discover()
        reply = master.case("urgent", make_cells(1, 64, False, False, seed=1), k=1, deadline_s=20)
        assert reply["ok"] and reply["dscp"] == 40
        urgent_port = f"127.0.0.1:{site.class_ports['urgent']}"
        assert reply["sites"][0]["address"] == urgent_port
        assert {dscp for address, dscp in opened if address == urgent_port} == {40}
    finally:
        master.close()
        site.stop(0)


def test_the_agent_and_sites_take_the_table_the_bench_gives_them():
    """The processes the bench starts (bench.py passes classes_argv(experiment.classes))."""
    from services.experiment.workload import classes_argv

    classes = parse_spec(spec()).classes
    module = [sys.executable, "-m", "services.experiment.workload"]
    site = subprocess.Popen([*module, "site", "--name", "A1", "--host", "127.0.0.1", "--port", "0",
                             "--match-bytes", "100", *classes_argv(classes)],
                            stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        ready = json.loads(site.stdout.readline())
        assert set(ready["class_ports"]) == {"urgent", "second-opinion"}
        port = ready["port"]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            info = pb_grpc.SiteStub(channel).Info(pb.SiteInfoRequest(), timeout=20, wait_for_ready=True)
        assert dict(info.class_dscp) == {"urgent": 40, "second-opinion": 26}
        agent = subprocess.Popen([*module, "agent", "--site", f"A1=127.0.0.1:{port}", *classes_argv(classes)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert json.loads(agent.stdout.readline()) == {"ready": True}
        agent.stdin.write(json.dumps({"op": "case", "class": "urgent", "cells": 1, "image_bytes": 64,
                                      "background": False, "mask": False, "k": 1, "seed": 1,
                                      "deadline_s": 20}) + "\n")
        agent.stdin.flush()
        reply = json.loads(agent.stdout.readline())
        assert reply["ok"] and reply["dscp"] == 40
        assert reply["sites"][0]["address"] == f"127.0.0.1:{ready['class_ports']['urgent']}"
    finally:
        for proc in (agent, site):
            if proc is not None:
                if proc.stdin:
                    proc.stdin.close()
                proc.terminate()
                proc.wait(timeout=20)


@pytest.mark.netns
@pytest.mark.timing
def test_in_the_testbed_the_runs_table_marks_the_case_and_sorts_it_at_the_routers(netns_ok):
    """The bench gives the table to the agent, the sites and the routers: the urgent case
    (CS5 here) lands in the routers' urgent queue. Were the agent marking with the default
    table (AF41), the routers, which know only this run's table, would not queue it as urgent."""
    from services.experiment.bench import TestbedBench

    data = spec(["urgent"])
    data["workload"] = {"cells": 2, "image_bytes": 5000, "k": 2, "match_bytes": 1000}
    data["strategies"] = {"prio": {"discipline": "prio"}}
    experiment = parse_spec(data)
    with TestbedBench(experiment) as bench:
        bench.configure(experiment.links[0], experiment.strategy("prio"))
        before = bench.counters()
        record = bench.run_case("urgent", seed=1, case_id="remapped-1")
        after = bench.counters()
    assert record["ok"] and record["dscp"] == 40, record
    sent = {cls: {n: sum(after[q][cls][n] - before[q][cls][n] for q in after) for n in ("packets", "bytes")}
            for cls in experiment.classes.names()}
    # Every packet of the case, both ways, in the urgent queues; none in the queue that takes
    # what the table does not know (AF41 would go there). That queue also takes what is not
    # IPv4: an ARP exchange, when a router's neighbour entry has to be learnt again during the
    # case (seen in a loaded run; every queue gets one after `ip neigh flush`), is 42-byte
    # frames; an IP packet is at least 54 bytes.
    assert sent["urgent"]["packets"] > record["bytes_up"] / 1500, sent
    assert sent["second-opinion"]["bytes"] == ARP_FRAME_BYTES * sent["second-opinion"]["packets"], sent
