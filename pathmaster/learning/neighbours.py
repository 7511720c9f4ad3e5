"""The nearest neighbours' rules: which cells are nearest and what their diagnoses say.

``nearest`` the k nearest training rows of each test row (squared Euclidean);
``majority_vote`` the most common label, a tie to the first ranked; ``neighbour_share`` the
share of abnormal diagnoses among the first k matches.
"""

from __future__ import annotations


import numpy as np


def neighbour_share(diagnoses, abnormal_labels, k: int) -> float:
    """Share of abnormal labels among the first ``k`` labelled diagnoses (0 when none)."""
    labelled = [d for d in diagnoses if d is not None][:k]
    return sum(d in abnormal_labels for d in labelled) / len(labelled) if labelled else 0.0


def nearest(train: np.ndarray, test: np.ndarray, k: int) -> np.ndarray:
    sq = (test * test).sum(1)[:, None] - 2 * test @ train.T + (train * train).sum(1)[None, :]
    return np.argsort(sq, axis=1, kind="stable")[:, :k]


def majority_vote(labels) -> str:
    """Most common label in rank order; a tie goes to the tied label that appears first."""
    from collections import Counter

    labels = list(labels)
    counts = Counter(labels)
    top = max(counts.values())
    return next(label for label in labels if counts[label] == top)
