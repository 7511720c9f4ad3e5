"""The power of an experiment's sequential design, by simulation from committed cells' own runs.

Each simulated experiment draws every cell's runs with replacement from that cell's completion
times in a committed raw folder (so the cells keep their own spread and skew, and the effects
the committed data show are taken as true), then tests the declared findings at the design's
looks exactly as the report does (sequential.look_rows: only open findings at each look, Holm
within it). Power of a finding at look k: the share of simulated experiments in which it was
resolved (reproduced, or its opposite shown) at look k or before. No library simulates a Holm-within-look, alpha-split design
over intersection-union claims, hence this module.
"""

from __future__ import annotations

import numpy as np

from qos.experiment.cells import Cell, load_cells
from qos.experiment.sequential import finding_cells, look_rows

MAX_SIMULATIONS = 100_000


def simulate(meta: dict, source: dict[tuple, Cell], simulations: int = 1000, seed: int = 0) -> list[dict]:
    """Per declared finding of `meta` (an experiment's to_dict() as `meta["experiment"]`): the
    share of `simulations` experiments that had reproduced it by each look's n
    (`reproduced_nN`), and that had resolved it the other way (`not_reproduced_nN`); their sum
    is the design's power to settle the finding by then.

    `source`: committed cells by (strategy, level) (link and class are the design's); each
    cell a finding needs must have at least 2 valid runs there.
    """
    if not 1 <= simulations <= MAX_SIMULATIONS:
        raise ValueError(f"simulations must be 1..{MAX_SIMULATIONS}, got {simulations}")
    design = meta["experiment"]["sequential"]
    findings = meta["experiment"]["findings"]
    looks = design["looks"]
    verdicts = ("reproduced", "not reproduced")
    needed = set().union(*(finding_cells(meta, f) for f in findings))
    pools = {}
    for key in needed:
        cell = source.get(key[:2])
        if cell is None or len(cell.times) < 2:
            raise ValueError(f"the committed data have no cell {key[0]}@{key[1]:g} with 2 or more valid runs")
        pools[key] = np.asarray(cell.times, float)
    rng = np.random.default_rng(seed)
    resolved = {(f["name"], v): np.zeros(len(looks), int) for f in findings for v in verdicts}
    for _ in range(simulations):
        cells = {}
        for key, pool in pools.items():
            cell = Cell(*key)
            draw = rng.choice(pool, size=looks[-1], replace=True)
            cell.records = [{"run": {"repetition": i}, "completion_s": float(t)} for i, t in enumerate(draw)]
            cell.times = [float(t) for t in draw]
            cell.repetitions = set(range(looks[-1]))
            cells[key] = cell
        for row in look_rows(meta, cells):
            if row["verdict"] in verdicts:
                resolved[row["finding"], row["verdict"]][row["look"] - 1:] += 1
    return [{"finding": f["name"],
             **{f"{v.replace(' ', '_')}_n{n}": float(resolved[f["name"], v][k]) / simulations
                for v in verdicts for k, n in enumerate(looks)}}
            for f in findings]


def committed_cells(folder) -> dict[tuple, Cell]:
    """A committed raw folder's cells by (strategy, level)."""
    _, cells = load_cells(folder)
    return {key[:2]: cell for key, cell in cells.items()}
