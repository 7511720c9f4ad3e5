"""The case conclusion in words and as plain JSON: one rendering for the CLI, batch and page.

The coordinator concludes the case (`CaseSummary.conclusion`, by `pathmaster.conclusion`);
clients only render it. A pathologist reads the conclusion first, then each cell's Bethesda
term and how its matches split, then the decision-support statement; a program reads
`conclusion_json` (the message as a plain dict: codes, terms and counts).
"""

from __future__ import annotations

from google.protobuf import json_format

STATEMENT = ("Decision support, not a diagnosis: these cells were compared with labelled cells at the sites. "
             "A case of {cells} picked cell{s} is never an adequate Bethesda specimen, which needs thousands "
             "of cells on the slide; the slide's interpretation is the cytologist's.")


def conclusion_json(conclusion) -> dict:
    """The CaseConclusion message as a plain JSON-ready dict (field names as in the proto,
    every field present, ``why`` as codes and params)."""
    return json_format.MessageToDict(conclusion, preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


def _cells(n: int) -> str:
    return f"{n} cell" + ("" if n == 1 else "s")


def headline(conclusion) -> str:
    """The case's conclusion in one line (e.g. "HSIL: 1 of 6 cells")."""
    why = {r.code: r.params for r in conclusion.why}
    if conclusion.outcome == "abnormal":
        more = int(why.get("most_significant_abnormality", {}).get("abnormal_cells", conclusion.cells_with))
        other = f"; {_cells(more)} abnormal in all" if more > conclusion.cells_with else ""
        return f"{conclusion.bethesda}: {conclusion.cells_with} of {_cells(conclusion.cells_total)}{other}"
    if conclusion.outcome == "nilm":
        return f"NILM: no cell's matches support an abnormality ({conclusion.cells_with} of " \
               f"{_cells(conclusion.cells_total)} read)"
    if conclusion.outcome == "cannot_conclude" and "sites_disagree" in why:
        p = why["sites_disagree"]
        return (f"cannot conclude: the sites disagree on cell {p['cell']} (abnormal at {p['abnormal_sites']}, "
                f"NILM at {p['nilm_sites']}) and together fall short of the rule")
    if conclusion.outcome == "cannot_conclude":
        return "cannot conclude: no site's matches carry a Bethesda term"
    return "no conclusion: no site answered"


def spread_text(cell) -> str:
    """How a cell's matches split over Bethesda terms, most severe first ("HSIL 9/15, LSIL 5/15")."""
    return ", ".join(f"{t.bethesda} {t.count}/{cell.total}" for t in cell.spread)


def cell_line(cell, verbose: bool = False) -> str:
    """One test cell: how its matches split (its term first among equals: the most severe
    first), what it supports, and with `verbose` its abnormal score."""
    if not cell.total:
        return f"{cell.query_cell_id}: no match with a Bethesda term"
    spread = spread_text(cell)
    supports = f" -> supports {cell.abnormal_term}" if cell.abnormal else ""
    score = f" (abnormal score {cell.abnormal_score:.2f})" if verbose else ""
    return f"{cell.query_cell_id}: {spread}{supports}{score}"


def statement(conclusion) -> str:
    """The decision-support statement for a case of this many cells."""
    n = max(conclusion.cells_total, len(conclusion.cells))
    return STATEMENT.format(cells=n, s="" if n == 1 else "s")


def format_conclusion(conclusion, verbose: bool = False) -> list[str]:
    """The conclusion first, each cell's line, then the statement (and the rule, verbose)."""
    lines = [f"Conclusion: {headline(conclusion)}"]
    lines += [f"    {cell_line(c, verbose)}" for c in conclusion.cells]
    if verbose and conclusion.rule:
        lines.append(f"    rule: {conclusion.rule}")
    lines.append(f"    {statement(conclusion)}")
    return lines
