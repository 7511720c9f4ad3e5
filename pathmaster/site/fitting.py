"""What a site learns from its own cells when it is indexed, between its database and ``pathmaster.learning``.

``fit_learnt(db, X, normalization, projection, vocabulary, ...)`` is what indexing runs after
the features are fitted: every cell's eye vector (``pathmaster.eye``, the frozen pretrained
network, on the patch of its stored image and blank slide; kept in the site directory by
the eye's id, so a cell is looked at once), then the lens and head on top and the choice of
what the site compares (``pathmaster.learning.choice.learn_similarity``); a site too small to learn
on top compares plain nearest neighbours in the eye's space, and one whose option is
"features" its features alone; either way the abnormality score and its operating point come
from the site's own cross-validation. ``load_learnt(site_dir, learnt)`` gives the stored lens
back.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from pathmaster.learning import policy
from pathmaster.analysis.cell import PATCH_PX, cell_patch
from pathmaster.eye._vectors import eye_id, eye_vectors_of
from pathmaster.learning.lens import SiteLens
from pathmaster.learning import similarity
from pathmaster.records import InvalidInput

log = logging.getLogger(__name__)

# What ``pathmaster index --similarity`` accepts: "auto" lets the site's cross-validation choose.
SIMILARITY_CHOICES = ("auto", *policy.SIMILARITY_MODES)

# The eye's options a site may be indexed with (``pathmaster index --eye-views/--eye-resolution``):
# how many rotations/flips it averages (``pathmaster.eye.VIEW_COUNTS``) and the side it resizes
# the patch to. Every cell's patch is made at ``PATCH_PX`` (the coordinator makes one per cell
# for every site), so a site's eye may only shrink it: multiples of 16 from 96 px up to it.
EYE_RESOLUTIONS = tuple(range(96, PATCH_PX + 1, 16))
# Reason codes of eye options refused (``InvalidInput.code``).
EYE_VIEWS_REFUSED = "eye_views_refused"
EYE_RESOLUTION_REFUSED = "eye_resolution_refused"


def eye_options(stored: dict | None = None, *, views: int | None = None, resolution: int | None = None) -> dict:
    """The eye's options a site is indexed with, {"resolution", "views"}: ``stored`` (its
    index options' "eye", kept by a re-index) with ``views`` / ``resolution`` given instead,
    the eye's defaults for the rest. InvalidInput (`EYE_VIEWS_REFUSED`,
    `EYE_RESOLUTION_REFUSED`) for a count of views not in ``VIEW_COUNTS`` or a side not in
    `EYE_RESOLUTIONS`."""
    from pathmaster.eye import DEFAULT_RESOLUTION, DEFAULT_VIEWS, VIEW_COUNTS

    options = {"resolution": DEFAULT_RESOLUTION, "views": DEFAULT_VIEWS, **(stored or {})}
    if views is not None:
        options["views"] = views
    if resolution is not None:
        options["resolution"] = resolution
    if set(options) != {"resolution", "views"}:
        raise InvalidInput(f"the eye's options are resolution and views, got {sorted(options)}")
    if type(options["views"]) is not int or options["views"] not in VIEW_COUNTS:
        raise InvalidInput(f"the eye averages {', '.join(map(str, VIEW_COUNTS))} views, not {options['views']!r}",
                           code=EYE_VIEWS_REFUSED)
    if type(options["resolution"]) is not int or options["resolution"] not in EYE_RESOLUTIONS:
        raise InvalidInput(f"the eye's resolution is one of {', '.join(map(str, EYE_RESOLUTIONS))} px (at most "
                           f"the patch's {PATCH_PX} px), not {options['resolution']!r}", code=EYE_RESOLUTION_REFUSED)
    return options


# The most labelled cells a site learns and scores from: the held-out neighbours take an
# (n/3 x 2n/3) float64 distance matrix (178 MB at this many) and the feature classifier
# twelve fits; a larger site learns from a seeded random sample of this many.
MAX_SCORED_CELLS = 10_000


def scored_cells(labelled: np.ndarray, seed: int) -> np.ndarray:
    """The cells (bool (n,)) a site learns and scores from: its labelled ones, or a seeded
    sample of ``MAX_SCORED_CELLS`` of them."""
    chosen = np.flatnonzero(labelled)
    if len(chosen) <= MAX_SCORED_CELLS:
        return labelled
    keep = np.zeros_like(labelled)
    keep[np.random.default_rng(seed).choice(chosen, MAX_SCORED_CELLS, replace=False)] = True
    return keep


def cell_patches(db, cells, size: int) -> np.ndarray:
    """uint8 (n, size, size, 3): ``cell.cell_patch`` of each stored cell (image, slide)."""
    from pathmaster.image.io import decode_image

    patches = np.zeros((len(cells), size, size, 3), np.uint8)
    for row, cell in enumerate(cells):
        image = decode_image(db.read_file(cell.image_path), cell.image_path)
        background = (decode_image(db.read_file(cell.background_path), cell.background_path)
                      if cell.background_path else np.full_like(image, 255))
        patches[row] = cell_patch(image, background, size)
    return patches


def eye_vectors(db, cells, eye) -> np.ndarray:
    """float32 (n, eye.dim): each cell's vector by ``eye``, read from the site's store of
    them (``eye-<id>.npz``, by cell id) where it holds them, the rest computed and stored."""
    path = Path(db.site_dir) / f"eye-{eye_id(eye.describe())[:16]}.npz"
    known: dict[str, np.ndarray] = {}
    if path.exists():
        with np.load(path, allow_pickle=False) as stored:
            known = dict(zip(stored["cell_ids"].tolist(), stored["vectors"]))
    missing = [c for c in cells if c.cell_id not in known]
    if missing:
        log.info("%s: the eye looks at %d cells", db.site_dir, len(missing))
        for start in range(0, len(missing), EYE_BATCH):
            batch = missing[start:start + EYE_BATCH]
            for cell, vector in zip(batch, eye_vectors_of(eye, cell_patches(db, batch, PATCH_PX))):
                known[cell.cell_id] = vector
        _store_eye_vectors(path, known)
    return np.stack([known[c.cell_id] for c in cells]).astype(np.float32) if cells else np.zeros((0, eye.dim),
                                                                                                  np.float32)


# Cells patched and looked at together when a site computes its eye vectors (bounded memory).
EYE_BATCH = 64


def _store_eye_vectors(path: Path, vectors: dict) -> None:
    import io

    from pathmaster.files import write_atomic

    buffer = io.BytesIO()
    ids = sorted(vectors)
    np.savez(buffer, cell_ids=np.asarray(ids, dtype=str), vectors=np.stack([vectors[i] for i in ids]))
    write_atomic(path, buffer.getvalue())


def _groups(cells, labelled: np.ndarray):
    """The labelled cells' groups (slide images) when the database records them, else None."""
    groups = [getattr(c, "group", None) for c, keep in zip(cells, labelled) if keep]
    return None if any(g is None for g in groups) or not groups else np.asarray(groups, dtype=str)


def fit_learnt(db, X: np.ndarray, normalization, projection, vocabulary, *, choice: str = "auto",
               seed: int = 0, eye_choice: dict | None = None) -> tuple[policy.LearntSimilarity, np.ndarray | None]:
    """(what the site compares, its cells' lens vectors (n, r) or None when it compares its features alone).

    ``eye_choice``: the eye's options (`eye_options`; None: its defaults). Writes the lens's
    file (``SiteLens.save``) into the site directory. Raises ``pathmaster.eye.EyeUnavailable``
    when the eye cannot be opened: a site never falls back to another representation on its own.
    """
    from pathmaster.learning.choice import fitted_similarity

    cells = db.cells()
    labels = np.array([c.diagnosis for c in cells], dtype=object)
    labelled = scored_cells(np.array([label is not None for label in labels]), seed)
    abnormal_labels = set(vocabulary.abnormal)
    Z = normalization.apply(X)
    eye = vectors = None
    if choice != "features":
        from pathmaster.eye import open_eye

        eye = open_eye(**eye_options(eye_choice))
        vectors = eye_vectors(db, cells, eye)
    learnt, lens = learn_from(Z[labelled], labels[labelled].astype(str), _groups(cells, labelled), abnormal_labels,
                              projection, db.get_config("feature_names"),
                              None if vectors is None else vectors[labelled],
                              None if eye is None else eye.describe(), choice=choice, seed=seed)
    if lens is None:
        log.info("%s: comparing features alone: %s", db.site_dir, learnt.report.get("reason"))
        return learnt, None
    lens.save(db.site_dir)
    for old in Path(db.site_dir).glob("lens-*.npz"):
        if old.name != f"lens-{lens.sha256[:16]}.npz":
            old.unlink(missing_ok=True)
    # the z-scores and scales on every cell (the unlabelled too), as the index holds them
    refitted = fitted_similarity(lens.embed(vectors), projection.apply(Z))
    learnt.mean, learnt.std = refitted.mean, refitted.std
    learnt.feature_scale, learnt.embedding_scale = refitted.feature_scale, refitted.embedding_scale
    return learnt, lens.embed(vectors)


def why_not_learn(labels, abnormal_labels) -> str:
    """Why a site with these labels (None: unlabelled) learns nothing on top of its eye ("" when it does)."""
    from pathmaster.learning.choice import cannot_learn

    return cannot_learn(labels, abnormal_labels)


def learn_from(Z: np.ndarray, labels: np.ndarray, groups, abnormal_labels, projection, names: list[str],
               vectors: np.ndarray | None, eye: dict | None, *, choice: str = "auto",
               seed: int = 0) -> tuple[policy.LearntSimilarity, SiteLens | None]:
    """(what a site learns from these labelled cells, its lens or None): the feature
    classifier, then the lens, head and the choice of what to compare
    (``choice.learn_similarity``); a site too small for that, plain nearest neighbours in the
    eye's space (``choice.plain_lens``); without eye vectors (the option "features") the
    features alone. Either way the abnormality score and its operating point. Z: their
    z-scored features (n, n_features); labels: str (n,); vectors: their eye vectors (n, D).
    Indexing runs it on a site's cells, ``pathmaster evaluate`` on each training fold's."""
    from pathmaster.learning.choice import learn_similarity, plain_lens

    fit = _refit(projection, Z, labels, names, seed)
    classifier, by_features = feature_classifier(Z, labels, groups, abnormal_labels, projection.columns, seed)
    lens = None
    reason = "the site's option 'features'" if vectors is None else why_not_learn(labels, abnormal_labels)
    if vectors is None:
        learnt = features_only(fit, labels, groups, abnormal_labels, reason, seed, by_features)
    elif reason:
        lens, learnt = plain_lens(vectors, eye, reason)
    else:
        lens, learnt = learn_similarity(vectors, eye, fit, labels, groups, abnormal_labels, choice=choice,
                                              seed=seed, other_scores=by_features)
    learnt.classifier = None if classifier is None else classifier.to_dict()
    return learnt, lens


def _refit(projection, Z: np.ndarray, labels: np.ndarray, names: list[str], seed: int):
    """``fit(train) -> (train vectors, all vectors)``: the site's projection method refitted
    on the labelled cells ``train`` (z-scores ``Z``, every feature, named ``names``), so
    held-out cells shape nothing."""
    names = list(names)

    def fit(train: np.ndarray):
        if projection.method == "all" or len(set(labels[train])) < 2:
            fitted = projection
        else:
            fitted = similarity.PROJECTIONS[projection.method](Z[train], labels[train], names, seed)
        vectors = fitted.apply(Z).astype(np.float64)
        return vectors[train], vectors
    return fit


def _can_score(labels: np.ndarray, abnormal_labels) -> bool:
    """Enough labelled cells, normal and abnormal, for held-out folds to score them."""
    from pathmaster.learning.folds import INNER_FOLDS

    abnormal = np.array([label in abnormal_labels for label in labels])
    return len(labels) >= 2 * INNER_FOLDS and abnormal.any() and not abnormal.all()


def feature_classifier(Z: np.ndarray, labels: np.ndarray, groups, abnormal_labels, columns, seed: int):
    """(the site's feature classifier fitted on every labelled cell, {"classifier": its
    out-of-fold scores (n,)}), both None / {} when there are too few cells to score."""
    from pathmaster.learning import abnormality
    from pathmaster.learning.folds import inner_folds

    if not _can_score(labels, abnormal_labels):
        return None, {}
    folds = inner_folds(labels, groups, seed)
    strength, scores, _ = abnormality.choose_strength(Z, labels, abnormal_labels, columns, folds)
    return abnormality.fit_classifier(Z, labels, abnormal_labels, columns, strength), {"classifier": scores}


def features_only(fit, labels: np.ndarray, groups, abnormal_labels, reason: str, seed: int,
                  other_scores: dict | None = None) -> policy.LearntSimilarity:
    """The features alone; the abnormality score (the neighbours' share, or one of
    ``other_scores``: out-of-fold scores (n,)) the held-out folds rank best, with its
    threshold there (``thresholds.choose_site_score``: with its margin) when there are enough cells (else the neighbours'
    share at 0.5: a majority of the neighbours); and why."""
    from pathmaster.learning import neighbours
    from pathmaster.learning import thresholds
    from pathmaster.learning.folds import inner_folds

    learnt = policy.LearntSimilarity(report={"reason": reason})
    if not _can_score(labels, abnormal_labels):
        return learnt
    abnormal = np.array([label in abnormal_labels for label in labels])
    share = np.zeros(len(labels))
    for train, test in inner_folds(labels, groups, seed):
        train_vectors, vectors = fit(train)
        share[test] = neighbours.neighbour_shares(abnormal[train], neighbours.nearest(train_vectors, vectors[test],
                                                                                      learnt.k))
    scores = thresholds.with_ensemble({"neighbours": share, **(other_scores or {})})
    learnt.score, points, learnt.report["thresholds"] = thresholds.choose_site_score(scores, abnormal)
    learnt.report["scores"] = points
    learnt.report["case"] = thresholds.case_operating_point(scores[learnt.score], abnormal, groups,
                                                       points[learnt.score]["threshold"], seed)
    learnt.threshold = learnt.report["case"]["threshold"]
    return learnt


def load_learnt(site_dir: Path, learnt: policy.LearntSimilarity) -> SiteLens | None:
    """The site's lens when it compares or scores through its eye, else None.
    FileNotFoundError when its file is gone (index the site again)."""
    if not learnt.model:
        return None
    path = Path(site_dir) / f"lens-{learnt.model[:16]}.npz"
    lens = SiteLens.from_bytes(path.read_bytes())
    if lens.sha256 != learnt.model:
        raise ValueError(f"{path}: its content does not match the index's lens {learnt.model[:16]}")
    return lens
