"""Tables from an experiment's raw data: per-cell statistics, the study's Table 1, significance.

Everything here is computed from OUT/runs/*.json and OUT/metadata.json, nothing else, so a
report can be made again at any time, on any machine. Writes into OUT/report/:

    summary.csv / summary.md     one row per matrix cell: n, mean, std, CV, median, p95,
                                 95% CI, and the same time as a ratio to each run's bound
    table1.md                    like the study's Table 1: mean (std) per strategy and level
    significance.csv / .md       every pair of strategies at every level: Welch's t-test and
                                 a bootstrap interval; which differences are not significant
    prediction.csv               the prediction's median absolute percentage error (MdAPE) per
                                 strategy and overall, from each run's predicted and actual time
    *.png, *.svg                 the figures (see plots.py)
"""

from __future__ import annotations

import csv
import itertools
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from qos.experiment import sequential
from qos.experiment.cells import Cell, declared_findings, load_cells
from qos.experiment.spec import competing_unit
from qos.experiment.stats import Summary, compare, summarise
from qos.experiment.store import Store


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


PREDICTION_COLUMNS = ["strategy", "runs", "predicted", "mdape", "ape_p90"]


def prediction_rows(meta: dict, cells: dict[tuple, Cell]) -> list[dict]:
    """The prediction's error per strategy and over every run ("all"): how many runs had a
    prediction, the median absolute percentage error (MdAPE) and its 90th percentile, as
    fractions (0.1 = 10%). Strategies without any prediction (older raw data) have none."""
    order = strategy_order(meta)
    by_strategy: dict[str, list[Cell]] = defaultdict(list)
    for cell in cells.values():
        by_strategy[cell.strategy].append(cell)

    def row(name: str, group: list[Cell]) -> dict:
        errors = [e for c in group for e in c.errors]
        return {"strategy": name, "runs": sum(len(c.times) for c in group), "predicted": len(errors),
                "mdape": float(np.median(errors)) if errors else float("nan"),
                "ape_p90": float(np.percentile(errors, 90)) if errors else float("nan")}

    rows = [row(name, by_strategy[name]) for name in sorted(by_strategy, key=lambda n: (order.index(n) if n in order else 99, n))]
    rows.append(row("all", list(cells.values())))
    return rows


def significance_rows(meta: dict, cells: dict[tuple, Cell], alpha: float = 0.05) -> list[dict]:
    """Every pair of strategies within each (level, link, class): is their mean time different?

    Welch's two-sided test per pair with its t-interval of the difference; the p-values of the
    whole table are one family, Holm-adjusted (`findings.holm`), and `significant` is the
    adjusted p < alpha. The table is exploratory: the declared findings are the confirmatory tests.
    """
    from qos.experiment.findings import holm

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
                         "n_a": len(ta), "n_b": len(tb),
                         "mean_a_s": float(np.mean(ta)), "mean_b_s": float(np.mean(tb)), "diff_s": c.diff,
                         "ci95_low_s": c.ci_low, "ci95_high_s": c.ci_high, "welch_t": c.t, "welch_p": c.p})
    for row, p in zip(rows, holm([r["welch_p"] for r in rows])):
        row["p_holm"] = p
        row["significant"] = bool(p < alpha)
    return rows


def _fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
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


def _grid(meta: dict, cells: dict[tuple, Cell], title: str, value) -> str:
    """One Markdown table per (link, class): rows = competing level, columns = strategy, `value(cell)`."""
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    order = strategy_order(meta)
    parts = []
    for link, cls in sorted({(k[2], k[3]) for k in cells}):
        levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
        present = [s for s in order if any((s, lv, link, cls) in cells for lv in levels)]
        header = [f"competing ({unit})"] + present
        lines = [f"### {title}: link {link}, class {cls}", "",
                 "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for lv in levels:
            row = [f"{lv:g}"]
            for s in present:
                cell = cells.get((s, lv, link, cls))
                row.append(value(cell) if cell is not None and cell.times else "-")
            lines.append("| " + " | ".join(row) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def table1(meta: dict, cells: dict[tuple, Cell]) -> str:
    """The study's Table 1 layout: rows = competing level, columns = strategy, 'mean (std)' seconds,
    with [the mean ratio to the lower bound]; then the competing traffic each cell let through."""

    def timing(cell: Cell) -> str:
        sm: Summary = summarise(cell.times)
        fail = f" ({cell.failed} failed)" if cell.failed else ""
        return f"{sm.mean:.2f} ({_fmt(sm.std, 2)}) [{_mean(cell.ratios):.2f}]{fail}"

    return (_grid(meta, cells, "completion time, mean (std) s [mean ratio to bound]", timing) + "\n"
            + _grid(meta, cells, "competing traffic achieved during the cases, mean kbit/s",
                    lambda c: _fmt(_mean(c.achieved_kbit), 4)))


def links_table(meta: dict, cells: dict[tuple, Cell]) -> str:
    """With several link settings (e.g. a delay sweep): rows = link, columns = (strategy, level, class);
    each entry 'mean (std) s, effective case throughput kbit/s, [mean ratio to bound]'."""
    links = [item["name"] for item in meta["experiment"]["links"]]
    columns = sorted({(k[0], k[1], k[3]) for k in cells},
                     key=lambda c: (strategy_order(meta).index(c[0]) if c[0] in strategy_order(meta) else 99, c[1], c[2]))
    header = ["link", "core kbit/s", "one-way delay ms", "MTU"] + [f"{st} {lv:g} {cls}" for st, lv, cls in columns]
    lines = ["### completion time per link setting: mean (std) s, case throughput kbit/s, [ratio to bound]", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    settings = {item["name"]: item for item in meta["experiment"]["links"]}
    for name in links:
        link = settings[name]
        row = [name, f"{link['core_kbit']:g}", f"{link['delay_ms']:g}", str(link["mtu"])]
        for st, lv, cls in columns:
            cell = cells.get((st, lv, name, cls))
            if cell is None or not cell.times:
                row.append("-")
                continue
            sm = summarise(cell.times)
            row.append(f"{sm.mean:.2f} ({_fmt(sm.std, 2)}), {_mean(cell.throughput_kbit):.0f}, "
                       f"[{_mean(cell.ratios):.2f}]")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


DECLARED_COLUMNS = ["finding", "claim", "statistic", "n", "versus", "a", "b", "effect_s", "ratio", "p", "p_holm",
                    "p_opposite_holm", "verdict"]
VERDICT_COLUMNS = ["study", "verdict", "parts"]


def write_report(out_dir: str | Path, plots: bool = True, findings_from=None) -> Path:
    """Write every table (and, with `plots`, every figure) into OUT/report/; returns that folder.

    `findings_from`: an experiment (qos.experiment.spec.Experiment) whose `[[findings]]` are
    tested instead of those the raw data's metadata declares; the report then says they were
    declared after these data were collected (a re-analysis, not a confirmatory test).
    """
    meta, cells = load_cells(out_dir)
    report_dir = Path(out_dir) / "report"
    report_dir.mkdir(exist_ok=True)
    summary = summary_rows(meta, cells)
    write_csv(report_dir / "summary.csv", summary, SUMMARY_COLUMNS)
    sig = significance_rows(meta, cells)
    sig_columns = list(sig[0]) if sig else ["link", "request_class", "competing", "a", "b"]
    write_csv(report_dir / "significance.csv", sig, sig_columns)
    prediction = prediction_rows(meta, cells)
    write_csv(report_dir / "prediction.csv", prediction, PREDICTION_COLUMNS)
    several_links = len(meta["experiment"]["links"]) > 1
    table = links_table(meta, cells) if several_links else table1(meta, cells)
    (report_dir / "table1.md").write_text(table)
    later = None if findings_from is None else [f.model_dump() for f in findings_from.findings]
    is_sequential = later is None and bool(meta["experiment"].get("sequential"))
    look_tests = sequential.look_rows(meta, cells) if is_sequential else []
    declared = sequential.verdicts(meta, cells, look_tests) if is_sequential else declared_findings(meta, cells, findings=later)
    if declared:
        write_csv(report_dir / "findings.csv", declared, DECLARED_COLUMNS)
    name = meta["experiment"]["name"]
    env = meta.get("environment", {})
    text = [
        f"# Experiment `{name}`", "",
        meta["experiment"].get("description", ""), "",
        f"- runs: {sum(len(c.times) for c in cells.values())} ok, {sum(c.failed for c in cells.values())} failed, "
        f"{sum(c.invalid for c in cells.values())} invalid (emulator behind its bound, kept apart), "
        f"{sum(c.reruns for c in cells.values())} re-runs; "
        f"started {meta.get('started')}, finished {meta.get('finished', 'not yet')}",
        f"- kernel {env.get('kernel')}, git {env.get('git_commit')}, seed {meta.get('seed')}, "
        f"order {meta['experiment'].get('order', 'shuffled')}", "",
        "## Table 1", "", table,
        *(_sequential_section(meta, declared, look_tests) if is_sequential
          else _findings_section(meta, cells, declared, later is not None)),
        *_sessions_section(cells),
        *fidelity_section(cells),
        *mechanism_section(meta, cells),
        "## Prediction error", "",
        "Each case's time as predicted before it was sent (the coordinator's passive model, "
        "qos.predict, one per strategy) against its actual time: median absolute percentage error "
        "(mdape) and its 90th percentile (ape_p90), as fractions; `predicted` counts the runs that "
        "had a prediction (a path's first case has none).", "",
        markdown_table(prediction, PREDICTION_COLUMNS), "",
        "## Every cell", "", "95% t-interval of the mean (ci95_low_s .. ci95_high_s).", "",
        markdown_table(summary, SUMMARY_COLUMNS[:16]), "",
        *_significance_section(sig),
    ]
    if plots:
        from qos.experiment.plots import write_figures

        figures = write_figures(meta, cells, report_dir, records=Store(out_dir).load_runs())
        text += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in figures if p.suffix == ".png"]
    (report_dir / "report.md").write_text("\n".join(text) + "\n")
    return report_dir


def _findings_section(meta: dict, cells: dict[tuple, Cell], declared: list[dict], after: bool) -> list[str]:
    """The findings: one verdict per study finding and its parts' tests; the study's statements
    are judged only by these tests (none where the experiment declares none)."""
    from qos.experiment.findings import study_verdicts

    if not declared:
        return ["## Findings", "",
                "This experiment declares no findings, so none is tested (the pairwise table below is "
                "exploratory). `pathmaster experiment report OUT --findings FILE` tests a file's declared "
                "findings on these data, as a re-analysis.", ""]
    when = ("declared AFTER these data were collected (for the re-run; on these data a re-analysis, "
            "not a confirmatory test)" if after else "declared in the experiment file before the run")
    return [
        "## Findings: one verdict each", "",
        f"The study's findings as tests, {when} (qos/experiment/findings.py). A finding of several parts "
        "is reproduced when every part is, not reproduced when any part is.", "",
        markdown_table(study_verdicts(declared), VERDICT_COLUMNS), "",
        "### The tests", "",
        f"Welch's one-sided t-test for means (a change of means: Welch's t of the difference of differences), "
        f"Brown-Forsythe for spread, equivalence (TOST) for 'alike'; against several cells every comparison "
        f"must hold (the largest p). The {len(declared)} claims and every comparison's opposite are adjusted "
        f"together by Holm's method (alpha 0.05). a, b: the statistic of a and of the binding other cell "
        f"(`versus`); effect_s = a - b in seconds.", "",
        markdown_table(declared, DECLARED_COLUMNS), ""]


LOOK_COLUMNS = ["finding", "look", "look_n", "alpha", "n", "versus", "a", "b", "effect_s", "p", "p_holm",
                "p_opposite_holm", "verdict"]


def _sequential_section(meta: dict, final: list[dict], rows: list[dict]) -> list[str]:
    """A sequential design's findings: one verdict each (`final`, at the first look that
    resolved it), then every look's tests (`rows`, sequential.look_rows)."""
    from qos.experiment.findings import study_verdicts

    design = meta["experiment"]["sequential"]
    looks = ", ".join(f"{n} runs per cell at alpha {a:g}" for n, a in zip(design["looks"], design["alpha"]))
    return [
        "## Findings: one verdict each, at declared looks", "",
        f"The findings declared in the experiment file before the first run, tested at its looks ({looks}; "
        f"Holm within a look over the findings still open and every comparison's opposite; the looks' alphas "
        f"add up to {sum(design['alpha']):g}). A verdict is final at the first look that resolves it; after a "
        f"look, {'only the cells of open findings get more runs' if design.get('continue', 'open') == 'open' else 'every cell gets more runs'}.",
        "", markdown_table(study_verdicts(final), VERDICT_COLUMNS), "",
        markdown_table(final, LOOK_COLUMNS), "",
        "### Every look's tests", "",
        markdown_table(rows, LOOK_COLUMNS) if rows else "(no look reached yet)", ""]


def _sessions_section(cells: dict[tuple, Cell]) -> list[str]:
    """The sessions as each other's replicate (sequential.session_rows), when there are two."""
    rows = sequential.session_rows(cells)
    if not rows:
        return []
    differ = [r for r in rows if r["differ"]]
    return [
        "## The sessions as each other's replicate", "",
        f"Each cell's runs of a later session against its first session's: Welch's two-sided test and the 95% "
        f"interval of the difference of means (later - first), Holm over the {len(rows)} cells. "
        f"{len(differ)} of {len(rows)} differ after adjustment.", "",
        markdown_table(rows, sequential.SESSION_COLUMNS), ""]


def _significance_section(sig: list[dict]) -> list[str]:
    not_sig = [r for r in sig if not r["significant"]]
    return [
        "## Pairwise differences (exploratory)", "",
        f"Every pair of strategies at every level: Welch's two-sided test, the {len(sig)} p-values "
        f"Holm-adjusted as one family (significance.csv: p, p_holm and the 95% Welch t-interval of the "
        f"difference). {len(not_sig)} of {len(sig)} pairs are not significant after adjustment:", "",
        markdown_table(not_sig, ["link", "request_class", "competing", "a", "b", "diff_s", "ci95_low_s",
                                 "ci95_high_s", "welch_p", "p_holm"]) if not_sig else "(none)", ""]


def mechanism_section(meta: dict, cells: dict[tuple, Cell]) -> list[str]:
    """Drops by place at the highest level and the mechanism claims tested on them
    (qos/experiment/mechanism.py)."""
    from qos.experiment import mechanism

    return mechanism.report_lines(meta, cells, markdown_table)


def fidelity_section(cells: dict[tuple, Cell]) -> list[str]:
    """Per cell: the emulator's lateness and the machine's load during its runs (runs with a
    fidelity record only); says so when the raw data predate the record."""
    rows = []
    for key in sorted(cells):
        cell = cells[key]
        fid = [r["fidelity"] for r in cell.records if r.get("fidelity")]
        if not fid:
            continue
        late = [(f.get("emulator") or {}).get("lateness_s") or {} for f in fid]
        mach = [f["machine"] for f in fid]

        def med(values):
            values = [v for v in values if v is not None]
            return float(np.median(values)) if values else float("nan")

        rows.append({"strategy": cell.strategy, "competing": cell.competing, "runs": len(fid),
                     "invalid": cell.invalid, "reruns": cell.reruns,
                     "lateness_p99_ms": 1000 * med([x.get("p99") for x in late]),
                     "lateness_max_ms": 1000 * max([x.get("max") or 0 for x in late]),
                     "nfqueue_drops": sum((f.get("emulator") or {}).get("nfqueue_drops_total", 0) for f in fid),
                     "cpu_busy": med([m.get("cpu_busy") for m in mach]),
                     "cpu_steal": med([m.get("cpu_steal") for m in mach]),
                     "loadavg": med([m.get("loadavg_1m_end") for m in mach])})
    head = ["## Fidelity", ""]
    if not rows:
        return head + ["These raw data predate the per-run fidelity record (emulator lateness, NFQUEUE drops, "
                       "CPU load and steal): how late the emulator was, and how loaded the machine, during "
                       "these runs is unknown.", ""]
    columns = list(rows[0])
    return head + ["Per cell, the median over its runs of the emulator's p99 release lateness, the worst "
                   "release, NFQUEUE drops (sum), and the machine's CPU busy and steal fractions and load "
                   "average (qos/experiment/fidelity.py). Invalid runs are not in any other table.", "",
                   markdown_table(rows, columns), ""]
