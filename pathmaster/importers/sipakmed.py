"""The SIPaKMeD layout (Plissiti et al., ICIP 2018), cropped single cells.

    ROOT/im_<Class>/[<Class>/]CROPPED/NNN_MM.bmp       one cropped cell, RGB
    ROOT/im_<Class>/[<Class>/]CROPPED/NNN_MM_cyt.dat   its cytoplasm boundary
    ROOT/im_<Class>/[<Class>/]CROPPED/NNN_MM_nuc.dat   its nucleus boundary

Classes: Superficial-Intermediate, Parabasal, Metaplastic, Koilocytotic, Dyskeratotic
(records.SIPAKMED_DIAGNOSES). A boundary file is a closed polygon, one vertex per line as
"x,y" (column, row; floating-point pixels of the cropped image). The full-slide images
next to the CROPPED folders (NNN.bmp with NNN_cyt01.dat ...) are not cells and are not read.
SIPaKMeD has no blank-slide images: the background is always estimated; a cropped cell
with neither boundary file is segmented automatically.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import numpy as np
from skimage.draw import polygon as fill_polygon

from pathmaster.imageio import read_image
from pathmaster.records import CYTOPLASM, NUCLEUS, CellRecord, InvalidInput

from .base import ImportProblem, each_class, finish, is_image, problem_from, subfolders

NAME = "sipakmed"
CROPPED = "cropped"
MAX_BOUNDARY_BYTES = 1024 * 1024  # a cell boundary is a few hundred vertices
# Vertices may sit on or just past the crop's edge; farther out means other coordinates.
EDGE_SLACK_PX = 2.0


def _cropped_folders(class_folder: Path) -> list[Path]:
    return sorted(p for p in class_folder.rglob("*") if p.is_dir() and p.name.lower() == CROPPED)


def looks_like(root: Path) -> bool:
    """A SIPaKMeD root has class folders holding a CROPPED folder (or named im_<Class>)."""
    return any(
        folder.name.lower().startswith("im_") or _cropped_folders(folder)
        for folder in subfolders(root)
    )


def read_boundary(path: Path, shape: tuple[int, int]) -> np.ndarray:
    """Read a SIPaKMeD .dat boundary -> float64 (N, 2) vertices as (x, y) pixels.

    Raises InvalidInput naming the file for unreadable numbers, fewer than 3 vertices, or
    vertices outside the (H, W) `shape` of the cropped image.
    """
    try:
        if path.stat().st_size > MAX_BOUNDARY_BYTES:
            raise InvalidInput(f"boundary file over {MAX_BOUNDARY_BYTES} bytes", path)
        text = path.read_text(encoding="ascii", errors="strict")
    except UnicodeDecodeError:
        raise InvalidInput("not a text boundary file (expected lines 'x,y')", path) from None
    except OSError as exc:
        raise InvalidInput(f"cannot read boundary file ({exc.strerror})", path) from None
    vertices = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = [f for f in re.split(r"[,\s;]+", line.strip()) if f]
        if not fields:
            continue
        try:
            if len(fields) != 2:
                raise ValueError
            vertices.append((float(fields[0]), float(fields[1])))
        except ValueError:
            raise InvalidInput(f"line {number} is {line.strip()[:40]!r}, expected 'x,y'", path) from None
    points = np.array(vertices, dtype=np.float64).reshape(-1, 2)
    if len(points) < 3:
        raise InvalidInput(f"boundary has {len(points)} vertices; a polygon needs at least 3", path)
    if not np.isfinite(points).all():
        raise InvalidInput("boundary has non-finite coordinates", path)
    height, width = shape
    outside = ((points[:, 0] < -EDGE_SLACK_PX) | (points[:, 0] > width - 1 + EDGE_SLACK_PX)
               | (points[:, 1] < -EDGE_SLACK_PX) | (points[:, 1] > height - 1 + EDGE_SLACK_PX))
    if outside.any():
        x, y = points[np.argmax(outside)]
        raise InvalidInput(
            f"{int(outside.sum())} of {len(points)} vertices lie outside the {width} x {height} "
            f"cropped image (e.g. x={x:g}, y={y:g}); coordinates must be the crop's pixels",
            path,
        )
    return points


def boundaries_to_mask(cytoplasm: np.ndarray, nucleus: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """Fill the two (x, y) polygons -> uint8 (H, W) mask, 1 cytoplasm, 2 nucleus."""
    mask = np.zeros(shape, dtype=np.uint8)
    rows, cols = fill_polygon(cytoplasm[:, 1], cytoplasm[:, 0], shape)
    mask[rows, cols] = CYTOPLASM
    rows, cols = fill_polygon(nucleus[:, 1], nucleus[:, 0], shape)
    mask[rows, cols] = NUCLEUS
    return mask


def iter_cells(root: Path) -> Iterator[CellRecord | ImportProblem]:
    return each_class(root, _class_cells)


def _class_cells(root: Path, class_folder: Path, diagnosis: str) -> Iterator[CellRecord | ImportProblem]:
    cropped = _cropped_folders(class_folder)
    if not cropped:
        yield ImportProblem(str(class_folder), "no CROPPED folder with cropped cells "
                            "(SIPaKMeD layout: im_<Class>/CROPPED/NNN_MM.bmp)")
    for folder in cropped:
        for image_path in sorted(p for p in folder.iterdir() if is_image(p)):
            yield _cell(root, image_path, diagnosis)


def _cell(root: Path, image_path: Path, diagnosis: str) -> CellRecord | ImportProblem:
    try:
        image = read_image(image_path)
    except InvalidInput as exc:
        return problem_from(exc, image_path)
    cyt_path = image_path.with_name(image_path.stem + "_cyt.dat")
    nuc_path = image_path.with_name(image_path.stem + "_nuc.dat")
    extra: dict = {"path": str(image_path)}
    mask = None
    if cyt_path.exists() or nuc_path.exists():
        missing = nuc_path if cyt_path.exists() else cyt_path
        if not missing.exists():
            return ImportProblem(str(missing), "boundary file missing (each cell needs both "
                                 "_cyt.dat and _nuc.dat, or neither to segment automatically)")
        try:
            shape = image.shape[:2]
            mask = boundaries_to_mask(read_boundary(cyt_path, shape), read_boundary(nuc_path, shape), shape)
        except InvalidInput as exc:
            return problem_from(exc, image_path)
        extra.update(cytoplasm_boundary=str(cyt_path), nucleus_boundary=str(nuc_path))
    record = CellRecord(
        source_id=image_path.relative_to(root).with_suffix("").as_posix(),
        diagnosis=diagnosis, image=image, mask=mask, background=None, origin=NAME, extra=extra,
    )
    return finish(record, nuc_path if mask is not None else image_path)
