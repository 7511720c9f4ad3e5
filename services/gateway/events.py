"""Turn the coordinator's protobuf replies into the JSON the page and the batch write.

Thumbnails become `data:` URLs so the page shows them without another request;
gRPC status codes get their names ("UNAVAILABLE") so a person can read them.
"""

from __future__ import annotations

import base64

import grpc

from services import conclusion_words, reasons
from services.shared import unpack

_STATUS_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}


def status_name(code: int) -> str:
    """The gRPC status name for a numeric code, e.g. 14 -> "UNAVAILABLE"."""
    return _STATUS_NAMES.get(int(code), f"STATUS_{int(code)}")


# What a failed call means, in the words the page shows a pathologist (status names are
# for logs and scripts): a site's state on its card, and the coordinator's in a sentence.
SITE_WORDS = {"OK": "answered", "UNAVAILABLE": "not reachable", "DEADLINE_EXCEEDED": "did not answer in time",
              "RESOURCE_EXHAUSTED": "too busy", "CANCELLED": "stopped",
              "UNAUTHENTICATED": "refused the connection", "PERMISSION_DENIED": "refused the connection"}
COORDINATOR_WORDS = {
    "UNAVAILABLE": "The coordinator is not reachable; is it running?",
    "DEADLINE_EXCEEDED": "The coordinator did not answer in time; try again.",
    "RESOURCE_EXHAUSTED": "The coordinator is too busy right now; try again in a minute.",
    "UNAUTHENTICATED": "The coordinator refused this page's connection; ask your administrator.",
    "PERMISSION_DENIED": "The coordinator refused this page's connection; ask your administrator.",
    "NOT_FOUND": "That was not found at the site.",
}


def site_words(status: str) -> str:
    """A site's state in words, from a status name ("UNAVAILABLE" -> "not reachable")."""
    return SITE_WORDS.get(status, "could not answer")


def coordinator_words(status: str) -> str:
    """What a failed coordinator call means, as one sentence for the page."""
    return COORDINATOR_WORDS.get(status, "The coordinator could not do this; try again, or ask "
                                         "your administrator.")


def png_data_url(image: bytes) -> str:
    """A `data:` URL for PNG, JPEG or WebP bytes ("" when there are none)."""
    if not image:
        return ""
    if image[:3] == b"\xff\xd8\xff":
        kind = "jpeg"
    elif image[:4] == b"RIFF" and image[8:12] == b"WEBP":
        kind = "webp"
    else:
        kind = "png"
    return f"data:image/{kind};base64," + base64.b64encode(image).decode("ascii")


def match_json(match, with_thumbnail: bool = True) -> dict:
    """One `Match` as a dict: cell_id, diagnosis, bethesda, distance, source_id, image_sha256,
    similarity (0..1, comparable between sites), same_cell (the test cell's own copy),
    measures (why close)[, thumbnail]."""
    out = {"cell_id": match.cell_id, "diagnosis": match.diagnosis, "bethesda": match.bethesda,
           "distance": round(float(match.distance), 6), "source_id": match.source_id,
           "image_sha256": match.image_sha256, "similarity": round(float(match.similarity), 4),
           "same_cell": bool(match.same_cell), "measures": unpack(match.measure_log2_ratio, match.measure_share)}
    if with_thumbnail:
        out["thumbnail"] = png_data_url(match.thumbnail)
    return out


def cell_result_json(cell, with_thumbnails: bool = True) -> dict:
    """One `CellResult` as a dict, its matches closest first."""
    return {"query_cell_id": cell.query_cell_id, "error": cell.error,
            "background_estimated": cell.background_estimated,
            "mask_estimated": cell.mask_estimated,
            "matches": [match_json(m, with_thumbnails) for m in cell.matches]}


def timing_json(timing) -> dict:
    """A `SiteTiming` as a dict of seconds."""
    return {name: round(getattr(timing, name), 6)
            for name in ("total_s", "transfer_s", "extraction_s", "search_s", "site_wall_s")}


def site_result_json(result, with_thumbnails: bool = True) -> dict:
    """One site's `SiteResult` as an event dict of type "site"."""
    cells = [cell_result_json(c, with_thumbnails) for c in result.cells]
    return {"type": "site", "site": result.site,
            "ok": result.status_code == 0,
            "status_code": result.status_code,
            "status": status_name(result.status_code),
            "status_words": site_words(status_name(result.status_code)),
            "status_message": result.status_message,
            "algorithm": result.algorithm,
            "timing": timing_json(result.timing),
            "bytes_sent": result.bytes_sent, "bytes_received": result.bytes_received,
            "mode": result.mode, "request_class": result.request_class,
            "predicted_s": round(result.predicted_s, 6) if result.predicted_s else None,
            "decisions": list(result.decisions), "why": reasons_json(result.why),
            "cells": cells}


def summary_json(summary) -> dict:
    """The `CaseSummary` as an event dict of type "summary"."""
    return {"type": "summary", "case_id": summary.case_id,
            "request_class": summary.request_class, "total_s": round(summary.total_s, 6),
            "sites_ok": summary.sites_ok, "sites_failed": summary.sites_failed,
            "bytes_sent": summary.bytes_sent, "bytes_received": summary.bytes_received,
            "votes": [{"query_cell_id": v.query_cell_id, "diagnosis": v.diagnosis,
                       "votes": v.votes, "total": v.total, "bethesda": v.bethesda,
                       "bethesda_votes": v.bethesda_votes, "bethesda_total": v.bethesda_total}
                      for v in summary.votes],
            "predicted_s": round(summary.predicted_s, 6) if summary.predicted_s else None,
            "served_class": summary.served_class, "decisions": list(summary.decisions),
            "why": reasons_json(summary.why), **conclusion_event(summary.conclusion)}


def reasons_json(whys) -> list[dict]:
    """`Reason`s as dicts of code and params, with their words for a pathologist ("plain",
    "" when they need not read it) and a researcher ("full"), from services/reasons.py."""
    return [w | {"plain": reasons.words(r, reasons.PLAIN), "full": reasons.words(r, reasons.FULL)}
            for w, r in zip(reasons.as_json(whys), whys)]


def conclusion_event(conclusion) -> dict:
    """The case conclusion as the summary carries it: "conclusion", the message as a plain
    dict (services/conclusion_words.py) whose reasons have their words, and
    "conclusion_words": its headline, each cell's line and the decision-support statement."""
    plain = conclusion_words.conclusion_json(conclusion)
    plain["why"] = reasons_json(conclusion.why)
    for cell, message in zip(plain.get("cells", []), conclusion.cells):
        cell["why"] = reasons_json(message.why)
    return {"conclusion": plain,
            "conclusion_words": {"headline": conclusion_words.headline(conclusion),
                                 "statement": conclusion_words.statement(conclusion),
                                 "next_step": conclusion_words.next_step(conclusion),
                                 "cells": {c.query_cell_id: conclusion_words.cell_line(c) for c in conclusion.cells}}}


def plan_json(plan) -> dict:
    """The `CasePlan` (first event) as a dict of type "plan": predicted seconds (None: no
    prediction yet) and, per site, the mode and class chosen and why."""
    return {"type": "plan", "case_id": plan.case_id, "request_class": plan.request_class,
            "served_class": plan.served_class, "deadline_s": plan.deadline_s,
            "predicted_s": round(plan.predicted_s, 6) if plan.predicted_s else None,
            "analysis_s": round(plan.analysis_s, 6),
            "decisions": list(plan.decisions), "why": reasons_json(plan.why),
            "sites": [{"site": s.site, "mode": s.mode, "request_class": s.request_class,
                       "predicted_s": round(s.predicted_s, 6) if s.predicted_s else None,
                       "hedge_after_s": round(s.hedge_after_s, 6) if s.hedge_after_s else None,
                       "reasons": list(s.reasons), "why": reasons_json(s.why)} for s in plan.sites]}


def case_event_json(event, with_thumbnails: bool = True) -> dict:
    """One `CaseEvent` (a site's result or the final summary) as a dict."""
    kind = event.WhichOneof("event")
    if kind == "site_result":
        return site_result_json(event.site_result, with_thumbnails)
    if kind == "plan":
        return plan_json(event.plan)
    return summary_json(event.summary)


def class_stats_json(stats) -> dict:
    """One `ClassStats` as a dict (times in seconds)."""
    return {"request_class": stats.request_class, "dscp": stats.dscp, "cases": stats.cases,
            "mean_s": stats.mean_s, "std_s": stats.std_s, "cv": stats.cv,
            "p50_s": stats.p50_s, "p95_s": stats.p95_s, "recent_s": list(stats.recent_s)}
