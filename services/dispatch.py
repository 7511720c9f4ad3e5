"""Cells go to a site's Ray actors most-favoured class first.

DSCP orders packets in the network; this orders work at the site. Each actor is given at
most one cell at a time, so a waiting urgent cell is the next one any actor starts, even
behind a queue of bulk cells (a cell already running is not interrupted for it). Within a
class, cells start in the order they came. A cancelled cell is dropped from the queue, and
a running one is told to stop (`ray.cancel`; the worker kills its analysis process).

A job's work is a named record (a NamedTuple: `AnalyseCell`, `SearchFeatures`, `FetchImage`
in services/site/worker.py, `AnalyseTimed` in services/coordinator/analysis.py): its
`method` names the actor's method and its fields are that method's arguments, in order.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Iterator
from typing import ClassVar, Protocol

import ray

POLL_S = 0.02  # how often the dispatcher looks for finished cells while some run
UNAVAILABLE_ATTEMPTS = 3  # runs of a job whose worker Ray could not reach for a moment


class Work(Protocol):
    """What a job runs: `actor.<method>(*work)`, the record's fields as the arguments."""

    method: ClassVar[str]

    def __iter__(self) -> Iterator: ...


class Job:
    """One piece of work, `actor.<work.method>(*work)`, for `cells` cells: `done` is set when
    `result` (or `error`) is there. `started` and `finished` (time.perf_counter(), None
    until then) time it on its worker, dispatch to result, for the site's service time."""

    def __init__(self, work: Work, cells: int = 1):
        self.work = work
        self.cells = cells
        self.done = threading.Event()
        self.result = None
        self.error: BaseException | None = None
        self.cancelled = False
        self.ref = None
        self.started: float | None = None
        self.finished: float | None = None
        self.priority = 0
        self.attempts = 1

    @property
    def method(self) -> str:
        """The worker method that does this job's work."""
        return self.work.method

    def service_s(self) -> float | None:
        """Seconds on its worker (dispatch to result), None unless it ran to the end."""
        if self.started is None or self.finished is None or self.error is not None:
            return None
        return self.finished - self.started


class WorkersDown(RuntimeError):
    """No worker of the site is alive: its waiting cells are failed at once, not kept."""


class PriorityDispatcher:
    """Runs `actor.<job.method>.remote(*job.work)` on `workers`, lowest priority number first.

    A worker that dies (its job fails with RayActorError, or the supervisor says so with
    `worker_down`) is given no more jobs until `replace` puts its successor in its place;
    while none is alive, waiting jobs fail with `WorkersDown`. `workers` is changed in place
    (the site server shares the list).
    """

    def __init__(self, workers: list):
        self.workers = workers
        self._heap: list[tuple[int, int, Job]] = []
        self._order = itertools.count()
        self._idle = list(range(len(workers)))
        self._running: dict = {}  # ObjectRef -> (job, worker index, the actor)
        self._down: set[int] = set()
        self._changed = threading.Condition()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, daemon=True, name="site-dispatch")
        self._thread.start()

    def submit(self, priority: int, work: Work, cells: int = 1) -> Job:
        """Queue `work` (a record of `cells` cells) at `priority` (0 most favoured)."""
        job = Job(work, cells)
        job.priority = priority
        with self._changed:
            if len(self._down) == len(self.workers):
                job.error = WorkersDown("no worker is alive")
                job.done.set()
                return job
            heapq.heappush(self._heap, (priority, next(self._order), job))
            self._changed.notify()
        return job

    def waiting(self) -> int:
        """Cells not started yet (cancelled jobs left out)."""
        with self._changed:
            return sum(job.cells for _, _, job in self._heap if not job.cancelled)

    def running(self) -> int:
        """Jobs on a worker now (sent and not yet answered)."""
        with self._changed:
            return len(self._running)

    def ahead(self, priority: int) -> int:
        """Cells a new job of `priority` would wait for: those waiting at the same or a
        more favoured priority (a smaller number), and those running now, of any class
        (a running cell is not interrupted). Less favoured waiting cells start after it."""
        with self._changed:
            waiting = sum(job.cells for p, _, job in self._heap if p <= priority and not job.cancelled)
            return waiting + sum(job.cells for job, _, _ in self._running.values())

    def work_ahead_s(self, seconds_per_cell: dict[str, float], priority: int | None = None) -> float:
        """Seconds until a worker is free for a new job of `priority` if none came before
        it: the service time of the waiting cells it would not overtake (those at the same
        or a more favoured priority; every one when `priority` is None) plus what is left
        of every running job, by method (`seconds_per_cell`; methods not in it count 0),
        over the live workers."""
        now = time.perf_counter()
        with self._changed:
            queued = sum(seconds_per_cell.get(job.method, 0.0) * job.cells
                         for p, _, job in self._heap
                         if not job.cancelled and (priority is None or p <= priority))
            running = sum(max(0.0, seconds_per_cell.get(job.method, 0.0) * job.cells - (now - job.started))
                          for job, _, _ in self._running.values())
            alive = len(self.workers) - len(self._down)
        return (queued + running) / max(1, alive)

    def cancel(self, job: Job) -> None:
        """Drop a waiting job; a running one is cancelled (`ray.cancel` sets the actor task's
        cancellation flag, which the worker's analysis pool watches: worker.py)."""
        with self._changed:
            job.cancelled = True
            if job.ref is not None:
                ray.cancel(job.ref)

    def worker_down(self, index: int) -> None:
        """The worker at `index` is dead: no more jobs for it; when it was the last one
        alive, every waiting job fails with WorkersDown."""
        with self._changed:
            self._mark_down(index)

    def _mark_down(self, index: int) -> None:
        self._down.add(index)
        if index in self._idle:
            self._idle.remove(index)
        if len(self._down) == len(self.workers):
            while self._heap:
                _, _, job = heapq.heappop(self._heap)
                job.error = WorkersDown("no worker is alive")
                job.done.set()

    def replace(self, index: int, actor) -> None:
        """`actor` (ready) takes the place of the dead worker at `index`."""
        with self._changed:
            self.workers[index] = actor
            self._down.discard(index)
            busy = any(i == index for _, i, _ in self._running.values())
            if not busy and index not in self._idle:
                self._idle.append(index)
            self._changed.notify()

    def is_alive(self, index: int) -> bool:
        """Whether the worker at `index` is not known to be dead."""
        with self._changed:
            return index not in self._down

    def alive(self) -> int:
        """Workers not known to be dead."""
        with self._changed:
            return len(self.workers) - len(self._down)

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()
        self._thread.join(timeout=5)

    def _start_waiting_jobs(self) -> None:
        while self._idle and self._heap:
            _, _, job = heapq.heappop(self._heap)
            if job.cancelled:
                continue
            worker = self._idle.pop()
            actor = self.workers[worker]
            job.started = time.perf_counter()
            job.ref = getattr(actor, job.method).remote(*job.work)
            self._running[job.ref] = (job, worker, actor)

    def _run(self) -> None:
        while True:
            with self._changed:
                if self._stopped:
                    return
                self._start_waiting_jobs()
                running = list(self._running)
                if not running:
                    self._changed.wait()
                    continue
            ready, _ = ray.wait(running, num_returns=1, timeout=POLL_S)
            for ref in ready:
                with self._changed:
                    job, worker, actor = self._running.pop(ref)
                try:
                    job.result = ray.get(ref)
                except Exception as exc:  # the handler turns it into a gRPC status
                    job.error = exc
                job.finished = time.perf_counter()
                with self._changed:
                    unavailable = isinstance(job.error, ray.exceptions.ActorUnavailableError)
                    if (isinstance(job.error, ray.exceptions.RayActorError) and not unavailable
                            and self.workers[worker] is actor):
                        self._mark_down(worker)  # dead: its successor comes through replace()
                    elif worker not in self._down and worker not in self._idle:
                        self._idle.append(worker)
                    if unavailable and job.attempts < UNAVAILABLE_ATTEMPTS and not job.cancelled:
                        # Not dead: Ray lost touch for a moment (a loaded host). Run it again.
                        job.attempts += 1
                        job.error, job.ref, job.started, job.finished = None, None, None, None
                        heapq.heappush(self._heap, (job.priority, next(self._order), job))
                        continue
                job.done.set()
