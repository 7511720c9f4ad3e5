"""The adaptive strategy: the product's policy drives the testbed's case.

An experiment file declares it per strategy (`adaptive = {...}`, checked like every table);
the transfer workload's master then plans each site with `qos.policy.plan_site` (features
where the schema matches, wire-sized replies, step-down, hedging) and predicts every case
with the coordinator's passive model; every run's raw record keeps predicted and actual
time and the mode used; the report computes the MdAPE from the raw records alone.
"""

from __future__ import annotations

import json

import pytest

from pathmaster import defaults
from pathmaster.records import InvalidInput
from qos.classes import DEFAULT_CLASSES
from qos.experiment.cells import load_cells
from qos.experiment.report import prediction_rows, write_report
from qos.experiment.spec import (CLASS_DEADLINES_S, MAX_WIRE_THUMBNAIL_BYTES, WIRE_THUMBNAIL_BYTES, load_spec,
                                 parse_spec)
from qos.network import GRPC_REPLY_FRAMING_BYTES, TCP_INITIAL_WINDOW_BYTES
from qos.policy import SMALL_REQUEST_COPIES

SCHEMA = "fs1-test"


def spec(**strategies) -> dict:
    return {"experiment": {"name": "adaptive-test", "repetitions": 2, "request_classes": ["urgent"]},
            "workload": {"cells": 2, "image_bytes": 4000, "k": 2, "match_bytes": 3000},
            "strategies": strategies or {"adaptive-fifo": {"discipline": "fifo", "adaptive": {}}},
            "links": [{"name": "10M", "core_kbit": 10000}]}


def test_an_adaptive_strategy_is_accepted_with_its_defaults():
    experiment = parse_spec(spec(fifo={"discipline": "fifo"},
                                 **{"adaptive-prio": {"discipline": "prio", "adaptive": {"deadlines_s": {"urgent": 1.5}}}}))
    assert experiment.strategy("fifo").adaptive is None
    adaptive = experiment.strategy("adaptive-prio").adaptive
    assert (adaptive.ship, adaptive.analyse, adaptive.deadlines_s) == ("auto", True, {"urgent": 1.5})
    assert parse_spec(spec()).strategy("adaptive-fifo").adaptive.deadlines_s == CLASS_DEADLINES_S
    assert experiment.to_dict()["strategies"][1]["adaptive"]["deadlines_s"] == {"urgent": 1.5}  # in the metadata
    study = load_spec("pathmaster2002")
    assert {s.name: s.discipline for s in study.strategies if s.adaptive} == {"adaptive-fifo": "fifo",
                                                                             "adaptive-prio": "prio"}


@pytest.mark.parametrize("adaptive, words", [
    ({"shipp": "auto"}, ["strategies.a.adaptive", "shipp", "unknown"]),
    ({"ship": "pixels"}, ["strategies.a.adaptive", "ship", "'pixels'"]),
    ({"analyse": "yes"}, ["strategies.a.adaptive", "analyse"]),
    ({"deadlines_s": {"urgent": -1.0}}, ["deadlines_s", "> 0"]),
    ({"deadlines_s": {"urgent": float("nan")}}, ["deadlines_s", "> 0"]),
    ({"deadlines_s": {"vip": 1.0}}, ["deadlines_s", "'vip'", "known: urgent"]),
])
def test_a_bad_adaptive_table_names_its_key(adaptive, words):
    with pytest.raises(InvalidInput) as err:
        parse_spec(spec(a={"discipline": "fifo", "adaptive": adaptive}), source="bad.toml")
    message = str(err.value)
    assert message.startswith("bad.toml: ")
    for word in words:
        assert word in message, message


@pytest.fixture
def loopback_sites():
    """Two transfer sites on loopback: A takes features of SCHEMA, B only images."""
    from services.experiment.workload import serve_transfer_site

    servers = {"A": serve_transfer_site("A", "127.0.0.1", 0, 3000, DEFAULT_CLASSES, 500, SCHEMA),
               "B": serve_transfer_site("B", "127.0.0.1", 0, 3000, DEFAULT_CLASSES, 500, "")}
    yield {name: f"127.0.0.1:{server.port}" for name, server in servers.items()}
    for server in servers.values():
        server.stop(0)


def test_the_master_runs_the_policy_and_predicts_every_case(loopback_sites):
    from services.experiment.workload import Master, make_cells

    master = Master(loopback_sites, DEFAULT_CLASSES, feature_schema=SCHEMA, feature_values=115)
    adaptive = parse_spec(spec()).strategy("adaptive-fifo").adaptive.model_dump()
    try:
        master.discover()
        cells = make_cells(2, 4000, True, True, seed=3)
        static = [master.case("urgent", cells, k=2, deadline_s=20, strategy="fifo", seed=3) for _ in range(2)]
        smart = master.case("urgent", cells, k=2, deadline_s=20, strategy="adaptive-fifo", adaptive=adaptive, seed=3)
    finally:
        master.close()
    assert all(case["ok"] for case in [*static, smart])
    # Today's case: images everywhere, full thumbnails; the first case of a path has no prediction.
    assert static[0]["predicted_s"] is None and static[0]["modes"] == ["images"]
    assert static[1]["predicted_s"] > 0 and all(s["predicted_s"] > 0 for s in static[1]["sites"])
    # Adaptive: features to the site of the same schema, images to the other; predicted, because
    # its first case warmed every class and mode the policy may choose.
    by_site = {s["site"]: s for s in smart["sites"]}
    assert by_site["A"]["mode"] == "features" and by_site["B"]["mode"] == "images"
    assert smart["policy"] == "adaptive" and smart["predicted_s"] > 0 and smart["modes"] == ["features", "images"]
    # Per copy (a small features request goes as several, 20 ms apart: on loopback the first
    # copy's answer may come before the others leave): 2 x 115 doubles vs 2 x 3 images.
    assert 1 <= by_site["A"]["copies"] <= SMALL_REQUEST_COPIES
    assert by_site["A"]["bytes_up"] / by_site["A"]["copies"] < static[1]["sites"][0]["bytes_up"] / 5
    why = {w["code"]: w["params"] for w in by_site["A"]["why"]}
    assert why["small_request_copies"]["gap_ms"] == "20"
    assert by_site["A"]["bytes_down"] < static[1]["sites"][0]["bytes_down"] / 3  # wire thumbnails
    assert smart["deadline_s"] == CLASS_DEADLINES_S["urgent"]
    assert "features_same_schema" in why


def test_a_six_cell_features_reply_fits_one_initial_window(loopback_sites):
    """A site's answer to a 6-cell features case (30 matches with their ids, content
    hashes and wire thumbnails) is one initial congestion window; with the 1000 B thumbnails
    of before, a strategy's `thumbnail_bytes`, it is not (the site sends what the strategy asks)."""
    from services.experiment.workload import Master, make_cells

    master = Master(loopback_sites, DEFAULT_CLASSES, feature_schema=SCHEMA, feature_values=115)
    now = parse_spec(spec()).strategy("adaptive-fifo").adaptive.model_dump()
    before = now | {"thumbnail_bytes": 1000}
    cells = make_cells(6, 4000, False, False, seed=1)
    try:
        master.discover()
        cases = {name: master.case("urgent", cells, k=defaults.K, deadline_s=20, strategy=name, adaptive=adaptive,
                                   seed=1)
                 for name, adaptive in [("now", now), ("before", before)]}
    finally:
        master.close()
    replies = {name: {s["site"]: s for s in case["sites"]}["A"] for name, case in cases.items()}
    assert all(case["ok"] for case in cases.values()) and replies["now"]["mode"] == "features"
    window = TCP_INITIAL_WINDOW_BYTES - GRPC_REPLY_FRAMING_BYTES
    assert replies["now"]["bytes_down"] <= window < replies["before"]["bytes_down"]
    assert replies["before"]["bytes_down"] - replies["now"]["bytes_down"] == 6 * defaults.K * (1000 - WIRE_THUMBNAIL_BYTES)


def test_a_strategy_cannot_ask_for_huge_thumbnails():
    with pytest.raises(InvalidInput, match="thumbnail_bytes"):
        parse_spec(spec(a={"discipline": "fifo", "adaptive": {"thumbnail_bytes": MAX_WIRE_THUMBNAIL_BYTES + 1}}))


def _write_run(runs_dir, run_id, strategy, completion_s, predicted_s):
    record = {"format": 1, "run": {"strategy": strategy, "competing": 0, "link": "10M", "request_class": "urgent",
                                   "repetition": int(run_id[-1]), "run_id": run_id},
              "ok": True, "completion_s": completion_s, "predicted_s": predicted_s,
              "bound": {"total_s": 0.1}, "bytes_up": 1000, "bytes_down": 1000, "sites": []}
    (runs_dir / f"{run_id}.json").write_text(json.dumps(record))


def test_the_report_computes_the_mdape_from_the_raw_runs(tmp_path):
    (tmp_path / "runs").mkdir()
    meta = {"experiment": {"name": "t", "description": "", "strategies": [{"name": "fifo", "discipline": "fifo"},
                                                                         {"name": "adaptive-fifo", "discipline": "fifo"}],
                           "links": [{"name": "10M"}], "competing": {"kind": "downloads"}}}
    (tmp_path / "metadata.json").write_text(json.dumps(meta))
    # fifo: errors 10%, 50%, and one run without a prediction; adaptive: 20%, 0%, 40%.
    _write_run(tmp_path / "runs", "f0", "fifo", 1.0, 1.1)
    _write_run(tmp_path / "runs", "f1", "fifo", 2.0, 1.0)
    _write_run(tmp_path / "runs", "f2", "fifo", 2.0, None)
    _write_run(tmp_path / "runs", "a0", "adaptive-fifo", 0.5, 0.6)
    _write_run(tmp_path / "runs", "a1", "adaptive-fifo", 0.5, 0.5)
    _write_run(tmp_path / "runs", "a2", "adaptive-fifo", 0.5, 0.3)
    rows = {r["strategy"]: r for r in prediction_rows(*load_cells(tmp_path))}
    assert rows["fifo"]["runs"] == 3 and rows["fifo"]["predicted"] == 2
    assert rows["fifo"]["mdape"] == pytest.approx(0.3)
    assert rows["adaptive-fifo"]["mdape"] == pytest.approx(0.2)
    assert rows["all"]["predicted"] == 5 and rows["all"]["mdape"] == pytest.approx(0.2)  # of 0.1 0.5 0.2 0 0.4
    report = write_report(tmp_path, plots=False)
    assert "## Prediction error" in (report / "report.md").read_text()
    assert (report / "prediction.csv").read_text().splitlines()[0] == "strategy,runs,predicted,mdape,ape_p90"


@pytest.mark.netns
@pytest.mark.timing
def test_a_short_namespace_run_records_predicted_actual_and_mode(netns_ok, tmp_path):
    """Two runs each of image mode and adaptive over FIFO, idle, in the testbed."""
    from qos.experiment.runner import run_experiment
    from qos.experiment.store import Store
    from services.experiment.bench import TestbedBench

    data = spec(fifo={"discipline": "fifo"}, **{"adaptive-fifo": {"discipline": "fifo", "adaptive": {}}})
    data["experiment"]["settle_s"] = 0.0
    experiment = parse_spec(data)
    with TestbedBench(experiment) as bench:
        run_experiment(experiment, tmp_path, bench, progress=False, allow_dirty=True)
    runs = Store(tmp_path).load_runs()
    assert len(runs) == 4 and all(r["ok"] for r in runs), [r.get("error") for r in runs]
    adaptive = [r for r in runs if r["run"]["strategy"] == "adaptive-fifo"]
    static = [r for r in runs if r["run"]["strategy"] == "fifo"]
    assert all(r["modes"] == ["features"] and r["predicted_s"] > 0 for r in adaptive)
    assert all(r["modes"] == ["images"] for r in static) and sum(r["predicted_s"] is not None for r in static) >= 1
    for r in runs:
        assert len(r["sites"]) == 3 and all(s["total_s"] <= r["completion_s"] for s in r["sites"])
        assert r["bound"]["total_s"] > 0
    # Each site's own time, not the case's: the master's own subnet (A1, no core link) answers
    # while the two remote sites' 24 KB each still cross the 10 Mbit/s core (>= 38 ms).
    local = [({s["site"]: s["total_s"] for s in r["sites"]}["A1"], r["completion_s"]) for r in static]
    assert any(a1 < completion - 0.01 for a1, completion in local), local
    # Per copy (a busy machine may make a hedge fire): 2 x 115 doubles against 2 x 3 x 4000 B.
    per_copy = [s["bytes_up"] / s["copies"] for r in adaptive for s in r["sites"]]
    assert max(per_copy) * 5 < min(s["bytes_up"] for r in static for s in r["sites"])
    rows = {row["strategy"]: row for row in prediction_rows(*load_cells(tmp_path))}
    assert rows["adaptive-fifo"]["predicted"] == 2 and rows["all"]["mdape"] >= 0


def test_in_service_mode_adaptive_is_the_coordinators_policy_and_static_is_images(monkeypatch):
    """The product's own coordinator plans an adaptive strategy's case (`query --ship auto`);
    any other strategy's case goes as images; the record keeps each site's mode and prediction."""
    from types import SimpleNamespace

    from services.experiment import deployment
    from services.experiment.bench import TestbedBench

    shipped = []
    site = {"status": "OK", "timing": {"total_s": 0.5, "transfer_s": 0.1, "site_wall_s": 0.4, "extraction_s": 0.3,
                                       "search_s": 0.01}, "bytes_sent": 100, "bytes_received": 50,
            "mode": "features", "request_class": "urgent", "predicted_s": 0.45}

    def run_case(dep, request_class, cells, seed, deadline_s, ship):
        shipped.append(ship)
        return deployment.CaseResult(request_class, True, 0.5, 0.9, {"site-A1": site},
                                     {"bytes_sent": 100, "bytes_received": 50, "votes": [], "predicted_s": 0.45}, 0)

    monkeypatch.setattr(deployment, "run_case", run_case)
    experiment = parse_spec(spec(fifo={"discipline": "fifo"}, smart={"discipline": "fifo", "adaptive": {}}))
    bench = SimpleNamespace(workload=experiment.workload, deployment=object(), strategy=experiment.strategy("fifo"))
    assert TestbedBench._service_case(bench, "urgent", 1)["policy"] == "static"
    bench.strategy = experiment.strategy("smart")
    record = TestbedBench._service_case(bench, "urgent", 1)
    assert shipped == ["images", "auto"]
    assert record["policy"] == "adaptive" and record["predicted_s"] == 0.45 and record["modes"] == ["features"]
    assert record["sites"][0]["mode"] == "features" and record["sites"][0]["predicted_s"] == 0.45


def test_an_adaptive_case_renews_the_connections_it_used(loopback_sites):
    """With `renew_connections` (as the coordinator's option) the connections a case used are
    replaced by fresh ones opened right after it; without (the default), a strategy keeps them."""
    from services.experiment.workload import Master, make_cells

    master = Master(loopback_sites, DEFAULT_CLASSES, feature_schema=SCHEMA, feature_values=115)
    # Copies all at once, so that every lane is used whatever the answer's speed.
    keeping = parse_spec(spec()).strategy("adaptive-fifo").adaptive.model_dump() | {"copy_gap_s": 0.0}
    renewing = keeping | {"renew_connections": True}
    assert keeping["renew_connections"] is False  # the default: renewal measured no help
    try:
        master.discover()
        cells = make_cells(2, 4000, False, False, seed=3)
        for strategy, adaptive in (("renewing", renewing), ("keeping", keeping)):
            assert master.case("urgent", cells, k=2, deadline_s=20, strategy=strategy, adaptive=adaptive)["ok"]
        # Site A got features as copies over every lane, site B images on one: each used lane renewed.
        spares = {k for k, v in master.strategy_channels["renewing"]._spares.items() if v}
        assert {("A", lane) for lane in range(SMALL_REQUEST_COPIES)} <= {(k[0], k[2]) for k in spares}
        assert ("B", 0) in {(k[0], k[2]) for k in spares}
        assert not any(master.strategy_channels["keeping"]._spares.values())
    finally:
        master.close()


def test_a_strategy_may_send_fewer_feature_values_as_a_what_if(loopback_sites):
    """`feature_values` (a what-if: only the features a site's selection keeps) changes the
    bytes of a features request, nothing else."""
    from services.experiment.workload import Master, make_cells

    master = Master(loopback_sites, DEFAULT_CLASSES, feature_schema=SCHEMA, feature_values=130)
    full = parse_spec(spec()).strategy("adaptive-fifo").adaptive.model_dump() | {"copy_gap_s": 0.0,
                                                                                 "small_request_copies": 1}
    try:
        master.discover()
        cells = make_cells(6, 4000, False, False, seed=3)
        sizes = {}
        for strategy, adaptive in (("full", full), ("selected", full | {"feature_values": 24})):
            case = master.case("urgent", cells, k=5, deadline_s=20, strategy=strategy, adaptive=adaptive)
            assert case["ok"]
            sizes[strategy] = next(s["bytes_up"] for s in case["sites"] if s["site"] == "A")
    finally:
        master.close()
    assert sizes["full"] > 6 * 130 * 8 and 6 * 24 * 8 < sizes["selected"] <= TCP_INITIAL_WINDOW_BYTES / 10


def test_a_site_that_advertises_its_selection_gets_the_coordinators_subset_request():
    """The transfer sites stand in for sites that select features (as many as forward
    selection keeps at most): they advertise the columns, and the master sends each only
    those values, in the coordinator's own encoding (fanout.features_request); a site that
    advertises none gets the full vectors."""
    from services.coordinator.fanout import features_request, new_send_id
    from services.experiment.workload import Master, make_cells, make_features, selection_stand_in, serve_transfer_site

    columns = selection_stand_in(130)
    assert len(columns) == defaults.MAX_SELECTED_FEATURES and columns[-1] == 129
    servers = {"A": serve_transfer_site("A", "127.0.0.1", 0, 3000, DEFAULT_CLASSES, 500, SCHEMA, feature_count=130),
               "B": serve_transfer_site("B", "127.0.0.1", 0, 3000, DEFAULT_CLASSES, 500, SCHEMA)}
    master = Master({n: f"127.0.0.1:{s.port}" for n, s in servers.items()}, DEFAULT_CLASSES,
                    feature_schema=SCHEMA, feature_values=130)
    adaptive = parse_spec(spec()).strategy("adaptive-fifo").adaptive.model_dump() | {"copy_gap_s": 0.0,
                                                                                     "small_request_copies": 1}
    try:
        master.discover()
        assert master.site_columns == {"A": tuple(columns), "B": ()}
        case = master.case("urgent", make_cells(6, 4000, False, False, seed=3), k=5, deadline_s=20,
                           strategy="s", adaptive=adaptive, case_id="c1", seed=3)
    finally:
        master.close()
        for server in servers.values():
            server.stop(0)
    assert case["ok"]
    sites = {s["site"]: s for s in case["sites"] if s["mode"] == "features"}
    up = {name: s["bytes_up"] for name, s in sites.items()}
    vectors = make_features(6, 130, seed=3)
    # (in the class the policy chose: urgent may step down)
    send = new_send_id()  # every request carries one, of one length
    assert up["A"] == features_request("c1", sites["A"]["request_class"], 5, SCHEMA, vectors, columns, send).ByteSize()
    assert up["B"] == features_request("c1", sites["B"]["request_class"], 5, SCHEMA, vectors, (), send).ByteSize()
    assert up["A"] < TCP_INITIAL_WINDOW_BYTES / 10 < 6 * 130 * 8 < up["B"]


def test_features_mode_charges_the_coordinators_analysis_once_before_the_fan_out():
    """On the study's workload a site analyses the images it gets (a wait
    of `analysis_s` an image, pipelined over its nodes); a site sent features only searches,
    because the coordinator analysed each cell once, on the master's own nodes, before any
    features left. So a features case cannot finish before that analysis, it is charged once
    for all the sites that get features, and the run's physical bound includes it."""
    from types import SimpleNamespace

    from qos.experiment.runner import run_bound
    from qos.experiment.spec import pipelined_analysis_s
    from services.experiment.workload import Master, make_cells, serve_transfer_site

    per_image, nodes, cells = 0.5, 2, 3
    delay = pipelined_analysis_s(cells, per_image, nodes)  # 1 s: far above loopback's transfer
    servers = {name: serve_transfer_site(name, "127.0.0.1", 0, 3000, DEFAULT_CLASSES, 500, schema,
                                         analysis_s=per_image, site_nodes=nodes)
               for name, schema in (("A", SCHEMA), ("C", SCHEMA), ("B", ""))}  # B takes images only
    master = Master({n: f"127.0.0.1:{s.port}" for n, s in servers.items()}, DEFAULT_CLASSES,
                    feature_schema=SCHEMA, feature_values=115, analysis_s=per_image, nodes=nodes)
    adaptive = parse_spec(spec()).strategy("adaptive-fifo").adaptive.model_dump()
    try:
        master.discover()
        case = make_cells(cells, 4000, True, True, seed=3)
        first, second = (master.case("urgent", case, k=2, deadline_s=30, strategy="adaptive-fifo",
                                     adaptive=adaptive, seed=3) for _ in range(2))
        static = master.case("urgent", case, k=2, deadline_s=30, strategy="fifo", seed=3)
    finally:
        master.close()
        for server in servers.values():
            server.stop(0)
    assert first["ok"] and second["ok"] and static["ok"]
    sites = {s["site"]: s for s in first["sites"]}
    assert {n: s["mode"] for n, s in sites.items()} == {"A": "features", "C": "features", "B": "images"}
    # The master's analysis, once: every features site's request waited for the same one.
    assert first["analysis_s"] >= delay
    assert sites["A"]["prior_s"] == sites["C"]["prior_s"] == first["analysis_s"] and sites["B"]["prior_s"] == 0
    # No features site answered before the analysis was done, nor the case.
    assert min(sites["A"]["total_s"], sites["C"]["total_s"]) >= first["analysis_s"] and first["completion_s"] >= delay
    # A features site only searches; an images site analyses (its wait is the same length).
    assert sites["B"]["compute_s"] >= delay > max(sites["A"]["compute_s"], sites["C"]["compute_s"])
    # Predicted as the coordinator models a case: its analysis (learnt from the first) and the slowest site.
    assert second["predicted_s"] > first["analysis_s"]
    # Images everywhere: nothing to analyse at the master.
    assert static["analysis_s"] == 0 and all(s["prior_s"] == 0 for s in static["sites"])
    # The physical bound includes the analysis the features requests waited for.
    experiment = parse_spec(spec() | {"links": [{"name": "hubs", "core_kbit": 10000, "network": "2002"}]})
    link = experiment.links[0]
    bench = SimpleNamespace(behind_core=lambda site: True)
    assert run_bound(experiment, link, first["sites"], bench)["total_s"] >= first["analysis_s"]
    no_wait = [s | {"prior_s": 0.0} for s in first["sites"] if s["mode"] == "features"]
    assert run_bound(experiment, link, no_wait, bench)["total_s"] < first["analysis_s"]
