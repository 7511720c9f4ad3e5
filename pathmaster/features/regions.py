"""Cutting one cell into PathMaster's regions (its arrays checked by imageio.check_cell).

The mask labels come from pathmaster.records: 0 background, 1 cytoplasm, 2 nucleus,
3 nucleolus. A nucleolus lies inside its nucleus, so the *nucleus region* is labels
2 and 3 together and the *cell region* is every label above 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pathmaster.image.io import check_cell
from pathmaster.records import CYTOPLASM, NUCLEOLUS, NUCLEUS, InvalidInput

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


def cell_regions(image: np.ndarray, background: np.ndarray, mask: np.ndarray,
                 source: str | None = None) -> CellRegions:
    """Check a cell's arrays and return its regions, cropped around the cell.

    Parameters
    ----------
    image, background : ndarray of uint8, shape (H, W, 3)
        RGB cell image and its blank slide.
    mask : ndarray of int, shape (H, W)
        Labels 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus.
    source : str, optional
        The file or cell named in error messages.

    Raises InvalidInput (naming `source`) where `pathmaster.image.io.check_cell`, the one
    rule for a cell's arrays, does, or when the background or mask is missing.
    """
    for what, array in (("background", background), ("mask", mask)):
        if array is None:
            raise InvalidInput(f"features need a {what} (pathmaster.image.segmentation.complete_cell "
                               "estimates a missing one)", source)
    check_cell(image, mask, background, source)
    return crop_regions(image, background, mask)


def crop_regions(image: np.ndarray, background: np.ndarray, mask: np.ndarray) -> CellRegions:
    """The regions of a cell whose arrays passed `check_cell`, cropped around the cell
    (its mask's bounding box plus CROP_MARGIN_PX): for callers that checked already."""
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
        nucleus=(labels == NUCLEUS) | (labels == NUCLEOLUS),
        nucleolus=labels == NUCLEOLUS,
    )
