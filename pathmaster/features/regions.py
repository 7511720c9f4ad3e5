"""Checking one cell's arrays and cutting it into PathMaster's regions.

The mask labels come from pathmaster.records: 0 background, 1 cytoplasm, 2 nucleus,
3 nucleolus. A nucleolus lies inside its nucleus, so the *nucleus region* is labels
2 and 3 together and the *cell region* is every label above 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathmaster.records import CYTOPLASM, MASK_LABELS, NUCLEOLUS, NUCLEUS, InvalidInput

# Pixels kept around the cell when cropping. At least the radius of the background
# smoothing kernel in density.py (4 sigma = 8 px), so that every cell pixel sees the same
# smoothed background as in the whole image: cropping changes no feature value.
CROP_MARGIN_PX = 8


@dataclass(frozen=True)
class CellRegions:
    """A cell cropped to its bounding box (plus CROP_MARGIN_PX) with boolean region masks.

    image, background: uint8 (h, w, 3); cell, cytoplasm, nucleus, nucleolus: bool (h, w).
    """

    image: np.ndarray
    background: np.ndarray
    cell: np.ndarray
    cytoplasm: np.ndarray
    nucleus: np.ndarray
    nucleolus: np.ndarray


def _check_rgb(name: str, array: np.ndarray, source: str | None) -> None:
    if not isinstance(array, np.ndarray):
        raise InvalidInput(f"{name} must be a numpy array, got {type(array).__name__}", source)
    if array.dtype != np.uint8:
        raise InvalidInput(f"{name} must be uint8 (0-255), got dtype {array.dtype}", source)
    if array.ndim != 3 or array.shape[2] != 3:
        raise InvalidInput(f"{name} must be RGB with shape (H, W, 3), got shape {array.shape}", source)


def cell_regions(image: np.ndarray, background: np.ndarray, mask: np.ndarray,
                 source: str | None = None) -> CellRegions:
    """Validate a cell's arrays and return its regions, cropped around the cell.

    image, background: uint8 (H, W, 3) RGB of the same shape; mask: integer (H, W) with
    labels in 0-3. Raises InvalidInput (naming `source` when given) on wrong dtypes or
    shapes, labels outside 0-3, or a cell with no nucleus.
    """
    _check_rgb("image", image, source)
    _check_rgb("background", background, source)
    if background.shape != image.shape:
        raise InvalidInput(
            f"background shape {background.shape} differs from image shape {image.shape}", source)
    if not isinstance(mask, np.ndarray) or not np.issubdtype(mask.dtype, np.integer):
        kind = getattr(mask, "dtype", type(mask).__name__)
        raise InvalidInput(f"mask must be an integer array, got {kind}", source)
    if mask.shape != image.shape[:2]:
        raise InvalidInput(f"mask shape {mask.shape} differs from image size {image.shape[:2]}", source)
    bad = np.setdiff1d(np.unique(mask), MASK_LABELS)
    if bad.size:
        raise InvalidInput(
            f"mask has labels {bad.tolist()[:5]} outside 0-3 (0 background, 1 cytoplasm, "
            f"2 nucleus, 3 nucleolus)", source)
    nucleus = (mask == NUCLEUS) | (mask == NUCLEOLUS)
    if not nucleus.any():
        raise InvalidInput("cell has no nucleus (no mask pixel labelled 2 or 3)", source)

    rows, cols = np.nonzero(mask)
    top, left = max(rows.min() - CROP_MARGIN_PX, 0), max(cols.min() - CROP_MARGIN_PX, 0)
    bottom, right = rows.max() + CROP_MARGIN_PX + 1, cols.max() + CROP_MARGIN_PX + 1
    box = (slice(top, bottom), slice(left, right))
    labels = mask[box]
    return CellRegions(
        image=image[box],
        background=background[box],
        cell=labels > 0,
        cytoplasm=labels == CYTOPLASM,
        nucleus=nucleus[box],
        nucleolus=labels == NUCLEOLUS,
    )
