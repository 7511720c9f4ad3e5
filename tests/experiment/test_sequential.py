"""A sequential design declared in the experiment file: looks, the alpha spent at each, and
running an experiment through one look."""

import pytest

from pathmaster.records import InvalidInput
from qos.experiment.runner import look_runs, run_experiment
from qos.experiment.spec import load_spec, parse_spec

FINDING = {"name": "3a. PQ beats FIFO", "claim": "less", "a": {"strategy": "prio", "level": 0},
           "b": {"strategy": "fifo", "level": 0}}
BASE = {
    "experiment": {"name": "t", "repetitions": 9, "order": "rounds", "settle_s": 0.0, "settle_fraction": 0.0},
    "competing": {"levels": [0]},
    "strategies": {"fifo": {"discipline": "fifo"}, "prio": {"discipline": "prio"}},
    "links": [{"name": "l", "core_kbit": 10_000}],
    "findings": [FINDING],
    "sequential": {"looks": [3, 6, 9], "alpha": [0.005, 0.015, 0.03]},
}


def spec(**sequential):
    return {**BASE, "sequential": {**BASE["sequential"], **sequential}}


def test_the_contested_file_declares_its_looks():
    design = load_spec("pathmaster2002-contested").sequential
    assert design.looks[-1] == load_spec("pathmaster2002-contested").repetitions
    assert sum(design.alpha) <= 0.05 and design.continue_cells == "open"


@pytest.mark.parametrize("bad", [
    {"looks": [3, 3, 9]},                       # not increasing
    {"looks": [2, 6, 9]},                       # too few runs at the first look
    {"alpha": [0.01, 0.02]},                    # one per look
    {"alpha": [0.01, 0.02, 0.03]},              # spends 0.06
    {"alpha": [0.0, 0.02, 0.03]},
    {"looks": [3, 6, 8]},                       # the last look is not the repetitions
    {"continue": "some"},
])
def test_a_design_that_does_not_add_up_is_refused(bad):
    with pytest.raises(InvalidInput):
        parse_spec(spec(**bad))


def test_a_design_needs_findings_and_rounds():
    with pytest.raises(InvalidInput):
        parse_spec({**spec(), "findings": []})
    with pytest.raises(InvalidInput):
        parse_spec({**spec(), "experiment": {**BASE["experiment"], "order": "blocked"}})


def test_the_design_is_part_of_the_experiments_fingerprint():
    assert parse_spec(spec()).fingerprint() != parse_spec(spec(alpha=[0.01, 0.01, 0.03])).fingerprint()
    assert parse_spec(spec()).to_dict()["sequential"]["continue"] == "open"


class _Bench:
    """The least a run needs: a case that completes, no emulators."""

    def environment(self): return {}
    def configure(self, link, strategy): pass
    def set_competing(self, level, seed): return None
    def stop_competing(self): return None
    def finish(self): return {}
    def counters(self): return {}
    def competing_bytes(self): return 0
    def behind_core(self, site): return False
    def emulator_snapshots(self, newer_than=0.0): return {}

    def run_case(self, request_class, seed, case_id):
        return {"ok": False, "error": "fake"}  # (a failed case: no bound to compute)


def test_running_through_a_look_stops_with_every_cell_at_its_n(tmp_path):
    exp = parse_spec(spec())
    store = run_experiment(exp, tmp_path / "out", _Bench(), progress=False, through_look=1, allow_dirty=True)
    runs = store.load_runs()
    assert sorted(r["run"]["repetition"] for r in runs) == [0, 0, 1, 1, 2, 2]
    assert {r["session"] for r in runs} == {1}
    store = run_experiment(exp, tmp_path / "out", _Bench(), progress=False, through_look=2, allow_dirty=True)
    runs = store.load_runs()
    assert len(runs) == 12 and {r["session"] for r in runs if r["run"]["repetition"] >= 3} == {2}
    assert [s["session"] for s in store.metadata()["sessions"]] == [1, 2]
    assert look_runs(exp, 3) == 9
    with pytest.raises(InvalidInput):
        look_runs(exp, 4)
    with pytest.raises(InvalidInput):
        look_runs(parse_spec({**BASE, "sequential": None, "findings": []}), 1)


def test_past_the_first_look_a_resolved_cell_gets_no_more_runs(tmp_path, monkeypatch):
    import qos.experiment.sequential as sequential

    asked = []

    def prio_resolved(meta, cells, cell, repetition):  # the look's verdict stands in: prio's finding resolved
        asked.append((cell[0], repetition, sum(len(c.repetitions) for c in cells.values())))
        return cell[0] != "prio"

    monkeypatch.setattr(sequential, "needed", prio_resolved)
    exp = parse_spec(spec())
    run_experiment(exp, tmp_path / "out", _Bench(), progress=False, through_look=1, allow_dirty=True)
    assert asked == []  # within the first look every run is wanted
    store = run_experiment(exp, tmp_path / "out", _Bench(), progress=False, through_look=2, allow_dirty=True)
    reps = sorted((r["run"]["strategy"], r["run"]["repetition"]) for r in store.load_runs())
    assert [rep for name, rep in reps if name == "prio"] == [0, 1, 2]
    assert [rep for name, rep in reps if name == "fifo"] == [0, 1, 2, 3, 4, 5]
    assert asked[0][2] >= 6  # asked on the runs stored so far
    assert sum(name == "prio" for name, _, _ in asked) == 1  # once held back, not asked again
    session = store.metadata()["sessions"][-1]
    assert session["runs"] == 3 and session["resolved_cells"] == ["prio/0/l/urgent"]
    exp_all = parse_spec(spec(**{"continue": "all"}))
    asked.clear()
    store = run_experiment(exp_all, tmp_path / "all", _Bench(), progress=False, through_look=2, allow_dirty=True)
    assert asked == [] and len(store.load_runs()) == 12
