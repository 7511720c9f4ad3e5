"""Folds split by slide image: cells of one image share stain, focus and patient, so they
are never on both sides of a split.

``stratified_folds`` the outer folds of an evaluation (scikit-learn's StratifiedGroupKFold,
diagnoses stratified); ``inner_folds`` the folds a site learns on, inside its own cells;
``group_codes`` a group label per cell as integers; ``group_summary`` what the groups were.
"""

from __future__ import annotations

import numpy as np


# Inner folds of the site's cross-validation (each fits a lens and a head on the others).
INNER_FOLDS = 3


def inner_folds(labels: np.ndarray, groups, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index pairs: stratified, and grouped when the cells have groups (cells of
    one slide image never on both sides)."""
    import warnings

    from sklearn.model_selection import KFold, StratifiedGroupKFold, StratifiedKFold

    n_splits = INNER_FOLDS
    if max(np.unique(labels, return_counts=True)[1]) < n_splits:  # no diagnosis to spread over the folds
        return list(KFold(n_splits, shuffle=True, random_state=seed).split(labels))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        if groups is not None and len(set(groups)) >= n_splits:
            return list(StratifiedGroupKFold(n_splits, shuffle=True, random_state=seed).split(labels, labels, groups))
        return list(StratifiedKFold(n_splits, shuffle=True, random_state=seed).split(labels, labels))


def stratified_folds(labels, folds: int = 5, seed: int = 0, groups=None) -> list[tuple[np.ndarray, np.ndarray]]:
    """Seeded stratified k-fold split: a list of (train, test) int64 index arrays.

    Every cell is in exactly one test fold and each class is spread over the folds as
    evenly as the groups allow. ``groups`` (n cells; None or a None entry: unknown) are the
    slide images the cells come from: cells of one group are never on both sides of a split
    (scikit-learn's StratifiedGroupKFold; a cell without a group is a group of its own),
    without groups scikit-learn's StratifiedKFold, both shuffled with ``seed``. ``folds`` is
    lowered to the size of the largest class (and to the number of groups) when that is
    smaller (a tiny site), but never below 2.
    """
    import warnings

    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    labels = np.asarray(labels, dtype=object)
    _, codes, counts = np.unique(labels.astype(str), return_inverse=True, return_counts=True)
    folds = max(2, min(int(folds), int(counts.max())))
    codes_of_groups = group_codes(groups, len(labels))
    if codes_of_groups is not None:
        folds = max(2, min(folds, len(np.unique(codes_of_groups))))
    if len(labels) < folds:
        raise ValueError(f"{folds}-fold cross-validation needs at least {folds} labelled cells, got {len(labels)}")
    with warnings.catch_warnings():
        # a class with fewer cells than folds is simply missing from some test folds
        warnings.filterwarnings("ignore", message=".*least populated class.*", category=UserWarning)
        if codes_of_groups is None:
            splits = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed).split(np.zeros(len(labels)), codes)
        else:
            splits = StratifiedGroupKFold(n_splits=folds, shuffle=True, random_state=seed).split(
                np.zeros(len(labels)), codes, codes_of_groups)
        return [(train.astype(np.int64), test.astype(np.int64)) for train, test in splits]


def group_codes(groups, n: int) -> np.ndarray | None:
    """int64 (n,) group numbers, a cell without a group alone in its own; None when no cell has one."""
    if groups is None:
        return None
    groups = list(groups)
    if len(groups) != n:
        raise ValueError(f"{len(groups)} groups for {n} cells")
    if all(g is None for g in groups):
        return None
    names = [("group", g) if g is not None else ("cell", i) for i, g in enumerate(groups)]
    index = {name: number for number, name in enumerate(dict.fromkeys(names))}
    return np.array([index[name] for name in names], dtype=np.int64)


def group_summary(groups, n: int) -> dict:
    """What a site says about the slide images of its cells: ``known`` (any group), ``groups``
    (distinct), ``cells_without`` a group, and ``note`` in words when folds cannot honour them."""
    groups = [None] * n if groups is None else list(groups)
    known = [g for g in groups if g is not None]
    summary = {"known": bool(known), "groups": len(set(known)), "cells_without": n - len(known), "note": None}
    if not known:
        summary["note"] = ("this site records no slide image for its cells: folds split cells, and cells of one "
                           "image on both sides of a split (same stain, focus, patient) make every figure look better")
    elif summary["cells_without"]:
        summary["note"] = (f"{summary['cells_without']} of {n} cells have no recorded slide image; "
                           "each is treated as an image of its own")
    return summary
