"""The site's feature classifier: NumPy inference equals scikit-learn's, its strength is
chosen by held-out folds, and the score that needs it refuses to run without features."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression

from pathmaster.learning import abnormality
from pathmaster.learning.policy import LearntSimilarity


def _cells(seed=0, n=60):
    rng = np.random.default_rng(seed)
    labels = np.array(["normal_a", "normal_b", "mild", "severe"] * (n // 4))
    centre = {"normal_a": 0.0, "normal_b": 0.5, "mild": 1.5, "severe": 2.5}
    Z = rng.normal(size=(n, 6))
    Z[:, 1] += [centre[label] for label in labels]
    return Z, labels


def test_numpy_probabilities_equal_scikit_learns_and_survive_a_round_trip():
    Z, labels = _cells()
    fitted = abnormality.fit_classifier(Z, labels, {"mild", "severe"}, [0, 1, 3], strength=0.3)
    reference = LogisticRegression(C=0.3, max_iter=5000).fit(Z[:, [0, 1, 3]], labels)
    expected = reference.predict_proba(Z[:, [0, 1, 3]])[:, np.isin(reference.classes_, ["mild", "severe"])].sum(1)
    np.testing.assert_allclose(fitted.abnormal_probability(Z), expected, atol=1e-9)
    again = abnormality.FeatureClassifier.from_dict(fitted.to_dict())
    np.testing.assert_array_equal(again.abnormal_probability(Z), fitted.abnormal_probability(Z))


def test_two_labels_keep_one_probability_per_label():
    Z, labels = _cells()
    binary = np.where(np.isin(labels, ["mild", "severe"]), "abnormal", "normal")
    fitted = abnormality.fit_classifier(Z, binary, {"abnormal"}, range(6), strength=1.0)
    reference = LogisticRegression(C=1.0, max_iter=5000).fit(Z, binary)
    np.testing.assert_allclose(fitted.abnormal_probability(Z), reference.predict_proba(Z)[:, 0], atol=1e-9)
    assert fitted.coef.shape == (2, 6)


def test_the_strength_is_the_one_held_out_cells_rank_best():
    Z, labels = _cells(seed=1, n=80)
    folds = [(np.arange(80)[np.arange(80) % 4 != f], np.arange(80)[np.arange(80) % 4 == f]) for f in range(4)]
    strength, scores, aucs = abnormality.choose_strength(Z, labels, {"mild", "severe"}, range(6), folds)
    assert strength in abnormality.STRENGTHS and aucs[str(strength)] == max(aucs.values())
    abnormal = np.isin(labels, ["mild", "severe"])
    assert scores[abnormal].mean() > scores[~abnormal].mean()


def test_the_classifier_score_needs_the_cells_features():
    fitting = LearntSimilarity(score="classifier", threshold=0.4)
    assert fitting.abnormal_score(None, 0.2, 0.7) == 0.7
    with pytest.raises(ValueError):
        fitting.abnormal_score(None, 0.2, None)
    assert not fitting.needs_embedding


def test_a_large_site_learns_from_a_seeded_sample_of_its_labelled_cells(monkeypatch):
    from pathmaster.site import fitting

    monkeypatch.setattr(fitting, "MAX_SCORED_CELLS", 50)
    labelled = np.arange(200) % 4 != 0  # 150 labelled cells
    sample = fitting.scored_cells(labelled, seed=3)
    assert sample.sum() == 50 and not (sample & ~labelled).any()
    np.testing.assert_array_equal(sample, fitting.scored_cells(labelled, seed=3))
    small = np.arange(40) % 2 == 0
    np.testing.assert_array_equal(fitting.scored_cells(small, seed=3), small)


def test_the_ensemble_is_the_mean_of_the_scores_the_site_has():
    fitting = LearntSimilarity(score="ensemble", model="abc", classifier={"columns": []})
    assert fitting.abnormal_score(0.9, 0.3, 0.6) == pytest.approx(0.6)
    assert fitting.needs_embedding
    with pytest.raises(ValueError):
        fitting.abnormal_score(None, 0.3, 0.6)
    features_alone = LearntSimilarity(score="ensemble", classifier={"columns": []})
    assert features_alone.abnormal_score(None, 0.2, 0.6) == pytest.approx(0.4)


def test_the_ensemble_is_kept_unless_a_single_score_beats_it_by_more_than_its_standard_error():
    from pathmaster.learning import thresholds

    def point(auc, n=40):
        return {"auc": auc, "specificity": 0.5, "abnormal_cells": n, "normal_cells": n}

    se = thresholds.auc_standard_error(0.85, 40, 40)
    assert 0.02 < se < 0.08  # Hanley-McNeil at 40 + 40 cells
    assert thresholds.choose_score({"network": point(0.85 + se / 2), "ensemble": point(0.85)}) == "ensemble"
    assert thresholds.choose_score({"network": point(0.85 + 2 * se), "ensemble": point(0.85)}) == "network"
    assert thresholds.choose_score({"network": point(0.7), "neighbours": point(0.8)}) == "neighbours"
    merged = thresholds.with_ensemble({"a": np.array([0.0, 1.0]), "b": np.array([1.0, 1.0]), "mean": np.zeros(2)})
    np.testing.assert_array_equal(merged["ensemble"], [0.5, 1.0])
