"""The nearest neighbours' rules: which cells are nearest and what their diagnoses say.

``nearest`` the k nearest training rows of each test row (squared Euclidean);
``majority_vote`` the most common label, a tie to the first ranked (``vocabulary.majority``'s
rule); the neighbours' abnormal share, the site's "neighbours" score: ``neighbour_share`` of
one query's matches as a site answers it, ``neighbour_shares`` of many held-out rows at once
as the site learns its threshold (the same rule, so the threshold fits the score).
"""

from __future__ import annotations

import numpy as np

from pathmaster.vocabulary import majority


def neighbour_share(diagnoses, abnormal_labels, k: int) -> float:
    """Share of abnormal labels among the first ``k`` labelled diagnoses (0 when none)."""
    labelled = [d for d in diagnoses if d is not None][:k]
    return sum(d in abnormal_labels for d in labelled) / len(labelled) if labelled else 0.0


def neighbour_shares(abnormal: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """float64 (m,): for each row of match indices (int (m, k) into ``abnormal``, bool (n,)),
    the share of its matches that are abnormal."""
    return np.asarray(abnormal, dtype=bool)[rows].mean(axis=1)


def nearest(train: np.ndarray, test: np.ndarray, k: int) -> np.ndarray:
    """int (m, k): the rows of ``train`` (n, d) nearest each row of ``test`` (m, d), nearest
    first (squared Euclidean; a tie to the lower row)."""
    sq = (test * test).sum(1)[:, None] - 2 * test @ train.T + (train * train).sum(1)[None, :]
    return np.argsort(sq, axis=1, kind="stable")[:, :k]


def majority_vote(labels) -> str:
    """Most common label in rank order; a tie goes to the tied label that appears first."""
    return majority(labels).label
