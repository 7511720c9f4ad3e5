"""``SiteIndex``: one site's database, ready to answer "which cells look like this one?".

    site = SiteIndex.open(site_dir)                  # SQLite + FAISS, loaded once
    analysis = site.analyse(image, background, mask)  # features (+ what was estimated)
    matches = site.search_analysis(analysis, k=5)     # [Match(cell_id, diagnosis, distance, source_id)]
    site.thumbnail_png(cell_id); site.image_png(cell_id)

The search index it opens is built by ``pathmaster.site.index`` (``build_search_index``) and kept
up to date by ``pathmaster.site.growth``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pathmaster import defaults
from pathmaster.learning import similarity
from pathmaster.site import faiss_index
from pathmaster.site.index import index_vectors, load_or_rebuild_faiss
from pathmaster.records import InvalidInput
from pathmaster.site.database import DB_NAME, CellColumns, CellRow, SiteDB, read_cell, read_site_file
from pathmaster.analysis.cell import CellAnalysis, analyse_cell

log = logging.getLogger(__name__)

# Cell rows and files are read through one connection a site, one read at a time (each ~0.1 ms).
_READER_LOCK = threading.Lock()


@dataclass(frozen=True)
class Match:
    """One database cell returned for a query; distance is unitless (weighted z-scores)."""

    cell_id: str
    diagnosis: str | None
    distance: float
    source_id: str


# ---------------------------------------------------------------- the facade


class SiteIndex:
    """A site's cells and search index in memory (see the module docstring)."""

    def __init__(self, site_dir: Path, config: dict, index, cells: CellColumns, feature_names: list[str],
                 vocabulary: dict | None = None):
        from pathmaster.vocabulary import stored_vocabulary

        self.site_dir = Path(site_dir)
        self.vocabulary = stored_vocabulary(vocabulary, cells.diagnoses, self.site_dir)
        self.config = config
        self.feature_names = list(feature_names)
        self._index = index
        self._normalization = similarity.Normalization.from_dict(config["normalization"])
        self._projection = similarity.Projection.from_dict(config["projection"])
        from pathmaster.learning.policy import LearntSimilarity
        from pathmaster.eye._vectors import eye_from
        from pathmaster.site.fitting import load_learnt

        # What the site compares besides its features, and its abnormality score
        # (pathmaster.site.fitting): its lens on top of its eye, both None without one. An eye
        # that cannot be opened, or is not the one the site was indexed with, stops the
        # site here (pathmaster.eye.EyeUnavailable): it never answers in another space.
        self.learnt = LearntSimilarity.from_dict(config.get("learnt"))
        self.lens = load_learnt(self.site_dir, self.learnt)
        self.eye = None if self.lens is None else eye_from(self.lens.eye)
        from pathmaster.learning.abnormality import FeatureClassifier

        self.classifier = FeatureClassifier.from_dict(self.learnt.classifier)
        # The cells' ids, source ids and diagnoses as columns, in the index's row order; the
        # rest of a row is read from the database when asked for (``cell``).
        self._cells = cells
        self._reader: sqlite3.Connection | None = None
        # The feature schema (pathmaster.features.schema) the stored vectors were made
        # with; "unknown" or "mixed" when they cannot be vouched for.
        self.feature_schema = "unknown"
        # Micrometres per pixel of the database's images (ingest.record_pixel_size); None: not known.
        self.pixel_um: float | None = None

    @classmethod
    def open(cls, site_dir: str | Path) -> "SiteIndex":
        """Load a site directory made by ``pathmaster index``.

        When cells were added or removed since the index was built (e.g. an ingest was
        killed before its last step) the index is brought up to date first
        (``growth.update_search_index``: what the site learnt is kept); a missing FAISS file
        is rebuilt from the database. Raises FileNotFoundError when there is no site database, InvalidInput
        when its cells were measured with another feature set than this PathMaster's.
        """
        from pathmaster.features import feature_names

        with SiteDB(site_dir) as db:
            stored = db.get_config("feature_names")
            if stored != list(feature_names()):
                raise InvalidInput(
                    f"the site's cells were measured with another feature set ({len(stored or [])} features; "
                    f"this PathMaster computes {len(feature_names())}): index the dataset again into a new "
                    "site directory", db.path)
            config, cells = db.get_config("index"), db.cell_columns()
            if config is None or config["fingerprint"] != cells.fingerprint():   # one read of the rows
                from pathmaster.site.growth import update_search_index

                log.info("%s: index out of date with the database; bringing it up to date", site_dir)
                config, cells = update_search_index(db), db.cell_columns()
            index = load_or_rebuild_faiss(db, config)
            site = cls(site_dir, config, index, cells, db.get_config("feature_names"), db.get_config("vocabulary"))
            site.feature_schema = db.get_config("feature_schema") or "unknown"
            site.pixel_um = db.get_config("pixel_um")
            return site

    def __len__(self) -> int:
        return len(self._cells)

    @property
    def algorithm(self) -> str:
        """The comparison algorithm, e.g. ``faiss-flat-l2/zscore/forward-12of115``; through the
        eye ``.../zscore/lda-130of130+6axes+efficientnet-lite0/lens64@0.5`` (fused, its weight)
        or ``.../efficientnet-lite0/lens64`` (`similarity.Projection.describe`)."""
        features = f"zscore/{self._projection.describe(len(self.feature_names))}"
        learnt = self.learnt
        seen = "" if self.lens is None else f"{self.lens.eye.get('name', 'eye')}/lens{self.lens.dim}"
        compared = {"features": features, "embedding": seen,
                    "fused": f"{features}+{seen}@{learnt.embedding_weight:g}"}[learnt.mode]
        return f"{faiss_index.describe(self._index)}/{compared}"

    def similarity_note(self) -> str:
        """What the site compares and why, in a line (its cross-validation's choice, or why
        it could not learn), then which abnormality score it chose and how it ranked its
        held-out cells, and the case figures of its operating point."""
        report = self.learnt.report or {}
        if "reason" in report:
            note = report["reason"] if self.lens is not None else f"features alone: {report['reason']}"
        else:
            chosen = report.get("candidates", {}).get(f"{self.learnt.mode}:{float(self.learnt.embedding_weight)}", {})
            note = (f"{self.learnt.mode} chosen by the site's {report.get('folds', '?')}-fold cross-validation"
                    f"{' (grouped by slide image)' if report.get('grouped') else ''}: top-1 {chosen.get('top1', 0):.3f}")
        point = (report.get("scores") or {}).get(self.learnt.score)
        if point:
            note += f"; abnormality by {self.learnt.score} (held-out ROC AUC {point['auc']:.3f})"
        case = report.get("case")
        if case:
            note += (f"; threshold chosen for 6-cell cases: case sensitivity {case['case_sensitivity']:.2f}, "
                     f"case specificity {case['case_specificity']:.2f} on its held-out cells")
        return note

    def diagnoses(self) -> list[str]:
        """The distinct diagnoses in the database, in the vocabulary's order (others last)."""
        present = {d for d in self._cells.diagnoses if d is not None}
        order = self.vocabulary.labels
        return [d for d in order if d in present] + sorted(present - set(order))

    def analyse(self, image: np.ndarray, background: np.ndarray | None = None,
                mask: np.ndarray | None = None, source: str | None = None) -> CellAnalysis:
        """Features of a test cell (see ``analyse_cell``)."""
        return analyse_cell(image, background, mask, source)

    def compared_columns(self) -> list[int]:
        """The columns of the feature vector the site's distance reads (its selection),
        ascending; [] when it reads every feature (nothing to leave out of a request)."""
        columns = sorted({int(c) for c in self._projection.columns})
        return [] if len(columns) == len(self.feature_names) else columns

    def expand(self, values: np.ndarray, columns: list[int]) -> np.ndarray:
        """Full feature vectors (m, n_features) from the `columns` (``compared_columns``)
        of each row of `values` (m, len(columns)), the other columns at the database mean.

        Those other columns are never read by the distance, so a search with the result
        is a search with the full vectors, to the bit. InvalidInput when `columns` are not
        the site's selection or a row has another length.
        """
        selected = self.compared_columns()
        if list(columns) != selected:
            raise InvalidInput(f"the site compares feature columns {selected or 'all'}, "
                               f"not {list(columns)}: send those values, or the full vector")
        values = np.atleast_2d(np.asarray(values, dtype=np.float64))
        if values.ndim != 2 or values.shape[1] != len(selected):
            raise InvalidInput(f"feature vectors of the site's selection must have {len(selected)} values each, "
                               f"got shape {values.shape}")
        full = np.repeat(self._normalization.mean[None, :], len(values), axis=0)
        full[:, selected] = values
        return full

    def embed(self, patches: np.ndarray) -> np.ndarray | None:
        """The cells' eye vectors (m, D) float32 of patches (m, S, S, 3) (``CellAnalysis.patch``),
        or None when the site has no eye. What a request carries as a cell's ``embedding``."""
        from pathmaster.eye._vectors import eye_vectors_of

        return None if self.eye is None else eye_vectors_of(self.eye, patches)

    def embedding_of(self, analysis: CellAnalysis) -> np.ndarray | None:
        """The eye vector (1, D) of an analysed test cell (``analyse``): its patch as the
        site's eye sees it; None when the site has no eye."""
        return None if analysis.patch is None else self.embed(analysis.patch[None])

    def search_analysis(self, analysis: CellAnalysis, k: int = defaults.K) -> list[Match]:
        """Top-k database cells for one analysed test cell (``analyse``), nearest first, by
        whatever the site compares: its features and, with an eye, its ``embedding_of``."""
        embedding = self.embedding_of(analysis)
        return self.search(analysis.features, k, embedding=None if embedding is None else embedding[0])

    def _vectors(self, features: np.ndarray, embeddings: np.ndarray | None = None) -> np.ndarray:
        features = np.atleast_2d(np.asarray(features, dtype=np.float64))
        if features.ndim != 2 or features.shape[1] != len(self.feature_names):
            raise InvalidInput(f"feature vectors must have {len(self.feature_names)} values each, got shape {features.shape}")
        if not np.isfinite(features).all():
            raise InvalidInput("feature vector has non-finite values")
        vectors = self._projection.apply(self._normalization.apply(features))
        if self.learnt.mode == "features":
            return vectors
        self._check_embeddings(embeddings, len(features))
        return self.learnt.vectors(vectors, self.lens.embed(embeddings))

    def _check_embeddings(self, embeddings, rows: int) -> None:
        if embeddings is None:
            raise InvalidInput("this site compares what its pretrained eye sees too: send the cell's image, or its "
                               f"vector by the eye {self.lens.eye_id[:16]}")
        shape = np.shape(embeddings)
        if shape != (rows, self.eye.dim) or not np.isfinite(embeddings).all():
            raise InvalidInput(f"eye vectors must be {rows} finite rows of {self.eye.dim} values, got shape {shape}")

    def abnormality(self, embeddings: np.ndarray | None, matches: list[list[Match]],
                    features: np.ndarray | None = None) -> list[float]:
        """Each query's abnormality score in [0, 1] (``learnt.abnormal_score``: the head's
        probability of an abnormal label from the cells' eye vectors ``embeddings`` (m, D),
        the share of abnormal labels among its k nearest matches, or the feature
        classifier's probability from the raw ``features`` (m, n_features)); a cell supports
        an abnormality at ``self.learnt.threshold`` or above."""
        from pathmaster.learning.neighbours import neighbour_share

        abnormal = set(self.vocabulary.abnormal)
        has_head = self.lens is not None and self.lens.head is not None
        network = (self.lens.abnormal_probability(embeddings) if has_head and embeddings is not None
                   else [None] * len(matches))
        reads_classifier = self.learnt.score in ("classifier", "ensemble")
        by_features = ([None] * len(matches) if self.classifier is None or features is None or not reads_classifier
                       else self.classifier.abnormal_probability(self._normalization.apply(np.atleast_2d(features))))
        return [self.learnt.abnormal_score(p, neighbour_share([m.diagnosis for m in row], abnormal, self.learnt.k), c)
                for p, row, c in zip(network, matches, by_features)]

    def search_many(self, features: np.ndarray, k: int = defaults.K,
                    columns: list[int] | None = None, embeddings: np.ndarray | None = None) -> list[list[Match]]:
        """Top-k database cells for each row of ``features`` (m, n_features), nearest first.

        With `columns` (the site's ``compared_columns``) the rows hold only those values.
        `embeddings` (m, D): the cells' eye vectors (``embed``), needed when the site
        compares through its eye (InvalidInput otherwise)."""
        if k < 1:
            raise InvalidInput(f"k must be at least 1, got {k}")
        if columns:
            features = self.expand(features, columns)
        distances, ids = faiss_index.search(self._index, self._vectors(features, embeddings), min(k, len(self)))
        cells = self._cells
        return [[Match(cells.cell_id(i), cells.diagnosis(i), float(d), cells.source_id(i))
                 for d, i in zip(row_d.tolist(), row_i.tolist()) if i >= 0]
                for row_d, row_i in zip(distances, ids)]

    def search(self, features: np.ndarray, k: int = defaults.K, columns: list[int] | None = None,
               embedding: np.ndarray | None = None) -> list[Match]:
        """Top-k database cells for one feature vector (n_features,), nearest first (with
        `columns`: only the values of those; `embedding` (D,): as ``search_many``)."""
        return self.search_many(np.asarray(features)[None, :] if np.ndim(features) == 1 else features, k,
                                columns, None if embedding is None else np.atleast_2d(embedding))[0]

    def _read(self, read):
        """`read` (a function of a sqlite3 connection) on the site's read-only connection,
        made on first use, one read at a time."""
        with _READER_LOCK:
            if self._reader is None:
                self._reader = sqlite3.connect(f"file:{self.site_dir / DB_NAME}?mode=ro", uri=True,
                                               check_same_thread=False, timeout=30)
            return read(self._reader)

    def _file(self, cell_id: str, attribute: str) -> bytes:
        relative = getattr(self.cell(cell_id), attribute)  # KeyError for an unknown id
        if relative is None:
            raise KeyError(f"cell {cell_id} has no {attribute.removesuffix('_path')}")
        return self._read(lambda conn: read_site_file(conn, self.site_dir, relative))

    def thumbnail_png(self, cell_id: str) -> bytes:
        """PNG bytes of the cell's thumbnail; KeyError for an unknown cell id."""
        return self._file(cell_id, "thumbnail_path")

    def image_png(self, cell_id: str) -> bytes:
        """PNG bytes of the full cell image; KeyError for an unknown cell id."""
        return self._file(cell_id, "image_path")

    def mask_png(self, cell_id: str) -> bytes:
        """PNG bytes of the cell's label mask (0-3); KeyError for an unknown id or no mask."""
        return self._file(cell_id, "mask_path")

    def cell(self, cell_id: str) -> CellRow:
        """The stored row of a cell (a ``database.CellRow`` without features), read from the
        database; KeyError if unknown."""
        return self._read(lambda conn: read_cell(conn, cell_id))

    def vectors(self) -> np.ndarray:
        """The database's index vectors (float32, (n_cells, d)), in cell order, for evaluation."""
        with SiteDB(self.site_dir) as db:
            _, X = db.feature_matrix()
            return index_vectors(db, X, self._normalization, self._projection, self.learnt)

    def cells_with_hash(self, digest: str) -> list[str]:
        """Ids of the database cells whose pixels hash to ``digest`` (``database.image_hash``):
        a query that is already in the database."""
        from pathmaster.site.database import cells_with_hash

        return self._read(lambda conn: cells_with_hash(conn, digest))

    def cell_ids(self, limit: int | None = None) -> list[str]:
        """The database's cell ids in cell order (the first `limit`; None: all)."""
        return self._cells.cell_ids(limit)

    def labels(self) -> list[str | None]:
        """The database diagnoses in cell order."""
        return self._cells.labels()

    def origins(self) -> dict[str, int]:
        """How many database cells each origin (dataset kind, e.g. herlev) has."""
        return dict(self._cells.origins)
