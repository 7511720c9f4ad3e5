"""The case conclusion in words and as plain JSON: one rendering for the CLI, batch and page.

The coordinator concludes the case (`CaseSummary.conclusion`, by `pathmaster.conclusion`);
clients only render it. A pathologist reads the conclusion first, then each cell's Bethesda
term and how its matches split, then the decision-support statement; a program reads
`conclusion_json` (the message as a plain dict: codes, terms and counts). The words of each
code are those of `services.reasons`, the one table.
"""

from __future__ import annotations

from google.protobuf import json_format

from services.reasons import FULL, PLAIN, words

STATEMENT = "decision_support_not_a_specimen"


def conclusion_json(conclusion) -> dict:
    """The CaseConclusion message as a plain JSON-ready dict (field names as in the proto,
    every field present, ``why`` as codes and params)."""
    return json_format.MessageToDict(conclusion, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def headline(conclusion, verbose: bool = False) -> str:
    """The case's conclusion in one line (e.g. "HSIL: 1 of 6 cells support it"): the words
    of its first reason, the one that decided the outcome."""
    first = next((w for w in conclusion.why if w.code != STATEMENT), None)
    return words(first, FULL if verbose else PLAIN) if first is not None else conclusion.outcome


def statement(conclusion, verbose: bool = False) -> str:
    """The decision-support statement (never a diagnosis, never an adequate specimen)."""
    said = next((w for w in conclusion.why if w.code == STATEMENT), None)
    return words(said, FULL if verbose else PLAIN) if said is not None else ""


def next_step(conclusion, verbose: bool = False) -> str:
    """What to do next when the case cannot be concluded (its "next_" reason), "" otherwise."""
    said = next((w for w in conclusion.why if w.code.startswith("next_")), None)
    return words(said, FULL if verbose else PLAIN) if said is not None else ""


def spread_text(cell) -> str:
    """How a cell's matches split over Bethesda terms, most severe first ("HSIL 9/15, LSIL 5/15")."""
    return ", ".join(f"{t.bethesda} {t.count}/{cell.total}" for t in cell.spread)


def cell_line(cell, verbose: bool = False) -> str:
    """One test cell: how its matches split, what it supports, and with `verbose` its
    abnormal score and each site's own reading."""
    if not cell.total:
        return f"{cell.query_cell_id}: no match with a Bethesda term"
    supports = f" -> supports {cell.abnormal_term}" if cell.abnormal else ""
    more = ""
    if verbose:
        sites = "; ".join(part for part in (
            f"abnormal at {', '.join(cell.abnormal_sites)}" if cell.abnormal_sites else "",
            f"NILM at {', '.join(cell.nilm_sites)}" if cell.nilm_sites else "") if part)
        more = f" (abnormal score {cell.abnormal_score:.2f}; {sites})"
    return f"{cell.query_cell_id}: {spread_text(cell)}{supports}{more}"


def format_conclusion(conclusion, verbose: bool = False) -> list[str]:
    """The conclusion first, each cell's line, what to do next when it cannot be concluded,
    then the statement (and the rule, verbose)."""
    lines = [f"Conclusion: {headline(conclusion, verbose)}"]
    lines += [f"    {cell_line(c, verbose)}" for c in conclusion.cells]
    lines += [f"    What to do next: {s}" for s in [next_step(conclusion, verbose)] if s]
    if verbose and conclusion.rule:
        lines.append(f"    rule: {conclusion.rule}")
    said = statement(conclusion, verbose)
    return lines + ([f"    {said}"] if said else [])
