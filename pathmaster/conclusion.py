"""A case concluded as a cytologist reports it: by its most significant abnormality.

The Bethesda System (TBS 2014) reports a Pap case by the most significant abnormality found,
and NILM only when none is found: one HSIL cell among normal ones makes an HSIL case, which a
majority over every match of every cell would hide. Here, from what the sites answered for
each test cell (the Bethesda term of each match, and a site's own abnormality score where it
sends one):

- each **cell** gets its term (the term most of its matches carry, a tie to the more severe)
  and the spread of its matches' terms ("HSIL 9/15, LSIL 5/15");
- a cell **supports an abnormality** when its abnormal score reaches the rule's threshold.
  Its score is the share of its matches whose term is abnormal (uniform, or weighted by
  distance within each site); a site that sends its own score and operating point has that
  score put on the same scale (its operating point mapped to the threshold) and used instead
  of its matches' share. The abnormality it supports is the severity of the median of its
  abnormal matches (a tie to the more severe);
- the **case** is the most severe abnormality any cell supports, with how many cells support
  it ("HSIL: 1 of 6 cells"); NILM when no cell supports one and the sites agree;
  ``cannot_conclude`` when, for some cell, one site on its own reads the cell abnormal and
  another reads it NILM, while the pooled score stays below the threshold (the evidence for
  an abnormality falls short, but NILM would overrule a site that sees one), or when no match
  of any cell has a Bethesda term; ``no_answer`` when no site answered.

This is decision support for the cells sent, never a diagnosis: a case of a few picked cells
is never an adequate Bethesda specimen (adequacy needs thousands of squamous cells on the
slide). Words are the clients' business; this module returns codes (`pathmaster.records.Why`).

The threshold is chosen from case-level figures: `simulate_cases` draws 6-cell cases from
held-out cells' scores (all-normal ones, and ones with 1-2 abnormal cells) and returns each
threshold's case sensitivity and specificity and the threshold that meets a target case
specificity with the best sensitivity. The arithmetic behind it: when a normal cell is called
abnormal with probability 1 - s, a 6-cell normal case is called abnormal with probability
1 - s**6, so a per-cell vote alone (s = 0.85: 62% false alarms) is not a case rule.
Hand-written because no library implements TBS's case rule or its simulation.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from pathmaster.records import Why
from pathmaster.vocabulary import BETHESDA_TERMS, NILM, majority, severity

# A cell supports an abnormality when at least half of its matches (by weight) are abnormal:
# its abnormal matches are at least as many as its normal ones, the tie going to the more
# severe reading as the cell's own term does. This default is an argument, not a fit: no
# data chose it. A site that calibrates on its own cells (`simulate_cases` over its
# cross-validated scores) sends its operating point, which replaces it for its score.
DEFAULT_THRESHOLD = 0.5
WEIGHTINGS = ("uniform", "distance")
TARGET_CASE_SPECIFICITY = 0.90
# A site's own operating point is chosen for the case, not the cell: the threshold at which
# simulated cases of its held-out cells reach this case sensitivity, at the best case
# specificity (`simulate_cases` with ``target_sensitivity``).
TARGET_CASE_SENSITIVITY = 0.95
CASE_CELLS = 6
OUTCOMES = ("abnormal", "nilm", "cannot_conclude", "no_answer")


@dataclass(frozen=True)
class SiteCell:
    """One site's answer for one test cell.

    Attributes
    ----------
    site : str
        The site's name.
    cell_id : str
        The test cell's id in the case.
    terms : tuple of str
        The Bethesda term of each match, nearest first ("" or None: the label maps to none).
    distances : tuple of float
        Each match's distance in the site's own measure (same order; may be empty).
    score : float, optional
        The site's own abnormality score of the cell, in [0, 1].
    operating_point : float, optional
        The site's threshold on ``score`` (abnormal at or above it); with ``score``.
    reading : bool, optional
        Whether ``score`` reaches the site's operating point, for a site that says so
        instead of sending the operating point.
    """

    site: str
    cell_id: str
    terms: tuple = ()
    distances: tuple = ()
    score: float | None = None
    operating_point: float | None = None
    reading: bool | None = None


@dataclass(frozen=True)
class CellReading:
    """One test cell as the case rule reads it (`conclude_cell`).

    ``term``/``support``/``total``: the term most matches carry (a tie to the more severe),
    its count, and the matches with any term; ``spread``: (term, count) most severe first;
    ``abnormal_score``: 0..1, None without evidence; ``abnormal``: the cell supports an
    abnormality; ``abnormal_term``: which ("" when none); ``site_readings``: each site's own
    reading (True: abnormal).
    """

    cell_id: str
    term: str
    support: int
    total: int
    spread: tuple
    abnormal_score: float | None
    abnormal: bool
    abnormal_term: str
    site_readings: dict
    why: tuple = ()


@dataclass(frozen=True)
class CaseReading:
    """The case as a cytologist reports it (`conclude_case`); ``outcome`` is one of `OUTCOMES`."""

    outcome: str
    term: str
    cells_with: int
    cells_total: int
    cells: tuple
    why: tuple
    rule: str


def is_abnormal_term(term: str | None) -> bool:
    """True for a Bethesda term other than NILM."""
    return bool(term) and term != NILM and term in BETHESDA_TERMS


def match_weights(distances, n: int, weighting: str = "uniform") -> np.ndarray:
    """Weights of one site's `n` matches: all 1 (``uniform``), or ``1 / (1 + d / median d)``
    (``distance``: nearer matches count more, scale-free within the site's own measure)."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, not {weighting!r}")
    d = np.asarray(distances, dtype=np.float64)
    if weighting == "uniform" or len(d) != n or n == 0:
        return np.ones(n)
    positive = d[d > 0]
    scale = float(np.median(positive)) if len(positive) else 1.0
    return 1.0 / (1.0 + np.maximum(d, 0.0) / scale)


def abnormal_share(terms, distances=(), weighting: str = "uniform") -> float | None:
    """The (weighted) share of matches with a Bethesda term whose term is abnormal, in
    [0, 1]; None when no match has a term."""
    weights = match_weights(distances, len(terms), weighting)
    known = np.array([term in BETHESDA_TERMS for term in terms], dtype=bool)
    if not known.any():
        return None
    abnormal = np.array([is_abnormal_term(term) for term in terms], dtype=bool)
    return float(weights[abnormal].sum() / weights[known].sum())


def aligned_score(score: float, operating_point: float, threshold: float) -> float:
    """`score` mapped piecewise-linearly onto [0, 1] so that `operating_point` lands on
    `threshold`: a site's own score read on the rule's scale."""
    score, point = min(max(float(score), 0.0), 1.0), min(max(float(operating_point), 0.0), 1.0)
    if score < point:
        return threshold * score / point
    return 1.0 if point >= 1.0 else threshold + (1.0 - threshold) * (score - point) / (1.0 - point)


def _site_score(answer: SiteCell, threshold: float, weighting: str) -> float | None:
    """The site's evidence on the rule's scale: its own score aligned at its operating point
    (or, with only its reading, the score within the side of the threshold it read), else
    its matches' abnormal share."""
    if answer.score is not None and answer.operating_point is not None:
        return aligned_score(answer.score, answer.operating_point, threshold)
    if answer.score is not None and answer.reading is not None:
        score = min(max(float(answer.score), 0.0), 1.0)
        if answer.reading:
            return threshold + (1.0 - threshold) * score
        return min(threshold * score, float(np.nextafter(threshold, 0.0)))  # below it, even at 1
    return abnormal_share(answer.terms, answer.distances, weighting)


def _abnormal_term(answers, weighting: str) -> str:
    """The median severity of the abnormal matches (a tie to the more severe)."""
    weight: Counter = Counter()
    for answer in answers:
        for term, w in zip(answer.terms, match_weights(answer.distances, len(answer.terms), weighting)):
            if is_abnormal_term(term):
                weight[term] += float(w)
    if not weight:
        return "ASC-US"  # abnormal by a site's own score alone: atypical, of undetermined significance
    half, running = sum(weight.values()) / 2.0, 0.0
    for term in sorted(weight, key=severity, reverse=True):
        running += weight[term]
        if running >= half:
            return term
    return NILM  # unreachable: the loop always reaches half


def conclude_cell(answers, threshold: float = DEFAULT_THRESHOLD, weighting: str = "uniform") -> CellReading:
    """One test cell read from every site's answer for it.

    Parameters
    ----------
    answers : sequence of SiteCell
        The sites' answers for this one cell (at least one).
    threshold : float
        The abnormal score, in [0, 1], at or above which the cell supports an abnormality.
    weighting : {"uniform", "distance"}
        How a site's matches count in its share (`match_weights`).

    Returns
    -------
    CellReading
    """
    answers = list(answers)
    terms = [t for a in answers for t in a.terms if t in BETHESDA_TERMS]
    counts = Counter(terms)
    top = majority(terms, BETHESDA_TERMS)
    spread = tuple(sorted(counts.items(), key=lambda item: severity(item[0]), reverse=True))
    scored, readings = [], {}
    for answer in answers:
        score = _site_score(answer, threshold, weighting)
        if score is not None:
            scored.append((score, max(1, sum(t in BETHESDA_TERMS for t in answer.terms))))
            readings[answer.site] = score >= threshold
    why = []
    if any(t and t not in BETHESDA_TERMS for a in answers for t in a.terms) or (answers and not terms):
        why.append(Why("labels_without_bethesda_term"))
    score = (sum(s * w for s, w in scored) / sum(w for _, w in scored)) if scored else None
    abnormal = score is not None and score >= threshold
    abnormal_term = _abnormal_term(answers, weighting) if abnormal else ""
    if abnormal and not any(is_abnormal_term(t) for t in terms):
        why.append(Why("abnormal_by_site_score_only"))
    if len(spread) > 1:
        why.append(Why("matches_split", {"terms": ", ".join(f"{t} {n}/{len(terms)}" for t, n in spread)}))
    return CellReading(answers[0].cell_id if answers else "", top.label if top else "", top.votes if top else 0,
                       len(terms), spread, score, abnormal, abnormal_term, readings, tuple(why))


def describe_rule(threshold: float = DEFAULT_THRESHOLD, weighting: str = "uniform") -> str:
    """The rule and its threshold in one line, for the researcher."""
    return (f"most significant abnormality; a cell supports one when its abnormal score >= {threshold:.2f} "
            f"(share of its matches in abnormal Bethesda terms, {weighting} weights; a site's own score "
            f"on that scale where sent)")


def conclude_case(answers, threshold: float = DEFAULT_THRESHOLD, weighting: str = "uniform",
                  cell_ids=None) -> CaseReading:
    """The case from every site's answers for every test cell (see the module docstring).

    Parameters
    ----------
    answers : iterable of SiteCell
        Every answering site's answer for every cell it answered for.
    threshold, weighting
        As in `conclude_cell`.
    cell_ids : sequence of str, optional
        The case's test cells in order (default: in order of first answer); cells no site
        answered for count in ``cells_total`` of nothing.

    Returns
    -------
    CaseReading
    """
    by_cell: dict[str, list[SiteCell]] = defaultdict(list)
    for answer in answers:
        by_cell[answer.cell_id].append(answer)
    order = list(cell_ids) if cell_ids is not None else list(by_cell)
    cells = tuple(conclude_cell(by_cell[c], threshold, weighting) for c in order if by_cell.get(c))
    rule = describe_rule(threshold, weighting)
    statement = Why("decision_support_not_a_specimen", {"cells": str(len(cells))})
    if not cells:
        return CaseReading("no_answer", "", 0, 0, (), (Why("no_site_answered"), statement), rule)
    n = len(cells)
    flagged = [c for c in cells if c.abnormal]
    if flagged:
        term = max((c.abnormal_term for c in flagged), key=severity)
        with_term = sum(c.abnormal_term == term for c in flagged)
        why = (Why("most_significant_abnormality", {"term": term, "cells_with": str(with_term),
                                                       "cells_total": str(n), "abnormal_cells": str(len(flagged))}),)
        return CaseReading("abnormal", term, with_term, n, cells, why + (statement,), rule)
    read = [c for c in cells if c.abnormal_score is not None]
    if not read:
        return CaseReading("cannot_conclude", "", 0, n, cells,
                           (Why("no_bethesda_term"), Why("next_ask_for_bethesda_terms"), statement), rule)
    split = [c for c in read if len(set(c.site_readings.values())) > 1]
    if split:
        worst = max(split, key=lambda c: c.abnormal_score)
        why = Why("sites_disagree", {
            "cell": worst.cell_id, "score": f"{worst.abnormal_score:.2f}", "threshold": f"{threshold:.2f}",
            "abnormal_sites": ", ".join(sorted(s for s, r in worst.site_readings.items() if r)),
            "nilm_sites": ", ".join(sorted(s for s, r in worst.site_readings.items() if not r))})
        step = Why("next_review_disputed_cell", {key: why.params[key] for key in ("cell", "abnormal_sites", "nilm_sites")})
        return CaseReading("cannot_conclude", "", 0, n, cells, (why, step, statement), rule)
    why = Why("no_abnormal_cell", {"cells_read": str(len(read)), "cells_total": str(n)})
    return CaseReading("nilm", NILM, len(read), n, cells, (why, statement), rule)


# ---------------------------------------------------------------- choosing the threshold


def _draw(rng: np.random.Generator, pool: np.ndarray, groups: np.ndarray, n: int) -> np.ndarray:
    """`n` cells of `pool` (indices), each from a different group while groups last."""
    chosen_groups = np.unique(groups[pool])
    rng.shuffle(chosen_groups)
    picked = []
    for g in chosen_groups[:n]:
        members = pool[groups[pool] == g]
        picked.append(members[rng.integers(len(members))])
    while len(picked) < n:  # fewer groups than cells: draw again from the whole pool
        picked.append(pool[rng.integers(len(pool))])
    return np.array(picked)


def draw_cases(abnormal, groups=None, *, usable=None, cells: int = CASE_CELLS, abnormal_cells=(1, 2),
               cases: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Simulated cases of held-out cells: (normal, abnormal) int arrays of shape (cases, cells).

    Each row holds the indices of one case's cells: all-normal cases, and cases with
    `abnormal_cells` (drawn uniformly) abnormal cells among normal ones. A case's cells come
    from different `groups` (slide images or patients) while there are enough, so that one
    image's look-alike cells do not fill a case. `usable` (bool, shape (n,)) leaves cells out.
    """
    abnormal = np.asarray(abnormal, dtype=bool)
    groups = np.arange(len(abnormal)) if groups is None else np.asarray(groups)
    usable = np.ones(len(abnormal), bool) if usable is None else np.asarray(usable, dtype=bool)
    if not (len(abnormal) == len(groups) == len(usable)):
        raise ValueError("abnormal, groups and usable must have one value per cell")
    if not 1 <= cells <= 1000 or not 1 <= cases <= 100_000 or not all(1 <= a <= cells for a in abnormal_cells):
        raise ValueError("cells, cases or abnormal_cells out of range")
    normal_pool, abnormal_pool = np.flatnonzero(usable & ~abnormal), np.flatnonzero(usable & abnormal)
    if len(normal_pool) == 0 or len(abnormal_pool) == 0:
        raise ValueError("simulating cases needs normal and abnormal cells")
    rng = np.random.default_rng(seed)
    normal = np.array([_draw(rng, normal_pool, groups, cells) for _ in range(cases)])
    mixed = []
    for _ in range(cases):
        a = int(rng.choice(abnormal_cells))
        mixed.append(np.r_[_draw(rng, abnormal_pool, groups, a), _draw(rng, normal_pool, groups, cells - a)])
    return normal, np.array(mixed)


def simulate_cases(scores, abnormal, groups=None, *, cells: int = CASE_CELLS, abnormal_cells=(1, 2),
                   cases: int = 2000, thresholds=None, target_specificity: float = TARGET_CASE_SPECIFICITY,
                   target_sensitivity: float | None = None, seed: int = 0) -> dict:
    """Case sensitivity and specificity per threshold, on cases drawn from held-out cells.

    Parameters
    ----------
    scores : array_like of float, shape (n,)
        Each held-out cell's abnormal score in [0, 1] (e.g. `abnormal_share` of its matches
        against a database it is not in, or a site's own score), NaN where it has none.
    abnormal : array_like of bool, shape (n,)
        The cell's true reading (True: abnormal).
    groups : array_like, shape (n,), optional
        The slide image (or patient) of each cell (`draw_cases`).
    cells, abnormal_cells, cases, seed
        As in `draw_cases` (``cases`` of each kind).
    thresholds : array_like of float, optional
        Thresholds to score (default: every distinct score, where decisions change).
    target_specificity : float
        The case specificity the chosen threshold must reach.
    target_sensitivity : float, optional
        Choose for sensitivity instead: the threshold with the best specificity among those
        whose case sensitivity reaches this (ties to the higher sensitivity); when none
        does, the most sensitive one. ``met`` then says whether it was reached.

    Returns
    -------
    dict
        ``thresholds``, ``sensitivity``, ``specificity`` (lists, one value per threshold;
        a case is abnormal when any of its cells scores at or above the threshold, as
        `conclude_case` reads it), ``chosen`` (the threshold with the best sensitivity among
        those meeting the target, ties to the higher specificity; when none meets it, the one
        with the best specificity), ``met`` (whether it meets the target),
        ``chosen_sensitivity``, ``chosen_specificity``, and ``cells`` / ``groups`` /
        ``cases`` (what was drawn from).
    """
    scores = np.asarray(scores, dtype=np.float64)
    usable = ~np.isnan(scores)
    truth = np.asarray(abnormal, dtype=bool)
    normal, mixed = draw_cases(truth, groups, usable=usable, cells=cells, abnormal_cells=abnormal_cells,
                               cases=cases, seed=seed)
    normal_max, abnormal_max = scores[normal].max(axis=1), scores[mixed].max(axis=1)
    grid = np.unique(scores[usable]) if thresholds is None else np.asarray(thresholds, dtype=np.float64)
    sensitivity = (abnormal_max[None, :] >= grid[:, None]).mean(axis=1)
    specificity = (normal_max[None, :] < grid[:, None]).mean(axis=1)
    if target_sensitivity is None:
        meets = specificity >= target_specificity
        candidates = np.flatnonzero(meets) if meets.any() else np.flatnonzero(specificity == specificity.max())
        best = max(candidates, key=lambda i: (sensitivity[i], specificity[i]))
    else:
        meets = sensitivity >= target_sensitivity
        candidates = np.flatnonzero(meets) if meets.any() else np.flatnonzero(sensitivity == sensitivity.max())
        best = max(candidates, key=lambda i: (specificity[i], sensitivity[i]))
    groups = np.arange(len(scores)) if groups is None else np.asarray(groups)
    return {"thresholds": grid.tolist(), "sensitivity": sensitivity.tolist(), "specificity": specificity.tolist(),
            "chosen": float(grid[best]), "met": bool(meets[best]), "target_specificity": target_specificity,
            "target_sensitivity": target_sensitivity,
            "chosen_sensitivity": float(sensitivity[best]), "chosen_specificity": float(specificity[best]),
            "cells": {"normal": int((usable & ~truth).sum()), "abnormal": int((usable & truth).sum())},
            "groups": int(len(np.unique(groups[usable]))), "cases": cases, "cells_per_case": cells}


def at_threshold(simulation: dict, threshold: float) -> tuple[float, float]:
    """(case sensitivity, case specificity) of `simulate_cases`'s result at `threshold`: those
    of the smallest scored threshold at or above it, which decides every drawn case alike
    when the thresholds scored are the distinct scores (the default)."""
    grid = np.asarray(simulation["thresholds"])
    above = np.flatnonzero(grid >= threshold)
    if len(above) == 0:
        return 0.0, 1.0  # no cell reaches it: every case NILM
    return simulation["sensitivity"][above[0]], simulation["specificity"][above[0]]
