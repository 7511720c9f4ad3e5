"""``SiteIndex``: one site's database, ready to answer "which cells look like this one?".

    site = SiteIndex.open(site_dir)                  # SQLite + FAISS, loaded once
    analysis = site.analyse(image, background, mask)  # features (+ what was estimated)
    matches = site.search(analysis.features, k=5)     # [Match(cell_id, diagnosis, distance, source_id)]
    site.thumbnail_png(cell_id); site.image_png(cell_id)

This module also builds the search index of a site (``build_search_index``): database
statistics for the z-scores, the feature subset or weighting chosen from the data, the FAISS
index. All of it is stored in the database's ``index`` config; the FAISS file is named by
the database's fingerprint and the config holds its SHA-1, so a missing, damaged or stale
file (another set of cells, another representation) is rebuilt from the database, never
trusted. FAISS writes and reads the file itself (``faiss.write_index``, ``faiss.read_index``):
no copy of a million vectors in between.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pathmaster import defaults, similarity
from pathmaster.records import DIAGNOSES, CellRecord, InvalidInput
from pathmaster.sitedb import DB_NAME, CellColumns, CellRow, SiteDB, read_cell, read_site_file

log = logging.getLogger(__name__)

# Choosing features from the data needs enough labelled cells for cross-validated
# leave-one-out scores to mean something; below this every feature counts equally.
MIN_CELLS_FOR_SELECTION = 30
# Queries (database cells) used to measure an approximate index's recall against exact.
RECALL_QUERIES = 500
TARGET_RECALL = 0.95
# Cell rows and files are read through one connection a site, one read at a time (each ~0.1 ms).
_READER_LOCK = threading.Lock()


@dataclass
class CellAnalysis:
    """Features of one test cell, and whether PathMaster had to estimate its inputs.

    features: float64 (n_features,). mask, background: the arrays actually used (given or
    estimated), uint8 (H, W) and (H, W, 3).
    """

    features: np.ndarray
    background_estimated: bool
    mask_estimated: bool
    mask: np.ndarray | None = None
    background: np.ndarray | None = None
    # Which cell of the crop was taken and why (``pathmaster.segmentation.complete_cell``);
    # None when the mask and background were both given.
    cell_choice: dict | None = None
    patch: np.ndarray | None = None  # uint8 (S, S, 3): what a learnt network sees (embedding.cell_patch)


@dataclass(frozen=True)
class Match:
    """One database cell returned for a query; distance is unitless (weighted z-scores)."""

    cell_id: str
    diagnosis: str | None
    distance: float
    source_id: str


def analyse_cell(image: np.ndarray, background: np.ndarray | None = None, mask: np.ndarray | None = None,
                 source: str | None = None) -> CellAnalysis:
    """Features of one cell, segmenting it and estimating its background when not given.

    Parameters
    ----------
    image : ndarray of uint8, shape (H, W, 3)
        RGB cell image.
    background : ndarray of uint8, shape (H, W, 3), optional
        The blank slide; estimated when None.
    mask : ndarray of int, shape (H, W), optional
        Labels 0-3; segmented when None.
    source : str, optional
        The file or cell named in error messages (default "cell").

    The arrays are checked once (`pathmaster.imageio.check_cell`; by
    `pathmaster.segmentation.complete_cell` when it fills something in) and analysed as
    they are. Raises InvalidInput
    naming ``source`` for arrays that do not fit together or a mask without a nucleus.
    """
    from pathmaster.embedding import cell_patch
    from pathmaster.features.extract import features_of
    from pathmaster.features.regions import crop_regions
    from pathmaster.imageio import check_cell

    cell = CellRecord(source or "cell", None, image, mask=mask, background=background)
    if mask is None or background is None:
        from pathmaster.segmentation import complete_cell

        complete_cell(cell)  # checks, then fills in what is missing
    else:
        check_cell(image, mask, background, cell.source_id)
    features = features_of(crop_regions(cell.image, cell.background, cell.mask))
    patch = cell_patch(cell.image, cell.background)
    return CellAnalysis(features, cell.background_estimated, cell.mask_estimated, cell.mask, cell.background,
                        cell_choice=cell.extra.get("cell_choice"), patch=patch)


# ---------------------------------------------------------------- building the index


def index_path(site_dir: Path, fingerprint: str) -> Path:
    return Path(site_dir) / f"index-{fingerprint[:16]}.faiss"


FEATURE_CHOICES = ("auto", *similarity.PROJECTIONS)


def build_search_index(db: SiteDB, *, algorithm: str | None = None, features: str | None = None,
                       seed: int = 0, similarity_choice: str | None = None,
                       learn_seconds: float | None = None) -> dict:
    """Fit z-scores and the feature subset to the database, build and save the FAISS index.

    algorithm: "flat", "ivf", "hnsw", or None for the site's stored choice (default: exact
    below ``similarity.EXACT_LIMIT`` cells, IVF above). features: "auto" (the best of
    all features, Fisher weights, forward selection and linear discriminant axes learnt
    from the site's labels, by cross-validated retrieval,
    ``similarity.choose_projection``), or one of ``similarity.PROJECTIONS`` to force it;
    None for the site's stored choice (default "auto").
    similarity_choice: "auto" (the site's cross-validation picks features, its learnt
    embedding or both fused, ``pathmaster.learnt``), or one of them to force it; None for
    the stored choice (default "auto"). learn_seconds: the training budget (default
    ``learnt.learn_budget`` of the labelled cells).
    Returns the ``index`` config written to the database.
    """
    from pathmaster import learnt as learnt_module

    options = db.get_config("index_options", {"algorithm": "auto", "features": "auto"})
    options.setdefault("similarity", "auto")
    if similarity_choice is not None:
        options["similarity"] = similarity_choice
    if learn_seconds is not None:
        options["learn_seconds"] = float(learn_seconds)
    if algorithm is not None:
        options["algorithm"] = algorithm
    if features is not None:
        options["features"] = features
    if options["algorithm"] not in ("auto", *similarity.ALGORITHMS):
        raise InvalidInput(f"unknown search algorithm {options['algorithm']!r}; known: auto, {', '.join(similarity.ALGORITHMS)}")
    if options["features"] not in FEATURE_CHOICES:
        raise InvalidInput(f"unknown feature choice {options['features']!r}; known: {', '.join(FEATURE_CHOICES)}")
    if options["similarity"] not in learnt_module.SIMILARITY_CHOICES:
        raise InvalidInput(f"unknown similarity {options['similarity']!r}; known: "
                           f"{', '.join(learnt_module.SIMILARITY_CHOICES)}")
    db.set_config("index_options", options)

    names = db.get_config("feature_names")
    cell_ids, X = db.feature_matrix()
    if not cell_ids:
        raise InvalidInput("the site database has no cells yet; nothing to index", db.path)
    fingerprint = db.fingerprint()
    previous = db.get_config("index") or {}
    if (previous.get("fingerprint") == fingerprint and previous.get("features") == options["features"]
            and previous.get("similarity", "auto") == options["similarity"]):
        # Same cells, same choices: only the search structure changes, so keep the fitted
        # z-scores, feature choice and network (fitting them is the slow part).
        normalization = similarity.Normalization.from_dict(previous["normalization"])
        projection = similarity.Projection.from_dict(previous["projection"])
        learnt = learnt_module.emb.LearntSimilarity.from_dict(previous.get("learnt"))
        vectors = _index_vectors(db, X, normalization, projection, learnt)
    else:
        normalization, projection = _fit_features(db, X, names, options["features"], seed)
        learnt, embeddings = learnt_module.fit_learnt(
            db, X, normalization, projection, _vocabulary(db), choice=options["similarity"],
            seconds=options.get("learn_seconds"), seed=seed)
        vectors = search_vectors(X, normalization, projection, learnt, embeddings)

    kind = options["algorithm"]
    if kind == "auto":
        kind = "flat" if len(vectors) <= similarity.EXACT_LIMIT else "ivf"
    index = similarity.build_index(vectors, kind, seed=seed)
    config = {"algorithm": kind, "features": options["features"], "normalization": normalization.to_dict(),
              "projection": projection.to_dict(), "n_cells": len(cell_ids), "fingerprint": fingerprint,
              "similarity": options["similarity"], "learnt": learnt.to_dict()}
    if kind in ("ivf", "hnsw"):
        config.update(measure_recall(index, vectors, kind, seed))
    config["index_sha1"] = _save_index(db.site_dir, fingerprint, index)
    with db.transaction():
        db.set_config("index", config)
    return config


def measure_recall(index, vectors: np.ndarray, kind: str, seed: int = 0) -> dict:
    """An approximate index's recall@5 against exact search, database cells as queries
    (each left out of its own results); for IVF the smallest nprobe reaching
    ``TARGET_RECALL`` too. Returns {"recall_at_5"[, "nprobe"]} for the ``index`` config."""
    import faiss

    sample = np.random.default_rng(seed).choice(len(vectors), min(RECALL_QUERIES, len(vectors)), replace=False)
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    _, exact = faiss.knn(vectors[sample], vectors, defaults.K + 1)   # exact, without a copy of every vector
    if kind == "ivf":
        nprobe, recall = similarity.tune_nprobe(index, vectors[sample], exact, defaults.K, TARGET_RECALL,
                                                exclude=sample)
        return {"nprobe": nprobe, "recall_at_5": recall}
    _, approx = similarity.search(index, vectors[sample], defaults.K + 1)
    return {"recall_at_5": similarity.recall_at_k(similarity.drop_ids(approx, sample, defaults.K),
                                                  similarity.drop_ids(exact, sample, defaults.K))}


def stored_vectors(db: SiteDB, config: dict, offset: int = 0) -> np.ndarray:
    """The search vectors (float32 (n, d)) of the database's cells from the `offset`-th on,
    by the representation fitted and stored in the ``index`` config `config`: nothing is
    fitted again (the one place that turns stored features into index vectors)."""
    from pathmaster.embedding import LearntSimilarity

    _, X = db.feature_matrix(offset)
    normalization = similarity.Normalization.from_dict(config["normalization"])
    projection = similarity.Projection.from_dict(config["projection"])
    return _index_vectors(db, X, normalization, projection, LearntSimilarity.from_dict(config.get("learnt")),
                          offset)


def _fit_features(db: SiteDB, X: np.ndarray, names: list[str], choice: str, seed: int):
    """(Normalization, Projection) fitted to the database's feature matrix ``X``."""
    labels = np.array(db.labels(), dtype=object)
    return fit_representation(X, labels, names, choice, seed=seed)


def fit_representation(X: np.ndarray, labels, names: list[str], choice: str, *, seed: int = 0):
    """What a site compares cells in, fitted to labelled cells: (Normalization, Projection).

    X: float64 (n_cells, n_features) raw features; labels: n_cells diagnoses (None for
    unlabelled cells); choice: a ``FEATURE_CHOICES`` entry. The one fit of the site's
    representation: indexing calls it on the whole database, ``pathmaster evaluate`` on each
    training fold, so the evaluation measures what the site searches with.
    """
    return similarity.fit_similarity(X, labels, names, choice, seed=seed, min_cells=MIN_CELLS_FOR_SELECTION)


def _vocabulary(db: SiteDB):
    """The site's stored vocabulary, or the built-in one that holds its labels."""
    from pathmaster.vocabulary import Vocabulary, vocabulary_for_labels

    stored = db.get_config("vocabulary")
    return Vocabulary.from_dict(stored, db.path) if stored else vocabulary_for_labels(c.diagnosis for c in db.cells())


def _index_vectors(db: SiteDB, X: np.ndarray, normalization, projection, learnt, offset: int = 0) -> np.ndarray:
    """The search vectors (float32 (n, d)) of the database's cells from the `offset`-th on
    (`X` their features): their features' projection, with their embeddings by the stored
    network when the site compares them."""
    from pathmaster import learnt as learnt_module

    embeddings = None
    if learnt.mode != "features":
        model = learnt_module.load_learnt(db.site_dir, learnt)
        embeddings = model.embed(learnt_module.cell_patches(db, db.cells()[offset:]))
    return search_vectors(X, normalization, projection, learnt, embeddings)


# Rows turned into search vectors at a time: the float64 intermediates are a block's, not a
# million cells' (each a GB at 1M x 130).
VECTOR_BLOCK = 65_536


def search_vectors(X: np.ndarray, normalization, projection, learnt, embeddings: np.ndarray | None) -> np.ndarray:
    """Search vectors (float32 (n, d)) of raw features `X` (n, n_features) and their
    `embeddings` (n, EMBEDDING_DIM) or None: z-scores, projection, the learnt part, a block
    of ``VECTOR_BLOCK`` rows at a time (each row's vector is its own: rows do not mix)."""
    def block(rows: slice) -> np.ndarray:
        return learnt.vectors(projection.apply(normalization.apply(X[rows])),
                              None if embeddings is None else embeddings[rows])

    if len(X) <= VECTOR_BLOCK:
        return block(slice(None))
    first = block(slice(0, VECTOR_BLOCK))
    out = np.empty((len(X), first.shape[1]), dtype=np.float32)
    out[:VECTOR_BLOCK] = first
    for start in range(VECTOR_BLOCK, len(X), VECTOR_BLOCK):
        out[start:start + VECTOR_BLOCK] = block(slice(start, start + VECTOR_BLOCK))
    return out


def _save_index(site_dir: Path, fingerprint: str, index) -> str:
    """Write the FAISS file atomically (FAISS writes a temporary file, renamed over the
    name), remove index files of older fingerprints; returns the file's SHA-1 for the config."""
    import faiss

    path = index_path(site_dir, fingerprint)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")   # sitedb.remove_orphan_temporaries' pattern
    faiss.write_index(index, str(tmp))
    digest = _file_sha1(tmp)
    os.replace(tmp, path)
    for old in Path(site_dir).glob("index-*.faiss"):
        if old != path:
            old.unlink(missing_ok=True)
    return digest


def _file_sha1(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha1").hexdigest()


def read_index_file(site_dir: Path, config: dict):
    """The FAISS index of the ``index`` config `config` from its file, or None when the
    file is missing, damaged, of another number of cells, or not the file the config was
    saved with (its SHA-1; a config without one is checked by size alone)."""
    import faiss

    path = index_path(site_dir, config["fingerprint"])
    if not path.is_file():
        log.info("%s: search index file missing; rebuilding it from the database", site_dir)
        return None
    if config.get("index_sha1") not in (None, _file_sha1(path)):
        log.warning("%s: not the file this index was saved with; rebuilding it from the database", path)
        return None
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as exc:  # FAISS's error for a damaged file
        log.warning("%s: unreadable (%s); rebuilding it from the database", path, str(exc).splitlines()[0])
        return None
    return index if index.ntotal == config["n_cells"] else None


def _load_or_rebuild_faiss(db: SiteDB, config: dict):
    """The site's FAISS index: read from its file (``read_index_file``), or rebuilt from
    the database vectors with the stored config (same z-scores, same features) and saved,
    the config then naming the new file."""
    index = read_index_file(db.site_dir, config)
    if index is None:
        index = similarity.build_index(stored_vectors(db, config), config["algorithm"])
        config["index_sha1"] = _save_index(db.site_dir, config["fingerprint"], index)
        with db.transaction():
            db.set_config("index", config)
    if "nprobe" in config:
        index.nprobe = config["nprobe"]
    return index


# ---------------------------------------------------------------- the facade


def emb_dim(embedder) -> int:
    """Width of a network's embedding (0 without one), for the algorithm's name."""
    return 0 if embedder is None else int(embedder.params["embed_w"].shape[1])


class SiteIndex:
    """A site's cells and search index in memory (see the module docstring)."""

    def __init__(self, site_dir: Path, config: dict, index, cells: CellColumns, feature_names: list[str],
                 vocabulary: dict | None = None):
        from pathmaster.vocabulary import Vocabulary, vocabulary_for_labels

        self.site_dir = Path(site_dir)
        # The site's diagnosis vocabulary (``pathmaster.vocabulary``); a database indexed
        # before sites declared one gets the built-in vocabulary that holds its labels.
        self.vocabulary = (Vocabulary.from_dict(vocabulary, self.site_dir) if vocabulary
                           else vocabulary_for_labels(cells.diagnoses))
        self.config = config
        self.feature_names = list(feature_names)
        self._index = index
        self._normalization = similarity.Normalization.from_dict(config["normalization"])
        self._projection = similarity.Projection.from_dict(config["projection"])
        from pathmaster.embedding import LearntSimilarity
        from pathmaster.learnt import load_learnt

        # What the site compares besides its features, and its abnormality score
        # (pathmaster.learnt); the network is NumPy weights, None without one.
        self.learnt = LearntSimilarity.from_dict(config.get("learnt"))
        self.embedder = load_learnt(self.site_dir, self.learnt)
        from pathmaster.abnormality import FeatureClassifier

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
                from pathmaster.growth import update_search_index

                log.info("%s: index out of date with the database; bringing it up to date", site_dir)
                config, cells = update_search_index(db), db.cell_columns()
            index = _load_or_rebuild_faiss(db, config)
            site = cls(site_dir, config, index, cells, db.get_config("feature_names"), db.get_config("vocabulary"))
            site.feature_schema = db.get_config("feature_schema") or "unknown"
            site.pixel_um = db.get_config("pixel_um")
            return site

    def __len__(self) -> int:
        return len(self._cells)

    @property
    def algorithm(self) -> str:
        """The comparison algorithm, e.g. ``faiss-flat-l2/zscore/forward-12of115``, with a learnt
        embedding ``.../zscore/lda-130of130+6axes+cnn64@0.5`` (fused, its weight) or ``.../cnn64``
        (`similarity.Projection.describe`)."""
        features = f"zscore/{self._projection.describe(len(self.feature_names))}"
        learnt = self.learnt
        compared = {"features": features, "embedding": f"cnn{emb_dim(self.embedder)}",
                    "fused": f"{features}+cnn{emb_dim(self.embedder)}@{learnt.embedding_weight:g}"}[learnt.mode]
        return f"{similarity.describe(self._index)}/{compared}"

    def similarity_note(self) -> str:
        """What the site compares and why, in a line (its cross-validation's choice, or why
        it could not learn), then which abnormality score it chose and how it ranked its
        held-out cells, and whether the training guard cut the network's epochs."""
        report = self.learnt.report or {}
        if "reason" in report:
            note = f"features alone: {report['reason']}"
        else:
            chosen = report.get("candidates", {}).get(f"{self.learnt.mode}:{float(self.learnt.embedding_weight)}", {})
            note = (f"{self.learnt.mode} chosen by the site's {report.get('folds', '?')}-fold cross-validation"
                    f"{' (grouped by slide image)' if report.get('grouped') else ''}: top-1 {chosen.get('top1', 0):.3f}")
        point = (report.get("scores") or {}).get(self.learnt.score)
        if point:
            note += f"; abnormality by {self.learnt.score} (held-out ROC AUC {point['auc']:.3f})"
        final = report.get("final") or {}
        if final.get("cut_by_time"):
            note += f"; training cut to {final['epochs']} of {final['planned_epochs']} epochs by its time guard"
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
        """The site's embeddings (m, d) of patches (m, S, S, 3) (``CellAnalysis.patch``), or
        None when the site has no network."""
        return None if self.embedder is None else self.embedder.embed(patches)

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
        return self.learnt.vectors(vectors, embeddings)

    def _check_embeddings(self, embeddings, rows: int) -> None:
        from pathmaster.embedding import EMBEDDING_DIM

        if embeddings is None:
            raise InvalidInput("this site compares its learnt embedding too: send the cell's image, or its "
                               f"embedding by the site's network {self.learnt.model[:16]}")
        shape = np.shape(embeddings)
        if shape != (rows, EMBEDDING_DIM) or not np.isfinite(embeddings).all():
            raise InvalidInput(f"embeddings must be {rows} finite rows of {EMBEDDING_DIM} values, got shape {shape}")

    def abnormality(self, embeddings: np.ndarray | None, matches: list[list[Match]],
                    features: np.ndarray | None = None) -> list[float]:
        """Each query's abnormality score in [0, 1] (``learnt.abnormal_score``: the network's
        probability of an abnormal label, the share of abnormal labels among its k nearest
        matches, or the feature classifier's probability from the raw ``features`` (m,
        n_features)); a cell is called abnormal at ``self.learnt.threshold`` or above."""
        from pathmaster.embedding import neighbour_share

        abnormal = set(self.vocabulary.abnormal)
        network = (self.embedder.abnormal_probability(embeddings) if self.embedder is not None
                   and embeddings is not None else [None] * len(matches))
        reads_classifier = self.learnt.score in ("classifier", "ensemble")
        by_features = ([None] * len(matches) if self.classifier is None or features is None or not reads_classifier
                       else self.classifier.abnormal_probability(self._normalization.apply(np.atleast_2d(features))))
        return [self.learnt.abnormal_score(p, neighbour_share([m.diagnosis for m in row], abnormal, self.learnt.k), c)
                for p, row, c in zip(network, matches, by_features)]

    def search_many(self, features: np.ndarray, k: int = defaults.K,
                    columns: list[int] | None = None, embeddings: np.ndarray | None = None) -> list[list[Match]]:
        """Top-k database cells for each row of ``features`` (m, n_features), nearest first.

        With `columns` (the site's ``compared_columns``) the rows hold only those values.
        `embeddings` (m, EMBEDDING_DIM): the cells' embeddings by the site's network
        (``embed``), needed when the site compares them (InvalidInput otherwise)."""
        if k < 1:
            raise InvalidInput(f"k must be at least 1, got {k}")
        if columns:
            features = self.expand(features, columns)
        distances, ids = similarity.search(self._index, self._vectors(features, embeddings), min(k, len(self)))
        cells = self._cells
        return [[Match(cells.cell_id(i), cells.diagnosis(i), float(d), cells.source_id(i))
                 for d, i in zip(row_d.tolist(), row_i.tolist()) if i >= 0]
                for row_d, row_i in zip(distances, ids)]

    def search(self, features: np.ndarray, k: int = defaults.K, columns: list[int] | None = None,
               embedding: np.ndarray | None = None) -> list[Match]:
        """Top-k database cells for one feature vector (n_features,), nearest first (with
        `columns`: only the values of those; `embedding` (EMBEDDING_DIM,): as ``search_many``)."""
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
        """The stored row of a cell (a ``sitedb.CellRow`` without features), read from the
        database; KeyError if unknown."""
        return self._read(lambda conn: read_cell(conn, cell_id))

    def vectors(self) -> np.ndarray:
        """The database's index vectors (float32, (n_cells, d)), in cell order, for evaluation."""
        with SiteDB(self.site_dir) as db:
            _, X = db.feature_matrix()
            return _index_vectors(db, X, self._normalization, self._projection, self.learnt)

    def cells_with_hash(self, digest: str) -> list[str]:
        """Ids of the database cells whose pixels hash to ``digest`` (``sitedb.image_hash``):
        a query that is already in the database."""
        from pathmaster.sitedb import cells_with_hash

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
