"""A sequential design's looks, and the sessions as each other's replicate.

An experiment with `[sequential]` (findings.Sequential) tests its declared findings at each
look, when every cell they need has the look's runs (repetitions 0 .. n-1, valid or not: a
run invalid on every attempt is missing, not waited for); at look k only the findings still
open are tested, at `alpha[k]`, Holm within the look (findings.evaluate). A finding's verdict
is final at the first look that resolves it ("reproduced" or "not reproduced"); otherwise it
is "not resolvable at n = N" at the last look reached. `open_cells` says which cells still
need runs after a look (`continue = "open"`).

`session_rows` compares each cell's runs of one session with another's (the runner records
the session in every run): Welch's two-sided test with its 95% interval of the difference,
Holm over the cells. The question is whether the machine kept its word between sessions;
"p > 0.05 everywhere" over ten cells would raise a false alarm 40% of the time, so the cells
are adjusted together and the intervals show how big a difference the data rule out.
"""

from __future__ import annotations

from qos.experiment.cells import Cell, cell_key, declared_findings
from qos.experiment.findings import PENDING, Finding, holm
from qos.experiment.stats import compare

RESOLVED = ("reproduced", "not reproduced")


def finding_cells(meta: dict, finding: dict) -> set[tuple]:
    """The cell keys (strategy, level, link, class) a declared finding (its dict) tests."""
    return {cell_key(meta, ref) for ref in Finding(**finding).cells()}


def through(cells: dict[tuple, Cell], n: int) -> dict[tuple, Cell]:
    """Each cell with only its valid runs of repetitions 0 .. n-1 (the data of a look at n)."""
    out = {}
    for key, cell in cells.items():
        kept = Cell(*key)
        kept.records = [r for r in cell.records if r["run"]["repetition"] < n]
        kept.times = [float(r["completion_s"]) for r in kept.records]
        out[key] = kept
    return out


def reached(cells: dict[tuple, Cell], keys: set[tuple], n: int) -> bool:
    """Whether every cell of `keys` has run repetitions 0 .. n-1 (valid, invalid or failed)."""
    return all(key in cells and set(range(n)) <= cells[key].repetitions for key in keys)


def look_rows(meta: dict, cells: dict[tuple, Cell]) -> list[dict]:
    """Every test at every look reached: declared_findings' rows plus `look` (1-based), `look_n`
    and `alpha`; at each look only the findings not resolved at an earlier one."""
    design = meta["experiment"].get("sequential")
    findings = meta["experiment"].get("findings") or []
    if not design or not findings:
        return []
    rows: list[dict] = []
    final: set[str] = set()
    for k, (n, alpha) in enumerate(zip(design["looks"], design["alpha"]), start=1):
        still = [f for f in findings if f["name"] not in final]
        if not still or not reached(cells, set().union(*(finding_cells(meta, f) for f in still)), n):
            break
        for row in declared_findings(meta, through(cells, n), alpha=alpha, findings=still):
            rows.append(row | {"look": k, "look_n": n, "alpha": alpha})
            if row["verdict"] in RESOLVED:
                final.add(row["finding"])
    return rows


def verdicts(meta: dict, cells: dict[tuple, Cell], rows: list[dict] | None = None) -> list[dict]:
    """One row per declared finding: its verdict at the first look that resolved it, or its
    last look's row ("not resolvable at n = N"); a finding no look has reached yet gets
    "no look reached yet" and the runs per cell so far. `rows`: look_rows(meta, cells) if
    already made."""
    rows = look_rows(meta, cells) if rows is None else rows
    out = []
    for f in meta["experiment"].get("findings") or []:
        mine = [r for r in rows if r["finding"] == f["name"]]
        resolved = [r for r in mine if r["verdict"] in RESOLVED]
        if resolved or mine:
            out.append(resolved[0] if resolved else mine[-1])
        else:
            keys = finding_cells(meta, f)
            n = min((len(cells[k].repetitions) if k in cells else 0) for k in keys)
            out.append({"finding": f["name"], "study": Finding(**f).group,
                        "claim": f["claim"], "statistic": f.get("statistic", "mean"), "n": n,
                        "verdict": f"{PENDING} ({n} runs per cell)"})
    return out


def open_cells(meta: dict, cells: dict[tuple, Cell]) -> set[tuple]:
    """The cells still needing runs: with `continue = "open"`, those of findings no look has
    resolved; otherwise every cell of every finding."""
    design = meta["experiment"].get("sequential") or {}
    findings = meta["experiment"].get("findings") or []
    resolved = {r["finding"] for r in look_rows(meta, cells) if r["verdict"] in RESOLVED}
    keep = [f for f in findings if design.get("continue", "open") == "all" or f["name"] not in resolved]
    return set().union(*(finding_cells(meta, f) for f in keep)) if keep else set()


def deciding_look(design: dict | None, repetition: int) -> int | None:
    """The 1-based look of a `[sequential]` design (its dict) whose runs include `repetition`
    (0-based), when the looks before it can hold such a run back; None within the first look,
    with `continue = "all"`, or without a design."""
    if not design or design.get("continue", "open") == "all" or repetition < design["looks"][0]:
        return None
    return next(k for k, n in enumerate(design["looks"], start=1) if repetition < n)


def needed(meta: dict, cells: dict[tuple, Cell], cell: tuple, repetition: int) -> bool:
    """Whether a run of `cell` (strategy, level, link, class) at `repetition` (0-based) is still
    wanted: always within the first look, and with `continue = "all"`; past the first look with
    `continue = "open"`, only while a finding the cell serves is unresolved by the looks reached
    in `cells` (the runs so far)."""
    if deciding_look(meta["experiment"].get("sequential"), repetition) is None:
        return True
    return cell in open_cells(meta, cells)


SESSION_COLUMNS = ["strategy", "competing", "session_a", "session_b", "n_a", "n_b", "mean_a_s", "mean_b_s",
                   "diff_s", "ci95_low_s", "ci95_high_s", "welch_p", "p_holm", "differ"]


def session_rows(cells: dict[tuple, Cell], alpha: float = 0.05) -> list[dict]:
    """Each cell's later sessions against its first: Welch's two-sided test and its 95%
    interval of the difference of means (b - a), the p-values Holm-adjusted over every row;
    `differ` when the adjusted p < alpha. Cells with fewer than 2 valid runs in a session are left out."""
    rows = []
    for key in sorted(cells):
        by_session: dict[int, list[float]] = {}
        for rec in cells[key].records:
            by_session.setdefault(int(rec.get("session") or 0), []).append(float(rec["completion_s"]))
        sessions = sorted(s for s, t in by_session.items() if len(t) >= 2)
        for later in sessions[1:]:
            a, b = by_session[sessions[0]], by_session[later]
            c = compare(b, a, alpha=alpha)
            rows.append({"strategy": key[0], "competing": key[1], "session_a": sessions[0], "session_b": later,
                         "n_a": len(a), "n_b": len(b), "mean_a_s": sum(a) / len(a), "mean_b_s": sum(b) / len(b),
                         "diff_s": c.diff, "ci95_low_s": c.ci_low, "ci95_high_s": c.ci_high, "welch_p": c.p})
    for row, p in zip(rows, holm([r["welch_p"] for r in rows])):
        row["p_holm"] = p
        row["differ"] = bool(p < alpha)
    return rows
