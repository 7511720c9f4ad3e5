"""Summary statistics of completion times and tests of whether two strategies differ.

Times are float64 seconds. With 10 runs a cell, a difference of means can easily be
noise: `compare` runs Welch's t-test (unequal variances, Welch 1947) with its t-interval of
the difference; intervals of means are t-based, which at n = 5-10 are honest where BCa and
percentile bootstraps are too narrow.

A std's interval: the chi-square one (`std_interval`) assumes normal times and is far too
narrow for skewed cells (a queue's occasional long stall); bootstrapping the std
(scipy.stats.bootstrap) is worse still at this n, since a resample of 10 cannot contain the
tail it lacks. Bonett's (2006) interval (`std_interval_skewed`), which widens the chi-square
one by the sample's kurtosis, covers best. Coverage of a nominal 95% interval of the std over
200 seeded draws each (tests/experiment/test_stats_bound.py draws the first row):

    times              n   chi-square  BCa bootstrap  percentile  Bonett
    lognormal s=0.8   10      0.63         0.58          0.53      0.77
    lognormal s=0.8   40      0.51         0.75          0.66      0.81
    gamma, shape 2    10      0.83         0.70          0.61      0.94
    exponential       10      0.75         0.63          0.58      0.88
    exponential       40      0.67         0.80          0.75      0.86

The mean's t-interval holds up on the same skewed times: 0.88 at n = 10 on the lognormal,
where BCa and percentile bootstraps of the mean give 0.85 and 0.83.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps


@dataclass(frozen=True)
class Summary:
    """Summary of one cell's times (seconds)."""

    n: int
    mean: float
    std: float  # sample standard deviation (ddof=1); nan for n < 2
    cv: float  # std / mean
    median: float
    p95: float
    ci_low: float  # 95% confidence interval of the mean (Student's t)
    ci_high: float
    minimum: float
    maximum: float


def summarise(values, confidence: float = 0.95) -> Summary:
    """Mean, std, CV, median, p95 and the t-interval of the mean of 1-D `values`."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"need a non-empty 1-D sample, got shape {x.shape}")
    n = x.size
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if n > 1 else float("nan")
    if n > 1:
        half = float(sps.t.ppf(0.5 + confidence / 2, n - 1) * std / np.sqrt(n))
    else:
        half = float("nan")
    return Summary(
        n=n,
        mean=mean,
        std=std,
        cv=std / mean if mean else float("nan"),
        median=float(np.median(x)),
        p95=float(np.percentile(x, 95)),
        ci_low=mean - half,
        ci_high=mean + half,
        minimum=float(x.min()),
        maximum=float(x.max()),
    )


def welch(a, b) -> tuple[float, float]:
    """Welch's t statistic and two-sided p-value for mean(a) != mean(b)
    (`scipy.stats.ttest_ind` with unequal variances); nan with fewer than 2 values a side,
    and for samples without variance 0 and 1 when their means are equal, else +-inf and 0
    (where scipy gives nan)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        return float("nan"), float("nan")
    if a.var(ddof=1) + b.var(ddof=1) == 0:
        same = a.mean() == b.mean()
        return (0.0, 1.0) if same else (float("inf") * np.sign(a.mean() - b.mean()), 0.0)
    result = sps.ttest_ind(a, b, equal_var=False)
    return float(result.statistic), float(result.pvalue)


def welch_interval(a, b, confidence: float = 0.95) -> tuple[float, float]:
    """Welch's t-interval of mean(a) - mean(b) (Welch-Satterthwaite degrees of freedom)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    diff = float(a.mean() - b.mean())
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    if va + vb == 0:
        return diff, diff
    dof = (va + vb) ** 2 / (va**2 / (a.size - 1) + vb**2 / (b.size - 1))
    half = float(sps.t.ppf(0.5 + confidence / 2, dof) * np.sqrt(va + vb))
    return diff - half, diff + half


@dataclass(frozen=True)
class Comparison:
    """Whether mean(a) and mean(b) differ: Welch's test and its interval of the difference."""

    diff: float  # mean(a) - mean(b), seconds
    t: float
    p: float  # Welch's two-sided p-value, unadjusted (a table of many adjusts them: holm)
    ci_low: float  # Welch's t-interval of the difference, at 1 - alpha
    ci_high: float


def compare(a, b, alpha: float = 0.05) -> Comparison:
    """Welch's t-test and t-interval of the difference of means (at small n a percentile
    bootstrap's interval is too narrow: it ignores that the std itself is estimated)."""
    t, p = welch(a, b)
    lo, hi = welch_interval(a, b, confidence=1 - alpha)
    return Comparison(float(np.mean(a) - np.mean(b)), t, p, lo, hi)


def std_interval(values, confidence: float = 0.95) -> tuple[float, float]:
    """The chi-square confidence interval of the standard deviation of `values` (normal theory):
    sqrt((n - 1) s^2 / chi2_{1-a/2}) .. sqrt((n - 1) s^2 / chi2_{a/2}); (nan, nan) for n < 2."""
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n < 2:
        return float("nan"), float("nan")
    s2 = float(x.var(ddof=1))
    lo = np.sqrt((n - 1) * s2 / sps.chi2.ppf(0.5 + confidence / 2, n - 1))
    hi = np.sqrt((n - 1) * s2 / sps.chi2.ppf(0.5 - confidence / 2, n - 1))
    return float(lo), float(hi)


BONETT_MIN_N = 5  # its trimmed mean trims 1 / (2 sqrt(n - 4)) of each tail


def std_interval_skewed(values, confidence: float = 0.95) -> tuple[float, float]:
    """Bonett's (2006) confidence interval of the standard deviation of `values`, for times
    that need not be normal; (nan, nan) for fewer than BONETT_MIN_N values.

    The chi-square interval's log-variance, widened by the sample's kurtosis (estimated about
    a trimmed mean) and scaled by c = n / (n - z): exp(ln(c s^2) +- z se), se = c sqrt((kurtosis
    - (n - 3) / n) / (n - 1)). Hand-written (a few lines): neither scipy nor the project's
    dependencies offer it (R's DescTools::VarCI(method = "bonett") does). See the module's
    docstring for its coverage against the chi-square and bootstrap intervals.

    Parameters
    ----------
    values : array_like
        One cell's completion times.
    confidence : float
        The interval's confidence level.

    Returns
    -------
    tuple of float
        (low, high) of the standard deviation, in the unit of `values`.
    """
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n < BONETT_MIN_N:
        return float("nan"), float("nan")
    s2 = float(x.var(ddof=1))
    if s2 == 0:
        return 0.0, 0.0
    z = float(sps.norm.ppf(0.5 + confidence / 2))
    centre = sps.trim_mean(x, 1 / (2 * np.sqrt(n - 4)))
    kurtosis = n * np.sum((x - centre) ** 4) / np.sum((x - x.mean()) ** 2) ** 2
    c = n / (n - z)
    se = c * np.sqrt(max(kurtosis - (n - 3) / n, 0.0) / (n - 1))
    return float(np.sqrt(c * s2 * np.exp(-z * se))), float(np.sqrt(c * s2 * np.exp(z * se)))
