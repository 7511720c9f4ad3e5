"""The study's workload as experiment-file options: the analysis time per
image pipelined over a site's nodes, and wget-like 20 MB fetches as the competing traffic."""

from __future__ import annotations

import pytest

from pathmaster.records import InvalidInput
from qos.classes import DEFAULT_CLASSES
from qos.experiment.spec import STUDY_ANALYSIS_S, load_spec, parse_spec, pipelined_analysis_s
from qos.traffic.competing import FETCH_FILE_BYTES
from services.experiment.bench import competing_spec

BASE = {
    "experiment": {"name": "t", "repetitions": 2},
    "strategies": {"fifo": {"discipline": "fifo"}},
    "links": [{"name": "hubs", "core_kbit": 10000, "network": "2002"}],
}


def spec(workload=None, competing=None):
    return {**BASE, "workload": workload or {}, "competing": competing or {"levels": [0]}}


@pytest.mark.parametrize("cells, nodes, per_image, expected", [
    (6, 2, 5.0, 15.0),   # the study: 6 cells, server + worker, ~5 s each
    (5, 2, 5.0, 15.0),   # an odd cell waits for a free node
    (6, 1, 5.0, 30.0),
    (1, 2, 5.0, 5.0),    # one cell cannot be split
    (6, 2, 0.0, 0.0),
])
def test_analysis_is_pipelined_one_cell_per_node(cells, nodes, per_image, expected):
    assert pipelined_analysis_s(cells, per_image, nodes) == expected


def test_the_studys_workload_is_what_the_faithful_experiment_runs():
    exp = load_spec("pathmaster2002-faithful")
    w = exp.workload
    assert (w.cells, w.image_bytes, w.with_background, w.with_mask) == (6, 100_000, True, True)
    assert (w.analysis_s, w.site_nodes) == (STUDY_ANALYSIS_S, 2)
    assert (w.k, w.match_bytes) == (5, w.image_bytes)  # the matching images come back whole
    assert w.analysis_wall_s == 15.0 < w.deadline_s
    assert exp.competing.kind == "wget" and exp.competing.fetch_bytes == 20_000_000
    assert exp.competing.unit == "processes" and max(exp.competing.levels) == 16
    # recorded with every run, so the raw data says what the workload was
    recorded = exp.to_dict()
    assert recorded["workload"]["analysis_s"] == 5.0 and recorded["competing"]["file_bytes"] == 20_000_000


def test_defaults_leave_older_experiments_as_they_were():
    exp = parse_spec(spec())
    assert exp.workload.analysis_s == 0.0 and exp.workload.analysis_wall_s == 0.0
    recorded = exp.to_dict()
    assert "analysis_s" not in recorded["workload"] and "file_bytes" not in recorded["competing"]


def test_wget_levels_become_processes_per_target_with_the_file_size():
    exp = parse_spec(spec(competing={"kind": "wget", "levels": [0, 4], "file_bytes": 2_000_000}))
    assert competing_spec(exp.competing, 4, seed=1) == {
        "kind": "wget", "targets": ["B3", "C3"], "processes": 4, "file_bytes": 2_000_000}
    default = parse_spec(spec(competing={"kind": "wget", "levels": [2]})).competing
    assert competing_spec(default, 2, seed=1)["file_bytes"] == FETCH_FILE_BYTES
    marked = parse_spec(spec(competing={"kind": "wget", "levels": [2], "params": {"dscp": 0}})).competing
    assert competing_spec(marked, 2, seed=1)["dscp"] == 0


@pytest.mark.parametrize("workload, competing, words", [
    ({"analysis_s": -1}, None, ["workload", "analysis_s", "greater than or equal to 0"]),
    ({"site_nodes": 0}, None, ["workload", "site_nodes"]),
    ({"analysis_s": 30, "deadline_s": 60}, None, ["6 cells over 2 node(s)", "90 s", "deadline_s = 60"]),
    ({"mode": "service", "analysis_s": 5}, None, ["service", "analyses the cells itself"]),
    ({"analysis_ms": 5}, None, ["analysis_ms", "unknown"]),
    (None, {"kind": "downloads", "levels": [2], "file_bytes": 1000}, ["file_bytes", 'kind = "wget"']),
    (None, {"kind": "wget", "levels": [1.5]}, ["processes per target, whole numbers", "1.5"]),
    (None, {"kind": "wget", "levels": [2], "file_bytes": 0}, ["file_bytes"]),
    (None, {"kind": "wgets", "levels": [2]}, ["wgets", "wget"]),
])
def test_bad_study_workload_options_name_the_key(workload, competing, words):
    with pytest.raises(InvalidInput) as err:
        parse_spec(spec(workload, competing), source="study.toml")
    message = str(err.value)
    assert message.startswith("study.toml: ")
    for word in words:
        assert word in message


def test_a_transfer_site_takes_the_pipelined_analysis_time():
    """The site's reported wall time holds the analysis of the cells it was sent (a wait, which
    never ends early: a lower bound, safe on a busy machine),."""
    from services.experiment.workload import Master, make_cells, serve_transfer_site

    site = serve_transfer_site("A1", "127.0.0.1", 0, 100, DEFAULT_CLASSES, analysis_s=0.2, site_nodes=2)
    master = Master({"A1": f"127.0.0.1:{site.port}"}, DEFAULT_CLASSES)
    try:
        master.discover()
        reply = master.case("urgent", make_cells(3, 64, True, True, seed=1), k=2, deadline_s=30)
        assert reply["ok"]
        (entry,) = reply["sites"]
        assert entry["compute_s"] >= pipelined_analysis_s(3, 0.2, 2) == 0.4
        assert entry["total_s"] >= entry["compute_s"]
    finally:
        master.close()
        site.stop(0)
