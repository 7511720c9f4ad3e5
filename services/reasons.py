"""Reason codes and their words: the one table clients render decisions from.

The policy, the coordinator and the fan-out say why they decided as a
`pathmaster.records.Why` (a stable code and its values); on the wire it is a
`pb.Reason`. Each code has plain words for a pathologist (the page, the CLI by default)
and full words for a researcher (`--verbose`, JSON, the case log and the `decisions`
strings of the protocol). Plain words may be empty: that decision is plumbing a
pathologist need not read. A code not in the table (a newer server) is shown as the
code and its values, never an error.
"""

from __future__ import annotations

import string
from dataclasses import dataclass
from typing import Iterable

from pathmaster.records import Why
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

PLAIN, FULL = "plain", "full"  # the audiences


@dataclass(frozen=True)
class Words:
    """A code's words: `str.format` templates over its params."""

    plain: str
    full: str


_COPIES = ("over separate connections, so that one lost packet does not hold the answer up; "
           "the first answer is used and the other copies are cancelled")
_ANSWERED = "answered by the {copy} copy ({request_class})"

REASONS: dict[str, Words] = {
    # How a site gets the case (qos.policy.choose_mode)
    "images_requested": Words("the images were sent, as asked", "images requested"),
    "images_as_sent": Words("the images were sent", "images as sent"),
    "features_same_schema": Words("the cells were measured once here and only the measurements were sent",
                                  "same feature schema: features sent, analysed once"),
    "images_other_schema_asked_features": Words("this site measures cells its own way: it was sent the images",
                                                "site has another feature schema: images sent instead"),
    "images_other_schema": Words("this site measures cells its own way: it was sent the images",
                                 "site has another feature schema: images sent"),
    # The class it travels in, the predicted wait and the hedge (qos.policy.plan_site)
    "class_stepped_down_within_deadline": Words(
        "sent with {served} priority because it will still arrive within the {asked} deadline",
        "stepped down to {served}: predicted {predicted_s:.2f} s meets the {deadline_s:.1f} s deadline, "
        "leaving {asked} capacity to others"),
    "predicted": Words("expected in about {predicted_s:.1f} s", "predicted {predicted_s:.2f} s"),
    "no_prediction_yet": Words("no estimate of the wait yet", "no prediction yet"),
    "no_hedge_most_favoured": Words("", "no hedge: {served} is the most favoured class allowed and no replica"),
    "no_hedge_no_time": Words("", "no hedge: the prediction leaves no time for one before the deadline"),
    "hedge_planned_class": Words("", "hedged on class {hedge_class} if no answer after {after_s:.2f} s"),
    "hedge_planned_replica": Words("", "hedged on replica {replica} if no answer after {after_s:.2f} s"),
    "small_request_copies": Words(
        "", "small request ({kilobytes:.1f} kB): sent as {copies} copies {gap_ms:.0f} ms apart " + _COPIES),
    "small_request_copies_at_once": Words(
        "", "small request ({kilobytes:.1f} kB): sent as {copies} copies at once " + _COPIES),
    # The coordinator's own decisions (admission, analysis)
    "class_reclassified_capacity": Words(
        "{asked} capacity is full: the case was sent with {served} priority instead of being refused",
        "{asked} capacity is fully used: served as {served} (reclassified, not dropped)"),
    "analysis_failed": Words("the cells could not be measured here: every site was sent the images",
                             "the coordinator could not analyse the cells ({error}): images sent to every site"),
    "analysed_once": Words("the {cells} cells were measured once here in {seconds:.1f} s",
                           "analysed {cells} cells once at the coordinator in {seconds:.2f} s; "
                           "features sent to {sites}"),
    # The client's own analysis (`pathmaster query --analyse-locally`, services.client.analyse_locally)
    "analysed_here": Words("", "analysed {cells} cells here: only their features sent"),
    "analysed_here_with_eye": Words(
        "", "analysed {cells} cells here: their features sent, and what the pretrained eye sees of each, "
            "because {sites} look through it"),
    "images_without_network": Words(
        "{sites} could not be given the cells' measurements here: their images were sent instead",
        "the pretrained eye of {sites} cannot be opened here (not installed, or another version): "
        "their cells sent as images"),
    # What happened while the case ran (services.coordinator.fanout)
    "hedge_sent": Words("no answer within {after_s:.1f} s: asked again with {hedge_class} priority",
                        "no answer after {after_s:.2f} s (predicted {predicted_s:.2f} s): "
                        "hedged with a copy in class {hedge_class}"),
    "hedge_sent_unpredicted": Words("no answer within {after_s:.1f} s: asked again with {hedge_class} priority",
                                    "no answer after {after_s:.2f} s: hedged with a copy in class {hedge_class}"),
    "answered_by_copy": Words("", _ANSWERED),
    "answered_by_copy_one_cancelled": Words("", _ANSWERED + "; 1 other copy cancelled"),
    "answered_by_copy_others_cancelled": Words("", _ANSWERED + "; {others} other copies cancelled"),
    "answered_before_copy_sent": Words("", _ANSWERED + " before another was sent"),
    "answered_before_copies_sent": Words("", _ANSWERED + " before {unsent} others were sent"),
    "features_sent_again": Words(
        "the site had changed how it measures cells: the measurements were sent again as it now asks",
        "features refused ({refusal}); the site's Info, asked again, says it compares {compares}: "
        "features sent again as it says"),
    "images_after_features_failed": Words("the site could not take the measurements: it was sent the images",
                                          "features failed ({error}): images sent instead"),
    # The case conclusion (pathmaster.conclusion)
    "most_significant_abnormality": Words(
        "{term}: {cells_with} of {cells_total} cells support it",
        "most significant abnormality {term}, supported by {cells_with} of {cells_total} cells "
        "({abnormal_cells} abnormal in all)"),
    "no_abnormal_cell": Words("NILM: no cell's matches support an abnormality",
                              "NILM: no cell reaches the rule's threshold ({cells_read} of {cells_total} cells read)"),
    "sites_disagree": Words(
        "the sites disagree about cell {cell}: this case cannot be concluded",
        "cannot conclude: cell {cell} reads abnormal at {abnormal_sites} and NILM at {nilm_sites}; "
        "pooled score {score} < threshold {threshold}"),
    "no_bethesda_term": Words("no site's matches carry a Bethesda term: this case cannot be concluded",
                              "cannot conclude: no match of any cell maps to a Bethesda term"),
    "no_site_answered": Words("no site answered", "no answer: no site answered"),
    # What to do next when the case cannot be concluded (pathmaster.conclusion NEXT_STEPS)
    "next_review_disputed_cell": Words(
        "Look at cell {cell} beside each site's matches and judge it yourself ({abnormal_sites} read it "
        "abnormal, {nilm_sites} NILM); if it is still unclear, add more cells from the same slide and run "
        "the case again",
        "next step: review cell {cell} by eye (abnormal at {abnormal_sites}, NILM at {nilm_sites}) or add cells"),
    "next_ask_for_bethesda_terms": Words(
        "Judge the matches by eye, and ask the sites' administrators to give their diagnosis labels "
        "Bethesda terms (their vocabularies)",
        "next step: the sites' vocabularies need Bethesda terms for their labels"),
    "decision_support_not_a_specimen": Words(
        "Decision support, not a diagnosis: {cells} picked cells, compared with labelled cells at the sites, "
        "are never an adequate Bethesda specimen, which needs thousands of cells on the slide",
        "decision support for the {cells} cells sent; not an adequate Bethesda specimen (thousands of cells)"),
    "labels_without_bethesda_term": Words("some matches' labels have no Bethesda term",
                                          "some matches' labels map to no Bethesda term"),
    "abnormal_by_site_score_only": Words("abnormal by a site's own score, not by its matches' terms",
                                         "abnormal by a site's own learnt score; its matches' terms alone fall short"),
    "matches_split": Words("its matches split: {terms}", "matches split: {terms}"),
}


def template_fields(template: str) -> set[str]:
    """The param names a template uses."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _numbers(template: str) -> set[str]:
    """The params a template formats as numbers (with a format spec such as ``.2f``)."""
    return {name for _, name, spec, _ in string.Formatter().parse(template) if name and spec}


def _typed(value, number: bool):
    """A param as its template formats it: a wire string back to a number where the
    template formats one."""
    if not number or not isinstance(value, str):
        return value
    try:
        return float(value)
    except ValueError:
        return value


def _wire(value) -> str:
    return format(value, ".6g") if isinstance(value, float) else str(value)


def words(why: Why | pb.Reason, audience: str = FULL) -> str:
    """`why` in words for `audience` ("plain" or "full"); "" when a pathologist need not
    read it; an unknown code (or missing values) as the code and its values."""
    known = REASONS.get(why.code)
    if known is not None:
        template = known.plain if audience == PLAIN else known.full
        numbers = _numbers(template)
        try:
            return template.format(**{name: _typed(value, name in numbers) for name, value in why.params.items()})
        except (KeyError, ValueError, IndexError):
            pass
    shown = ", ".join(f"{name}={_wire(value)}" for name, value in sorted(why.params.items()))
    return f"{why.code} ({shown})" if shown else why.code


def decisions(whys: Iterable[Why | pb.Reason], audience: str = FULL) -> list[str]:
    """Each of `whys` in words, the empty ones left out."""
    return [text for text in (words(w, audience) for w in whys) if text]


def reason(why: Why) -> pb.Reason:
    """`why` as it goes on the wire."""
    return pb.Reason(code=why.code, params={name: _wire(value) for name, value in why.params.items()})


def reasons(whys: Iterable[Why]) -> list[pb.Reason]:
    return [reason(w) for w in whys]


def codes(whys: Iterable[Why | pb.Reason]) -> list[str]:
    """The codes of `whys`, in order (what programs and tests read)."""
    return [w.code for w in whys]


def as_json(whys: Iterable[Why | pb.Reason]) -> list[dict]:
    """`whys` as JSON: ``{"code": ..., "params": {name: string}}`` each, as on the wire."""
    return [{"code": w.code, "params": {name: _wire(value) for name, value in w.params.items()}} for w in whys]
