"""The case rule on constructed cases: a case is reported by its most significant abnormality."""

import numpy as np
import pytest

from pathmaster.conclusion import (DEFAULT_THRESHOLD, SiteCell, abnormal_share, aligned_score, at_threshold, draw_cases,
                                   conclude_case, conclude_cell, simulate_cases)
from pathmaster.vocabulary import BETHESDA_TERMS, severity


def cell(cell_id, *terms, site="a", **kw):
    return SiteCell(site, cell_id, tuple(terms), **kw)


def codes(reading):
    return [r.code for r in reading.why]


def test_severity_order_puts_the_worse_finding_last():
    order = [severity(t) for t in ("NILM", "ASC-US", "LSIL", "ASC-H", "HSIL", "SCC")]
    assert order == sorted(order) and len(set(order)) == 6
    assert severity("AGC") < severity("AIS") < severity("ADENOCARCINOMA")
    assert severity("LSIL") < severity("AGC") < severity("HSIL")  # AGC is worked up like ASC-H
    assert severity(None) == severity("not a term") == -1 < severity("NILM")
    assert set(BETHESDA_TERMS) >= {"NILM", "ASC-US", "LSIL", "ASC-H", "HSIL", "SCC", "AGC", "AIS"}


def test_a_tied_cell_goes_to_the_more_severe_term_and_says_it_is_split():
    reading = conclude_cell([cell("c", "LSIL", "HSIL", "LSIL", "HSIL", "NILM")])
    assert (reading.term, reading.support, reading.total) == ("HSIL", 2, 5)
    assert reading.spread == (("HSIL", 2), ("LSIL", 2), ("NILM", 1))  # most severe first
    assert "matches_split" in codes(reading)
    assert reading.abnormal and reading.abnormal_term == "HSIL"


def test_spread_across_sites_counts_every_match():
    reading = conclude_cell([cell("c", *["HSIL"] * 5), cell("c", "HSIL", "HSIL", "LSIL", "LSIL", "LSIL", site="b"),
                             cell("c", "HSIL", "HSIL", "LSIL", "LSIL", "NILM", site="c")])
    assert reading.spread == (("HSIL", 9), ("LSIL", 5), ("NILM", 1)) and reading.total == 15
    assert reading.abnormal_score == pytest.approx(14 / 15)
    assert reading.site_readings == {"a": True, "b": True, "c": True}


def test_one_hsil_cell_among_five_nilm_cells_makes_an_hsil_case():
    answers = [cell(f"n{i}", *["NILM"] * 5) for i in range(5)] + [cell("h", "HSIL", "HSIL", "HSIL", "NILM", "LSIL")]
    case = conclude_case(answers)
    assert (case.outcome, case.term, case.cells_with, case.cells_total) == ("abnormal", "HSIL", 1, 6)
    assert codes(case) == ["most_significant_abnormality", "decision_support_not_a_specimen"]
    assert [c.abnormal for c in case.cells] == [False] * 5 + [True]


def test_the_most_severe_supported_term_wins_over_the_most_frequent():
    answers = [cell("l1", *["LSIL"] * 5), cell("l2", *["LSIL"] * 4, "NILM"), cell("h", "HSIL", "HSIL", "HSIL", "NILM",
                                                                                    "NILM")]
    case = conclude_case(answers)
    assert (case.term, case.cells_with) == ("HSIL", 1)
    assert case.why[0].params["abnormal_cells"] == "3"


def test_a_cell_below_the_threshold_supports_nothing():
    case = conclude_case([cell("a", "HSIL", "NILM", "NILM", "NILM", "NILM"), cell("b", *["NILM"] * 5)])
    assert (case.outcome, case.term, case.cells_with, case.cells_total) == ("nilm", "NILM", 2, 2)
    assert case.cells[0].term == "NILM" and not case.cells[0].abnormal
    strict = conclude_case([cell("a", "HSIL", "HSIL", "NILM")], threshold=0.9)
    assert strict.outcome == "nilm"
    lenient = conclude_case([cell("a", "HSIL", "NILM", "NILM", "NILM", "NILM")], threshold=0.2)
    assert (lenient.outcome, lenient.term) == ("abnormal", "HSIL")


def test_all_nilm():
    case = conclude_case([cell(f"c{i}", *["NILM"] * 5, site=s) for i in range(6) for s in "ab"])
    assert (case.outcome, case.term, case.cells_with, case.cells_total) == ("nilm", "NILM", 6, 6)
    assert codes(case)[0] == "no_abnormal_cell"


def test_sites_disagreeing_on_a_cell_below_the_threshold_cannot_conclude():
    answers = [cell("x", "HSIL", "HSIL", "HSIL", "NILM", "NILM", site="a"),  # a reads it abnormal (3/5)
               cell("x", *["NILM"] * 5, site="b"), cell("x", *["NILM"] * 5, site="c"),  # pooled 3/15
               cell("y", *["NILM"] * 5, site="a")]
    case = conclude_case(answers)
    assert case.outcome == "cannot_conclude" and case.term == ""
    why = case.why[0]
    assert why.code == "sites_disagree"
    assert (why.params["cell"], why.params["abnormal_sites"], why.params["nilm_sites"]) == ("x", "a", "b, c")
    # ... and says what to do next: look at that cell, whose sites it names.
    step = case.why[1]
    assert step.code == "next_review_disputed_cell"
    assert (step.params["cell"], step.params["abnormal_sites"], step.params["nilm_sites"]) == ("x", "a", "b, c")
    # Enough support pooled over the sites: the abnormality stands although site b reads NILM.
    agreed = conclude_case([cell("x", *["HSIL"] * 5, site="a"), cell("x", "HSIL", "NILM", "NILM", "NILM", "NILM",
                                                                     site="b")])
    assert (agreed.outcome, agreed.term) == ("abnormal", "HSIL")


def test_no_site_answered():
    case = conclude_case([], cell_ids=["a", "b"])
    assert (case.outcome, case.term, case.cells_total, case.cells) == ("no_answer", "", 0, ())
    assert codes(case)[0] == "no_site_answered"


def test_labels_mapping_to_no_bethesda_term_cannot_conclude():
    case = conclude_case([cell("a", "", None, ""), cell("b", "", "")])
    assert (case.outcome, case.term) == ("cannot_conclude", "")
    assert codes(case)[:2] == ["no_bethesda_term", "next_ask_for_bethesda_terms"]
    assert case.cells[0].abnormal_score is None and "labels_without_bethesda_term" in codes(case.cells[0])
    # Matches without a term do not count in the share of those with one.
    assert abnormal_share(("HSIL", "", "NILM", None)) == pytest.approx(0.5)


def test_a_sites_own_score_replaces_its_match_share_at_its_operating_point():
    # The site's matches say 1/5 abnormal, its own score 0.3 is above its operating point 0.2.
    reading = conclude_cell([cell("c", "LSIL", "NILM", "NILM", "NILM", "NILM", score=0.3, operating_point=0.2)])
    assert reading.abnormal and reading.abnormal_term == "LSIL"
    assert reading.abnormal_score == pytest.approx(aligned_score(0.3, 0.2, DEFAULT_THRESHOLD))
    below = conclude_cell([cell("c", *["HSIL"] * 5, score=0.1, operating_point=0.2)])
    assert not below.abnormal
    only = conclude_cell([cell("c", "NILM", score=0.9, operating_point=0.5)])
    assert only.abnormal_term == "ASC-US" and "abnormal_by_site_score_only" in codes(only)
    assert aligned_score(0.2, 0.2, 0.7) == pytest.approx(0.7) and aligned_score(1.0, 0.2, 0.7) == 1.0
    # A site that sends its reading instead of its operating point: the reading decides.
    read = conclude_cell([cell("c", *["NILM"] * 5, score=0.1, reading=True),
                          cell("c", *["NILM"] * 5, site="b")])
    assert read.site_readings == {"a": True, "b": False} and not read.abnormal  # pooled below
    alone = conclude_cell([cell("c", "LSIL", "NILM", "NILM", score=0.95, reading=False)])
    assert not alone.abnormal and alone.abnormal_score < DEFAULT_THRESHOLD


def test_distance_weights_favour_the_nearer_matches():
    terms, near_first = ("HSIL", "NILM", "NILM"), (0.1, 2.0, 2.0)
    assert abnormal_share(terms, near_first, "distance") > abnormal_share(terms) == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        abnormal_share(terms, near_first, "cosine")


def test_simulated_cases_choose_the_threshold_meeting_the_case_specificity():
    rng = np.random.default_rng(1)
    normal = rng.beta(2, 8, 300)     # normal cells score low,
    abnormal = rng.beta(8, 2, 300)   # abnormal ones high, with overlap
    scores = np.r_[normal, abnormal]
    truth = np.r_[np.zeros(300, bool), np.ones(300, bool)]
    groups = np.arange(600) // 3
    sim = simulate_cases(scores, truth, groups, cases=500, seed=0)
    assert sim["met"] and sim["chosen_specificity"] >= 0.90
    # The per-cell arithmetic: every normal cell below the threshold in ~0.9 ** (1/6) of draws.
    assert (normal < sim["chosen"]).mean() >= 0.9 ** (1 / 6) - 0.02
    # No lower threshold meets the target with better sensitivity.
    for t, se, sp in zip(sim["thresholds"], sim["sensitivity"], sim["specificity"]):
        assert not (sp >= 0.90 and se > sim["chosen_sensitivity"])
    assert at_threshold(sim, sim["chosen"]) == (sim["chosen_sensitivity"], sim["chosen_specificity"])
    assert at_threshold(sim, 2.0) == (0.0, 1.0)
    # Scores that cannot separate the classes cannot meet it, and say so.
    flat = simulate_cases(np.full(600, 0.5), truth, groups, cases=200)
    assert not flat["met"]
    with pytest.raises(ValueError):
        simulate_cases(normal, np.zeros(300, bool))


def test_drawn_cases_hold_one_cell_per_slide_image_and_the_asked_abnormal_cells():
    truth = np.r_[np.zeros(40, bool), np.ones(20, bool)]
    groups = np.arange(60) // 2  # two cells per image
    normal, mixed = draw_cases(truth, groups, cases=300, seed=3)
    assert normal.shape == mixed.shape == (300, 6)
    assert not truth[normal].any()
    assert set(truth[mixed].sum(axis=1).tolist()) == {1, 2}
    assert all(len(set(groups[row])) == 6 for row in np.r_[normal, mixed])
    again = draw_cases(truth, groups, cases=300, seed=3)
    assert (again[0] == normal).all() and (again[1] == mixed).all()  # seeded
    with pytest.raises(ValueError):
        draw_cases(truth, groups, cells=0)
