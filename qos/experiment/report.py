"""Tables from an experiment's raw data: per-cell statistics, the study's Table 1, significance.

Everything here is computed from OUT/runs/*.json and OUT/metadata.json, nothing else, so a
report can be made again at any time, on any machine. Writes into OUT/report/:

    summary.csv / summary.md     one row per matrix cell: n, mean, std, CV, median, p95,
                                 95% CI, and the same time as a ratio to each run's bound
    table1.md                    like the study's Table 1: mean (std) per strategy and level
    significance.csv / .md       every pair of strategies at every level: Welch's t-test and
                                 a bootstrap interval; which differences are not significant
    *.png, *.svg                 the figures (see plots.py)
"""

from __future__ import annotations

import csv
import itertools
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pathmaster.records import InvalidInput
from qos.experiment.stats import Summary, compare, summarise
from qos.experiment.store import Store


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
    failed: int = 0

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
        if not rec.get("ok"):
            cell.failed += 1
            continue
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
    return meta, cells


def strategy_order(meta: dict) -> list[str]:
    """Strategies in the order the experiment file lists them."""
    return [s["name"] for s in meta["experiment"]["strategies"]]


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


SUMMARY_COLUMNS = [
    "strategy", "competing", "link", "request_class", "n", "failed",
    "mean_s", "std_s", "cv", "median_s", "p95_s", "ci95_low_s", "ci95_high_s",
    "bound_mean_s", "ratio_mean", "ratio_std", "ratio_median", "ratio_p95",
    "competing_achieved_kbit", "case_throughput_kbit",
]


def summary_rows(meta: dict, cells: dict[tuple, Cell]) -> list[dict]:
    """One row per cell with the statistics of its times and of their ratio to the bound."""
    order = {name: i for i, name in enumerate(strategy_order(meta))}
    rows = []
    for key in sorted(cells, key=lambda k: (k[2], k[3], order.get(k[0], 99), k[1])):
        cell = cells[key]
        row = {"strategy": cell.strategy, "competing": cell.competing, "link": cell.link,
               "request_class": cell.request_class, "n": len(cell.times), "failed": cell.failed}
        if cell.times:
            s = summarise(cell.times)
            r = summarise(cell.ratios)
            row |= {"mean_s": s.mean, "std_s": s.std, "cv": s.cv, "median_s": s.median, "p95_s": s.p95,
                    "ci95_low_s": s.ci_low, "ci95_high_s": s.ci_high, "bound_mean_s": _mean(cell.bounds),
                    "ratio_mean": r.mean, "ratio_std": r.std, "ratio_median": r.median, "ratio_p95": r.p95,
                    "competing_achieved_kbit": _mean(cell.achieved_kbit),
                    "case_throughput_kbit": _mean(cell.throughput_kbit)}
        rows.append(row)
    return rows


def significance_rows(meta: dict, cells: dict[tuple, Cell], alpha: float = 0.05) -> list[dict]:
    """Every pair of strategies within each (level, link, class): is their mean time different?"""
    order = strategy_order(meta)
    groups: dict[tuple, dict[str, Cell]] = defaultdict(dict)
    for (strategy, level, link, cls), cell in cells.items():
        groups[(link, cls, level)][strategy] = cell
    rows = []
    for (link, cls, level) in sorted(groups):
        present = [s for s in order if s in groups[(link, cls, level)]]
        for a, b in itertools.combinations(present, 2):
            ta, tb = groups[(link, cls, level)][a].times, groups[(link, cls, level)][b].times
            if len(ta) < 2 or len(tb) < 2:
                continue
            c = compare(ta, tb, alpha=alpha)
            rows.append({"link": link, "request_class": cls, "competing": level, "a": a, "b": b,
                         "mean_a_s": float(np.mean(ta)), "mean_b_s": float(np.mean(tb)), "diff_s": c.diff,
                         "welch_t": c.t, "welch_p": c.p, "boot_low_s": c.boot_low, "boot_high_s": c.boot_high,
                         "significant": c.significant})
    return rows


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    """A GitHub-flavoured Markdown table of `rows` restricted to `columns`."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def table1(meta: dict, cells: dict[tuple, Cell]) -> str:
    """The study's Table 1 layout: rows = competing level, columns = strategy, 'mean (std)' seconds.

    One table per (link, request class); a second line per level gives the mean ratio to the bound.
    """
    unit = "streams" if meta["experiment"]["competing"]["kind"] == "downloads" else "kbit/s"
    order = strategy_order(meta)
    parts = []
    for link, cls in sorted({(k[2], k[3]) for k in cells}):
        levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
        present = [s for s in order if any((s, lv, link, cls) in cells for lv in levels)]
        header = [f"competing ({unit})", "achieved kbit/s"] + present
        lines = [f"### link {link}, class {cls}: completion time, mean (std) s; [mean ratio to bound]", "",
                 "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for lv in levels:
            achieved = [v for s in present for v in cells.get((s, lv, link, cls), Cell(s, lv, link, cls)).achieved_kbit]
            row = [f"{lv:g}", _fmt(_mean(achieved), 4)]
            for s in present:
                cell = cells.get((s, lv, link, cls))
                if cell is None or not cell.times:
                    row.append("-")
                    continue
                sm: Summary = summarise(cell.times)
                fail = f" ({cell.failed} failed)" if cell.failed else ""
                row.append(f"{sm.mean:.2f} ({_fmt(sm.std, 2)}) [{_mean(cell.ratios):.2f}]{fail}")
            lines.append("| " + " | ".join(row) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def write_report(out_dir: str | Path, plots: bool = True) -> Path:
    """Write every table (and, with `plots`, every figure) into OUT/report/; returns that folder."""
    meta, cells = load_cells(out_dir)
    report_dir = Path(out_dir) / "report"
    report_dir.mkdir(exist_ok=True)
    summary = summary_rows(meta, cells)
    write_csv(report_dir / "summary.csv", summary, SUMMARY_COLUMNS)
    sig = significance_rows(meta, cells)
    sig_columns = list(sig[0]) if sig else ["link", "request_class", "competing", "a", "b"]
    write_csv(report_dir / "significance.csv", sig, sig_columns)
    (report_dir / "table1.md").write_text(table1(meta, cells))

    name = meta["experiment"]["name"]
    env = meta.get("environment", {})
    not_sig = [r for r in sig if not r["significant"]]
    text = [
        f"# Experiment `{name}`", "",
        meta["experiment"].get("description", ""), "",
        f"- runs: {sum(len(c.times) for c in cells.values())} ok, {sum(c.failed for c in cells.values())} failed; "
        f"started {meta.get('started')}, finished {meta.get('finished', 'not yet')}",
        f"- kernel {env.get('kernel')}, git {env.get('git_commit')}, seed {meta.get('seed')}", "",
        "## Table 1", "", table1(meta, cells),
        "## Every cell", "", markdown_table(summary, SUMMARY_COLUMNS[:16]), "",
        "## Differences that are not significant", "",
        f"Welch's t-test (p < 0.05) and a 95% bootstrap interval of the difference of means must both "
        f"exclude 'no difference'. {len(not_sig)} of {len(sig)} pairs do not:", "",
        markdown_table(not_sig, ["link", "request_class", "competing", "a", "b", "diff_s", "welch_p",
                                 "boot_low_s", "boot_high_s"]) if not_sig else "(none)", "",
    ]
    if plots:
        from qos.experiment.plots import write_figures

        figures = write_figures(meta, cells, report_dir)
        text += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures if p.suffix == ".png"]
    (report_dir / "report.md").write_text("\n".join(text) + "\n")
    return report_dir
