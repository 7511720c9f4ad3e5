"""A site's learnt similarity, between its database and the trainer.

``fit_learnt(db, X, labels, normalization, projection, ...)`` is what indexing runs after the
features are fitted: read each cell's patch from its stored image, mask and blank slide,
learn the network and choose what the site compares (``pathmaster.learn.learn_similarity``)
or, when the site cannot learn (too few labelled cells, JAX not installed, the option
"features"), keep the features and say why; either way choose the abnormality score's
operating point by the site's own cross-validation. ``load_learnt(site_dir, config)`` gives
the stored network back for inference (NumPy only).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from pathmaster import embedding as emb
from pathmaster import similarity

log = logging.getLogger(__name__)

# What ``pathmaster index --similarity`` accepts: "auto" lets the site's cross-validation choose.
SIMILARITY_CHOICES = ("auto", *emb.SIMILARITY_MODES)
# The training guard of one indexing run, in seconds of wall time (every network it trains
# together): SECONDS_PER_CELL a labelled cell, within these bounds. On a quiet machine the
# plan (``learn.EPOCHS``) finishes well inside it; a busy one trains fewer epochs instead of
# holding indexing up, and the site's report says so. It also decides how many inner folds
# train a network (``learn._time_for_another``): at 200 s a 1,000-cell site trains two of
# three (~47 s each) and the final (~70 s), so indexing stays under 300 s; a 370-cell site
# on a quiet machine trains all three.
LEARN_SECONDS = (60.0, 200.0)
SECONDS_PER_CELL = 0.3


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


def learn_budget(cells: int) -> float:
    """Seconds of training guard for a site of `cells` labelled cells."""
    return float(np.clip(cells * SECONDS_PER_CELL, *LEARN_SECONDS))


def cell_patches(db, cells) -> np.ndarray:
    """uint8 (n, S, S, 3): ``embedding.cell_patch`` of each stored cell (image, slide)."""
    from pathmaster.imageio import decode_image

    patches = []
    for cell in cells:
        image = decode_image(db.read_file(cell.image_path), cell.image_path)
        background = (decode_image(db.read_file(cell.background_path), cell.background_path)
                      if cell.background_path else np.full_like(image, 255))
        patches.append(emb.cell_patch(image, background))
    return np.stack(patches) if patches else np.zeros((0, emb.PATCH_PX, emb.PATCH_PX, 3), np.uint8)


def _groups(cells, labelled: np.ndarray):
    """The labelled cells' groups (slide images) when the database records them, else None."""
    groups = [getattr(c, "group", None) for c, keep in zip(cells, labelled) if keep]
    return None if any(g is None for g in groups) or not groups else np.asarray(groups, dtype=str)


def fit_learnt(db, X: np.ndarray, normalization, projection, vocabulary, *, choice: str = "auto",
               seconds: float | None = None, seed: int = 0) -> tuple[emb.LearntSimilarity, np.ndarray | None]:
    """(what the site compares, its cells' embeddings (n, EMBEDDING_DIM) or None).

    seconds: the training budget (None: ``learn_budget`` of the labelled cells). Writes the
    network's file (``Embedder.save``) into the site directory when one is learnt.
    """
    from pathmaster import learn

    cells = db.cells()
    labels = np.array([c.diagnosis for c in cells], dtype=object)
    labelled = scored_cells(np.array([label is not None for label in labels]), seed)
    abnormal_labels = set(vocabulary.abnormal)
    reason = why_not_learn(labels, abnormal_labels, choice)
    Z = normalization.apply(X)
    patches = cell_patches(db, cells) if not reason else None
    learnt, model = learn_from(Z[labelled], labels[labelled].astype(str), _groups(cells, labelled), abnormal_labels,
                               projection, db.get_config("feature_names"), reason,
                               None if patches is None else patches[labelled], choice=choice, seconds=seconds,
                               seed=seed)
    if model is None:
        log.info("%s: comparing features alone: %s", db.site_dir, reason)
        return learnt, None
    model.save(db.site_dir)
    for old in Path(db.site_dir).glob("embedding-*.npz"):
        if old.name != f"embedding-{model.sha256[:16]}.npz":
            old.unlink(missing_ok=True)
    embeddings = model.embed(patches)
    # the z-scores and scales on every cell (the unlabelled too), as the index holds them
    vectors = projection.apply(Z)
    refitted = learn._fitted(embeddings, vectors)
    learnt.mean, learnt.std = refitted.mean, refitted.std
    learnt.feature_scale, learnt.embedding_scale = refitted.feature_scale, refitted.embedding_scale
    return learnt, embeddings


def why_not_learn(labels, abnormal_labels, choice: str = "auto") -> str:
    """Why a site with these labels (None: unlabelled) compares its features alone ("" when
    it learns a network): its option, too few cells (``learn.cannot_learn``), no trainer."""
    from pathmaster import learn

    if choice == "features":
        return "the site's option 'features'"
    reason = learn.cannot_learn(labels, abnormal_labels)
    if not reason:
        try:
            import jax  # noqa: F401
            import optax  # noqa: F401
        except ImportError:
            reason = "the trainer is not installed (pathmaster-qos[learn])"
    return reason


def learn_from(Z: np.ndarray, labels: np.ndarray, groups, abnormal_labels, projection, names: list[str],
               reason: str, patches: np.ndarray | None, *, choice: str = "auto", seconds: float | None = None,
               seed: int = 0) -> tuple[emb.LearntSimilarity, emb.Embedder | None]:
    """(what a site learns from these labelled cells, its network or None): the feature
    classifier, then the network and the choice of what to compare (``learn.learn_similarity``)
    or, with a ``reason`` not to learn, the features alone; either way the abnormality score
    and its operating point. Z: their z-scored features (n, n_features); labels: str (n,);
    patches: uint8 (n, S, S, 3) (None with a reason). Indexing runs it on a site's cells,
    ``pathmaster evaluate`` on each training fold's."""
    from pathmaster import learn

    fit = _refit(projection, Z, labels, names, seed)
    classifier, by_features = feature_classifier(Z, labels, groups, abnormal_labels, projection.columns, seed)
    model = None
    if reason:
        learnt = features_only(fit, labels, groups, abnormal_labels, reason, seed, by_features)
    else:
        model, learnt = learn.learn_similarity(patches, fit, labels, groups, abnormal_labels, choice=choice,
                                               seconds=seconds or learn_budget(len(labels)), seed=seed,
                                               other_scores=by_features)
    learnt.classifier = None if classifier is None else classifier.to_dict()
    return learnt, model


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
    from pathmaster import learn

    abnormal = np.array([label in abnormal_labels for label in labels])
    return len(labels) >= 2 * learn.INNER_FOLDS and abnormal.any() and not abnormal.all()


def feature_classifier(Z: np.ndarray, labels: np.ndarray, groups, abnormal_labels, columns, seed: int):
    """(the site's feature classifier fitted on every labelled cell, {"classifier": its
    out-of-fold scores (n,)}), both None / {} when there are too few cells to score."""
    from pathmaster import abnormality, learn

    if not _can_score(labels, abnormal_labels):
        return None, {}
    folds = learn.inner_folds(labels, groups, seed)
    strength, scores, _ = abnormality.choose_strength(Z, labels, abnormal_labels, columns, folds)
    return abnormality.fit_classifier(Z, labels, abnormal_labels, columns, strength), {"classifier": scores}


def features_only(fit, labels: np.ndarray, groups, abnormal_labels, reason: str, seed: int,
                  other_scores: dict | None = None) -> emb.LearntSimilarity:
    """The features alone; the abnormality score (the neighbours' share, or one of
    ``other_scores``: out-of-fold scores (n,)) the held-out folds rank best, with its
    threshold there (``learn.choose_site_score``: with its margin) when there are enough cells (else the neighbours'
    share at 0.5: a majority of the neighbours); and why."""
    from pathmaster import learn

    learnt = emb.LearntSimilarity(report={"reason": reason})
    if not _can_score(labels, abnormal_labels):
        return learnt
    abnormal = np.array([label in abnormal_labels for label in labels])
    share = np.zeros(len(labels))
    for train, test in learn.inner_folds(labels, groups, seed):
        train_vectors, vectors = fit(train)
        nearest = learn._nearest(train_vectors, vectors[test], learnt.k)
        share[test] = abnormal[train][nearest].mean(axis=1)
    scores = learn.with_ensemble({"neighbours": share, **(other_scores or {})})
    learnt.score, points, learnt.report["thresholds"] = learn.choose_site_score(scores, abnormal)
    learnt.threshold = points[learnt.score]["threshold"]
    learnt.report["scores"] = points
    return learnt


def load_learnt(site_dir: Path, learnt: emb.LearntSimilarity) -> emb.Embedder | None:
    """The site's network (NumPy) when it compares or scores with one, else None.
    FileNotFoundError when its file is gone (index the site again)."""
    if not learnt.model:
        return None
    path = Path(site_dir) / f"embedding-{learnt.model[:16]}.npz"
    model = emb.Embedder.from_bytes(path.read_bytes())
    if model.sha256 != learnt.model:
        raise ValueError(f"{path}: its content does not match the index's model {learnt.model[:16]}")
    return model
