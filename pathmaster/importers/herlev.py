"""The Herlev Pap-smear layout (Jantzen et al. 2005, "New database pictures").

    ROOT/<class folder>/NAME.BMP      the cell, 24-bit RGB
    ROOT/<class folder>/NAME-d.bmp    its segmentation, colour-coded (below)

Class folders: normal_superficiel, normal_intermediate, normal_columnar, light_dysplastic,
moderate_dysplastic, severe_dysplastic, carcinoma_in_situ (see records.DIAGNOSIS_ALIASES).
Mask colour code: (0,0,255) nucleus, (0,0,128) cytoplasm, (255,0,0) background;
(128,128,128) "unsure" and (0,0,0) "other" pixels at the cell's edge count as background
(their number is kept in the record's extra). Herlev has no blank-slide images, so the
background is always estimated; a cell without its -d.bmp is segmented automatically.
A cell's group is its slide image, from Herlev's file names (``base.herlev_group``); copies
renamed otherwise (the 40 px set's K-N.BMP) have none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np

from pathmaster.image.io import read_image
from pathmaster.records import BACKGROUND, CYTOPLASM, NUCLEUS, CellRecord, InvalidInput

from .base import (ImportProblem, Unread, each_class, finish, herlev_group, is_image, problem_from, source_id_of,
                   subfolders)

NAME = "herlev"
MASK_SUFFIX = "-d"

# Colour -> label. "Unsure"/"other" map to background: they sit outside the cell's edge.
COLOUR_CODE = {
    (0, 0, 255): NUCLEUS,
    (0, 0, 128): CYTOPLASM,
    (255, 0, 0): BACKGROUND,
    (128, 128, 128): BACKGROUND,
    (0, 0, 0): BACKGROUND,
}
UNSURE_COLOURS = ((128, 128, 128), (0, 0, 0))
# A resampled or re-saved copy shifts colours a little; beyond this it is not the code.
COLOUR_TOLERANCE = 40.0


def _masks_by_stem(files: list[Path]) -> dict[str, Path]:
    """Cell stem -> its NAME-d.bmp, whatever the case of the extension."""
    return {p.stem[: -len(MASK_SUFFIX)]: p for p in files
            if p.stem.endswith(MASK_SUFFIX) and p.suffix.lower() == ".bmp"}


def pixel_um(root: Path) -> float | None:
    """Micrometres per pixel of the dataset's images: None, Herlev's files do not say (and its public copies are resized cell by cell)."""
    return None


def looks_like(root: Path) -> bool:
    """A Herlev root has class folders holding NAME-d.bmp masks."""
    return any(
        p.stem.endswith(MASK_SUFFIX) and p.suffix.lower() == ".bmp"
        for folder in subfolders(root) for p in folder.iterdir()
    )


def decode_colour_mask(rgb: np.ndarray, name: str) -> tuple[np.ndarray, int]:
    """Herlev colour-coded mask, uint8 (H, W, 3) -> (labels uint8 (H, W), unsure pixel count).

    Each pixel takes the nearest code colour; a colour farther than COLOUR_TOLERANCE from
    every code colour raises InvalidInput naming `name`, the colour and its pixel count.
    """
    palette = np.array(list(COLOUR_CODE), dtype=np.float64)
    labels_of = np.array(list(COLOUR_CODE.values()), dtype=np.uint8)
    # One integer per colour: a 1-D unique is far cheaper than np.unique(axis=0).
    flat = rgb.reshape(-1, 3).astype(np.uint32)
    codes, inverse = np.unique((flat[:, 0] << 16) | (flat[:, 1] << 8) | flat[:, 2], return_inverse=True)
    colours = np.stack([codes >> 16, (codes >> 8) & 255, codes & 255], axis=1)
    distance = np.linalg.norm(colours[:, None, :].astype(np.float64) - palette[None], axis=2)
    nearest = distance.argmin(axis=1)
    far = distance.min(axis=1) > COLOUR_TOLERANCE
    if far.any():
        counts = np.bincount(inverse.ravel(), minlength=len(colours))
        shown = ", ".join(f"{tuple(int(c) for c in colours[i])} x {counts[i]}" for i in np.flatnonzero(far)[:5])
        raise InvalidInput(
            f"mask colours not in the Herlev code ({shown}); expected (0,0,255) nucleus, "
            "(0,0,128) cytoplasm, (255,0,0) background, (128,128,128)/(0,0,0) unsure",
            name,
        )
    labels = labels_of[nearest][inverse.ravel()].reshape(rgb.shape[:2])
    unsure_index = [i for i, colour in enumerate(COLOUR_CODE) if colour in UNSURE_COLOURS]
    unsure = int(np.isin(nearest[inverse.ravel()], unsure_index).sum())
    return labels, unsure


def iter_cells(root: Path, vocabulary) -> Iterator[Unread | ImportProblem]:
    return each_class(root, _class_cells, vocabulary)


def _class_cells(root: Path, folder: Path, diagnosis: str) -> Iterator[Unread | ImportProblem]:
    files = sorted(p for p in folder.iterdir() if is_image(p))
    masks = _masks_by_stem(files)
    mask_files = set(masks.values())
    images = [p for p in files if p not in mask_files]
    stems = {p.stem for p in images}
    for stem, orphan in masks.items():
        if stem not in stems:
            yield ImportProblem(str(orphan), f"mask without its cell image ({stem}.BMP not found)")
    for image_path in images:
        yield Unread(str(image_path), source_id_of(root, image_path), _cell,
                     (root, image_path, masks.get(image_path.stem), diagnosis))


def _cell(root: Path, image_path: Path, mask_path: Path | None, diagnosis: str) -> CellRecord | ImportProblem:
    try:
        image = read_image(image_path)
    except InvalidInput as exc:
        return problem_from(exc, image_path)
    extra: dict = {"path": str(image_path)}
    mask = None
    if mask_path is not None:
        try:
            rgb = read_image(mask_path)
            if rgb.shape != image.shape:
                raise InvalidInput(
                    f"mask is {rgb.shape[1]} x {rgb.shape[0]} pixels but its image is "
                    f"{image.shape[1]} x {image.shape[0]} (width x height)", mask_path)
            mask, extra["unsure_pixels"] = decode_colour_mask(rgb, str(mask_path))
        except InvalidInput as exc:
            return problem_from(exc, mask_path)
        extra["mask_path"] = str(mask_path)
    record = CellRecord(
        source_id=source_id_of(root, image_path),
        diagnosis=diagnosis, image=image, mask=mask, background=None, origin=NAME, extra=extra,
        group=herlev_group(image_path.stem),
    )
    return finish(record, mask_path or image_path)
