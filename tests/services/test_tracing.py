"""OpenTelemetry traces: one trace per case across client -> coordinator -> sites, written
to a JSON-lines file by the SDK's exporter, with no identifiers or image bytes in the spans."""

from __future__ import annotations

import json

import pytest

from services.client import CoordinatorClient
from services.config import TracingTable
from services.tracing import start_tracing


def test_tracing_settings_are_checked():
    assert TracingTable().exporter == "off" and start_tracing(TracingTable(), "test") is None
    with pytest.raises(ValueError, match="needs a file"):
        TracingTable(exporter="jsonl")
    with pytest.raises(ValueError):
        TracingTable(exporter="zipkin")


def test_a_case_is_one_trace_across_client_coordinator_and_sites(deployment, case, tmp_path):
    spans_file = tmp_path / "spans.jsonl"
    # The deployment's servers have had their interceptors since they started; turning
    # tracing on in this process (where the test's client, coordinator and sites all run)
    # makes their spans recorded from now on.
    provider = start_tracing(TracingTable(exporter="jsonl", file=spans_file), "pathmaster-test")
    assert provider is not None
    case_id = "ACC-2026-77131"  # an accession number: must not reach any span
    try:
        with CoordinatorClient(deployment.coordinator.address) as client:
            events = list(client.submit(case, "routine", deadline_s=60, case_id=case_id, ship="images"))
        assert events[-1].HasField("summary") and events[-1].summary.sites_ok == 3
        assert provider.force_flush(30_000)
    finally:
        provider.shutdown()
    text = spans_file.read_text()
    spans = [json.loads(line) for line in text.splitlines()]
    root = [s for s in spans if s["name"] == "case"]
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
