"""Retrieval quality: does a cell's neighbourhood in the site's representation carry its diagnosis?

Three ways to get rankings, one way to score them:

- ``cross_validate(X, labels, fit, groups=...)``: stratified k-fold with folds split by
  slide image (cells of one image share stain, focus and patient: on both sides of a split
  they inflate every figure); the site's representation is refitted on each fold's
  training cells by the function indexing uses and every cell is queried once against the
  training cells of its fold. The honest figure for a site's own cells: confidence
  intervals, per-class recall, sensitivity and specificity for the site's abnormal labels
  (by the 5-nearest majority, and at an operating point on the abnormality score chosen on
  the training fold by the site's rule, ``learn.operating_point``), the ROC of that score
  (``pathmaster.conclusion``), simulated 6-cell cases of held-out cells, and classifiers on
  the same folds and representation (``CEILINGS``) as a ceiling.
- ``leave_one_out(vectors, labels)``: every database cell queries the rest of the database
  (in a space fitted to all of them, the queries included: it flatters).
- ``held_out(site, records)``: cells from another dataset query the site.
- ``score_rankings(...)`` turns ranked neighbour labels into the metrics below.

Metrics (all fractions in [0, 1], means over queries):
  top1            the nearest cell has the query's diagnosis
  precision_at_5  fraction of the 5 nearest with the query's diagnosis
  majority_at_5   the most common diagnosis among the 5 nearest (ties: the one ranked
                  first) is the query's
  map             mean average precision over the full ranking of the database
  binary_accuracy normal vs abnormal (dysplasia or worse) by majority of the 5 nearest
  confusion       true diagnosis (rows) x majority@5 prediction (columns), counts

``ci`` holds each metric's 95% confidence interval [low, high]: Wilson score intervals for the proportions
(top1, majority_at_5, binary_accuracy, per-class recall, sensitivity, specificity), a seeded
percentile bootstrap over queries for the means of per-query values (precision_at_5, map)
and the ROC AUC. Queries are treated as independent, which holds best for held-out folds
of distinct slide images.

The group-aware folds are scikit-learn's StratifiedGroupKFold; ROC curves and AUC
scikit-learn's; the operating point (a threshold meeting a target sensitivity) is the
site's own rule (``pathmaster.learn.operating_point``) and the simulated cases (1-2 abnormal
cells among normal ones) the case conclusion's (``pathmaster.conclusion.simulate_cases``).
"""

from __future__ import annotations

import inspect
from typing import Callable

import numpy as np

from pathmaster import defaults, learn
from pathmaster.learn import majority_vote
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


def _is_normal(label: str) -> bool:
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
        votes = [majority_vote([_is_normal(x) for x in row[:k]]) for row in ranked_labels]
        binary_right = np.array([v == _is_normal(q) for v, q in zip(votes, query_labels)])
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


def leave_one_out(vectors: np.ndarray, labels, k: int = defaults.K, *, max_queries: int | None = None,
                  seed: int = 0, chunk: int = 512) -> dict:
    """Leave-one-out metrics of a database: each cell (or a seeded sample of ``max_queries``
    cells) ranks all the other cells by Euclidean distance in ``vectors`` (n, d).

    The ranking is exact (NumPy, in chunks of ``chunk`` queries) so that ``map`` covers the
    whole database; returns ``score_rankings``'s dict.
    """
    X = np.asarray(vectors, dtype=np.float64)
    labels = np.asarray(labels, dtype=object)
    n = len(X)
    if n <= k:
        raise ValueError(f"leave-one-out needs more than {k} cells, got {n}")
    queries = np.arange(n)
    if max_queries is not None and max_queries < n:
        queries = np.sort(np.random.default_rng(seed).choice(n, max_queries, replace=False))
    _, codes = np.unique(labels, return_inverse=True)
    sq_norms = (X * X).sum(axis=1)
    top = np.empty((len(queries), k), dtype=object)
    ap = np.empty(len(queries))
    for start in range(0, len(queries), chunk):
        rows = queries[start:start + chunk]
        d = sq_norms[rows, None] - 2.0 * X[rows] @ X.T + sq_norms[None, :]
        d[np.arange(len(rows)), rows] = np.inf  # leave the query itself out
        order = np.argsort(d, axis=1, kind="stable")[:, : n - 1]
        top[start:start + len(rows)] = labels[order[:, :k]]
        ap[start:start + len(rows)] = average_precisions(codes[order] == codes[rows][:, None])
    return score_rankings(labels[queries], top, ap, k)


def stratified_folds(labels, folds: int = 5, seed: int = 0, groups=None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded stratified k-fold split: a list of (train, test) int64 index arrays.

    Every cell is in exactly one test fold and each class is spread over the folds as
    evenly as the groups allow. ``groups`` (n cells; None or a None entry: unknown) are the
    slide images the cells come from: cells of one group are never on both sides of a split
    (scikit-learn's StratifiedGroupKFold; a cell without a group is a group of its own),
    without groups scikit-learn's StratifiedKFold, both shuffled with ``seed``. ``folds`` is
    lowered to the size of the largest class (and to the number of groups) when that is
    smaller (a tiny site), but never below 2.
    """
    import warnings

    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    labels = np.asarray(labels, dtype=object)
    _, codes, counts = np.unique(labels.astype(str), return_inverse=True, return_counts=True)
    folds = max(2, min(int(folds), int(counts.max())))
    group_codes = _group_codes(groups, len(labels))
    if group_codes is not None:
        folds = max(2, min(folds, len(np.unique(group_codes))))
    if len(labels) < folds:
        raise ValueError(f"{folds}-fold cross-validation needs at least {folds} labelled cells, got {len(labels)}")
    with warnings.catch_warnings():
        # a class with fewer cells than folds is simply missing from some test folds
        warnings.filterwarnings("ignore", message=".*least populated class.*", category=UserWarning)
        if group_codes is None:
            splits = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(len(labels)), codes)
        else:
            splits = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(
                np.zeros(len(labels)), codes, group_codes)
        return [(train.astype(np.int64), test.astype(np.int64)) for train, test in splits]


def _group_codes(groups, n: int) -> np.ndarray | None:
    """int64 (n,) group numbers, a cell without a group alone in its own; None when no cell has one."""
    if groups is None:
        return None
    groups = list(groups)
    if len(groups) != n:
        raise ValueError(f"{len(groups)} groups for {n} cells")
    if all(g is None for g in groups):
        return None
    names = [("group", g) if g is not None else ("cell", i) for i, g in enumerate(groups)]
    index = {name: number for number, name in enumerate(dict.fromkeys(names))}
    return np.array([index[name] for name in names], dtype=np.int64)


def group_summary(groups, n: int) -> dict:
    """What a site says about the slide images of its cells: ``known`` (any group), ``groups``
    (distinct), ``cells_without`` a group, and ``note`` in words when folds cannot honour them."""
    groups = [None] * n if groups is None else list(groups)
    known = [g for g in groups if g is not None]
    summary = {"known": bool(known), "groups": len(set(known)), "cells_without": n - len(known), "note": None}
    if not known:
        summary["note"] = ("this site records no slide image for its cells: folds split cells, and cells of one "
                           "image on both sides of a split (same stain, focus, patient) make every figure look better")
    elif summary["cells_without"]:
        summary["note"] = (f"{summary['cells_without']} of {n} cells have no recorded slide image; "
                           "each is treated as an image of its own")
    return summary


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


def _distances(V_query: np.ndarray, V_base: np.ndarray) -> np.ndarray:
    """Squared Euclidean distances (m, n), never below 0."""
    d = ((V_query * V_query).sum(axis=1)[:, None] - 2.0 * V_query @ V_base.T + (V_base * V_base).sum(axis=1)[None, :])
    return np.maximum(d, 0.0)


def _apart(d: np.ndarray, group_codes: np.ndarray | None) -> np.ndarray:
    """Training cells queried against the other training cells: ``d`` (n, n) with each cell,
    and every cell of its slide image, out of its own reach (as a held-out image would be)."""
    d = d.copy()
    np.fill_diagonal(d, np.inf)
    if group_codes is not None:
        d[group_codes[:, None] == group_codes[None, :]] = np.inf
    return d


def _knn_votes(labels_sorted: np.ndarray, distances: np.ndarray, classes: np.ndarray, weighted: bool) -> np.ndarray:
    """Class votes (m, n_classes) of neighbours' labels (m, k) nearest first; weighted by
    distance as the case conclusion weighs matches, or equal."""
    from pathmaster.conclusion import match_weights

    weights = (np.vstack([match_weights(row, len(row), "distance") for row in distances]) if weighted
               else np.ones(distances.shape))
    votes = np.zeros((len(labels_sorted), len(classes)))
    for column, label in enumerate(classes):
        votes[:, column] = (weights * (labels_sorted == label)).sum(axis=1)
    return votes


def _tuned_knn(V_train, y_train, V_test, d_train_apart, d_test, seed):
    """k nearest neighbours with k and distance weighting chosen on the training cells alone
    (each queried with its slide image held apart); returns (predictions for the test
    cells, the choice)."""
    classes = np.unique(y_train)
    finite = np.isfinite(d_train_apart).sum(axis=1).min()
    best = None
    order = np.argsort(d_train_apart, axis=1, kind="stable")
    for k in KNN_CHOICES:
        if k > finite:
            break
        near = order[:, :k]
        dist = np.sqrt(np.take_along_axis(d_train_apart, near, axis=1))
        for weighted in (False, True):
            votes = _knn_votes(y_train[near], dist, classes, weighted)
            right = float((classes[votes.argmax(axis=1)] == y_train).mean())
            if best is None or right > best[0] + 1e-12:
                best = (right, k, weighted)
    _, k, weighted = best if best else (0.0, min(defaults.K, len(y_train)), False)
    near = np.argsort(d_test, axis=1, kind="stable")[:, :k]
    dist = np.sqrt(np.take_along_axis(d_test, near, axis=1))
    votes = _knn_votes(y_train[near], dist, classes, weighted)
    return classes[votes.argmax(axis=1)], {"k": int(k), "distance_weighted": bool(weighted)}


def _logistic(V_train, y_train, V_test, d_train_apart, d_test, seed):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    model = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=5000))
    model.fit(V_train, y_train.astype(str))
    return model.predict(V_test), {"C": 1.0}


# Classifiers fitted on each training fold in the SAME representation the retrieval searches
# (the site's fitted similarity): what a supervised model gets out of it. Tuned kNN includes
# the retrieval's own 5-nearest vote among its choices, so it is a ceiling of the retrieval.
CEILINGS: dict[str, Callable] = {"knn_tuned": _tuned_knn, "logistic_regression": _logistic}
KNN_CHOICES = (1, 3, 5, 7, 9, 11, 15, 21, 31)


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
    abnormal = _abnormal_set(abnormal_labels, truth)
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


def _abnormal_set(abnormal_labels, labels) -> frozenset:
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


def cross_validate(X: np.ndarray, labels, fit: Callable, *, groups=None, abnormal_labels=None, folds: int = 5,
                   seed: int = 0, k: int = defaults.K, ceilings=tuple(CEILINGS), confidence: float = 0.95,
                   cases: int = CASES_PER_FOLD, target_sensitivity: float = learn.TARGET_SENSITIVITY,
                   progress: bool = False, site_score: Callable | None = None) -> dict:
    """Stratified k-fold retrieval metrics, folds split by slide image, the similarity
    refitted on each training fold.

    X: float (n_cells, n_features) raw feature values; labels: n_cells diagnoses; groups:
    n_cells slide images (None: unknown, see ``stratified_folds``); abnormal_labels: the
    site's abnormal diagnoses (default Herlev's); fit: ``fit(X_train, labels_train) ->
    transform``, where ``transform(X)`` maps raw features to search vectors (float (m, d)),
    fitted on the training cells only (``site_similarity_fit``: the site's own fit).
    Each cell is queried once, against the training cells of its fold, by exact Euclidean
    distance; ``map`` covers the whole training fold. Everything chosen (the operating
    points on the abnormality score, for cells and for simulated cases, and the ceilings'
    settings) is chosen on the training fold alone, each training cell queried with its
    slide image held apart. ``ceilings`` names classifiers of ``CEILINGS`` fitted on the
    same folds and representation; ``cases`` simulated cases per fold (``simulate_cases``);
    ``progress`` shows a bar per fold on stderr. ``site_score(train, test)`` (``site_score_fit``):
    the site's own abnormality score and operating point learnt on the training fold, and
    the test cells' scores, as the site answers queries; its figures go to ``site_score``.

    Returns ``score_rankings``'s dict (pooled over all held-out queries) plus ``folds``,
    ``seed``, ``groups`` (``group_summary``), ``per_fold``, ``abnormal`` (sensitivity and
    specificity of the majority vote and of the operating point, the ROC of the abnormality
    score; None when the labels have no abnormal and normal side), ``cases``, ``site_score``
    (``_Run.site_figures``; None without ``site_score``) and ``ceilings`` (name ->
    ``score_predictions`` dict with each fold's choice).
    """
    from tqdm import tqdm

    X = np.asarray(X, dtype=np.float64)
    labels = np.asarray(labels, dtype=object)
    n = len(labels)
    splits = stratified_folds(labels, folds, seed, groups)
    codes = _group_codes(groups, n)
    abnormal = _abnormal_set(abnormal_labels, labels)
    positive = np.isin(labels, list(abnormal))
    run = _Run(n, k, ceilings, site_score)
    for number, (train, test) in enumerate(tqdm(splits, desc="cross-validating", unit="fold", disable=not progress)):
        if len(train) < k:
            raise ValueError(f"fold {number}: {len(train)} training cells, fewer than k = {k}")
        run.fold(number, train, test, fit, X, labels, codes, abnormal, positive, seed, cases, target_sensitivity)
    metrics = score_rankings(labels, run.top, run.ap, k, confidence=confidence, seed=seed)
    metrics["folds"], metrics["seed"] = len(splits), seed
    metrics["groups"] = group_summary(groups, n)
    metrics["per_fold"] = []
    for number in range(len(splits)):
        part = score_rankings(labels[run.fold_of == number], run.top[run.fold_of == number], None, k, seed=seed)
        metrics["per_fold"].append({key: part[key] for key in ("queries", "top1", "majority_at_5", "binary_accuracy")})
    metrics["abnormal"] = run.abnormal_figures(positive, abnormal, target_sensitivity, confidence, seed)
    metrics["cases"] = run.case_figures(target_sensitivity, confidence) if abnormal else None
    metrics["site_score"] = (run.site_figures(positive, codes, confidence, seed, cases * len(splits))
                             if abnormal and site_score is not None else None)
    metrics["ceilings"] = {}
    for name in ceilings:
        metrics["ceilings"][name] = score_predictions(labels, run.predictions[name], confidence=confidence,
                                                      abnormal_labels=abnormal or None)
        metrics["ceilings"][name]["choices"] = run.choices[name]
    return metrics


class _Run:
    """What the folds of ``cross_validate`` gather, and the figures made of it."""

    def __init__(self, n: int, k: int, ceilings, site_score: Callable | None = None):
        self.k = k
        self.site_score = site_score
        self.site_scores = np.full(n, np.nan)
        self.site_folds: list[dict] = []
        self.top = np.empty((n, k), dtype=object)
        self.ap = np.empty(n)
        self.fold_of = np.empty(n, dtype=np.int64)
        self.scores = np.zeros(n)
        self.called = np.zeros(n, dtype=bool)
        self.thresholds: list[float] = []
        self.case_counts = np.zeros(4, dtype=np.int64)  # abnormal found, abnormal cases, normal cleared, normal cases
        self.case_thresholds: list[float] = []
        self.case_targets_met: list[bool] = []
        self.predictions = {name: np.empty(n, dtype=object) for name in ceilings}
        self.choices: dict[str, list] = {name: [] for name in ceilings}

    def fold(self, number, train, test, fit, X, labels, codes, abnormal, positive, seed, cases, target):
        k = self.k
        transform = fit(X[train], labels[train])
        V_train = np.asarray(transform(X[train]), dtype=np.float64)
        V_test = np.asarray(transform(X[test]), dtype=np.float64)
        d_test = _distances(V_test, V_train)
        order = np.argsort(d_test, axis=1, kind="stable")
        ranked = labels[train][order]
        self.top[test] = ranked[:, :k]
        self.ap[test] = average_precisions(ranked == labels[test][:, None])
        self.fold_of[test] = number
        d_apart = _apart(_distances(V_train, V_train), None if codes is None else codes[train])
        if abnormal:
            flags = list(abnormal)
            near = np.sqrt(np.take_along_axis(d_test, order[:, :k], axis=1))
            self.scores[test] = abnormality_scores(np.isin(ranked[:, :k], flags), near)
            apart_order = np.argsort(d_apart, axis=1, kind="stable")[:, :k]
            train_scores = abnormality_scores(np.isin(labels[train][apart_order], flags),
                                             np.sqrt(np.take_along_axis(d_apart, apart_order, axis=1)))
            threshold = learn.operating_point(train_scores, positive[train], target)["threshold"]
            self.thresholds.append(threshold)
            self.called[test] = self.scores[test] >= threshold
            self._cases(number, train_scores, positive[train], self.scores[test], positive[test],
                        None if codes is None else codes[train], None if codes is None else codes[test], seed, cases)
            if self.site_score is not None:
                fitted = self.site_score(train, test)
                self.site_scores[test] = fitted["scores"]
                self.site_folds.append({"score": fitted["score"], "threshold": float(fitted["threshold"]),
                                        "cell_threshold": float(fitted.get("cell_threshold", fitted["threshold"])),
                                        "note": fitted.get("note", "")})
        for name in self.predictions:
            predicted, choice = CEILINGS[name](V_train, labels[train], V_test, d_apart, d_test, seed)
            self.predictions[name][test] = predicted
            self.choices[name].append(choice)

    def _cases(self, number, train_scores, train_truth, test_scores, test_truth, train_groups, test_groups,
               seed, cases) -> None:
        """Simulated cases (``pathmaster.conclusion.simulate_cases``): the case threshold is
        the one the training fold's cells choose (the target case specificity with the best
        sensitivity), then scored on cases drawn from the held-out cells."""
        from pathmaster.conclusion import simulate_cases

        if not (train_truth.any() and (~train_truth).any() and test_truth.any() and (~test_truth).any()):
            return
        fitted = simulate_cases(train_scores, train_truth, train_groups, cases=cases, seed=seed * 1000 + number)
        held = simulate_cases(test_scores, test_truth, test_groups, cases=cases, thresholds=[fitted["chosen"]],
                              seed=seed * 1000 + number + 500)
        sensitivity, specificity = held["sensitivity"][0], held["specificity"][0]
        self.case_counts += [round(sensitivity * cases), cases, round(specificity * cases), cases]
        self.case_thresholds.append(fitted["chosen"])
        self.case_targets_met.append(fitted["met"])

    def abnormal_figures(self, positive, abnormal, target, confidence, seed) -> dict | None:
        if not abnormal:
            return None
        majority = np.array([majority_vote([x in abnormal for x in row]) for row in self.top], dtype=bool)
        return {"labels": sorted(abnormal), "name": "match_share",
                "score": "distance-weighted share of abnormal cells among the k matches (pathmaster.conclusion)",
                "majority": binary_figures(positive, majority, confidence),
                "operating_point": {**binary_figures(positive, self.called, confidence), "target_sensitivity": target,
                                    "thresholds": [round(t, 6) for t in self.thresholds]},
                "roc": roc(positive, self.scores, confidence=confidence, seed=seed)}

    def site_figures(self, positive, codes, confidence, seed, cases) -> dict:
        """The site's own score (``site_score_fit``): ROC, the calls at each fold's operating
        point, and simulated cases concluded as the coordinator concludes them."""
        thresholds = np.array([fold["threshold"] for fold in self.site_folds])[self.fold_of]
        called = self.site_scores >= thresholds
        figures = site_score_figures(positive, self.site_scores, called, thresholds, codes, confidence=confidence,
                                     seed=seed, cases=cases)
        names = [fold["score"] for fold in self.site_folds]
        figures["score"] = names[0] if len(set(names)) == 1 else names
        figures["per_fold"] = [{**fold, **{key: binary_figures(positive[self.fold_of == f], called[self.fold_of == f],
                                                              confidence)[key]
                                          for key in ("sensitivity", "specificity", "missed", "false_alarms")}}
                               for f, fold in enumerate(self.site_folds)]
        figures["operating_point"]["thresholds"] = [round(fold["threshold"], 6) for fold in self.site_folds]
        figures["operating_point"]["rule"] = ("each training fold's own, as the site chooses it when indexed: "
                                              "for 6-cell cases of its held-out cells")
        # what the per-cell rule (the threshold for per-cell sensitivity) would have given
        cell = np.array([fold["cell_threshold"] for fold in self.site_folds])[self.fold_of]
        by_cell = site_score_figures(positive, self.site_scores, self.site_scores >= cell, cell, codes,
                                     confidence=confidence, seed=seed, cases=cases)
        figures["cell_rule"] = {"operating_point": {**by_cell["operating_point"],
                                                    "thresholds": [round(f["cell_threshold"], 6)
                                                                   for f in self.site_folds]},
                                "cases": by_cell["cases"]}
        return figures

    def case_figures(self, target, confidence) -> dict | None:
        from pathmaster.conclusion import CASE_CELLS, TARGET_CASE_SPECIFICITY

        found, sick, cleared, well = (int(v) for v in self.case_counts)
        if not sick or not well:
            return None
        return {"cells_per_case": CASE_CELLS, "cases": sick + well, "abnormal_cases": sick,
                "rule": "abnormal when a cell's abnormality score reaches the threshold the training fold's "
                        f"simulated cases choose (case specificity >= {TARGET_CASE_SPECIFICITY:.2f}, best sensitivity)",
                **counted_figures(found, sick, cleared, well, confidence),
                "thresholds": [round(t, 6) for t in self.case_thresholds],
                "target_met_on_training": self.case_targets_met}


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
                                   "target_sensitivity": learn.TARGET_SENSITIVITY},
               "roc": roc(positive, scores, confidence=confidence, seed=seed), "cases": None}
    if positive.any() and (~positive).any():
        aligned = [aligned_score(s, t, DEFAULT_THRESHOLD) for s, t in zip(scores, thresholds)]
        drawn = simulate_cases(aligned, positive, groups, cases=cases, thresholds=[DEFAULT_THRESHOLD], seed=seed)
        found, cleared = round(drawn["sensitivity"][0] * cases), round(drawn["specificity"][0] * cases)
        figures["cases"] = {"cells_per_case": CASE_CELLS, "cases": 2 * cases, "abnormal_cases": cases,
                            "rule": "abnormal when a cell's score reaches the site's operating point",
                            **counted_figures(found, cases, cleared, cases, confidence)}
    return figures


# The last representation fitted (``_fit_representation``): cross-validation's fit and the
# site's score fit the same training fold one after the other.
_LAST_FIT: dict = {}


def _fit_representation(X_train: np.ndarray, labels_train, names: list[str], choice: str, seed: int):
    """``index.fit_representation``, once for the same cells and choices."""
    import hashlib

    from pathmaster import index

    key = (hashlib.sha256(np.ascontiguousarray(X_train, np.float64).tobytes()).hexdigest(),
           tuple(map(str, labels_train)), tuple(names), choice, seed)
    if key not in _LAST_FIT:
        _LAST_FIT.clear()
        _LAST_FIT[key] = index.fit_representation(X_train, labels_train, names, choice, seed=seed)
    return _LAST_FIT[key]


def site_similarity_fit(names: list[str], choice: str = "auto", seed: int = 0, min_cells: int | None = None) -> Callable:
    """A ``fit`` for ``cross_validate`` that refits a site's representation on each training
    fold with the function indexing uses (``pathmaster.index.fit_representation``)."""
    def fit(X_train: np.ndarray, labels_train: np.ndarray) -> Callable:
        normalization, projection = _fit_representation(X_train, labels_train, names, choice, seed)
        return lambda X: projection.apply(normalization.apply(X))

    return fit


def site_score_fit(X: np.ndarray, labels, groups, names: list[str], abnormal_labels, *, choice: str = "auto",
                   similarity_choice: str = "auto", eye_vectors: np.ndarray | None = None, eye: dict | None = None,
                   seed: int = 0) -> Callable:
    """A ``site_score`` for ``cross_validate``: ``site_score(train, test)`` learns on the
    training cells what indexing learns (``pathmaster.learnt.learn_from``: the lens and head
    on the cells' ``eye_vectors`` (float (n, D), by the eye ``eye`` describes) when given, the
    feature classifier, the abnormality score and its operating point, chosen for the case)
    and scores the test cells as ``SiteIndex.abnormality`` does. Returns {"score",
    "threshold", "cell_threshold", "scores" (m,), "note"}. X, labels, groups: the cells
    ``cross_validate`` is given (its indices)."""
    from pathmaster import learnt
    from pathmaster.abnormality import FeatureClassifier
    from pathmaster.embedding import neighbour_share

    labels = np.asarray(labels, dtype=object).astype(str)
    abnormal = set(abnormal_labels)

    def score(train: np.ndarray, test: np.ndarray) -> dict:
        normalization, projection = _fit_representation(X[train], labels[train], names, choice, seed)
        Z = normalization.apply(X)
        train_groups = None if groups is None else list(np.asarray(groups, dtype=object)[train])
        train_groups = None if train_groups is None or None in train_groups else np.asarray(train_groups, str)
        use_eye = eye_vectors is not None and similarity_choice != "features"
        fitted, lens = learnt.learn_from(Z[train], labels[train], train_groups, abnormal, projection, names,
                                         eye_vectors[train] if use_eye else None, eye if use_eye else None,
                                         choice=similarity_choice, seed=seed)
        features, embeddings = projection.apply(Z).astype(np.float64), None
        if lens is not None:
            embeddings = lens.embed(eye_vectors)
            refit = learn.fitted_similarity(embeddings[train], features[train])  # as indexing, on the site's cells
            fitted.mean, fitted.std = refit.mean, refit.std
            fitted.feature_scale, fitted.embedding_scale = refit.feature_scale, refit.embedding_scale
        vectors = np.asarray(fitted.vectors(features, embeddings), np.float64)
        nearest = np.argsort(_distances(vectors[test], vectors[train]), axis=1, kind="stable")[:, :defaults.K]
        network = (lens.abnormal_probability(eye_vectors[test]) if lens is not None and lens.head is not None
                   else [None] * len(test))
        classifier = FeatureClassifier.from_dict(fitted.classifier)
        by_features = classifier.abnormal_probability(Z[test]) if classifier is not None else [None] * len(test)
        scores = [fitted.abnormal_score(p, neighbour_share(labels[train][row], abnormal, fitted.k), c)
                  for p, row, c in zip(network, nearest, by_features)]
        case = (fitted.report or {}).get("case") or {}
        return {"score": fitted.score, "threshold": float(fitted.threshold),
                "cell_threshold": float(case.get("cell_rule", {}).get("threshold", fitted.threshold)),
                "scores": np.asarray(scores), "note": (fitted.report or {}).get("reason", "")}

    return score


def held_out(site, records, k: int = defaults.K) -> tuple[dict, list]:
    """Metrics of query cells from another dataset against ``site`` (a ``SiteIndex``).

    records: iterable of ``CellRecord`` (with diagnoses) and ``ImportProblem``s; cells that
    cannot be analysed are skipped and returned as (source, problem) pairs alongside the
    metrics, so a bad query file never stops an evaluation.
    """
    from pathmaster.ingest import problem_pair
    from pathmaster.records import CellRecord, InvalidInput

    labels, ranked, distances, ap, problems, site_scores = [], [], [], [], [], []
    for record in records:
        if not isinstance(record, CellRecord):
            problems.append(problem_pair(record))
            continue
        if record.diagnosis is None:
            problems.append((record.source_id, "query cell has no diagnosis to score against"))
            continue
        try:
            analysis = site.analyse(record.image, record.background, record.mask)
        except InvalidInput as exc:
            problems.append((record.source_id, exc.problem))
            continue
        embedding = site.embedding_of(analysis)
        matches = site.search(analysis.features, k=len(site), embedding=None if embedding is None else embedding[0])
        site_scores.append(site.abnormality(embedding, [matches[:k]], analysis.features[None])[0])
        ranking = [m.diagnosis for m in matches]
        labels.append(record.diagnosis)
        ranked.append(ranking[:k])
        distances.append([m.distance for m in matches[:k]])
        ap.append(average_precisions(np.asarray(ranking, dtype=object) == record.diagnosis)[0])
    if not labels:
        raise ValueError("no query cell could be analysed: " + "; ".join(f"{s}: {p}" for s, p in problems[:5]))
    ranked = np.asarray(ranked, dtype=object)
    metrics = score_rankings(labels, ranked, np.asarray(ap), k)
    abnormal = _abnormal_set(site.vocabulary.abnormal, np.concatenate([labels, site.labels()]))
    metrics["abnormal"] = None
    if abnormal:
        positive = np.isin(labels, list(abnormal))
        majority = np.array([majority_vote([x in abnormal for x in row]) for row in ranked], dtype=bool)
        scores = abnormality_scores(np.isin(ranked, list(abnormal)), np.asarray(distances))
        metrics["abnormal"] = {"labels": sorted(abnormal), "name": "match_share",
                               "score": "distance-weighted share of abnormal cells among the k matches "
                                        "(pathmaster.conclusion)",
                               "majority": binary_figures(positive, majority),
                               "operating_point": None, "roc": roc(positive, scores)}
    metrics["site_score"] = None
    if abnormal and site.vocabulary.abnormal:
        threshold = float(site.learnt.threshold)
        figures = site_score_figures(positive, site_scores, np.asarray(site_scores) >= threshold,
                                     [threshold] * len(site_scores))
        figures["score"] = site.learnt.score
        figures["operating_point"]["thresholds"] = [round(threshold, 6)]
        figures["operating_point"]["rule"] = "the site's own, chosen when it was indexed"
        metrics["site_score"] = figures
    return metrics, problems


def _interval(ci: dict, key: str) -> str:
    low_high = ci.get(key)
    return "" if low_high is None else f"  [{low_high[0]:.3f}, {low_high[1]:.3f}]"


def _pair(figures: dict) -> str:
    """'sensitivity 0.912 [0.88, 0.94]  specificity ...' of ``binary_figures``."""
    parts = []
    for key in ("sensitivity", "specificity"):
        value = figures[key]
        low, high = figures[f"{key}_ci"]
        parts.append(f"{key} {'n/a' if value is None else f'{value:.3f}'} [{low:.3f}, {high:.3f}]")
    return "  ".join(parts)


def _abnormal_lines(metrics: dict) -> list[str]:
    """The report's lines on abnormal cells, simulated cases and the ROC."""
    abnormal = metrics.get("abnormal")
    if abnormal is None:
        return ["", "abnormal vs normal: n/a (the site's labels have no abnormal and normal side)"]
    majority, point = abnormal["majority"], abnormal["operating_point"]
    lines = ["", f"abnormal ({', '.join(abnormal['labels'])}) vs normal: "
                 f"{majority['positives']} abnormal, {majority['negatives']} normal cells",
             f"  majority of the {metrics['k']} matches   {_pair(majority)}  ({majority['missed']} abnormal called normal)"]
    if point:
        lines.append(f"  match share's operating point {_pair(point)}  ({point['missed']} abnormal called normal;"
                     f" threshold chosen on each training fold for sensitivity >= {point['target_sensitivity']:.2f})")
    curve = abnormal.get("roc")
    if curve:
        lines.append(f"  ROC AUC of the match share {curve['auc']:.3f} [{curve['auc_ci'][0]:.3f}, "
                     f"{curve['auc_ci'][1]:.3f}] ({abnormal['score']})")
    cases = metrics.get("cases")
    if cases:
        lines.append(f"  simulated {cases['cells_per_case']}-cell cases of held-out cells by the match share "
                     f"({cases['cases']}, {cases['abnormal_cases']} with 1-2 abnormal cells): {_pair(cases)}")
    return lines + _site_score_lines(metrics.get("site_score"))


def _site_score_lines(site: dict | None) -> list[str]:
    """The report's lines on the score the site decides by: a pathologist's line, then the figures."""
    from pathmaster.embedding import SCORE_WORDS

    if not site:
        return []
    point, names = site["operating_point"], site["score"]
    name = names if isinstance(names, str) else max(set(names), key=names.count)
    lines = ["", f"the site's own abnormality score ({name if isinstance(names, str) else ', '.join(names)}), "
                 "as it answers queries and as the case conclusion reads it:",
             f"  In plain words: the site calls a cell abnormal by {SCORE_WORDS.get(name, name)}; on cells it had "
             f"not seen it found {point['positives'] - point['missed']} of {point['positives']} abnormal cells and "
             f"cleared {point['negatives'] - point['false_alarms']} of {point['negatives']} normal ones "
             "(decision support, not a diagnosis).",
             f"  at its operating point    {_pair(point)}  ({point['missed']} abnormal called normal; "
             f"{point['rule']})"]
    for fold in site.get("per_fold", []):
        shown = {key: "n/a" if fold[key] is None else f"{fold[key]:.3f}" for key in ("sensitivity", "specificity")}
        lines.append(f"    fold: {fold['score']} >= {fold['threshold']:.3f}: sensitivity {shown['sensitivity']}"
                     f"  specificity {shown['specificity']}")
    if site.get("roc"):
        curve = site["roc"]
        lines.append(f"  ROC AUC {curve['auc']:.3f} [{curve['auc_ci'][0]:.3f}, {curve['auc_ci'][1]:.3f}]")
    if site.get("cases"):
        cases = site["cases"]
        lines.append(f"  simulated {cases['cells_per_case']}-cell cases ({cases['cases']}, {cases['abnormal_cases']} "
                     f"with 1-2 abnormal cells): {_pair(cases)}")
    by_cell = site.get("cell_rule")
    if by_cell:
        lines.append(f"  the per-cell rule instead (sensitivity >= {by_cell['operating_point']['target_sensitivity']:.2f}"
                     f" a cell): cells {_pair(by_cell['operating_point'])}"
                     + (f"; cases {_pair(by_cell['cases'])}" if by_cell.get("cases") else ""))
    return lines


def format_report(metrics: dict) -> str:
    """The metrics as a short plain-text report: each metric with its confidence interval,
    abnormal sensitivity and specificity, the ROC AUC, simulated cases, per-class recall,
    the classifier ceilings (when cross-validated) and the confusion matrix."""
    ci = metrics.get("ci", {})
    head = f"queries: {metrics['queries']}"
    if "folds" in metrics:
        groups = metrics.get("groups") or {}
        split = f"split by slide image, {groups['groups']} images" if groups.get("known") else "split by cell"
        head += f" ({metrics['folds']}-fold stratified cross-validation, {split}, seed {metrics['seed']})"
    lines = [head]
    if (metrics.get("groups") or {}).get("note"):
        lines.append(f"note: {metrics['groups']['note']}")
    if ci:
        lines.append(f"{'':16s} {'value':>5s}  {int(round(100 * metrics.get('confidence', 0.95)))}% interval")
    for key in ("top1", "precision_at_5", "majority_at_5", "map", "binary_accuracy"):
        value = metrics.get(key)
        lines.append(f"{key:16s} {'n/a' if value is None else f'{value:.3f}'}{_interval(ci, key)}")
    if "abnormal" in metrics:
        lines += _abnormal_lines(metrics)
    ceilings = metrics.get("ceilings") or {}
    per_class = metrics["per_class"]
    lines.append("")
    lines.append("recall per class (majority@5" + "".join(f" | {name}" for name in ceilings) + "):")
    for label, row in per_class.items():
        cells = [f"{row['majority_at_5']:.3f}{_interval(row, 'recall_ci')}"]
        cells += [f"{c['per_class'][label]['recall']:.3f}" for c in ceilings.values() if label in c["per_class"]]
        lines.append(f"  {label[:21]:21s} n={row['n']:<4d} " + " | ".join(cells))
    if ceilings:
        lines.append("")
        lines.append("classifier ceiling on the same folds and representation (accuracy = its top1; "
                     f"retrieval's majority@5: {metrics['majority_at_5']:.3f}):")
        for name, c in ceilings.items():
            binary = "n/a" if c["binary_accuracy"] is None else f"{c['binary_accuracy']:.3f}"
            lines.append(f"  {name:20s} accuracy {c['accuracy']:.3f}{_interval(c['ci'], 'accuracy')}"
                         f"  binary {binary}{_interval(c['ci'], 'binary_accuracy')}")
    confusion = metrics["confusion"]
    labels = confusion["labels"]
    short = [label[:10] for label in labels]
    lines.append("")
    lines.append(f"confusion ({confusion['rows']} x {confusion['columns']}):")
    lines.append(" " * 22 + " ".join(f"{s:>10s}" for s in short))
    for label, row in zip(labels, confusion["matrix"]):
        lines.append(f"{label[:21]:21s} " + " ".join(f"{c:10d}" for c in row))
    return "\n".join(lines)
