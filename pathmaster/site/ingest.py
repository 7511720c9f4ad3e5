"""Ingest a dataset into a site database: idempotent, crash-safe, never stopped by one bad file.

``ingest(dataset_dir, site_dir)`` lists the dataset with ``pathmaster.importers.iter_dataset``
(synthetic, Herlev, SIPaKMeD or plain class folders; each file an ``Unread``), skips the
cells the database holds, and for each other file: reads it, segments the cell and
estimates its background when the dataset has none, extracts its features and encodes its
image, thumbnail, mask and background PNGs (``analyse_units``: the costly part). One
writer, this process, inserts the rows with their files in batches, one transaction each
(see ``pathmaster.sitedb``), so killing the process at any moment leaves a consistent
database and running the same command again completes it. Files that cannot
be read or analysed (or whose analysis crashed or ran over its budget) are recorded in
the database's ``problems`` table by name and reported; the rest goes on. Finally the
search index is brought up to date (``pathmaster.site.growth.update_search_index``: the new
cells added to it, what the site learnt from its cells kept until it re-learns).

Where the analysis runs (``workers``, ``ray_address``): in this process (1 worker), in a
pool of local worker processes (``pathmaster.analysis.budget.AnalysisPool``: each task under a CPU
budget and a memory limit, a crashed worker replaced, the default of ``pathmaster index``
on every core), or as Ray tasks on a running Ray cluster (``ray_address``; Ray is the
site extra's, imported only then). All three run the same ``analyse_units`` over the same
chunks of files and hand back results in the dataset's order, so the database they make
is the same, row for row. Why Ray tasks, not Ray Data: the work is a map over files with
one ordered consumer that must stay a single process (the SQLite writer); plain tasks in
a bounded window give exactly that, with results in order, back-pressure and a failed
chunk retried file by file to name the bad one, and need no pandas/pyarrow (Ray Data's
dependencies) on a site. Results carry the encoded PNGs back to the writer, so a
cluster's nodes need the dataset's files (shared storage or the same path) but never the
site directory.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from pathmaster.image.io import encode_png
from pathmaster.records import CellRecord, InvalidInput
from pathmaster.analysis.cell import analyse_cell
from pathmaster.site.database import THUMBNAIL_PX, CellRow, SiteDB, cell_id_for, image_hash
from pathmaster.files import remove_orphan_temporaries

BATCH_SIZE = 32
# Files per task sent to a worker: enough to make the hand-over's cost small against the
# analysis (~30-100 ms a cell), few enough that the writer is never starved for long.
FILES_PER_TASK = 8
# Tasks in flight per worker: each worker always has its next task waiting.
TASKS_AHEAD = 3
# What a worker's first cell imports, imported once by the pool's fork server instead of by
# every new worker (its first cell cost ~2x the next without; skimage.measure loads lazily).
ANALYSIS_MODULES = ("pathmaster.site.ingest", "pathmaster.importers", "pathmaster.analysis.cell",
                    "skimage.measure._regionprops", "skimage.measure._find_contours")


@dataclass
class IngestReport:
    """What one ingest run did. problems: (file or cell, what is wrong) pairs."""

    added: int = 0
    skipped: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    total_cells: int = 0
    index: dict | None = None
    workers: int = 1
    where: str = "this process"

    @property
    def cells_per_second(self) -> float:
        return self.added / self.seconds if self.seconds > 0 else 0.0


def thumbnail(image: np.ndarray, size: int = THUMBNAIL_PX) -> np.ndarray:
    """The image shrunk (never enlarged) to at most ``size`` pixels a side, aspect kept."""
    picture = Image.fromarray(image)
    picture.thumbnail((size, size), Image.Resampling.LANCZOS)
    return np.asarray(picture)


@dataclass
class AnalysedCell:
    """One cell ready for the writer: its row, and its files (path relative to the site
    directory -> encoded PNG bytes), to be written before the row."""

    row: CellRow
    files: dict[str, bytes]


def encode_cell(record: CellRecord, mask: np.ndarray, background: np.ndarray, features: np.ndarray, *,
                mask_estimated: bool, background_estimated: bool, origin: str) -> AnalysedCell:
    """One cell's row and the encoded files it will point at (nothing is written)."""
    cell_id = cell_id_for(record.source_id)
    stem = f"cells/{cell_id[:2]}/{cell_id}"
    paths = {"image": f"{stem}.png", "thumbnail": f"{stem}-thumb.png",
             "mask": f"{stem}-mask.png", "background": f"{stem}-bg.png"}
    arrays = {"image": record.image, "thumbnail": thumbnail(record.image), "mask": mask, "background": background}
    row = CellRow(cell_id, record.source_id, record.diagnosis, origin, paths["image"], paths["thumbnail"],
                  paths["mask"], paths["background"], mask_estimated, background_estimated, features,
                  group=record.group, image_hash=image_hash(record.image))
    return AnalysedCell(row, {paths[key]: encode_png(arrays[key]) for key in paths})


def problem_pair(item) -> tuple[str, str]:
    """(file, problem) of an importer's ImportProblem."""
    return str(item.path), item.problem


def record_pixel_size(db: SiteDB, pixel_um: float | None) -> float | None:
    """Store the micrometres per pixel of the database's images (config "pixel_um"), and
    return it: the first dataset's, kept while every dataset added says the same; None
    (not known) from the first one that does not know or says another."""
    stored = db.get_config("pixel_um") if len(db) else pixel_um
    if stored is not None and (pixel_um is None or abs(float(pixel_um) - float(stored)) > 1e-9):
        stored = None
    db.set_config("pixel_um", None if stored is None else float(stored))
    return stored


def record_feature_schema(db: SiteDB, schema: str) -> str:
    """Store the feature schema the database's vectors are made with, and return it.

    A database whose cells were all measured with one schema keeps it. Cells added by a
    PathMaster with another schema make the set mixed ("mixed"): such a site gets images,
    never feature vectors, until it is indexed again into a new directory.
    """
    stored = db.get_config("feature_schema")
    if stored is None:
        stored = schema if len(db) == 0 else "unknown"  # cells from before schemas were kept
    elif stored != schema:
        stored = "mixed"
    db.set_config("feature_schema", stored)
    return stored


# ---------------------------------------------------------------- the analysis (any worker)

_one_thread = False


def analyse_units(units: list, vocabulary) -> list:
    """Read and analyse dataset files: the work of one task, in whichever process runs it.

    units: ``Unread`` files, ``CellRecord``s or ``ImportProblem``s. vocabulary: the site's
    (``pathmaster.vocabulary.Vocabulary``). Returns, in order, an ``AnalysedCell`` for every
    cell and a (file or cell, problem) pair for everything that could not be ingested.
    """
    global _one_thread
    if not _one_thread:  # a worker's numeric libraries run one thread: the cores are the workers'
        from pathmaster.analysis.budget import one_thread_numerics

        one_thread_numerics()
        _one_thread = True
    from pathmaster.importers import Unread

    out = []
    for unit in units:
        for item in unit.read() if isinstance(unit, Unread) else [unit]:
            out.append(_analyse_item(item, vocabulary))
    return out


def _analyse_item(item, vocabulary):
    if not isinstance(item, CellRecord):
        return problem_pair(item)
    if item.diagnosis is not None and item.diagnosis not in vocabulary:
        return (item.source_id, f"unknown diagnosis {str(item.diagnosis)[:64]!r}: not a label "
                                f"of the site's vocabulary {vocabulary.name!r}")
    try:
        analysis = analyse_cell(item.image, item.background, item.mask, item.source_id)
    except InvalidInput as exc:
        return (item.source_id, exc.problem)
    return encode_cell(item, analysis.mask, analysis.background, analysis.features,
                       mask_estimated=item.mask_estimated or analysis.mask_estimated,
                       background_estimated=item.background_estimated or analysis.background_estimated,
                       origin=item.origin)


def _unit_name(unit) -> str:
    return str(getattr(unit, "path", None) or getattr(unit, "source_id", "cell"))


class UnitFailed(Exception):
    """A task's worker crashed, ran out of memory or over its budget; str() says how."""


# ---------------------------------------------------------------- where the analysis runs


class _InProcess:
    """Analysis in this process, one task after another."""

    workers = 1
    where = "this process"

    def map(self, tasks, vocabulary):
        for units in tasks:
            yield units, analyse_units(units, vocabulary)

    def close(self) -> None:
        pass


class _Windowed:
    """Tasks submitted ahead, `window` at a time, results handed back in order; a failed
    task's `UnitFailed` is handed back in its result's place."""

    window = 1

    def map(self, tasks, vocabulary):
        running: deque = deque()
        tasks = iter(tasks)
        while True:
            while len(running) < self.window:
                units = next(tasks, None)
                if units is None:
                    break
                running.append((units, self._submit(units, vocabulary)))
            if not running:
                return
            units, handle = running.popleft()
            try:
                yield units, self._result(handle)
            except UnitFailed as exc:
                yield units, exc


class _LocalProcesses(_Windowed):
    """Worker processes on this machine (``AnalysisPool``: budgets, crashed workers replaced)."""

    def __init__(self, workers: int):
        from concurrent.futures import ThreadPoolExecutor

        from pathmaster.analysis.budget import AnalysisPool

        self.workers, self.window = workers, workers * TASKS_AHEAD
        self.where = f"{workers} local processes"
        self._pool = AnalysisPool(workers, preload=ANALYSIS_MODULES)
        # A thread per task in flight, not per worker: the pool then holds each worker's next
        # task, which the worker takes as soon as it is free, instead of waiting for this
        # process to be scheduled and hand it over (on a busy machine, a wait per task).
        self._threads = ThreadPoolExecutor(self.window, thread_name_prefix="ingest")

    def _submit(self, units, vocabulary):
        from pathmaster.defaults import MAX_ANALYSIS_PIXELS

        # Every file may cost what the largest cell allowed does.
        return self._threads.submit(self._pool.run, analyse_units, units, vocabulary,
                                    pixels=MAX_ANALYSIS_PIXELS * len(units), name=_unit_name(units[0]))

    def _result(self, future):
        from pathmaster.analysis.budget import CellStopped

        try:
            return future.result()
        except CellStopped as exc:
            raise UnitFailed(f"analysis stopped ({exc.reason})") from exc

    def close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
        self._pool.close()


class _RayTasks(_Windowed):
    """Ray tasks on the cluster at `address` (one CPU each)."""

    def __init__(self, address: str):
        try:
            import ray
        except ImportError:
            raise InvalidInput("analysing on a Ray cluster needs Ray: install the site extra "
                               "(pathmaster-qos[site])") from None
        self._ray = ray
        self._connected_here = not ray.is_initialized()
        if self._connected_here:
            ray.init(address=address, logging_level="warning", log_to_driver=False)
        self.workers = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self.window = self.workers * TASKS_AHEAD
        self.where = f"Ray at {address} ({self.workers} CPUs)"
        self._remote = ray.remote(num_cpus=1, max_retries=0)(analyse_units)

    def _submit(self, units, vocabulary):
        return self._remote.remote(units, vocabulary)

    def _result(self, ref):
        exceptions = self._ray.exceptions
        try:
            return self._ray.get(ref)
        except (exceptions.WorkerCrashedError, exceptions.OutOfMemoryError, exceptions.NodeDiedError) as exc:
            raise UnitFailed(f"analysis process failed ({type(exc).__name__})") from exc

    def close(self) -> None:
        if self._connected_here:
            self._ray.shutdown()


def analysis_runner(workers: int = 1, ray_address: str | None = None):
    """Where ``ingest`` analyses: Ray tasks at `ray_address` when given, else `workers`
    local processes (1: this process). Has ``workers``, ``where``, ``map``, ``close``."""
    if ray_address:
        return _RayTasks(ray_address)
    if workers < 1:
        raise ValueError(f"workers must be at least 1, got {workers}")
    return _InProcess() if workers == 1 else _LocalProcesses(workers)


def local_cores() -> int:
    """The cores this process may run on (its CPU affinity), the default number of workers."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ---------------------------------------------------------------- the one writer


class _Writer:
    """Writes analysed cells (rows with their files, `batch_size` cells a transaction) and problems."""

    def __init__(self, db: SiteDB, report: IngestReport, known: set[str], batch_size: int):
        self.db, self.report, self.known, self.batch_size = db, report, known, batch_size
        self.pending: list[AnalysedCell] = []
        self.problems: list[tuple[str, str]] = []

    def take(self, outcome) -> None:
        if isinstance(outcome, AnalysedCell):
            if outcome.row.source_id in self.known:  # one of a slide's cells, ingested before
                self.report.skipped += 1
                return
            self.pending.append(outcome)
            self.known.add(outcome.row.source_id)
            if len(self.pending) >= self.batch_size:
                self.commit()
        else:
            self.problems.append(outcome)
            self.report.problems.append(outcome)

    def commit(self) -> None:
        with self.db.transaction():
            for cell in self.pending:
                self.db.add_cell(cell.row, cell.files)
            for source, problem in self.problems:
                self.db.record_problem(source, problem)
        self.report.added += len(self.pending)
        self.pending.clear()
        self.problems.clear()


def _prepare_site(db: SiteDB, dataset_dir, records, vocabulary):
    """Check and record the site's feature set, schema and vocabulary; returns the vocabulary."""
    from pathmaster.features import feature_names
    from pathmaster.features.schema import feature_schema

    names = list(feature_names())
    stored = db.get_config("feature_names")
    if stored is None:
        db.set_config("feature_names", names)
    elif stored != names:
        raise InvalidInput(
            f"this site was indexed with a different feature set ({len(stored)} features, this "
            f"PathMaster computes {len(names)}); index into a new site directory", db.path)
    record_feature_schema(db, feature_schema())
    from pathmaster.vocabulary import site_vocabulary

    default = None
    if records is None and dataset_dir is not None:
        from pathmaster.importers import default_vocabulary

        default = default_vocabulary(dataset_dir)
    return site_vocabulary(db, vocabulary, default)


def task_size(remaining: int | None, workers: int, most: int = FILES_PER_TASK) -> int:
    """Files in the next task: `most`, shrinking toward one as the last `2 * most * workers`
    files are handed out (guided scheduling), so that the workers finish together instead
    of one worker's last full task running alone. remaining: files not handed out yet
    (None: unknown, `most`)."""
    if remaining is None:
        return most
    return max(1, min(most, -(-remaining // (2 * workers))))


def _chunks(units, known: set[str], report: IngestReport, bar, most: int, filled: list,
            total: int | None = None, workers: int = 1):
    """The units not yet in the database in tasks of `task_size` files (`total`: how many
    units there are, None if unknown); known cells are counted as skipped, and a known cell
    already read (a CellRecord) adds its group and image hash to `filled`."""
    chunk, seen = [], 0
    size = task_size(total, workers, most)
    for unit in units:
        seen += 1
        if getattr(unit, "source_id", None) in known:  # a file whose one cell is in already
            report.skipped += 1
            if isinstance(unit, CellRecord):
                filled.append((unit.source_id, unit.group, image_hash(unit.image)))
            bar.update(1)
            continue
        chunk.append(unit)
        if len(chunk) >= size:
            yield chunk
            chunk = []
            size = task_size(None if total is None else max(0, total - seen), workers, most)
    if chunk:
        yield chunk


def _fill_in_older_rows(db: SiteDB, filled: list) -> None:
    """Give cells stored before groups and image hashes were kept theirs: from the records met
    again (`filled`), else the hash of the stored image (PNG: the same pixels) and the group
    its Herlev file name tells."""
    from pathmaster.importers.base import herlev_group
    from pathmaster.image.io import decode_image

    with db.transaction():
        for source, group, digest in filled:
            db.fill_in(source, group, digest)
    missing = db.cells_without_hash()
    with db.transaction():
        for cell in missing:
            digest = image_hash(decode_image(db.read_file(cell.image_path), cell.image_path))
            db.fill_in(cell.source_id, herlev_group(Path(cell.source_id).name), digest)


def ingest(dataset_dir: str | Path, site_dir: str | Path, *, batch_size: int = BATCH_SIZE,
           progress: bool = False, build_index: bool = True, algorithm: str | None = None,
           features: str | None = None, records=None, vocabulary=None, workers: int = 1,
           ray_address: str | None = None, files_per_task: int = FILES_PER_TASK,
           relearn: bool = False, similarity: str | None = None, pixel_um: float | None = None,
           eye: dict | None = None) -> IngestReport:
    """Add every cell of ``dataset_dir`` that ``site_dir`` does not hold yet.

    batch_size: cells per committed transaction (a kill loses at most this much work).
    progress: show a tqdm progress bar (files, with an ETA) on stderr. build_index: bring
    the search index up to date at the end (``pathmaster.site.growth.update_search_index``: new
    cells added, what the site learnt kept unless `relearn` or the new cells drifted;
    ``algorithm``/``features``/``similarity``/``eye`` as in ``index.build_search_index``'s
    ``algorithm``/``features``/``similarity_choice``/``eye``). pixel_um: micrometres per pixel of
    the cells added, when the caller knows it (None: what the dataset's importer knows,
    ``importers.dataset_pixel_um``, for a dataset folder; not known for `records`).
    records: an iterable to use instead of ``iter_dataset(dataset_dir)`` (CellRecords and
    ImportProblems). vocabulary: the site's diagnosis vocabulary (a
    ``pathmaster.vocabulary.Vocabulary``), stored in the database on the first run; None
    keeps the stored one, or on a new site takes ``importers.default_vocabulary`` of the
    dataset. A cell whose diagnosis is not a label of it is a problem naming the label and
    the vocabulary. workers: local analysis processes (1: this process; ``local_cores()``
    for every core); ray_address: analyse as Ray tasks on that cluster instead (see the
    module docstring). files_per_task: files a worker analyses per task (fewer in the
    last tasks, see `task_size`).
    Returns an ``IngestReport``; raises InvalidInput when the dataset cannot be read at all,
    was analysed with another feature set than the site's, or `vocabulary` is not the
    site's.
    """
    from tqdm import tqdm

    from pathmaster.importers import iter_dataset

    started = time.perf_counter()
    site_dir = Path(site_dir)
    report = IngestReport()
    with SiteDB(site_dir, create=True) as db:
        vocabulary = _prepare_site(db, dataset_dir, records, vocabulary)
        if pixel_um is None and records is None:
            from pathmaster.importers import dataset_pixel_um

            pixel_um = dataset_pixel_um(dataset_dir)
        record_pixel_size(db, pixel_um)
        known = db.source_ids()
        remove_orphan_temporaries(site_dir)
        if records is None:
            def listing():
                return iter_dataset(Path(dataset_dir), vocabulary=vocabulary, unread=True)

            units, total = listing(), sum(1 for _ in listing())
        else:
            units, total = records, (len(records) if hasattr(records, "__len__") else None)
        writer = _Writer(db, report, known, batch_size)
        runner = analysis_runner(workers, ray_address)
        report.workers, report.where = runner.workers, runner.where
        bar = tqdm(total=total, unit="file", desc=f"indexing {Path(dataset_dir).name}", disable=not progress)
        try:
            filled: list[tuple[str, str | None, str]] = []
            tasks = _chunks(units, known, report, bar, files_per_task, filled, total, runner.workers)
            for units_done, outcomes in runner.map(tasks, vocabulary):
                if isinstance(outcomes, UnitFailed):  # name the file(s) that failed: one by one
                    outcomes = _one_by_one(runner, units_done, vocabulary)
                for outcome in outcomes:
                    writer.take(outcome)
                bar.update(len(units_done))
                bar.set_postfix(added=report.added + len(writer.pending), problems=len(report.problems),
                                refresh=False)
            writer.commit()
            _fill_in_older_rows(db, filled)
        finally:
            bar.close()
            runner.close()
        report.total_cells = len(db)
        report.seconds = time.perf_counter() - started
        if build_index and report.total_cells:
            from pathmaster.site.growth import update_search_index

            report.index = update_search_index(db, algorithm=algorithm, features=features, relearn=relearn,
                                               similarity_choice=similarity, eye=eye)
    return report


def _one_by_one(runner, units: list, vocabulary) -> list:
    """The outcomes of `units` analysed one per task: a file whose task fails again is a problem."""
    outcomes = []
    for units_done, result in runner.map([[unit] for unit in units], vocabulary):
        if isinstance(result, UnitFailed):
            result = [(_unit_name(units_done[0]), f"{result}; the file was not ingested")]
        outcomes.extend(result)
    return outcomes
