"""OpenTelemetry traces: one trace per case across client -> coordinator -> sites, written
to a JSON-lines file by the SDK's exporter, with no identifiers or image bytes in the spans."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


from qos.policy import SMALL_REQUEST_COPIES
from services.client import CoordinatorClient
from services.config import TracingTable
from services.tracing import start_tracing


def test_tracing_settings_are_checked():
    assert TracingTable().exporter == "off" and start_tracing(TracingTable(), "test") is None
    with pytest.raises(ValueError, match="needs a file"):
        TracingTable(exporter="jsonl")
    with pytest.raises(ValueError):
        TracingTable(exporter="zipkin")


@pytest.fixture(scope="module")
def servers_tracing(deployment, tmp_path_factory):
    """Tracing on in this process, where the test deployment's coordinator and sites run
    (their interceptors are installed from the start; spans are recorded from now on):
    (the SDK provider, its JSON-lines file). Once per process, as in a server."""
    spans_file = tmp_path_factory.mktemp("spans") / "servers.jsonl"
    provider = start_tracing(TracingTable(exporter="jsonl", file=spans_file), "pathmaster-test")
    assert provider is not None
    yield provider, spans_file
    provider.shutdown()


def read_spans(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_case_is_one_trace_across_client_coordinator_and_sites(deployment, servers_tracing, case):
    provider, spans_file = servers_tracing
    case_id = "ACC-2026-77131"  # an accession number: must not reach any span
    with CoordinatorClient(deployment.coordinator.address) as client:
        events = list(client.submit(case, "routine", deadline_s=60, case_id=case_id, ship="images"))
    assert events[-1].HasField("summary") and events[-1].summary.sites_ok == 3
    assert provider.force_flush(30_000)
    text = spans_file.read_text()
    spans = read_spans(spans_file)
    root = [s for s in spans if s["name"] == "case" and s["resource"]["attributes"]["service.name"] == "pathmaster-test"]
    assert len(root) == 1 and root[0]["parent_id"] is None
    trace_id = root[0]["context"]["trace_id"]
    ours = [s for s in spans if s["context"]["trace_id"] == trace_id]
    names = [s["name"] for s in ours]
    assert names.count("/pathmaster.v1.Coordinator/SubmitCase") == 1
    # the coordinator's call to each site (client span) and each site's handling (server span)
    kinds = [(s["name"], s["kind"]) for s in ours if s["name"] == "/pathmaster.v1.Site/Analyse"]
    assert kinds.count(("/pathmaster.v1.Site/Analyse", "SpanKind.CLIENT")) == 3
    assert kinds.count(("/pathmaster.v1.Site/Analyse", "SpanKind.SERVER")) == 3
    by_id = {s["context"]["span_id"]: s for s in ours}
    for span in ours:  # every span hangs from the case's root, in this trace
        while span["parent_id"] is not None:
            span = by_id[span["parent_id"]]
        assert span is root[0]
    # no patient identifier, no cell name, no image bytes in any span
    assert case_id not in text
    assert not any(cell.cell_id in text for cell in case)
    values = [v for s in ours for v in (s.get("attributes") or {}).values()]
    assert all(len(str(v)) < 200 for v in values)
    assert all(s["resource"]["attributes"]["service.name"] == "pathmaster-test" for s in ours)


def test_query_traces_its_case_into_the_servers_trace(deployment, servers_tracing, case_cells, tmp_path):
    """`pathmaster query --trace-file`: the desktop client's "case" span is the root of the
    servers' spans for that case, including the coordinator's own analysis of the cells."""
    provider, servers_file = servers_tracing
    files = []
    for i, cell in enumerate(case_cells[:2]):
        files.append(tmp_path / f"ACC-555-{i}.png")  # a file name is a patient identifier
        files[-1].write_bytes(cell["image"])
    client_file = tmp_path / "query.jsonl"
    done = subprocess.run([sys.executable, "-m", "pathmaster", "query", "--coordinator",
                           deployment.coordinator.address, "--class", "routine", "--json",
                           "--trace-file", client_file, *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["sites_ok"] == 3
    client_spans = read_spans(client_file)  # written by the time the process ended
    assert [s["name"] for s in client_spans] == ["case"]
    root = client_spans[0]
    assert root["resource"]["attributes"]["service.name"] == "pathmaster-query"
    assert root["attributes"] == {"pathmaster.request_class": "routine", "pathmaster.cells": 2,
                                  "rpc.grpc.status_code": 0}
    assert provider.force_flush(30_000)
    ours = [s for s in read_spans(servers_file) if s["context"]["trace_id"] == root["context"]["trace_id"]]
    submit = [s for s in ours if s["name"] == "/pathmaster.v1.Coordinator/SubmitCase"]
    assert len(submit) == 1 and submit[0]["parent_id"] == root["context"]["span_id"]
    assert {s["mode"] for s in summary_sites(done.stdout)} == {"features"}  # analysed once, here:
    analysis = [s for s in ours if s["name"] == "analyse cells"]
    assert len(analysis) == 1 and analysis[0]["parent_id"] == submit[0]["context"]["span_id"]
    assert analysis[0]["attributes"] == {"pathmaster.cells": 2}
    # a features request is small: up to SMALL_REQUEST_COPIES copies to each site, spaced in
    # time (a site that answers before the next is due gets no more), each a client span at
    # the coordinator; every server span at a site is the child of one of them
    calls = [s for s in ours if s["name"] == "/pathmaster.v1.Site/Analyse"]
    clients = {s["context"]["span_id"] for s in calls if s["kind"] == "SpanKind.CLIENT"}
    servers = [s for s in calls if s["kind"] == "SpanKind.SERVER"]
    assert 3 <= len(clients) <= 3 * SMALL_REQUEST_COPIES
    assert 3 <= len(servers) <= len(clients)
    assert all(s["parent_id"] in clients for s in servers)
    text = client_file.read_text() + servers_file.read_text()
    assert "ACC-555" not in text and summary["case_id"] not in text


def summary_sites(stdout: str) -> list[dict]:
    return [e for e in map(json.loads, stdout.splitlines()) if e["type"] == "site"]


def test_query_refuses_two_trace_destinations(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pathmaster", "query", "--coordinator", "127.0.0.1:1",
                           "--trace-file", tmp_path / "a.jsonl", "--trace-endpoint", "http://127.0.0.1:4317",
                           tmp_path / "missing.png"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
