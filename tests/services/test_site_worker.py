"""A site worker's own logic over a fake index (no Ray, no database): the abnormality read
from the site's own nearest however many matches were asked, its operating point, a
refined search re-ranked by concept, a vector that does not fit, several cells in one call,
and what it reports of its database."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from pathmaster.image.io import encode_png
from pathmaster.image.synth import GENERATOR
from pathmaster.records import InvalidInput
from pathmaster.site.search import Match, SiteIndex
from services.site import worker as site_worker
from services.site.worker import SYNTHETIC, FeatureCell, SiteWorker, origin_counts

PNG = encode_png(np.full((8, 8, 3), 200, np.uint8))


@dataclass
class Learnt:
    k: int = 5
    threshold: float = 0.5


class Vocabulary:
    def to_bethesda(self, diagnosis):
        return {"normal": "NILM", "severe": "HSIL"}.get(diagnosis)


class FakeIndex:
    """What SiteWorker asks of a SiteIndex: ten database cells c0..c9 at distances 0..9 of
    any query, c9 with no diagnosis; the abnormality score is the share of "severe" among
    the matches it is given. Records the searches and scorings asked for."""

    def __init__(self, learnt: Learnt = Learnt(), misfit: bool = False):
        self.learnt, self.misfit, self.vocabulary = learnt, misfit, Vocabulary()
        self.searched: list[tuple[int, list | None]] = []   # (k, columns) of each search
        self.scored: list[int] = []                          # matches each score read

    def diagnosis(self, i: int) -> str | None:
        return None if i == 9 else ("severe" if i % 2 else "normal")

    def expand(self, rows, columns):
        full = np.zeros((len(rows), 4))
        full[:, columns] = rows
        return full

    def search_many(self, queries, k, columns=None, embeddings=None):
        if self.misfit:
            raise InvalidInput(f"expected 4 feature values, got {queries.shape[1]}")
        self.searched.append((k, columns))
        return [[Match(f"c{i}", self.diagnosis(i), float(i), f"s{i}") for i in range(min(k, 10))]]

    def abnormality(self, embeddings, found, queries):
        self.scored.append(len(found[0]))
        return [sum(m.diagnosis == "severe" for m in found[0]) / len(found[0])]

    def cells_with_hash(self, digest):
        return []

    def thumbnail_png(self, cell_id):
        return PNG

    def image_png(self, cell_id):
        return PNG

    def mask_png(self, cell_id):
        raise KeyError(cell_id)

    def cell(self, cell_id):
        return Match(cell_id, None, 0.0, "s")


class FakeExplainer:
    """Similarity falls with distance; a refined search puts the farthest first."""

    def __init__(self, index):
        pass

    def similarities(self, distances, weights=None):
        return tuple(1.0 / (1.0 + d) for d in distances)

    def reweighted(self, query, cell_ids, weights):
        return np.arange(len(cell_ids), 0, -1, dtype=float)

    def measures(self, query, cell_id, known=None):
        return [{"concept": "chromatin", "share": 1.0}]


@pytest.fixture
def worker_over(monkeypatch):
    def make(index: FakeIndex) -> SiteWorker:
        monkeypatch.setattr(SiteIndex, "open", classmethod(lambda cls, db: index))
        monkeypatch.setattr(site_worker, "Explainer", FakeExplainer)
        return SiteWorker("fake-db", budget=None, warm_up=False)

    return make


def test_the_abnormality_is_read_from_the_sites_own_nearest_however_many_matches_are_asked(worker_over):
    index = FakeIndex(Learnt(k=5, threshold=0.4))
    worker = worker_over(index)
    outcome = worker.search("q", [0.1, 0.2, 0.3, 0.4], k=2)
    assert [m.cell_id for m in outcome.matches] == ["c0", "c1"]
    assert index.searched == [(5, None)] and index.scored == [5]
    assert outcome.abnormal_score == pytest.approx(0.4) and outcome.abnormal  # at the operating point: abnormal
    assert outcome.bethesda == ("NILM", "HSIL") and outcome.similarity == pytest.approx((1.0, 0.5))
    assert outcome.same_cell == (False, False) and outcome.extraction_s == 0.0
    assert len(outcome.thumbnails) == len(outcome.image_sha256) == 2
    more = worker.search("q", [0.1, 0.2, 0.3, 0.4], k=10)  # more than the site scores with
    assert index.scored[-1] == 10 and more.bethesda[-1] == ""  # a match whose label has no term


def test_below_the_operating_point_a_cell_is_not_abnormal(worker_over):
    outcome = worker_over(FakeIndex(Learnt(k=5, threshold=0.41))).search("q", [0.0] * 4, k=3)
    assert outcome.abnormal_score == pytest.approx(0.4) and not outcome.abnormal


def test_a_refined_search_reranks_more_candidates_and_reports_its_own_distances(worker_over):
    index = FakeIndex()
    outcome = worker_over(index).search("q", [0.0] * 4, k=3, weights={"chromatin": 2.0})
    assert index.searched == [(site_worker.RERANK_CANDIDATES, None)]
    assert index.scored == [5]  # scored on the site's own nearest, not the re-ranked ones
    n = min(site_worker.RERANK_CANDIDATES, 10)
    assert [m.cell_id for m in outcome.matches] == [f"c{n - 1}", f"c{n - 2}", f"c{n - 3}"]
    assert [m.distance for m in outcome.matches] == [1.0, 2.0, 3.0]


def test_a_vector_that_does_not_fit_is_the_cells_error_and_not_an_exception(worker_over):
    outcome = worker_over(FakeIndex(misfit=True)).search("q", [0.0] * 3, k=3)
    assert outcome.error and outcome.matches == () and outcome.abnormal_score is None


def test_cells_analysed_elsewhere_are_searched_in_one_call_with_their_columns(worker_over):
    index = FakeIndex()
    cells = [FeatureCell("a", [1.0, 2.0], True, False), ("b", [3.0, 4.0], False, True)]  # a tuple of its fields too
    outcomes = worker_over(index).search_many(cells, 2, columns=[0, 3])
    assert [(o.query_cell_id, o.background_estimated, o.mask_estimated) for o in outcomes] == [
        ("a", True, False), ("b", False, True)]
    assert index.searched == [(5, [0, 3])] * 2
    assert all(len(o.measures) == 2 for o in outcomes)


def test_a_database_cell_without_a_mask_or_a_diagnosis_is_read_as_empty(worker_over):
    worker = worker_over(FakeIndex())
    assert worker.image("c9") == {"image": PNG, "diagnosis": "", "mask": b""}
    assert worker.budget_stats() == {}  # unbounded: no analysis pool to report


def test_generated_cells_are_reported_as_synthetic_beside_each_dataset():
    assert origin_counts({GENERATOR: 3, SYNTHETIC: 2, "herlev": 5}) == {SYNTHETIC: 5, "herlev": 5}
