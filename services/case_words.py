"""A case's events in words for the person who sent it: one rendering for `pathmaster
query`, the demo and `pathmaster batch`.

Plain (the default) says what the page says, in its words: the case's expected wait once;
per site its answer (``services.gateway.events.site_words``), its time and the
pathologist's own wait (from sending to that answer); per match its diagnosis, Bethesda term
and the site's calibrated similarity ("97% similar": the share of pairs of the site's own
cells farther apart, comparable between sites, as the page's ``words.js`` shows it); the
case conclusion first in the summary (``services.conclusion_words``). Decisions are in
``services.reasons``' words for the audience. Full (``--verbose``) adds every decision, the
site's algorithm, its time split, bytes, raw distances (in each site's own scale) and votes.
"""

from __future__ import annotations

from services.conclusion_words import format_conclusion
from services.reasons import FULL, PLAIN, decisions

# The wait is said once, for the case (its plan); not again for each site.
WAIT_CODES = frozenset({"predicted", "no_prediction_yet"})


def similarity_text(similarity: float) -> str:
    """A match's calibrated similarity (0..1) as the page words it: "97% similar", "<1% similar"."""
    return "<1% similar" if similarity < 0.005 else f"{int(100 * similarity + 0.5)}% similar"


def diagnosis_text(diagnosis: str) -> str:
    """A site's label as the page writes it ("severe_dysplasia" -> "severe dysplasia")."""
    return (diagnosis or "unknown").replace("_", " ")


def match_text(match, audience: str = PLAIN) -> str:
    """One match: its diagnosis, Bethesda term and similarity (with the full audience, its
    raw distance in the site's own measure too)."""
    term = f" ({match.bethesda})" if match.bethesda else ""
    distance = f", distance {match.distance:.3f}" if audience == FULL else ""
    return f"{diagnosis_text(match.diagnosis)}{term} {similarity_text(match.similarity)}{distance}"


def _site_decisions(whys, audience: str, said: frozenset[str] = frozenset()) -> list[str]:
    """A site's decisions for `audience`; plain leaves out the wait, said once for the case,
    and the codes in `said` (already printed for this site, in the plan)."""
    if audience == FULL:
        return decisions(whys, audience)
    return decisions([w for w in whys if w.code not in WAIT_CODES | said], audience)


def _site_head(result, elapsed_s: float, audience: str) -> str:
    from services.gateway.events import site_words, status_name

    status = status_name(result.status_code)
    if audience == PLAIN:
        took = f" in {result.timing.total_s:.2f} s" if result.status_code == 0 else ""
        return f"{result.site:<12} {site_words(status)}{took} (your wait {elapsed_s:.2f} s)"
    head = f"[{elapsed_s:6.2f} s] {result.site:<12} {status}"
    if result.status_code != 0:
        return f"{head}  {result.status_message}"
    t = result.timing
    return (f"{head}  {result.algorithm}: site {t.site_wall_s:.2f} s (extraction {t.extraction_s:.2f} s, "
            f"search {t.search_s:.3f} s), transfer {t.transfer_s:.3f} s, "
            f"{result.bytes_sent / 1024:.0f} KiB out / {result.bytes_received / 1024:.0f} KiB back"
            + (f", {result.mode} in {result.request_class}" if result.mode else ""))


def format_site_result(result, elapsed_s: float, truth: dict | None = None, audience: str = PLAIN,
                       said: frozenset[str] = frozenset()) -> str:
    """A site's result as lines for a terminal: its answer, its time and the wait so far
    (`elapsed_s`, since the case was sent); the decisions not `said` in its plan (codes);
    each cell's matches (truth: {cell id: diagnosis} when known)."""
    lines = [_site_head(result, elapsed_s, audience)]
    if result.status_code != 0:
        return "\n".join(lines)
    lines += [f"    ({d})" for d in _site_decisions(result.why, audience, said)]
    for cell in result.cells:
        label = f"    {cell.query_cell_id}"
        if truth and cell.query_cell_id in truth:
            label += f" (true: {diagnosis_text(truth[cell.query_cell_id])})"
        if cell.error:
            lines.append(f"{label}: could not be read: {cell.error}")
            continue
        lines.append(f"{label}: " + "; ".join(match_text(m, audience) for m in cell.matches))
    return "\n".join(lines)


def planned_codes(plan) -> dict[str, frozenset[str]]:
    """{site: the codes its plan said}: what `format_site_result` need not say again."""
    return {s.site: frozenset(w.code for w in s.why) for s in plan.sites}


def format_plan(plan, audience: str = PLAIN) -> str:
    """The case's plan, printed before any result: the expected wait (once) and, per site,
    what was decided for it in `audience`'s words (full: its mode, class and prediction)."""
    wait = f"expected in about {plan.predicted_s:.1f} s" if plan.predicted_s else "no estimate of the wait yet"
    served = f" (served as {plan.served_class})" if plan.served_class != plan.request_class else ""
    lines = [f"case {plan.case_id} ({plan.request_class}{served}): {wait}, deadline {plan.deadline_s:.0f} s"]
    for s in plan.sites:
        said = _site_decisions(s.why, audience)
        if audience == FULL:
            predicted = f"~{s.predicted_s:.2f} s" if s.predicted_s else "not predicted yet"
            lines.append(f"    {s.site:<12} {s.mode:<8} {s.request_class:<9} {predicted}")
            lines += [f"        {d}" for d in said]
        elif said:
            lines.append(f"    {s.site}: {'; '.join(said)}")
    lines += [f"    {d}" for d in decisions(plan.why, audience)]
    return "\n".join(lines)


def format_summary(summary, truth: dict | None = None, audience: str = PLAIN,
                   elapsed_s: float | None = None) -> str:
    """The case's summary: its conclusion first (with the full audience each cell's score,
    each site's reading and the rule), then how many sites answered and the wait
    (`elapsed_s`, since the case was sent; full: the coordinator's time, bytes and each
    cell's vote)."""
    lines = format_conclusion(summary.conclusion, verbose=audience == FULL)
    answered = f"{summary.sites_ok} of {summary.sites_ok + summary.sites_failed} sites answered"
    if audience == PLAIN:
        wait = f"; your wait {elapsed_s:.2f} s" if elapsed_s is not None else f" in {summary.total_s:.2f} s"
        expected = f" (expected {summary.predicted_s:.1f} s)" if summary.predicted_s else ""
        return "\n".join(lines + [f"{answered}{wait}{expected}"])
    predicted = f" (predicted {summary.predicted_s:.2f} s)" if summary.predicted_s else ""
    lines += [f"case {summary.case_id} ({summary.request_class}): {summary.total_s:.2f} s{predicted}, "
              f"{summary.sites_ok} site(s) OK, {summary.sites_failed} failed, "
              f"{summary.bytes_sent / 1024:.0f} KiB sent, {summary.bytes_received / 1024:.0f} KiB received"]
    for v in summary.votes:
        known = f"  [true: {truth[v.query_cell_id]}]" if truth and v.query_cell_id in truth else ""
        bethesda = f"; Bethesda {v.bethesda} ({v.bethesda_votes}/{v.bethesda_total})" if v.bethesda else ""
        lines.append(f"    {v.query_cell_id}: {v.diagnosis} ({v.votes}/{v.total} matches{bethesda}){known}")
    return "\n".join(lines)
