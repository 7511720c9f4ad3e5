"""A site's operating point: chosen on every held-out cell, with a margin for its sampling error."""

from __future__ import annotations

import numpy as np
import pytest

from pathmaster.learning import thresholds


def new_cells_sensitivity(threshold: float, abnormal_scores: np.ndarray) -> float:
    return float((abnormal_scores >= threshold).mean())


def test_a_threshold_on_a_third_misses_new_cells_where_the_site_threshold_does_not():
    # 90 held-out abnormal cells spread over [0.05, 1]; the first inner fold's 30 happen to be
    # the upper ones (a fold of well-stained slides), its 30 normal cells low
    abnormal_scores = np.linspace(0.05, 1.0, 90)
    first_abnormal = abnormal_scores[60:]
    normal_scores = np.linspace(0.0, 0.3, 60)
    scores = np.concatenate([abnormal_scores, normal_scores])
    abnormal = np.r_[np.ones(90, bool), np.zeros(60, bool)]
    first = np.zeros(150, bool)
    first[60:90] = first[90:120] = True
    point, rules = thresholds.site_threshold(scores, abnormal, first)
    new_cells = np.linspace(0.05, 1.0, 1000)  # new abnormal cells, as the held-out ones spread
    assert np.allclose(np.sort(scores[first & abnormal]), np.sort(first_abnormal))
    assert new_cells_sensitivity(rules["third"], new_cells) < 0.9
    assert new_cells_sensitivity(point["threshold"], new_cells) >= 0.95
    assert point["threshold"] == pytest.approx(rules[f"cp{thresholds.MARGIN_CONFIDENCE:g}"], abs=1e-6) and point["sensitivity"] >= 0.95
    assert point["threshold"] <= rules["point"] < rules["third"]


def test_the_margin_asks_more_of_few_cells_than_of_many():
    assert thresholds.cells_needed(90) == 86  # ceil(0.95 x 90): the point estimate
    needed_90 = thresholds.cells_needed(90, confidence=0.8)
    needed_270 = thresholds.cells_needed(270, confidence=0.8)
    assert 86 < needed_90 <= 90 and needed_270 < 270
    assert needed_90 / 90 > needed_270 / 270 >= 0.95
    assert thresholds.cells_needed(30, confidence=0.9) == thresholds.cells_needed(30)  # too few: the point estimate
    assert thresholds.cells_needed(40, confidence=0.8) == thresholds.cells_needed(40)  # met only by all 40
    assert thresholds.cells_needed(0, confidence=0.9) == 1


def test_one_outlying_abnormal_cell_of_a_small_site_does_not_set_its_threshold():
    """40 abnormal cells (scores 0.6-1.0 but one at 0.01), 30 normal (0.0-0.4): a margin met
    only by finding all 40 would flag every normal cell above 0.01."""
    scores = np.r_[np.linspace(0.6, 1.0, 39), 0.01, np.linspace(0.0, 0.4, 30)]
    abnormal = np.r_[np.ones(40, bool), np.zeros(30, bool)]
    point, _ = thresholds.site_threshold(scores, abnormal)
    assert point["threshold"] > 0.4 and point["specificity"] == 1.0 and point["sensitivity"] >= 0.95


def test_an_operating_point_with_a_margin_is_lower_and_still_reports_what_it_finds():
    rng = np.random.default_rng(0)
    scores = np.r_[rng.uniform(0.2, 1.0, 80), rng.uniform(0.0, 0.6, 80)]
    abnormal = np.r_[np.ones(80, bool), np.zeros(80, bool)]
    plain = thresholds.operating_point(scores, abnormal)
    margin = thresholds.operating_point(scores, abnormal, confidence=0.9)
    assert margin["threshold"] < plain["threshold"]
    assert margin["sensitivity"] > plain["sensitivity"] >= 0.95 and margin["specificity"] <= plain["specificity"]
    assert margin["margin_confidence"] == 0.9 and plain["margin_confidence"] is None


def test_the_operating_point_is_the_highest_score_meeting_the_target_ties_called_alike():
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    abnormal = np.array([0, 0, 1, 0, 1, 1, 1, 1, 1, 1], dtype=bool)
    assert thresholds.operating_point(scores, abnormal, 1.0)["threshold"] == 0.3  # every abnormal cell
    assert thresholds.operating_point(scores, abnormal, 0.85)["threshold"] == 0.5  # one of 7 may be missed
    assert thresholds.operating_point(scores, np.zeros(10, bool))["threshold"] == 0.5  # nothing to find
    # a small site (40 abnormal cells) with tied scores, for the point estimate and the margin:
    # no score above the chosen threshold calls enough abnormal cells, and the threshold does
    rng = np.random.default_rng(7)
    for trial in range(30):
        n_abnormal = 40 if trial < 20 else int(rng.integers(1, 200))
        scores = rng.integers(0, 12, n_abnormal + 30) / 11  # few distinct values: many ties
        abnormal = np.r_[np.ones(n_abnormal, bool), np.zeros(30, bool)]
        for target, confidence in [(0.95, None), (0.9, None), (0.95, thresholds.MARGIN_CONFIDENCE), (0.95, 0.95)]:
            point = thresholds.operating_point(scores, abnormal, target, confidence)
            needed = thresholds.cells_needed(n_abnormal, target, confidence)
            found = (scores[abnormal] >= point["threshold"]).sum()
            assert point["threshold"] in scores[abnormal] and found >= needed
            assert all((scores[abnormal] >= t).sum() < needed for t in np.unique(scores) if t > point["threshold"])
            assert point["sensitivity"] == found / n_abnormal
            assert point["specificity"] == (scores[~abnormal] < point["threshold"]).mean()


def test_a_site_chooses_its_score_on_held_out_cells_and_sets_its_threshold_on_every_cell_scored():
    rng = np.random.default_rng(3)
    abnormal = np.r_[np.ones(120, bool), np.zeros(120, bool)]
    held_out = np.r_[np.ones(60, bool), np.zeros(60, bool), np.ones(60, bool), np.zeros(60, bool)]
    good = np.clip(abnormal * 0.6 + rng.uniform(0, 0.5, 240), 0, 1)
    scores = {"neighbours": rng.uniform(0, 1, 240), "network": np.where(held_out, good, np.nan)}
    score, points, rules = thresholds.choose_site_score(scores, abnormal, held_out)
    assert score == "network"  # the better ranking on the held-out cells
    assert points["neighbours"] == thresholds.operating_point(scores["neighbours"][held_out], abnormal[held_out],
                                                         confidence=thresholds.MARGIN_CONFIDENCE)
    assert (points["network"], rules) == thresholds.site_threshold(good[held_out], abnormal[held_out])
    assert points["network"]["abnormal_cells"] == 60  # the network scored no other cell
    # every cell held out (a site comparing its features alone): the threshold reads them all
    score, points, _ = thresholds.choose_site_score({"neighbours": scores["neighbours"], "classifier": good}, abnormal)
    assert score == "classifier" and points[score]["abnormal_cells"] == 120


def test_the_ensemble_leaves_a_missing_network_score_out_of_its_mean():
    scores = thresholds.with_ensemble({"neighbours": np.array([0.2, 0.4]), "network": np.array([np.nan, 0.8]),
                                  "classifier": np.array([0.6, 0.6])})
    assert scores["ensemble"] == pytest.approx([0.4, 0.6])
