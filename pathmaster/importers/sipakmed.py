"""The SIPaKMeD layout (Plissiti et al., ICIP 2018): cropped cells and whole slides.

    ROOT/im_<Class>/[im_<Class>/]NNN.bmp                 a whole slide image (cluster), RGB
    ROOT/im_<Class>/[im_<Class>/]NNN_cytMM.dat           cell MM's cytoplasm boundary on it
    ROOT/im_<Class>/[im_<Class>/]NNN_nucMM.dat           cell MM's nucleus boundary on it
    ROOT/im_<Class>/[im_<Class>/]CROPPED/NNN_MM.bmp      cell MM cropped out, RGB
    ROOT/im_<Class>/[im_<Class>/]CROPPED/NNN_MM_cyt.dat  its own cytoplasm boundary
    ROOT/im_<Class>/[im_<Class>/]CROPPED/NNN_MM_nuc.dat  its own nucleus boundary

Classes: Superficial-Intermediate, Parabasal, Metaplastic, Koilocytotic, Dyskeratotic
(records.SIPAKMED_DIAGNOSES). A boundary file is a closed polygon written as the dataset
writes it: one vertex per line as "x,y" (column, row) in floating-point pixels, e.g.
``1146.5,489``, the first vertex repeated as the last. A whole slide's boundaries are in
that slide's pixel coordinates; a cropped cell's in the crop's.

A class folder with a CROPPED folder is read from it (one cell per file, the dataset's
4,049 cells); the whole slides beside it show the same cells again and are not read. A
class folder without one has its cells cut out of the whole slides: the bounding box of
each cytoplasm polygon plus a margin of glass (``cut_out``), the polygons moved into it.
A cell's group is its whole slide (cropped cell NNN_MM: slide NNN of its class folder), so
evaluation keeps cells of one slide image together.
SIPaKMeD has no blank-slide images: the background is always estimated; a cropped cell
with neither boundary file is segmented automatically.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import numpy as np
from skimage.draw import polygon as fill_polygon

from pathmaster.image.io import read_image
from pathmaster.records import CYTOPLASM, NUCLEUS, CellRecord, InvalidInput

from .base import ImportProblem, Unread, each_class, finish, is_image, problem_from, source_id_of, subfolders

NAME = "sipakmed"
CROPPED = "cropped"
MAX_BOUNDARY_BYTES = 1024 * 1024  # a cell boundary is a few hundred vertices
# Vertices may sit on or just past the image's edge; farther out means other coordinates.
EDGE_SLACK_PX = 2.0
# Glass kept around a cell cut out of a whole slide: a share of its size, at least this.
CUT_OUT_MARGIN_SHARE, MIN_CUT_OUT_MARGIN_PX = 0.15, 8
# NNN_cyt01.dat / NNN_nuc01.dat: cell 01 of the whole slide NNN.bmp.
SLIDE_BOUNDARY = re.compile(r"^(?P<slide>.+)_(?P<part>cyt|nuc)(?P<cell>\d+)$", re.IGNORECASE)


# CROPPED/NNN_MM.bmp: cell MM of the whole slide NNN.bmp of the same class folder.
CROPPED_CELL = re.compile(r"^(?P<slide>.+)_(?P<cell>\d+)$")


def cropped_group(root: Path, image_path: Path) -> str | None:
    """The whole slide a cropped cell comes from: its class folder's ``NNN`` (the slide image
    beside CROPPED/), as a path like the whole slide's own cells get; None for another name."""
    found = CROPPED_CELL.match(image_path.stem)
    if not found:
        return None
    class_folder = image_path.parent.parent  # .../CROPPED/NNN_MM.bmp
    return (class_folder / found["slide"]).relative_to(root).as_posix()


def _cropped_folders(class_folder: Path) -> list[Path]:
    return sorted(p for p in class_folder.rglob("*") if p.is_dir() and p.name.lower() == CROPPED)


def pixel_um(root: Path) -> float | None:
    """Micrometres per pixel of the dataset's images: None, SIPaKMeD's files do not say."""
    return None


def looks_like(root: Path) -> bool:
    """A SIPaKMeD root has class folders holding a CROPPED folder (or named im_<Class>)."""
    return any(
        folder.name.lower().startswith("im_") or _cropped_folders(folder)
        for folder in subfolders(root)
    )


def read_boundary(path: Path, shape: tuple[int, int], where: str = "image") -> np.ndarray:
    """Read a SIPaKMeD .dat boundary -> float64 (N, 2) vertices as (x, y) pixels.

    Parameters
    ----------
    path : Path
        The .dat file: one ``x,y`` vertex per line (floats), the polygon closed by
        repeating its first vertex (the repeat is dropped here).
    shape : tuple of int
        (H, W) of the image the coordinates refer to.
    where : str
        What that image is, for messages ("cropped image", "whole slide").

    Raises
    ------
    InvalidInput
        Naming the file, for unreadable numbers, fewer than 3 distinct vertices, or
        vertices outside `shape`.
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
    if len(points) > 1 and np.array_equal(points[0], points[-1]):
        points = points[:-1]  # the closing vertex
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
            f"{where} (e.g. x={x:g}, y={y:g}); coordinates must be that image's pixels",
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


def cut_out(slide: np.ndarray, cytoplasm: np.ndarray,
            nucleus: np.ndarray) -> tuple[np.ndarray, np.ndarray, tuple[int, int]]:
    """One cell of a whole slide: (image, mask, (x0, y0) of the cut-out on the slide).

    The cut-out is the bounding box of both polygons (slide pixels, (x, y) vertices) plus
    a margin of glass (``CUT_OUT_MARGIN_SHARE`` of its size, at least
    ``MIN_CUT_OUT_MARGIN_PX``), clipped to the slide; the mask is the polygons filled in it.
    """
    points = np.vstack([cytoplasm, nucleus])
    low, high = points.min(axis=0), points.max(axis=0)
    margin = np.maximum(MIN_CUT_OUT_MARGIN_PX, CUT_OUT_MARGIN_SHARE * (high - low))
    height, width = slide.shape[:2]
    x0, y0 = (int(v) for v in np.maximum(0, np.floor(low - margin)))
    x1 = int(min(width, np.ceil(high[0] + margin[0]) + 1))
    y1 = int(min(height, np.ceil(high[1] + margin[1]) + 1))
    offset = np.array([x0, y0], dtype=np.float64)
    image = np.ascontiguousarray(slide[y0:y1, x0:x1])
    return image, boundaries_to_mask(cytoplasm - offset, nucleus - offset, image.shape[:2]), (x0, y0)


def iter_cells(root: Path, vocabulary) -> Iterator[Unread | ImportProblem]:
    return each_class(root, _class_cells, vocabulary)


def _class_cells(root: Path, class_folder: Path, diagnosis: str) -> Iterator[Unread | ImportProblem]:
    cropped = _cropped_folders(class_folder)
    if cropped:
        for folder in cropped:
            for image_path in sorted(p for p in folder.iterdir() if is_image(p)):
                yield Unread(str(image_path), source_id_of(root, image_path), _cell, (root, image_path, diagnosis))
        return
    slides = _slide_boundaries(class_folder)
    if not slides:
        yield ImportProblem(str(class_folder), "no CROPPED folder with cropped cells and no whole slide "
                            "with boundary files (SIPaKMeD layout: im_<Class>/CROPPED/NNN_MM.bmp, "
                            "or im_<Class>/NNN.bmp with NNN_cyt01.dat and NNN_nuc01.dat)")
    for slide_stem, cells in slides.items():
        yield Unread(str(slide_stem), None, _slide_cells, (root, slide_stem, cells, diagnosis))


def _slide_boundaries(class_folder: Path) -> dict[Path, dict[str, dict[str, Path]]]:
    """Slide (its path without suffix) -> cell number -> {"cyt": .dat, "nuc": .dat}."""
    slides: dict[Path, dict[str, dict[str, Path]]] = {}
    for dat in sorted(class_folder.rglob("*")):
        inside = dat.relative_to(class_folder).parts
        if dat.suffix.lower() != ".dat" or CROPPED in (part.lower() for part in inside):
            continue
        found = SLIDE_BOUNDARY.match(dat.stem)
        if found:
            cells = slides.setdefault(dat.with_name(found["slide"]), {})
            cells.setdefault(found["cell"], {})[found["part"].lower()] = dat
    return slides


def _slide_cells(root: Path, slide_stem: Path, cells: dict[str, dict[str, Path]],
                 diagnosis: str) -> Iterator[CellRecord | ImportProblem]:
    slide_path = next((p for p in sorted(slide_stem.parent.iterdir())
                       if p.stem == slide_stem.name and is_image(p)), None)
    if slide_path is None:
        first = next(iter(next(iter(cells.values())).values()))
        yield ImportProblem(str(first), f"boundary files without their whole slide ({slide_stem.name}.bmp not found)")
        return
    try:
        slide = read_image(slide_path)
    except InvalidInput as exc:
        yield problem_from(exc, slide_path)
        return
    for number, files in sorted(cells.items()):
        if set(files) != {"cyt", "nuc"}:
            have = next(iter(files.values()))
            yield ImportProblem(str(have), "boundary file without its partner (each cell of a whole "
                                f"slide needs both {slide_stem.name}_cyt{number}.dat and _nuc{number}.dat)")
            continue
        try:
            shape = slide.shape[:2]
            image, mask, (x0, y0) = cut_out(slide, read_boundary(files["cyt"], shape, "whole slide"),
                                            read_boundary(files["nuc"], shape, "whole slide"))
        except InvalidInput as exc:
            yield problem_from(exc, files["cyt"])
            continue
        record = CellRecord(
            source_id=f"{slide_stem.relative_to(root).as_posix()}_{number}",
            diagnosis=diagnosis, image=image, mask=mask, background=None, origin=NAME,
            group=slide_stem.relative_to(root).as_posix(),
            extra={"path": str(slide_path), "cut_out": [x0, y0, image.shape[1], image.shape[0]],
                   "cytoplasm_boundary": str(files["cyt"]), "nucleus_boundary": str(files["nuc"])},
        )
        yield finish(record, files["nuc"])


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
            mask = boundaries_to_mask(read_boundary(cyt_path, shape, "cropped image"),
                                      read_boundary(nuc_path, shape, "cropped image"), shape)
        except InvalidInput as exc:
            return problem_from(exc, image_path)
        extra.update(cytoplasm_boundary=str(cyt_path), nucleus_boundary=str(nuc_path))
    record = CellRecord(
        source_id=source_id_of(root, image_path),
        diagnosis=diagnosis, image=image, mask=mask, background=None, origin=NAME, extra=extra,
        group=cropped_group(root, image_path),
    )
    return finish(record, nuc_path if mask is not None else image_path)
