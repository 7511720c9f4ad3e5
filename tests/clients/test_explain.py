"""A site's explanations of its matches (services/site/explain.py): a similarity that means
the same at every site and in every case, and which measures make a match close or far."""

from __future__ import annotations

import numpy as np
import pytest

from pathmaster.site import SiteIndex
from pathmaster.sitedb import SiteDB
from services.site.explain import CONCEPTS, Explainer, pack, unpack


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from services.site.synthetic import build_synthetic_site

    folder = build_synthetic_site(tmp_path_factory.mktemp("site") / "s", cells=21, seed=7, similarity="features")
    index = SiteIndex.open(folder)
    with SiteDB(folder) as db:
        ids, raw = db.feature_matrix()
    return index, Explainer(index), ids, raw


def test_similarity_is_calibrated_on_the_sites_own_pairs(site):
    index, explainer, ids, raw = site
    assert explainer.similarity(0.0) == 1.0  # closer than every pair of its cells
    assert explainer.similarity(1e9) == 0.0
    distances = [m.distance for m in index.search(raw[0], 10)]
    similarities = [explainer.similarity(d) for d in distances]
    assert similarities == sorted(similarities, reverse=True)  # farther is never more similar
    # A site whose distances are all 10x larger (a scaled space) says the same.
    scaled = Explainer.__new__(Explainer)
    scaled._pairs = explainer._pairs * 10
    assert [scaled.similarity(10 * d) for d in distances] == similarities


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
    # A concept the site was not sent is not shown.
    partial = [m for m in measures if m["concept"] != "chromatin"]
    assert "chromatin" not in {m["concept"] for m in unpack(*pack(partial))}


def test_refining_by_concept_reranks_and_refuses_unknown_concepts(site):
    from services.site.explain import check_weights

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
