"""Ingest a dataset into a site database: idempotent, crash-safe, never stopped by one bad file.

``ingest(dataset_dir, site_dir)`` walks the dataset with ``pathmaster.importers.iter_dataset``
(synthetic, Herlev, SIPaKMeD or plain class folders), and for each cell not yet in the
database: segments it and estimates its background when the dataset has none, extracts
its features, writes its image, thumbnail, mask and background files, and inserts its row.
Rows are committed in batches; files are written before their rows (see
``pathmaster.sitedb``), so killing the process at any moment leaves a consistent database
and running the same command again completes it. Files that cannot be read or analysed
are recorded in the database's ``problems`` table and reported; the rest goes on.
Finally the search index is rebuilt (``pathmaster.site.build_search_index``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from pathmaster.imageio import encode_png
from pathmaster.records import CellRecord, InvalidInput
from pathmaster.site import analyse_cell, build_search_index
from pathmaster.sitedb import THUMBNAIL_PX, CellRow, SiteDB, cell_id_for, remove_orphan_temporaries, write_atomic

BATCH_SIZE = 32


@dataclass
class IngestReport:
    """What one ingest run did. problems: (file or cell, what is wrong) pairs."""

    added: int = 0
    skipped: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    total_cells: int = 0
    index: dict | None = None

    @property
    def cells_per_second(self) -> float:
        return self.added / self.seconds if self.seconds > 0 else 0.0


def thumbnail(image: np.ndarray, size: int = THUMBNAIL_PX) -> np.ndarray:
    """The image shrunk (never enlarged) to at most ``size`` pixels a side, aspect kept."""
    picture = Image.fromarray(image)
    picture.thumbnail((size, size), Image.Resampling.LANCZOS)
    return np.asarray(picture)


def store_cell(site_dir: Path, record: CellRecord, mask: np.ndarray, background: np.ndarray,
               features: np.ndarray, *, mask_estimated: bool, background_estimated: bool,
               origin: str) -> CellRow:
    """Write one cell's files (atomically) and return the row that will point at them."""
    cell_id = cell_id_for(record.source_id)
    stem = f"cells/{cell_id[:2]}/{cell_id}"
    paths = {"image": f"{stem}.png", "thumbnail": f"{stem}-thumb.png",
             "mask": f"{stem}-mask.png", "background": f"{stem}-bg.png"}
    arrays = {"image": record.image, "thumbnail": thumbnail(record.image), "mask": mask, "background": background}
    for key, relative in paths.items():
        write_atomic(site_dir / relative, encode_png(arrays[key]))
    return CellRow(cell_id, record.source_id, record.diagnosis, origin, paths["image"], paths["thumbnail"],
                   paths["mask"], paths["background"], mask_estimated, background_estimated, features)


def site_vocabulary(db: SiteDB, dataset_dir=None, declared=None):
    """The site's vocabulary: the one stored in `db`, else `declared`, else the dataset's
    default (``importers.default_vocabulary``), else herlev; stored when new.

    Raises InvalidInput when `declared` differs from the stored one: a site has one
    vocabulary (index into a new site directory to use another).
    """
    from pathmaster.vocabulary import BUILTIN, DEFAULT, Vocabulary, vocabulary_for_labels

    stored = db.get_config("vocabulary")
    if stored is not None:
        current = Vocabulary.from_dict(stored, db.path)
        if declared is not None and declared.as_dict() != current.as_dict():
            raise InvalidInput(f"this site's vocabulary is {current.name!r}, not {declared.name!r}; a site has "
                               "one vocabulary (index into a new site directory to use another)", db.path)
        return current
    if declared is None and len(db):  # indexed before sites declared vocabularies
        declared = vocabulary_for_labels(c.diagnosis for c in db.cells())
    if declared is None and dataset_dir is not None:
        from pathmaster.importers import default_vocabulary

        declared = default_vocabulary(dataset_dir)
    declared = declared or BUILTIN[DEFAULT]
    db.set_config("vocabulary", declared.as_dict())
    return declared


def problem_pair(item) -> tuple[str, str]:
    """(file, problem) of an importer's ImportProblem."""
    return str(item.path), item.problem


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


def ingest(dataset_dir: str | Path, site_dir: str | Path, *, batch_size: int = BATCH_SIZE,
           progress: bool = False, build_index: bool = True, algorithm: str | None = None,
           features: str | None = None, records=None, vocabulary=None, similarity: str | None = None) -> IngestReport:
    """Add every cell of ``dataset_dir`` that ``site_dir`` does not hold yet.

    batch_size: cells per committed transaction (a kill loses at most this much work).
    progress: show a tqdm progress bar on stderr. build_index: rebuild the search index at
    the end (``algorithm``/``features``/``similarity`` as in ``build_search_index``'s
    ``algorithm``/``features``/``similarity_choice``). records: an iterable
    to use instead of ``iter_dataset(dataset_dir)`` (CellRecords and ImportProblems).
    vocabulary: the site's diagnosis vocabulary (a ``pathmaster.vocabulary.Vocabulary``),
    stored in the database on the first run; None keeps the stored one, or on a new site
    takes ``importers.default_vocabulary`` of the dataset. A cell whose diagnosis is not a
    label of it is a problem naming the label and the vocabulary.
    Returns an ``IngestReport``; raises InvalidInput when the dataset cannot be read at all,
    was analysed with another feature set than the site's, or `vocabulary` is not the
    site's.
    """
    from tqdm import tqdm

    from pathmaster.features import feature_names
    from pathmaster.features.schema import feature_schema

    started = time.perf_counter()
    site_dir = Path(site_dir)
    report = IngestReport()
    with SiteDB(site_dir, create=True) as db:
        names = list(feature_names())
        stored = db.get_config("feature_names")
        if stored is None:
            db.set_config("feature_names", names)
        elif stored != names:
            raise InvalidInput(
                f"this site was indexed with a different feature set ({len(stored)} features, this "
                f"PathMaster computes {len(names)}); index into a new site directory", db.path)
        record_feature_schema(db, feature_schema())
        vocabulary = site_vocabulary(db, dataset_dir if records is None else None, vocabulary)
        known = db.source_ids()
        remove_orphan_temporaries(site_dir)
        if records is None:
            from pathmaster.importers import iter_dataset

            records = iter_dataset(Path(dataset_dir), vocabulary=vocabulary)
        pending: list[CellRow] = []
        pending_problems: list[tuple[str, str]] = []

        def commit() -> None:
            with db.transaction():
                for row in pending:
                    db.add_cell(row)
                for source, problem in pending_problems:
                    db.record_problem(source, problem)
            report.added += len(pending)
            pending.clear()
            pending_problems.clear()

        bar = tqdm(records, unit="cell", desc=f"indexing {Path(dataset_dir).name}", disable=not progress)
        for item in bar:
            if not isinstance(item, CellRecord):
                pending_problems.append(problem_pair(item))
                report.problems.append(pending_problems[-1])
                continue
            if item.source_id in known:
                report.skipped += 1
                continue
            if item.diagnosis is not None and item.diagnosis not in vocabulary:
                pending_problems.append((item.source_id, f"unknown diagnosis {str(item.diagnosis)[:64]!r}: not a label "
                                                         f"of the site's vocabulary {vocabulary.name!r}"))
                report.problems.append(pending_problems[-1])
                continue
            try:
                analysis = analyse_cell(item.image, item.background, item.mask, item.source_id)
            except InvalidInput as exc:
                pending_problems.append((item.source_id, exc.problem))
                report.problems.append(pending_problems[-1])
                continue
            pending.append(store_cell(
                site_dir, item, analysis.mask, analysis.background, analysis.features,
                mask_estimated=item.mask_estimated or analysis.mask_estimated,
                background_estimated=item.background_estimated or analysis.background_estimated,
                origin=item.origin))
            known.add(item.source_id)
            if len(pending) >= batch_size:
                commit()
            bar.set_postfix(added=report.added + len(pending), problems=len(report.problems), refresh=False)
        commit()
        report.total_cells = len(db)
        report.seconds = time.perf_counter() - started
        if build_index and report.total_cells:
            report.index = build_search_index(db, algorithm=algorithm, features=features,
                                              similarity_choice=similarity)
    return report
