"""Findings declared in the experiment file before the run, tested with Holm's correction.

A finding is a claim about one statistic of completion time, of one cell against one or
several others:

    [[findings]]
    name = "2a. FIFO degrades most"      # "2a": part of the study's finding 2 (one verdict per finding)
    claim = "greater"            # less | greater | alike (within `margin` of b's statistic)
    statistic = "mean"           # mean | median | p95 | std | spread
    change_from = 0              # mean only: each cell's change of the mean from this level
    a = { strategy = "fifo", level = 16 }             # optional: link, request_class
    b = [{ strategy = "prio", level = 16 }, { strategy = "wfq", level = 16 }]   # a list: against each

Tests (scipy.stats): a mean is Welch's one-sided t-test (a change of means: Welch's t of the
difference of differences, `change_less_p`); "spread" is the Brown-Forsythe test
(`brown_forsythe_less_p`, the one-sided form of levene(center='median')); median, p95 and std
are permutation tests of the difference of that statistic; "alike" is the two one-sided tests
of equivalence (TOST) with the margin. Against a list of cells the claim must hold against
each (an intersection-union test: the largest p). The claims and every comparison's opposite
are adjusted together by Holm's step-down method (`holm`), so the chance of any false verdict
either way stays at `alpha`.

Verdicts: "reproduced" (adjusted p < alpha), "not reproduced" (the opposite of a comparison
is itself significant after adjustment; for "alike", the difference is significantly larger
than the margin), otherwise "not resolvable at n = N". `study_verdicts` joins the parts of
one study finding ("2a", "2b") into its one verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from pydantic import Field, field_validator, model_validator

from qos.config import FileModel, Seq, one_of

CLAIMS = ("less", "greater", "alike")
STATISTICS = ("mean", "median", "p95", "std", "spread")
PERMUTATIONS = 9999
_STATISTIC: dict[str, Callable] = {
    "mean": np.mean, "median": np.median,
    "p95": lambda x, axis=-1: np.percentile(x, 95, axis=axis),
    "std": lambda x, axis=-1: np.std(x, ddof=1, axis=axis),
    "spread": lambda x, axis=-1: np.std(x, ddof=1, axis=axis),  # shown as the std; tested by Brown-Forsythe
}


class CellRef(FileModel):
    """One cell of the matrix: a strategy at a competing level (link, class: the first by default)."""

    strategy: str
    level: float
    link: str | None = None
    request_class: str | None = None


class Finding(FileModel):
    """A `[[findings]]` entry: a claim about one statistic of a cell against one or several others."""

    name: str
    claim: str = Field(json_schema_extra={"enum": list(CLAIMS)})
    statistic: str = Field("mean", json_schema_extra={"enum": list(STATISTICS)})
    a: CellRef
    b: CellRef | list[CellRef] = Field(description="a list: the claim must hold against each (intersection-union)")
    change_from: float | None = Field(None, description="mean only: the claim is about each strategy's change of "
                                                        "the mean from this level to its cell's level")
    margin: float | None = Field(None, gt=0, description='"alike" only: relative to b\'s statistic')
    study_finding: str | None = Field(None, description="the study's finding this is part of (default: the "
                                                        "name's leading number, '2a. ...' -> '2')")

    @field_validator("claim")
    @classmethod
    def _claim(cls, value: str) -> str:
        return one_of(value, CLAIMS)

    @field_validator("statistic")
    @classmethod
    def _statistic(cls, value: str) -> str:
        return one_of(value, STATISTICS)

    @model_validator(mode="after")
    def _margin(self) -> "Finding":
        if (self.claim == "alike") != (self.margin is not None):
            raise ValueError('margin: needed by claim = "alike", and only there')
        if self.claim == "alike" and self.statistic == "spread":
            raise ValueError('statistic "spread": claims "less" or "greater" only')
        if self.change_from is not None and (self.statistic != "mean" or self.claim == "alike"):
            raise ValueError('change_from: with statistic = "mean" and claim "less" or "greater" only')
        return self

    @property
    def others(self) -> list[CellRef]:
        """The cells the claim is made against (b, or each of b's list)."""
        return list(self.b) if isinstance(self.b, list) else [self.b]

    @property
    def group(self) -> str:
        """The study's finding this claim belongs to: one verdict per group (`study_verdicts`)."""
        if self.study_finding:
            return self.study_finding
        head = self.name.split(".")[0].split()[0] if self.name.strip() else self.name
        return head.rstrip("abcdefghijklmnopqrstuvwxyz") or head

    def cells(self) -> list[CellRef]:
        """Every cell the test reads: a and the others, and with `change_from` each at that level."""
        refs = [self.a, *self.others]
        if self.change_from is not None:
            refs += [r.model_copy(update={"level": self.change_from}) for r in (self.a, *self.others)]
        return refs


FAMILY_ALPHA = 0.05  # the chance of any false verdict, over all looks of a sequential design
CONTINUE_RULES = ("all", "open")


class Sequential(FileModel):
    """`[sequential]`: the declared findings tested at several looks as the runs accrue (a
    group-sequential design fixed before the first run).

    At look k every cell has `looks[k]` runs and the findings are tested at `alpha[k]` (Holm
    within the look, as `evaluate`); the alphas add up to at most FAMILY_ALPHA, so testing at
    every look keeps the chance of any false verdict at or below it (Bonferroni over looks).
    A finding's verdict is final at the first look that resolves it; after a look, with
    `continue = "open"`, only the cells of findings still open get more runs.
    """

    looks: Seq[int] = Field(description="runs per cell at each look, increasing; the last is [experiment] "
                                        "repetitions")
    alpha: Seq[float] = Field(description="the error rate spent at each look (one per look; sum <= 0.05)")
    continue_cells: str = Field("open", alias="continue", json_schema_extra={"enum": list(CONTINUE_RULES)},
                                description='after a look: "open", only the cells of findings still not resolved '
                                            'get more runs; "all", every cell')

    @field_validator("looks")
    @classmethod
    def _looks(cls, looks: tuple[int, ...]) -> tuple[int, ...]:
        if not looks or looks[0] < 3 or any(b <= a for a, b in zip(looks, looks[1:])):
            raise ValueError(f"looks must increase from at least 3 runs per cell, got {list(looks)!r}")
        return looks

    @field_validator("continue_cells")
    @classmethod
    def _continue(cls, value: str) -> str:
        return one_of(value, CONTINUE_RULES)

    @model_validator(mode="after")
    def _alphas(self) -> "Sequential":
        if len(self.alpha) != len(self.looks):
            raise ValueError(f"alpha needs one value per look ({len(self.looks)}), got {len(self.alpha)}")
        if any(not 0 < a < 1 for a in self.alpha):
            raise ValueError(f"every alpha must be in (0, 1), got {list(self.alpha)!r}")
        if sum(self.alpha) > FAMILY_ALPHA + 1e-12:
            raise ValueError(f"the alphas spend {sum(self.alpha):g}, more than the family's {FAMILY_ALPHA}")
        return self

    def look_at(self, n: int) -> int | None:
        """The look (0-based) whose runs per cell is `n`, or None."""
        return self.looks.index(n) if n in self.looks else None


@dataclass(frozen=True)
class Pair:
    """The samples (completion times, s) of one comparison: a against b, each optionally as the
    change from a base cell (`a0`, `b0`: `change_from`)."""

    a: np.ndarray
    b: np.ndarray
    a0: np.ndarray | None = None
    b0: np.ndarray | None = None

    def swapped(self) -> "Pair":
        return Pair(self.b, self.a, self.b0, self.a0)

    def sizes(self) -> list[int]:
        return [len(x) for x in (self.a, self.b, self.a0, self.b0) if x is not None]

    def statistic(self, fn) -> tuple[float, float]:
        sa, sb = float(fn(self.a)), float(fn(self.b))
        if self.a0 is not None:
            sa, sb = sa - float(fn(self.a0)), sb - float(fn(self.b0))
        return sa, sb


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of p-values (family-wise error rate).

    Hand-written (ten lines): scipy.stats offers only Benjamini-Hochberg
    (`false_discovery_control`, a false-discovery rate, not the family-wise error rate the
    verdicts need), and statsmodels' `multipletests` is not a dependency of the project.

    Parameters
    ----------
    p_values : list of float
        Unadjusted p-values of the tests of one family.

    Returns
    -------
    list of float
        Adjusted p-values in the input's order: the i-th smallest is multiplied by
        (m - i), made non-decreasing in that order, and capped at 1.
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _less_p(a: np.ndarray, b: np.ndarray, statistic: str, seed: int) -> float:
    """One-sided p-value of "a's statistic < b's"."""
    from scipy import stats as sps  # here: the experiment's spec (and the bench's sites) need no scipy.stats

    if statistic == "mean":
        return float(sps.ttest_ind(a, b, equal_var=False, alternative="less").pvalue)
    if statistic == "spread":
        return brown_forsythe_less_p(a, b)
    fn = _STATISTIC[statistic]
    result = sps.permutation_test((a, b), lambda x, y, axis=-1: fn(x, axis=axis) - fn(y, axis=axis),
                                  alternative="less", n_resamples=PERMUTATIONS,
                                  random_state=np.random.default_rng(seed), vectorized=True)
    return float(result.pvalue)


def brown_forsythe_less_p(a, b) -> float:
    """One-sided Brown-Forsythe test of "a's spread < b's".

    Brown-Forsythe is the ANOVA of the absolute deviations from each group's median
    (`scipy.stats.levene(center='median')`); with two groups its F is the square of the pooled
    two-sample t of those deviations, so the one-sided p is that t-test's (levene gives only
    the two-sided p: twice the smaller one-sided one). Robust to non-normal times, unlike an
    F-test of variances, and a test of spread alone, unlike a permutation test of the std
    (which also responds to a shift of the mean between skewed samples).
    """
    from scipy import stats as sps

    a, b = np.asarray(a, float), np.asarray(b, float)
    da, db = np.abs(a - np.median(a)), np.abs(b - np.median(b))
    if np.ptp(np.concatenate([da, db])) == 0:
        return 1.0
    return float(sps.ttest_ind(da, db, equal_var=True, alternative="less").pvalue)


def change_less_p(pair: Pair) -> float:
    """One-sided p of "(mean a - mean a0) < (mean b - mean b0)": Welch's t with the
    Welch-Satterthwaite degrees of freedom over the four independent samples.

    Hand-written because scipy.stats has no test of a difference of two differences of
    independent means (ttest_ind takes two samples); the statistic and its degrees of freedom
    are Welch's (1947) for a linear combination of means.
    """
    from scipy import stats as sps

    groups = [(pair.a, 1.0), (pair.a0, -1.0), (pair.b, -1.0), (pair.b0, 1.0)]
    d = sum(c * float(np.mean(x)) for x, c in groups)
    v = [float(np.var(x, ddof=1)) / len(x) for x, _ in groups]
    se2 = sum(v)
    if se2 == 0:
        return 0.0 if d < 0 else 1.0
    dof = se2 ** 2 / sum(vi ** 2 / (len(x) - 1) for vi, (x, _) in zip(v, groups))
    return float(sps.t.cdf(d / np.sqrt(se2), dof))


def _pair_less_p(pair: Pair, statistic: str, seed: int) -> float:
    if pair.a0 is not None:
        return change_less_p(pair)
    return _less_p(pair.a, pair.b, statistic, seed)


def finding_p_values(finding: Finding, a, b, seed: int = 0) -> tuple[float, float]:
    """(p of the claim, p of its opposite), unadjusted, for one comparison.

    Parameters
    ----------
    finding : Finding
    a, b : array-like or Pair
        Completion times (s) of the two cells (or a `Pair`, with `change_from`'s base cells).
    seed : int
        Seeds the permutation tests, so a report is reproducible.

    Returns
    -------
    tuple of float
        For "less": p(a < b) and p(b < a) ("greater": the reverse). For "alike": p of
        equivalence within the margin (TOST) and p of "the difference exceeds the margin"
        (the larger side).
    """
    pair = a if isinstance(a, Pair) else Pair(np.asarray(a, float), np.asarray(b, float))
    if finding.claim == "less":
        return _pair_less_p(pair, finding.statistic, seed), _pair_less_p(pair.swapped(), finding.statistic, seed)
    if finding.claim == "greater":
        return _pair_less_p(pair.swapped(), finding.statistic, seed), _pair_less_p(pair, finding.statistic, seed)
    a, b = pair.a, pair.b
    delta = finding.margin * float(_STATISTIC[finding.statistic](b))
    # Equivalence: a < b + delta and a > b - delta (i.e. b - delta < a), both one-sided.
    p_equiv = max(_less_p(a, b + delta, finding.statistic, seed), _less_p(b - delta, a, finding.statistic, seed))
    # Beyond the margin, on whichever side the data lie.
    p_beyond = min(_less_p(b + delta, a, finding.statistic, seed), _less_p(a, b - delta, finding.statistic, seed))
    return p_equiv, p_beyond


def evaluate(findings: list[Finding], samples: list, alpha: float = 0.05, seed: int = 0) -> list[dict]:
    """Test every declared finding and adjust them together (Holm).

    Parameters
    ----------
    findings : list of Finding
        As declared in the experiment file.
    samples : list
        Per finding: (a, b), its two cells' completion times (s); or a list of `Pair`, one per
        cell in `finding.others`. Against several cells the claim is an intersection-union
        test: it holds when it holds against each, with the largest of their p-values (no
        correction needed for the intersection, Berger 1982); its opposite is shown by any one.
    alpha : float
        Family-wise error rate.
    seed : int
        Seeds the permutation tests.

    Returns
    -------
    list of dict
        Per finding: finding, study (its group), claim, statistic, n, the two statistics (b:
        the binding one's, named in `versus`), effect (a - b, s) and ratio (a / b), p
        (unadjusted), p_holm, verdict.
    """
    pairs = [_pairs(s) for s in samples]
    tested = [_components(f, p, seed) for f, p in zip(findings, pairs)]
    claims = [(i, max(p for p, _, _ in t)) for i, t in enumerate(tested) if t]
    against = [(i, j, q) for i, t in enumerate(tested) if t for j, (_, q, _) in enumerate(t)]
    # One family: the claims and every comparison's opposite, so a verdict either way is controlled.
    adjusted = holm([p for _, p in claims] + [q for _, _, q in against])
    p_claim = {i: (p, adjusted[k]) for k, (i, p) in enumerate(claims)}
    p_against = {}
    for k, (i, _, _) in enumerate(against):
        p_against[i] = min(p_against.get(i, 1.0), adjusted[len(claims) + k])
    return [_row(f, t, p_claim.get(i), p_against.get(i), alpha, min(min(p.sizes()) for p in ps))
            for i, (f, t, ps) in enumerate(zip(findings, tested, pairs))]


def _pairs(sample) -> list[Pair]:
    if isinstance(sample, list) and sample and all(isinstance(p, Pair) for p in sample):
        return sample
    return [Pair(np.asarray(sample[0], float), np.asarray(sample[1], float))]


def _components(finding: Finding, pairs: list[Pair], seed: int) -> list[tuple[float, float, Pair]] | None:
    """[(p claim, p opposite, pair)] per comparison, or None when a cell has fewer than 2 runs."""
    if any(min(p.sizes()) < 2 for p in pairs):
        return None
    return [(*finding_p_values(finding, p, None, seed), p) for p in pairs]


def _row(finding: Finding, tested, claim, against, alpha: float, n: int) -> dict:
    row = {"finding": finding.name, "study": finding.group, "claim": finding.claim,
           "statistic": finding.statistic + (f" change from {finding.change_from:g}" if finding.change_from is not None
                                             else "")}
    if tested is None:
        return {**row, "n": "-", "verdict": f"not resolvable at n = {n}"}
    others = finding.others
    k = max(range(len(tested)), key=lambda j: tested[j][0])  # the binding comparison
    pair = tested[k][2]
    sa, sb = pair.statistic(_STATISTIC[finding.statistic])
    if claim[1] < alpha:
        verdict = "reproduced"
    elif against < alpha:
        verdict = "not reproduced"
    else:
        verdict = f"not resolvable at n = {n}"
    return {**row, "n": f"{len(pair.a)}, {len(pair.b)}", "versus": others[k].strategy + f"@{others[k].level:g}",
            "a": sa, "b": sb, "effect_s": sa - sb, "ratio": sa / sb if sb else float("nan"),
            "p": claim[0], "p_holm": claim[1], "p_opposite_holm": against, "verdict": verdict}


PENDING = "no look reached yet"  # a sequential design's finding before its first look


def study_verdicts(rows: list[dict]) -> list[dict]:
    """One verdict per study finding from its parts' rows: reproduced when every part is;
    not reproduced when any part is; "no look reached yet" while a part waits for its first
    look (sequential designs); otherwise not resolvable (naming the parts that are not)."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(row["study"], []).append(row)
    out = []
    for name, parts in groups.items():
        verdicts = [p["verdict"] for p in parts]
        if all(v == "reproduced" for v in verdicts):
            verdict = "reproduced"
        elif any(v == "not reproduced" for v in verdicts):
            verdict = "not reproduced"
        elif any(v.startswith(PENDING) for v in verdicts):
            verdict = PENDING
        else:
            verdict = "not resolvable"
        detail = "; ".join(f"{p['finding'].split('.')[0]}: {p['verdict']}" for p in parts)
        out.append({"study": name, "verdict": verdict, "parts": detail})
    return out
