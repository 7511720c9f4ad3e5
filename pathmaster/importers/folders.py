"""Plain class folders of images: the simplest thing a user can hand PathMaster.

    ROOT/<diagnosis>/NAME.png                 a cell (PNG, BMP, JPEG or TIFF)
    ROOT/<diagnosis>/NAME-mask.png            optional: its 0-3 label mask
    ROOT/<diagnosis>/NAME-background.png      optional: its blank slide

Cells named as Herlev names them (``<image id>-<image id>-NNN``, e.g. a Herlev JPEG copy) are
grouped by their slide image; other names carry no group.
Folder names are diagnoses in any vocabulary records.diagnosis_from_name knows. Cells
without a mask are segmented and cells without a background get an estimate, both flagged.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from pathmaster.image.io import read_image, read_mask
from pathmaster.records import CellRecord, InvalidInput

from .base import ImportProblem, Unread, each_class, finish, herlev_group, is_image, problem_from, source_id_of

NAME = "folders"
COMPANIONS = ("-mask", "-background")


def pixel_um(root: Path) -> float | None:
    """Micrometres per pixel of the dataset's images: None, plain class folders do not say."""
    return None


def looks_like(root: Path) -> bool:
    return any(is_image(p) for folder in root.iterdir() if folder.is_dir() for p in folder.iterdir())


def _companion(image: Path, suffix: str) -> Path | None:
    for candidate in image.parent.iterdir():
        if candidate.stem == image.stem + suffix and is_image(candidate):
            return candidate
    return None


def iter_cells(root: Path, vocabulary) -> Iterator[Unread | ImportProblem]:
    for stray in sorted(p for p in root.iterdir() if is_image(p)):
        yield ImportProblem(str(stray), "image outside a class folder: put it in ROOT/<diagnosis>/")
    yield from each_class(root, _class_cells, vocabulary)


def _class_cells(root: Path, folder: Path, diagnosis: str) -> Iterator[Unread | ImportProblem]:
    for image_path in sorted(p for p in folder.iterdir() if is_image(p)):
        if not image_path.stem.endswith(COMPANIONS):
            yield Unread(str(image_path), source_id_of(root, image_path), _cell, (root, image_path, diagnosis))


def _cell(root: Path, image_path: Path, diagnosis: str) -> CellRecord | ImportProblem:
    mask_path = _companion(image_path, "-mask")
    background_path = _companion(image_path, "-background")
    current = image_path
    try:
        image = read_image(image_path)
        current = mask_path
        mask = read_mask(mask_path, image.shape) if mask_path else None
        current = background_path
        background = read_image(background_path) if background_path else None
    except InvalidInput as exc:
        return problem_from(exc, current)
    record = CellRecord(
        source_id=source_id_of(root, image_path),
        diagnosis=diagnosis, image=image, mask=mask, background=background, origin=NAME,
        extra={"path": str(image_path)}, group=herlev_group(image_path.stem),
    )
    return finish(record, image_path)
