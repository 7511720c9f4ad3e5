"""Retrieval quality: does a cell's neighbourhood in feature space carry its diagnosis?

Three ways to get rankings, one way to score them:

- ``cross_validate(X, labels, fit)``: stratified k-fold; the similarity (z-scores and
  feature choice) is refitted on each fold's training cells and every cell is queried
  once, against the training cells of its fold. This is the honest figure for a site's
  own cells, and it comes with confidence intervals, per-class recall and, on the same
  folds, classifiers on the same features (``CEILINGS``) as a ceiling.
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
(top1, majority_at_5, binary_accuracy, per-class recall), a seeded percentile bootstrap
over queries for the means of per-query values (precision_at_5, map). Queries are treated
as independent, which holds for held-out folds of distinct cells.
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Callable

import numpy as np

from pathmaster import defaults
from pathmaster.records import DIAGNOSES, NORMAL_DIAGNOSES


def majority_vote(labels) -> str:
    """Most common label in rank order; a tie goes to the tied label that appears first."""
    counts = Counter(labels)
    top = max(counts.values())
    return next(label for label in labels if counts[label] == top)


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


def stratified_folds(labels, folds: int = 5, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded stratified k-fold split: a list of (train, test) int64 index arrays.

    Every cell is in exactly one test fold and each class is spread evenly over the folds
    (scikit-learn's StratifiedKFold, shuffled with ``seed``). ``folds`` is lowered to the
    size of the largest class when that is smaller (a tiny site), but never below 2.
    """
    from sklearn.model_selection import StratifiedKFold

    labels = np.asarray(labels, dtype=object)
    _, codes, counts = np.unique(labels.astype(str), return_inverse=True, return_counts=True)
    folds = max(2, min(int(folds), int(counts.max())))
    if len(labels) < folds:
        raise ValueError(f"{folds}-fold cross-validation needs at least {folds} labelled cells, got {len(labels)}")
    splitter = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    import warnings

    with warnings.catch_warnings():
        # a class with fewer cells than folds is simply missing from some test folds
        warnings.filterwarnings("ignore", message=".*least populated class.*", category=UserWarning)
        return [(train.astype(np.int64), test.astype(np.int64))
                for train, test in splitter.split(np.zeros(len(labels)), codes)]


def _logistic(seed: int):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), LogisticRegression(C=0.1, max_iter=5000))


def _forest(seed: int):
    from sklearn.ensemble import RandomForestClassifier

    return RandomForestClassifier(n_estimators=200, min_samples_leaf=2, random_state=seed, n_jobs=1)


# Classifiers fitted on the same training folds and features as the retrieval: what a
# supervised model gets out of the features, i.e. how much the 5-nearest vote leaves.
CEILINGS: dict[str, Callable] = {"logistic_regression": _logistic, "random_forest": _forest}


def score_predictions(query_labels, predicted, *, confidence: float = 0.95) -> dict:
    """Accuracy, binary (normal vs abnormal) accuracy and per-class recall of class predictions,
    with Wilson intervals; ``binary_accuracy`` is None outside the Herlev vocabulary."""
    truth = np.asarray(query_labels, dtype=object)
    predicted = np.asarray(predicted, dtype=object)
    right = truth == predicted
    m = len(truth)
    result = {"accuracy": float(right.mean()), "binary_accuracy": None,
              "ci": {"accuracy": wilson_interval(int(right.sum()), m, confidence)}, "per_class": {}}
    if set(truth.tolist()) | set(predicted.tolist()) <= set(DIAGNOSES):
        same = np.array([_is_normal(t) == _is_normal(g) for t, g in zip(truth, predicted)])
        result["binary_accuracy"] = float(same.mean())
        result["ci"]["binary_accuracy"] = wilson_interval(int(same.sum()), m, confidence)
    for label in [d for d in DIAGNOSES if d in set(truth)] + sorted(set(truth) - set(DIAGNOSES)):
        rows = truth == label
        result["per_class"][label] = {"n": int(rows.sum()), "recall": float(right[rows].mean()),
                                      "recall_ci": wilson_interval(int(right[rows].sum()), int(rows.sum()), confidence)}
    return result


def cross_validate(X: np.ndarray, labels, fit: Callable, *, folds: int = 5, seed: int = 0, k: int = defaults.K,
                   ceilings=tuple(CEILINGS), confidence: float = 0.95) -> dict:
    """Stratified k-fold retrieval metrics, the similarity refitted on each training fold.

    X: float (n_cells, n_features) raw feature values; labels: n_cells diagnoses;
    fit: ``fit(X_train, labels_train) -> transform``, where ``transform(X)`` maps raw
    features to search vectors (float (m, d)); e.g. z-scores plus the feature choice
    fitted on the training cells only (see ``pathmaster.similarity.fit_similarity``), so
    that no query shapes the space it is searched in.
    Each cell is queried once, against the training cells of its fold, by exact Euclidean
    distance; ``map`` covers the whole training fold. ``ceilings`` names classifiers of
    ``CEILINGS`` to fit and score on the same folds (empty for none).

    Returns ``score_rankings``'s dict (metrics pooled over all held-out queries, with
    ``ci`` and per-class recall) plus ``folds``, ``seed``, ``per_fold`` (top1,
    majority_at_5 and binary accuracy of each fold) and ``ceilings`` (name ->
    ``score_predictions`` dict).
    """
    X = np.asarray(X, dtype=np.float64)
    labels = np.asarray(labels, dtype=object)
    splits = stratified_folds(labels, folds, seed)
    n = len(labels)
    top = np.empty((n, k), dtype=object)
    ap = np.empty(n)
    fold_of = np.empty(n, dtype=np.int64)
    predictions = {name: np.empty(n, dtype=object) for name in ceilings}
    for number, (train, test) in enumerate(splits):
        if len(train) < k:
            raise ValueError(f"fold {number}: {len(train)} training cells, fewer than k = {k}")
        transform = fit(X[train], labels[train])
        V_train = np.asarray(transform(X[train]), dtype=np.float64)
        V_test = np.asarray(transform(X[test]), dtype=np.float64)
        d = ((V_test * V_test).sum(axis=1)[:, None] - 2.0 * V_test @ V_train.T
             + (V_train * V_train).sum(axis=1)[None, :])
        order = np.argsort(d, axis=1, kind="stable")
        ranked = labels[train][order]
        top[test] = ranked[:, :k]
        ap[test] = average_precisions(ranked == labels[test][:, None])
        fold_of[test] = number
        for name in ceilings:
            model = CEILINGS[name](seed).fit(X[train], labels[train].astype(str))
            predictions[name][test] = model.predict(X[test])
    metrics = score_rankings(labels, top, ap, k, confidence=confidence, seed=seed)
    metrics["folds"], metrics["seed"] = len(splits), seed
    metrics["per_fold"] = []
    for number in range(len(splits)):
        part = score_rankings(labels[fold_of == number], top[fold_of == number], None, k, seed=seed)
        metrics["per_fold"].append({key: part[key] for key in ("queries", "top1", "majority_at_5", "binary_accuracy")})
    metrics["ceilings"] = {name: score_predictions(labels, predictions[name], confidence=confidence)
                           for name in ceilings}
    return metrics


def site_similarity_fit(names: list[str], choice: str = "auto", seed: int = 0, min_cells: int = 30) -> Callable:
    """A ``fit`` for ``cross_validate`` that refits a site's similarity (z-scores and feature
    ``choice``, ``pathmaster.similarity.fit_similarity``) on each training fold."""
    from pathmaster import similarity

    def fit(X_train: np.ndarray, labels_train: np.ndarray) -> Callable:
        normalization, projection = similarity.fit_similarity(X_train, labels_train, names, choice,
                                                              seed=seed, min_cells=min_cells)
        return lambda X: projection.apply(normalization.apply(X))

    return fit


def held_out(site, records, k: int = defaults.K) -> tuple[dict, list]:
    """Metrics of query cells from another dataset against ``site`` (a ``SiteIndex``).

    records: iterable of ``CellRecord`` (with diagnoses) and ``ImportProblem``s; cells that
    cannot be analysed are skipped and returned as (source, problem) pairs alongside the
    metrics, so a bad query file never stops an evaluation.
    """
    from pathmaster.ingest import problem_pair
    from pathmaster.records import CellRecord, InvalidInput

    labels, ranked, ap, problems = [], [], [], []
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
        matches = site.search(analysis.features, k=len(site))
        ranking = [m.diagnosis for m in matches]
        labels.append(record.diagnosis)
        ranked.append(ranking[:k])
        ap.append(average_precisions(np.asarray(ranking, dtype=object) == record.diagnosis)[0])
    if not labels:
        raise ValueError("no query cell could be analysed: " + "; ".join(f"{s}: {p}" for s, p in problems[:5]))
    return score_rankings(labels, np.asarray(ranked, dtype=object), np.asarray(ap), k), problems


def _interval(ci: dict, key: str) -> str:
    low_high = ci.get(key)
    return "" if low_high is None else f"  [{low_high[0]:.3f}, {low_high[1]:.3f}]"


def format_report(metrics: dict) -> str:
    """The metrics as a short plain-text report: each metric with its confidence interval,
    per-class recall, the classifier ceilings (when cross-validated) and the confusion matrix."""
    ci = metrics.get("ci", {})
    head = f"queries: {metrics['queries']}"
    if "folds" in metrics:
        head += f" ({metrics['folds']}-fold stratified cross-validation, seed {metrics['seed']})"
    lines = [head]
    if ci:
        lines.append(f"{'':16s} {'value':>5s}  {int(round(100 * metrics.get('confidence', 0.95)))}% interval")
    for key in ("top1", "precision_at_5", "majority_at_5", "map", "binary_accuracy"):
        value = metrics.get(key)
        lines.append(f"{key:16s} {'n/a' if value is None else f'{value:.3f}'}{_interval(ci, key)}")
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
        lines.append("classifier ceiling on the same folds and features (accuracy = its top1):")
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
