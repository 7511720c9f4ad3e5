"""Retrieval metrics against rankings worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from pathmaster.evaluation import crossval
from pathmaster.evaluation import metrics
from pathmaster.evaluation.report import format_report
from pathmaster.learning.folds import group_summary, stratified_folds

SUP, INT, MILD, CIS = "normal_superficial", "normal_intermediate", "mild_dysplasia", "carcinoma_in_situ"


def test_average_precision_of_hand_made_rankings():
    rel = np.array([[True, False, True, False], [False, False, False, False], [False, True, False, False]])
    np.testing.assert_allclose(metrics.average_precisions(rel), [(1 + 2 / 3) / 2, 0.0, 0.5])


def test_majority_vote_breaks_ties_by_rank():
    assert crossval.majority_vote(["a", "b", "b", "a", "c"]) == "a"
    assert crossval.majority_vote(["c", "b", "b", "a", "a"]) == "b"


def test_score_rankings_by_hand():
    queries = [SUP, MILD, CIS]
    ranked = np.array([
        [SUP, SUP, INT, SUP, MILD],    # top1 yes, 3/5, majority SUP; binary: 4 normal -> normal (right)
        [CIS, MILD, MILD, CIS, MILD],  # top1 no, 3/5, majority MILD; binary abnormal (right)
        [INT, INT, SUP, CIS, CIS],     # top1 no, 2/5, majority INT; binary normal (wrong)
    ], dtype=object)
    m = metrics.score_rankings(queries, ranked, np.array([1.0, 0.5, 0.25]))
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
    assert {k: m["per_class"][MILD][k] for k in ("n", "top1", "majority_at_5")} == {"n": 1, "top1": 0.0, "majority_at_5": 1.0}
    # every metric has an interval around it; one query of a class says little about it
    for key in ("top1", "precision_at_5", "majority_at_5", "map", "binary_accuracy"):
        low, high = m["ci"][key]
        assert low - 1e-9 <= m[key] <= high + 1e-9
    low, high = m["per_class"][MILD]["recall_ci"]
    assert high == 1.0 and low < 0.3


def test_leave_one_out_on_separated_and_on_random_labels():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (50, 4)), rng.normal(20, 1, (50, 4))])
    y = np.array([SUP] * 50 + [CIS] * 50)
    m = crossval.leave_one_out(X, y)
    assert m["top1"] == 1.0 and m["map"] == pytest.approx(1.0) and m["binary_accuracy"] == 1.0
    shuffled = crossval.leave_one_out(X, rng.permutation(y))
    assert 0.2 < shuffled["top1"] < 0.8
    assert 0.3 < shuffled["map"] < 0.7


def test_leave_one_out_never_returns_the_query_itself():
    # each cell's twin sits at distance 0; a query that found itself would always "win"
    X = np.repeat(np.arange(10, dtype=float)[:, None], 2, axis=0)
    y = np.array([f"c{i // 2}" if i % 4 < 2 else f"d{i}" for i in range(20)], dtype=object)
    m = crossval.leave_one_out(X, y, k=1)
    assert m["top1"] == pytest.approx(0.5)
    assert m["binary_accuracy"] is None  # labels outside the Herlev vocabulary


def test_format_report_lists_metrics_and_confusion():
    X = np.vstack([np.zeros((6, 2)), np.ones((6, 2)) * 9])
    text = format_report(crossval.leave_one_out(X, [SUP] * 6 + [CIS] * 6))
    assert "top1             1.000" in text and "carcinoma_in_situ" in text


def test_wilson_interval_matches_its_formula():
    z = 1.959963984540054
    for successes, n in ((50, 100), (3, 40), (0, 12), (917, 917)):
        p = successes / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        np.testing.assert_allclose(metrics.wilson_interval(successes, n), [centre - half, centre + half], atol=1e-9)


def test_bootstrap_interval_is_seeded_and_covers_the_mean():
    values = np.random.default_rng(1).random(200)
    a = metrics.bootstrap_interval(values, seed=3)
    assert a == metrics.bootstrap_interval(values, seed=3)
    assert a[0] < values.mean() < a[1]
    # standard error of a uniform mean ~ 0.29 / sqrt(200) = 0.02: a 95% interval ~ +-0.04
    assert 0.05 < a[1] - a[0] < 0.11


def _two_clusters(rng, n=40, d=4, gap=20.0):
    X = np.vstack([rng.normal(0, 1, (n, d)), rng.normal(gap, 1, (n, d))])
    return X, np.array([SUP] * n + [CIS] * n, dtype=object)


def _zscores(X_train, y_train):
    mean, std = X_train.mean(axis=0), X_train.std(axis=0)
    return lambda X: (X - mean) / std


def test_stratified_folds_partition_the_cells_evenly_and_are_reproducible():
    labels = np.array([SUP] * 30 + [MILD] * 20 + [CIS] * 10, dtype=object)
    folds = stratified_folds(labels, 5, seed=7)
    tests = np.concatenate([test for _, test in folds])
    assert sorted(tests.tolist()) == list(range(60))
    for train, test in folds:
        assert not set(train) & set(test) and len(train) + len(test) == 60
        assert (labels[test] == CIS).sum() == 2 and (labels[test] == SUP).sum() == 6
    again = stratified_folds(labels, 5, seed=7)
    assert all((a[1] == b[1]).all() for a, b in zip(folds, again))
    other = stratified_folds(labels, 5, seed=8)
    assert any((a[1] != b[1]).any() for a, b in zip(folds, other))
    # a tiny site: 2 cells per class cannot make 5 stratified folds
    assert len(stratified_folds([SUP, SUP, CIS, CIS], 5)) == 2


def test_cross_validate_queries_each_cell_once_and_fits_on_training_cells_only():
    rng = np.random.default_rng(0)
    X, y = _two_clusters(rng)
    seen = []

    def fit(X_train, y_train):
        seen.append({tuple(row) for row in X_train})
        return _zscores(X_train, y_train)

    m = crossval.cross_validate(X, y, fit, folds=4, seed=1)
    assert m["queries"] == 80 and m["folds"] == 4 and len(seen) == 4
    assert sum(map(sum, m["confusion"]["matrix"])) == 80
    for rows, (_, test) in zip(seen, stratified_folds(y, 4, seed=1)):
        assert not rows & {tuple(row) for row in X[test]}  # no query among the cells fitted to
    assert m["top1"] == 1.0 and m["binary_accuracy"] == 1.0
    for name, ceiling in m["ceilings"].items():
        assert ceiling["accuracy"] == 1.0, name
    assert sum(f["queries"] for f in m["per_fold"]) == 80
    assert crossval.cross_validate(X, y, fit, folds=4, seed=1, ceilings=())["top1"] == 1.0


def test_cross_validation_does_not_flatter_a_feature_choice_tuned_on_noise():
    # 60 noise features, random labels: forward selection fitted on every cell finds
    # features that "retrieve" the labels of those very cells; refitted per fold it cannot.
    from pathmaster.learning import similarity

    rng = np.random.default_rng(5)
    X = rng.normal(size=(120, 60))
    y = np.array([SUP, CIS] * 60, dtype=object)
    names = [f"f{i}" for i in range(60)]
    normalization, projection = similarity.fit_similarity(X, y, names, "forward")
    leaky = crossval.leave_one_out(projection.apply(normalization.apply(X)), y)
    honest = crossval.cross_validate(X, y, crossval.site_similarity_fit(names, "forward"), folds=5, seed=0, ceilings=())
    assert leaky["precision_at_5"] > 0.6
    assert abs(honest["precision_at_5"] - 0.5) < 0.08
    assert honest["precision_at_5"] < leaky["precision_at_5"] - 0.1


def test_format_report_shows_intervals_recall_and_ceilings():
    rng = np.random.default_rng(2)
    X, y = _two_clusters(rng, n=15)
    text = format_report(crossval.cross_validate(X, y, _zscores, folds=3))
    assert "3-fold stratified cross-validation, split by cell, seed 0" in text
    assert "recall per class" in text and "logistic_regression" in text and "knn_tuned" in text
    assert "sensitivity" in text and "ROC AUC" in text and "split by cell" in text
    assert "top1             1.000  [" in text


def test_real_herlev_cells_retrieve_their_diagnosis_far_better_than_shuffled_labels(herlev_40px, tmp_path):
    import shutil

    from pathmaster.importers import iter_dataset
    from pathmaster.records import CellRecord
    from pathmaster.learning.similarity import fit_normalization
    from pathmaster.analysis.cell import analyse_cell

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
    real = crossval.leave_one_out(Z, labels)
    rng = np.random.default_rng(0)
    shuffled = [crossval.leave_one_out(Z, rng.permutation(labels)) for _ in range(5)]
    assert real["binary_accuracy"] > max(s["binary_accuracy"] for s in shuffled) + 0.15
    assert real["precision_at_5"] > max(s["precision_at_5"] for s in shuffled) + 0.1


def test_folds_never_split_a_slide_image_and_say_when_there_are_none():
    rng = np.random.default_rng(3)
    labels = np.array([SUP, MILD, CIS] * 40, dtype=object)
    groups = np.array([f"image-{i // 4}" for i in range(120)], dtype=object)
    groups[:6] = None  # cells without a recorded image: each an image of its own
    for train, test in stratified_folds(labels, 5, seed=2, groups=groups):
        assert not ({g for g in groups[train] if g} & {g for g in groups[test] if g})
    assert group_summary(groups, 120)["cells_without"] == 6
    assert group_summary(None, 10)["known"] is False and group_summary(None, 10)["note"]
    # two images only: at most two folds
    assert len(stratified_folds(labels[:8], 5, groups=["a"] * 4 + ["b"] * 4)) == 2
    X = rng.normal(size=(120, 3))
    m = crossval.cross_validate(X, labels, _zscores, groups=groups, folds=4, ceilings=(), cases=20)
    assert m["groups"]["known"] and m["groups"]["groups"] == 29


def test_binary_figures_count_what_calls_find_and_clear():
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    positive = np.array([0, 0, 1, 0, 1, 1, 1, 1, 1, 1], dtype=bool)
    figures = metrics.binary_figures(positive, scores >= 0.5)
    assert (figures["sensitivity"], figures["specificity"], figures["missed"]) == (6 / 7, 1.0, 1)
    assert figures["sensitivity_ci"][0] < 6 / 7 < figures["sensitivity_ci"][1]
    assert metrics.counted_figures(6, 7, 3, 3).items() <= figures.items()  # cells and simulated cases alike
    assert metrics.counted_figures(0, 0, 2, 4)["sensitivity"] is None and metrics.counted_figures(0, 0, 2, 4)["false_alarms"] == 2


def test_each_training_folds_operating_point_is_the_sites_rule_on_its_cells():
    from pathmaster.learning import thresholds

    rng = np.random.default_rng(4)
    X = np.vstack([rng.normal(0, 1, (40, 3)), rng.normal(1.5, 1, (40, 3))])
    y = np.array([SUP] * 20 + [INT] * 20 + [MILD] * 20 + [CIS] * 20, dtype=object)
    chosen, rule = [], thresholds.operating_point

    def spy(scores, abnormal, target=thresholds.TARGET_SENSITIVITY, confidence=None):
        chosen.append((target, confidence))
        return rule(scores, abnormal, target, confidence)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(crossval, "operating_point", spy)
        m = crossval.cross_validate(X, y, _zscores, folds=4, seed=0, cases=20, ceilings=(), target_sensitivity=0.9)
    assert chosen == [(0.9, None)] * 4  # the point estimate, no margin, at the target asked for
    assert m["abnormal"]["operating_point"]["target_sensitivity"] == 0.9


def test_the_abnormality_score_is_the_one_the_case_conclusion_reads():
    from pathmaster.conclusion import abnormal_share

    flags = np.array([[True, False, True, False, False], [False] * 5, [True] * 5])
    distances = np.array([[0.5, 1.0, 2.0, 3.0, 4.0], [1.0] * 5, [0.0, 1, 2, 3, 4]])
    terms = [["HSIL" if f else "NILM" for f in row] for row in flags]
    expected = [abnormal_share(t, d, metrics.WEIGHTING) for t, d in zip(terms, distances)]
    np.testing.assert_allclose(metrics.abnormality_scores(flags, distances), expected)
    scores = metrics.abnormality_scores(flags, distances)
    assert scores[1] == 0.0 and scores[2] == 1.0
    # nearer abnormal matches count more than farther ones
    near, far = metrics.abnormality_scores([[True, False, False], [False, False, True]], [[1.0, 2, 3]] * 2)
    assert near > 1 / 3 > far


def test_the_auc_by_ranks_is_scikit_learns_on_every_resample_at_once():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(5)
    positive = rng.random((40, 25)) < 0.3
    scores = np.round(rng.random((40, 25)) + 0.4 * positive, 1)  # rounded: many ties
    positive[0] = False  # a resample without a positive cell has no AUC
    got = metrics.auc_by_ranks(positive, scores)
    assert np.isnan(got[0])
    want = [roc_auc_score(p, s) for p, s in zip(positive[1:], scores[1:])]
    np.testing.assert_allclose(got[1:], want, rtol=0, atol=1e-12)
    np.testing.assert_allclose(metrics.auc_by_ranks(positive.T, scores.T, axis=0)[1:], want, rtol=0, atol=1e-12)


def test_abnormal_figures_roc_and_a_ceiling_at_least_the_retrieval():
    rng = np.random.default_rng(4)
    X = np.vstack([rng.normal(0, 1, (60, 3)), rng.normal(1.5, 1, (60, 3))])
    y = np.array([SUP] * 30 + [INT] * 30 + [MILD] * 30 + [CIS] * 30, dtype=object)
    m = crossval.cross_validate(X, y, _zscores, folds=5, seed=0, cases=50, groups=[f"g{i // 3}" for i in range(120)])
    point = m["abnormal"]["operating_point"]
    assert point["positives"] == 60 and point["negatives"] == 60 and len(point["thresholds"]) == 5
    assert 0.75 < m["abnormal"]["roc"]["auc"] <= 1.0
    low, high = m["abnormal"]["roc"]["auc_ci"]
    assert low <= m["abnormal"]["roc"]["auc"] <= high
    assert m["cases"]["cases"] == 500 and m["cases"]["abnormal_cases"] == 250
    assert len(m["cases"]["thresholds"]) == 5 and 0.5 < m["cases"]["sensitivity"] <= 1.0
    assert m["ceilings"]["knn_tuned"]["binary_accuracy"] >= m["binary_accuracy"] - 0.05
    assert {c["k"] for c in m["ceilings"]["knn_tuned"]["choices"]} <= set(crossval.KNN_CHOICES)
    # labels with no normal side: no abnormal figures, said so
    only = crossval.cross_validate(X, np.array([MILD, CIS] * 60, dtype=object), _zscores, folds=3, ceilings=())
    assert only["abnormal"] is None and only["cases"] is None


def test_the_site_score_is_reported_at_each_folds_own_operating_point_beside_the_match_share():
    rng = np.random.default_rng(5)
    X = np.vstack([rng.normal(0, 1, (40, 3)), rng.normal(1.5, 1, (40, 3))])
    y = np.array([SUP] * 20 + [INT] * 20 + [MILD] * 20 + [CIS] * 20, dtype=object)
    truth = np.isin(y, [MILD, CIS])
    seen = []

    def site_score(train, test):
        # a score that ranks the test cells perfectly, with a threshold that misses one abnormal
        seen.append((set(train.tolist()), set(test.tolist())))
        scores = np.where(truth[test], 0.6, 0.1)
        scores[np.flatnonzero(truth[test])[:1]] = 0.3
        return {"score": "classifier", "threshold": 0.5, "scores": scores}

    m = crossval.cross_validate(X, y, _zscores, folds=4, seed=0, cases=40, ceilings=(), site_score=site_score)
    assert all(not (train & test) for train, test in seen) and len(seen) == 4
    site = m["site_score"]
    assert site["score"] == "classifier" and m["abnormal"]["name"] == "match_share"
    point = site["operating_point"]
    assert point["missed"] == 4 and point["false_alarms"] == 0 and point["thresholds"] == [0.5] * 4
    assert [fold["sensitivity"] for fold in site["per_fold"]] == [0.9] * 4
    assert site["roc"]["auc"] == 1.0  # a ranking figure: the misses come from the threshold
    assert site["cases"]["specificity"] == 1.0 and 0.5 < site["cases"]["sensitivity"] < 1.0
    report = format_report(m)
    assert "the site's own abnormality score (classifier)" in report and "match share" in report
    assert "found 36 of 40 abnormal cells" in report
    assert crossval.cross_validate(X, y, _zscores, folds=4, seed=0, cases=40, ceilings=())["site_score"] is None
