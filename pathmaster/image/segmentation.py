"""Automatic 4-region segmentation and blank-slide estimate, for cells that come without.

PathMaster wants, per cell, a mask (0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus)
and a blank-slide background image. Users and public datasets often have neither; this
module makes both from the cell image alone (flagging them as estimated is the caller's
job, see `complete_cell`).

Method, in optical density (OD = -log10(I / I0), the quantity stain amounts are linear in;
`pathmaster.image.optics.optical_density`, the same OD the features measure):
nucleus = the densest of three multi-Otsu classes of the whole crop, the piece nearest the
centre (a small, much denser core replaces it for pyknotic nuclei); cell = Otsu's split of
the other pixels, glass against cytoplasm, the piece holding the nucleus; nucleoli = small
eosinophilic spots inside the nucleus: a white top-hat of the eosin channel of a colour
deconvolution (skimage.color.rgb2hed), with the nucleus brought to one size first
(`_find_nucleoli`). See `segment_cell`; `benchmarks/bench_segmentation.py`
scores it against Herlev's hand-drawn masks per class. Without a blank slide the lamp is
flat (the brightest pixels), refitted as a surface to the glass round the cell when there
is enough of it. The blank-slide estimate for the features: the upper envelope of the
image by asymmetric least squares, see `estimate_background`.

Cost grows linearly with pixel count (uploads may be 4096 x 4096 px): no filter here has
a footprint that grows with the image (the opening uses distance transforms; the image
primitives, each equal to a scipy or scikit-image call, are in `pathmaster.image.morphology`), and the
nucleolus search works only around the nucleus. About 1.2-1.8 s of one core
per megapixel; `python benchmarks/bench_features.py --sweep` measures it.
"""

from __future__ import annotations

import cv2
import numpy as np
from scipy import ndimage as ndi
from skimage import color, morphology

from pathmaster.image.optics import optical_density
from pathmaster.image.io import check_cell, check_mask
from pathmaster.image.morphology import (
    channel_percentile,
    fill_holes,
    gaussian_smooth,
    grow,
    label_pieces,
    open_with_disk,
    shrink,
    threshold_multiotsu,
    threshold_otsu,
    white_tophat_disk,
)
from pathmaster.records import BACKGROUND, CYTOPLASM, NUCLEOLUS, NUCLEUS, CellRecord, InvalidInput

NO_NUCLEUS_FOUND = "no_nucleus_found"  # InvalidInput.code of a picture segmented to no nucleus

MIN_BACKGROUND_PIXELS = 200  # fewer glass pixels (and under 5% of the image): flat lamp
QUADRATIC_MIN_PIXELS = 1000  # fewer: fit a plane, not a quadratic
SPLIT_PREFERENCE = 1.3  # a later nucleus threshold must raise the density ratio this much
# A cell under this many times its nucleus's area has lost its cytoplasm to the glass
# threshold; the cytoplasm is looked for again below it (`_cell_and_nucleus`).
THIN_CYTOPLASM = 1.5
ENVELOPE_WEIGHT = 0.99  # asymmetric least squares: weight of pixels above the lamp surface
# How far nucleolus detection looks outside the nucleus: the eosin smoothing's reach
# (sigma 0.7 px truncated at 4 sigma: 3 px) plus the top-hat opening's (disk(4) twice: 8 px).
NUCLEOLUS_CONTEXT_PX = 12
# Nucleoli are looked for with the nucleus at this equivalent diameter (px), a larger one
# shrunk to it (`_find_nucleoli`): nucleoli are 1-2 um across in nuclei of ~6-10 um, a
# share of the nucleus, not a number of pixels. At 32 px the top-hat's disk(4) passes spots
# up to ~1/4 of the nucleus across and the 3 px floor is ~1/16: from ~0.5 um (about what a
# light microscope resolves) to 2 um in an 8 um nucleus.
NUCLEOLUS_SCALE_PX = 32.0
# The nucleus is looked for near the centre of the crop: a dark neighbour at the border
# must be e times larger per 15% of the image side it lies further out.
NUCLEUS_CENTRE_REACH = 0.15
# Smoothing of the OD before thresholds (px); 0.7 px on crops under 60 px a side.
NUCLEUS_SMOOTHING_PX = 1.0
# A lamp surface (6 coefficients per channel) is fitted to at most this many glass pixels,
# evenly spread over them: the envelope in `_clear_glass` is pinned down by as many.
SURFACE_FIT_POINTS = 4000
# A fitted lamp may dip this much (grey levels) from its edges to its inside before it is
# taken for a sag under the cell (`_sags`) and refitted as a plane.
SAG_TOLERANCE = 3.0
# Letter-box bars (`picture_box`): edge rows or columns of one flat colour, as a resize to a
# square pads a crop. A line is flat when no pixel is further than BAR_NOISE grey levels per
# channel from the bar's first line (JPEG noise on a flat colour is ~1-3); bars thinner than
# BAR_MIN_PX are not looked for, and BAR_RINGING_PX more are cut where JPEG rings at a bar's
# edge. A picture left smaller than MIN_PICTURE_PX a side is taken whole.
BAR_NOISE = 8.0
BAR_MIN_PX = 3
BAR_RINGING_PX = 2
MIN_PICTURE_PX = 16
# complete_cell's coarse cell (half resolution) is grown by this much before the glass
# round it is used for the blank slide, as the flat pass's
# 2 px dilation is in _cell_and_nucleus_without_slide.
COARSE_CELL_MARGIN_PX = 2


def _PLANE(y: np.ndarray, x: np.ndarray) -> tuple:
    return (1.0, x, y)


def _QUADRATIC(y: np.ndarray, x: np.ndarray) -> tuple:
    return (1.0, x, y, x * x, x * y, y * y)


def _design(terms, rows: np.ndarray, cols: np.ndarray, height: int, width: int) -> np.ndarray:
    """Least-squares design matrix (n, k) of a surface's terms at pixels (rows, cols),
    coordinates scaled to [-0.5, 0.5) of the image's height and width."""
    return np.column_stack(np.broadcast_arrays(*terms(rows / height - 0.5, cols / width - 0.5)))


def _least_squares(design: np.ndarray, values: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Coefficients (k,) or (k, C) of the (weighted) least-squares fit ``design @ coef ~ values``.

    design: (n, k) with k <= 6 surface terms; values: (n,) or (n, C); weights: (n,) or None.
    Solved through the k x k normal equations (by ``numpy.linalg.lstsq``, so a degenerate
    set of pixels, e.g. all in one row, still gets the minimum-norm fit): with coordinates
    scaled to [-0.5, 0.5) they are well conditioned, and forming them costs one pass over
    the n points instead of an SVD of the (n, k) matrix (~10x faster at n = 4000).
    """
    weighted = design if weights is None else design * weights[:, None]
    coef, *_ = np.linalg.lstsq(weighted.T @ design, weighted.T @ values, rcond=None)
    return coef


def _surface_on_grid(terms, coef: np.ndarray, height: int, width: int) -> np.ndarray:
    """A fitted surface at every pixel: float64 (H, W), or (H, W, C) for coef (k, C).

    Sums coefficient x term with each term broadcast from a row or a column of
    coordinates: a per-pixel design matrix (H*W, k) cost seconds and gigabytes on a
    4096 px image, for the same numbers.
    """
    y = (np.arange(height) / height - 0.5)[:, None]
    x = (np.arange(width) / width - 0.5)[None, :]
    # Terms of one coordinate (1, x, y, x^2, y^2) are summed along their own axis first,
    # so only the final sum and the x*y term cost a pass over every pixel. Channels come
    # first while summing (C, H, W): numpy's loops over a last axis of 3 were ~3x slower
    # (1 of 2 ms of a 200 px lamp); the products and sums are the same, in the same order.
    channel_coef = coef.reshape(len(coef), -1).T[:, :, None, None]  # (C, k, 1, 1)
    parts: dict[tuple, np.ndarray] = {}
    for index, term in enumerate(terms(y, x)):
        product = np.multiply(term, channel_coef[:, index])  # = np.multiply.outer(term, c), channels first
        key = np.shape(term)
        parts[key] = parts[key] + product if key in parts else product
    # Summed in the parts' order onto 0.0, as onto an array of zeros, the small parts
    # before the first full-size sum so no pass over every pixel adds a zero.
    total = 0.0
    for part in parts.values():
        if np.ndim(total) == 3 and np.shape(total)[1:] == (height, width):
            total += part
        else:
            total = total + part
    total = np.broadcast_to(total, (channel_coef.shape[0], height, width))
    if coef.ndim == 1:
        return np.array(total[0], dtype=np.float64)
    return np.ascontiguousarray(np.moveaxis(total, 0, -1), dtype=np.float64)


def _component_nearest_centre(binary: np.ndarray, reach: float = 0.25, why: dict | None = None) -> np.ndarray:
    """The connected component that covers, or lies closest to, the image centre; weighted
    by size so a speck at the centre does not beat the cell next to it. ``reach`` (a
    fraction of the image's longer side) is the distance that costs as much as a factor e
    in area: smaller favours the centre more. ``why``, when given, is filled with the
    choice: ``candidates`` (pieces), ``reason`` (a CHOICE_REASONS code)."""
    labels, count = label_pieces(binary)
    if count <= 1:
        if why is not None:
            why.update(candidates=count, reason="only_candidate")
        return binary.copy()
    centre = np.array(binary.shape, dtype=np.float64) / 2
    # Every piece's area and its pixel nearest the centre, in one pass over the pixels;
    # ties go to the lower label, as a scan in label order would give them.
    rows, cols = np.nonzero(labels)
    pieces = labels[rows, cols]
    distance = np.sqrt((rows - centre[0]) ** 2 + (cols - centre[1]) ** 2)
    nearest = np.full(count + 1, np.inf)
    np.minimum.at(nearest, pieces, distance)
    area = np.bincount(pieces, minlength=count + 1)
    score = np.log(area[1:]) - nearest[1:] / (reach * max(binary.shape))
    chosen = int(np.argmax(score))
    if why is not None:
        closest = nearest[1:].min()
        reason = ("covers_centre" if nearest[1 + chosen] <= 1.0 else
                  "nearest_centre" if nearest[1 + chosen] <= closest else "larger_than_nearer")
        why.update(candidates=count, reason=reason)
    return labels == 1 + chosen


def _flat_lamp(image: np.ndarray) -> np.ndarray:
    """The lamp as one colour: the 99th percentile of each channel, float64 (3,).

    Stain only darkens, so the brightest pixels are (nearly) clear glass. Good enough to
    rank pixels by optical density for segmentation, cheap, and, unlike a fitted surface,
    not fooled by a crop that the cell fills (Herlev's cells often touch the border).
    """
    return channel_percentile(image.reshape(-1, 3), 99)


def _dense_core(score: np.ndarray, cell: np.ndarray, core: np.ndarray) -> np.ndarray:
    """A small, much denser nucleus inside ``core`` (the top density class), if there is one.

    A pyknotic nucleus of a few pixels in a large, well-stained superficial cell is too
    small a mode for multi-Otsu, whose top class is then the stained cytoplasm around it.
    Such a nucleus is an outlier of the cell's density (above median + 5 MAD); it replaces
    ``core`` when it is under half its size and its density contrast with the rest of the
    cell is SPLIT_PREFERENCE times ``core``'s.
    """
    inside = score[cell]
    median = np.median(inside)
    outlier = median + 5 * 1.4826 * np.median(np.abs(inside - median))

    def contrast(region):
        rest = cell & ~region
        return score[region].mean() / score[rest].mean() if rest.any() and region.any() else 0.0

    candidate = cell & (score > outlier)
    if not candidate.any():
        return core
    candidate = fill_holes(_component_nearest_centre(candidate, NUCLEUS_CENTRE_REACH))
    if candidate.sum() < 0.5 * core.sum() and contrast(candidate) > SPLIT_PREFERENCE * contrast(core):
        return candidate
    return core


def _more_than_three_values(values: np.ndarray) -> bool:
    """``np.unique(values).size > 3`` in a few linear passes instead of a sort: the least and
    the greatest values other than the extremes differ exactly when there are at least 4."""
    low, high = values.min(), values.max()
    inner = values[(values > low) & (values < high)]
    return inner.size > 0 and inner.min() < inner.max()


def _cell_and_nucleus(image: np.ndarray, lamp: np.ndarray, nucleus_wanted: bool = True,
                      why: dict | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cell and nucleus (bool (H, W) each, the nucleus inside the cell, never empty) and the
    smoothed summed OD they were cut from, given the lamp (uint8 or float (H, W, 3)).
    See ``segment_cell`` for the method. A caller that wants the cell alone (a pass that
    only finds the glass round it) passes ``nucleus_wanted=False`` and gets the nucleus
    before its last step (`_finish_nucleus`, which that caller may still apply): the cell
    is the same. ``why``: filled with the nucleus's choice (`_component_nearest_centre`)."""
    height, width = image.shape[:2]
    small = min(height, width)
    od_rgb = optical_density(image, np.broadcast_to(lamp, image.shape))
    od = od_rgb[..., 0] + od_rgb[..., 1] + od_rgb[..., 2]  # .sum(axis=2), the same sums, faster
    score = gaussian_smooth(od, NUCLEUS_SMOOTHING_PX if small >= 60 else 0.7)

    nucleus = np.zeros((height, width), dtype=bool)
    if _more_than_three_values(score):
        core = score > threshold_multiotsu(score, classes=3)[-1]
        if core.sum() > 30:
            core = open_with_disk(core, 1)
        if core.any():
            nucleus = fill_holes(_component_nearest_centre(core, NUCLEUS_CENTRE_REACH, why))
    rest = score[~nucleus]
    if rest.size > 10 and np.ptp(rest) > 0:
        # The piece holding the nucleus, taken once: the test below and the cell both use it.
        cell = _piece_holding(score > threshold_otsu(rest), nucleus)
        if nucleus.any() and cell.sum() < THIN_CYTOPLASM * nucleus.sum() and _more_than_three_values(rest):
            # Only the nucleus stood out: a pale cytoplasm filling the crop (little glass
            # to split it from) fell with the glass. The lower of three density classes
            # of the rest splits glass from pale cytoplasm instead.
            cell = _piece_holding(score > threshold_multiotsu(rest, classes=3)[0], nucleus)
    else:
        cell = np.ones((height, width), dtype=bool)  # one piece: the piece holding the nucleus
    cell = fill_holes(cell)
    cell = open_with_disk(cell, max(1, small // 40)) | nucleus
    cell = fill_holes(_piece_holding(cell, nucleus))
    if nucleus_wanted:
        nucleus = _finish_nucleus(score, cell, nucleus)
    return cell, nucleus, score


def _piece_holding(binary: np.ndarray, region: np.ndarray) -> np.ndarray:
    """The connected piece of ``binary`` that overlaps ``region`` most (the cell holding the
    nucleus, not a neighbour nearer the centre), with ``region`` itself; the piece nearest
    the centre (`_component_nearest_centre`) when ``region`` is empty or apart from it."""
    binary = binary | region
    labels, count = label_pieces(binary)
    if count <= 1:
        return binary
    overlap = np.bincount(labels[region], minlength=count + 1)[1:] if region.any() else np.zeros(count)
    if overlap.max() == 0:
        return _component_nearest_centre(binary)
    return labels == 1 + int(np.argmax(overlap))


def _finish_nucleus(score: np.ndarray, cell: np.ndarray, nucleus: np.ndarray) -> np.ndarray:
    """The last step of `_cell_and_nucleus`: the nucleus cut to the cell and replaced by a
    dense core where there is one (`_dense_core`), or by the densest disc of the cell
    where it came out empty. Returns bool (H, W)."""
    nucleus = nucleus & cell
    if nucleus.any():
        return _dense_core(score, cell, nucleus)
    peak = np.unravel_index(np.argmax(np.where(cell, score, -np.inf)), score.shape)
    radius = max(2, min(cell.shape) // 40)
    rows, cols = np.ogrid[: cell.shape[0], : cell.shape[1]]
    # skimage.morphology.disk(radius) centred on the peak, cut to the image
    return ((rows - peak[0]) ** 2 + (cols - peak[1]) ** 2 <= radius * radius) & cell


def segment_cell(image: np.ndarray, background: np.ndarray | None = None) -> np.ndarray:
    """Segment one cell image into PathMaster's 4 regions.

    image: uint8 (H, W, 3) RGB, the cell roughly centred (as in Herlev/SIPaKMeD crops);
    letter-box bars (`picture_box`) are left out and labelled background.
    background: optional uint8 (H, W, 3) blank slide; it makes the OD exact. Without it
    the lamp is taken as flat (``_flat_lamp``): the thresholds below only rank pixels.
    Returns uint8 (H, W): 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus. The nucleus is
    never empty: if no darker region is found, the densest part of the cell is used.

    Method, on the summed optical density (lightly smoothed):
    nucleus = the densest of three multi-Otsu classes of the whole image (a stained
    nucleus is the densest thing in a Pap crop, whether it fills the frame, as carcinoma
    in situ does, or is a dot in a superficial cell, see ``_dense_core``), the connected
    piece nearest the centre, holes filled; cell = Otsu's split of the remaining pixels
    (glass against cytoplasm; where that leaves a cell barely larger than its nucleus, a pale
    cytoplasm filling the crop, the lowest of three density classes), the piece holding the
    nucleus, holes filled;
    nucleoli = small eosinophilic spots inside the nucleus, looked for at the nucleus's own
    scale (``_find_nucleoli``).
    On the 917 Herlev cells (40 px) this took the nucleus's median Dice from 0.82 to 0.91
    and the cell's from 0.75 to 0.81 (benchmarks/bench_segmentation.py).
    """
    check_cell(image, None, background, "segment_cell input")
    box = picture_box(image)
    if _is_whole(box, image.shape):
        return _segment_cell(image, background)
    picture = np.ascontiguousarray(image[box])
    mask = _segment_cell(picture, None if background is None else np.ascontiguousarray(background[box]))
    height, width = image.shape[:2]
    return np.pad(mask, ((box[0].start, height - box[0].stop), (box[1].start, width - box[1].stop)),
                  constant_values=BACKGROUND)


def _segment_cell(image: np.ndarray, background: np.ndarray | None, why: dict | None = None) -> np.ndarray:
    """`segment_cell` of arrays that passed `check_cell`; ``why`` as in `_cell_and_nucleus`."""
    height, width = image.shape[:2]
    if background is not None:
        lamp = background
        cell, nucleus, score = _cell_and_nucleus(image, background, why=why)
    else:
        cell, nucleus, lamp = _cell_and_nucleus_without_slide(image, why=why)

    mask = np.full((height, width), BACKGROUND, dtype=np.uint8)
    mask[cell] = CYTOPLASM
    mask[nucleus] = NUCLEUS
    mask[_find_nucleoli(image, lamp, nucleus)] = NUCLEOLUS
    return mask


def _find_nucleoli(image: np.ndarray, lamp: np.ndarray, nucleus: np.ndarray) -> np.ndarray:
    """The nucleoli (bool (H, W), inside ``nucleus``) of an image (uint8 (H, W, 3)) against
    its lamp, at the nucleus's own scale.

    A nucleus wider than NUCLEOLUS_SCALE_PX (equivalent diameter) is shrunk to it first
    (area averaging, which also evens out JPEG's 8 px blocks), searched (`_nucleoli`), and
    the spots found brought back to the image's pixels. Searched at the image's pixels, a
    224 px upload's nucleus of ~7000 px showed chromatin grains and JPEG blocks as 11
    nucleoli on average (up to 85) where the same cells at 40 px showed 0.5. Nucleoli lie
    in the nucleus, and the filters look NUCLEOLUS_CONTEXT_PX (at the search's scale)
    around it at most: the rest of a large image is not deconvolved nor filtered. No
    nucleus found (a picture of no cell, e.g. a black-and-white checkerboard): no nucleoli.
    """
    if not nucleus.any():
        return np.zeros_like(nucleus)
    diameter = 2.0 * np.sqrt(np.count_nonzero(nucleus) / np.pi)
    scale = min(1.0, NUCLEOLUS_SCALE_PX / diameter)
    box = _bounding_box(nucleus, int(np.ceil(NUCLEOLUS_CONTEXT_PX / scale)))
    ratio, region = _normalise_to_lamp(image[box], lamp[box]), nucleus[box]
    height, width = region.shape
    size = (max(1, round(width * scale)), max(1, round(height * scale)))  # OpenCV's (width, height)
    if scale < 1.0:
        ratio = cv2.resize(ratio, size, interpolation=cv2.INTER_AREA)
        searched = cv2.resize(region.view(np.uint8).astype(np.float32), size, interpolation=cv2.INTER_AREA) >= 0.5
    else:
        searched = region
    spots = _nucleoli(color.rgb2hed(ratio)[..., 1], searched)
    if scale < 1.0:
        spots = (cv2.resize(spots.view(np.uint8).astype(np.float32), (width, height),
                            interpolation=cv2.INTER_LINEAR) >= 0.5) & region
    found = np.zeros_like(nucleus)
    found[box] = spots
    return found


def _cell_and_nucleus_without_slide(image: np.ndarray, nucleus_wanted: bool = True,
                                    why: dict | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cell, nucleus (bool (H, W) each; for ``nucleus_wanted=False`` the nucleus before
    `_finish_nucleus`) and the lamp (uint8 or float (H, W, 3)) they were cut against, for
    an image without its blank slide."""
    lamp = np.broadcast_to(_flat_lamp(image), image.shape)
    cell, nucleus, score = _cell_and_nucleus(image, lamp, nucleus_wanted=False, why=why)
    # A vignetted or tilted lamp fools a flat one; where the first pass leaves enough
    # glass round the cell to pin down a quadratic (QUADRATIC_MIN_PIXELS), the lamp
    # is fitted to it (a surface per channel) and the cell segmented again. Small
    # crops (Herlev's 40 px) have too little glass for a fit that holds under the
    # cell: it sagged there and cost 0.03 of nucleus Dice; they keep the flat lamp.
    glass = ~grow(cell, 2)
    if QUADRATIC_MIN_PIXELS <= glass.sum() < glass.size:
        lamp = _fit_lamp(image, glass)
        cell, nucleus, _ = _cell_and_nucleus(image, lamp, nucleus_wanted, why=why)
    elif nucleus_wanted:  # no second pass: the first one's nucleus is the answer
        nucleus = _finish_nucleus(score, cell, nucleus)
    return cell, nucleus, lamp


def _bounding_box(region: np.ndarray, margin: int) -> tuple[slice, slice]:
    """Slices of the bounding box of a non-empty bool (H, W) region, grown by `margin` px
    on every side and clipped to the image."""
    rows, cols = np.nonzero(region)
    return (slice(max(rows.min() - margin, 0), rows.max() + margin + 1),
            slice(max(cols.min() - margin, 0), cols.max() + margin + 1))


def _normalise_to_lamp(image: np.ndarray, background: np.ndarray) -> np.ndarray:
    """Image divided by its blank slide, rescaled to a white lamp, so colour deconvolution
    sees the stain and not the lamp's tint and vignetting."""
    ratio = image.astype(np.float64)  # (image + 1) / (background + 1), in place
    ratio += 1.0
    lamp = background.astype(np.float64)
    lamp += 1.0
    ratio /= lamp
    return np.clip(ratio, 0, 1, out=ratio)


def _nucleoli(eosin: np.ndarray, nucleus: np.ndarray) -> np.ndarray:
    """Nucleoli: small eosinophilic spots in the nucleus (red against blue chromatin in a Pap
    stain). White top-hat of the eosin channel above the nucleus's own variation (median +
    4 MAD); 3 px up to 1/5 of the nucleus in area."""
    if nucleus.sum() < 40:
        return np.zeros_like(nucleus)
    smooth = gaussian_smooth(eosin, 0.7)
    tophat = white_tophat_disk(np.where(nucleus, smooth, smooth[nucleus].min()), 4)
    values = tophat[nucleus]
    median = np.median(values)
    mad = np.median(np.abs(values - median)) + 1e-9
    spots = nucleus & (tophat > median + 4 * 1.4826 * mad) & shrink(nucleus, 2)
    spots = morphology.remove_small_objects(spots, max_size=2)
    labels, count = label_pieces(spots)
    if count:
        areas = ndi.sum(spots, labels, index=np.arange(1, count + 1))
        too_big = np.flatnonzero(areas > nucleus.sum() / 5) + 1
        spots &= ~np.isin(labels, too_big)
    return spots


def estimate_background(image: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """Estimate the blank-slide image (lamp through clear glass) from a cell image.

    image: uint8 (H, W, 3). mask: optional uint8 (H, W) labels; glass is looked for among
    its 0 pixels. Glass is what lies within noise of the image's upper envelope (stain
    only darkens), see `_clear_glass`.
    Fits each channel with a 2-D quadratic surface over the glass pixels (vignetting and a
    gradient are smooth), so the estimate also holds under the cell. With fewer than
    MIN_BACKGROUND_PIXELS glass pixels (and under 5% of the image) the lamp is taken as flat,
    at the 99th percentile of each channel.
    Returns uint8 (H, W, 3), nowhere darker than the dimmest 1% of the glass, and lifted
    if needed so that 99% of the cell is darker than it (stain only absorbs).
    """
    check_cell(image, None, None, "estimate_background input")
    if mask is not None:
        check_mask(mask, image.shape, "estimate_background input")
    return _estimate_background(image, mask)


def _estimate_background(image: np.ndarray, mask: np.ndarray | None,
                         clear: np.ndarray | None = None) -> np.ndarray:
    """`estimate_background` of arrays that passed `check_cell` / `check_mask`; ``clear``
    is `_clear_glass(image)` when the caller has it already."""
    glass = _clear_glass(image) if clear is None else clear
    if mask is not None:
        # A mask's "background" can hold neighbouring cells and debris (real crops do):
        # only the part of it that is also clear glass shows the lamp.
        # Too little of it and the lamp is taken as flat (see _fit_lamp).
        glass = glass & (mask == BACKGROUND)
    glass = shrink(glass, 2, border_value=1)  # clear of the blurred edge
    lamp = _fit_lamp(image, glass)
    # Stain only absorbs: the lamp is at least as bright as the cell. A crop with no glass
    # in it (the cell fills the frame) fools the fit; lift it above 99% of the cell.
    lift = np.zeros(image.shape[2])
    cell = ~glass
    if cell.any():
        excess = gaussian_smooth(image, 1.0)
        np.subtract(excess, lamp, out=excess)
        # Channel by channel: numpy selects in a contiguous run ~3x faster than along
        # axis 0 of (n, 3) pixels, for the same order statistics.
        lift = np.maximum([np.percentile(excess[..., channel][cell], 99) for channel in range(image.shape[2])], 0.0)
    # The lifted lamp, clip(rint(level + lift)), depends per channel on the uint8 level
    # alone: a table of its 256 values read by cv2.LUT gives the same numbers in one pass
    # (float64 arithmetic over (H, W, 3) with a (3,) lift cost ~0.5 ms on a 200 px image).
    table = np.clip(np.rint(np.arange(256, dtype=np.float64)[:, None] + lift), 1, 255).astype(np.uint8)
    return cv2.LUT(lamp, np.ascontiguousarray(table[None]))


def _clear_glass(image: np.ndarray) -> np.ndarray:
    """Boolean (H, W): pixels where the lamp shines through clear glass.

    Stain only ever darkens the lamp, so the lamp is the upper envelope of the image.
    Asymmetric least squares (Eilers & Boelens 2005) finds it: pixels above the surface
    weigh ENVELOPE_WEIGHT, those below 1 - ENVELOPE_WEIGHT, refit until stable. Glass is
    what lies within noise of the envelope. A brightness threshold would fail: with
    vignetting the corners can be darker than a pale cytoplasm.
    """
    # R + G + B as float64, added from the uint8 channels: integer sums (<= 765) are exact
    # either way, without converting the whole (H, W, 3) image first.
    total = np.add(image[..., 0], image[..., 1], dtype=np.float64)
    level = gaussian_smooth(np.add(total, image[..., 2], out=total), 1.5)
    # |level - its smoothing|, in the smoothing's array; the median may reorder it.
    deviation = gaussian_smooth(level, 3.0)
    np.subtract(level, deviation, out=deviation)
    noise = 1.4826 * np.median(np.abs(deviation, out=deviation), overwrite_input=True) + 1e-6
    # The envelope is smooth: a grid of ~4000 pixels pins it down as well as all of them.
    height, width = level.shape
    stride = max(1, int(np.sqrt(level.size / 4000)))
    rows, cols = (g.ravel() for g in np.mgrid[0:height:stride, 0:width:stride])
    values = level[rows, cols]
    terms = _QUADRATIC if len(values) >= QUADRATIC_MIN_PIXELS else _PLANE
    design = _design(terms, rows, cols, height, width)
    weights = np.ones(len(values))
    for _ in range(20):
        coef = _least_squares(design, values, weights)
        residual = values - design @ coef
        updated = np.where(residual > 0, ENVELOPE_WEIGHT, 1 - ENVELOPE_WEIGHT)
        if (updated == weights).all():
            break
        weights = updated
    keep = residual > -4.0 * noise
    coef = _least_squares(design[keep], values[keep])
    envelope = _surface_on_grid(terms, coef, height, width)
    return level - envelope > -4.0 * noise


def _fit_surface(level: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Least-squares surface (quadratic, or a plane with few points) through `level` at
    the `where` pixels, evaluated everywhere: float64 of level's shape. level: (H, W) or
    (H, W, C), any real dtype (only the fitted pixels are converted to float64)."""
    height, width = level.shape[:2]
    # Flat indices, picked and then split into rows and columns: the same pixels as
    # np.nonzero's (raster order) without splitting all of them.
    flat = np.flatnonzero(where)
    if len(flat) > SURFACE_FIT_POINTS:  # a quadratic needs far fewer points; keep it fast
        flat = flat[np.linspace(0, len(flat) - 1, SURFACE_FIT_POINTS).astype(int)]
    rows, cols = np.divmod(flat, width)
    # Few glass pixels (a tight crop) cannot pin down curvature: fit a plane instead.
    terms = _QUADRATIC if len(rows) >= QUADRATIC_MIN_PIXELS else _PLANE
    values = level[rows, cols].astype(np.float64)
    coef = _least_squares(_design(terms, rows, cols, height, width), values)
    if terms is _QUADRATIC and _sags(coef):
        terms = _PLANE
        coef = _least_squares(_design(terms, rows, cols, height, width), values)
    return _surface_on_grid(terms, coef, height, width)


def _sags(coef: np.ndarray) -> bool:
    """Whether a fitted quadratic lamp (coef (6,) or (6, C) of `_QUADRATIC`'s terms) dims
    towards its inside along some direction by more than SAG_TOLERANCE grey levels.

    A lamp through a microscope is brightest near the optical axis and dims outwards
    (vignetting), or slopes across an off-centre crop: never darker inside than at its
    edges. Glass only on two opposite sides of a cell that fills the crop lets a quadratic
    sag under the cell (the cell then reads as glass); such a fit is replaced by a plane.
    """
    c = coef.reshape(6, -1)
    for xx, xy, yy in zip(c[3], c[4], c[5]):
        # Hessian [[2xx, xy], [xy, 2yy]] over coordinates in [-0.5, 0.5): a positive
        # eigenvalue e lifts the surface by e/8 from the centre to an edge along its axis.
        if np.linalg.eigvalsh(np.array([[2 * xx, xy], [xy, 2 * yy]])).max() / 8 > SAG_TOLERANCE:
            return True
    return False


def _fit_lamp(image: np.ndarray, glass: np.ndarray) -> np.ndarray:
    """Surface per channel through the glass pixels, as uint8 (H, W, 3)."""
    count = int(np.count_nonzero(glass))
    if count < min(MIN_BACKGROUND_PIXELS, max(20, 0.05 * glass.size)):
        flat = channel_percentile(image.reshape(-1, 3), 99)
        return np.broadcast_to(np.rint(flat).astype(np.uint8), image.shape).copy()
    full = _fit_surface(image, glass)
    # Far from the glass pixels the fit can sag; the lamp is not dimmer than the dim glass.
    floor = channel_percentile(image, 1, where=glass)
    np.maximum(full, floor, out=full)  # in place: the same values without two (H, W, 3) temporaries
    return np.clip(np.rint(full, out=full), 1, 255, out=full).astype(np.uint8)


def _bar_length(lines: np.ndarray) -> int:
    """How many leading lines of ``lines`` (n, L, 3) share the first line's flat colour."""
    first = lines[0].astype(np.int16)
    reference = first.reshape(-1, 3).mean(axis=0)
    if np.abs(first - reference).max() > BAR_NOISE:
        return 0
    # Looked at in blocks doubling in size: a bar is a few lines, the picture most of them,
    # and the first rough line ends the bar (a pass over every line cost ~1 ms a side).
    start, block = 1, BAR_MIN_PX + BAR_RINGING_PX
    while start < len(lines):
        chunk = lines[start:start + block].astype(np.int16)
        spread = np.abs(chunk - reference).max(axis=(1, 2))  # per line, worst pixel and channel
        rough = np.flatnonzero(spread > BAR_NOISE)
        if rough.size:
            return start + int(rough[0])
        start, block = start + block, 2 * block
    return len(lines)


def picture_box(image: np.ndarray) -> tuple[slice, slice]:
    """The picture inside an image's letter-box bars: (rows, cols) slices.

    Parameters
    ----------
    image : ndarray of uint8, shape (H, W, 3)

    Returns
    -------
    rows, cols : slice
        The image without the flat bars along its edges (each side alone: a bar is at least
        BAR_MIN_PX lines of one flat colour, see BAR_NOISE; BAR_RINGING_PX more lines are cut
        where it meets the picture), or the whole image when there are none or the picture
        left would be under MIN_PICTURE_PX a side. A resize of a crop to a square pads it
        with such bars: they are neither glass nor cell, and their colour, often darker than
        the glass, would pass for stain.
    """
    height, width = image.shape[:2]
    across = image.transpose(1, 0, 2)
    cut = []
    for lines in (image, image[::-1], across, across[::-1]):
        length = _bar_length(lines)
        cut.append(length + BAR_RINGING_PX if length >= BAR_MIN_PX else 0)
    top, bottom, left, right = cut
    if height - top - bottom < MIN_PICTURE_PX or width - left - right < MIN_PICTURE_PX:
        return slice(0, height), slice(0, width)
    return slice(top, height - bottom), slice(left, width - right)


def _is_whole(box: tuple[slice, slice], shape: tuple[int, ...]) -> bool:
    return box[0] == slice(0, shape[0]) and box[1] == slice(0, shape[1])


def complete_cell(record: CellRecord) -> CellRecord:
    """Fill in a record's missing mask and background, flagging what was estimated.

    Checks the record's arrays once (`check_cell`, naming its source_id). Letter-box bars
    (`picture_box`) are left out: the picture inside them is completed alone, the mask is
    background on the bars and the estimated blank slide there repeats its nearest picture
    pixel. Within the picture: a missing mask is segmented (with the background when there
    is one) and a missing background estimated from the image and mask. ``record.extra``
    gets ``"cell_choice"``: which cell of the crop was taken and why (`cell_choice`).
    Returns the same record, updated. Raises InvalidInput for arrays that do not fit together,
    and (code NO_NUCLEUS_FOUND) when the segmentation finds no nucleus: nothing to measure.
    """
    check_cell(record.image, record.mask, record.background, record.source_id)
    if record.mask is not None and record.background is not None:
        return record
    box = picture_box(record.image)
    why: dict = {"reason": "mask_given", "candidates": None}
    if _is_whole(box, record.image.shape):
        _complete(record, why)
    else:
        part = CellRecord(record.source_id, record.diagnosis, np.ascontiguousarray(record.image[box]),
                          mask=None if record.mask is None else np.ascontiguousarray(record.mask[box]),
                          background=None if record.background is None else np.ascontiguousarray(record.background[box]))
        _complete(part, why)
        height, width = record.image.shape[:2]
        pads = ((box[0].start, height - box[0].stop), (box[1].start, width - box[1].stop))
        if record.mask is None:
            record.mask = np.pad(part.mask, pads, constant_values=BACKGROUND)
            record.mask_estimated = True
        if record.background is None:
            record.background = np.pad(part.background, (*pads, (0, 0)), mode="edge")
            record.background_estimated = True
    if record.mask_estimated and not ((record.mask == NUCLEUS).any() or (record.mask == NUCLEOLUS).any()):
        raise InvalidInput("no nucleus found in the picture: it shows no cell that can be measured "
                           "(send a cell, or its mask)", record.source_id, NO_NUCLEUS_FOUND)
    record.extra["cell_choice"] = _choice_report(why, record.mask, box, record.image.shape)
    return record


# Why a crop's cell was the one taken (``cell_choice``'s ``reason``): the only dense piece,
# the one covering the picture's centre, the nearest to it, or a larger one a little further
# out (a speck nearer the centre loses to a nucleus, `_component_nearest_centre`); or the
# user's mask said which.
CHOICE_REASONS = ("only_candidate", "covers_centre", "nearest_centre", "larger_than_nearer", "mask_given")


def _choice_report(why: dict, mask: np.ndarray, box: tuple[slice, slice], shape: tuple[int, ...]) -> dict:
    """``cell_choice``: which cell of the crop was taken and why.

    ``reason`` (a CHOICE_REASONS code), ``candidates`` (dense pieces the nucleus was chosen
    among; None for a given mask), ``centre_offset`` (the nucleus centroid's distance from the
    picture's centre, a share of half the picture's diagonal) and ``bars`` (letter-box bars
    cut off, px: top, bottom, left, right; all 0 without bars).
    """
    height, width = shape[:2]
    rows, cols = np.nonzero(mask >= NUCLEUS)
    centre = ((box[0].start + box[0].stop - 1) / 2, (box[1].start + box[1].stop - 1) / 2)
    half_diagonal = 0.5 * np.hypot(box[0].stop - box[0].start, box[1].stop - box[1].start)
    offset = float(np.hypot(rows.mean() - centre[0], cols.mean() - centre[1]) / half_diagonal) if rows.size else None
    return {"reason": why.get("reason", "mask_given"), "candidates": why.get("candidates"),
            "centre_offset": None if offset is None else round(offset, 3),
            "bars": [box[0].start, height - box[0].stop, box[1].start, width - box[1].stop]}


def _complete(record: CellRecord, why: dict | None = None) -> CellRecord:
    """`complete_cell` of a record without letter-box bars whose arrays passed `check_cell`;
    ``why`` is filled with the nucleus's choice when the mask is segmented."""
    if record.mask is None and record.background is None:
        # Neither given (an upload as most users have it). Segmenting against a flat lamp,
        # refitting the lamp to the glass round that cell, segmenting again and then
        # estimating the slide anew cost two full segmentations and three lamp fits (a
        # ~200 px upload: 2/3 of its analysis). Where the crop is large enough, the cell is
        # first found coarsely at half resolution (the same two passes on 1/4 of the
        # pixels), the blank slide estimated from the clear glass round it, and the cell
        # segmented once against that slide. Small crops (Herlev's 40 px) keep the old
        # order: a coarse pass there is too coarse, and their slide is flat anyway.
        image = record.image
        clear = _clear_glass(image)
        half = image[::2, ::2]
        if clear.sum() >= QUADRATIC_MIN_PIXELS and half.shape[0] * half.shape[1] >= QUADRATIC_MIN_PIXELS:
            # Clear glass alone also takes in pale cytoplasm (the lamp then sags under the
            # cell): it is kept out by a first, coarse segmentation at half resolution.
            coarse, _, _ = _cell_and_nucleus_without_slide(half, nucleus_wanted=False)
            cell = np.repeat(np.repeat(coarse, 2, axis=0), 2, axis=1)[: image.shape[0], : image.shape[1]]
            outside = np.where(grow(cell, COARSE_CELL_MARGIN_PX), CYTOPLASM, BACKGROUND)
            record.background = _estimate_background(image, outside.astype(np.uint8), clear)
            record.background_estimated = True
            record.mask = _segment_cell(image, record.background, why)
            record.mask_estimated = True
            return record
        record.mask = _segment_cell(image, None, why)
        record.mask_estimated = True
        record.background = _estimate_background(image, record.mask, clear)
        record.background_estimated = True
        return record
    if record.mask is None:
        record.mask = _segment_cell(record.image, record.background, why)
        record.mask_estimated = True
    if record.background is None:
        record.background = _estimate_background(record.image, record.mask)
        record.background_estimated = True
    return record



# `whole_cells`: a stained piece counts as a cell when it has at least this many pixels
# (opened by a 2 px disk first, so glass noise and debris do not count).
WHOLE_CELL_MIN_PX = 400


def whole_cells(image: np.ndarray) -> int:
    """How many whole cells an image shows: stained pieces that hold a nucleus and do
    not touch the picture's edge.

    image: uint8 (H, W, 3) RGB, as the decoders give it (not checked again here: the cell's
    arrays are checked once, where they are analysed); letter-box bars (`picture_box`) are
    left out. The pieces
    are `segment_cell`'s, against a flat lamp on the lightly smoothed summed optical
    density: stain = above Otsu's split of the whole picture (glass against everything
    stained), opened by a disk of 2 px, each piece of at least WHOLE_CELL_MIN_PX pixels;
    a nucleus = the densest of three multi-Otsu classes. A crop of one cell gives 0 or 1
    (the cell often touches the edge, its cut neighbours always do); a field of view gives
    about one per cell that stands apart. Linear in the pixel count (~0.5 s a megapixel).
    """
    picture = np.ascontiguousarray(image[picture_box(image)])
    height, width = picture.shape[:2]
    od_rgb = optical_density(picture, np.broadcast_to(_flat_lamp(picture), picture.shape))
    score = gaussian_smooth(od_rgb.sum(axis=2), NUCLEUS_SMOOTHING_PX if min(height, width) >= 60 else 0.7)
    if not _more_than_three_values(score):
        return 0
    nucleus = open_with_disk(score > threshold_multiotsu(score, classes=3)[-1], 1)
    labels, count = label_pieces(open_with_disk(score > threshold_otsu(score), 2))
    if count == 0:
        return 0
    area = np.bincount(labels.ravel(), minlength=count + 1)
    nucleated = np.bincount(labels[nucleus], minlength=count + 1) > 0
    edge = np.zeros(count + 1, dtype=bool)
    edge[np.concatenate([labels[0], labels[-1], labels[:, 0], labels[:, -1]])] = True
    keep = (area >= WHOLE_CELL_MIN_PX) & nucleated & ~edge
    return int(np.count_nonzero(keep[1:]))
