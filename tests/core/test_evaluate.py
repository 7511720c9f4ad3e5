"""Retrieval metrics against rankings worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pathmaster import evaluate as ev

SUP, INT, MILD, CIS = "normal_superficial", "normal_intermediate", "mild_dysplasia", "carcinoma_in_situ"


def test_average_precision_of_hand_made_rankings():
    rel = np.array([[True, False, True, False], [False, False, False, False], [False, True, False, False]])
    np.testing.assert_allclose(ev.average_precisions(rel), [(1 + 2 / 3) / 2, 0.0, 0.5])


def test_majority_vote_breaks_ties_by_rank():
    assert ev.majority_vote(["a", "b", "b", "a", "c"]) == "a"
    assert ev.majority_vote(["c", "b", "b", "a", "a"]) == "b"


def test_score_rankings_by_hand():
    queries = [SUP, MILD, CIS]
    ranked = np.array([
        [SUP, SUP, INT, SUP, MILD],    # top1 yes, 3/5, majority SUP; binary: 4 normal -> normal (right)
        [CIS, MILD, MILD, CIS, MILD],  # top1 no, 3/5, majority MILD; binary abnormal (right)
        [INT, INT, SUP, CIS, CIS],     # top1 no, 2/5, majority INT; binary normal (wrong)
    ], dtype=object)
    m = ev.score_rankings(queries, ranked, np.array([1.0, 0.5, 0.25]))
    assert m["top1"] == pytest.approx(1 / 3)
    assert m["precision_at_5"] == pytest.approx((3 + 3 + 2) / 15)
    assert m["majority_at_5"] == pytest.approx(2 / 3)
    assert m["binary_accuracy"] == pytest.approx(2 / 3)
    assert m["map"] == pytest.approx(0.5833333)
    confusion = dict(zip(m["confusion"]["labels"], m["confusion"]["matrix"]))
    labels = m["confusion"]["labels"]
    assert labels == [SUP, INT, MILD, CIS]  # severity order
    assert confusion[CIS][labels.index(INT)] == 1
    assert sum(map(sum, m["confusion"]["matrix"])) == 3
    assert m["per_class"][MILD] == {"n": 1, "top1": 0.0, "majority_at_5": 1.0}


def test_leave_one_out_on_separated_and_on_random_labels():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (50, 4)), rng.normal(20, 1, (50, 4))])
    y = np.array([SUP] * 50 + [CIS] * 50)
    m = ev.leave_one_out(X, y)
    assert m["top1"] == 1.0 and m["map"] == pytest.approx(1.0) and m["binary_accuracy"] == 1.0
    shuffled = ev.leave_one_out(X, rng.permutation(y))
    assert 0.2 < shuffled["top1"] < 0.8
    assert 0.3 < shuffled["map"] < 0.7


def test_leave_one_out_never_returns_the_query_itself():
    # each cell's twin sits at distance 0; a query that found itself would always "win"
    X = np.repeat(np.arange(10, dtype=float)[:, None], 2, axis=0)
    y = np.array([f"c{i // 2}" if i % 4 < 2 else f"d{i}" for i in range(20)], dtype=object)
    m = ev.leave_one_out(X, y, k=1)
    assert m["top1"] == pytest.approx(0.5)
    assert m["binary_accuracy"] is None  # labels outside the Herlev vocabulary


def test_format_report_lists_metrics_and_confusion():
    X = np.vstack([np.zeros((6, 2)), np.ones((6, 2)) * 9])
    text = ev.format_report(ev.leave_one_out(X, [SUP] * 6 + [CIS] * 6))
    assert "top1             1.000" in text and "carcinoma_in_situ" in text


def test_real_herlev_cells_retrieve_their_diagnosis_far_better_than_shuffled_labels(herlev_40px, tmp_path):
    import shutil

    from pathmaster.importers import iter_dataset
    from pathmaster.records import CellRecord
    from pathmaster.similarity import fit_normalization
    from pathmaster.site import analyse_cell

    # 15 real cells per class, copied in Herlev's own layout (image + colour-coded mask)
    for folder in sorted(p for p in herlev_40px.iterdir() if p.is_dir()):
        (tmp_path / folder.name).mkdir()
        for image in sorted(folder.glob("*.BMP"))[:15]:
            shutil.copy(image, tmp_path / folder.name)
            shutil.copy(image.with_name(f"{image.stem}-d.bmp"), tmp_path / folder.name)
    records = [r for r in iter_dataset(tmp_path) if isinstance(r, CellRecord)]
    assert len(records) == 105 and len({r.diagnosis for r in records}) == 7
    X = np.vstack([analyse_cell(r.image, r.background, r.mask).features for r in records])
    labels = np.array([r.diagnosis for r in records], dtype=object)
    Z = fit_normalization(X).apply(X)
    real = ev.leave_one_out(Z, labels)
    rng = np.random.default_rng(0)
    shuffled = [ev.leave_one_out(Z, rng.permutation(labels)) for _ in range(5)]
    assert real["binary_accuracy"] > max(s["binary_accuracy"] for s in shuffled) + 0.15
    assert real["precision_at_5"] > max(s["precision_at_5"] for s in shuffled) + 0.1
