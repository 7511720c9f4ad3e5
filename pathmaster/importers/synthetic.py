"""Datasets written by `pathmaster synth` (pathmaster.image.synth.write_dataset)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator

from pathmaster.image.io import read_image, read_mask
from pathmaster.records import CellRecord, InvalidInput
from pathmaster.image.synth import GENERATOR, MANIFEST

from .base import ImportProblem, Unread, finish, problem_from

NAME = "synthetic"


def pixel_um(root: Path) -> float | None:
    """Micrometres per pixel: PathMaster's generator draws every cell at one scale."""
    from pathmaster.image.synth import PIXEL_UM

    return PIXEL_UM


def looks_like(root: Path) -> bool:
    manifest = root / MANIFEST
    if not manifest.is_file():
        return False
    try:
        return json.loads(manifest.read_text()).get("format") == GENERATOR
    except (OSError, ValueError, AttributeError):
        return False


def iter_cells(root: Path, vocabulary) -> Iterator[Unread | ImportProblem]:
    """One cell per manifest entry, with its own background and ground-truth mask."""
    manifest_path = root / MANIFEST
    try:
        manifest = json.loads(manifest_path.read_text())
        cells = manifest["cells"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        yield ImportProblem(str(manifest_path), f"unreadable manifest ({exc})")
        return
    for entry in cells:
        try:
            cell_id, diagnosis = entry["id"], entry["diagnosis"]
            paths = {key: root / entry[key] for key in ("image", "background", "mask")}
        except (KeyError, TypeError) as exc:
            yield ImportProblem(str(manifest_path), f"manifest entry {entry!r} lacks {exc}")
            continue
        if diagnosis not in vocabulary:
            yield ImportProblem(str(paths["image"]), f"unknown diagnosis {str(diagnosis)[:64]!r} in the manifest: "
                                f"not a label of the site's vocabulary {vocabulary.name!r}")
            continue
        yield Unread(str(paths["image"]), cell_id, _cell, (cell_id, diagnosis, paths))


def _cell(cell_id: str, diagnosis: str, paths: dict[str, Path]) -> CellRecord | ImportProblem:
    try:
        image = read_image(paths["image"])
        background = read_image(paths["background"])
        mask = read_mask(paths["mask"], image.shape)
    except InvalidInput as exc:
        return problem_from(exc, paths["image"])
    return finish(CellRecord(source_id=cell_id, diagnosis=diagnosis, image=image, mask=mask,
                             background=background, origin=NAME, extra={"path": str(paths["image"])}),
                  paths["image"])
