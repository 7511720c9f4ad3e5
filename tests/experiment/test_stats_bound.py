"""Statistics against scipy and textbook values; the physical bound against hand arithmetic."""

import numpy as np
import pytest
from scipy import stats as sps

from qos.experiment.bound import SiteTransfer, lower_bound
from qos.experiment.stats import compare, summarise, welch


def test_summary_of_known_sample():
    x = [1.0, 2.0, 3.0, 4.0, 5.0]
    s = summarise(x)
    assert s.n == 5 and s.mean == 3.0 and s.median == 3.0
    assert s.std == pytest.approx(np.sqrt(2.5))
    assert s.cv == pytest.approx(np.sqrt(2.5) / 3)
    assert s.p95 == pytest.approx(4.8)
    lo, hi = sps.t.interval(0.95, 4, loc=3.0, scale=sps.sem(x))
    assert (s.ci_low, s.ci_high) == (pytest.approx(lo), pytest.approx(hi))


def test_summary_rejects_empty():
    with pytest.raises(ValueError):
        summarise([])


def test_welch_matches_scipy():
    rng = np.random.default_rng(1)
    a = rng.normal(10, 1, 10)
    b = rng.normal(11, 3, 7)
    t, p = welch(a, b)
    ref = sps.ttest_ind(a, b, equal_var=False)
    assert t == pytest.approx(ref.statistic) and p == pytest.approx(ref.pvalue)


def test_compare_tells_noise_from_a_real_difference():
    rng = np.random.default_rng(2)
    a = rng.normal(10, 1, 10)
    same = compare(a, rng.normal(10, 1, 10))
    far = compare(a, rng.normal(20, 1, 10))
    assert same.p > 0.05 and same.ci_low < 0 < same.ci_high
    assert far.p < 0.05 and far.ci_high < 0 and far.diff < -5


def test_intervals_are_t_and_chi_square_based():
    from scipy import stats as sps

    from qos.experiment.stats import std_interval, welch_interval

    rng = np.random.default_rng(3)
    a, b = rng.normal(10, 1, 5), rng.normal(12, 2, 5)
    lo, hi = welch_interval(a, b)
    t, p = welch(a, b)
    assert (lo < 0 < hi) == (p > 0.05)  # the interval and the test agree
    slo, shi = std_interval(a)
    s = a.std(ddof=1)
    assert slo < s < shi
    assert shi == pytest.approx(s * np.sqrt(4 / sps.chi2.ppf(0.025, 4)))


SKEWED_SIGMA = 0.8  # lognormal times: skewness ~3.7, like a cell with an occasional long stall


def _coverage(interval, n: int = 10, draws: int = 200, seed: int = 11) -> float:
    """How often `interval(x)` holds the true std over `draws` seeded lognormal samples of `n`."""
    rng = np.random.default_rng(seed)
    v = SKEWED_SIGMA**2
    true_std = np.sqrt((np.exp(v) - 1) * np.exp(v))
    hits = 0
    for i in range(draws):
        lo, hi = interval(rng.lognormal(0, SKEWED_SIGMA, n), i)
        hits += lo <= true_std <= hi
    return hits / draws


def test_the_skewed_cells_std_interval_covers_better_than_chi_square_and_the_bootstrap():
    from scipy import stats as sps

    from qos.experiment.stats import std_interval, std_interval_skewed

    def bca(x, seed):
        ci = sps.bootstrap((x,), lambda a, axis=-1: np.std(a, ddof=1, axis=axis), method="BCa",
                           n_resamples=999, random_state=seed).confidence_interval
        return ci.low, ci.high

    chi = _coverage(lambda x, _: std_interval(x))
    bonett = _coverage(lambda x, _: std_interval_skewed(x))
    boot = _coverage(bca)
    assert chi < 0.75 and bonett > chi + 0.08  # chi-square far below 95% on skewed times
    assert boot < bonett  # at n = 10 a bootstrap cannot see the tail its sample lacks
    normal = np.random.default_rng(5).normal(10, 1, 40)
    lo, hi = std_interval_skewed(normal)
    clo, chi_hi = std_interval(normal)
    assert lo < normal.std(ddof=1) < hi and hi / lo == pytest.approx(chi_hi / clo, rel=0.25)  # normal: alike
    assert np.isnan(std_interval_skewed([1.0, 2.0, 3.0, 4.0])[0])  # below BONETT_MIN_N: none


def test_bound_single_remote_site_is_bytes_over_rate_plus_round_trip_plus_work():
    # 125 kB at 1 Mbit/s = 1 s each way; 2 x 50 ms delay; 0.5 s work
    site = SiteTransfer("B1", bytes_up=125_000, bytes_down=125_000, compute_s=0.5, behind_core=True)
    b = lower_bound([site], core_kbit=1000, access_kbit=100_000, core_delay_ms=50)
    assert b.total_s == pytest.approx(1 + 0.05 + 0.5 + 1 + 0.05)
    assert b.per_site_s == pytest.approx(b.total_s)


def test_bound_two_remote_sites_share_the_core():
    sites = [SiteTransfer(n, 125_000, 1_250, 0.0, True) for n in ("B1", "C1")]
    local = SiteTransfer("A1", 125_000, 1_250, 0.0, False)
    b = lower_bound(sites + [local], core_kbit=1000, access_kbit=10_000)
    # both uploads cross the core one after the other: 2 s, then one 10 ms reply
    assert b.core_s == pytest.approx(2.0 + 0.01)
    assert b.total_s == pytest.approx(b.core_s) and b.limited_by == "core link"


def test_bound_rejects_nonsense():
    with pytest.raises(ValueError):
        lower_bound([], 1000, 1000)
    with pytest.raises(ValueError):
        lower_bound([SiteTransfer("x", 1, 1)], 0, 1000)


def test_bound_counts_the_masters_work_a_features_request_waits_for():
    # A features request leaves only once the coordinator has analysed the cells (prior_s):
    # 10 s of analysis, then 1250 B each way at 1 Mbit/s (10 ms each) and no site work.
    features = [SiteTransfer(n, 1_250, 1_250, 0.0, True, prior_s=10.0) for n in ("B1", "C1")]
    b = lower_bound(features, core_kbit=1000, access_kbit=10_000)
    assert b.per_site_s == pytest.approx(10.0 + 0.01 + 0.01)
    assert b.core_s == pytest.approx(10.0 + 0.02 + 0.01)  # both requests after the analysis, then a reply
    # On hubs: both requests and both replies cross the one medium after the analysis.
    hubs = lower_bound(features, core_kbit=1000, access_kbit=1000, shared_medium=True)
    assert hubs.core_s == pytest.approx(10.0 + 0.04) and hubs.total_s == pytest.approx(10.04)
    # The master's own site (no wire) still waits for it.
    local = SiteTransfer("A1", 1_250, 1_250, 0.0, False, prior_s=10.0)
    assert lower_bound([local], 1000, 1000, shared_medium=True).total_s == pytest.approx(10.0)
    # An images site (no wait) may use the medium during the analysis: its 125 kB do not add
    # to the features sites' time after it, only to the whole medium's.
    images = SiteTransfer("D1", 125_000, 0, 0.0, True)
    mixed = lower_bound([*features, images], core_kbit=1000, access_kbit=1000, shared_medium=True)
    assert mixed.total_s == pytest.approx(10.04)
    without = lower_bound([SiteTransfer(n, 1_250, 1_250, 0.0, True) for n in ("B1", "C1")] + [images],
                          core_kbit=1000, access_kbit=1000, shared_medium=True)
    assert without.total_s == pytest.approx(1.0 + 0.04)  # every byte on the medium, no analysis
