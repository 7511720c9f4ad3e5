"""Pair a case's files into cells by file name.

A cell is an image file NAME.EXT with, optionally, its blank-slide background
NAME-background.EXT and its 4-region label mask NAME-mask.EXT (any image extension,
any letter case), or Herlev's colour-coded mask NAME-d.bmp (`mask_labels` turns it into
labels before it is sent). The web page and `pathmaster batch` both use this one rule, so a
folder that pairs one way in the browser pairs the same way in a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import PurePath

from pathmaster.ids import id_from_name
from pathmaster.image.io import ACCEPTED_SUFFIXES

IMAGE_EXTENSIONS = ACCEPTED_SUFFIXES  # the accepted formats' suffixes (pathmaster.image.io)
# Suffixes of a companion file's stem, mapped to the CellImage field they fill.
COMPANION_SUFFIXES = {"-background": "background", "-mask": "mask"}
HERLEV_MASK_SUFFIX = "-d"  # Herlev's NAME-d.bmp: the cell's mask, colour-coded


def is_herlev_mask(name: str) -> bool:
    """True for a Herlev colour-coded mask file name, NAME-d.bmp (any letter case)."""
    path = PurePath(name)
    return path.suffix.lower() == ".bmp" and path.stem.endswith(HERLEV_MASK_SUFFIX)


def mask_labels(name: str, data: bytes) -> bytes:
    """A mask file's bytes as sent: a Herlev colour mask (`is_herlev_mask`) becomes a PNG of
    labels 0-3; any other mask is sent as it is. InvalidInput naming the file when a Herlev
    mask has colours outside its code."""
    if not is_herlev_mask(name):
        return data
    from pathmaster.image.io import decode_image, encode_png
    from pathmaster.importers.herlev import decode_colour_mask

    return encode_png(decode_colour_mask(decode_image(data, name), name)[0])


@dataclass
class CellFiles:
    """The files of one test cell: `image` always, `background`/`mask` when given.

    Each is a name (or path) exactly as it was passed to `pair_files`.
    `cell_id` is the image's name without its extension (with any folder part, so
    cells of different folders keep different ids), made a valid cell id
    (``pathmaster.ids.id_from_name``: other characters become '_', a long one is shortened).
    """

    cell_id: str
    image: str
    background: str | None = None
    mask: str | None = None

    def as_dict(self) -> dict:
        return {"cell_id": self.cell_id, "image": self.image,
                "background": self.background, "mask": self.mask}


@dataclass
class Pairing:
    """`cells` in name order, and `problems`: (file name, what is wrong) for files left out."""

    cells: list[CellFiles] = field(default_factory=list)
    problems: list[tuple[str, str]] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"cells": [c.as_dict() for c in self.cells],
                "problems": [{"file": f, "problem": p} for f, p in self.problems]}


def split_name(name: str) -> tuple[str, str | None]:
    """Return (cell stem, role) for one file name; role is None for a cell image,
    "background" or "mask" for a companion. The stem keeps any folder part so that
    cells in different folders never pair with each other."""
    path = PurePath(name)
    stem = str(path.with_suffix("")) if path.suffix else str(path)
    for suffix, role in COMPANION_SUFFIXES.items():
        if stem.lower().endswith(suffix):
            return stem[: -len(suffix)], role
    if is_herlev_mask(name):
        return stem[: -len(HERLEV_MASK_SUFFIX)], "mask"
    return stem, None


def extension_problem(name: str) -> str | None:
    """Why file `name` cannot be a cell's file from its extension alone, or None."""
    if PurePath(name).suffix.lower() in IMAGE_EXTENSIONS:
        return None
    return f"not an image file (expected one of {', '.join(IMAGE_EXTENSIONS)})"


def pair_files(names) -> Pairing:
    """Group file names (strings or paths) into cells.

    In:  an iterable of names such as "c1.png", "c1-background.png", "c1-mask.png".
    Out: a `Pairing`. A file is left out, with a problem naming it, when its extension
    is not an image type, when it is a background/mask whose cell image is missing, or
    when two files claim the same role for one cell (e.g. c1.png and c1.bmp).
    """
    images: dict[str, str] = {}
    companions: dict[str, dict[str, str]] = {}
    problems: list[tuple[str, str]] = []
    for name in sorted(str(n) for n in names):
        problem = extension_problem(name)
        if problem:
            problems.append((name, problem))
            continue
        stem, role = split_name(name)
        slot = images if role is None else companions.setdefault(stem, {})
        key = stem if role is None else role
        if key in slot:
            problems.append((name, f"a second {role or 'cell image'} for cell "
                                   f"{PurePath(stem).name!r} (already have {slot[key]})"))
            continue
        slot[key] = name
    cells = []
    for stem, image in sorted(images.items()):
        extra = companions.pop(stem, {})
        cells.append(CellFiles(cell_id=id_from_name(PurePath(stem).as_posix()), image=image,
                               background=extra.get("background"), mask=extra.get("mask")))
    for stem, orphans in sorted(companions.items()):
        for role, name in sorted(orphans.items()):
            problems.append((name, f"{role} without its cell image "
                                   f"{PurePath(stem).name}.png (or another image type)"))
    problems.sort()
    return Pairing(cells=cells, problems=problems)
