"""The per-cell abnormality score, worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pathmaster.abnormality import abnormality_score, match_weights


def test_score_is_the_distance_weighted_share_of_abnormal_matches():
    assert abnormality_score([True] * 5, [1.0, 2, 3, 4, 5]) == pytest.approx(1.0)
    assert abnormality_score([False] * 5, [1.0, 2, 3, 4, 5]) == 0.0
    equal = abnormality_score([True, False, True, False, False], [2.0] * 5)
    assert equal == pytest.approx(0.4)  # equal distances: the plain share
    # the nearest match counts more than the farthest: the same flags, reversed order
    near = abnormality_score([True, False, False, False, False], [1.0, 2, 3, 4, 5])
    far = abnormality_score([False, False, False, False, True], [1.0, 2, 3, 4, 5])
    assert near > 0.2 > far
    offset = 0.1 * 3.0
    assert near == pytest.approx((1 / (1 + offset)) / sum(1 / (d + offset) for d in (1, 2, 3, 4, 5)))


def test_weights_do_not_depend_on_the_distance_unit_and_survive_zero():
    d = np.array([[0.0, 1, 2, 3, 4], [0.0] * 5])
    w = match_weights(d)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)
    np.testing.assert_allclose(match_weights(d * 1000), w)
    np.testing.assert_allclose(w[1], 0.2)
    scores = abnormality_score(np.array([[True, False, False, False, False]] * 2), d)
    assert scores.shape == (2,) and 0.2 < scores[0] < 1.0 and scores[1] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="shape"):
        abnormality_score([True, False], [1.0])
