"""The one table of reason codes: every code has words for both audiences, the words use
only the values the code carries, and a code reads the same from the wire as at its source."""

from __future__ import annotations

import pytest

from pathmaster.records import Why
from qos.policy import plan_site
from services.reasons import FULL, PLAIN, REASONS, as_json, codes, decisions, reason, template_fields, words

CLASSES = ["urgent", "routine", "teaching", "bulk"]


@pytest.mark.parametrize("code", sorted(REASONS))
def test_every_code_has_full_words_and_plain_words_use_no_value_the_full_do_not(code):
    entry = REASONS[code]
    assert entry.full
    assert template_fields(entry.plain) <= template_fields(entry.full)


def test_a_reason_reads_the_same_from_the_wire_as_from_its_source():
    plan = plan_site("a", requested="urgent", entitled=CLASSES, deadline_s=10,
                     predict=lambda cls, mode: {"urgent": 0.5, "routine": 0.6}[cls], schema_matches=True,
                     mode_bytes={"features": 5_600, "images": 890_000})
    assert codes(plan.why) == ["features_same_schema", "class_stepped_down_within_deadline", "predicted",
                               "hedge_planned_class", "small_request_copies"]
    wire = [reason(w) for w in plan.why]
    for audience in (PLAIN, FULL):
        assert decisions(wire, audience) == decisions(plan.why, audience)
    stepped = wire[1]
    assert dict(stepped.params) == {"asked": "urgent", "served": "routine", "predicted_s": "0.6",
                                    "deadline_s": "10"}
    assert words(stepped, PLAIN) == "sent with routine priority because it will still arrive within the urgent deadline"
    assert as_json([stepped]) == [{"code": stepped.code, "params": dict(stepped.params)}]


def test_plumbing_has_no_plain_words_and_an_unknown_code_shows_itself():
    copies = Why("answered_by_copy", {"copy": "first", "request_class": "routine"})
    assert words(copies, PLAIN) == "" and decisions([copies], PLAIN) == []
    assert words(copies) == "answered by the first copy (routine)"
    assert words(Why("from_a_newer_server", {"n": 2})) == "from_a_newer_server (n=2)"
    assert words(Why("predicted")) == "predicted"  # its value missing: the code, not an error


def test_the_cli_shows_plain_words_by_default_and_every_decision_in_full_with_verbose():
    from services.case_words import format_plan, format_site_result
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

    stepped = Why("class_stepped_down_within_deadline",
                  {"asked": "urgent", "served": "routine", "predicted_s": 0.6, "deadline_s": 10.0})
    hedge = Why("hedge_planned_class", {"hedge_class": "urgent", "after_s": 0.9})
    plan = pb.CasePlan(case_id="c1", request_class="urgent", served_class="urgent", deadline_s=10,
                       sites=[pb.SitePlan(site="alpha", mode="features", request_class="routine",
                                          why=[reason(stepped), reason(hedge)])])
    plain, full = format_plan(plan), format_plan(plan, FULL)
    assert words(stepped, PLAIN) in plain and words(hedge) not in plain
    assert words(stepped) in full and words(hedge) in full
    answered = Why("images_after_features_failed", {"error": "FAILED_PRECONDITION: another schema"})
    result = pb.SiteResult(site="alpha", status_code=0, why=[reason(answered)])
    assert words(answered, PLAIN) in format_site_result(result, 1.0)
    assert words(answered) in format_site_result(result, 1.0, audience=FULL)
