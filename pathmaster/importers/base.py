"""What every importer shares: the problem record, class folders, finishing a cell, and the
slide image a cell's file name says it was cropped from."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from pathmaster.image.io import ACCEPTED_SUFFIXES, check_cell
from pathmaster.records import CellRecord, InvalidInput
from pathmaster.image.segmentation import complete_cell

IMAGE_SUFFIXES = frozenset(ACCEPTED_SUFFIXES)  # the accepted formats' (pathmaster.image.io)
# Herlev's own file names: <image id>-<image id>-NNN, cell NNN cropped from the slide image
# named by the two ids (e.g. 153956040-153956058-001). The 40 px copy's "K-N" names (class
# number, running number) say nothing about the image.
HERLEV_CELL_NAME = re.compile(r"^(?P<group>\d{5,}-\d{5,})-\d+$")
# Folders that archive tools and desktops leave behind; never class folders.
IGNORED_DIRS = frozenset({"__macosx", "__pycache__"})


@dataclass(frozen=True)
class ImportProblem:
    """A file (or folder) that could not be imported, and why. Ingest reports it and goes on."""

    path: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def herlev_group(stem: str) -> str | None:
    """The slide image a Herlev-named cell file comes from (its name before the last
    ``-NNN``), or None when the name is not Herlev's (``HERLEV_CELL_NAME``)."""
    found = HERLEV_CELL_NAME.match(stem)
    return found["group"] if found else None


@dataclass(frozen=True)
class Unread:
    """A dataset file listed but not read yet; ``read()`` reads it into its CellRecords and
    ImportProblems. Picklable (a module-level `reader` and its arguments), so that another
    process, or another machine of a Ray cluster, reads and analyses it: listing a dataset
    costs a directory walk, reading it the decoding and segmentation.

    path: the file that names it in reports. source_id: its one cell's source id when the
    name tells it (so a cell already ingested is skipped unread), None when reading tells
    (a whole slide's several cells).
    """

    path: str
    source_id: str | None
    reader: Callable
    args: tuple

    def read(self) -> list:
        out = self.reader(*self.args)
        return [out] if isinstance(out, (CellRecord, ImportProblem)) else list(out)


def source_id_of(root: Path, image_path: Path) -> str:
    """A cell file's source id: its path under the dataset's root, without the suffix."""
    return image_path.relative_to(root).with_suffix("").as_posix()


def is_image(path: Path) -> bool:
    return path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES and not path.name.startswith(".")


def subfolders(path: Path) -> list[Path]:
    """Visible subfolders, sorted by name."""
    return sorted(
        p for p in path.iterdir()
        if p.is_dir() and not p.name.startswith(".") and p.name.lower() not in IGNORED_DIRS
    )


def each_class(
    root: Path, cells_in: Callable[[Path, Path, str], Iterator[CellRecord | ImportProblem]], vocabulary
) -> Iterator[CellRecord | ImportProblem]:
    """Run `cells_in(root, class_folder, diagnosis)` over every class folder of `root`;
    a folder whose name is no label of `vocabulary` (a ``pathmaster.vocabulary.Vocabulary``)
    becomes one ImportProblem instead, naming the label and the vocabulary."""
    for folder in subfolders(root):
        try:
            diagnosis = vocabulary.label(folder.name, folder)
        except InvalidInput as exc:
            yield ImportProblem(str(folder), exc.problem + "; its files were not imported")
            continue
        yield from cells_in(root, folder, diagnosis)


def finish(record: CellRecord, path: Path) -> CellRecord | ImportProblem:
    """Validate a record, fill in a missing mask/background (flagged), validate again.

    Returns the completed record, or an ImportProblem naming `path` and the problem.
    """
    try:
        check_cell(record.image, record.mask, record.background, str(path))
        complete_cell(record)
        check_cell(record.image, record.mask, record.background, str(path))
    except InvalidInput as exc:
        return ImportProblem(str(path), exc.problem)
    return record


def problem_from(exc: InvalidInput, fallback: Path) -> ImportProblem:
    """An InvalidInput as an ImportProblem, keeping the file it names."""
    return ImportProblem(exc.source or str(fallback), exc.problem)
