"""Retrieval quality: does a cell's neighbourhood in the site's representation carry its diagnosis?

Three ways to get rankings, one way to score them:

- ``cross_validate(X, labels, fit, groups=...)``: stratified k-fold with folds split by
  slide image (cells of one image share stain, focus and patient: on both sides of a split
  they inflate every figure); the site's representation is refitted on each fold's
  training cells by the function indexing uses and every cell is queried once against the
  training cells of its fold. The honest figure for a site's own cells: confidence
  intervals, per-class recall, sensitivity and specificity for the site's abnormal labels
  (by the 5-nearest majority, and at an operating point on the abnormality score chosen on
  the training fold by the site's rule, ``thresholds.operating_point``), the ROC of that score
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
site's own rule (``pathmaster.learning.thresholds.operating_point``) and the simulated cases (1-2 abnormal
cells among normal ones) the case conclusion's (``pathmaster.conclusion.simulate_cases``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from pathmaster import defaults
from pathmaster.learning.choice import fitted_similarity
from pathmaster.learning.thresholds import TARGET_SENSITIVITY, operating_point
from pathmaster.learning.neighbours import majority_vote
from pathmaster.evaluation.metrics import CASES_PER_FOLD, abnormal_set, abnormality_scores, average_precisions, binary_figures, counted_figures, roc, score_predictions, score_rankings, site_score_figures
from pathmaster.learning.folds import group_codes, group_summary, stratified_folds


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


def cross_validate(X: np.ndarray, labels, fit: Callable, *, groups=None, abnormal_labels=None, folds: int = 5,
                   seed: int = 0, k: int = defaults.K, ceilings=tuple(CEILINGS), confidence: float = 0.95,
                   cases: int = CASES_PER_FOLD, target_sensitivity: float = TARGET_SENSITIVITY,
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
    codes = group_codes(groups, n)
    abnormal = abnormal_set(abnormal_labels, labels)
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
            threshold = operating_point(train_scores, positive[train], target)["threshold"]
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


# The last representation fitted (``_fit_representation``): cross-validation's fit and the
# site's score fit the same training fold one after the other.
_LAST_FIT: dict = {}


def _fit_representation(X_train: np.ndarray, labels_train, names: list[str], choice: str, seed: int):
    """``index.fit_representation``, once for the same cells and choices."""
    import hashlib

    from pathmaster.site import index

    key = (hashlib.sha256(np.ascontiguousarray(X_train, np.float64).tobytes()).hexdigest(),
           tuple(map(str, labels_train)), tuple(names), choice, seed)
    if key not in _LAST_FIT:
        _LAST_FIT.clear()
        _LAST_FIT[key] = index.fit_representation(X_train, labels_train, names, choice, seed=seed)
    return _LAST_FIT[key]


def site_similarity_fit(names: list[str], choice: str = "auto", seed: int = 0, min_cells: int | None = None) -> Callable:
    """A ``fit`` for ``cross_validate`` that refits a site's representation on each training
    fold with the function indexing uses (``pathmaster.site.index.fit_representation``)."""
    def fit(X_train: np.ndarray, labels_train: np.ndarray) -> Callable:
        normalization, projection = _fit_representation(X_train, labels_train, names, choice, seed)
        return lambda X: projection.apply(normalization.apply(X))

    return fit


def site_score_fit(X: np.ndarray, labels, groups, names: list[str], abnormal_labels, *, choice: str = "auto",
                   similarity_choice: str = "auto", eye_vectors: np.ndarray | None = None, eye: dict | None = None,
                   seed: int = 0) -> Callable:
    """A ``site_score`` for ``cross_validate``: ``site_score(train, test)`` learns on the
    training cells what indexing learns (``pathmaster.site.fitting.learn_from``: the lens and head
    on the cells' ``eye_vectors`` (float (n, D), by the eye ``eye`` describes) when given, the
    feature classifier, the abnormality score and its operating point, chosen for the case)
    and scores the test cells as ``SiteIndex.abnormality`` does. Returns {"score",
    "threshold", "cell_threshold", "scores" (m,), "note"}. X, labels, groups: the cells
    ``cross_validate`` is given (its indices)."""
    from pathmaster.site import fitting
    from pathmaster.learning.abnormality import FeatureClassifier
    from pathmaster.learning.neighbours import neighbour_share

    labels = np.asarray(labels, dtype=object).astype(str)
    abnormal = set(abnormal_labels)

    def score(train: np.ndarray, test: np.ndarray) -> dict:
        normalization, projection = _fit_representation(X[train], labels[train], names, choice, seed)
        Z = normalization.apply(X)
        train_groups = None if groups is None else list(np.asarray(groups, dtype=object)[train])
        train_groups = None if train_groups is None or None in train_groups else np.asarray(train_groups, str)
        use_eye = eye_vectors is not None and similarity_choice != "features"
        fitted, lens = fitting.learn_from(Z[train], labels[train], train_groups, abnormal, projection, names,
                                         eye_vectors[train] if use_eye else None, eye if use_eye else None,
                                         choice=similarity_choice, seed=seed)
        features, embeddings = projection.apply(Z).astype(np.float64), None
        if lens is not None:
            embeddings = lens.embed(eye_vectors)
            refit = fitted_similarity(embeddings[train], features[train])  # as indexing, on the site's cells
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
    from pathmaster.site.ingest import problem_pair
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
    abnormal = abnormal_set(site.vocabulary.abnormal, np.concatenate([labels, site.labels()]))
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
