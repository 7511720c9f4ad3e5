"""CI's faithful smoke: a tiny pathmaster2002-faithful, end to end through the experiment
driver on the real 2002 network (10 Mbit/s hubs, IOS priority queuing in the user-space emulator,
wget fetches as the competing traffic), then its report: raw files, declared findings, figures.

Tiny so that it fits CI (one strategy, levels 0 and 2 wget processes per target, one run each,
a 2-cell case of 20 kB images with 0.2 s of analysis per image, 2 MB fetches). Skips, saying
why, where namespaces cannot be made (needs root)."""

from __future__ import annotations

import json

import pytest

from qos.experiment.matrix import expand
from qos.experiment.report import write_report
from qos.experiment.runner import run_experiment
from qos.experiment.spec import parse_spec
from qos.experiment.store import Store

pytestmark = [pytest.mark.netns, pytest.mark.timing]

TINY = {
    "experiment": {"name": "faithful-smoke", "repetitions": 1, "seed": 2002, "order": "blocked",
                   "settle_s": 0.5, "request_classes": ["urgent"]},
    "workload": {"cells": 2, "image_bytes": 20_000, "analysis_s": 0.2, "site_nodes": 2, "match_bytes": 5_000,
                 "deadline_s": 60.0},
    "competing": {"kind": "wget", "file_bytes": 2_000_000, "levels": [0, 2], "targets": ["B3", "C3"]},
    "strategies": {"prio": {"discipline": "prio"}},
    "links": [{"name": "hubs", "core_kbit": 10_000, "network": "2002"}],
    "findings": [{"name": "PQ keeps the case fast: 2 streams alike none", "claim": "alike", "margin": 0.5,
                  "a": {"strategy": "prio", "level": 2}, "b": {"strategy": "prio", "level": 0}}],
}


@pytest.fixture(scope="module")
def faithful_run(netns_ok, tmp_path_factory):
    from services.experiment.bench import TestbedBench

    experiment = parse_spec(TINY)
    out = tmp_path_factory.mktemp("faithful")
    with TestbedBench(experiment) as bench:
        run_experiment(experiment, out, bench, progress=False, allow_dirty=True)
    return experiment, out, write_report(out)


def _counts(counters: dict):
    """Every count in a run's (nested) counters, by place and reason; "reset" is a flag."""
    for key, value in counters.items():
        if isinstance(value, dict):
            yield from _counts(value)
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and key != "reset":
            yield value


def test_every_run_has_one_self_describing_raw_file(faithful_run):
    experiment, out, _ = faithful_run
    order = [r.run_id for r in expand(experiment)]
    assert sorted(p.stem for p in (out / "runs").glob("*.json")) == sorted(order)
    for run_id in order:
        rec = json.loads((out / "runs" / f"{run_id}.json").read_text())
        assert rec["ok"], (run_id, rec.get("error"), rec.get("sites"))
        assert rec["run"]["run_id"] == run_id and rec["link"]["network"] == "2002"
        assert rec["strategy"]["discipline"] == "prio" and rec["competing"]["kind"] == "wget"
        assert rec["experiment"]["name"] == "faithful-smoke" and rec["workload"]["analysis_s"] == 0.2
        assert len(rec["competing"]["samples"]) >= 2 and rec["competing"]["samples"][0] == [0.0, 0]
        # the case took at least its analysis and at least its physical bound (within clock noise)
        assert rec["completion_s"] >= 0.2 and rec["completion_s"] >= 0.9 * rec["bound"]["total_s"] > 0
        assert all(v >= 0 for v in _counts(rec["router_counters"]))
    idle, loaded = (json.loads((out / "runs" / f"prio__c{lv}__hubs__urgent__r00.json").read_text())
                    for lv in (0, 2))
    assert idle["competing"]["bytes"] == 0  # nothing ran, nothing counted
    assert loaded["competing"]["achieved_kbit"] > 100  # 4 fetches did load the hubs
    meta = Store(out).metadata()
    assert meta["provenance"]["commit"] and "allow_dirty" in meta["provenance"] and "finished" in meta
    assert meta["experiment"]["links"][0]["network"] == "2002" and meta["order"] == order


def test_the_declared_finding_is_evaluated_honestly(faithful_run):
    _, out, report = faithful_run
    rows = (report / "findings.csv").read_text().splitlines()
    assert len(rows) == 2 and "alike" in rows[1]
    # One run a cell decides nothing. A run whose emulator fell behind on every attempt (a busy
    # machine) is kept apart from the statistics, so n is the fewer valid runs of the two cells.
    valid = [json.loads((out / "runs" / f"prio__c{lv}__hubs__urgent__r00.json").read_text())["fidelity"]["valid"]
             for lv in (0, 2)]
    assert f"not resolvable at n = {min(int(v) for v in valid)}" in rows[1]
    text = (report / "report.md").read_text()
    assert "## Findings: one verdict each" in text and "faithful-smoke" in text


def test_the_report_has_its_tables_and_figures(faithful_run):
    _, _, report = faithful_run
    for name in ("table1.md", "summary.csv", "report.md"):
        assert (report / name).stat().st_size > 0
    table = (report / "table1.md").read_text()
    assert "| 0 |" in table and "| 2 |" in table and "prio" in table
    pngs = {p.stem for p in report.glob("*.png")}
    assert any(s.startswith("fig7") for s in pngs) and any(s.startswith("timeseries") for s in pngs), pngs
