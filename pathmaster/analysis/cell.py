"""One cell analysed: its features, and the patch its eye sees.

- ``analyse_cell(image, background, mask)`` -> ``CellAnalysis``: the 130 interpretable
  features of one cell, segmenting it and estimating its blank slide when they are not
  given, and the eye's patch; what a site and the coordinator both run on an upload.
- ``cell_patch(image, background, size)``: the cell's image made square (padded with its
  blank slide's colour) and resized to the eye's input side; uint8 (S, S, 3).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from pathmaster.records import CellRecord


log = logging.getLogger(__name__)


@dataclass
class CellAnalysis:
    """Features of one test cell, and whether PathMaster had to estimate its inputs.

    features: float64 (n_features,). mask, background: the arrays actually used (given or
    estimated), uint8 (H, W) and (H, W, 3).
    """

    features: np.ndarray
    background_estimated: bool
    mask_estimated: bool
    mask: np.ndarray | None = None
    background: np.ndarray | None = None
    # Which cell of the crop was taken and why (``pathmaster.image.segmentation.complete_cell``);
    # None when the mask and background were both given.
    cell_choice: dict | None = None
    patch: np.ndarray | None = None  # uint8 (S, S, 3): what the eye sees (embedding.cell_patch)


def analyse_cell(image: np.ndarray, background: np.ndarray | None = None, mask: np.ndarray | None = None,
                 source: str | None = None) -> CellAnalysis:
    """Features of one cell, segmenting it and estimating its background when not given.

    Parameters
    ----------
    image : ndarray of uint8, shape (H, W, 3)
        RGB cell image.
    background : ndarray of uint8, shape (H, W, 3), optional
        The blank slide; estimated when None.
    mask : ndarray of int, shape (H, W), optional
        Labels 0-3; segmented when None.
    source : str, optional
        The file or cell named in error messages (default "cell").

    The arrays are checked once (`pathmaster.image.io.check_cell`; by
    `pathmaster.image.segmentation.complete_cell` when it fills something in) and analysed as
    they are. Raises InvalidInput
    naming ``source`` for arrays that do not fit together or a mask without a nucleus.
    """
    from pathmaster.features.extract import features_of
    from pathmaster.features.regions import crop_regions
    from pathmaster.image.io import check_cell

    cell = CellRecord(source or "cell", None, image, mask=mask, background=background)
    if mask is None or background is None:
        from pathmaster.image.segmentation import complete_cell

        complete_cell(cell)  # checks, then fills in what is missing
    else:
        check_cell(image, mask, background, cell.source_id)
    features = features_of(crop_regions(cell.image, cell.background, cell.mask))
    patch = cell_patch(cell.image, cell.background)
    return CellAnalysis(features, cell.background_estimated, cell.mask_estimated, cell.mask, cell.background,
                        cell_choice=cell.extra.get("cell_choice"), patch=patch)


# Side of the patch made of an upload, in pixels: the largest side a site's eye may read
# (the eye resizes it to its own, ``pathmaster.eye.DEFAULT_RESOLUTION`` by default), so a
# database cell and a query are made alike and every site can read the one patch sent.
PATCH_PX = 160


def cell_patch(image: np.ndarray, background: np.ndarray, size: int = PATCH_PX) -> np.ndarray:
    """The cell's image as the eye sees it: square, ``size`` px a side, its colours as taken.

    Parameters
    ----------
    image, background : ndarray of uint8, shape (H, W, 3)
        The cell and its blank slide (given or estimated).
    size : int
        Side of the patch.

    Returns
    -------
    ndarray of uint8, shape (size, size, 3)
        The whole image, padded to a square with the blank slide's median colour, resized
        (area averaging when shrinking, bilinear when enlarging).

    Notes
    -----
    The whole upload, not the segmented cell's box: a box round a mis-segmented cell (its
    nucleus alone, or a neighbour) loses what the eye needs to see. Its colours as taken,
    not divided by the blank slide: on the development half the division lowered the eye's
    plain nearest-neighbour ROC AUC (0.942 -> 0.934), the eye having learnt photographs.
    """
    import cv2

    from pathmaster.image.morphology import channel_percentile

    h, w = image.shape[:2]
    side = max(h, w)
    slide = channel_percentile(np.asarray(background).reshape(-1, 3), 50).astype(np.uint8)
    square = np.empty((side, side, 3), np.uint8)
    square[...] = slide
    top, left = (side - h) // 2, (side - w) // 2
    square[top:top + h, left:left + w] = image
    # Area averaging: every pixel of the upload counts, as PIL's antialiased reduction; in
    # NumPy out of NumPy, so an upload's pixels are decoded once (services/cells.py).
    return cv2.resize(square, (size, size), interpolation=cv2.INTER_AREA if side >= size else cv2.INTER_LINEAR)
