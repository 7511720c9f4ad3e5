"""A case in words for the person who sent it (services/case_words.py): plain by default,
everything with the full audience (`--verbose`)."""

from __future__ import annotations

import pytest

from services.case_words import (format_plan, format_site_result, format_summary, match_text, planned_codes,
                                 similarity_text)
from services.coordinator.conclusion import case_conclusion
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.reasons import FULL, PLAIN, reason, words
from pathmaster.records import Why

NO_WAIT_YET = Why("no_prediction_yet")
ALGORITHM = "faiss-flat-l2/zscore/lda-130of130+6axes"
DISTANCES = (0.5123, 5.9731)  # two sites' own scales


def site_result(name: str, distance: float, status: int = 0) -> pb.SiteResult:
    matches = [pb.Match(cell_id=f"{name}{i}", diagnosis="severe_dysplasia", bethesda="HSIL",
                        distance=distance + i, similarity=0.97 - 0.1 * i) for i in range(5)]
    return pb.SiteResult(site=name, status_code=status, algorithm=ALGORITHM, why=[reason(NO_WAIT_YET)],
                         timing=pb.SiteTiming(total_s=0.42, site_wall_s=0.3, search_s=0.004),
                         bytes_sent=6144, bytes_received=12288,
                         cells=[] if status else [pb.CellResult(query_cell_id="cell1.png", matches=matches)])


@pytest.fixture
def case():
    """A plan with no prediction yet for two sites, both sites' answers and the summary."""
    plan = pb.CasePlan(case_id="c1", request_class="urgent", served_class="urgent", deadline_s=60,
                       sites=[pb.SitePlan(site=s, mode="features", request_class="urgent",
                                          why=[reason(NO_WAIT_YET)]) for s in ("alpha", "beta")])
    results = [site_result("alpha", DISTANCES[0]), site_result("beta", DISTANCES[1])]
    summary = pb.CaseSummary(case_id="c1", request_class="urgent", sites_ok=2, total_s=0.5,
                             conclusion=case_conclusion(results, cell_ids=["cell1.png"]))
    return plan, results, summary


def rendered(case, audience: str) -> list[str]:
    plan, results, summary = case
    text = [format_plan(plan, audience)] + [format_site_result(r, 0.61, audience=audience) for r in results]
    return text + [format_summary(summary, audience=audience, elapsed_s=0.65)]


def test_plain_words_say_the_wait_once_and_no_distance_or_algorithm(case):
    plan, results, summary = case
    text = "\n".join(rendered(case, PLAIN))
    assert text.count(words(NO_WAIT_YET, PLAIN)) == 1
    assert ALGORITHM not in text and "KiB" not in text
    assert not any(f"{d:.2f}" in text or f"{d + 1:.2f}" in text for d in DISTANCES)
    # Per match: its diagnosis, Bethesda term and the site's calibrated similarity.
    for result in results:
        assert all(match_text(m) in text for m in result.cells[0].matches)
    assert "severe dysplasia (HSIL) 97% similar" in text
    # Per site: its answer, its time and the pathologist's wait.
    site_line = format_site_result(results[0], 0.61).splitlines()[0]
    assert "answered" in site_line and "0.42 s" in site_line and "0.61 s" in site_line
    # The summary opens with the conclusion.
    assert format_summary(summary, elapsed_s=0.65).splitlines()[0].startswith("Conclusion: ")


def test_full_words_keep_every_decision_distance_and_the_algorithm(case):
    text = "\n".join(rendered(case, FULL))
    assert ALGORITHM in text and f"distance {DISTANCES[1]:.3f}" in text and "KiB" in text
    assert text.count(words(NO_WAIT_YET, FULL)) == 4  # the plan's two sites, and both answers
    assert "% similar" in text


def test_plain_words_say_a_sites_decision_once():
    mode = Why("features_same_schema")
    plan = pb.CasePlan(case_id="c1", sites=[pb.SitePlan(site="alpha", why=[reason(mode)])])
    result = site_result("alpha", DISTANCES[0])
    result.why.append(reason(mode))
    said = planned_codes(plan)["alpha"]
    text = format_plan(plan) + "\n" + format_site_result(result, 0.61, said=said)
    assert text.count(words(mode, PLAIN)) == 1
    assert words(mode) in format_site_result(result, 0.61, audience=FULL, said=said)


def test_a_site_that_did_not_answer_says_so_in_words():
    line = format_site_result(site_result("gamma", 0.0, status=14), 2.0)
    assert "not reachable" in line and "UNAVAILABLE" not in line
    assert "UNAVAILABLE" in format_site_result(site_result("gamma", 0.0, status=14), 2.0, audience=FULL)


@pytest.mark.parametrize(("similarity", "text"), [(0.004, "<1% similar"), (0.005, "1% similar"),
                                                   (0.125, "13% similar"), (1.0, "100% similar")])
def test_similarity_in_the_page_words(similarity, text):
    assert similarity_text(similarity) == text
