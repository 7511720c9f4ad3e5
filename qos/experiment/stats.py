"""Summary statistics of completion times and tests of whether two strategies differ.

Times are float64 seconds. With 10 runs a cell, a difference of means can easily be
noise: `compare` runs Welch's t-test (unequal variances, Welch 1947) and a percentile
bootstrap of the difference, and calls the difference significant only when both agree.
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


def bootstrap_diff(a, b, confidence: float = 0.95, resamples: int = 5000, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of mean(a) - mean(b)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    rng = np.random.default_rng(seed)
    da = rng.choice(a, size=(resamples, a.size)).mean(axis=1)
    db = rng.choice(b, size=(resamples, b.size)).mean(axis=1)
    lo, hi = np.percentile(da - db, [50 * (1 - confidence), 50 * (1 + confidence)])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Comparison:
    """Whether mean(a) and mean(b) differ, by two tests."""

    diff: float  # mean(a) - mean(b), seconds
    t: float
    p: float  # Welch's two-sided p-value
    boot_low: float
    boot_high: float
    significant: bool  # p < alpha AND the bootstrap interval excludes 0


def compare(a, b, alpha: float = 0.05, seed: int = 0) -> Comparison:
    """Welch's t-test and a bootstrap interval of the difference of means."""
    t, p = welch(a, b)
    lo, hi = bootstrap_diff(a, b, confidence=1 - alpha, seed=seed)
    diff = float(np.mean(a) - np.mean(b))
    significant = bool(p < alpha and (lo > 0 or hi < 0))
    return Comparison(diff, t, p, lo, hi, significant)


BCA_RESAMPLES = 9999
BCA_MIN_N = 3  # below this the jackknife acceleration of BCa is not defined


def bca_interval(values, confidence: float = 0.95, resamples: int = BCA_RESAMPLES,
                 seed: int = 0) -> tuple[float, float]:
    """The bias-corrected and accelerated (BCa, Efron 1987) bootstrap interval of the mean of `values`.

    scipy.stats.bootstrap does the work. Returns (nan, nan) where BCa is not defined: fewer
    than BCA_MIN_N values, or all equal.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size < BCA_MIN_N or np.ptp(x) == 0:
        return float("nan"), float("nan")
    res = sps.bootstrap((x,), np.mean, confidence_level=confidence, n_resamples=resamples,
                        method="BCa", random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)
