"""The coordinator's own analysis: each cell of a case is analysed once, here.

Sites whose index was built with the coordinator's feature schema then receive feature
vectors (about 1 KB per cell) instead of image, background and mask (about 150 KB per
cell), and only search; each still normalises and selects features with its own
statistics, so its matches are the ones it would find from the images. Sites with another
schema, or their own algorithm, get the images.

`CellAnalyser` is a Ray actor (a plain class, so tests can run it in-process): decode the
cell's parts, segment it and estimate its slide when they were not sent, extract features,
in a bounded worker process (pathmaster/analysis/budget.py: a CPU budget per cell, a memory limit,
the case's deadline), exactly as a site does. `Analysers` keeps a few of them and analyses
a case's cells in parallel, a cell per actor at a time, the most favoured class first (the
site's `PriorityDispatcher`): an urgent case's cells are the next ones any actor starts,
even behind a queue of bulk cells.
"""

from __future__ import annotations

import logging
import math
import time
from typing import NamedTuple

import ray

from pathmaster.analysis.budget import AnalysisPool, CellBudget, CellStopped
from pathmaster.records import InvalidInput
from qos.predict import RecentMedian
from services.analysis import PRELOAD, analyse_encoded_cell
from services.cells import check_cell_size
from services.shared import WARM_UP_SEED
from services.dispatch import PriorityDispatcher
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.ray_local import RAY_OUT_OF_ORDER, RAY_TASK_EVENTS

ANALYSIS_READY_S = 120.0        # how long the coordinator waits for them before images-only

log = logging.getLogger("pathmaster.coordinator")


class AnalyseTimed(NamedTuple):
    """Analyse one submitted cell and time it on the actor (`CellAnalyser.analyse_timed`)."""

    cell_id: str
    image: bytes
    background: bytes            # b"": not sent (estimated)
    mask: bytes                  # b"": not sent (segmented)
    deadline: float | None       # time.time() after which the answer is of no use
    method = "analyse_timed"


class CellAnalyser:
    """Turns one submitted cell into its raw feature vector (or a per-cell error)."""

    def __init__(self, budget: CellBudget | None = CellBudget(), warm_up: bool = True):
        from pathmaster.features.schema import feature_schema

        self.schema = feature_schema()
        # None: analyse in this process, unbounded (a coordinator configured so).
        self.pool = AnalysisPool(budget=budget, preload=PRELOAD) if budget is not None else None
        if self.pool is not None:
            self.pool.warm_up()  # the fork server and a worker start now, not on the first case
        self.warm_up_s: float | None = None
        if warm_up:
            self.warm_up()

    def warm_up(self) -> float | None:
        """Analyse one synthetic cell once, as a case's cells are analysed, before the
        analyser says it is ready: the analysis process's lazy imports and first-call
        costs are paid here, not by the first case (whose time the predictor learns
        from). Returns its seconds (also `warm_up_s`), None when the cell was not
        analysed (logged: a warm-up never stops the coordinator)."""
        from services.synthetic import synthetic_case_cells

        cell = synthetic_case_cells(1, WARM_UP_SEED)[0]
        t0 = time.perf_counter()
        result = self.analyse(cell["cell_id"], cell["image"], cell["background"], cell["mask"])
        if isinstance(result, str):
            log.warning("coordinator analyser: warm-up cell not analysed (%s); the first case will be slower", result)
            return None
        self.warm_up_s = time.perf_counter() - t0
        return self.warm_up_s

    def ready(self) -> str:
        """The feature schema this analyser makes vectors in."""
        return self.schema

    def analyse(self, cell_id: str, image: bytes, background: bytes, mask: bytes,
                deadline: float | None = None) -> pb.CellFeatures | str:
        """The cell's raw feature vector as the wire carries it, or the text of what is
        wrong with the cell (naming it) when it cannot be analysed, or was stopped by its
        budget or by `deadline` (time.time())."""
        try:
            pixels = check_cell_size(cell_id, image, background, mask)
            if self.pool is None:
                features, background_estimated, mask_estimated, patch, digest = analyse_encoded_cell(
                    cell_id, image, background, mask)
            else:
                features, background_estimated, mask_estimated, patch, digest = self.pool.run(
                    analyse_encoded_cell, cell_id, image, background, mask, pixels=pixels, deadline=deadline,
                    name=f"cell {cell_id!r}")
        except (InvalidInput, CellStopped) as exc:
            return str(exc)
        return pb.CellFeatures(cell_id=cell_id, values=[float(v) for v in features],
                               background_estimated=bool(background_estimated),
                               mask_estimated=bool(mask_estimated), patch=patch.tobytes(),
                               image_sha256=bytes.fromhex(digest) if digest else b"")


    def analyse_timed(self, cell_id: str, image: bytes, background: bytes, mask: bytes,
                      deadline: float | None = None) -> tuple[pb.CellFeatures | str, float]:
        """`analyse`, and the seconds it took here (its service time, without the wait in
        the actor's queue)."""
        t0 = time.perf_counter()
        result = self.analyse(cell_id, image, background, mask, deadline)
        return result, time.perf_counter() - t0


# its calls leave no task events in Ray's GCS (services.ray_local.RAY_TASK_EVENTS)
_RemoteAnalyser = ray.remote(max_restarts=-1, max_task_retries=0, enable_task_events=RAY_TASK_EVENTS,
                             allow_out_of_order_execution=RAY_OUT_OF_ORDER)(CellAnalyser)


class Analysers:
    """A few `CellAnalyser` actors; `analyse(cells)` spreads a case over them.

    Parameters
    ----------
    count : int
        Actors to start (each holds the feature code loaded once).
    cpus : float
        Ray CPUs reserved per actor.
    budget : CellBudget or None
        What one cell may cost (None: unbounded).
    """

    def __init__(self, count: int, cpus: float, budget: CellBudget | None = CellBudget()):
        self.actors = [_RemoteAnalyser.options(num_cpus=cpus).remote(budget) for _ in range(count)]
        self.dispatcher = PriorityDispatcher(self.actors)
        self.schema = ""
        self.seconds_per_cell = RecentMedian()  # service time of one cell on an actor
        # Wall seconds of one round (every actor analysing one cell) as a whole case saw it:
        # the actors' service, Ray's calls and the hand-offs; what `estimate_s` scales.
        self.seconds_per_round = RecentMedian()

    def wait_ready(self, timeout_s: float) -> str:
        """Wait until every actor has loaded; returns the feature schema (raises on failure)."""
        schemas = set(ray.get([a.ready.remote() for a in self.actors], timeout=timeout_s))
        if len(schemas) != 1:
            raise RuntimeError(f"coordinator analysers disagree on the feature schema: {schemas}")
        self.schema = schemas.pop()
        return self.schema

    def rounds(self, cells: int, ahead: int) -> int:
        """Rounds of one cell per actor that `cells` new cells take behind `ahead` ones."""
        return math.ceil((ahead + cells) / max(1, len(self.actors)))

    def estimate_s(self, cells: int, priority: int = 0) -> float | None:
        """Predicted seconds to analyse `cells` more cells of `priority` now: the cells
        ahead of them (waiting at the same or a more favoured priority, or running) and
        these, served a cell per actor at a time, at the recent median wall time of a round
        as cases saw it (before any case was timed: of one cell's service); None before the
        first cell was analysed."""
        per_round = self.seconds_per_round.value()
        if per_round is None:
            per_round = self.seconds_per_cell.value()
        if per_round is None:
            return None
        return per_round * self.rounds(cells, self.dispatcher.ahead(priority))

    def analyse(self, cells: list[pb.CellImage], timeout_s: float, priority: int = 0) -> list[pb.CellFeatures | str]:
        """Each cell's CellFeatures, or the error text for a cell that cannot be analysed,
        in the order of `cells`, analysed before waiting cells of a larger `priority` (the
        case's class's; 0 most favoured). Raises ray's GetTimeoutError when `timeout_s`
        passes, and an actor's error as it is."""
        deadline = time.time() + timeout_s
        started = time.monotonic()
        rounds = self.rounds(len(cells), self.dispatcher.ahead(priority))
        jobs = [self.dispatcher.submit(priority, AnalyseTimed(c.cell_id, c.image, c.background, c.mask, deadline))
                for c in cells]
        try:
            for job in jobs:
                if not job.done.wait(max(0.0, started + timeout_s - time.monotonic())):
                    raise ray.exceptions.GetTimeoutError(f"the cells were not analysed in {timeout_s:.1f} s")
                if job.error is not None:
                    raise job.error
            timed = [job.result for job in jobs]
        except BaseException:
            for job in jobs:
                self.dispatcher.cancel(job)
            raise
        for _, seconds in timed:
            self.seconds_per_cell.add(seconds)
        self.seconds_per_round.add((time.monotonic() - started) / rounds)
        return [result for result, _ in timed]

    def stop(self) -> None:
        self.dispatcher.stop()
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
