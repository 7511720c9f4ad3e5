"""A site that grows without a rebuild: new cells join its search index, cells leave it or
change diagnosis, and what the site learnt from its cells is kept until it is learnt again.

What a site fits to its cells when it is indexed (``pathmaster.site.index.build_search_index``:
the z-scores, the feature choice or weighting, anything else it learns) is its
*representation*; everything else in the ``index`` config is the search structure. After
cells are added, ``update_search_index`` keeps the representation and adds the new cells'
vectors to the FAISS index (``index.add``): the search then answers exactly as a search
index built afresh over every cell with that representation would. It is fitted again
only when the administrator asks (``pathmaster index --relearn``) or when the site's own
drift check finds the new cells unlike the ones it was fitted to (``drift``). Removing
cells rebuilds the search structure from the stored vectors, representation kept;
relabelling changes no vector (a representation learnt from labels is re-learnt on
``--relearn``).

The ``index`` config says what the representation is and what it was fitted on
(``representation``: an id over its fitted parts, the cells it was fitted to, the cells
added and removed since, the last drift check), so a site reports it truthfully.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np

from pathmaster.site import faiss_index
from pathmaster.records import InvalidInput
from pathmaster.site.database import SiteDB

log = logging.getLogger(__name__)

# The search structure's keys of the ``index`` config; every other key is what the site fitted.
STRUCTURE_KEYS = frozenset({"algorithm", "n_cells", "fingerprint", "nprobe", "recall_at_5", "representation",
                            "index_sha1"})
# The drift check: new cells whose distances to their nearest cell of a reference sample
# of the database are larger than those of the database's own cells (one-sided
# Mann-Whitney U) with p below DRIFT_P and a large effect (Vargha and Delaney's A >= 0.71:
# a new cell is farther than an old one in at least 71% of pairs) have drifted. Fewer new
# cells than DRIFT_MIN_CELLS are not tested.
DRIFT_P = 0.01
DRIFT_EFFECT = 0.71
DRIFT_MIN_CELLS = 20
DRIFT_SAMPLE = 300         # cells of each side compared, at most (plenty for a large effect)
DRIFT_REFERENCE = 10_000   # database cells they are compared against, at most


def representation_id(config: dict) -> str:
    """16 hex digits identifying a site's fitted representation (every non-structure key
    of its ``index`` config): the same while it is kept, new when it is fitted again."""
    fitted = {key: value for key, value in config.items() if key not in STRUCTURE_KEYS}
    return hashlib.sha1(json.dumps(fitted, sort_keys=True, default=str).encode()).hexdigest()[:16]


def representation(config: dict) -> dict:
    """{"id", "fitted_cells", "fitted_fingerprint", "added", "removed", "drift"}: the fitted
    representation of an ``index`` config and what happened since it was fitted."""
    stored = config.get("representation") or {}
    return {"id": representation_id(config), "fitted_cells": stored.get("fitted_cells", config["n_cells"]),
            "fitted_fingerprint": stored.get("fitted_fingerprint", config["fingerprint"]),
            "added": stored.get("added", 0), "removed": stored.get("removed", 0), "drift": stored.get("drift")}


def drift(reference: np.ndarray, old: np.ndarray, new: np.ndarray) -> dict:
    """Whether the `new` cells' vectors (m, d) lie farther from the database's cells
    `reference` (a sample, (r, d)) than other database cells `old` ((n, d), none of them in
    `reference`) do.

    Returns {"drifted", "p", "effect", "new_cells"}: the one-sided Mann-Whitney U test of the
    new cells' distances to their nearest reference cell against the old cells', and
    Vargha and Delaney's A effect size; see the module's constants.
    """
    from scipy.stats import mannwhitneyu

    if len(new) < DRIFT_MIN_CELLS or len(old) < DRIFT_MIN_CELLS:
        return {"drifted": False, "p": None, "effect": None, "new_cells": len(new)}
    index = faiss_index.build_index(reference)
    d_new = faiss_index.search(index, new, 1)[0][:, 0]
    d_old = faiss_index.search(index, old, 1)[0][:, 0]
    test = mannwhitneyu(d_new, d_old, alternative="greater")
    effect = float(test.statistic) / (len(d_new) * len(d_old))
    return {"drifted": bool(test.pvalue < DRIFT_P and effect >= DRIFT_EFFECT), "p": float(test.pvalue),
            "effect": round(effect, 4), "new_cells": len(new)}


def _sample(n: int, size: int, seed: int) -> np.ndarray:
    return np.sort(np.random.default_rng(seed).choice(n, min(n, size), replace=False))


def _vectors_in(index, rows: np.ndarray) -> np.ndarray:
    """Rows of the vectors stored in a FAISS index (flat, IVF-flat or HNSW-flat), float32 (len(rows), d)."""
    import faiss

    if isinstance(index, faiss.IndexIVF):
        index.make_direct_map()
    return np.ascontiguousarray(index.reconstruct_batch(np.asarray(rows, dtype=np.int64)), dtype=np.float32)


def update_search_index(db: SiteDB, *, algorithm: str | None = None, features: str | None = None,
                        relearn: bool = False, similarity_choice: str | None = None, seed: int = 0,
                        eye: dict | None = None) -> dict:
    """Bring the site's search index up to date with its database; returns the ``index`` config.

    Fits the representation (``index.build_search_index``) when there is none yet, when
    `relearn`, when `features` asks for another feature choice than the stored one, or
    `similarity_choice` asks for another (features, embedding, fused, auto), or `eye` other
    options of the eye (``fitting.eye_options``), or when the new cells have drifted (``drift``). Otherwise keeps it: cells appended since
    are added to the FAISS index; after removals the structure is rebuilt from the stored
    vectors. `algorithm`: another search structure ("flat", "ivf", "hnsw"; rebuilt from
    the stored vectors), None to keep it.
    """
    from pathmaster.site.fitting import eye_options
    from pathmaster.site.index import build_search_index, read_index_file

    previous = db.get_config("index")
    options = db.get_config("index_options", {"algorithm": "auto", "features": "auto"})
    new_features = features is not None and features != options.get("features")
    new_similarity = similarity_choice is not None and similarity_choice != options.get("similarity", "auto")
    new_eye = eye is not None and eye_options(options.get("eye"), **eye) != eye_options(options.get("eye"))
    if previous is None or relearn or new_features or new_similarity or new_eye:
        if previous is not None:
            db.set_config("index", None)   # nothing is kept: build_search_index fits afresh
        return build_search_index(db, algorithm=algorithm, features=features, seed=seed,
                                  similarity_choice=similarity_choice, eye=eye)
    if algorithm is not None:
        if algorithm not in ("auto", *faiss_index.ALGORITHMS):
            raise InvalidInput(f"unknown search algorithm {algorithm!r}; known: auto, "
                               f"{', '.join(faiss_index.ALGORITHMS)}")
        db.set_config("index_options", {**options, "algorithm": algorithm})
    fingerprint, n_cells = db.fingerprint(), len(db)
    if n_cells == 0:
        raise InvalidInput("the site database has no cells left; nothing to index", db.path)
    kind = algorithm or options.get("algorithm", "auto")
    if kind == "auto":
        kind = "flat" if n_cells <= faiss_index.EXACT_LIMIT else "ivf"
    if fingerprint == previous["fingerprint"] and kind == previous["algorithm"]:
        return previous
    grown = (kind == previous["algorithm"] and n_cells > previous["n_cells"]
             and db.fingerprint(previous["n_cells"]) == previous["fingerprint"])
    index = read_index_file(db.site_dir, previous) if grown else None
    state = representation(previous)
    if index is not None:
        new = _new_vectors(db, previous)
        rows = np.random.default_rng(seed).permutation(index.ntotal)[:DRIFT_SAMPLE + DRIFT_REFERENCE]
        cut = min(DRIFT_SAMPLE, len(rows) // 2)   # old cells tested; the rest is the reference
        old, reference = _vectors_in(index, np.sort(rows[:cut])), _vectors_in(index, np.sort(rows[cut:]))
        state["drift"] = drift(reference, old, new[_sample(len(new), DRIFT_SAMPLE, seed)])
        if state["drift"]["drifted"]:
            log.warning("%s: the %d new cells have drifted from the ones the site was fitted to (%s); "
                        "fitting it again", db.site_dir, len(new), state["drift"])
            db.set_config("index", None)
            config = build_search_index(db, seed=seed)
            config["representation"] = {**representation(config), "refitted_for_drift": state["drift"]}
            with db.transaction():
                db.set_config("index", config)
            return config
        index.add(new)
        state["added"] += len(new)
    else:   # removed or reordered cells, another structure, or no usable file: rebuilt, representation kept
        from pathmaster.site.index import stored_vectors

        index = faiss_index.build_index(stored_vectors(db, previous), kind, seed=seed)
        state["removed"] += max(0, previous["n_cells"] - n_cells)
        state["added"] += max(0, n_cells - previous["n_cells"])
    return _save(db, previous, index, kind, state, seed)


def _new_vectors(db: SiteDB, previous: dict) -> np.ndarray:
    from pathmaster.site.index import stored_vectors

    return np.ascontiguousarray(stored_vectors(db, previous, offset=previous["n_cells"]), dtype=np.float32)


def _save(db: SiteDB, previous: dict, index, kind: str, state: dict, seed: int) -> dict:
    """Store the grown index and its config (structure keys new, representation kept)."""
    from pathmaster.site.index import measure_recall, save_index

    fingerprint = db.fingerprint()
    config = {key: value for key, value in previous.items() if key not in STRUCTURE_KEYS}
    config.update(algorithm=kind, n_cells=int(index.ntotal), fingerprint=fingerprint)
    if kind in ("ivf", "hnsw"):
        config.update(measure_recall(index, index.reconstruct_n(0, index.ntotal), kind, seed))
    state.pop("id", None)
    config["representation"] = state
    config["index_sha1"] = save_index(db.site_dir, fingerprint, index)
    with db.transaction():
        db.set_config("index", config)
    return config


def remove_cells(site_dir: str | Path, cell_ids: list[str]) -> dict:
    """Remove cells from a site: their rows, then their files; the search index follows
    (representation kept). Returns the ``index`` config. KeyError naming an unknown id."""
    with SiteDB(site_dir) as db:
        with db.transaction():
            rows = db.remove_cells(list(dict.fromkeys(cell_ids)))
        for row in rows:   # rows first: a kill here leaves only files nothing points at
            for relative in (row.image_path, row.thumbnail_path, row.mask_path, row.background_path):
                if relative:
                    (Path(site_dir) / relative).unlink(missing_ok=True)
        return update_search_index(db)


def relabel_cell(site_dir: str | Path, cell_id: str, diagnosis: str) -> str:
    """Give a cell another diagnosis, a label of the site's vocabulary (InvalidInput
    otherwise; KeyError for an unknown id). Returns the label stored. Its vector, and the
    representation, are unchanged until the site re-learns."""
    from pathmaster.vocabulary import site_vocabulary

    with SiteDB(site_dir) as db:
        vocabulary = site_vocabulary(db)
        label = vocabulary.label(diagnosis, db.path)
        with db.transaction():
            db.set_diagnosis(cell_id, label)
        return label
