"""A sequential design's looks, the sessions as replicates, and the design's simulated power."""

import numpy as np
import pytest

from qos.experiment import sequential
from qos.experiment.findings import study_verdicts
from qos.experiment.power import simulate
from qos.experiment.cells import Cell
from qos.experiment.spec import parse_spec

SPEC = {
    "experiment": {"name": "t", "repetitions": 12, "order": "rounds"},
    "competing": {"levels": [16]},
    "strategies": {"fifo": {"discipline": "fifo"}, "prio": {"discipline": "prio"}, "wfq": {"discipline": "wfq"}},
    "links": [{"name": "l", "core_kbit": 10_000}],
    "findings": [
        {"name": "3a. PQ beats FIFO", "claim": "less", "a": {"strategy": "prio", "level": 16},
         "b": {"strategy": "fifo", "level": 16}},
        {"name": "4. WFQ beats FIFO", "claim": "less", "a": {"strategy": "wfq", "level": 16},
         "b": {"strategy": "fifo", "level": 16}},
    ],
    "sequential": {"looks": [4, 8, 12], "alpha": [0.005, 0.015, 0.03]},
}
META = {"experiment": parse_spec(SPEC).to_dict()}


def cells_of(times: dict[str, list[float]], sessions: dict[str, list[int]] | None = None) -> dict:
    """Cells at level 16 on link l whose run i took times[strategy][i] (session 1 unless given)."""
    out = {}
    for name, values in times.items():
        cell = Cell(name, 16.0, "l", "urgent")
        cell.records = [{"run": {"repetition": i}, "completion_s": t,
                         "session": (sessions or {}).get(name, [1] * len(values))[i]} for i, t in enumerate(values)]
        cell.times = list(values)
        cell.repetitions = set(range(len(values)))
        out[cell.key] = cell
    return out


def noise(mean: float, n: int, seed: int, sd: float = 1.0) -> list[float]:
    return list(np.random.default_rng(seed).normal(mean, sd, n))


def test_a_clear_finding_is_final_at_the_first_look_and_not_tested_again():
    cells = cells_of({"fifo": noise(80, 12, 0), "prio": noise(60, 12, 1), "wfq": noise(80, 12, 2)})
    rows = sequential.look_rows(META, cells)
    pq = [r for r in rows if r["finding"].startswith("3a")]
    assert [(r["look"], r["verdict"]) for r in pq] == [(1, "reproduced")]
    wfq = [r for r in rows if r["finding"].startswith("4")]
    assert [r["look"] for r in wfq] == [1, 2, 3] and [r["alpha"] for r in wfq] == [0.005, 0.015, 0.03]
    final = {r["finding"][:2]: r for r in sequential.verdicts(META, cells)}
    assert final["3a"]["look"] == 1 and final["4."]["verdict"] == "not resolvable at n = 12"


def test_a_look_waits_for_every_cell_it_needs():
    cells = cells_of({"fifo": noise(80, 7, 0), "prio": noise(60, 7, 1), "wfq": noise(80, 3, 2)})
    rows = sequential.look_rows(META, cells)
    assert rows == []  # wfq has 3 of look 1's 4 runs: no look yet for either finding
    final = sequential.verdicts(META, cells)
    assert [r["verdict"] for r in final] == ["no look reached yet (7 runs per cell)",
                                             "no look reached yet (3 runs per cell)"]
    # The study's verdict says so too, not "not resolvable" (which is a look's verdict).
    assert [r["verdict"] for r in study_verdicts(final)] == ["no look reached yet"] * 2


def test_after_a_look_only_the_open_findings_cells_continue():
    cells = cells_of({"fifo": noise(80, 4, 0), "prio": noise(60, 4, 1), "wfq": noise(80, 4, 2)})
    assert sequential.open_cells(META, cells) == {("fifo", 16.0, "l", "urgent"), ("wfq", 16.0, "l", "urgent")}
    every = {"experiment": {**META["experiment"], "sequential": {**META["experiment"]["sequential"],
                                                                 "continue": "all"}}}
    assert len(sequential.open_cells(every, cells)) == 3


def test_the_sessions_are_compared_cell_by_cell_with_intervals():
    same = cells_of({"fifo": noise(80, 20, 3), "prio": noise(60, 20, 4)},
                    sessions={"fifo": [1] * 10 + [2] * 10, "prio": [1] * 10 + [2] * 10})
    rows = sequential.session_rows(same)
    assert [(r["strategy"], r["session_a"], r["session_b"], r["n_a"], r["n_b"]) for r in rows] == \
        [("fifo", 1, 2, 10, 10), ("prio", 1, 2, 10, 10)]
    assert not any(r["differ"] for r in rows) and all(r["ci95_low_s"] < 0 < r["ci95_high_s"] for r in rows)
    drift = cells_of({"fifo": noise(80, 10, 5, 0.5) + noise(90, 10, 6, 0.5)},
                     sessions={"fifo": [1] * 10 + [2] * 10})
    (row,) = sequential.session_rows(drift)
    assert row["differ"] and row["ci95_low_s"] < 10 < row["ci95_high_s"] and row["p_holm"] == row["welch_p"]


def test_power_is_high_for_a_clear_effect_and_near_alpha_for_none():
    source = {("fifo", 16.0): cells_of({"fifo": noise(80, 30, 7, 5)})[("fifo", 16.0, "l", "urgent")],
              ("prio", 16.0): cells_of({"prio": noise(60, 30, 8, 5)})[("prio", 16.0, "l", "urgent")],
              ("wfq", 16.0): cells_of({"wfq": noise(80, 30, 7, 5)})[("wfq", 16.0, "l", "urgent")]}
    rows = {r["finding"][:2]: r for r in simulate(META, source, simulations=200, seed=1)}
    # 20 s apart at sd 5: about half reproduced at n = 4 (alpha 0.005 over Holm's four tests),
    # nearly all by n = 8.
    assert 0.25 < rows["3a"]["reproduced_n4"] < 0.9 and rows["3a"]["reproduced_n8"] > 0.95
    # WFQ drawn from FIFO's own runs: either verdict only by chance (0.05 over the looks)
    assert rows["4."]["reproduced_n12"] + rows["4."]["not_reproduced_n12"] < 0.1
    assert rows["3a"]["not_reproduced_n12"] == 0
    p = [rows["3a"][f"reproduced_n{n}"] for n in (4, 8, 12)]
    assert p == sorted(p)  # reproduced by a look stays reproduced
    with pytest.raises(ValueError):
        simulate(META, {k: v for k, v in source.items() if k[0] != "wfq"}, simulations=10)


def test_a_run_past_the_first_look_is_needed_only_while_its_cell_is_open():
    cells = cells_of({"fifo": noise(80, 4, 0), "prio": noise(60, 4, 1), "wfq": noise(80, 4, 2)})
    prio, fifo = ("prio", 16.0, "l", "urgent"), ("fifo", 16.0, "l", "urgent")
    assert sequential.needed(META, cells, prio, 3)  # within the first look
    assert not sequential.needed(META, cells, prio, 4) and sequential.needed(META, cells, fifo, 4)
    every = {"experiment": {**META["experiment"], "sequential": {**META["experiment"]["sequential"],
                                                                 "continue": "all"}}}
    assert sequential.needed(every, cells, prio, 4)


def test_the_power_command_simulates_the_contested_design_from_committed_runs(tmp_path):
    import json
    import subprocess
    import sys
    import tarfile
    from pathlib import Path

    raw = Path(__file__).parents[2] / "qos/experiment/results/pathmaster2002-faithful/raw.tar.gz"
    with tarfile.open(raw) as tar:
        tar.extractall(tmp_path)  # the committed file
    (source,) = [p.parent for p in tmp_path.glob("*/metadata.json")]

    def power(*args):
        return subprocess.run([sys.executable, "-m", "pathmaster", "experiment", "power", "pathmaster2002-contested",
                               "--from", str(source), *args], capture_output=True, text=True, timeout=120)

    done = power("--simulations", "20", "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["finding"][:2] for r in rows] == ["2b", "3a", "3b", "4.", "5."]
    for row in rows:
        for n in (11, 22, 40):
            assert 0 <= row[f"reproduced_n{n}"] + row[f"not_reproduced_n{n}"] <= 1
    assert power("--simulations", "0").returncode == 2
    assert power("--simulations", "20", "--from", str(tmp_path / "none")).returncode == 2
