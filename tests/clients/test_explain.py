"""A site's explanations of its matches (services/site/explain.py): a similarity that means
the same at every site and in every case, and which measures make a match close or far."""

from __future__ import annotations

import numpy as np
import pytest

from pathmaster.site.search import SiteIndex
from pathmaster.site.database import SiteDB
from pathmaster.image.io import decode_image, encode_png
from pathmaster.site.database import image_hash
from services.analysis import analyse_encoded_cell
from services.shared import CONCEPTS, pack, unpack
from services.site.explain import Explainer, survival_share


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from services.synthetic import build_synthetic_site

    folder = build_synthetic_site(tmp_path_factory.mktemp("site") / "s", cells=21, seed=7, similarity="features")
    index = SiteIndex.open(folder)
    with SiteDB(folder) as db:
        ids, raw = db.feature_matrix()
    return index, Explainer(index), ids, raw


def test_similarity_is_calibrated_on_the_sites_own_nearest_neighbours(site):
    index, explainer, ids, raw = site
    nearest = explainer._nearest
    assert len(nearest) == len(ids)  # every cell of this small site is in the sample
    n = len(nearest)
    # Closer than every cell's nearest neighbour, yet not the cell itself: below 1.
    assert explainer.similarities([0.0]) == (n / (n + 1),)
    assert explainer.similarities([1e9]) == (0.0,)
    # The median nearest-neighbour distance is about half-way: the scale is where matches are.
    assert abs(explainer.similarities([float(np.median(nearest))])[0] - 0.5) <= 1 / n
    # A site whose distances are all 10x larger (a scaled space) says the same.
    distances = [m.distance for m in index.search(raw[0], 10)]
    assert survival_share(nearest * 10, np.array(distances) * 10).tolist() == list(explainer.similarities(distances))


@pytest.fixture(scope="module")
def worker(site):
    from services.site.worker import SiteWorker

    return SiteWorker(site[0].site_dir, budget=None, warm_up=False)


REFINED = [None, {"chromatin": 0.0, "nucleus_size": 4.0}, {"cytoplasm": 0.5}]


@pytest.mark.parametrize("seed", range(24))
def test_similarity_never_rises_down_the_ranks(site, worker, seed):
    """For test cells drawn about the site's own (near and far), refined or not."""
    index, _, _, raw = site
    rng = np.random.default_rng(seed)
    row, noise, weights = int(rng.integers(len(raw))), float(rng.uniform(0.0, 2.0)), REFINED[seed % len(REFINED)]
    query = raw[row] + noise * raw.std(axis=0) * rng.standard_normal(raw.shape[1])
    outcome = worker.search("q", query.tolist(), 8, weights=weights)
    assert not outcome.error
    assert list(outcome.similarity) == sorted(outcome.similarity, reverse=True)
    assert all(0.0 <= s < 1.0 for s in outcome.similarity)  # no image hash sent: never "the same cell"
    assert outcome.same_cell == (False,) * len(outcome.matches)


def test_only_the_cell_itself_is_the_same_cell(site, worker):
    index, _, ids, _ = site
    png = index.image_png(ids[3])
    outcome = worker.analyse("mine.png", png, b"", b"", 5)
    assert outcome.matches[0].cell_id == ids[3]
    assert outcome.same_cell[0] and outcome.similarity[0] == 1.0
    assert not any(outcome.same_cell[1:]) and all(s < 1.0 for s in outcome.similarity[1:])
    # The same cell with one pixel changed is a near-duplicate, not the cell: below 1.
    pixels = decode_image(png, "cell").copy()
    pixels[0, 0] = 255 - pixels[0, 0]
    twin = worker.analyse("twin.png", encode_png(pixels), b"", b"", 5)
    assert not any(twin.same_cell) and all(s < 1.0 for s in twin.similarity)
    # In features mode the analyser sends the hash beside the features: the same flag.
    features, *_ = analyse_encoded_cell("mine.png", png, b"", b"")
    by_features = worker.search_many([("mine.png", features.tolist(), True, True, [], image_hash(decode_image(png, "cell")))], 5)
    assert by_features[0].same_cell[0] and by_features[0].similarity[0] == 1.0


def test_measures_name_what_differs_and_split_the_distance(site):
    index, explainer, ids, raw = site
    query = raw[0].copy()
    names = list(index.feature_names)
    nucleus = names.index("nucleus_area")
    query[nucleus] *= 1.9  # the test cell's nucleus 1.9x its twin's
    measures = explainer.measures(query, ids[0])
    assert {m["concept"] for m in measures} == set(CONCEPTS)
    size = next(m for m in measures if m["concept"] == "nucleus_size")
    assert size["query"] / size["match"] == pytest.approx(1.9)
    assert measures[0]["concept"] == "nucleus_size"  # the only difference, so all of the distance
    assert size["share"] == pytest.approx(1.0)
    assert all(m["share"] == pytest.approx(0.0) for m in measures[1:])
    # Values the site was not sent are not explained.
    known = np.ones(len(names), dtype=bool)
    known[nucleus] = False
    assert "nucleus_size" not in {m["concept"] for m in explainer.measures(query, ids[0], known)}


def test_measures_travel_packed_and_come_back_as_ratios(site):
    index, explainer, ids, raw = site
    query = raw[0].copy()
    query[list(index.feature_names).index("nucleus_area")] /= 1.9
    measures = explainer.measures(query, ids[0])
    ratios, shares = pack(measures)
    assert len(ratios) == len(shares) == len(CONCEPTS)
    back = unpack(ratios, shares)
    assert back[0]["concept"] == "nucleus_size" and back[0]["ratio"] == pytest.approx(1.9, rel=0.01)
    assert back[0]["share"] == pytest.approx(1.0)
    # A ratio no cell could have (one of the two segmented wrongly) is not sent as a number.
    wild = [dict(m, match=m["query"] * 55.6) if m["concept"] == "cytoplasm" else m for m in measures]
    assert next(m for m in unpack(*pack(wild)) if m["concept"] == "cytoplasm")["ratio"] is None
    # A concept the site was not sent is not shown.
    partial = [m for m in measures if m["concept"] != "chromatin"]
    assert "chromatin" not in {m["concept"] for m in unpack(*pack(partial))}


def test_refining_by_concept_reranks_and_refuses_unknown_concepts(site):
    from services.shared import check_weights

    index, explainer, ids, raw = site
    query = raw[0].copy()
    cells = ids[:8]
    plain = explainer.reweighted(query, cells, {})
    assert plain[0] == pytest.approx(0.0)  # the cell itself
    # Without chromatin, the distance is what the other concepts (and features) leave.
    no_chromatin = explainer.reweighted(query, cells, {"chromatin": 0.0})
    assert (no_chromatin <= plain + 1e-9).all() and (no_chromatin < plain).any()
    more = explainer.reweighted(query, cells, {"chromatin": 4.0})
    assert (more >= plain - 1e-9).all()
    assert check_weights({"nucleus_size": 2}) == {"nucleus_size": 2.0}
    for bad in ({"eyes": 1.0}, {"chromatin": -1.0}, {"chromatin": 11.0}):
        with pytest.raises(ValueError):
            check_weights(bad)
