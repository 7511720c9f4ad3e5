"""Findings declared in the experiment file before the run, tested with Holm's correction.

A finding compares one statistic of completion time between two cells of the matrix:

    [[findings]]
    name = "3. priority queuing beats FIFO"
    claim = "less"              # less: a's statistic is below b's | alike: within `margin` of it
    statistic = "mean"          # mean | median | p95 | std
    a = { strategy = "prio", level = 16 }       # optional: link, request_class (default: the first)
    b = { strategy = "fifo", level = 16 }
    # margin = 0.25             # alike only: |a - b| < margin x b's statistic

Tests (scipy.stats): a mean "less" is Welch's one-sided t-test; "alike" on means is the two
one-sided Welch tests of equivalence (TOST) with the margin; any other statistic is a
permutation test of the difference of that statistic (for "alike": the larger of the two
one-sided permutation p-values against the shifted margins). The p-values of all the
findings of an experiment are adjusted together by Holm's step-down method, so the chance
of reporting any false finding stays at `alpha`.

Verdicts: "reproduced" (adjusted p < alpha), "not reproduced" (the opposite direction is
itself significant after adjustment; for "alike", the difference is significantly larger
than the margin), otherwise "not resolvable at n = N".
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from pydantic import Field, field_validator, model_validator

from qos.config import FileModel, one_of

CLAIMS = ("less", "alike")
STATISTICS = ("mean", "median", "p95", "std")
PERMUTATIONS = 9999
_STATISTIC: dict[str, Callable] = {
    "mean": np.mean, "median": np.median,
    "p95": lambda x, axis=-1: np.percentile(x, 95, axis=axis),
    "std": lambda x, axis=-1: np.std(x, ddof=1, axis=axis),
}


class CellRef(FileModel):
    """One cell of the matrix: a strategy at a competing level (link, class: the first by default)."""

    strategy: str
    level: float
    link: str | None = None
    request_class: str | None = None


class Finding(FileModel):
    """A `[[findings]]` entry: a claim about one statistic of two cells."""

    name: str
    claim: str = Field(json_schema_extra={"enum": list(CLAIMS)})
    statistic: str = Field("mean", json_schema_extra={"enum": list(STATISTICS)})
    a: CellRef
    b: CellRef
    margin: float | None = Field(None, gt=0, description='"alike" only: relative to b\'s statistic')

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
        return self


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjustment of p-values (family-wise error rate).

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
    fn = _STATISTIC[statistic]
    result = sps.permutation_test((a, b), lambda x, y, axis=-1: fn(x, axis=axis) - fn(y, axis=axis),
                                  alternative="less", n_resamples=PERMUTATIONS,
                                  random_state=np.random.default_rng(seed), vectorized=True)
    return float(result.pvalue)


def finding_p_values(finding: Finding, a, b, seed: int = 0) -> tuple[float, float]:
    """(p of the claim, p of its opposite), unadjusted.

    Parameters
    ----------
    finding : Finding
    a, b : array-like
        Completion times (s) of the two cells.
    seed : int
        Seeds the permutation tests, so a report is reproducible.

    Returns
    -------
    tuple of float
        For "less": p(a < b) and p(b < a). For "alike": p of equivalence within the margin
        (TOST) and p of "the difference exceeds the margin" (the larger side).
    """
    a, b = np.asarray(a, float), np.asarray(b, float)
    if finding.claim == "less":
        return _less_p(a, b, finding.statistic, seed), _less_p(b, a, finding.statistic, seed)
    delta = finding.margin * float(_STATISTIC[finding.statistic](b))
    # Equivalence: a < b + delta and a > b - delta (i.e. b - delta < a), both one-sided.
    p_equiv = max(_less_p(a, b + delta, finding.statistic, seed), _less_p(b - delta, a, finding.statistic, seed))
    # Beyond the margin, on whichever side the data lie.
    p_beyond = min(_less_p(b + delta, a, finding.statistic, seed), _less_p(a, b - delta, finding.statistic, seed))
    return p_equiv, p_beyond


def evaluate(findings: list[Finding], samples: list[tuple[list[float], list[float]]], alpha: float = 0.05,
             seed: int = 0) -> list[dict]:
    """Test every declared finding and adjust them together (Holm).

    Parameters
    ----------
    findings : list of Finding
        As declared in the experiment file.
    samples : list of (a, b)
        Each finding's two cells' completion times, seconds.
    alpha : float
        Family-wise error rate.
    seed : int
        Seeds the permutation tests.

    Returns
    -------
    list of dict
        Per finding: name, claim, statistic, n (a, b), the two statistics, effect (a - b, s)
        and ratio (a / b), p (unadjusted), p_holm, verdict.
    """
    tested = []
    for finding, (a, b) in zip(findings, samples):
        if len(a) < 2 or len(b) < 2:
            tested.append(None)
            continue
        tested.append(finding_p_values(finding, a, b, seed))
    valid = [i for i, t in enumerate(tested) if t is not None]
    # One family: both the claims and their opposites, so a verdict either way is controlled.
    adjusted = holm([tested[i][0] for i in valid] + [tested[i][1] for i in valid])
    k = len(valid)
    rows = []
    for finding, (a, b), t in zip(findings, samples, tested):
        fn = _STATISTIC[finding.statistic]
        row = {"finding": finding.name, "claim": finding.claim, "statistic": finding.statistic,
               "n": f"{len(a)}, {len(b)}"}
        if t is None:
            rows.append({**row, "verdict": f"not resolvable at n = {min(len(a), len(b))}"})
            continue
        j = valid.index(len(rows))
        p_claim, p_against = adjusted[j], adjusted[k + j]
        sa, sb = float(fn(np.asarray(a, float))), float(fn(np.asarray(b, float)))
        if p_claim < alpha:
            verdict = "reproduced"
        elif p_against < alpha:
            verdict = "not reproduced"
        else:
            verdict = f"not resolvable at n = {min(len(a), len(b))}"
        rows.append({**row, "a": sa, "b": sb, "effect_s": sa - sb, "ratio": sa / sb if sb else float("nan"),
                     "p": t[0], "p_holm": p_claim, "verdict": verdict})
    return rows
