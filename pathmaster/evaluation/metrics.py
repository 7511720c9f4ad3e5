"""Figures of retrieval and of an abnormality score, with their confidence intervals.

``score_rankings`` ranked neighbour labels -> top-1, precision@5, majority@5, mean average
precision, binary accuracy, confusion; ``score_predictions`` the same for predicted labels;
``roc`` the ROC and AUC of a score (scikit-learn's); ``site_score_figures`` a site's score at
its operating points, per cell and for simulated 6-cell cases; Wilson intervals for
proportions, a seeded percentile bootstrap for means.
"""

from __future__ import annotations

import inspect

import numpy as np

from pathmaster import defaults
from pathmaster.learning.thresholds import TARGET_SENSITIVITY
from pathmaster.learning.neighbours import majority_vote
from pathmaster.records import DIAGNOSES, NORMAL_DIAGNOSES

CASES_PER_FOLD = 400  # simulated cases of each kind (all-normal; 1-2 abnormal cells) per fold
# The per-cell abnormality score: the case conclusion's (``pathmaster.conclusion``), the
# share of a cell's matches that are abnormal, weighted by distance within the site.
WEIGHTING = "distance"


def average_precisions(relevant: np.ndarray) -> np.ndarray:
    """Average precision of each ranking; ``relevant`` is a bool (m, r) array in rank order.

    A row with nothing relevant scores 0.
    """
    relevant = np.atleast_2d(np.asarray(relevant, dtype=bool))
    ranks = np.arange(1, relevant.shape[1] + 1)
    precision = np.cumsum(relevant, axis=1) / ranks
    n_relevant = relevant.sum(axis=1)
    total = (precision * relevant).sum(axis=1)
    return np.divide(total, n_relevant, out=np.zeros(len(relevant)), where=n_relevant > 0)


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> list[float]:
    """Wilson score interval [low, high] of a proportion ``successes / n`` (scipy.stats.binomtest).

    Unlike the normal approximation it stays inside [0, 1] and is sensible at 0 or n
    successes and for small n (a class of a few cells).
    """
    from scipy.stats import binomtest

    if n <= 0:
        return [0.0, 1.0]
    interval = binomtest(int(successes), int(n)).proportion_ci(confidence, method="wilson")
    return [float(interval.low), float(interval.high)]


def bootstrap_interval(values: np.ndarray, confidence: float = 0.95, seed: int = 0,
                       resamples: int = 2000) -> list[float]:
    """Percentile bootstrap interval [low, high] of the mean of per-query ``values`` (float (m,)),
    seeded (scipy.stats.bootstrap). Constant values give [value, value]."""
    from scipy.stats import bootstrap

    values = np.asarray(values, dtype=np.float64)
    if values.size < 2 or np.ptp(values) == 0:
        mean = float(values.mean()) if values.size else 0.0
        return [mean, mean]
    # scipy >= 1.15 names the generator ``rng``; older releases ``random_state``.
    generator = {"rng" if "rng" in inspect.signature(bootstrap).parameters else "random_state":
                 np.random.default_rng(seed)}
    result = bootstrap((values,), np.mean, confidence_level=confidence, n_resamples=resamples,
                       method="percentile", vectorized=True, axis=-1, **generator)
    return [float(result.confidence_interval.low), float(result.confidence_interval.high)]


def is_normal(label: str) -> bool:
    return label in NORMAL_DIAGNOSES


def score_rankings(query_labels, ranked_labels: np.ndarray, average_precision=None, k: int = defaults.K, *,
                   confidence: float = 0.95, seed: int = 0) -> dict:
    """Metrics of ranked neighbour labels.

    query_labels: m diagnoses; ranked_labels: (m, r >= k) array of the database diagnoses
    in rank order, nearest first; average_precision: (m,) AP of each query over the full
    ranking of the database (``average_precisions``), or None to leave ``map`` out.
    Returns the dict described in the module docstring plus ``queries``, ``k``, ``ci``
    (metric -> [low, high] at ``confidence``) and ``per_class`` (n, top1, majority_at_5,
    which is the class's recall under the majority@5 prediction, and its ``recall_ci``,
    per true diagnosis). ``binary_accuracy`` is None when some label is outside the Herlev
    vocabulary. ``seed`` fixes the bootstrap resamples.
    """
    query_labels = np.asarray(query_labels, dtype=object)
    ranked_labels = np.asarray(ranked_labels, dtype=object)
    m = len(query_labels)
    if m == 0:
        raise ValueError("no queries to evaluate")
    if ranked_labels.ndim != 2 or ranked_labels.shape[0] != m or ranked_labels.shape[1] < k:
        raise ValueError(f"need a ({m}, >= {k}) ranking, got {ranked_labels.shape}")
    relevant = ranked_labels == query_labels[:, None]
    predicted = [majority_vote(list(row[:k])) for row in ranked_labels]
    top1 = relevant[:, 0]
    majority = np.array([p == q for p, q in zip(predicted, query_labels)])

    known = set(DIAGNOSES)
    all_labels = set(query_labels.tolist()) | set(ranked_labels[:, :k].ravel().tolist())
    binary = binary_right = None
    if all_labels <= known:
        votes = [majority_vote([is_normal(x) for x in row[:k]]) for row in ranked_labels]
        binary_right = np.array([v == is_normal(q) for v, q in zip(votes, query_labels)])
        binary = float(binary_right.mean())

    order = [d for d in DIAGNOSES if d in all_labels] + sorted(all_labels - known)
    position = {label: i for i, label in enumerate(order)}
    matrix = np.zeros((len(order), len(order)), dtype=np.int64)
    for truth, guess in zip(query_labels, predicted):
        matrix[position[truth], position[guess]] += 1

    per_class = {}
    for label in order:
        rows = query_labels == label
        if rows.any():
            per_class[label] = {
                "n": int(rows.sum()),
                "top1": float(top1[rows].mean()),
                "majority_at_5": float(majority[rows].mean()),
                "recall_ci": wilson_interval(int(majority[rows].sum()), int(rows.sum()), confidence),
            }
    ci = {"top1": wilson_interval(int(top1.sum()), m, confidence),
          "majority_at_5": wilson_interval(int(majority.sum()), m, confidence),
          "precision_at_5": bootstrap_interval(relevant[:, :k].mean(axis=1), confidence, seed)}
    if average_precision is not None:
        ci["map"] = bootstrap_interval(np.asarray(average_precision, dtype=np.float64), confidence, seed)
    if binary_right is not None:
        ci["binary_accuracy"] = wilson_interval(int(binary_right.sum()), m, confidence)
    return {
        "queries": m,
        "k": k,
        "top1": float(top1.mean()),
        "precision_at_5": float(relevant[:, :k].mean()),
        "majority_at_5": float(majority.mean()),
        "map": None if average_precision is None else float(np.mean(average_precision)),
        "binary_accuracy": binary,
        "confusion": {"labels": order, "matrix": matrix.tolist(),
                      "rows": "true diagnosis", "columns": "majority@5 prediction"},
        "per_class": per_class,
        "ci": ci,
        "confidence": confidence,
    }


def counted_figures(found: int, positives: int, cleared: int, negatives: int, confidence: float = 0.95) -> dict:
    """Sensitivity (``found`` of ``positives``) and specificity (``cleared`` of
    ``negatives``), each None of nothing, with Wilson intervals, and the ``missed`` and
    ``false_alarms`` counts: the figures of calls on cells and on simulated cases alike."""
    found, positives, cleared, negatives = int(found), int(positives), int(cleared), int(negatives)
    return {"sensitivity": found / positives if positives else None,
            "specificity": cleared / negatives if negatives else None,
            "sensitivity_ci": wilson_interval(found, positives, confidence),
            "specificity_ci": wilson_interval(cleared, negatives, confidence),
            "missed": positives - found, "false_alarms": negatives - cleared}


def binary_figures(positive: np.ndarray, called: np.ndarray, confidence: float = 0.95) -> dict:
    """``counted_figures`` of calls (bool (n,) each), with their accuracy and counts."""
    positive = np.asarray(positive, dtype=bool)
    called = np.asarray(called, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    return {**counted_figures(int((positive & called).sum()), n_pos, int((~positive & ~called).sum()), n_neg,
                              confidence),
            "accuracy": float((positive == called).mean()), "positives": n_pos, "negatives": n_neg}


def abnormality_scores(abnormal: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """The abnormality score of each query: the share of its matches that are abnormal,
    weighted as the case conclusion weighs them (``pathmaster.conclusion.match_weights``,
    ``WEIGHTING``), so that evaluation measures the score a case is concluded on.

    abnormal: bool (m, k), each match abnormal in the site's vocabulary; distances: float
    (m, k), nearest first. Returns float64 (m,) in [0, 1].
    """
    from pathmaster.conclusion import match_weights

    abnormal = np.asarray(abnormal, dtype=bool)
    distances = np.asarray(distances, dtype=np.float64)
    weights = np.vstack([match_weights(row, len(row), WEIGHTING) for row in distances])
    return (weights * abnormal).sum(axis=1) / weights.sum(axis=1)


def score_predictions(query_labels, predicted, *, confidence: float = 0.95, abnormal_labels=None) -> dict:
    """Accuracy, binary (normal vs abnormal) accuracy, sensitivity and specificity for the
    abnormal labels (default: Herlev's dysplasias and carcinoma) and per-class recall of class
    predictions, with Wilson intervals; binary figures are None when no label is abnormal."""
    truth = np.asarray(query_labels, dtype=object)
    predicted = np.asarray(predicted, dtype=object)
    right = truth == predicted
    m = len(truth)
    result = {"accuracy": float(right.mean()), "binary_accuracy": None,
              "ci": {"accuracy": wilson_interval(int(right.sum()), m, confidence)}, "per_class": {}}
    abnormal = abnormal_set(abnormal_labels, truth)
    if abnormal:
        positive = np.isin(truth, list(abnormal))
        binary = binary_figures(positive, np.isin(predicted, list(abnormal)), confidence)
        result["binary_accuracy"] = binary["accuracy"]
        result["ci"]["binary_accuracy"] = wilson_interval(int(round(binary["accuracy"] * m)), m, confidence)
        result["abnormal"] = binary
    for label in [d for d in DIAGNOSES if d in set(truth)] + sorted(set(truth) - set(DIAGNOSES)):
        rows = truth == label
        result["per_class"][label] = {"n": int(rows.sum()), "recall": float(right[rows].mean()),
                                      "recall_ci": wilson_interval(int(right[rows].sum()), int(rows.sum()), confidence)}
    return result


def abnormal_set(abnormal_labels, labels) -> frozenset:
    """The abnormal labels present among ``labels``' vocabulary: ``abnormal_labels`` as given,
    or Herlev's abnormal classes when None; empty when every or no label is abnormal."""
    present = set(np.asarray(labels, dtype=object).tolist())
    abnormal = frozenset(set(DIAGNOSES) - NORMAL_DIAGNOSES if abnormal_labels is None else abnormal_labels)
    inside = present & abnormal
    return frozenset(abnormal) if inside and present - abnormal else frozenset()


def auc_by_ranks(positive: np.ndarray, scores: np.ndarray, axis: int = -1) -> np.ndarray:
    """ROC AUC of ``scores`` (float) for ``positive`` cells (bool) along ``axis``, by the
    Mann-Whitney rank sum: the chance that a positive cell outscores a negative one, ties
    counting a half (as ``sklearn.metrics.roc_auc_score``); NaN where one side is empty.

    Hand-written because the bootstrap below needs the AUC of a thousand resamples at once,
    whose class counts differ: sklearn scores one sample per call (~7 ms of input checks each)
    and ``scipy.stats.mannwhitneyu`` takes the two classes as separate, equal-shaped arrays.
    """
    from scipy.stats import rankdata

    positive = np.moveaxis(np.asarray(positive, dtype=bool), axis, -1)
    ranks = rankdata(np.moveaxis(np.asarray(scores, dtype=np.float64), axis, -1), axis=-1)
    n_pos = positive.sum(axis=-1)
    n_neg = positive.shape[-1] - n_pos
    rank_sum = np.where(positive, ranks, 0.0).sum(axis=-1)
    with np.errstate(invalid="ignore", divide="ignore"):
        auc = (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)
    return np.where((n_pos > 0) & (n_neg > 0), auc, np.nan)


def roc(positive: np.ndarray, scores: np.ndarray, *, confidence: float = 0.95, seed: int = 0) -> dict | None:
    """ROC curve (sklearn.metrics.roc_curve) and AUC of ``scores`` for ``positive`` cells,
    with a seeded percentile bootstrap interval of the AUC over the cells (scipy.stats);
    None when one side is empty."""
    from scipy.stats import bootstrap
    from sklearn.metrics import roc_auc_score, roc_curve

    positive = np.asarray(positive, dtype=bool)
    scores = np.asarray(scores, dtype=np.float64)
    if positive.all() or not positive.any():
        return None
    fpr, tpr, thresholds = roc_curve(positive, scores)
    generator = {"rng" if "rng" in inspect.signature(bootstrap).parameters else "random_state":
                 np.random.default_rng(seed)}
    interval = bootstrap((positive, scores), auc_by_ranks, paired=True, vectorized=True, n_resamples=1000,
                         confidence_level=confidence, method="percentile", **generator).confidence_interval
    return {"auc": float(roc_auc_score(positive, scores)), "auc_ci": [float(interval.low), float(interval.high)],
            "fpr": fpr.round(6).tolist(), "tpr": tpr.round(6).tolist(),
            "thresholds": [round(float(t), 6) if np.isfinite(t) else None for t in thresholds]}


def site_score_figures(positive, scores, called, thresholds, groups=None, *, confidence: float = 0.95, seed: int = 0,
                       cases: int = CASES_PER_FOLD) -> dict:
    """Figures of a site's own abnormality score on held-out cells: its ROC, sensitivity and
    specificity of its calls (``called``: score at or above the site's operating point,
    ``thresholds``: each cell's), and simulated cases of these cells concluded as the
    coordinator concludes them (a cell supports an abnormality when its score reaches the
    site's operating point: ``conclusion.aligned_score``)."""
    from pathmaster.conclusion import CASE_CELLS, DEFAULT_THRESHOLD, aligned_score, simulate_cases

    positive, scores = np.asarray(positive, bool), np.asarray(scores, np.float64)
    figures = {"operating_point": {**binary_figures(positive, called, confidence),
                                   "target_sensitivity": TARGET_SENSITIVITY},
               "roc": roc(positive, scores, confidence=confidence, seed=seed), "cases": None}
    if positive.any() and (~positive).any():
        aligned = [aligned_score(s, t, DEFAULT_THRESHOLD) for s, t in zip(scores, thresholds)]
        drawn = simulate_cases(aligned, positive, groups, cases=cases, thresholds=[DEFAULT_THRESHOLD], seed=seed)
        found, cleared = round(drawn["sensitivity"][0] * cases), round(drawn["specificity"][0] * cases)
        figures["cases"] = {"cells_per_case": CASE_CELLS, "cases": 2 * cases, "abnormal_cases": cases,
                            "rule": "abnormal when a cell's score reaches the site's operating point",
                            **counted_figures(found, cases, cleared, cases, confidence)}
    return figures
