"""Why a match is close, in measures a pathologist reads, and how close, comparably.

A site's distance is a weighted sum of squared z-score differences over the features it
compares (``pathmaster.similarity.Projection``; a learnt map, when there is one, is applied
after). `Explainer` splits that weighted sum by *concept* (nuclear size, N/C ratio,
chromatin, nuclear shape, cytoplasm), so a match can say which concepts make it close or
far, and shows each concept's plainest feature as raw values ("nucleus 1.9x larger").

Distances are in each site's own space; `Explainer.similarity` makes them comparable: the
share of pairs of the site's own database cells that lie farther apart than the match lies
from the test cell (an empirical CDF of a fixed sample of pair distances, so it is the
same for every case). Hand-written: it is a few lines over the site's arrays.
"""

from __future__ import annotations

import math

import numpy as np

# concept -> (the feature shown for it, prefixes of the features it is made of)
CONCEPTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "nucleus_size": ("nucleus_area", ("nucleus_area", "nucleus_perimeter", "nucleus_major_axis",
                                      "nucleus_minor_axis", "nucleus_feret_")),
    "nc_ratio": ("nc_ratio", ("nc_ratio",)),
    "chromatin": ("nucleus_od_mean", ("nucleus_od_", "nucleus_brightness_", "nucleus_haralick_",
                                      "nucleus_lbp_")),
    "nucleus_shape": ("nucleus_form_factor", ("nucleus_form_factor", "nucleus_eccentricity", "nucleus_solidity",
                                              "nucleus_radial_cv", "nucleus_fourier_")),
    "cytoplasm": ("cell_area", ("cell_", "cytoplasm_")),
}
MAX_WEIGHT = 10.0  # a concept's weight when refining by concept: 0 (ignore it) to 10
RERANK_CANDIDATES = 50  # the site's nearest cells a refined search re-ranks
PAIR_SAMPLE = 4000  # pairs of database cells whose distances calibrate `similarity`
SAMPLE_CELLS = 2000  # the cells those pairs are drawn from
PAIR_SEED = 0


def concept_columns(feature_names: list[str]) -> dict[str, np.ndarray]:
    """{concept: int64 indices of its features in `feature_names`}."""
    return {concept: np.array([i for i, name in enumerate(feature_names) if name.startswith(prefixes)],
                              dtype=np.int64)
            for concept, (_, prefixes) in CONCEPTS.items()}


def check_weights(weights) -> dict[str, float]:
    """`weights` ({concept: weight}) as a dict; ValueError naming a concept not in
    `CONCEPTS` or a weight outside 0..MAX_WEIGHT."""
    out = {}
    for concept, weight in dict(weights).items():
        if concept not in CONCEPTS:
            raise ValueError(f"no concept {concept[:40]!r}; the concepts are {', '.join(CONCEPTS)}")
        if not 0.0 <= float(weight) <= MAX_WEIGHT:
            raise ValueError(f"the weight of {concept} must be 0 to {MAX_WEIGHT:g}, not {weight}")
        out[concept] = float(weight)
    return out


UNMEASURED = 255  # a packed share: the site was not sent the concept's shown feature


def pack(measures: list[dict]) -> tuple[list[int], list[int]]:
    """`Explainer.measures` as the wire's packed fields (Match.measure_log2_ratio,
    Match.measure_share), one value per concept in `CONCEPTS` order."""
    by_concept = {m["concept"]: m for m in measures}
    ratios, shares = [], []
    for concept in CONCEPTS:
        m = by_concept.get(concept)
        if m is None or not (m["query"] > 0 and m["match"] > 0):
            ratios.append(0)
            shares.append(UNMEASURED)
            continue
        ratios.append(round(100 * math.log2(m["match"] / m["query"])))
        shares.append(min(100, round(100 * m["share"])))
    return ratios, shares


def unpack(ratios, shares) -> list[dict]:
    """The packed fields as [{"concept", "ratio" (match over test cell), "share" (0..1)}],
    largest share first, concepts the site did not measure left out."""
    out = [{"concept": concept, "ratio": round(2 ** (r / 100), 3), "share": s / 100}
           for concept, r, s in zip(CONCEPTS, ratios, shares) if s != UNMEASURED]
    return sorted(out, key=lambda m: -m["share"])


class Explainer:
    """Explanations and comparable similarities for one site's matches.

    Parameters
    ----------
    index : pathmaster.site.SiteIndex
        The site's open index (its normalisation, projection and cells).
    """

    def __init__(self, index):
        from pathmaster.sitedb import SiteDB  # the site's; the page's gateway needs only `unpack`

        self._db = SiteDB(index.site_dir)  # a match's raw features are read when it is explained
        names = list(index.feature_names)
        self._shown = {concept: names.index(feature) for concept, (feature, _) in CONCEPTS.items()}
        self._norm = index._normalization
        projection = index._projection
        weight = np.zeros(len(names))
        weight[np.asarray(projection.columns, dtype=np.int64)] = projection.weights
        self._weight = weight  # per feature; 0 where the site's distance does not read it
        self._concepts = concept_columns(names)
        self._pairs = self._pair_distances(projection)

    def _pair_distances(self, projection) -> np.ndarray:
        """Sorted distances of PAIR_SAMPLE random pairs among a sample of the site's cells
        (at most SAMPLE_CELLS read, however large the database)."""
        rng = np.random.default_rng(PAIR_SEED)
        rowids = np.array([r for (r,) in self._db.conn.execute("SELECT rowid FROM cells")], dtype=np.int64)
        if len(rowids) < 2:
            return np.zeros(0)
        chosen = np.sort(rng.choice(rowids, size=min(len(rowids), SAMPLE_CELLS), replace=False))
        marks = ",".join("?" * len(chosen))
        raw = np.vstack([np.frombuffer(blob, dtype="<f8") for (blob,) in self._db.conn.execute(
            f"SELECT features FROM cells WHERE rowid IN ({marks})", [int(r) for r in chosen])])
        vectors = projection.apply(self._norm.apply(raw)).astype(np.float64)
        n = len(vectors)
        a = rng.integers(0, n, PAIR_SAMPLE)
        b = (a + rng.integers(1, n, PAIR_SAMPLE)) % n  # never a cell with itself
        return np.sort(np.linalg.norm(vectors[a] - vectors[b], axis=1))

    def _raw(self, cell_id: str) -> np.ndarray:
        (blob,) = self._db.conn.execute("SELECT features FROM cells WHERE cell_id = ?", (cell_id,)).fetchone()
        return np.frombuffer(blob, dtype="<f8")

    def similarity(self, distance: float) -> float:
        """0..1: the share of sampled database pairs farther apart than `distance`."""
        if not len(self._pairs):
            return 0.0
        return float(1.0 - np.searchsorted(self._pairs, distance, side="right") / len(self._pairs))

    def reweighted(self, query: np.ndarray, cell_ids: list[str], weights: dict[str, float]) -> np.ndarray:
        """float64 (len(cell_ids),): each cell's weighted z-score distance from `query` with
        each concept's features' weights multiplied by `weights` (1 when absent): the
        site's measure refined by concept (a learnt map, when the site has one, is left out)."""
        factor = np.ones(len(self._weight))
        for concept, weight in weights.items():
            factor[self._concepts[concept]] = weight
        rows = np.vstack([self._raw(c) for c in cell_ids])
        dz = self._norm.apply(query)[None, :] - self._norm.apply(rows)
        return np.sqrt((self._weight * factor * dz * dz).sum(axis=1))

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
