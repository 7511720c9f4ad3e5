"""Training a site's cell embedding from its own labelled cells, with JAX, on the CPU.

``train_embedder(patches, labels, abnormal_labels)`` trains the small CNN that
``pathmaster.embedding`` defines (the forward pass is that module's ``forward``, run with
``jax.numpy``) to tell the site's diagnoses apart, from scratch, within a time budget, on
patches augmented by the 8 rotations and flips, small shifts and brightness changes. It
returns an ``embedding.Embedder`` holding NumPy weights: nothing learnt here is ever read
back through JAX, which only training imports (extra ``[learn]``).

The operating point (``operating_point``) is the project's one rule for the threshold of an
abnormality score at which held-out sensitivity reaches a target: a site chooses its own
with a margin (``choose_site_score``, ``site_threshold``), and ``pathmaster.evaluate``
chooses its training folds' by the same rule without one.

The plan: ``EPOCHS`` passes over the site's cells, or as many as ``MAX_STEPS`` batches
allow on a large site, with a cosine learning-rate decay over them, so indexing the same
cells twice learns the same network. ``seconds`` is a guard, not the plan: when the first
epochs (less the first step, which compiles) show the plan would overrun it, the run plans
fewer epochs and its report says so (``cut_by_time``).
"""

from __future__ import annotations

import functools
import time

import numpy as np

from pathmaster import embedding as emb

LEARNING_RATE = 3e-3
WEIGHT_DECAY = 1e-4
BATCH_SIZE = 64
LABEL_SMOOTHING = 0.1
# Passes over the site's cells, and the most batches one network trains on: on the
# development half of the 224 px Herlev cells (3 grouped folds) 120 epochs ranked abnormal
# cells little better than 60 (network ROC AUC 0.85 against 0.84 in the fold run both ways);
# a 1,000-cell site's two networks then train in about 3 minutes on 2 cores.
EPOCHS = 60
MAX_STEPS = 1000


def init_params(seed: int, n_classes: int, channels=emb.CHANNELS) -> dict:
    """He-initialised weights (float32 NumPy arrays) of ``embedding.forward``."""
    rng = np.random.default_rng(seed)
    params, c_in = {}, 3
    for i, c_out in enumerate(channels):
        params[f"conv{i}_w"] = rng.normal(0, np.sqrt(2 / (9 * c_in)), (3, 3, c_in, c_out)).astype(np.float32)
        params[f"conv{i}_b"] = np.zeros(c_out, np.float32)
        c_in = c_out
    params["embed_w"] = rng.normal(0, np.sqrt(2 / c_in), (c_in, emb.EMBEDDING_DIM)).astype(np.float32)
    params["embed_b"] = np.zeros(emb.EMBEDDING_DIM, np.float32)
    params["head_w"] = rng.normal(0, np.sqrt(1 / emb.EMBEDDING_DIM), (emb.EMBEDDING_DIM, n_classes)).astype(np.float32)
    params["head_b"] = np.zeros(n_classes, np.float32)
    return params


def augment(patches: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Float32 copies (n, S, S, 3) of uint8 patches, each randomly rotated/flipped (one of
    the 8), shifted by up to 3 px (wrapping blank slide round the edge) and scaled in
    brightness by up to +-10%."""
    x = patches.astype(np.float32) / 200.0
    out = np.empty_like(x)
    for i, patch in enumerate(x):
        patch = np.rot90(patch[:, ::-1] if rng.random() < 0.5 else patch, rng.integers(4))
        patch = np.roll(patch, tuple(rng.integers(-3, 4, size=2)), axis=(0, 1))
        out[i] = patch * rng.uniform(0.9, 1.1)
    return out


def _class_weights(codes: np.ndarray, n_classes: int) -> np.ndarray:
    """Per-class loss weights, inverse square root of the class's share, mean 1 over cells."""
    counts = np.bincount(codes, minlength=n_classes).astype(np.float64)
    weights = 1.0 / np.sqrt(np.maximum(counts, 1))
    weights /= (weights[codes]).mean()
    return weights.astype(np.float32)


@functools.lru_cache(maxsize=1)
def _trainer():
    """(optimizer, jitted training step): one per process, so every network a site trains
    (inner folds, final) reuses the compiled step. The learning rate is in the optimizer's
    state (set before each step), so re-planning the epochs needs no new trace."""
    import jax
    import optax

    optimizer = optax.inject_hyperparams(optax.adamw)(learning_rate=LEARNING_RATE, weight_decay=WEIGHT_DECAY)

    def loss_fn(params, x, y, class_weight):
        _, logits = emb.forward(params, x, jax.numpy)
        targets = optax.smooth_labels(jax.nn.one_hot(y, logits.shape[-1]), LABEL_SMOOTHING)
        return (optax.softmax_cross_entropy(logits, targets) * class_weight[y]).mean()

    @jax.jit
    def step(params, state, x, y, class_weight):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, class_weight)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    return optimizer, step


def train_embedder(patches: np.ndarray, labels, abnormal_labels, *, seconds: float = 600.0,
                   max_epochs: int = EPOCHS, min_epochs: int = 3, seed: int = 0) -> tuple[emb.Embedder, dict]:
    """Train the embedding network on labelled patches.

    Parameters
    ----------
    patches : ndarray of uint8, shape (n, S, S, 3)
        ``embedding.cell_patch`` of each cell.
    labels : sequence of str, length n
        Their diagnoses.
    abnormal_labels : collection of str
        The labels that count as abnormal (the site's vocabulary).
    seconds : float
        Wall-time guard: fewer epochs are planned when the first ones show the plan would
        overrun it (never fewer than ``min_epochs``).
    max_epochs, min_epochs : int
        The planned epochs (``max_epochs``, fewer when ``MAX_STEPS`` batches come first) and
        the fewest the guard may leave.
    seed : int
        Initialisation, batch order and augmentation.

    Returns
    -------
    (Embedder, dict)
        The network with NumPy weights, and what the training did (epochs planned and
        done, whether the guard cut them, seconds, the last epoch's mean loss).
    """
    import jax.numpy as jnp

    labels = np.asarray(labels).astype(str)
    classes = sorted(set(labels.tolist()))
    codes = np.searchsorted(classes, labels)
    n, n_classes = len(codes), len(classes)
    class_weight = jnp.asarray(_class_weights(codes, n_classes))
    steps_per_epoch = max(1, -(-n // BATCH_SIZE))
    planned_epochs = plan = int(np.clip(MAX_STEPS // steps_per_epoch, min(min_epochs, max_epochs), max_epochs))
    optimizer, step = _trainer()
    params = {k: jnp.asarray(v) for k, v in init_params(seed, n_classes).items()}
    state = optimizer.init(params)
    rng = np.random.default_rng(seed)
    started = time.monotonic()
    epoch, loss_sum, done, first_step_done = 0, 0.0, 0, started
    while epoch < planned_epochs:
        # every batch full (the last one topped up from the start of the order): one jit shape
        order = np.resize(rng.permutation(n), steps_per_epoch * BATCH_SIZE)
        loss_sum, epoch_started = 0.0, time.monotonic()
        for b in range(steps_per_epoch):
            batch = order[b * BATCH_SIZE:(b + 1) * BATCH_SIZE]
            progress = min(done / (planned_epochs * steps_per_epoch), 1.0)
            state.hyperparams["learning_rate"] = jnp.asarray(LEARNING_RATE * 0.5 * (1 + np.cos(np.pi * progress)))
            params, state, loss = step(params, state, augment(patches[batch], rng), codes[batch], class_weight)
            loss_sum += float(loss)
            done += 1
            if done == 1:
                first_step_done = time.monotonic()  # the first step compiles: not a step's time
        epoch += 1
        now = time.monotonic()
        if epoch <= 2 and (epoch == 2 or steps_per_epoch > 1):
            per_epoch = (now - epoch_started if epoch == 2
                         else (now - first_step_done) * steps_per_epoch / (steps_per_epoch - 1))
            remaining = (seconds - (now - started)) / max(per_epoch, 1e-3)
            planned_epochs = int(np.clip(epoch + remaining, min(min_epochs, plan), plan))
    numpy_params = {k: np.asarray(v, np.float32) for k, v in params.items()}
    abnormal = np.array([c in set(abnormal_labels) for c in classes], bool)
    report = {"epochs": epoch, "planned_epochs": plan, "cut_by_time": epoch < plan,
              "seconds": round(time.monotonic() - started, 1),
              "loss": round(loss_sum / steps_per_epoch, 4), "cells": n}
    return emb.Embedder(numpy_params, classes, abnormal), report


# ---------------------------------------------------------------- choosing what a site compares

# Fewer labelled cells than this (or fewer than two diagnoses with two cells each) and a
# site compares its features alone: a network trained on a handful of cells learns them by
# heart, and its cross-validation would choose on noise.
MIN_CELLS_TO_LEARN = 100
# Inner folds of the site's cross-validation. The first always trains a network (then one
# more trains on all cells); the others train one too while the training guard's time allows
# (``_time_for_another``), so the choice and the operating point read the network's score
# on every cell where the machine and the site's size permit, and on a third at the least.
INNER_FOLDS = 3
TRAINED_FOLDS = 1
# The operating point: the highest threshold at which the site's own held-out cells reach
# this sensitivity for abnormal cells (decision support should miss few abnormal cells: a
# missed one costs a patient more than a second look at a normal one). Evaluation's
# training folds aim at it too.
TARGET_SENSITIVITY = 0.95
# The operating point's margin for its sampling error: the threshold is the highest at which
# a one-sided Clopper-Pearson lower bound, at this confidence, of the sensitivity on the
# site's held-out abnormal cells still reaches TARGET_SENSITIVITY (``operating_point``). A
# threshold where exactly 95% of ~90 held-out abnormal cells score above it finds 0.87-1.0
# of a new fold's; the bound asks for more found cells the fewer there are, and little more
# when there are many. On the dev half's 5 folds (benchmarks/results/learn-a15ed0b) 0.8 on
# every held-out cell found 332 of 340 new abnormal cells (per fold 0.94-1.0) where the point
# estimate on a third found 323 (0.87-1.0), for 3 more of 122 normal cells flagged; 0.9 and
# 0.95 found no more and flagged 3 more.
MARGIN_CONFIDENCE = 0.8
# Thresholds the site's report records beside the one it uses, for benchmarks: the point
# estimate on the first trained fold's cells alone ("third"), on every held-out cell
# ("point"), and with the margin at these confidences.
MARGIN_RULES = (0.5, 0.8, 0.9, 0.95)
# Weights of the embedding block tried for "fused" (the feature block gets 1 - w).
FUSED_WEIGHTS = (0.3, 0.5, 0.7)


def cannot_learn(labels, abnormal_labels) -> str:
    """Why a site cannot learn from these labels ("" when it can)."""
    labelled = [label for label in labels if label is not None]
    counts = {label: labelled.count(label) for label in set(labelled)}
    if len(labelled) < MIN_CELLS_TO_LEARN:
        return f"too few labelled cells to learn from ({len(labelled)} < {MIN_CELLS_TO_LEARN})"
    if sum(c >= 2 for c in counts.values()) < 2:
        return "fewer than two diagnoses with two cells each"
    if not any(label in abnormal_labels for label in counts):
        return "no labelled cell is abnormal in the site's vocabulary"
    if all(label in abnormal_labels for label in counts):
        return "no labelled cell is normal in the site's vocabulary"
    return ""


def inner_folds(labels: np.ndarray, groups, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) index pairs: stratified, and grouped when the cells have groups (cells of
    one slide image never on both sides)."""
    import warnings

    from sklearn.model_selection import KFold, StratifiedGroupKFold, StratifiedKFold

    n_splits = INNER_FOLDS
    if max(np.unique(labels, return_counts=True)[1]) < n_splits:  # no diagnosis to spread over the folds
        return list(KFold(n_splits, shuffle=True, random_state=seed).split(labels))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        if groups is not None and len(set(groups)) >= n_splits:
            return list(StratifiedGroupKFold(n_splits, shuffle=True, random_state=seed).split(labels, labels, groups))
        return list(StratifiedKFold(n_splits, shuffle=True, random_state=seed).split(labels, labels))


def _nearest(train: np.ndarray, test: np.ndarray, k: int) -> np.ndarray:
    sq = (test * test).sum(1)[:, None] - 2 * test @ train.T + (train * train).sum(1)[None, :]
    return np.argsort(sq, axis=1, kind="stable")[:, :k]


def _majority(labels) -> str:
    from pathmaster.evaluate import majority_vote

    return majority_vote(list(labels))


def cells_needed(abnormal_cells: int, target: float = TARGET_SENSITIVITY, confidence: float | None = None) -> int:
    """How many of ``abnormal_cells`` held-out abnormal cells a threshold must find: the
    fewest whose sensitivity reaches ``target`` (``confidence`` None), or whose one-sided
    Clopper-Pearson lower bound at ``confidence`` does (scipy.stats.beta: the exact
    binomial bound). A site with too few abnormal cells for the bound to be met short of
    finding every one (under ~60 at 0.95 and 0.8) gets the point estimate: its weakest
    abnormal cell would set the threshold, and one outlier there flags most normal cells."""
    from scipy.stats import beta

    n = int(abnormal_cells)
    needed = max(int(np.ceil(target * n - 1e-9)), 1)
    if confidence is None or n == 0:
        return min(needed, max(n, 1))
    found = np.arange(needed, n + 1)
    bounded = found[beta.ppf(1.0 - confidence, found, n - found + 1) >= target]
    return int(bounded[0]) if len(bounded) and bounded[0] < n else min(needed, n)


def operating_point(scores: np.ndarray, abnormal: np.ndarray, target: float = TARGET_SENSITIVITY,
                    confidence: float | None = None) -> dict:
    """The highest threshold at which calling ``score >= threshold`` abnormal finds enough of
    these held-out cells' abnormal ones: ``target`` of them, or with ``confidence`` as many
    as its Clopper-Pearson margin asks (``cells_needed``); the most specific call that
    still meets the target. Tied scores are called alike.

    Parameters
    ----------
    scores : ndarray of float, shape (n,)
        Each cell's abnormality score.
    abnormal : ndarray of bool, shape (n,)
        Whether each cell is abnormal.
    target : float
        The sensitivity to reach, in (0, 1].
    confidence : float or None
        The margin's confidence (``MARGIN_CONFIDENCE`` for a site), None for the point
        estimate.

    Returns
    -------
    dict
        ``threshold`` (0.5 when no cell is abnormal), the ``sensitivity``, ``specificity``
        (fractions) and ROC ``auc`` there, ``abnormal_cells``, ``normal_cells`` and
        ``margin_confidence``.
    """
    from sklearn.metrics import roc_auc_score

    scores, abnormal = np.asarray(scores, np.float64), np.asarray(abnormal, bool)
    positives = np.sort(scores[abnormal])[::-1]
    needed = cells_needed(len(positives), target, confidence)
    threshold = float(positives[needed - 1]) if len(positives) else 0.5
    called = scores >= threshold
    return {"threshold": threshold, "sensitivity": float(called[abnormal].mean()) if abnormal.any() else 0.0,
            "specificity": float((~called[~abnormal]).mean()) if (~abnormal).any() else 1.0,
            "auc": float(roc_auc_score(abnormal, scores)) if 0 < abnormal.sum() < len(abnormal) else 0.5,
            "abnormal_cells": int(abnormal.sum()), "normal_cells": int((~abnormal).sum()),
            "margin_confidence": confidence}


def site_threshold(scores: np.ndarray, abnormal: np.ndarray, first: np.ndarray | None = None) -> tuple[dict, dict]:
    """(the operating point a site uses for this out-of-fold score, {rule: threshold} of the
    rules ``MARGIN_RULES`` names beside it). ``first``: bool (n,), the first trained fold's
    cells (the rule "third"), None for every cell."""
    point = operating_point(scores, abnormal, confidence=MARGIN_CONFIDENCE)
    rules = {"point": operating_point(scores, abnormal)["threshold"]}
    if first is not None:
        rules["third"] = operating_point(scores[first], abnormal[first])["threshold"]
    rules.update({f"cp{c:g}": operating_point(scores, abnormal, confidence=c)["threshold"] for c in MARGIN_RULES})
    return point, {k: round(v, 6) for k, v in rules.items()}


def choose_site_score(scores: dict, abnormal: np.ndarray, held_out: np.ndarray | None = None,
                      first: np.ndarray | None = None) -> tuple[str, dict, dict]:
    """The abnormality score a site uses and its operating point, from out-of-fold scores.

    Parameters
    ----------
    scores : dict of str to ndarray of float, shape (n,)
        Each candidate score of every cell (NaN where it has none).
    abnormal : ndarray of bool, shape (n,)
        Whether each cell is abnormal.
    held_out : ndarray of bool, shape (n,), optional
        The cells every candidate scored out of fold, on which the score is chosen
        (``choose_score`` of their ``operating_point`` with the margin); None for all.
    first : ndarray of bool, shape (n,), optional
        The first trained fold's cells (``site_threshold``'s rule "third").

    Returns
    -------
    (str, dict, dict)
        The chosen score's name; ``{name: operating_point(...)}`` on the held-out cells, the
        chosen one's replaced by its ``site_threshold`` on every cell it scored; and
        ``{rule: threshold}`` of ``MARGIN_RULES`` beside it.
    """
    held_out = np.ones(len(abnormal), bool) if held_out is None else np.asarray(held_out, bool)
    points = {name: operating_point(s[held_out], abnormal[held_out], confidence=MARGIN_CONFIDENCE)
              for name, s in scores.items()}
    score = choose_score(points)
    scored = np.isfinite(scores[score])
    points[score], rules = site_threshold(scores[score][scored], abnormal[scored],
                                          None if first is None else first[scored])
    return score, points, rules


def auc_standard_error(auc: float, abnormal_cells: int, normal_cells: int) -> float:
    """Standard error of a ROC AUC from these many abnormal and normal cells (Hanley and
    McNeil 1982, Radiology 143:29, their equation 1)."""
    q1, q2 = auc / (2 - auc), 2 * auc * auc / (1 + auc)
    variance = (auc * (1 - auc) + (abnormal_cells - 1) * (q1 - auc * auc)
                + (normal_cells - 1) * (q2 - auc * auc)) / max(abnormal_cells * normal_cells, 1)
    return float(np.sqrt(max(variance, 0.0)))


def choose_score(points: dict) -> str:
    """The abnormality score to use, of ``{name: operating_point(...)}`` on held-out cells.

    The best ROC AUC (then the best specificity at the target sensitivity: over the few
    normal cells of a held-out fold the specificity moves in steps of one cell, where the
    AUC reads every pair); but "ensemble", the mean of the others, unless the best beats
    it by more than its standard error (the one-standard-error rule, Breiman et al. 1984):
    the best of a few scores on a third of a site's cells is partly luck, and the mean of
    scores that err differently ranks new cells more steadily.
    """
    best = max(points, key=lambda name: (round(points[name]["auc"], 3), points[name]["specificity"]))
    ensemble = points.get("ensemble")
    if ensemble and "abnormal_cells" in ensemble:
        margin = auc_standard_error(ensemble["auc"], ensemble["abnormal_cells"], ensemble["normal_cells"])
        if points[best]["auc"] - ensemble["auc"] <= margin:
            return "ensemble"
    return best


def with_ensemble(scores: dict) -> dict:
    """``scores`` and, when it holds more than one, "ensemble": their mean ("mean", itself a
    mean of two of them, left out; a score missing for a cell, NaN, left out of its mean)."""
    parts = [v for name, v in scores.items() if name not in ("mean", "ensemble")]
    return {**scores, "ensemble": np.nanmean(parts, axis=0)} if len(parts) > 1 else dict(scores)


def learn_similarity(patches: np.ndarray, feature_vectors_fit, labels, groups, abnormal_labels, *,
                     choice: str = "auto", seconds: float = 180.0, k: int = 5, seed: int = 0,
                     other_scores: dict | None = None):
    """Learn a site's network and choose what it compares, by cross-validation on its cells.

    Parameters
    ----------
    patches : ndarray of uint8, shape (n, S, S, 3)
        Each labelled cell's ``embedding.cell_patch``.
    feature_vectors_fit : callable
        ``fit(train_indices) -> (train_vectors, all_vectors)``: the site's feature projection
        refitted on those cells, and every cell's vector in it (float (n, p)).
    labels : sequence of str
        The cells' diagnoses.
    groups : sequence or None
        The cells' groups (slide images), or None.
    abnormal_labels : collection of str
        The site's abnormal labels.
    choice : str
        "auto" or one of ``embedding.SIMILARITY_MODES`` to force it.
    seconds : float
        Training budget in all (shared by the inner folds' networks and the final one).
    k : int
        Neighbours for the vote and the neighbours' abnormality score.
    other_scores : dict of str to ndarray, optional
        More candidate abnormality scores: each cell's score (n,) from a model fitted
        without its ``inner_folds`` fold (e.g. the feature classifier's).

    Returns
    -------
    (Embedder, LearntSimilarity)
        The network trained on every cell, and the mode, fusion weights, abnormality score
        and threshold chosen, with every candidate's held-out figures in ``report``.
    """
    labels = np.asarray(labels).astype(str)
    abnormal = np.array([label in set(abnormal_labels) for label in labels])
    candidates = [("features", 0.0), ("embedding", 1.0)] + [("fused", w) for w in FUSED_WEIGHTS]
    oof = _inner_networks(patches, feature_vectors_fit, labels, abnormal_labels, candidates,
                          inner_folds(labels, groups, seed), seconds, k, seed)
    held_out = oof["held_out"]
    report = {"folds": INNER_FOLDS, "trained_folds": len(oof["epochs"]), "held_out_cells": int(held_out.sum()),
              "grouped": groups is not None, "epochs": oof["epochs"], "candidates": {}}
    labels_h, abnormal_h = labels[held_out], abnormal[held_out]
    for (name, w), votes in oof["votes"].items():
        report["candidates"][f"{name}:{w}"] = {"top1": float(np.mean(votes[held_out] == labels_h)),
                                               **operating_point(oof["share"][(name, w)][held_out], abnormal_h)}
    allowed = [c for c in candidates if choice == "auto" or c[0] == choice]
    mode, weight = max(allowed, key=lambda c: report["candidates"][f"{c[0]}:{c[1]}"]["top1"])
    # where no inner network scored a cell, its neighbours are those of its features
    share = np.where(held_out, oof["share"][(mode, weight)], oof["feature_share"])
    network_p = np.where(held_out, oof["network"], np.nan)
    scores = with_ensemble({"neighbours": share, "network": network_p, "mean": 0.5 * (share + network_p),
                            **(other_scores or {})})
    score, points, report["thresholds"] = choose_site_score(scores, abnormal, held_out, oof["first"])
    report["scores"] = points

    model, trained = train_embedder(patches, labels, abnormal_labels, seconds=seconds / (TRAINED_FOLDS + 1),
                                    seed=seed)
    report["final"] = trained
    embedded = model.embed(patches)
    _, all_f = feature_vectors_fit(np.arange(len(labels)))
    learnt = _fitted(embedded, all_f)
    learnt.mode, learnt.embedding_weight, learnt.model = mode, weight, model.sha256
    learnt.score, learnt.threshold, learnt.k, learnt.report = score, points[score]["threshold"], k, report
    return model, learnt


def _time_for_another(started: float, last_s: float, train_cells: int, cells: int, seconds: float) -> bool:
    """True when one more inner network (as long as the last, ``last_s``) and the final one
    (the last's time scaled by its batches) still fit in ``seconds`` from ``started``."""
    def steps(m):
        return min(MAX_STEPS, EPOCHS * -(-m // BATCH_SIZE))
    return time.monotonic() - started + last_s + last_s * steps(cells) / steps(train_cells) <= seconds


def _inner_networks(patches, feature_vectors_fit, labels, abnormal_labels, candidates, folds, seconds, k, seed):
    """Out-of-fold figures of the inner folds: each candidate's 5-nearest votes and abnormal
    share, and the network's abnormal probability, on the cells of the folds whose network was
    trained (``held_out``; the first always, the others while ``_time_for_another``); the
    features' abnormal share on every cell; the first fold's cells; each network's epochs."""
    n = len(labels)
    abnormal = np.array([label in set(abnormal_labels) for label in labels])
    oof = {"votes": {c: np.empty(n, dtype=object) for c in candidates}, "share": {c: np.zeros(n) for c in candidates},
           "network": np.zeros(n), "feature_share": np.zeros(n), "held_out": np.zeros(n, bool),
           "first": np.zeros(n, bool), "epochs": []}
    budget, started, last_s = seconds / (TRAINED_FOLDS + 1), time.monotonic(), 0.0
    for f, (train, test) in enumerate(folds):
        train_f, all_f = feature_vectors_fit(train)
        oof["feature_share"][test] = abnormal[train][_nearest(train_f, all_f[test], k)].mean(axis=1)
        if f >= TRAINED_FOLDS and not _time_for_another(started, last_s, len(train), n, seconds):
            continue
        oof["held_out"][test] = True
        oof["first"][test] = f == 0
        model, trained = train_embedder(patches[train], labels[train], abnormal_labels, seconds=budget, seed=seed + f)
        oof["epochs"].append(trained["epochs"])
        last_s = trained["seconds"]
        embedded = model.embed(patches)
        oof["network"][test] = model.abnormal_probability(embedded[test])
        similarity = _fitted(embedded[train], train_f)
        for name, w in candidates:
            similarity.mode, similarity.embedding_weight = name, w
            vectors = similarity.vectors(all_f, embedded)
            nearest = _nearest(vectors[train], vectors[test], k)
            oof["votes"][(name, w)][test] = [_majority(labels[train][row]) for row in nearest]
            oof["share"][(name, w)][test] = abnormal[train][nearest].mean(axis=1)
    return oof


def _fitted(embeddings: np.ndarray, train_features: np.ndarray):
    """A LearntSimilarity with the embedding's z-scores and both blocks' scales fitted on
    these (training) cells."""
    from pathmaster.embedding import LearntSimilarity

    mean, std = embeddings.mean(axis=0), embeddings.std(axis=0)
    std = np.where(std > 1e-6, std, 1.0)
    z = (embeddings - mean) / std
    return LearntSimilarity(mean=mean.astype(np.float64), std=std.astype(np.float64),
                            feature_scale=float(np.sqrt(np.asarray(train_features).var(axis=0).sum())) or 1.0,
                            embedding_scale=float(np.sqrt(z.var(axis=0).sum())) or 1.0)
