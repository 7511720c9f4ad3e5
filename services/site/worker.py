"""The work a site does for one cell, and the Ray actor that does it.

`SiteWorker` holds one `SiteIndex` (SQLite metadata + FAISS index, loaded once when the
worker starts) and analyses one encoded cell at a time: decode, segment/estimate what
the user did not send, extract features, search, attach thumbnails; the result is a
`CellOutcome`. It is a plain class, so the same code runs in the site server's own process
(`search_in_server`, tests) and as a Ray actor (`start_workers`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np
import ray

from pathmaster.analysis.budget import AnalysisPool, CellBudget, CellStopped
from pathmaster import defaults
from pathmaster.image.io import wire_thumbnail
from pathmaster.records import InvalidInput
from pathmaster.site.search import Match
from pathmaster.image.synth import GENERATOR
from services.analysis import PRELOAD, analyse_encoded_cell
from services.cells import check_cell_size, decode_cell
from services.shared import WARM_UP_SEED
from services.ray_local import RAY_OUT_OF_ORDER, RAY_TASK_EVENTS
from services.site.explain import RERANK_CANDIDATES, Explainer

SITE_RESOURCE_PER_WORKER = 0.001  # of a site's Ray placement resource (a node that holds its
                                  # database offers 1), asked by each of its actors and index builds:
                                  # it pins them to that node without limiting how many run there
WIRE_THUMBNAIL_PX = 48     # a match's inline thumbnail; full images on demand, cached by content hash
# WebP at quality 80: ~300 B a real cell (Herlev), half a JPEG's at about its fidelity, so a
# site's 30 matches fit in one initial congestion window. Every browser the page supports shows WebP.
WIRE_THUMBNAIL_FORMAT = "WEBP"
WIRE_THUMBNAIL_QUALITY = 80
WARM_UP_THUMBNAILS = 1024       # database cells whose wire thumbnails a site worker makes at start
                                # (~3 ms each): a case's search then costs the same whether or not
                                # its matches were seen before

log = logging.getLogger("pathmaster.site")
SYNTHETIC = "synthetic"  # what SiteInfo.database_origins calls cells PathMaster generated


@dataclass(frozen=True)
class CellOutcome:
    """What a site worker returns for one test cell; the site server turns it into the
    wire's `CellResult` (server.py `cell_result`).

    matches: the database cells found (`pathmaster.site.search.Match`), nearest first;
    thumbnails: a small WebP of each (sized for the wire), in the same order;
    image_sha256: the content hash of each one's full image (a client's cache key);
    bethesda: each one's diagnosis in The Bethesda System's terms, by the site's vocabulary;
    similarity and measures: how close each is, comparably, and why (services/site/explain.py). error: why the cell could not be
    analysed (bad input, naming the cell), "" when it was. Times in seconds: extraction_s
    decoding to features, search_s the search and reading the thumbnails.
    """

    query_cell_id: str
    matches: tuple[Match, ...] = ()
    thumbnails: tuple[bytes, ...] = ()
    image_sha256: tuple[str, ...] = ()
    bethesda: tuple[str, ...] = ()   # each match's diagnosis in Bethesda terms ("" when unmapped)
    similarity: tuple[float, ...] = ()  # each match's comparable similarity (explain.Explainer)
    same_cell: tuple[bool, ...] = ()    # each match's image is the test cell's (sitedb.image_hash)
    measures: tuple[tuple[dict, ...], ...] = ()  # each match's measures (explain.Explainer.measures)
    background_estimated: bool = False
    mask_estimated: bool = False
    error: str = ""
    extraction_s: float = 0.0
    search_s: float = 0.0
    abnormal_score: float | None = None  # the site's per-cell score (SiteIndex.abnormality)
    abnormal: bool = False               # the score reaches the site's operating point


# ------------------------------------------------------------------ the work the site server sends
# Each is one call of a worker's method (services/dispatch.py runs `worker.<method>(*record)`);
# records and not bare tuples, so that a reader of either end sees the fields.


class AnalyseCell(NamedTuple):
    """Analyse one encoded cell and search its matches (`SiteWorker.analyse`)."""

    cell_id: str
    image: bytes
    background: bytes            # b"": not sent (estimated)
    mask: bytes                  # b"": not sent (segmented)
    k: int
    deadline: float | None       # time.time() after which the answer is of no use
    weights: dict[str, float] | None  # concept weights of a refined search; None: the site's own
    method = "analyse"


class FeatureCell(NamedTuple):
    """One cell analysed elsewhere, as a features request carries it."""

    cell_id: str
    values: list[float]          # its raw feature vector (or the request's columns of it)
    background_estimated: bool
    mask_estimated: bool
    embedding: list[float] | None = None  # its eye vector, for a site that looks through one
    image_hash: str = ""         # sitedb.image_hash of its pixels; "": not sent


class SearchFeatures(NamedTuple):
    """Search the matches of cells analysed elsewhere, in one call (`SiteWorker.search_many`)."""

    cells: list[FeatureCell]
    k: int
    columns: list[int] | None    # the feature columns the values are; None: full vectors
    weights: dict[str, float] | None
    method = "search_many"


class FetchImage(NamedTuple):
    """Read one database cell's image (`SiteWorker.image`)."""

    cell_id: str
    method = "image"


def ray_task_cancelled() -> bool:
    """True when this runs as a Ray actor task that `ray.cancel` was called on (the site
    cancels a cell whose case its caller gave up); False outside a Ray worker."""
    try:
        return ray.get_runtime_context().is_canceled()
    except RuntimeError:  # not a Ray worker: the in-process use
        return False


class SiteWorker:
    """Feature extraction and search over one site database (folder `db`)."""

    def __init__(self, db: str | Path, budget: CellBudget | None = CellBudget(), warm_up: bool = True):
        # Heavy imports happen in the worker, here, so the first case is not slower.
        import pathmaster.features.extract  # noqa: F401
        import pathmaster.image.segmentation  # noqa: F401
        from pathmaster.site.search import SiteIndex

        self.index = SiteIndex.open(db)
        self.explainer = Explainer(self.index)
        self._wire = lru_cache(maxsize=4096)(self._wire_parts)
        # budget: each cell is analysed in a bounded worker process (CPU budget, memory
        # limit, deadline); None: in this process, unbounded (a server that only searches).
        self.pool = AnalysisPool(budget=budget, preload=PRELOAD) if budget is not None else None
        if self.pool is not None:
            self.pool.warm_up()  # the fork server and a worker start now, not on the first case
        self.warm_up_s: dict[str, float] = {}
        if warm_up:
            self.warm_up()

    def warm_up(self) -> dict[str, float]:
        """Serve one synthetic cell once, as cases are served: analyse it, then search
        with its features. What a fresh process does only once (lazy imports in the
        analysis process, FAISS's first search, the thumbnail codec) is then paid here,
        before the worker is ready, and not by the first case, whose time the
        coordinator's predictor would learn from. Returns the seconds of each
        step ({"analyse_s", "search_s", "thumbnails_s"}, also kept in `warm_up_s`); a
        step that fails is logged and left out: a warm-up never stops a site.

        The wire parts (thumbnail, image hash) of the first WARM_UP_THUMBNAILS database
        cells are made too: a search's time then does not depend on whether its matches
        were met before (~3 ms a match, 30 in a 6-cell case)."""
        from services.synthetic import synthetic_case_cells

        cell = synthetic_case_cells(1, WARM_UP_SEED)[0]
        try:
            t0 = time.perf_counter()
            features, _, _, patch, _ = self._extract(cell["cell_id"], cell["image"], cell["background"], cell["mask"],
                                                  None)
            self.warm_up_s["analyse_s"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            embedding = self.index.embed(patch[None])
            outcome = self.search(cell["cell_id"], [float(v) for v in features], defaults.K,
                                  embedding=None if embedding is None else embedding[0])
            if not outcome.error:
                self.warm_up_s["search_s"] = time.perf_counter() - t0
        except (InvalidInput, CellStopped) as exc:
            log.warning("site worker: warm-up cell not served (%s); the first case will be slower", exc)
        t0 = time.perf_counter()
        for cell_id in self.index.cell_ids(WARM_UP_THUMBNAILS):
            self._wire(cell_id)
        self.warm_up_s["thumbnails_s"] = time.perf_counter() - t0
        return dict(self.warm_up_s)

    def _extract(self, cell_id: str, image: bytes, background: bytes, mask: bytes, deadline: float | None):
        """(features, background_estimated, mask_estimated, patch, image hash) of one cell;
        InvalidInput or CellStopped (budget) naming it."""
        if self.pool is None:
            from pathmaster.site.database import image_hash

            rgb, background_rgb, labels = decode_cell(cell_id, image, background, mask)
            analysis = self.index.analyse(rgb, background_rgb, labels, source=f"cell {cell_id!r}")
            return (analysis.features, analysis.background_estimated, analysis.mask_estimated, analysis.patch,
                    image_hash(rgb))
        pixels = check_cell_size(cell_id, image, background, mask) if image else 0
        return self.pool.run(analyse_encoded_cell, cell_id, image, background, mask,
                             pixels=pixels, deadline=deadline, name=f"cell {cell_id!r}",
                             should_stop=ray_task_cancelled)

    def ready(self) -> bool:
        return True

    def info(self) -> dict:
        """{"algorithm", "database_cells", "diagnoses", "feature_schema", "vocabulary",
        "feature_columns", "feature_column_names", "database_origins" (cells per dataset kind,
        generated cells as "synthetic"), "pixel_um" (0: not known), "representation",
        "representation_cells"} of this
        worker's database (the vocabulary as ``Vocabulary.as_dict``; the columns its distance
        reads, [] for all; the fitted representation's id and its cells)."""
        from pathmaster.site.growth import representation

        columns = self.index.compared_columns()
        fitted = representation(self.index.config)
        return {
            "representation": fitted["id"],
            "representation_cells": fitted["fitted_cells"],
            "feature_columns": columns,
            "feature_column_names": [self.index.feature_names[c] for c in columns],
            "algorithm": self.index.algorithm,
            "database_cells": len(self.index),
            "diagnoses": [str(d) for d in self.index.diagnoses()],
            "feature_schema": self.index.feature_schema,
            "vocabulary": self.index.vocabulary.as_dict(),
            "database_origins": origin_counts(self.index.origins()),
            "pixel_um": self.index.pixel_um or 0.0,
            **self._learnt_info(),
        }

    def _learnt_info(self) -> dict:
        """What the site learnt (SiteInfo fields 50-57): what it compares, the eye a features
        request's embeddings must come from ("" when it needs none) and its abnormality
        score, with the per-cell figures at its operating point (chosen for cases)."""
        learnt, lens = self.index.learnt, self.index.lens
        report = learnt.report or {}
        point = report.get("case") or (report.get("scores") or {}).get(learnt.score, {})
        needs = learnt.needs_embedding and lens is not None
        return {"similarity": learnt.mode, "similarity_note": self.index.similarity_note(),
                "model_sha256": lens.eye_id if needs else "",
                "eye": json.dumps(lens.eye, sort_keys=True) if needs else "",
                "abnormal_score": learnt.score, "abnormal_threshold": float(learnt.threshold),
                "abnormal_sensitivity": float(point.get("sensitivity", 0.0)),
                "abnormal_specificity": float(point.get("specificity", 0.0))}

    def wire_parts(self, cell_id: str) -> tuple[bytes, str]:
        """A database cell's (wire thumbnail, image hash), made once and then kept."""
        return self._wire(cell_id)

    def _wire_parts(self, cell_id: str) -> tuple[bytes, str]:
        """(small WebP thumbnail, SHA-256 of the full image) of a database cell."""
        thumbnail = wire_thumbnail(self.index.thumbnail_png(cell_id), WIRE_THUMBNAIL_PX, WIRE_THUMBNAIL_QUALITY,
                                   WIRE_THUMBNAIL_FORMAT)
        return thumbnail, hashlib.sha256(self.index.image_png(cell_id)).hexdigest()

    def _outcome(self, cell_id: str, features, k: int, columns: list[int] | None = None, embedding=None,
                 weights: dict[str, float] | None = None, image_hash: str = "", **flags) -> CellOutcome:
        """Search with one raw feature vector (with `columns`: only those of it) and its
        eye vector (None without one); with `weights`, refined by
        concept: the nearest RERANK_CANDIDATES re-ranked by `Explainer.reweighted`. The
        outcome has the matches' wire parts, similarity (in the measure that ranked them, so
        it never rises down the ranks; 1 for a match that is the test cell itself: its
        `image_hash`, "" unknown, is the match's) and measures, and the cell's abnormality
        score, read from the site's own k nearest however many were asked for."""
        t0 = time.perf_counter()
        query, known = np.asarray(features, dtype=np.float64), None
        if columns:
            query = self.index.expand(query[None, :], columns)[0]
            known = np.zeros(len(query), dtype=bool)
            known[columns] = True
        embeddings = None if embedding is None else np.asarray(embedding, np.float32)[None]
        scored = max(k, self.index.learnt.k)
        found = self.index.search_many(np.asarray(features, np.float64)[None],
                                       max(scored, RERANK_CANDIDATES) if weights else scored, columns, embeddings)[0]
        [score] = self.index.abnormality(embeddings, [found[:scored]], query[None])
        if weights:
            refined = self.explainer.reweighted(query, [m.cell_id for m in found], weights)
            found = [dataclasses.replace(m, distance=float(d)) for m, d in zip(found, refined)]
        itself = set(self.index.cells_with_hash(image_hash)) if image_hash else set()
        # nearest first, the test cell itself (distance ~0) before any twin of it
        matches = tuple(sorted(found, key=lambda m: (m.cell_id not in itself, m.distance))[:k])
        same = tuple(m.cell_id in itself for m in matches)
        similar = tuple(1.0 if s else v for s, v in
                        zip(same, self.explainer.similarities([m.distance for m in matches], weights)))
        parts = [self._wire(m.cell_id) for m in matches]
        bethesda = tuple(self.index.vocabulary.to_bethesda(m.diagnosis) or "" for m in matches)
        return CellOutcome(cell_id, matches, tuple(p[0] for p in parts), tuple(p[1] for p in parts), bethesda,
                           similar, same,
                           tuple(tuple(self.explainer.measures(query, m.cell_id, known)) for m in matches),
                           search_s=time.perf_counter() - t0, abnormal_score=score,
                           abnormal=score >= self.index.learnt.threshold, **flags)

    def search(self, cell_id: str, values: list[float], k: int, background_estimated: bool = False,
               mask_estimated: bool = False, columns: list[int] | None = None, embedding=None,
               weights: dict[str, float] | None = None, image_hash: str = "") -> CellOutcome:
        """One test cell analysed elsewhere (its raw feature vector, or with `columns` the
        values of those columns only; its embedding by the site's network when the site
        needs one; the hash of its pixels when the analyser sent it, "" not sent) -> its
        CellOutcome; extraction_s is 0. A vector that does not fit gives the outcome's `error`."""
        try:
            return self._outcome(cell_id, values, k, columns,
                                 embedding if embedding is not None and len(embedding) else None, weights,
                                 image_hash, background_estimated=background_estimated, mask_estimated=mask_estimated)
        except InvalidInput as exc:
            return CellOutcome(cell_id, error=f"cell {cell_id!r}: {exc}")

    def search_many(self, cells: list[FeatureCell], k: int, columns: list[int] | None = None,
                    weights: dict[str, float] | None = None) -> list[CellOutcome]:
        """`search` for each of `cells` (FeatureCells, or tuples of their fields in order)
        with `k`, `columns` and `weights`, in one call: a features-mode request is one Ray
        task, not one per cell."""
        cells = [FeatureCell(*cell) for cell in cells]
        return [self.search(cell.cell_id, cell.values, k, cell.background_estimated, cell.mask_estimated, columns,
                            cell.embedding, weights=weights, image_hash=cell.image_hash)
                for cell in cells]

    def analyse(self, cell_id: str, image: bytes, background: bytes, mask: bytes, k: int,
                deadline: float | None = None, weights: dict[str, float] | None = None) -> CellOutcome:
        """One test cell, as encoded bytes (background/mask may be b"") -> its CellOutcome.
        deadline: wall-clock time (time.time()) after which the answer is of no use.

        Bad input gives the outcome's `error` (naming the cell), not an exception; so does a
        cell stopped by its budget or deadline (the rest of the case is answered). A cell
        whose task is cancelled (`ray.cancel`: its case was cancelled) is stopped, its
        analysis process killed and replaced.
        """
        t0 = time.perf_counter()
        try:
            features, background_estimated, mask_estimated, patch, digest = self._extract(
                cell_id, image, background, mask, deadline)
            embedding = self.index.embed(patch[None])
        except (InvalidInput, CellStopped) as exc:
            return CellOutcome(cell_id, error=str(exc), extraction_s=time.perf_counter() - t0)
        return self._outcome(cell_id, features, k, None, None if embedding is None else embedding[0], weights,
                             digest, extraction_s=time.perf_counter() - t0,
                             background_estimated=bool(background_estimated),
                             mask_estimated=bool(mask_estimated))

    def budget_stats(self) -> dict:
        """The analysis pool's counts, peak worker RSS and recent events
        [(time.monotonic(), cell name, outcome)]; {} when cells run unbounded."""
        if self.pool is None:
            return {}
        from dataclasses import asdict

        return asdict(self.pool.stats)

    def image(self, cell_id: str) -> dict:
        """{"image": PNG bytes, "diagnosis", "mask": PNG bytes or b""} of a database cell;
        KeyError when the site has no such cell."""
        cell = self.index.cell(cell_id)
        try:
            mask = self.index.mask_png(cell_id)
        except KeyError:
            mask = b""  # this cell has no stored mask
        return {"image": self.index.image_png(cell_id), "diagnosis": str(cell.diagnosis or ""), "mask": mask}


def origin_counts(origins: dict[str, int]) -> dict[str, int]:
    """Cells per dataset kind as Info reports them: generated cells as "synthetic"."""
    counts = Counter()
    for origin, n in origins.items():
        counts[SYNTHETIC if origin == GENERATOR else origin] += n
    return dict(counts)


def prepare_index(db: str | Path, algorithm: str) -> str:
    """Make the site database's search index use `algorithm` ("flat", "ivf", "hnsw"),
    rebuilding and storing it when it differs. Runs once per site, before its workers
    load the index. Returns the algorithm now in force."""
    from pathmaster.site.database import SiteDB
    from pathmaster.site.index import build_search_index

    with SiteDB(db) as site_db:
        config = site_db.get_config("index") or {}
        if config.get("algorithm") != algorithm or config.get("fingerprint") != site_db.fingerprint():
            log.info("%s: building the %s search index", db, algorithm)
            config = build_search_index(site_db, algorithm=algorithm)
    return config["algorithm"]


# Ray restarts nothing: a dead worker is replaced by the site's supervisor (supervisor.py),
# with backoff, while the site says NOT_SERVING if none is left. Its calls leave no task
# events in Ray's GCS (RAY_TASK_EVENTS).
_RemoteWorker = ray.remote(max_restarts=0, max_task_retries=0, enable_task_events=RAY_TASK_EVENTS,
                           allow_out_of_order_execution=RAY_OUT_OF_ORDER)(SiteWorker)
_prepare_index = ray.remote(prepare_index)


def start_worker(db: str | Path, cpus: float, budget: CellBudget | None = CellBudget(), resource: str = ""):
    """One new worker actor over the database, not waited for (its `ready` says when);
    `resource` as in `start_workers`."""
    placement = {"resources": {resource: SITE_RESOURCE_PER_WORKER}} if resource else {}
    return _RemoteWorker.options(num_cpus=cpus, **placement).remote(str(db), budget)


def start_workers(db: str | Path, algorithm: str, count: int, cpus: float, timeout_s: float = 120.0,
                  budget: CellBudget | None = CellBudget(), resource: str = ""):
    """Start `count` Ray actors over the database and wait until each has loaded it;
    with `algorithm` set, the index is first made to use it (`prepare_index`). budget:
    what each cell may cost (None: unbounded, in the actor's own process). resource: a Ray
    custom resource offered only by the nodes that hold `db` (the site's `ray_resource`);
    the actors and the index build then run only there. "": on any node.

    Returns the actor handles. Raises RuntimeError naming the database when a worker
    cannot open it (the worker's own error is included).
    """
    placement = {"resources": {resource: SITE_RESOURCE_PER_WORKER}} if resource else {}
    if algorithm:
        try:
            build = _prepare_index.options(num_cpus=cpus, **placement).remote(str(db), algorithm)
            ray.get(build, timeout=timeout_s)
        except ray.exceptions.RayTaskError as exc:
            raise RuntimeError(f"site database {db}: cannot build a {algorithm!r} index: {exc.cause}") from None
        except ray.exceptions.GetTimeoutError:
            ray.cancel(build, force=True)  # not left queued (or running) for a node that never comes
            raise RuntimeError(f"site database {db}: its {algorithm!r} index build did not finish in {timeout_s:.0f} s"
                               + (f" (no live node offers the resource {resource!r}?)" if resource else "")) from None
    workers = [start_worker(db, cpus, budget, resource) for _ in range(count)]
    try:
        ray.get([w.ready.remote() for w in workers], timeout=timeout_s)
    except ray.exceptions.RayActorError as exc:
        stop_workers(workers)
        cause = exc.__cause__ or exc
        raise RuntimeError(f"site database {db}: a worker could not open it: {cause}") from None
    except ray.exceptions.GetTimeoutError:
        stop_workers(workers)
        raise RuntimeError(
            f"site database {db}: workers not ready after {timeout_s:.0f} s "
            f"(not enough Ray CPUs for {count} x {cpus}"
            + (f", or no live node offers the resource {resource!r}" if resource else "") + "?)") from None
    return workers


def stop_workers(workers) -> None:
    for worker in workers:
        ray.kill(worker, no_restart=True)
