"""Where a run's packets were dropped, by place, and the mechanism claim tested on it.

The 2002 network's counters (`Testbed.bottleneck_stats`, per run as deltas in
`router_counters`) name each queue: "rA:hub/A1" is the master's card on hub A (its station),
"A1:A1-eth0" the card's kernel FIFO in front of it, "rA:hub/rA" router rA's port toward its
hosts, "core:core/rA" rA's port toward the shared segment. The routers' ports are where a
router strategy runs; the hosts' cards are where it cannot act.

The claim tested (`mechanism_tests`): a strategy at the routers shortens the case because it
protects the case's packets where it runs, i.e. the case's class loses fewer packets at the
routers' queues than under FIFO at the same level (one-sided Mann-Whitney U per strategy,
Holm-adjusted together). Raw data recorded before the per-station counters have only one
counter per medium ("rA:hub", mixing the master's card with rA's port): they are reported as
such and not tested.
"""

from __future__ import annotations

import numpy as np

PLACES = ("router port", "host card", "medium (not split)")


def place_of(key: str) -> tuple[str, str] | None:
    """(place, queue) of a `router_counters` key; None for a medium's total when its stations
    are also recorded (counted once)."""
    node, _, rest = key.partition(":")
    if "/" in rest:
        station = rest.split("/", 1)[1]
        return ("router port" if station.startswith("r") and len(station) == 2 else "host card"), key
    if rest in ("hub", "core"):
        return "medium (not split)", key
    if node == "core" or (node.startswith("r") and len(node) == 2):
        return "router port", key  # a router's kernel queue ("rA:rA-eth4", the lan network)
    return "host card", key  # a host's kernel FIFO ("A1:A1-eth0")


def drops_by_place(record: dict, klass: str) -> dict[str, int | None]:
    """One run's drops of `klass` by place (`PLACES`; None: the run recorded no queue there); a
    medium's total is left out where its stations were recorded."""
    counters = record.get("router_counters") or {}
    split = {k.split("/")[0] for k in counters if "/" in k}
    out: dict[str, int | None] = {p: None for p in PLACES}
    for key, classes in counters.items():
        if "/" not in key and key in split:
            continue
        where = place_of(key)
        c = (classes or {}).get(klass)
        if where is None or not isinstance(c, dict):
            continue
        out[where[0]] = (out[where[0]] or 0) + int(c.get("drops", 0))
    return out


def drops_by_queue(record: dict, klass: str) -> dict[str, int]:
    """One run's drops of `klass` per queue (key of `router_counters`)."""
    return {k: int((v or {}).get(klass, {}).get("drops", 0)) for k, v in (record.get("router_counters") or {}).items()
            if isinstance((v or {}).get(klass), dict)}


def place_rows(cells: dict, level: float, classes=("urgent", "bulk")) -> list[dict]:
    """Per strategy at `level`: the median per run of each class's drops at each place (nan: no
    queue recorded there)."""
    rows = []
    for key in sorted(k for k in cells if k[1] == level):
        cell = cells[key]
        if not cell.records:
            continue
        row = {"strategy": cell.strategy, "competing": level, "runs": len(cell.records)}
        for klass in classes:
            per = [drops_by_place(r, klass) for r in cell.records]
            for place in PLACES:
                seen = [p[place] for p in per if p[place] is not None]
                row[f"{klass} @ {place}"] = float(np.median(seen)) if seen else float("nan")
        rows.append(row)
    return rows


def split_counters(cells: dict) -> bool:
    """Whether the runs recorded per-station counters (else only per medium)."""
    return any("/" in k for c in cells.values() for r in c.records for k in (r.get("router_counters") or {}))


def mechanism_tests(cells: dict, level: float, case_class: str = "urgent", baseline: str = "fifo",
                    alpha: float = 0.05) -> list[dict]:
    """Does each strategy lose fewer of the case's packets at the routers' ports than `baseline`?

    One-sided Mann-Whitney U (scipy.stats.mannwhitneyu) of the per-run drops of `case_class`
    at "router port", per strategy at `level` against the baseline's, Holm-adjusted together.
    """
    from scipy import stats as sps

    from qos.experiment.findings import holm

    base = next((c for k, c in cells.items() if k[0] == baseline and k[1] == level), None)
    if base is None or not base.records:
        return []
    b = [drops_by_place(r, case_class)["router port"] or 0 for r in base.records]
    rows = []
    for key in sorted(k for k in cells if k[1] == level and k[0] != baseline):
        cell = cells[key]
        a = [drops_by_place(r, case_class)["router port"] or 0 for r in cell.records]
        if len(a) < 2 or len(b) < 2:
            continue
        p = 1.0 if max(a + b) == min(a + b) else float(sps.mannwhitneyu(a, b, alternative="less").pvalue)
        rows.append({"strategy": cell.strategy, "versus": baseline, "competing": level,
                     "median_drops": float(np.median(a)), "baseline_median_drops": float(np.median(b)), "p": p})
    for row, p in zip(rows, holm([r["p"] for r in rows])):
        row["p_holm"] = p
        row["fewer_at_routers"] = bool(p < alpha)
    return rows
