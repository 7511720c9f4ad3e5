"""Why a match is close, in measures a pathologist reads, and how close, comparably.

A site's distance is a weighted sum of squared z-score differences over the features it
compares (``pathmaster.learning.similarity.Projection``; a learnt map, when there is one, is applied
after). `Explainer` splits that weighted sum by *concept* (nuclear size, N/C ratio,
chromatin, nuclear shape, cytoplasm), so a match can say which concepts make it close or
far, and shows each concept's plainest feature as raw values ("nucleus 1.9x larger").

Distances are in each site's own space; `Explainer.similarities` makes them comparable and
able to rank: a match's similarity is the share of the site's own database cells whose
nearest other cell lies farther away than the match lies from the test cell, by the
Weibull plotting position of that empirical survival function (count / (n + 1)), so it is
below 1 for any cell that is not the test cell itself (the worker says 1 for a cell with the
test cell's image hash), falls with distance (never rises down the ranks) and spreads out
exactly where matches are: among near neighbours, not among random pairs. The cells are
the whole database up to SAMPLE_CELLS, a fixed random sample of that many beyond (their
nearest neighbours then sought among the sample, a little farther than in the whole
database); their distances are computed once per measure (the site's, or a refined one)
with the project's FAISS search.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from services.shared import CONCEPTS

RERANK_CANDIDATES = 50  # the site's nearest cells a refined search re-ranks
SAMPLE_CELLS = 2000  # database cells whose nearest-neighbour distances calibrate `similarities`
SAMPLE_SEED = 0
REFINED_MEASURES = 32  # refined measures (concept weights) whose calibration a worker keeps


def concept_columns(feature_names: list[str]) -> dict[str, np.ndarray]:
    """{concept: int64 indices of its features in `feature_names`}."""
    return {concept: np.array([i for i, name in enumerate(feature_names) if name.startswith(prefixes)],
                              dtype=np.int64)
            for concept, (_, prefixes) in CONCEPTS.items()}


def nearest_distances(vectors: np.ndarray) -> np.ndarray:
    """Sorted float64 (n,): each row's Euclidean distance to its nearest other row of
    `vectors` (float32 (n, d)); an exact duplicate's is 0. Empty for fewer than 2 rows."""
    from pathmaster.site import faiss_index  # FAISS: the site's own

    if len(vectors) < 2:
        return np.zeros(0)
    index = faiss_index.build_index(np.ascontiguousarray(vectors, np.float32))
    distances, _ = faiss_index.search(index, vectors, 2)
    return np.sort(distances[:, 1].astype(np.float64))  # [:, 0] is the row itself (or its twin)


def survival_share(nearest: np.ndarray, distances) -> np.ndarray:
    """float64 (m,): for each distance, the share of `nearest` (sorted) that is larger, as
    the Weibull plotting position count / (n + 1): in [0, n / (n + 1)], falling with
    distance. 0 where there is no calibration (`nearest` empty)."""
    distances = np.asarray(distances, dtype=np.float64)
    if not len(nearest):
        return np.zeros(len(distances))
    larger = len(nearest) - np.searchsorted(nearest, distances, side="right")
    return larger / (len(nearest) + 1)


class Explainer:
    """Explanations and comparable similarities for one site's matches.

    Parameters
    ----------
    index : pathmaster.site.search.SiteIndex
        The site's open index (its normalisation, projection and cells).
    """

    def __init__(self, index):
        from pathmaster.site.database import SiteDB  # the site's own

        self._db = SiteDB(index.site_dir)  # a match's raw features are read when it is explained
        names = list(index.feature_names)
        self._shown = {concept: names.index(feature) for concept, (feature, _) in CONCEPTS.items()}
        self._norm = index._normalization
        projection = index._projection
        weight = np.zeros(len(names))
        weight[np.asarray(projection.columns, dtype=np.int64)] = projection.weights
        self._weight = weight  # per feature; 0 where the site's distance does not read it
        self._concepts = concept_columns(names)
        self._sample = self._sample_features()
        self._nearest = nearest_distances(self._site_vectors(index))
        self._refined = lru_cache(maxsize=REFINED_MEASURES)(self._refined_nearest)

    def _sample_features(self) -> tuple[np.ndarray, np.ndarray]:
        """(positions int64 (m,) in the database's row order, raw features float64 (m,
        n_features)) of at most SAMPLE_CELLS of the site's cells, chosen at random (fixed
        seed) however large the database."""
        rowids = np.array([r for (r,) in self._db.conn.execute("SELECT rowid FROM cells ORDER BY rowid")],
                          dtype=np.int64)
        if not len(rowids):
            return np.zeros(0, np.int64), np.zeros((0, len(self._weight)))
        rng = np.random.default_rng(SAMPLE_SEED)
        positions = np.sort(rng.choice(len(rowids), size=min(len(rowids), SAMPLE_CELLS), replace=False))
        chosen = [int(r) for r in rowids[positions]]
        blobs = [blob for (blob,) in self._db.conn.execute(
            f"SELECT features FROM cells WHERE rowid IN ({','.join('?' * len(chosen))}) ORDER BY rowid", chosen)]
        return positions, np.vstack([np.frombuffer(blob, dtype="<f8") for blob in blobs])

    def _site_vectors(self, index) -> np.ndarray:
        """The sample's search vectors in the site's own measure (its lens included)."""
        from pathmaster.site.index import search_vectors

        positions, raw = self._sample
        embeddings = None
        if index.lens is not None and index.learnt.mode != "features" and len(positions):
            from pathmaster.site.fitting import eye_vectors

            cells = self._db.cells()  # their eye vectors are in the site's store: looked at when indexed
            embeddings = index.lens.embed(eye_vectors(self._db, [cells[p] for p in positions], index.eye))
        return search_vectors(raw, self._norm, index._projection, index.learnt, embeddings)

    def _refined_nearest(self, weights: tuple) -> np.ndarray:
        """The sample's nearest-neighbour distances in the measure `reweighted` uses with
        `weights` ((concept, weight) pairs, sorted)."""
        scale = np.sqrt(self._weight * self._factor(dict(weights)))
        return nearest_distances((self._norm.apply(self._sample[1]) * scale).astype(np.float32))

    def _factor(self, weights: dict[str, float]) -> np.ndarray:
        """float64 (n_features,): each feature's weight multiplier under concept `weights`."""
        factor = np.ones(len(self._weight))
        for concept, weight in weights.items():
            factor[self._concepts[concept]] = weight
        return factor

    def _raw(self, cell_id: str) -> np.ndarray:
        (blob,) = self._db.conn.execute("SELECT features FROM cells WHERE cell_id = ?", (cell_id,)).fetchone()
        return np.frombuffer(blob, dtype="<f8")

    def similarities(self, distances, weights: dict[str, float] | None = None) -> tuple[float, ...]:
        """Each distance's similarity, 0..n/(n+1) (`survival_share`): calibrated on the
        nearest-neighbour distances of the site's sample in the measure the distances are
        in: the site's own (`weights` None or empty) or `reweighted`'s with `weights`."""
        nearest = self._refined(tuple(sorted(weights.items()))) if weights else self._nearest
        return tuple(float(v) for v in survival_share(nearest, distances))

    def reweighted(self, query: np.ndarray, cell_ids: list[str], weights: dict[str, float]) -> np.ndarray:
        """float64 (len(cell_ids),): each cell's weighted z-score distance from `query` with
        each concept's features' weights multiplied by `weights` (1 when absent): the
        site's measure refined by concept (a learnt map, when the site has one, is left out)."""
        rows = np.vstack([self._raw(c) for c in cell_ids])
        dz = self._norm.apply(query)[None, :] - self._norm.apply(rows)
        return np.sqrt((self._weight * self._factor(weights) * dz * dz).sum(axis=1))

    def measures(self, query: np.ndarray, cell_id: str, known: np.ndarray | None = None) -> list[dict]:
        """The concepts of one match, largest share of the distance first: dicts of
        concept, query, match (raw values of its shown feature, `CONCEPTS`) and share.

        query: float64 (n_features,) raw features of the test cell; known: bool
        (n_features,) of the values the site was sent (None: all), a concept whose shown
        feature was not sent is left out."""
        row = self._raw(cell_id)
        dz = self._norm.apply(query) - self._norm.apply(row)
        part = self._weight * dz * dz
        total = float(part.sum()) or 1.0
        out = []
        for concept, columns in self._concepts.items():
            shown = self._shown[concept]
            if known is not None and not known[shown]:
                continue
            out.append({"concept": concept, "query": float(query[shown]),
                        "match": float(row[shown]), "share": float(part[columns].sum()) / total})
        return sorted(out, key=lambda m: -m["share"])
