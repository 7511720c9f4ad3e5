"""Every cell's compute, bounded: a pixel cap checked from the header, and a pool of worker
processes each cell runs in under a CPU-time budget, a memory limit and its case's deadline.

Why: one 56 KB PNG of a flat 4096 x 4096 image (inside the decode limits) held a site for
269 s and grew its worker by 10.9 GB, and the urgent case queued behind it failed. Two
defences, each enough for the known case and both kept:

* ``check_analysis_size``: a cell image over ``MAX_ANALYSIS_PIXELS`` is refused from its
  header (``InvalidInput``), before any decoding, saying the limit and "crop the cell".
  Refusing rather than downscaling: the features are in pixel units and the database
  cells are cell-sized, so a downscaled field of view would match nothing meaningful.
* ``AnalysisPool``: runs ``fn(*args)`` in a worker process (pebble's ``ProcessPool``, a
  forkserver context: the caller runs gRPC and Ray threads, so fork is unsafe) whose
  address space is limited (``RLIMIT_AS``), with one thread for OpenMP/OpenBLAS/OpenCV.
  Each task gets a CPU-time budget (``RLIMIT_CPU`` set in the worker for that task: the
  kernel kills the worker when it is used up, so a busy machine does not make a cell look
  over budget) and a wall-clock limit (the case's deadline, and a generous multiple of the
  budget for work that blocks). A worker that is killed, runs out of budget or dies is
  replaced by pebble; the task gets ``CellStopped`` with a message for the user, and the
  next task runs on a fresh worker. A task whose caller no longer wants it (``should_stop``,
  e.g. its case was cancelled) is stopped the same way: a running one's worker is killed
  and replaced.

Plain and reusable (no services, no qos): the site's Ray actor analyses through it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import multiprocessing
import os
import resource
import signal
import threading
import time
from concurrent.futures import CancelledError
from concurrent.futures.process import BrokenProcessPool
from collections.abc import Callable
from dataclasses import dataclass, field

from pathmaster import defaults
from pathmaster.records import InvalidInput

# Threads of the numeric libraries in a worker: one (a site's CPUs are shared by its
# workers; more threads only contend), set by the fork server before it imports numpy
# (pathmaster/_single_thread.py) and again in each worker.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


# ------------------------------------------------------------------ the pixel cap


def image_size(data: bytes, name: str) -> tuple[int, int]:
    """(width, height) of encoded image bytes, from the header only (nothing is decoded).
    Raises InvalidInput naming `name` when the bytes are not an image of an accepted
    format (`pathmaster.image.io.open_accepted`)."""
    from pathmaster.image.io import open_accepted

    with open_accepted(data, name, max_bytes=len(data)) as img:
        return img.size


def check_analysis_size(data: bytes, name: str, max_pixels: int = defaults.MAX_ANALYSIS_PIXELS) -> int:
    """Refuse a cell image with more than `max_pixels` pixels, from its header; returns its
    pixel count. Raises InvalidInput naming `name`, saying the limit and what to do."""
    width, height = image_size(data, name)
    if width * height > max_pixels:
        side = math.isqrt(max_pixels)
        raise InvalidInput(
            f"image is {width} x {height} = {width * height} pixels, over the limit of "
            f"{max_pixels} pixels ({side} x {side}) for one cell: this looks like a field of "
            f"view, not a cell; crop the cell (a Pap cell is ~100-300 pixels a side) and send that",
            name)
    return width * height


# ------------------------------------------------------------------ budgets


@dataclass(frozen=True)
class CellBudget:
    """What one cell may cost: CPU seconds (a floor plus a share per megapixel), a wall-clock
    cap (`wall_factor` x the CPU budget) and the worker's address space in bytes."""

    floor_s: float = defaults.CELL_CPU_FLOOR_S
    per_megapixel_s: float = defaults.CELL_CPU_PER_MEGAPIXEL_S
    wall_factor: float = defaults.CELL_WALL_FACTOR
    memory_bytes: int = defaults.ANALYSIS_MEMORY_BYTES

    def cpu_s(self, pixels: int) -> float:
        return self.floor_s + self.per_megapixel_s * max(0, pixels) / 1e6


class CellStopped(Exception):
    """A cell whose analysis was stopped or not started; str() is the message for the user.
    `reason`: "budget", "deadline", "memory", "crashed" or "cancelled"."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class PoolStats:
    """Counts since the pool started, and the largest peak RSS a finished task reported."""

    completed: int = 0
    over_budget: int = 0
    deadline: int = 0
    memory: int = 0
    crashed: int = 0
    not_started: int = 0
    cancelled: int = 0
    peak_rss_bytes: int = 0
    events: list = field(default_factory=list)  # (time.monotonic(), name, outcome), last 100


# ------------------------------------------------------------------ in the worker process


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_memory(mmap_threshold_bytes: int = defaults.ANALYSIS_MMAP_THRESHOLD_BYTES,
                      trim_threshold_bytes: int = defaults.ANALYSIS_TRIM_THRESHOLD_BYTES) -> bool:
    """Let this process's allocator keep freed memory for its next arrays (glibc only).

    Parameters
    ----------
    mmap_threshold_bytes : int
        Allocations up to this size (bytes) come from the heap, not from a fresh mapping.
    trim_threshold_bytes : int
        Up to this much free memory (bytes) at the top of the heap stays mapped.

    Returns
    -------
    bool
        True when both were set (a glibc process), False elsewhere (nothing changed).

    Notes
    -----
    A cell's analysis makes and drops dozens of arrays of about the image's size. With
    glibc's default thresholds each of them is a fresh ``mmap`` (or heap grown and trimmed
    again), whose pages the kernel zeroes and faults in one by one: on a ~200 px upload
    that system time was about a fifth of the analysis's CPU. Called once per analysis
    worker (`_worker_init`, and processes that do nothing but analyse); the memory kept is
    bounded by ``trim_threshold_bytes`` and counts against the worker's RLIMIT_AS like any.
    """
    name = ctypes.util.find_library("c")
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # mallopt returns 1 on success; the mmap threshold first, since setting it stops glibc
    # from moving both thresholds by itself.
    return bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold_bytes)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold_bytes))


def _worker_init(memory_bytes: int) -> None:
    """Runs once in each new worker: limits that stay for its whole life."""
    for name in THREAD_VARIABLES:  # for anything imported from here on
        os.environ[name] = "1"
    keep_freed_memory()
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # an over-budget kill writes no core file
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    signal.signal(signal.SIGXCPU, signal.SIG_DFL)  # the CPU budget kills (a parent may ignore it)
    # pebble stops a worker (over its wall cap or deadline, cancelled) with SIGTERM and
    # waits 3 s before SIGKILL. A handler inherited from the fork server (a Ray worker's
    # fork server imports Ray, which catches SIGTERM) runs only between bytecodes, not
    # inside a long OpenCV/NumPy call, and did not end the worker: every stop cost 3 s
    # more (4-7 s in all) before the next cell, an urgent case's possibly, could start.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    one_thread_numerics()


def one_thread_numerics() -> None:
    """Hold OpenCV and the BLAS/OpenMP pools already loaded to one thread each (an analysis
    worker, or the fork server before it forks one, must run no thread of its own)."""
    try:
        import cv2

        cv2.setNumThreads(1)
    except ImportError:
        pass
    try:
        from threadpoolctl import threadpool_limits

        threadpool_limits(1)
    except ImportError:
        pass


def _cpu_used_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


class _OutOfMemory(Exception):
    """Raised in a worker for a MemoryError, with the worker's peak RSS in bytes."""

    def __init__(self, peak_rss_bytes: int):
        super().__init__(peak_rss_bytes)
        self.peak_rss_bytes = peak_rss_bytes


def _run_budgeted(fn, args: tuple, cpu_s: float):
    """In the worker: `fn(*args)` under a CPU-time limit of `cpu_s` more seconds.
    Returns (result, peak RSS bytes of this worker so far); a MemoryError becomes
    _OutOfMemory (with the peak RSS)."""
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(_cpu_used_s() + cpu_s)  # RLIMIT_CPU counts whole seconds of the process
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))
    try:
        return fn(*args), _peak_rss_bytes()
    except MemoryError:
        raise _OutOfMemory(_peak_rss_bytes()) from None
    finally:
        resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, hard))


# ------------------------------------------------------------------ the pool


_forkserver_lock = threading.Lock()


# What every worker runs before its first task, imported by the fork server (after the
# one-thread settings) so that no new worker imports it: this module, pebble's worker
# loop (unpickled by each new worker: ~45 ms of CPU when imported there, mostly pages
# copied on write) and what `_worker_init` loads.
SERVER_PRELOAD = ("pathmaster._single_thread", "pathmaster._forkserver_main", "pathmaster.analysis.budget",
                  "pebble.pool.process", "threadpoolctl")
_MAIN_ENV = "PATHMASTER_FORKSERVER_MAIN"  # pathmaster._forkserver_main.MAIN_ENV (not imported here)


def _context(preload: tuple[str, ...]):
    """The forkserver context; `SERVER_PRELOAD` and the modules in `preload` are imported
    once by the fork server, so a replacement worker starts in milliseconds, not seconds.
    The preload list only takes effect if this process's fork server is not running yet."""
    from multiprocessing import spawn

    context = multiprocessing.get_context("forkserver")
    with _forkserver_lock:
        # This process's main script, for the server to run once (pathmaster/_forkserver_main.py)
        main = spawn.get_preparation_data("analysis").get("init_main_from_path")
        if main:
            os.environ[_MAIN_ENV] = main
        context.set_forkserver_preload([*SERVER_PRELOAD, *preload])
    return context


class AnalysisPool:
    """Worker processes that run one task each under a `CellBudget` (see the module doc).

    pool = AnalysisPool(workers=1, budget=CellBudget(), preload=("pathmaster.analysis.cell",))
    result = pool.run(fn, arg1, arg2, pixels=w * h, deadline=time.time() + 30, name="cell 'a.png'")
    pool.close()

    `fn` must be importable by name (a module-level function). `run` blocks; raises
    CellStopped when the task was over its budget, past its deadline, out of memory or its
    worker died (the worker is replaced, the pool keeps serving), and re-raises whatever
    `fn` itself raised (e.g. InvalidInput).
    """

    def __init__(self, workers: int = defaults.ANALYSIS_PROCESSES, budget: CellBudget = CellBudget(),
                 preload: tuple[str, ...] = ()):
        from pebble import ProcessPool

        self.budget = budget
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._new_pool = lambda: ProcessPool(max_workers=workers, initializer=_worker_init,
                                             initargs=(budget.memory_bytes,), context=_context(tuple(preload)))
        self._pool = self._new_pool()

    def _event(self, name: str, outcome: str) -> None:
        with self._lock:
            self.stats.events.append((time.monotonic(), name, outcome))
            del self.stats.events[:-100]

    def _count(self, what: str, name: str) -> None:
        with self._lock:
            setattr(self.stats, what, getattr(self.stats, what) + 1)
        self._event(name, what)

    def run(self, fn, *args, pixels: int = 0, deadline: float | None = None, name: str = "cell",
            should_stop: Callable[[], bool] | None = None):
        """`fn(*args)` in a worker. pixels: the cell's size (sets its CPU budget). deadline:
        wall-clock time (`time.time()`) by which the answer is of no use, or None.
        should_stop: asked before the task starts and then every
        ``defaults.ANALYSIS_STOP_POLL_S`` seconds while it runs; once it says True the task
        is cancelled (a running worker is killed and replaced) and CellStopped("cancelled")
        is raised."""
        if should_stop is not None and should_stop():
            self._count("cancelled", name)
            raise CellStopped("cancelled", f"{name}: not analysed: its case was cancelled")
        cpu_s = self.budget.cpu_s(pixels)
        wall_s = cpu_s * self.budget.wall_factor
        by_deadline = False
        if deadline is not None:
            remaining = deadline - time.time()
            if remaining <= 0:
                self._count("not_started", name)
                raise CellStopped("deadline", f"{name}: not analysed: the case's deadline had passed before it started")
            if remaining < wall_s:
                wall_s, by_deadline = remaining, True
        future = self._pool.schedule(_run_budgeted, args=(fn, args, cpu_s), timeout=wall_s)
        try:
            result, peak = self._result(future, should_stop, name)
        except TimeoutError:
            if by_deadline:
                self._count("deadline", name)
                raise CellStopped("deadline", f"{name}: analysis stopped: the case's deadline passed") from None
            self._count("over_budget", name)
            raise CellStopped("budget", f"{name}: analysis of this cell took longer than its budget of "
                                        f"{wall_s:.0f} s (wall clock) and was stopped") from None
        except (MemoryError, _OutOfMemory) as exc:
            self._note_peak(getattr(exc, "peak_rss_bytes", 0))
            self._count("memory", name)
            raise CellStopped("memory", f"{name}: analysis of this cell needed more memory than its limit "
                                        f"of {self.budget.memory_bytes / 2**20:.0f} MiB and was stopped") from None
        except CancelledError:
            self._count("crashed", name)
            raise CellStopped("crashed", f"{name}: analysis was cancelled") from None
        except BrokenProcessPool:  # the workers could not be (re)started: start afresh
            self._count("crashed", name)
            with self._lock:
                broken, self._pool = self._pool, self._new_pool()
            broken.stop()
            raise CellStopped("crashed", f"{name}: the analysis workers failed; the cell was not analysed") from None
        except Exception as exc:
            from pebble import ProcessExpired

            if not isinstance(exc, ProcessExpired):
                raise  # fn's own error (bad input, a bug): the caller decides
            if exc.exitcode == -signal.SIGXCPU:
                self._count("over_budget", name)
                raise CellStopped("budget", f"{name}: analysis of this cell took longer than its budget of "
                                            f"{math.ceil(cpu_s)} s of CPU time and was stopped") from None
            self._count("crashed", name)
            how = (f"killed by signal {-exc.exitcode}" if exc.exitcode and exc.exitcode < 0
                   else f"exited with code {exc.exitcode}")
            raise CellStopped("crashed", f"{name}: the analysis process {how} (out of memory?); "
                                         "the cell was not analysed") from None
        self._note_peak(peak)
        self._count("completed", name)
        return result

    def _result(self, future, should_stop: Callable[[], bool] | None, name: str):
        """The future's result; with `should_stop`, cancels the future (pebble kills a
        running worker) and raises CellStopped("cancelled") as soon as it says True."""
        if should_stop is None:
            return future.result()
        while True:
            try:
                return future.result(timeout=defaults.ANALYSIS_STOP_POLL_S)
            except TimeoutError:
                if future.done():  # pebble's own wall-clock limit (also a TimeoutError)
                    raise
            if should_stop():
                future.cancel()
                self._count("cancelled", name)
                raise CellStopped("cancelled", f"{name}: analysis stopped: its case was cancelled")

    def _note_peak(self, peak_rss_bytes: int) -> None:
        with self._lock:
            self.stats.peak_rss_bytes = max(self.stats.peak_rss_bytes, peak_rss_bytes)

    def warm_up(self) -> int:
        """Start the workers now (the fork server imports the preload modules); returns a
        worker's process id."""
        return self._pool.schedule(os.getpid).result()

    def close(self) -> None:
        """Stop the workers (a running task is killed)."""
        self._pool.stop()
        self._pool.join(timeout=10)

    def __enter__(self) -> "AnalysisPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
