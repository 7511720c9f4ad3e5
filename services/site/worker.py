"""The work a site does for one cell, and the Ray actor that does it.

`SiteWorker` holds one `SiteIndex` (SQLite metadata + FAISS index, loaded once when the
worker starts) and analyses one encoded cell at a time: decode, segment/estimate what
the user did not send, extract features, search, attach thumbnails. It is a plain class
so the same code runs in-process (benchmarks' baseline) and as a Ray actor (`start_workers`).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import ray

from pathmaster.records import InvalidInput
from services.site.cells import decode_cell

log = logging.getLogger("pathmaster.site")


class SiteWorker:
    """Feature extraction and search over one site database (folder `db`)."""

    def __init__(self, db: str | Path):
        # Heavy imports happen in the worker, here, so the first case is not slower.
        import pathmaster.features  # noqa: F401
        import pathmaster.segmentation  # noqa: F401
        from pathmaster.site import SiteIndex

        self.index = SiteIndex.open(db)

    def ready(self) -> bool:
        return True

    def info(self) -> dict:
        """{"algorithm", "database_cells", "diagnoses", "vocabulary"} of this worker's
        database (the vocabulary as ``Vocabulary.as_dict``)."""
        return {
            "algorithm": self.index.algorithm,
            "database_cells": len(self.index),
            "diagnoses": [str(d) for d in self.index.diagnoses()],
            "vocabulary": self.index.vocabulary.as_dict(),
        }

    def analyse(self, cell_id: str, image: bytes, background: bytes, mask: bytes, k: int) -> dict:
        """One test cell, as encoded bytes (background/mask may be b"") -> a result dict.

        Returns {"query_cell_id", "matches": [{"cell_id", "diagnosis", "bethesda", "distance",
        "source_id", "thumbnail"}], "background_estimated", "mask_estimated", "error",
        "extraction_s", "search_s"}; times in seconds, search_s includes reading the
        matches' thumbnails. Bad input gives "error" (naming the cell), not an exception.
        """
        result = {"query_cell_id": cell_id, "matches": [], "background_estimated": False,
                  "mask_estimated": False, "error": "", "extraction_s": 0.0, "search_s": 0.0}
        t0 = time.perf_counter()
        try:
            rgb, background_rgb, labels = decode_cell(cell_id, image, background, mask)
            analysis = self.index.analyse(rgb, background_rgb, labels, source=f"cell {cell_id!r}")
        except InvalidInput as exc:
            result["error"] = str(exc)
            result["extraction_s"] = time.perf_counter() - t0
            return result
        t1 = time.perf_counter()
        result["extraction_s"] = t1 - t0
        result["background_estimated"] = bool(analysis.background_estimated)
        result["mask_estimated"] = bool(analysis.mask_estimated)
        for match in self.index.search(analysis.features, k):
            result["matches"].append({
                "cell_id": str(match.cell_id),
                "diagnosis": str(match.diagnosis or ""),
                "bethesda": self.index.vocabulary.to_bethesda(match.diagnosis) or "",
                "distance": float(match.distance),
                "source_id": str(match.source_id),
                "thumbnail": self.index.thumbnail_png(match.cell_id),
            })
        result["search_s"] = time.perf_counter() - t1
        return result

    def image(self, cell_id: str) -> dict:
        """{"image": PNG bytes, "diagnosis", "mask": PNG bytes or b""} of a database cell;
        KeyError when the site has no such cell."""
        cell = self.index.cell(cell_id)
        try:
            mask = self.index.mask_png(cell_id)
        except KeyError:
            mask = b""  # this cell has no stored mask
        return {"image": self.index.image_png(cell_id), "diagnosis": str(cell.diagnosis or ""), "mask": mask}


def prepare_index(db: str | Path, algorithm: str) -> str:
    """Make the site database's search index use `algorithm` ("flat", "ivf", "hnsw"),
    rebuilding and storing it when it differs. Runs once per site, before its workers
    load the index. Returns the algorithm now in force."""
    from pathmaster.sitedb import SiteDB
    from pathmaster.site import build_search_index

    with SiteDB(db) as site_db:
        config = site_db.get_config("index") or {}
        if config.get("algorithm") != algorithm or config.get("fingerprint") != site_db.fingerprint():
            log.info("%s: building the %s search index", db, algorithm)
            config = build_search_index(site_db, algorithm=algorithm)
    return config["algorithm"]


def ensure_ray(address: str = "", num_cpus: int | None = None) -> None:
    """Connect this process to Ray once: a local instance by default, or `address`
    ("auto", "HOST:PORT", "ray://HOST:PORT") to join an existing cluster."""
    if ray.is_initialized():
        return
    kwargs = dict(include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    if address:
        ray.init(address=address, **kwargs)
    else:  # a local instance talks over loopback only
        ray.init(num_cpus=num_cpus, _node_ip_address="127.0.0.1", **kwargs)


_RemoteWorker = ray.remote(max_restarts=1, max_task_retries=0)(SiteWorker)
_prepare_index = ray.remote(prepare_index)


def start_workers(db: str | Path, algorithm: str, count: int, cpus: float, timeout_s: float = 120.0):
    """Start `count` Ray actors over the database and wait until each has loaded it;
    with `algorithm` set, the index is first made to use it (`prepare_index`).

    Returns the actor handles. Raises RuntimeError naming the database when a worker
    cannot open it (the worker's own error is included).
    """
    if algorithm:
        try:
            ray.get(_prepare_index.options(num_cpus=cpus).remote(str(db), algorithm), timeout=timeout_s)
        except ray.exceptions.RayTaskError as exc:
            raise RuntimeError(f"site database {db}: cannot build a {algorithm!r} index: {exc.cause}") from None
    workers = [_RemoteWorker.options(num_cpus=cpus).remote(str(db)) for _ in range(count)]
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
            f"(not enough Ray CPUs for {count} x {cpus}?)") from None
    return workers


def stop_workers(workers) -> None:
    for worker in workers:
        ray.kill(worker, no_restart=True)
