"""Operating points: the threshold on an abnormality score at which a cell supports an
abnormality.

``operating_point`` is the project's one rule for the threshold at which held-out
sensitivity reaches a target: a site chooses its own with a margin (``site_threshold``,
``choose_site_score``), and the evaluation chooses its training folds' by the same rule
without one. ``case_operating_point`` chooses the threshold for 6-cell cases from simulated
cases of the site's held-out cells (``pathmaster.conclusion.simulate_cases``);
``cells_needed`` and ``auc_standard_error`` say how many cells a target needs and how
certain an AUC is.
"""

from __future__ import annotations

import numpy as np

# The operating point: the highest threshold at which the site's own held-out cells reach
# this sensitivity for abnormal cells (decision support should miss few abnormal cells: a
# missed one costs a patient more than a second look at a normal one). Evaluation's
# training folds aim at it too.
TARGET_SENSITIVITY = 0.95
# The operating point's margin for its sampling error: the threshold is the highest at which
# a one-sided Clopper-Pearson lower bound, at this confidence, of the sensitivity on the
# site's held-out abnormal cells still reaches TARGET_SENSITIVITY (``operating_point``). A
# threshold where exactly 95% of ~90 held-out abnormal cells score above it finds 0.87-1.0
# of a new fold's; the bound asks for more found cells the fewer there are, and little more
# when there are many. On the dev half's 5 folds (benchmarks/results/learn-a15ed0b) 0.8 on
# every held-out cell found 332 of 340 new abnormal cells (per fold 0.94-1.0) where the point
# estimate on a third found 323 (0.87-1.0), for 3 more of 122 normal cells flagged; 0.9 and
# 0.95 found no more and flagged 3 more.
MARGIN_CONFIDENCE = 0.8
# Thresholds the site's report records beside the one it uses, for benchmarks: the point
# estimate on the first trained fold's cells alone ("third"), on every held-out cell
# ("point"), and with the margin at these confidences.
MARGIN_RULES = (0.5, 0.8, 0.9, 0.95)
# Simulated cases of each kind (all-normal, with abnormal cells) the case operating point reads.
CASES_SIMULATED = 2000
# The case sensitivity a site's threshold must reach on its own held-out cells: above the
# target on new slides (``conclusion.TARGET_CASE_SENSITIVITY``), a margin for the threshold's
# error there: on the dev half's 5 folds by slide image a threshold reaching 0.95 on a site's
# held-out cells found 0.91 of the cases of slides it had not seen.
SITE_CASE_SENSITIVITY = 0.97


def cells_needed(abnormal_cells: int, target: float = TARGET_SENSITIVITY, confidence: float | None = None) -> int:
    """How many of ``abnormal_cells`` held-out abnormal cells a threshold must find: the
    fewest whose sensitivity reaches ``target`` (``confidence`` None), or whose one-sided
    Clopper-Pearson lower bound at ``confidence`` does (scipy.stats.beta: the exact
    binomial bound). A site with too few abnormal cells for the bound to be met short of
    finding every one (under ~60 at 0.95 and 0.8) gets the point estimate: its weakest
    abnormal cell would set the threshold, and one outlier there flags most normal cells."""
    from scipy.stats import beta

    n = int(abnormal_cells)
    needed = max(int(np.ceil(target * n - 1e-9)), 1)
    if confidence is None or n == 0:
        return min(needed, max(n, 1))
    found = np.arange(needed, n + 1)
    bounded = found[beta.ppf(1.0 - confidence, found, n - found + 1) >= target]
    return int(bounded[0]) if len(bounded) and bounded[0] < n else min(needed, n)


def operating_point(scores: np.ndarray, abnormal: np.ndarray, target: float = TARGET_SENSITIVITY,
                    confidence: float | None = None) -> dict:
    """The highest threshold at which calling ``score >= threshold`` abnormal finds enough of
    these held-out cells' abnormal ones: ``target`` of them, or with ``confidence`` as many
    as its Clopper-Pearson margin asks (``cells_needed``); the most specific call that
    still meets the target. Tied scores are called alike.

    Parameters
    ----------
    scores : ndarray of float, shape (n,)
        Each cell's abnormality score.
    abnormal : ndarray of bool, shape (n,)
        Whether each cell is abnormal.
    target : float
        The sensitivity to reach, in (0, 1].
    confidence : float or None
        The margin's confidence (``MARGIN_CONFIDENCE`` for a site), None for the point
        estimate.

    Returns
    -------
    dict
        ``threshold`` (0.5 when no cell is abnormal), the ``sensitivity``, ``specificity``
        (fractions) and ROC ``auc`` there, ``abnormal_cells``, ``normal_cells`` and
        ``margin_confidence``.
    """
    from sklearn.metrics import roc_auc_score

    scores, abnormal = np.asarray(scores, np.float64), np.asarray(abnormal, bool)
    positives = np.sort(scores[abnormal])[::-1]
    needed = cells_needed(len(positives), target, confidence)
    threshold = float(positives[needed - 1]) if len(positives) else 0.5
    called = scores >= threshold
    return {"threshold": threshold, "sensitivity": float(called[abnormal].mean()) if abnormal.any() else 0.0,
            "specificity": float((~called[~abnormal]).mean()) if (~abnormal).any() else 1.0,
            "auc": float(roc_auc_score(abnormal, scores)) if 0 < abnormal.sum() < len(abnormal) else 0.5,
            "abnormal_cells": int(abnormal.sum()), "normal_cells": int((~abnormal).sum()),
            "margin_confidence": confidence}


def site_threshold(scores: np.ndarray, abnormal: np.ndarray, first: np.ndarray | None = None) -> tuple[dict, dict]:
    """(the operating point a site uses for this out-of-fold score, {rule: threshold} of the
    rules ``MARGIN_RULES`` names beside it). ``first``: bool (n,), the first trained fold's
    cells (the rule "third"), None for every cell."""
    point = operating_point(scores, abnormal, confidence=MARGIN_CONFIDENCE)
    rules = {"point": operating_point(scores, abnormal)["threshold"]}
    if first is not None:
        rules["third"] = operating_point(scores[first], abnormal[first])["threshold"]
    rules.update({f"cp{c:g}": operating_point(scores, abnormal, confidence=c)["threshold"] for c in MARGIN_RULES})
    return point, {k: round(v, 6) for k, v in rules.items()}


def choose_site_score(scores: dict, abnormal: np.ndarray, held_out: np.ndarray | None = None,
                      first: np.ndarray | None = None) -> tuple[str, dict, dict]:
    """The abnormality score a site uses and its operating point, from out-of-fold scores.

    Parameters
    ----------
    scores : dict of str to ndarray of float, shape (n,)
        Each candidate score of every cell (NaN where it has none).
    abnormal : ndarray of bool, shape (n,)
        Whether each cell is abnormal.
    held_out : ndarray of bool, shape (n,), optional
        The cells every candidate scored out of fold, on which the score is chosen
        (``choose_score`` of their ``operating_point`` with the margin); None for all.
    first : ndarray of bool, shape (n,), optional
        The first trained fold's cells (``site_threshold``'s rule "third").

    Returns
    -------
    (str, dict, dict)
        The chosen score's name; ``{name: operating_point(...)}`` on the held-out cells, the
        chosen one's replaced by its ``site_threshold`` on every cell it scored; and
        ``{rule: threshold}`` of ``MARGIN_RULES`` beside it.
    """
    held_out = np.ones(len(abnormal), bool) if held_out is None else np.asarray(held_out, bool)
    points = {name: operating_point(s[held_out], abnormal[held_out], confidence=MARGIN_CONFIDENCE)
              for name, s in scores.items()}
    score = choose_score(points)
    scored = np.isfinite(scores[score])
    points[score], rules = site_threshold(scores[score][scored], abnormal[scored],
                                          None if first is None else first[scored])
    return score, points, rules


def auc_standard_error(auc: float, abnormal_cells: int, normal_cells: int) -> float:
    """Standard error of a ROC AUC from these many abnormal and normal cells (Hanley and
    McNeil 1982, Radiology 143:29, their equation 1)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (abnormal_cells - 1) * (q1 - auc * auc)
                + (normal_cells - 1) * (q2 - auc * auc)) / max(abnormal_cells * normal_cells, 1)
    return float(np.sqrt(max(variance, 0.0)))


def choose_score(points: dict) -> str:
    """The abnormality score to use, of ``{name: operating_point(...)}`` on held-out cells.

    The best ROC AUC (then the best specificity at the target sensitivity: over the few
    normal cells of a held-out fold the specificity moves in steps of one cell, where the
    AUC reads every pair); but "ensemble", the mean of the others, unless the best beats
    it by more than its standard error (the one-standard-error rule, Breiman et al. 1984):
    the best of a few scores on a third of a site's cells is partly luck, and the mean of
    scores that err differently ranks new cells more steadily.
    """
    best = max(points, key=lambda name: (round(points[name]["auc"], 3), points[name]["specificity"]))
    ensemble = points.get("ensemble")
    if ensemble and "abnormal_cells" in ensemble:
        margin = auc_standard_error(ensemble["auc"], ensemble["abnormal_cells"], ensemble["normal_cells"])
        if points[best]["auc"] - ensemble["auc"] <= margin:
            return "ensemble"
    return best


def with_ensemble(scores: dict) -> dict:
    """``scores`` and, when it holds more than one, "ensemble": their mean ("mean", itself a
    mean of two of them, left out; a score missing for a cell, NaN, left out of its mean)."""
    parts = [v for name, v in scores.items() if name not in ("mean", "ensemble")]
    return {**scores, "ensemble": np.nanmean(parts, axis=0)} if len(parts) > 1 else dict(scores)


def case_operating_point(scores: np.ndarray, abnormal: np.ndarray, groups, cell_threshold: float,
                         seed: int = 0) -> dict:
    """The threshold at which a cell supports an abnormality, chosen for the case.

    Simulated 6-cell cases of these held-out cells (``conclusion.simulate_cases``: all-normal
    ones and ones with 1 or 2 abnormal cells, each case's cells from different slide images)
    give each threshold's case sensitivity and specificity; the chosen one reaches
    ``SITE_CASE_SENSITIVITY`` at the best case specificity. Beside it: the
    per-cell sensitivity and specificity there, and the case figures the per-cell rule's
    ``cell_threshold`` would have given.
    """
    from pathmaster import conclusion

    scores, abnormal = np.asarray(scores, np.float64), np.asarray(abnormal, bool)
    simulation = conclusion.simulate_cases(scores, abnormal, groups, cases=CASES_SIMULATED, seed=seed,
                                           target_sensitivity=SITE_CASE_SENSITIVITY)
    threshold = simulation["chosen"]
    called = scores >= threshold
    by_cell = conclusion.at_threshold(simulation, cell_threshold)
    return {"threshold": threshold, "met": simulation["met"],
            "target_case_sensitivity": SITE_CASE_SENSITIVITY,
            "case_sensitivity": simulation["chosen_sensitivity"], "case_specificity": simulation["chosen_specificity"],
            "sensitivity": float(called[abnormal].mean()), "specificity": float((~called[~abnormal]).mean()),
            "cell_rule": {"threshold": float(cell_threshold), "case_sensitivity": float(by_cell[0]),
                          "case_specificity": float(by_cell[1])}}
