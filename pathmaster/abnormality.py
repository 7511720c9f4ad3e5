"""How abnormal a cell looks from its matches: one score for evaluation and conclusions.

The score of a query cell is the distance-weighted share of abnormal cells among its k
nearest database cells, in [0, 1]: 0 when every match is normal, 1 when every match is
abnormal. A closer match counts more: its weight is ``1 / (d + offset)``, the offset a
share (``OFFSET_SHARE``) of the query's mean match distance, so the weights do not depend
on a site's distance units and a match at distance 0 (the same cell) does not take all.
``pathmaster.evaluate`` draws its ROC curve and picks its operating point on this score;
a case conclusion reads the same score for each of its cells.
"""

from __future__ import annotations

import numpy as np

# The weight offset as a share of the query's mean match distance: 0 would give a match
# at distance 0 infinite weight; large values make every match count the same.
OFFSET_SHARE = 0.1


def match_weights(distances: np.ndarray) -> np.ndarray:
    """Weights of matches, float64 of ``distances``'s shape ((k,) or (m, k)), each row
    summing to 1: ``1 / (d + OFFSET_SHARE * mean(d))``, equal where all distances are 0."""
    d = np.atleast_2d(np.asarray(distances, dtype=np.float64))
    offset = OFFSET_SHARE * d.mean(axis=1, keepdims=True)
    offset = np.where(offset > 0, offset, 1.0)
    raw = 1.0 / (d + offset)
    weights = raw / raw.sum(axis=1, keepdims=True)
    return weights.reshape(np.shape(distances))


def abnormality_score(abnormal: np.ndarray, distances: np.ndarray) -> np.ndarray:
    """The distance-weighted share of abnormal matches of each query.

    Parameters
    ----------
    abnormal : array_like of bool, shape (m, k) or (k,)
        Whether each match (nearest first) is abnormal in the site's vocabulary.
    distances : array_like of float, same shape
        The matches' distances (any unit, >= 0).

    Returns
    -------
    ndarray of float64, shape (m,) (a float for one query)
        In [0, 1].
    """
    flags = np.asarray(abnormal, dtype=np.float64)
    if flags.shape != np.shape(distances):
        raise ValueError(f"abnormal flags {flags.shape} and distances {np.shape(distances)} differ in shape")
    score = (np.atleast_2d(flags) * np.atleast_2d(match_weights(distances))).sum(axis=1)
    return float(score[0]) if flags.ndim == 1 else score
