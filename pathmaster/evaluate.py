"""Retrieval quality: does a cell's neighbourhood in feature space carry its diagnosis?

Two ways to get rankings, one way to score them:

- ``leave_one_out(vectors, labels)``: every database cell queries the rest of the database.
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
"""

from __future__ import annotations

from collections import Counter

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


def _is_normal(label: str) -> bool:
    return label in NORMAL_DIAGNOSES


def score_rankings(query_labels, ranked_labels: np.ndarray, average_precision=None, k: int = defaults.K) -> dict:
    """Metrics of ranked neighbour labels.

    query_labels: m diagnoses; ranked_labels: (m, r >= k) array of the database diagnoses
    in rank order, nearest first; average_precision: (m,) AP of each query over the full
    ranking of the database (``average_precisions``), or None to leave ``map`` out.
    Returns the dict described in the module docstring plus ``queries``, ``k`` and
    ``per_class`` (n, top1, majority_at_k per true diagnosis). ``binary_accuracy`` is None
    when some label is outside the Herlev vocabulary.
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
    binary = None
    if all_labels <= known:
        votes = [majority_vote([_is_normal(x) for x in row[:k]]) for row in ranked_labels]
        binary = float(np.mean([v == _is_normal(q) for v, q in zip(votes, query_labels)]))

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
            }
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


def format_report(metrics: dict) -> str:
    """The metrics as a short plain-text report with the confusion matrix."""
    lines = [f"queries: {metrics['queries']}"]
    for key in ("top1", "precision_at_5", "majority_at_5", "map", "binary_accuracy"):
        value = metrics.get(key)
        lines.append(f"{key:16s} {'n/a' if value is None else f'{value:.3f}'}")
    confusion = metrics["confusion"]
    labels = confusion["labels"]
    short = [label[:10] for label in labels]
    lines.append("")
    lines.append(f"confusion ({confusion['rows']} x {confusion['columns']}):")
    lines.append(" " * 22 + " ".join(f"{s:>10s}" for s in short))
    for label, row in zip(labels, confusion["matrix"]):
        lines.append(f"{label[:21]:21s} " + " ".join(f"{c:10d}" for c in row))
    return "\n".join(lines)
