"""The `smoke` experiment in a real testbed (root + network namespaces), then reports from its raw data.

One module-scoped run feeds every test here: it stops after a few runs and is resumed
into the same output directory, then checked for the study's
ordering at high competing load, and reported on.
"""

import csv
import json
import subprocess
import sys

import numpy as np
import pytest

from qos.experiment.matrix import expand
from qos.experiment.report import write_report
from qos.experiment.runner import run_experiment
from qos.experiment.spec import load_spec
from qos.experiment.stats import summarise
from qos.experiment.store import Store

pytestmark = [pytest.mark.netns, pytest.mark.timing]

FIRST_SESSION = 4


@pytest.fixture(scope="module")
def smoke_run(netns_ok, tmp_path_factory):
    from services.experiment.bench import TestbedBench

    experiment = load_spec("smoke")
    out = tmp_path_factory.mktemp("smoke")
    with TestbedBench(experiment) as bench:
        run_experiment(experiment, out, bench, progress=False, max_runs=FIRST_SESSION, allow_dirty=True)
        first = {p.name: p.read_bytes() for p in (out / "runs").glob("*.json")}
        run_experiment(experiment, out, bench, progress=False, allow_dirty=True)
    return experiment, out, first


def _times(out, strategy, level):
    records = [json.loads(p.read_text()) for p in (out / "runs").glob(f"{strategy}__c{level}__*.json")]
    assert records and all(r["ok"] for r in records), [r.get("error") for r in records]
    return np.array([r["completion_s"] for r in records])


def test_resumed_run_is_complete_and_kept_the_first_session(smoke_run):
    experiment, out, first = smoke_run
    store = Store(out)
    order = [r.run_id for r in expand(experiment)]
    assert store.done_ids() == set(order)
    assert len(first) == FIRST_SESSION
    assert set(first) == {f"{rid}.json" for rid in order[:FIRST_SESSION]}
    for name, data in first.items():
        assert (out / "runs" / name).read_bytes() == data  # not run again
    meta = store.metadata()
    assert [s["runs"] for s in meta["sessions"]] == [FIRST_SESSION, len(order) - FIRST_SESSION]
    assert meta["order"] == order and "finished" in meta
    env = meta["environment"]
    assert env["kernel"] and env["git_commit"] and env["iperf3"] != "absent"
    # every block of competing traffic left what its flows achieved (from iperf3's reports)
    blocks = [b for s in meta["sessions"] for b in s["competing_blocks"]]
    assert blocks and all(b["level"] > 0 and b["kind"] == "downloads" for b in blocks)
    for block in blocks:
        assert len(block["flows"]) == len(experiment.competing.targets)
        assert block["bps"] > 0 and block["bytes"] > 0


def test_runs_are_recorded_in_the_shuffled_order(smoke_run):
    _, out, _ = smoke_run
    meta = Store(out).metadata()
    started = [json.loads((out / "runs" / f"{rid}.json").read_text())["started"] for rid in meta["order"]]
    assert started == sorted(started)


def test_every_run_holds_its_raw_measurements(smoke_run):
    experiment, out, _ = smoke_run
    for rec in Store(out).load_runs():
        assert rec["ok"], (rec["run"]["run_id"], rec.get("error"), rec.get("sites"))
        assert {s["site"] for s in rec["sites"]} == set(experiment.workload.sites)
        assert rec["completion_s"] >= max(s["total_s"] for s in rec["sites"])
        # the case carries cells, backgrounds and masks to each site; matches come back
        assert rec["bytes_up"] > 3 * 3 * experiment.workload.cells * experiment.workload.image_bytes
        assert rec["bytes_down"] > 3 * experiment.workload.cells * experiment.workload.k * experiment.workload.match_bytes
        assert rec["completion_s"] >= rec["bound"]["total_s"] > 0
        counters = rec["router_counters"]
        if rec["strategy"]["discipline"] == "fifo":
            assert sum(q["all"]["packets"] for q in counters.values()) > 0
        else:  # the case's packets were classified by their DSCP into the urgent queue
            assert sum(q["urgent"]["packets"] for q in counters.values()) > rec["bytes_up"] / 1500
        assert rec["competing"]["achieved_kbit"] >= 0 and rec["competing"]["window_s"] > 0
    # competing traffic was there during the cases (per cell: strict priority may starve it in a run)
    top = max(experiment.competing.levels)
    for strategy in experiment.strategies:
        achieved = [json.loads(p.read_text())["competing"]["achieved_kbit"]
                    for p in (out / "runs").glob(f"{strategy.name}__c{top:g}__*.json")]
        assert np.median(achieved) > 100


def test_every_loaded_run_keeps_iperf3s_json_of_its_competing_flows(smoke_run):
    experiment, out, _ = smoke_run
    store = Store(out)
    loaded = [rec for rec in store.load_runs() if rec["run"]["competing"] > 0]
    assert loaded
    for rec in loaded:
        run_id = rec["run"]["run_id"]
        kept = store.load_iperf3(run_id)
        assert kept is not None, f"{run_id}: no iperf3 JSON"
        assert run_id in kept["block_runs"] and kept["kind"] == "downloads"
        assert {name.split("->")[1] for name in kept["flows"]} == set(experiment.competing.targets)
        in_case = 0
        for flow in kept["flows"].values():
            client = flow["client"]
            assert client["start"]["test_start"]["reverse"] == 1
            assert client["start"]["test_start"]["num_streams"] == rec["run"]["competing"]
            assert client["end"]["sum_received"]["bytes"] > 0
            assert client["intervals"]
            in_case += sum(iv["sum"]["bytes"] for iv in client["intervals"])
        # The kept intervals span the case: they hold at least the payload its targets received then.
        assert in_case >= 0.8 * rec["competing"]["bytes"] * 1448 / 1514, run_id
    # runs without competing traffic have none
    idle = [rec["run"]["run_id"] for rec in store.load_runs() if rec["run"]["competing"] == 0]
    assert idle and all(store.load_iperf3(rid) is None for rid in idle)


def test_high_load_fifo_is_slower_and_less_predictable_than_priority(smoke_run):
    experiment, out, _ = smoke_run
    top = max(experiment.competing.levels)
    fifo, prio = _times(out, "fifo", top), _times(out, "prio", top)
    assert fifo.mean() > prio.mean()
    assert fifo.std(ddof=1) > prio.std(ddof=1)


def test_with_shaping_completion_time_is_nearly_flat(smoke_run):
    experiment, out, _ = smoke_run
    top = max(experiment.competing.levels)
    idle, loaded = _times(out, "shape-500", 0), _times(out, "shape-500", top)
    fifo_growth = _times(out, "fifo", top).mean() / _times(out, "fifo", 0).mean()
    shaped_growth = loaded.mean() / idle.mean()
    assert shaped_growth < 1.5
    assert shaped_growth < fifo_growth


def test_shaping_holds_the_competing_traffic_to_its_limit(smoke_run):
    experiment, out, _ = smoke_run
    top = max(experiment.competing.levels)
    achieved = [json.loads(p.read_text())["competing"]["achieved_kbit"]
                for p in (out / "runs").glob(f"shape-500__c{top:g}__*.json")]
    assert np.median(achieved) < 500 * 1.2
    unshaped = [json.loads(p.read_text())["competing"]["achieved_kbit"]
                for p in (out / "runs").glob(f"fifo__c{top:g}__*.json")]
    assert np.median(unshaped) > 5 * np.median(achieved)


def test_report_tables_come_from_the_raw_data(smoke_run):
    experiment, out, _ = smoke_run
    folder = write_report(out)
    with open(folder / "summary.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(experiment.strategies) * len(experiment.competing.levels)
    for row in rows:
        times = _times(out, row["strategy"], f"{float(row['competing']):g}")
        s = summarise(times)
        assert int(row["n"]) == len(times) == experiment.repetitions
        assert float(row["mean_s"]) == pytest.approx(s.mean)
        assert float(row["std_s"]) == pytest.approx(s.std)
        assert float(row["p95_s"]) == pytest.approx(np.percentile(times, 95))
        assert float(row["ratio_mean"]) >= 1.0
    table = (folder / "table1.md").read_text()
    for strategy in experiment.strategies:
        assert strategy.name in table
    with open(folder / "significance.csv") as f:
        sig = list(csv.DictReader(f))
    assert len(sig) == 3 * len(experiment.competing.levels)  # 3 pairs of strategies per level
    for stem in ("fig7_mean_10M_urgent", "fig8_std_10M_urgent", "fig9_shaping_10M_urgent",
                 "ratio_10M_urgent", "box_10M_urgent", "cdf_10M_urgent"):
        assert (folder / f"{stem}.png").stat().st_size > 5000
        assert (folder / f"{stem}.svg").read_text().lstrip().startswith("<?xml")


def test_report_command(smoke_run):
    _, out, _ = smoke_run
    done = subprocess.run([sys.executable, "-m", "pathmaster", "experiment", "report", str(out), "--no-plots"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "fifo" in done.stdout and "report.md" in done.stdout
