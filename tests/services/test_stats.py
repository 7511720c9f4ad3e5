"""Per-class completion statistics, checked against the standard library and Prometheus' parser."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from qos.classes import DEFAULT_CLASSES
from services.coordinator.stats import CaseLog, ClassStats, CoordinatorMetrics, summarise
from services.metrics import case_outcome

TIMES = [1.2, 0.8, 1.0, 3.5, 0.9, 1.1, 1.05]


def test_summarise_matches_the_standard_library():
    s = summarise(TIMES)
    assert s["cases"] == 7
    assert s["mean_s"] == pytest.approx(statistics.mean(TIMES))
    assert s["std_s"] == pytest.approx(statistics.stdev(TIMES))
    assert s["cv"] == pytest.approx(statistics.stdev(TIMES) / statistics.mean(TIMES))
    assert s["p50_s"] == pytest.approx(statistics.median(TIMES))
    # statistics.quantiles' "inclusive" method is the same linear interpolation as NumPy's default.
    assert s["p95_s"] == pytest.approx(statistics.quantiles(TIMES, n=20, method="inclusive")[-1])


def test_summarise_edge_cases():
    assert summarise([])["cases"] == 0 and summarise([])["mean_s"] == 0.0
    one = summarise([2.0])
    assert one["std_s"] == 0.0 and one["cv"] == 0.0 and one["p95_s"] == 2.0


def test_window_keeps_recent_times_but_counts_all():
    stats = ClassStats(DEFAULT_CLASSES, window=3)
    for t in [10.0, 1.0, 2.0, 3.0]:
        stats.add("urgent", t)
    s = stats.summary("urgent")
    assert s["cases"] == 4 and s["recent_s"] == [1.0, 2.0, 3.0] and s["mean_s"] == pytest.approx(2.0)
    assert s["dscp"] == 34 and stats.summary("bulk")["cases"] == 0


def scrape(registry) -> dict:
    """{(sample name, frozenset of labels): value} as Prometheus' own parser reads the exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(generate_latest(registry).decode())
            for s in family.samples}


def test_prometheus_exposition():
    stats = ClassStats(DEFAULT_CLASSES)
    metrics = CoordinatorMetrics(stats)
    for t in TIMES:
        metrics.case("routine", "ok", t)
    samples = scrape(metrics.registry)
    routine = frozenset({("class", "routine")})
    assert samples[("pathmaster_cases_total", routine | {("outcome", "ok")})] == 7
    assert samples[("pathmaster_case_std_seconds", routine)] == pytest.approx(statistics.stdev(TIMES))
    assert samples[("pathmaster_case_p95_seconds", routine)] == pytest.approx(np.percentile(TIMES, 95))
    assert samples[("pathmaster_case_seconds_count", routine | {("outcome", "ok")})] == 7
    assert samples[("pathmaster_cases_total", frozenset({("class", "urgent"), ("outcome", "ok")}))] == 0
    build = [k for k in samples if k[0] == "pathmaster_build_info"]
    assert len(build) == 1 and ("role", "coordinator") in build[0][1]
    assert any(k[0] == "process_resident_memory_bytes" for k in samples)  # process metrics (Linux)


def test_failed_case_is_counted_but_not_completed():
    """A case no site answered (0 of 1) is a failure: counted under outcome="failed", its
    time in the histogram under that label, and never in the completion statistics."""
    stats = ClassStats(DEFAULT_CLASSES)
    metrics = CoordinatorMetrics(stats)
    metrics.case("urgent", case_outcome(answered=1, failed=0), 2.0)
    metrics.case("urgent", case_outcome(answered=0, failed=1), 0.01)
    metrics.case("urgent", case_outcome(answered=1, failed=1), 4.0)
    summary = stats.summary("urgent")
    assert summary["cases"] == 2 and summary["mean_s"] == pytest.approx(3.0)
    assert stats.outcomes("urgent") == {"ok": 1, "partial": 1, "failed": 1, "cancelled": 0}
    samples = scrape(metrics.registry)
    failed = frozenset({("class", "urgent"), ("outcome", "failed")})
    assert samples[("pathmaster_cases_total", failed)] == 1
    assert samples[("pathmaster_case_seconds_count", failed)] == 1
    assert samples[("pathmaster_case_mean_seconds", frozenset({("class", "urgent")}))] == pytest.approx(3.0)


def test_case_outcome():
    assert case_outcome(3, 0) == "ok" and case_outcome(2, 1) == "partial"
    assert case_outcome(0, 3) == "failed" and case_outcome(3, 0, cancelled=True) == "cancelled"


def test_case_log_appends_json_lines(tmp_path):
    log = CaseLog(tmp_path / "deep" / "cases.jsonl")
    log.write({"case_id": "a", "total_s": 1.5})
    log.write({"case_id": "b", "total_s": 2.5})
    lines = [json.loads(x) for x in (tmp_path / "deep" / "cases.jsonl").read_text().splitlines()]
    assert [x["case_id"] for x in lines] == ["a", "b"] and all("time" in x for x in lines)
    CaseLog(None).write({"case_id": "c"})  # no file configured: dropped, no error
