"""Datasets in, CellRecords out: one function whatever the layout on disk.

    for item in iter_dataset(path):
        if isinstance(item, ImportProblem):
            report(item)          # a bad file: say which and why, go on
        else:
            ingest(item)          # a CellRecord with image, mask and background filled in

Layouts, detected in this order (`detect_layout`):
- "synthetic": written by `pathmaster synth` (a manifest.json names every file);
- "sipakmed": SIPaKMeD class folders with CROPPED cells and _cyt.dat/_nuc.dat boundaries;
- "herlev": Herlev class folders with NAME.BMP and colour-coded NAME-d.bmp masks;
- "folders": class folders of plain images, masks and backgrounds optional.
Every record comes out complete: a missing mask is segmented (`mask_estimated=True`), a
missing background is estimated (`background_estimated=True`). See datasets/README.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from pathmaster.records import CellRecord, InvalidInput
from pathmaster.vocabulary import BUILTIN, DEFAULT, Vocabulary, merged

from . import folders, herlev, sipakmed, synthetic
from .base import ImportProblem, Unread, subfolders

LAYOUTS = {module.NAME: module for module in (synthetic, sipakmed, herlev, folders)}

__all__ = ["ImportProblem", "LAYOUTS", "Unread", "dataset_pixel_um", "default_vocabulary", "detect_layout",
           "iter_dataset"]


def detect_layout(path: str | Path) -> str:
    """Name of the layout of the dataset folder `path` (a key of LAYOUTS).

    Raises InvalidInput naming the path when it is not a folder or matches no layout.
    """
    root = Path(path)
    if not root.is_dir():
        raise InvalidInput("not a dataset folder (does not exist or is a file)", root)
    for name, module in LAYOUTS.items():
        if module.looks_like(root):
            return name
    raise InvalidInput(
        "no dataset found: expected a `pathmaster synth` folder (manifest.json), Herlev or "
        "SIPaKMeD class folders, or class folders of images (see datasets/README.md)",
        root,
    )


def dataset_pixel_um(path: str | Path, layout: str | None = None) -> float | None:
    """Micrometres per pixel of the dataset's images, as far as its layout knows (the
    layout module's ``pixel_um``); None when it does not (a viewer then says "pixel scale
    only")."""
    return LAYOUTS[layout or detect_layout(path)].pixel_um(Path(path))


def default_vocabulary(path: str | Path, layout: str | None = None) -> Vocabulary:
    """The vocabulary a dataset's labels are in when the site declares none: sipakmed for
    the SIPaKMeD layout; for class folders, the first built-in vocabulary that knows every
    folder name any of them knows (all of them merged when they are names of several);
    herlev otherwise."""
    root = Path(path)
    name = layout or detect_layout(root)
    if name == sipakmed.NAME:
        return BUILTIN["sipakmed"]
    if name == folders.NAME:
        names = [f.name for f in subfolders(root)]
        known = [n for n in names if any(_knows(v, n) for v in BUILTIN.values())]
        for vocabulary in BUILTIN.values():
            if all(_knows(vocabulary, n) for n in known):
                return vocabulary
        return merged(BUILTIN.values())  # names of several
    return BUILTIN[DEFAULT]


def _knows(vocabulary: Vocabulary, name: str) -> bool:
    try:
        vocabulary.label(name)
    except InvalidInput:
        return False
    return True


def iter_dataset(path: str | Path, layout: str | None = None, vocabulary: Vocabulary | None = None,
                 unread: bool = False) -> Iterator[CellRecord | ImportProblem | Unread]:
    """Import every cell of the dataset at `path`, in a stable order.

    layout: one of LAYOUTS to skip detection. vocabulary: the labels class folders may
    have (default: `default_vocabulary`). Yields complete CellRecords (image, mask and
    background filled in, `origin` = layout name, `source_id` unique within the dataset)
    and an ImportProblem for every file or folder that could not be imported (a class
    folder whose name is not in the vocabulary among them).
    unread: yield each file as an `Unread` (listed, not read: ``read()`` reads it, in
    this process or another) instead of its records.
    Raises InvalidInput only when `path` itself is not a dataset.
    """
    root = Path(path)
    name = layout or detect_layout(root)
    if name not in LAYOUTS:
        raise InvalidInput(f"unknown layout {name!r}; known: {', '.join(LAYOUTS)}", root)
    for item in LAYOUTS[name].iter_cells(root, vocabulary or default_vocabulary(root, name)):
        if unread or not isinstance(item, Unread):
            yield item
        else:
            yield from item.read()
