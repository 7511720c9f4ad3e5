"""Per-class completion statistics, checked against the standard library and Prometheus' parser."""

from __future__ import annotations

import json
import statistics

import numpy as np
import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from qos.classes import DEFAULT_CLASSES
from services.coordinator.stats import CaseLog, ClassStats, metrics_registry, summarise

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


def test_prometheus_exposition():
    stats = ClassStats(DEFAULT_CLASSES)
    registry, histogram = metrics_registry(stats)
    for t in TIMES:
        stats.add("routine", t)
        histogram.labels("routine").observe(t)
    samples = {(s.name, s.labels.get("request_class")): s.value
               for family in text_string_to_metric_families(generate_latest(registry).decode())
               for s in family.samples}
    assert samples[("pathmaster_cases_total", "routine")] == 7
    assert samples[("pathmaster_case_std_seconds", "routine")] == pytest.approx(statistics.stdev(TIMES))
    assert samples[("pathmaster_case_p95_seconds", "routine")] == pytest.approx(np.percentile(TIMES, 95))
    assert samples[("pathmaster_case_seconds_count", "routine")] == 7
    assert samples[("pathmaster_cases_total", "urgent")] == 0


def test_case_log_appends_json_lines(tmp_path):
    log = CaseLog(tmp_path / "deep" / "cases.jsonl")
    log.write({"case_id": "a", "total_s": 1.5})
    log.write({"case_id": "b", "total_s": 2.5})
    lines = [json.loads(x) for x in (tmp_path / "deep" / "cases.jsonl").read_text().splitlines()]
    assert [x["case_id"] for x in lines] == ["a", "b"] and all("time" in x for x in lines)
    CaseLog(None).write({"case_id": "c"})  # no file configured: dropped, no error
