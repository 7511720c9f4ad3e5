"""A site's learnt similarity: the network in NumPy and JAX, learning at index time, fallbacks."""

from __future__ import annotations

import numpy as np
import pytest

from pathmaster import embedding as emb
from pathmaster.ingest import ingest
from pathmaster.records import DIAGNOSES, InvalidInput
from pathmaster.site import SiteIndex, build_search_index
from pathmaster.sitedb import SiteDB
from pathmaster.synth import cell_rng, synth_cell

jax = pytest.importorskip("jax", reason="the trainer (extra [learn]) is not installed")
learn = pytest.importorskip("pathmaster.learn")

# Tiny budgets: these tests check the plumbing and the rules, not what a network learns.
TINY = {"seconds": 0.5, "max_epochs": 2, "min_epochs": 1}


def records(n, seed=11, classes=DIAGNOSES):
    return [synth_cell(classes[i % len(classes)], cell_rng(seed, i), source_id=f"synth/{seed}/{i}")
            for i in range(n)]


def random_patches(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n, emb.PATCH_PX, emb.PATCH_PX, 3)).astype(np.uint8)


def test_numpy_inference_equals_the_jax_forward_pass_on_the_same_weights():
    params = learn.init_params(3, 4)
    x = random_patches(5).astype(np.float32) / 200.0
    e_np, logits_np = emb.forward(params, x)
    e_jax, logits_jax = emb.forward({k: jax.numpy.asarray(v) for k, v in params.items()}, x, jax.numpy)
    np.testing.assert_allclose(e_np, np.asarray(e_jax), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(logits_np, np.asarray(logits_jax), rtol=1e-4, atol=1e-4)
    assert np.abs(e_np).max() > 0  # a pass that computed something


def test_the_embedding_is_the_same_for_every_rotation_and_flip():
    model = emb.Embedder(learn.init_params(1, 3), ["a", "b", "c"], np.array([False, True, True]))
    patch = random_patches(1, seed=4)
    turned = np.rot90(patch[:, :, ::-1], 1, axes=(1, 2))
    np.testing.assert_allclose(model.embed(patch), model.embed(turned), rtol=1e-4, atol=1e-5)
    assert not np.allclose(model.embed(patch), model.embed(random_patches(1, seed=5)))


def test_weights_round_trip_by_content_hash_and_junk_is_refused(tmp_path):
    model = emb.Embedder(learn.init_params(2, 3), ["a", "b", "c"], np.array([False, True, True]))
    path = model.save(tmp_path)
    again = emb.Embedder.from_bytes(path.read_bytes())
    assert again.sha256 == model.sha256 and path.name == f"embedding-{model.sha256[:16]}.npz"
    assert again.labels == model.labels and list(again.abnormal) == [False, True, True]
    with pytest.raises(ValueError, match="not a PathMaster embedding"):
        emb.Embedder.from_bytes(b"PK\x03\x04 not an npz")


def test_the_same_cells_learn_the_same_network_and_a_cut_plan_is_reported():
    patches, labels = random_patches(64, seed=7), ["a", "b"] * 32
    first, report = learn.train_embedder(patches, labels, {"b"}, seconds=600, max_epochs=2, min_epochs=1)
    again, _ = learn.train_embedder(patches, labels, {"b"}, seconds=600, max_epochs=2, min_epochs=1)
    assert report["epochs"] == report["planned_epochs"] == 2 and not report["cut_by_time"]
    assert first.sha256 == again.sha256
    _, cut = learn.train_embedder(patches, labels, {"b"}, seconds=0, max_epochs=4, min_epochs=1)
    assert cut["planned_epochs"] == 4 and cut["epochs"] < 4 and cut["cut_by_time"]


def test_training_lowers_the_loss_on_separable_patches():
    patches = np.concatenate([np.full((32, emb.PATCH_PX, emb.PATCH_PX, 3), 60, np.uint8),
                              np.full((32, emb.PATCH_PX, emb.PATCH_PX, 3), 220, np.uint8)])
    labels = ["dark"] * 32 + ["light"] * 32
    model, report = learn.train_embedder(patches, labels, {"dark"}, seconds=5, max_epochs=15, min_epochs=15)
    assert report["epochs"] == 15
    p = model.abnormal_probability(model.embed(patches[[0, -1]]))
    assert p[0] > 0.5 > p[1]


def test_operating_point_reaches_the_target_sensitivity():
    scores = np.array([0.9, 0.8, 0.7, 0.6, 0.4, 0.3, 0.2, 0.1, 0.05, 0.5])
    abnormal = np.array([True, True, True, True, True, False, False, False, False, True])
    point = learn.operating_point(scores, abnormal, target=0.8)
    assert point["sensitivity"] >= 0.8 and point["threshold"] == pytest.approx(0.5)
    assert point["specificity"] == 1.0


def test_a_small_site_compares_its_features_alone_and_says_why(tmp_path):
    ingest("synthetic", tmp_path, records=records(21))
    site = SiteIndex.open(tmp_path)
    assert site.learnt.mode == "features" and site.embedder is None
    assert "too few labelled cells" in site.similarity_note()
    cell = records(21)[3]
    analysis = site.analyse(cell.image, cell.background, cell.mask)
    matches = site.search(analysis.features, k=3)
    [score] = site.abnormality(None, [matches], analysis.features[None])
    assert 0.0 <= score <= 1.0


def test_folds_of_a_site_whose_diagnoses_have_a_cell_or_two_each():
    labels = np.array(["a", "b", "c", "d", "d", "e", "f"])
    folds = learn.inner_folds(labels, None, seed=0)
    assert len(folds) == learn.INNER_FOLDS
    assert sorted(np.concatenate([test for _, test in folds]).tolist()) == list(range(len(labels)))


def test_the_features_refitted_on_a_fold_read_every_feature_when_the_site_selects_some():
    from pathmaster import similarity
    from pathmaster.learnt import _refit

    rng = np.random.default_rng(0)
    labels = np.array(["a", "b"] * 20)
    Z = rng.normal(size=(40, 6)) + (labels == "b")[:, None] * np.array([2.0, 0, 0, 0, 0, 0])
    names = [f"f{i}" for i in range(6)]
    selected = similarity.forward_select(Z, labels, names)
    assert 0 < len(selected.columns) < 6
    train_vectors, vectors = _refit(selected, Z, labels, names, seed=0)(np.arange(30))
    assert len(train_vectors) == 30 and len(vectors) == 40


def test_labels_without_an_abnormal_one_fall_back_to_features():
    many = learn.MIN_CELLS_TO_LEARN
    reason = learn.cannot_learn(["normal_superficiel"] * many + ["normal_columnar"] * many, {"light_dysplastic"})
    assert "no labelled cell is abnormal" in reason
    assert learn.cannot_learn(["a"] * many + ["b"], {"b"}) == "fewer than two diagnoses with two cells each"
    assert "too few labelled cells" in learn.cannot_learn(["a", "b"] * (many // 2 - 1), {"b"})
    assert learn.cannot_learn(["a", "b"] * many, {"b"}) == ""


@pytest.fixture(scope="module")
def learnt_site(tmp_path_factory, monkeypatch_module):
    """A 70-cell synthetic site (one class with a single cell) that learns, fused forced."""
    monkeypatch_module.setattr(learn, "train_embedder", _tiny(learn.train_embedder))
    monkeypatch_module.setattr(learn, "MIN_CELLS_TO_LEARN", 60)
    path = tmp_path_factory.mktemp("learnt")
    cells = records(69) + [synth_cell("carcinoma_in_situ", cell_rng(99, 0), source_id="synth/single")]
    cells = [c for c in cells if c.diagnosis != "carcinoma_in_situ"] + cells[-1:]
    ingest("synthetic", path, records=cells, build_index=False)
    with SiteDB(path) as db:
        build_search_index(db, features="lda", similarity_choice="fused", learn_seconds=2)
    return path, cells


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def _tiny(train):
    def tiny(*args, **kwargs):
        kwargs.update(TINY)
        return train(*args, **kwargs)
    return tiny


def test_a_learnt_site_searches_fused_vectors_and_scores_cells(learnt_site):
    path, cells = learnt_site
    site = SiteIndex.open(path)
    assert site.learnt.mode == "fused" and site.embedder is not None
    assert "cnn64" in site.algorithm and "fused chosen" in site.similarity_note()
    chosen = site.learnt.report["candidates"][f"fused:{site.learnt.embedding_weight}"]["top1"]
    assert f"top-1 {chosen:.3f}" in site.similarity_note()
    assert 0.0 <= site.learnt.threshold <= 1.0
    assert set(site.learnt.report["candidates"]) >= {"features:0.0", "embedding:1.0", "fused:0.5"}
    cell = cells[10]
    analysis = site.analyse(cell.image, cell.background, cell.mask)
    embedding = site.embed(analysis.patch[None])
    matches = site.search_many(analysis.features[None], k=5, embeddings=embedding)
    assert matches[0][0].source_id == cell.source_id  # a database cell finds itself first
    assert matches[0][0].distance == pytest.approx(0.0, abs=1e-3)
    [score] = site.abnormality(embedding, matches, analysis.features[None])
    assert 0.0 <= score <= 1.0
    with pytest.raises(InvalidInput, match="learnt embedding"):
        site.search_many(analysis.features[None], k=5)


def test_rebuilding_the_search_structure_keeps_the_network(learnt_site):
    path, _ = learnt_site
    model = SiteIndex.open(path).learnt.model
    with SiteDB(path) as db:
        config = build_search_index(db, algorithm="hnsw")
    assert config["learnt"]["model"] == model
    site = SiteIndex.open(path)
    assert site.embedder.sha256 == model and len(site.vectors()) == len(site)


def test_a_learnt_site_answers_without_importing_jax(learnt_site):
    import subprocess
    import sys

    path, _ = learnt_site
    code = ("import sys; from pathmaster.site import SiteIndex; from pathmaster.synth import cell_rng, synth_cell\n"
            f"site = SiteIndex.open({str(path)!r}); cell = synth_cell('normal_columnar', cell_rng(5, 5))\n"
            "a = site.analyse(cell.image); e = site.embed(a.patch[None])\n"
            "m = site.search_many(a.features[None], 5, embeddings=e); site.abnormality(e, m, a.features[None])\n"
            "print(len(m[0]), 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240, check=True)
    assert out.stdout.split() == ["5", "False"]


def test_a_learnt_sites_operating_point_is_its_report_s_and_its_rules_are_recorded(learnt_site):
    path, _ = learnt_site
    learnt = SiteIndex.open(path).learnt
    report = learnt.report
    assert 1 <= report["trained_folds"] <= learn.INNER_FOLDS and len(report["epochs"]) == report["trained_folds"]
    point = report["scores"][learnt.score]
    assert learnt.threshold == point["threshold"] and point["margin_confidence"] == learn.MARGIN_CONFIDENCE
    assert {"point", "third", "cp0.8"} <= set(report["thresholds"])
    assert learnt.threshold == pytest.approx(report["thresholds"][f"cp{learn.MARGIN_CONFIDENCE:g}"], abs=1e-6)


def test_evaluate_learns_the_sites_score_on_each_training_fold_as_indexing_does(learnt_site, monkeypatch, capsys):
    import json

    from pathmaster.cli import main

    path, _ = learnt_site
    monkeypatch.setattr(learn, "MIN_CELLS_TO_LEARN", 20)  # a training fold of this small site still learns
    capsys.readouterr()
    assert main(["evaluate", "--db", str(path), "--json", "--folds", "2", "--no-ceiling", "--quiet"]) == 0
    figures = json.loads(capsys.readouterr().out)["site_score"]
    assert [fold["note"] for fold in figures["per_fold"]] == ["", ""]  # each fold learnt a network
    assert {fold["score"] for fold in figures["per_fold"]} <= set(emb.ABNORMAL_SCORES)
    point = figures["operating_point"]
    assert point["positives"] + point["negatives"] == len(SiteIndex.open(path))
    assert all(0.0 <= t <= 1.0 for t in point["thresholds"]) and 0.0 <= figures["roc"]["auc"] <= 1.0
