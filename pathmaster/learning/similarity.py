"""Similarity between cells: z-scores, a feature subset chosen from the data, FAISS search.

The pipeline from raw feature vectors to an index is:

1. ``fit_normalization(X)`` -> ``Normalization`` (per-feature mean and standard deviation
   of the site's database; stored with the index so a query is scaled exactly like the
   database it is compared with).
2. ``forward_select(Z, labels)`` -> the feature columns (and their weights) that make
   leave-one-out retrieval of the right diagnosis best on this database.
3. ``build_index(vectors, algorithm)`` -> a FAISS index over the projected vectors:
   exact (``"flat"``) by default, ``"ivf"`` or ``"hnsw"`` for large sites, with
   ``tune_nprobe`` measuring recall against exact search.

All vectors handed to FAISS are float32, C-contiguous. Distances returned by
``search`` are Euclidean (not squared) in the weighted z-score space: unitless, smaller
is closer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from pathmaster import defaults


@dataclass
class Normalization:
    """Per-feature z-score statistics of a database (float64 arrays of shape (n_features,))."""

    mean: np.ndarray
    std: np.ndarray

    def apply(self, X: np.ndarray) -> np.ndarray:
        """Z-scores of ``X`` (n, n_features) or (n_features,) as float64."""
        return (np.asarray(X, dtype=np.float64) - self.mean) / self.std

    def to_dict(self) -> dict:
        return {"mean": self.mean.tolist(), "std": self.std.tolist()}

    @classmethod
    def from_dict(cls, data: dict) -> "Normalization":
        return cls(np.asarray(data["mean"], dtype=np.float64), np.asarray(data["std"], dtype=np.float64))


def fit_normalization(X: np.ndarray) -> Normalization:
    """Mean and standard deviation of each column of ``X`` (n_cells, n_features).

    A constant column gets std 1 so that it maps to 0 instead of dividing by zero.
    Non-finite values are rejected: they would poison every distance.
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"need a non-empty 2-D feature matrix, got shape {X.shape}")
    if not np.isfinite(X).all():
        bad = sorted(set(np.nonzero(~np.isfinite(X))[1].tolist()))
        raise ValueError(f"feature matrix has non-finite values in columns {bad}")
    mean = X.mean(axis=0)
    std = X.std(axis=0)
    std[std < 1e-12 * np.maximum(1.0, np.abs(mean))] = 1.0
    return Normalization(mean, std)


@dataclass
class Projection:
    """Which z-scored columns go into the index, with what weight, and a learnt linear map.

    A query vector q (z-scores) becomes ``q[columns] * sqrt(weights)`` so that squared
    Euclidean distance in the index is the weighted sum of squared z-score differences;
    with a ``matrix`` (float64 (len(columns), d), ``lda_projection``'s: the z-scores, scaled,
    then discriminant axes learnt from the site's labels) that is then multiplied by it,
    and distance is Euclidean in the d dimensions. The matrix is stored with the index config in
    the site database (``to_dict``) and refitted from the database's cells on a rebuild.
    """

    columns: np.ndarray  # int64 indices into the feature vector
    weights: np.ndarray  # float64, same length, > 0
    names: list[str] = field(default_factory=list)
    score: float | None = None  # retrieval score that justified this choice
    history: list[dict] = field(default_factory=list)
    method: str = "all"  # a key of PROJECTIONS
    matrix: np.ndarray | None = None  # float64 (len(columns), d): a learnt linear map, or None

    def apply(self, Z: np.ndarray) -> np.ndarray:
        """Project z-scores (n, n_features) or (n_features,) to float32 index vectors."""
        Z = np.asarray(Z, dtype=np.float64)
        out = Z[..., self.columns] * np.sqrt(self.weights)
        if self.matrix is not None:
            out = out @ self.matrix
        return np.ascontiguousarray(out, dtype=np.float32)

    @property
    def dimensions(self) -> int:
        """Length of the index vectors this projection makes."""
        return len(self.columns) if self.matrix is None else int(self.matrix.shape[1])

    @property
    def learnt_axes(self) -> int:
        """How many learnt axes the matrix appends to the chosen (scaled) z-scores: 0
        without a matrix, at most the number of diagnoses - 1 for ``lda_projection``."""
        return 0 if self.matrix is None else self.dimensions - len(self.columns)

    def describe(self, n_features: int) -> str:
        """The projection in a word for an algorithm string: method, columns kept of
        ``n_features``, and the learnt axes beside them, e.g. ``lda-130of130+6axes``
        (130 z-scores and 6 discriminant axes: 136 index dimensions)."""
        axes = f"+{self.learnt_axes}axes" if self.matrix is not None else ""
        return f"{self.method}-{len(self.columns)}of{n_features}{axes}"

    def to_dict(self) -> dict:
        return {
            "columns": self.columns.tolist(),
            "weights": self.weights.tolist(),
            "names": list(self.names),
            "score": self.score,
            "history": self.history,
            "method": self.method,
            "matrix": None if self.matrix is None else self.matrix.tolist(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> "Projection":
        return cls(
            np.asarray(data["columns"], dtype=np.int64),
            np.asarray(data["weights"], dtype=np.float64),
            list(data.get("names", [])),
            data.get("score"),
            list(data.get("history", [])),
            data.get("method", "all"),
            None if data.get("matrix") is None else np.asarray(data["matrix"], dtype=np.float64),
        )

    @classmethod
    def all_features(cls, names: list[str]) -> "Projection":
        n = len(names)
        return cls(np.arange(n, dtype=np.int64), np.ones(n), list(names))


def loo_precision(sq_dist: np.ndarray, labels: np.ndarray, k: int = defaults.K) -> float:
    """Leave-one-out precision@k: mean fraction of each cell's k nearest others sharing its label.

    ``sq_dist`` is an (n, n) matrix of (squared) distances whose diagonal is +inf (so a cell
    is never its own neighbour). Precision@k is used for selection rather than top-1
    because it changes smoothly as a feature is added, so the greedy search is less driven
    by ties and noise.
    """
    k = min(k, sq_dist.shape[0] - 1)
    nearest = np.argpartition(sq_dist, k - 1, axis=1)[:, :k]
    return float((labels[nearest] == labels[:, None]).mean())


def _self_excluded(sq_dist: np.ndarray) -> np.ndarray:
    sq_dist = sq_dist.copy()
    np.fill_diagonal(sq_dist, np.inf)
    return sq_dist


def forward_select(
    Z: np.ndarray,
    labels,
    names: list[str] | None = None,
    *,
    k: int = defaults.K,
    max_features: int = defaults.MAX_SELECTED_FEATURES,
    patience: int = 4,
    max_cells: int = 800,
    seed: int = 0,
    time_limit_s: float = 30.0,
) -> Projection:
    """Greedy forward feature selection on leave-one-out retrieval.

    Z: float (n_cells, n_features) z-scores; labels: n_cells diagnoses (any hashable).
    Starting from no features, each step adds the feature whose inclusion gives the best
    leave-one-out precision@k (``loo_precision``), even when that is a little worse than
    before, so that a short plateau does not end the search. The search stops after
    ``patience`` steps without a new best, after ``max_features`` features, or after
    ``time_limit_s`` seconds; the chosen subset is the shortest prefix with the best score.
    Constant columns are never chosen. Large databases are subsampled (uniformly, seeded)
    to ``max_cells`` cells, because each step costs O(n_cells^2 x n_features).

    Returns a ``Projection`` with unit weights on the chosen columns, the score reached and
    the per-step history (feature added, score).
    """
    Z = np.asarray(Z, dtype=np.float64)
    labels = np.asarray(labels)
    n, n_features = Z.shape
    names = list(names) if names is not None else [f"f{i}" for i in range(n_features)]
    if n < k + 1:
        raise ValueError(f"feature selection needs more than {k} labelled cells, got {n}")
    if n > max_cells:
        keep = np.random.default_rng(seed).choice(n, max_cells, replace=False)
        Z, labels = Z[keep], labels[keep]
        n = max_cells
    _, codes = np.unique(labels, return_inverse=True)
    usable = [f for f in range(n_features) if np.ptp(Z[:, f]) > 0]

    chosen: list[int] = []
    history: list[dict] = []
    current = _self_excluded(np.zeros((n, n)))
    best_score, best_length = -1.0, 0
    started = time.monotonic()
    while len(chosen) < min(max_features, len(usable)) and len(chosen) - best_length < patience:
        step_score, step_feature, step_dist = -1.0, -1, None
        for f in usable:
            if f in chosen:
                continue
            column = Z[:, f]
            candidate = current + (column[:, None] - column[None, :]) ** 2
            score = loo_precision(candidate, codes, k)
            if score > step_score:
                step_score, step_feature, step_dist = score, f, candidate
        chosen.append(step_feature)
        current = step_dist
        history.append({"feature": names[step_feature], "score": round(step_score, 6)})
        if step_score > best_score:
            best_score, best_length = step_score, len(chosen)
        if time.monotonic() - started > time_limit_s:
            break
    columns = np.asarray(chosen[:best_length], dtype=np.int64)
    return Projection(columns, np.ones(len(columns)), [names[c] for c in columns], best_score, history, "forward")


def fisher_weights(Z: np.ndarray, labels, names: list[str] | None = None) -> Projection:
    """Weight each feature by its Fisher ratio (between-class over within-class variance).

    Z: float (n_cells, n_features) z-scores; labels: n_cells diagnoses. Weights are
    scaled to mean 1 over the features kept; features with no between-class spread (e.g.
    constant columns) are left out.
    """
    Z = np.asarray(Z, dtype=np.float64)
    labels = np.asarray(labels)
    names = list(names) if names is not None else [f"f{i}" for i in range(Z.shape[1])]
    overall = Z.mean(axis=0)
    between = np.zeros(Z.shape[1])
    within = np.zeros(Z.shape[1])
    for label in np.unique(labels):
        group = Z[labels == label]
        between += len(group) * (group.mean(axis=0) - overall) ** 2
        within += ((group - group.mean(axis=0)) ** 2).sum(axis=0)
    ratio = between / np.maximum(within, 1e-12)
    columns = np.flatnonzero(ratio > 1e-9)
    weights = ratio[columns] / ratio[columns].mean()
    return Projection(columns.astype(np.int64), weights, [names[c] for c in columns], method="fisher")


# How much the plain z-scores still count next to the learnt discriminant axes in
# ``lda_projection``: their share of the index vectors' total variance is this squared
# over (1 + this squared), i.e. 0.2 at 0.5.
LDA_ZSCORE_SHARE = 0.5


def lda_projection(Z: np.ndarray, labels, names: list[str] | None = None,
                   zscore_share: float = LDA_ZSCORE_SHARE) -> Projection:
    """A supervised projection learnt from the site's labels: discriminant axes beside the z-scores.

    Parameters
    ----------
    Z : ndarray of float, shape (n_cells, n_features)
        Z-scores of labelled cells.
    labels : sequence of str, length n_cells
        Their diagnoses (at least two distinct).
    names : list of str, optional
        The feature names.
    zscore_share : float
        Scale of the z-score block (see below); 0 keeps the discriminant axes alone.

    Returns
    -------
    Projection
        Every column, unit weights, and ``matrix`` (n_features, n_features + k): the
        z-scores scaled by ``zscore_share / sqrt(n_features)`` (total variance about
        zscore_share^2), then the k = min(n_features, n_classes - 1) discriminant axes of
        ``sklearn.discriminant_analysis.LinearDiscriminantAnalysis`` (eigen solver with
        Ledoit-Wolf shrinkage of the within-diagnosis covariance; no random state, so the
        same cells give the same matrix), scaled to a total variance of 1 on these cells.
        On the discriminant axes the within-diagnosis scatter is whitened, so neighbours
        there follow the diagnosis rather than whichever features vary most; the z-score
        block keeps the cells' own look, which k axes alone lose.

    Notes
    -----
    Shrinkage, because a site has few cells per feature: on every third Herlev cell (306
    cells, 115 features, halves as train and test) plain LDA retrieved worse than
    z-scores (precision@5 0.30 vs 0.33) while the shrunk one retrieved 0.40-0.42.
    The z-score block: on herlev-40px (5-fold, seed 0, automatic segmentation) the axes
    alone gave top-1 0.423 and precision@5 0.415, with the z-scores at 0.5 0.487 and
    0.438 (at 1.0: 0.483, 0.429; z-scores alone 0.445, 0.392); 0.5 was picked there, and
    held on other fold seeds (1: 0.490, 0.450; 2: 0.497, 0.447 against z-scores' 0.454,
    0.398 and 0.433, 0.393).
    The constant offset of LDA's ``transform`` is left out: it moves every vector alike.
    """
    import warnings

    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    Z = np.asarray(Z, dtype=np.float64)
    names = list(names) if names is not None else [f"f{i}" for i in range(Z.shape[1])]
    with warnings.catch_warnings():
        # a diagnosis with a single cell has no scatter of its own; the pooled one serves
        warnings.filterwarnings("ignore", message="Only one sample available", category=UserWarning)
        model = LinearDiscriminantAnalysis(solver="eigen", shrinkage="auto").fit(Z, np.asarray(labels).astype(str))
    d = Z.shape[1]
    axes = model.transform(np.eye(d)) - model.transform(np.zeros((1, d)))
    spread = float(np.sqrt((Z @ axes).var(axis=0).sum()))
    axes = axes / spread if spread > 0 else axes
    matrix = np.hstack([np.eye(d) * (zscore_share / np.sqrt(d)), axes])
    return Projection(np.arange(d, dtype=np.int64), np.ones(d), names, method="lda", matrix=matrix)


# How each candidate projection is fitted to labelled z-scores (Z, labels, names, seed).
PROJECTIONS = {
    "all": lambda Z, y, names, seed: Projection.all_features(names),
    "fisher": lambda Z, y, names, seed: fisher_weights(Z, y, names),
    "forward": lambda Z, y, names, seed: forward_select(Z, y, names, seed=seed),
    "lda": lambda Z, y, names, seed: lda_projection(Z, y, names),
}


def _held_out_precision(projection: Projection, Z: np.ndarray, codes: np.ndarray, k: int) -> float:
    V = projection.apply(Z).astype(np.float64)
    sq = (V * V).sum(axis=1)
    return loo_precision(_self_excluded(sq[:, None] - 2.0 * V @ V.T + sq[None, :]), codes, k)


def choose_projection(Z: np.ndarray, labels, names: list[str], *, k: int = defaults.K, max_cells: int = 1200,
                      seed: int = 0, candidates=tuple(PROJECTIONS)) -> Projection:
    """Pick the feature subset/weighting that retrieves diagnoses best on data it was not fitted to.

    Each candidate of ``PROJECTIONS`` (all features; Fisher-ratio weights; forward
    selection; a linear discriminant projection learnt from the labels) is fitted on one half of the labelled cells and scored by leave-one-out
    precision@k on the other half, both ways round (2-fold cross-validation, on at most
    ``max_cells`` cells). The winner is refitted on all cells and returned with
    ``history`` holding every candidate's cross-validated score, so the choice can be
    checked later. Scoring on held-out halves keeps forward selection from winning merely
    because it was tuned on the cells it is scored on.
    """
    Z = np.asarray(Z, dtype=np.float64)
    labels = np.asarray(labels)
    _, codes = np.unique(labels, return_inverse=True)
    rng = np.random.default_rng(seed)
    sample = rng.permutation(len(Z))[:max_cells]
    halves = (sample[: len(sample) // 2], sample[len(sample) // 2:])
    scores = {}
    for name in candidates:
        fit = PROJECTIONS[name]
        folds = [(halves[0], halves[1]), (halves[1], halves[0])]
        scores[name] = float(np.mean([
            _held_out_precision(fit(Z[train], labels[train], names, seed), Z[test], codes[test], k)
            for train, test in folds]))
    winner = max(candidates, key=lambda name: scores[name])
    chosen = PROJECTIONS[winner](Z, labels, names, seed)
    chosen.score = scores[winner]
    chosen.history = [{"method": name, "cv_precision_at_5": round(score, 6)} for name, score in scores.items()] + chosen.history
    return chosen


def fit_similarity(X: np.ndarray, labels, names: list[str], choice: str = "auto", *, seed: int = 0,
                   min_cells: int = 30) -> tuple[Normalization, Projection]:
    """Fit the whole similarity (z-scores, then feature choice) to a labelled feature matrix.

    X: float (n_cells, n_features) raw feature values; labels: n_cells diagnoses, None for
    an unlabelled cell (it counts for the z-scores, not for the feature choice); names:
    the feature names; choice: "auto" (``choose_projection``) or a key of
    ``PROJECTIONS``. With fewer than ``min_cells`` labelled cells, or a single diagnosis,
    every feature counts equally. This is what a site fits to its database, and what an
    evaluation refits on each training fold so that no held-out cell shapes its own
    similarity.
    """
    labels = np.asarray(labels, dtype=object)
    normalization = fit_normalization(X)
    Z = normalization.apply(X)
    labelled = np.array([label is not None for label in labels], dtype=bool)
    Zl, yl = (Z, labels) if labelled.all() else (Z[labelled], labels[labelled])   # no copy of a labelled site
    enough = len(yl) >= min_cells and len(set(yl)) > 1
    if choice == "auto" and enough:
        projection = choose_projection(Zl, yl, names, seed=seed)
    elif choice in PROJECTIONS and choice != "all" and enough:
        projection = PROJECTIONS[choice](Zl, yl, names, seed)
    elif choice == "auto" or choice in PROJECTIONS:
        projection = Projection.all_features(names)
    else:
        raise ValueError(f"unknown feature choice {choice!r}; known: auto, {', '.join(PROJECTIONS)}")
    return normalization, projection
