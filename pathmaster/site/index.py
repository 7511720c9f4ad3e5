"""Building a site's search index: what it fits to its cells and the FAISS index over them.

``build_search_index(db)`` fits the database statistics for the z-scores, the feature subset
or weighting chosen from the data and what the site learns on top of its eye
(``pathmaster.site.fitting``), and builds the FAISS index. All of it is stored in the database's
``index`` config; the FAISS file is named by the database's fingerprint and the config holds
its SHA-1, so a missing, damaged or stale file (another set of cells, another representation)
is rebuilt from the database, never trusted. FAISS writes and reads the file itself
(``faiss.write_index``, ``faiss.read_index``): no copy of a million vectors in between.
``pathmaster.site.growth`` keeps the index up to date as cells come and go; ``pathmaster.site``
serves it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import numpy as np

from pathmaster import defaults
from pathmaster.learning import similarity
from pathmaster.site import faiss_index
from pathmaster.records import InvalidInput
from pathmaster.site.database import SiteDB

log = logging.getLogger(__name__)

# Choosing features from the data needs enough labelled cells for cross-validated
# leave-one-out scores to mean something; below this every feature counts equally.
MIN_CELLS_FOR_SELECTION = 30
# Queries (database cells) used to measure an approximate index's recall against exact.
RECALL_QUERIES = 500
TARGET_RECALL = 0.95


def index_path(site_dir: Path, fingerprint: str) -> Path:
    return Path(site_dir) / f"index-{fingerprint[:16]}.faiss"


FEATURE_CHOICES = ("auto", *similarity.PROJECTIONS)


def build_search_index(db: SiteDB, *, algorithm: str | None = None, features: str | None = None,
                       seed: int = 0, similarity_choice: str | None = None, eye: dict | None = None) -> dict:
    """Fit z-scores and the feature subset to the database, build and save the FAISS index.

    algorithm: "flat", "ivf", "hnsw", or None for the site's stored choice (default: exact
    below ``faiss_index.EXACT_LIMIT`` cells, IVF above). features: "auto" (the best of
    all features, Fisher weights, forward selection and linear discriminant axes learnt
    from the site's labels, by cross-validated retrieval,
    ``similarity.choose_projection``), or one of ``similarity.PROJECTIONS`` to force it;
    None for the site's stored choice (default "auto").
    similarity_choice: "auto" (the site's cross-validation picks features, what its eye
    sees through its lens, or both fused, ``pathmaster.site.fitting``), or one of them to force
    it; None for the stored choice (default "auto").
    eye: the eye's options, {"views": ..., "resolution": ...} or either alone
    (``fitting.eye_options``), the rest as stored; None for the stored ones (default the eye's).
    Returns the ``index`` config written to the database.
    """
    from pathmaster.learning.policy import LearntSimilarity
    from pathmaster.site import fitting

    options = db.get_config("index_options", {"algorithm": "auto", "features": "auto"})
    options.setdefault("similarity", "auto")
    if similarity_choice is not None:
        options["similarity"] = similarity_choice
    options.pop("learn_seconds", None)
    if algorithm is not None:
        options["algorithm"] = algorithm
    if features is not None:
        options["features"] = features
    if options["algorithm"] not in ("auto", *faiss_index.ALGORITHMS):
        raise InvalidInput(f"unknown search algorithm {options['algorithm']!r}; known: auto, {', '.join(faiss_index.ALGORITHMS)}")
    if options["features"] not in FEATURE_CHOICES:
        raise InvalidInput(f"unknown feature choice {options['features']!r}; known: {', '.join(FEATURE_CHOICES)}")
    if options["similarity"] not in fitting.SIMILARITY_CHOICES:
        raise InvalidInput(f"unknown similarity {options['similarity']!r}; known: "
                           f"{', '.join(fitting.SIMILARITY_CHOICES)}")
    options["eye"] = fitting.eye_options(options.get("eye"), **(eye or {}))
    db.set_config("index_options", options)

    names = db.get_config("feature_names")
    cell_ids, X = db.feature_matrix()
    if not cell_ids:
        raise InvalidInput("the site database has no cells yet; nothing to index", db.path)
    fingerprint = db.fingerprint()
    previous = db.get_config("index") or {}
    if (previous.get("fingerprint") == fingerprint and previous.get("features") == options["features"]
            and previous.get("similarity", "auto") == options["similarity"] and previous.get("eye") == options["eye"]):
        # Same cells, same choices: only the search structure changes, so keep the fitted
        # z-scores, feature choice and lens (fitting them is the slow part).
        normalization = similarity.Normalization.from_dict(previous["normalization"])
        projection = similarity.Projection.from_dict(previous["projection"])
        learnt = LearntSimilarity.from_dict(previous.get("learnt"))
        vectors = index_vectors(db, X, normalization, projection, learnt)
    else:
        normalization, projection = _fit_features(db, X, names, options["features"], seed)
        learnt, embeddings = fitting.fit_learnt(db, X, normalization, projection, _vocabulary(db),
                                                choice=options["similarity"], seed=seed, eye_choice=options["eye"])
        vectors = search_vectors(X, normalization, projection, learnt, embeddings)

    kind = options["algorithm"]
    if kind == "auto":
        kind = "flat" if len(vectors) <= faiss_index.EXACT_LIMIT else "ivf"
    index = faiss_index.build_index(vectors, kind, seed=seed)
    config = {"algorithm": kind, "features": options["features"], "normalization": normalization.to_dict(),
              "projection": projection.to_dict(), "n_cells": len(cell_ids), "fingerprint": fingerprint,
              "similarity": options["similarity"], "eye": options["eye"], "learnt": learnt.to_dict()}
    if kind in ("ivf", "hnsw"):
        config.update(measure_recall(index, vectors, kind, seed))
    config["index_sha1"] = save_index(db.site_dir, fingerprint, index)
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
        nprobe, recall = faiss_index.tune_nprobe(index, vectors[sample], exact, defaults.K, TARGET_RECALL,
                                                exclude=sample)
        return {"nprobe": nprobe, "recall_at_5": recall}
    _, approx = faiss_index.search(index, vectors[sample], defaults.K + 1)
    return {"recall_at_5": faiss_index.recall_at_k(faiss_index.drop_ids(approx, sample, defaults.K),
                                                  faiss_index.drop_ids(exact, sample, defaults.K))}


def stored_vectors(db: SiteDB, config: dict, offset: int = 0) -> np.ndarray:
    """The search vectors (float32 (n, d)) of the database's cells from the `offset`-th on,
    by the representation fitted and stored in the ``index`` config `config`: nothing is
    fitted again (the one place that turns stored features into index vectors)."""
    from pathmaster.learning.policy import LearntSimilarity

    _, X = db.feature_matrix(offset)
    normalization = similarity.Normalization.from_dict(config["normalization"])
    projection = similarity.Projection.from_dict(config["projection"])
    return index_vectors(db, X, normalization, projection, LearntSimilarity.from_dict(config.get("learnt")),
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
    from pathmaster.vocabulary import stored_vocabulary

    return stored_vocabulary(db.get_config("vocabulary"), (c.diagnosis for c in db.cells()), db.path)


def index_vectors(db: SiteDB, X: np.ndarray, normalization, projection, learnt, offset: int = 0) -> np.ndarray:
    """The search vectors (float32 (n, d)) of the database's cells from the `offset`-th on
    (`X` their features): their features' projection, with their lens vectors when the
    site compares them (their eye vectors from the site's store, ``fitting.eye_vectors``)."""
    from pathmaster.site import fitting
    from pathmaster.eye._vectors import eye_from

    embeddings = None
    if learnt.mode != "features":
        lens = fitting.load_learnt(db.site_dir, learnt)
        embeddings = lens.embed(fitting.eye_vectors(db, db.cells()[offset:], eye_from(lens.eye)))
    return search_vectors(X, normalization, projection, learnt, embeddings)


# Rows turned into search vectors at a time: the float64 intermediates are a block's, not a
# million cells' (each a GB at 1M x 130).
VECTOR_BLOCK = 65_536


def search_vectors(X: np.ndarray, normalization, projection, learnt, embeddings: np.ndarray | None) -> np.ndarray:
    """Search vectors (float32 (n, d)) of raw features `X` (n, n_features) and their
    lens vectors `embeddings` (n, r) or None: z-scores, projection, the learnt part, a block
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


def save_index(site_dir: Path, fingerprint: str, index) -> str:
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


def load_or_rebuild_faiss(db: SiteDB, config: dict):
    """The site's FAISS index: read from its file (``read_index_file``), or rebuilt from
    the database vectors with the stored config (same z-scores, same features) and saved,
    the config then naming the new file."""
    index = read_index_file(db.site_dir, config)
    if index is None:
        index = faiss_index.build_index(stored_vectors(db, config), config["algorithm"])
        config["index_sha1"] = save_index(db.site_dir, config["fingerprint"], index)
        with db.transaction():
            db.set_config("index", config)
    if "nprobe" in config:
        index.nprobe = config["nprobe"]
    return index
