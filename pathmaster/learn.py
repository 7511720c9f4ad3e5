"""Choosing what a site compares and how it scores abnormality, by cross-validation on its cells.

A site sees each cell twice: by its 130 interpretable features (``pathmaster.similarity``)
and by its frozen pretrained eye (``pathmaster.eye``) through the lens it fits on top
(``embedding.SiteLens``: shrinkage linear discriminant axes of its diagnoses, and their
posterior as a head). ``learn_similarity`` fits lenses on inner folds of the site's own
labelled cells (grouped by slide image), chooses what to compare (the features, the lens or
both fused) by held-out retrieval, and the abnormality score and its operating point by
held-out ranking. Nothing is trained for long: every fit is one discriminant analysis or a
logistic regression, seconds for a thousand cells.

The operating point (``operating_point``) is the project's one rule for the threshold of an
abnormality score at which held-out sensitivity reaches a target: a site chooses its own
with a margin (``choose_site_score``, ``site_threshold``), and ``pathmaster.evaluate``
chooses its training folds' by the same rule without one.
"""

from __future__ import annotations

import numpy as np

from pathmaster import embedding as emb

# ---------------------------------------------------------------- choosing what a site compares

# Fewer labelled cells than this (or fewer than two diagnoses with two cells each) and a
# site learns nothing on top of its eye: it compares plain nearest neighbours in the eye's
# space and scores by their labels; a head fitted on a handful of cells learns them by
# heart, and its cross-validation would choose on noise.
MIN_CELLS_TO_LEARN = 100
# Inner folds of the site's cross-validation (each fits a lens and a head on the others).
INNER_FOLDS = 3
# The operating point: the highest threshold at which the site's own held-out cells reach
# this sensitivity for abnormal cells (decision support should miss few abnormal cells: a
# missed one costs a patient more than a second look at a normal one). Evaluation's
# training folds aim at it too.
TARGET_SENSITIVITY = 0.95
# The operating point's margin for its sampling error: the threshold is the highest at which
# a one-sided Clopper-Pearson lower bound, at this confidence, of the sensitivity on the
# site's held-out abnormal cells still reaches TARGET_SENSITIVITY (``operating_point``). A
# threshold where exactly 95% of ~90 held-out abnormal cells score above it finds 0.87-1.0
# of a new fold's; the bound asks for more found cells the fewer there are, and little more
# when there are many. On the dev half's 5 folds (benchmarks/results/learn-a15ed0b) 0.8 on
# every held-out cell found 332 of 340 new abnormal cells (per fold 0.94-1.0) where the point
# estimate on a third found 323 (0.87-1.0), for 3 more of 122 normal cells flagged; 0.9 and
# 0.95 found no more and flagged 3 more.
MARGIN_CONFIDENCE = 0.8
# Thresholds the site's report records beside the one it uses, for benchmarks: the point
# estimate on the first trained fold's cells alone ("third"), on every held-out cell
# ("point"), and with the margin at these confidences.
MARGIN_RULES = (0.5, 0.8, 0.9, 0.95)
# Simulated cases of each kind (all-normal, with abnormal cells) the case operating point reads.
CASES_SIMULATED = 2000
# The case sensitivity a site's threshold must reach on its own held-out cells: above the
# target on new slides (``conclusion.TARGET_CASE_SENSITIVITY``), a margin for the threshold's
# error there: on the dev half's 5 folds by slide image a threshold reaching 0.95 on a site's
# held-out cells found 0.91 of the cases of slides it had not seen.
SITE_CASE_SENSITIVITY = 0.97
# Weights of the embedding block tried for "fused" (the feature block gets 1 - w).
FUSED_WEIGHTS = (0.3, 0.5, 0.7)


def cannot_learn(labels, abnormal_labels) -> str:
    """Why a site cannot learn from these labels ("" when it can)."""
    labelled = [label for label in labels if label is not None]
    counts = {label: labelled.count(label) for label in set(labelled)}
    if len(labelled) < MIN_CELLS_TO_LEARN:
        return f"too few labelled cells to learn from ({len(labelled)} < {MIN_CELLS_TO_LEARN})"
    if sum(c >= 2 for c in counts.values()) < 2:
        return "fewer than two diagnoses with two cells each"
    if not any(label in abnormal_labels for label in counts):
        return "no labelled cell is abnormal in the site's vocabulary"
    if all(label in abnormal_labels for label in counts):
        return "no labelled cell is normal in the site's vocabulary"
    return ""


def inner_folds(labels: np.ndarray, groups, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index pairs: stratified, and grouped when the cells have groups (cells of
    one slide image never on both sides)."""
    import warnings

    from sklearn.model_selection import KFold, StratifiedGroupKFold, StratifiedKFold

    n_splits = INNER_FOLDS
    if max(np.unique(labels, return_counts=True)[1]) < n_splits:  # no diagnosis to spread over the folds
        return list(KFold(n_splits, shuffle=True, random_state=seed).split(labels))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        if groups is not None and len(set(groups)) >= n_splits:
            return list(StratifiedGroupKFold(n_splits, shuffle=True, random_state=seed).split(labels, labels, groups))
        return list(StratifiedKFold(n_splits, shuffle=True, random_state=seed).split(labels, labels))


def _nearest(train: np.ndarray, test: np.ndarray, k: int) -> np.ndarray:
    sq = (test * test).sum(1)[:, None] - 2 * test @ train.T + (train * train).sum(1)[None, :]
    return np.argsort(sq, axis=1, kind="stable")[:, :k]


def majority_vote(labels) -> str:
    """Most common label in rank order; a tie goes to the tied label that appears first."""
    from collections import Counter

    labels = list(labels)
    counts = Counter(labels)
    top = max(counts.values())
    return next(label for label in labels if counts[label] == top)


def cells_needed(abnormal_cells: int, target: float = TARGET_SENSITIVITY, confidence: float | None = None) -> int:
    """How many of ``abnormal_cells`` held-out abnormal cells a threshold must find: the
    fewest whose sensitivity reaches ``target`` (``confidence`` None), or whose one-sided
    Clopper-Pearson lower bound at ``confidence`` does (scipy.stats.beta: the exact
    binomial bound). A site with too few abnormal cells for the bound to be met short of
    finding every one (under ~60 at 0.95 and 0.8) gets the point estimate: its weakest
    abnormal cell would set the threshold, and one outlier there flags most normal cells."""
    from scipy.stats import beta

    n = int(abnormal_cells)
    needed = max(int(np.ceil(target * n - 1e-9)), 1)
    if confidence is None or n == 0:
        return min(needed, max(n, 1))
    found = np.arange(needed, n + 1)
    bounded = found[beta.ppf(1.0 - confidence, found, n - found + 1) >= target]
    return int(bounded[0]) if len(bounded) and bounded[0] < n else min(needed, n)


def operating_point(scores: np.ndarray, abnormal: np.ndarray, target: float = TARGET_SENSITIVITY,
                    confidence: float | None = None) -> dict:
    """The highest threshold at which calling ``score >= threshold`` abnormal finds enough of
    these held-out cells' abnormal ones: ``target`` of them, or with ``confidence`` as many
    as its Clopper-Pearson margin asks (``cells_needed``); the most specific call that
    still meets the target. Tied scores are called alike.

    Parameters
    ----------
    scores : ndarray of float, shape (n,)
        Each cell's abnormality score.
    abnormal : ndarray of bool, shape (n,)
        Whether each cell is abnormal.
    target : float
        The sensitivity to reach, in (0, 1].
    confidence : float or None
        The margin's confidence (``MARGIN_CONFIDENCE`` for a site), None for the point
        estimate.

    Returns
    -------
    dict
        ``threshold`` (0.5 when no cell is abnormal), the ``sensitivity``, ``specificity``
        (fractions) and ROC ``auc`` there, ``abnormal_cells``, ``normal_cells`` and
        ``margin_confidence``.
    """
    from sklearn.metrics import roc_auc_score

    scores, abnormal = np.asarray(scores, np.float64), np.asarray(abnormal, bool)
    positives = np.sort(scores[abnormal])[::-1]
    needed = cells_needed(len(positives), target, confidence)
    threshold = float(positives[needed - 1]) if len(positives) else 0.5
    called = scores >= threshold
    return {"threshold": threshold, "sensitivity": float(called[abnormal].mean()) if abnormal.any() else 0.0,
            "specificity": float((~called[~abnormal]).mean()) if (~abnormal).any() else 1.0,
            "auc": float(roc_auc_score(abnormal, scores)) if 0 < abnormal.sum() < len(abnormal) else 0.5,
            "abnormal_cells": int(abnormal.sum()), "normal_cells": int((~abnormal).sum()),
            "margin_confidence": confidence}


def site_threshold(scores: np.ndarray, abnormal: np.ndarray, first: np.ndarray | None = None) -> tuple[dict, dict]:
    """(the operating point a site uses for this out-of-fold score, {rule: threshold} of the
    rules ``MARGIN_RULES`` names beside it). ``first``: bool (n,), the first trained fold's
    cells (the rule "third"), None for every cell."""
    point = operating_point(scores, abnormal, confidence=MARGIN_CONFIDENCE)
    rules = {"point": operating_point(scores, abnormal)["threshold"]}
    if first is not None:
        rules["third"] = operating_point(scores[first], abnormal[first])["threshold"]
    rules.update({f"cp{c:g}": operating_point(scores, abnormal, confidence=c)["threshold"] for c in MARGIN_RULES})
    return point, {k: round(v, 6) for k, v in rules.items()}


def choose_site_score(scores: dict, abnormal: np.ndarray, held_out: np.ndarray | None = None,
                      first: np.ndarray | None = None) -> tuple[str, dict, dict]:
    """The abnormality score a site uses and its operating point, from out-of-fold scores.

    Parameters
    ----------
    scores : dict of str to ndarray of float, shape (n,)
        Each candidate score of every cell (NaN where it has none).
    abnormal : ndarray of bool, shape (n,)
        Whether each cell is abnormal.
    held_out : ndarray of bool, shape (n,), optional
        The cells every candidate scored out of fold, on which the score is chosen
        (``choose_score`` of their ``operating_point`` with the margin); None for all.
    first : ndarray of bool, shape (n,), optional
        The first trained fold's cells (``site_threshold``'s rule "third").

    Returns
    -------
    (str, dict, dict)
        The chosen score's name; ``{name: operating_point(...)}`` on the held-out cells, the
        chosen one's replaced by its ``site_threshold`` on every cell it scored; and
        ``{rule: threshold}`` of ``MARGIN_RULES`` beside it.
    """
    held_out = np.ones(len(abnormal), bool) if held_out is None else np.asarray(held_out, bool)
    points = {name: operating_point(s[held_out], abnormal[held_out], confidence=MARGIN_CONFIDENCE)
              for name, s in scores.items()}
    score = choose_score(points)
    scored = np.isfinite(scores[score])
    points[score], rules = site_threshold(scores[score][scored], abnormal[scored],
                                          None if first is None else first[scored])
    return score, points, rules


def auc_standard_error(auc: float, abnormal_cells: int, normal_cells: int) -> float:
    """Standard error of a ROC AUC from these many abnormal and normal cells (Hanley and
    McNeil 1982, Radiology 143:29, their equation 1)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (abnormal_cells - 1) * (q1 - auc * auc)
                + (normal_cells - 1) * (q2 - auc * auc)) / max(abnormal_cells * normal_cells, 1)
    return float(np.sqrt(max(variance, 0.0)))


def choose_score(points: dict) -> str:
    """The abnormality score to use, of ``{name: operating_point(...)}`` on held-out cells.

    The best ROC AUC (then the best specificity at the target sensitivity: over the few
    normal cells of a held-out fold the specificity moves in steps of one cell, where the
    AUC reads every pair); but "ensemble", the mean of the others, unless the best beats
    it by more than its standard error (the one-standard-error rule, Breiman et al. 1984):
    the best of a few scores on a third of a site's cells is partly luck, and the mean of
    scores that err differently ranks new cells more steadily.
    """
    best = max(points, key=lambda name: (round(points[name]["auc"], 3), points[name]["specificity"]))
    ensemble = points.get("ensemble")
    if ensemble and "abnormal_cells" in ensemble:
        margin = auc_standard_error(ensemble["auc"], ensemble["abnormal_cells"], ensemble["normal_cells"])
        if points[best]["auc"] - ensemble["auc"] <= margin:
            return "ensemble"
    return best


def with_ensemble(scores: dict) -> dict:
    """``scores`` and, when it holds more than one, "ensemble": their mean ("mean", itself a
    mean of two of them, left out; a score missing for a cell, NaN, left out of its mean)."""
    parts = [v for name, v in scores.items() if name not in ("mean", "ensemble")]
    return {**scores, "ensemble": np.nanmean(parts, axis=0)} if len(parts) > 1 else dict(scores)


def learn_similarity(eye_vectors: np.ndarray, eye: dict, feature_vectors_fit, labels, groups, abnormal_labels, *,
                     choice: str = "auto", k: int = 5, seed: int = 0, other_scores: dict | None = None):
    """Fit a site's lens and head, and choose what it compares, by cross-validation on its cells.

    Parameters
    ----------
    eye_vectors : ndarray of float, shape (n, D)
        Each labelled cell's eye vector (``pathmaster.eye.Eye.features`` of its patch).
    eye : dict
        The eye's description (``Eye.describe``).
    feature_vectors_fit : callable
        ``fit(train_indices) -> (train_vectors, all_vectors)``: the site's feature projection
        refitted on those cells, and every cell's vector in it (float (n, p)).
    labels : sequence of str
        The cells' diagnoses.
    groups : sequence or None
        The cells' groups (slide images), or None.
    abnormal_labels : collection of str
        The site's abnormal labels.
    choice : str
        "auto" or one of ``embedding.SIMILARITY_MODES`` to force it.
    k : int
        Neighbours for the vote and the neighbours' abnormality score.
    other_scores : dict of str to ndarray, optional
        More candidate abnormality scores: each cell's score (n,) from a model fitted
        without its ``inner_folds`` fold (e.g. the feature classifier's).

    Returns
    -------
    (SiteLens, LearntSimilarity)
        The lens and head fitted on every cell, and the mode, fusion weight, abnormality
        score and threshold chosen, with every candidate's held-out figures in ``report``.
    """
    labels = np.asarray(labels).astype(str)
    abnormal = np.array([label in set(abnormal_labels) for label in labels])
    candidates = [("features", 0.0), ("embedding", 1.0)] + [("fused", w) for w in FUSED_WEIGHTS]
    folds = inner_folds(labels, groups, seed)
    oof = _inner_lenses(eye_vectors, eye, feature_vectors_fit, labels, abnormal_labels, candidates, folds, k)
    network_p = oof["network"]
    report = {"folds": INNER_FOLDS, "held_out_cells": len(labels), "grouped": groups is not None,
              "eye": eye, "candidates": {}}
    for (name, w), votes in oof["votes"].items():
        report["candidates"][f"{name}:{w}"] = {"top1": float(np.mean(votes == labels)),
                                               **operating_point(oof["share"][(name, w)], abnormal)}
    allowed = [c for c in candidates if choice == "auto" or c[0] == choice]
    mode, weight = max(allowed, key=lambda c: report["candidates"][f"{c[0]}:{c[1]}"]["top1"])
    share = oof["share"][(mode, weight)]
    scores = with_ensemble({"neighbours": share, "network": network_p, "mean": 0.5 * (share + network_p),
                            **(other_scores or {})})
    score, points, report["thresholds"] = choose_site_score(scores, abnormal)
    report["scores"] = points
    report["case"] = case_operating_point(scores[score], abnormal, groups, points[score]["threshold"], seed)
    lens = emb.fit_discriminant_lens(eye_vectors, labels, abnormal_labels, eye)
    _, all_f = feature_vectors_fit(np.arange(len(labels)))
    learnt = fitted_similarity(lens.embed(eye_vectors), all_f)
    learnt.mode, learnt.embedding_weight, learnt.model = mode, weight, lens.sha256
    learnt.score, learnt.threshold, learnt.k, learnt.report = score, report["case"]["threshold"], k, report
    return lens, learnt


def case_operating_point(scores: np.ndarray, abnormal: np.ndarray, groups, cell_threshold: float,
                         seed: int = 0) -> dict:
    """The threshold at which a cell supports an abnormality, chosen for the case.

    Simulated 6-cell cases of these held-out cells (``conclusion.simulate_cases``: all-normal
    ones and ones with 1 or 2 abnormal cells, each case's cells from different slide images)
    give each threshold's case sensitivity and specificity; the chosen one reaches
    ``SITE_CASE_SENSITIVITY`` at the best case specificity. Beside it: the
    per-cell sensitivity and specificity there, and the case figures the per-cell rule's
    ``cell_threshold`` would have given.
    """
    from pathmaster import conclusion

    scores, abnormal = np.asarray(scores, np.float64), np.asarray(abnormal, bool)
    simulation = conclusion.simulate_cases(scores, abnormal, groups, cases=CASES_SIMULATED, seed=seed,
                                           target_sensitivity=SITE_CASE_SENSITIVITY)
    threshold = simulation["chosen"]
    called = scores >= threshold
    by_cell = conclusion.at_threshold(simulation, cell_threshold)
    return {"threshold": threshold, "met": simulation["met"],
            "target_case_sensitivity": SITE_CASE_SENSITIVITY,
            "case_sensitivity": simulation["chosen_sensitivity"], "case_specificity": simulation["chosen_specificity"],
            "sensitivity": float(called[abnormal].mean()), "specificity": float((~called[~abnormal]).mean()),
            "cell_rule": {"threshold": float(cell_threshold), "case_sensitivity": float(by_cell[0]),
                          "case_specificity": float(by_cell[1])}}


def plain_lens(eye_vectors: np.ndarray, eye: dict, reason: str, k: int = 5):
    """(lens, LearntSimilarity) of a site too small to learn on top of its eye: the lens's
    axes alone (no labels read), compared as plain nearest neighbours, scored by their
    labels at a majority; ``reason`` says why."""
    lens = emb.fit_lens(eye_vectors, eye)
    learnt = fitted_similarity(lens.embed(eye_vectors), np.zeros((len(eye_vectors), 1)))
    learnt.mode, learnt.embedding_weight, learnt.model, learnt.k = "embedding", 1.0, lens.sha256, k
    learnt.report = {"reason": f"plain nearest neighbours in the eye's space: {reason}", "eye": eye}
    return lens, learnt


def _inner_lenses(eye_vectors, eye, feature_vectors_fit, labels, abnormal_labels, candidates, folds, k):
    """Out-of-fold figures of the inner folds: each candidate's k-nearest votes and abnormal
    share, and the lens's head's abnormal probability, every fold's lens and feature
    projection fitted on the other folds' cells."""
    n = len(labels)
    abnormal = np.array([label in set(abnormal_labels) for label in labels])
    oof = {"votes": {c: np.empty(n, dtype=object) for c in candidates}, "share": {c: np.zeros(n) for c in candidates},
           "network": np.zeros(n)}
    for train, test in folds:
        train_f, all_f = feature_vectors_fit(train)
        lens = emb.fit_discriminant_lens(eye_vectors[train], labels[train], abnormal_labels, eye)
        oof["network"][test] = lens.abnormal_probability(eye_vectors[test])
        embedded = lens.embed(eye_vectors)
        similarity = fitted_similarity(embedded[train], train_f)
        for name, w in candidates:
            similarity.mode, similarity.embedding_weight = name, w
            vectors = similarity.vectors(all_f, embedded)
            nearest = _nearest(vectors[train], vectors[test], k)
            oof["votes"][(name, w)][test] = [majority_vote(labels[train][row]) for row in nearest]
            oof["share"][(name, w)][test] = abnormal[train][nearest].mean(axis=1)
    return oof


def fitted_similarity(embeddings: np.ndarray, train_features: np.ndarray):
    """A LearntSimilarity with the lens vectors' centre and scale and both blocks' scales
    fitted on these (training) cells. One scale for every lens axis (the root of their mean
    variance): the lens's own geometry is kept, only its size set."""
    from pathmaster.embedding import LearntSimilarity

    mean = embeddings.mean(axis=0)
    spread = float(np.sqrt(embeddings.var(axis=0).mean())) if embeddings.size else 1.0
    std = np.full(embeddings.shape[1], spread if spread > 1e-12 else 1.0)
    z = (embeddings - mean) / std
    return LearntSimilarity(mean=mean.astype(np.float64), std=std.astype(np.float64),
                            feature_scale=float(np.sqrt(np.asarray(train_features).var(axis=0).sum())) or 1.0,
                            embedding_scale=float(np.sqrt(z.var(axis=0).sum())) or 1.0)
