"""An experiment's runs by matrix cell, and its declared findings tested on them.

The layer under the report, the sequential looks and the power simulation: `load_cells`
reads OUT/runs/*.json into one `Cell` per (strategy, level, link, class), keeping valid,
invalid and failed runs apart, and `declared_findings` tests findings on cells
(qos/experiment/findings.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pathmaster.records import InvalidInput
from qos.experiment.store import Store
from qos.predict import absolute_percentage_error


@dataclass
class Cell:
    """The runs of one matrix cell (strategy, competing level, link, request class)."""

    strategy: str
    competing: float
    link: str
    request_class: str
    times: list[float] = field(default_factory=list)  # completion, seconds, successful runs
    ratios: list[float] = field(default_factory=list)  # completion / lower bound
    bounds: list[float] = field(default_factory=list)
    achieved_kbit: list[float] = field(default_factory=list)  # competing traffic actually carried
    throughput_kbit: list[float] = field(default_factory=list)  # case bytes / completion time
    errors: list[float] = field(default_factory=list)  # |predicted - actual| / actual, runs with a prediction
    unpredicted: int = 0  # successful runs without a prediction (the predictor had not seen the path yet)
    failed: int = 0
    invalid: int = 0  # runs whose emulator fell behind past the bound on every attempt (kept apart)
    reruns: int = 0  # attempts judged invalid and run again
    records: list[dict] = field(default_factory=list, repr=False)  # the valid runs' raw records
    repetitions: set[int] = field(default_factory=set)  # every repetition run (valid, invalid or failed)

    @property
    def key(self) -> tuple:
        return (self.strategy, self.competing, self.link, self.request_class)


def load_cells(out_dir: str | Path) -> tuple[dict, dict[tuple, Cell]]:
    """The metadata and the runs grouped by matrix cell."""
    store = Store(out_dir)
    meta = store.metadata()
    records = store.load_runs()
    if not records:
        raise InvalidInput("no runs yet in runs/: nothing to report", store.root)
    cells: dict[tuple, Cell] = {}
    for rec in records:
        run = rec["run"]
        key = (run["strategy"], float(run["competing"]), run["link"], run["request_class"])
        cell = cells.setdefault(key, Cell(*key))
        cell.repetitions.add(int(run["repetition"]))
        cell.reruns += int(rec.get("attempt", 1)) - 1
        if not (rec.get("fidelity") or {}).get("valid", True):
            cell.invalid += 1
            continue
        if not rec.get("ok"):
            cell.failed += 1
            continue
        cell.records.append(rec)
        t = float(rec["completion_s"])
        cell.times.append(t)
        bound = float(rec["bound"]["total_s"])
        cell.bounds.append(bound)
        cell.ratios.append(t / bound)
        achieved = rec.get("competing", {}).get("achieved_kbit")
        if achieved is not None:
            cell.achieved_kbit.append(float(achieved))
        case_bytes = rec.get("bytes_up", 0) + rec.get("bytes_down", 0)
        cell.throughput_kbit.append(case_bytes * 8 / 1000 / t)
        if rec.get("predicted_s"):
            cell.errors.append(absolute_percentage_error(float(rec["predicted_s"]), t))
        else:
            cell.unpredicted += 1
    return meta, cells


def cell_key(meta: dict, ref, level: float | None = None) -> tuple:
    """The cell key (strategy, level, link, class) a finding's cell reference (findings.CellRef)
    names in experiment `meta`, at `level` instead of its own if given: the experiment's first
    link and class where the reference leaves them out."""
    return (ref.strategy, float(ref.level if level is None else level),
            ref.link or meta["experiment"]["links"][0]["name"],
            ref.request_class or meta["experiment"]["request_classes"][0])


def declared_findings(meta: dict, cells: dict[tuple, Cell], alpha: float = 0.05,
                      findings: list[dict] | None = None) -> list[dict]:
    """The experiment file's `[[findings]]` (or `findings`, declared elsewhere), each tested on its
    cells, Holm-adjusted together (qos/experiment/findings.py); [] when none are declared."""
    from qos.experiment.findings import Finding, Pair, evaluate

    declared = [Finding(**f) for f in (meta["experiment"].get("findings", []) if findings is None else findings)]
    if not declared:
        return []

    def times(ref, level=None) -> np.ndarray:
        cell = cells.get(cell_key(meta, ref, level))
        return np.asarray(cell.times if cell else [], float)

    def pairs(f) -> list:
        base = f.change_from
        return [Pair(times(f.a), times(b), None if base is None else times(f.a, base),
                     None if base is None else times(b, base)) for b in f.others]

    return evaluate(declared, [pairs(f) for f in declared], alpha=alpha, seed=int(meta.get("seed") or 0))
