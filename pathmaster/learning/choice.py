"""Choosing what a site compares and how it scores abnormality, by cross-validation on its cells.

A site sees each cell twice: by its 130 interpretable features (``pathmaster.similarity``)
and by its frozen pretrained eye (``pathmaster.eye``) through the lens it fits on top
(``lens.SiteLens``: shrinkage linear discriminant axes of its diagnoses, and their
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

from pathmaster.learning.lens import fit_discriminant_lens, fit_lens
from pathmaster.learning.folds import INNER_FOLDS, inner_folds
from pathmaster.learning.neighbours import majority_vote, nearest, neighbour_shares
from pathmaster.learning.thresholds import case_operating_point, choose_site_score, operating_point, with_ensemble

# ---------------------------------------------------------------- choosing what a site compares

# Fewer labelled cells than this (or fewer than two diagnoses with two cells each) and a
# site learns nothing on top of its eye: it compares plain nearest neighbours in the eye's
# space and scores by their labels; a head fitted on a handful of cells learns them by
# heart, and its cross-validation would choose on noise.
MIN_CELLS_TO_LEARN = 100
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
        "auto" or one of ``policy.SIMILARITY_MODES`` to force it.
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
    lens = fit_discriminant_lens(eye_vectors, labels, abnormal_labels, eye)
    _, all_f = feature_vectors_fit(np.arange(len(labels)))
    learnt = fitted_similarity(lens.embed(eye_vectors), all_f)
    learnt.mode, learnt.embedding_weight, learnt.model = mode, weight, lens.sha256
    learnt.score, learnt.threshold, learnt.k, learnt.report = score, report["case"]["threshold"], k, report
    return lens, learnt


def plain_lens(eye_vectors: np.ndarray, eye: dict, reason: str, k: int = 5):
    """(lens, LearntSimilarity) of a site too small to learn on top of its eye: the lens's
    axes alone (no labels read), compared as plain nearest neighbours, scored by their
    labels at a majority; ``reason`` says why."""
    lens = fit_lens(eye_vectors, eye)
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
        lens = fit_discriminant_lens(eye_vectors[train], labels[train], abnormal_labels, eye)
        oof["network"][test] = lens.abnormal_probability(eye_vectors[test])
        embedded = lens.embed(eye_vectors)
        similarity = fitted_similarity(embedded[train], train_f)
        for name, w in candidates:
            similarity.mode, similarity.embedding_weight = name, w
            vectors = similarity.vectors(all_f, embedded)
            rows = nearest(vectors[train], vectors[test], k)
            oof["votes"][(name, w)][test] = [majority_vote(labels[train][row]) for row in rows]
            oof["share"][(name, w)][test] = neighbour_shares(abnormal[train], rows)
    return oof


def fitted_similarity(embeddings: np.ndarray, train_features: np.ndarray):
    """A LearntSimilarity with the lens vectors' centre and scale and both blocks' scales
    fitted on these (training) cells. One scale for every lens axis (the root of their mean
    variance): the lens's own geometry is kept, only its size set."""
    from pathmaster.learning.policy import LearntSimilarity

    mean = embeddings.mean(axis=0)
    spread = float(np.sqrt(embeddings.var(axis=0).mean())) if embeddings.size else 1.0
    std = np.full(embeddings.shape[1], spread if spread > 1e-12 else 1.0)
    z = (embeddings - mean) / std
    return LearntSimilarity(mean=mean.astype(np.float64), std=std.astype(np.float64),
                            feature_scale=float(np.sqrt(np.asarray(train_features).var(axis=0).sum())) or 1.0,
                            embedding_scale=float(np.sqrt(z.var(axis=0).sum())) or 1.0)
