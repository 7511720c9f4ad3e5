"""The case conclusion from site answers (the coordinator's converter) and its one rendering
for the CLI, --json and the page (codes and counts checked, not sentences)."""

import json

from services.case_words import format_summary
from services.conclusion_words import conclusion_json, format_conclusion, headline
from services.coordinator.conclusion import case_conclusion, site_cells
from services.gateway.events import summary_json
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb


def site(name, cells, status=0):
    return pb.SiteResult(site=name, status_code=status, cells=[
        pb.CellResult(query_cell_id=cid, matches=[pb.Match(bethesda=t, distance=i) for i, t in enumerate(terms)])
        for cid, terms in cells.items()])


CELLS = {f"n{i}": ["NILM"] * 5 for i in range(5)} | {"h": ["HSIL", "HSIL", "LSIL", "HSIL", "NILM"]}


def test_one_hsil_cell_among_five_nilm_cells_is_concluded_hsil_and_rendered_first():
    conclusion = case_conclusion([site("a", CELLS), site("down", {}, status=14)], cell_ids=list(CELLS))
    assert (conclusion.outcome, conclusion.bethesda, conclusion.cells_with, conclusion.cells_total) == \
        ("abnormal", "HSIL", 1, 6)
    assert [c.query_cell_id for c in conclusion.cells] == list(CELLS)  # the case's order
    hsil = conclusion.cells[-1]
    assert [(t.bethesda, t.count) for t in hsil.spread] == [("HSIL", 3), ("LSIL", 1), ("NILM", 1)]
    assert list(hsil.abnormal_sites) == ["a"] and conclusion.threshold == 0.5
    lines = format_conclusion(conclusion)
    assert lines[0].startswith("Conclusion: ") and "HSIL" in lines[0] and "1 of 6" in lines[0]
    assert "HSIL 3/5" in lines[-2] and "LSIL 1/5" in lines[-2] and "HSIL" in lines[-2].split("->")[1]
    assert "decision support" in lines[-1].lower() and "6" in lines[-1]
    as_json = conclusion_json(conclusion)
    json.dumps(as_json)
    assert as_json["outcome"] == "abnormal" and as_json["cells_with"] == 1
    assert [r["code"] for r in as_json["why"]] == ["most_significant_abnormality", "decision_support_not_a_specimen"]
    assert as_json["cells"][0]["abnormal"] is False and as_json["cells"][0]["abnormal_term"] == ""


def test_the_summary_shows_the_conclusion_before_anything_else_and_json_keeps_its_shape():
    conclusion = case_conclusion([site("a", CELLS)])
    summary = pb.CaseSummary(case_id="c1", request_class="routine", sites_ok=1, conclusion=conclusion)
    for audience in ("plain", "full"):
        text = format_summary(summary, audience=audience).splitlines()
        assert text[0] == f"Conclusion: {headline(conclusion, audience == 'full')}"
        assert text.index(next(x for x in text if "1 of 1 sites" in x or x.startswith("case c1"))) > len(conclusion.cells)
    data = summary_json(summary)
    # One reading of the case: its conclusion's term; no majority of matches beside it.
    assert data["conclusion"]["bethesda"] == "HSIL" and "bethesda" not in data
    assert {"votes", "case_id", "total_s", "bytes_sent"} <= set(data)


def test_no_answer_failed_cells_and_labels_without_terms():
    nothing = case_conclusion([site("a", CELLS, status=14)], cell_ids=list(CELLS))
    assert (nothing.outcome, nothing.cells_total, len(nothing.cells)) == ("no_answer", 0, 0)
    assert nothing.why[0].code == "no_site_answered"
    assert headline(nothing) and format_conclusion(nothing)[-1]
    failed_cell = site("a", {"x": ["HSIL"] * 5})
    failed_cell.cells[0].error = "mask has no nucleus"
    assert case_conclusion([failed_cell]).outcome == "no_answer"
    untermed = case_conclusion([site("a", {"x": ["", "", ""]})])
    assert (untermed.outcome, untermed.why[0].code) == ("cannot_conclude", "no_bethesda_term")
    assert "no match" in format_conclusion(untermed)[1]


def test_sites_disagreeing_are_named():
    conclusion = case_conclusion([site("a", {"x": ["HSIL"] * 3 + ["NILM"] * 2}), site("b", {"x": ["NILM"] * 5}),
                                  site("c", {"x": ["NILM"] * 5})])
    assert conclusion.outcome == "cannot_conclude" and conclusion.why[0].code == "sites_disagree"
    assert dict(conclusion.why[0].params)["abnormal_sites"] == "a"
    assert list(conclusion.cells[0].nilm_sites) == ["b", "c"]


def test_a_sites_own_score_and_reading_enter_only_where_its_cell_result_carries_them():
    scored = site("a", {"x": ["NILM"] * 5})
    scored.cells[0].abnormal_score, scored.cells[0].abnormal = 0.9, True
    plain = site("b", {"x": ["NILM"] * 5})
    plain.cells[0].abnormal = True  # no score: the flag alone is not the site's reading
    assert [(c.site, c.score, c.reading, c.terms) for c in site_cells([scored, plain])] == [
        ("a", 0.9, True, ("NILM",) * 5), ("b", None, None, ("NILM",) * 5)]
    alone = case_conclusion([scored]).cells[0]
    assert alone.abnormal and list(alone.abnormal_sites) == ["a"] and alone.abnormal_score > 0
    pooled = case_conclusion([scored, plain]).cells[0]  # a's reading pooled with b's NILM matches
    assert (list(pooled.abnormal_sites), list(pooled.nilm_sites)) == (["a"], ["b"])
