"""Automatic 4-region segmentation and blank-slide estimate, for cells that come without.

PathMaster wants, per cell, a mask (0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus)
and a blank-slide background image. Users and public datasets often have neither; this
module makes both from the cell image alone (flagging them as estimated is the caller's
job, see `complete_cell`).

Method, in optical density (OD = -log10(I / I0), the quantity stain amounts are linear in;
`pathmaster.features.density.optical_density`, the same OD the features measure):
cell = OD above the clear-glass peak of the OD histogram (one object: the component
nearest the centre, holes filled); nucleus = the dense part of the cell: Otsu (for a tiny
nucleus multi-Otsu's top class or an outlier threshold) on OD within the cell, refined by
a marker-based watershed on the OD gradient; nucleoli = small eosinophilic spots inside the nucleus: a
white top-hat of the eosin channel of a colour deconvolution (skimage.color.rgb2hed).
The lamp: the upper envelope of the image by asymmetric least squares, see
`estimate_background`.

Cost grows linearly with pixel count (uploads may be 4096 x 4096 px): no filter here has
a footprint that grows with the image (the opening uses distance transforms), and the
watershed and nucleolus search work only around the nucleus. About 1.2-1.8 s of one core
per megapixel; `python benchmarks/bench_features.py --sweep` measures it.
"""

from __future__ import annotations

import numpy as np
from scipy import ndimage as ndi
from skimage import color, filters, measure, morphology, segmentation

from pathmaster.records import BACKGROUND, CYTOPLASM, NUCLEOLUS, NUCLEUS, CellRecord
from pathmaster.features.density import optical_density
from pathmaster.imageio import check_cell, check_mask

MIN_BACKGROUND_PIXELS = 200  # fewer glass pixels (and under 5% of the image): flat lamp
QUADRATIC_MIN_PIXELS = 1000  # fewer: fit a plane, not a quadratic
SPLIT_PREFERENCE = 1.3  # a later nucleus threshold must raise the density ratio this much
ENVELOPE_WEIGHT = 0.99  # asymmetric least squares: weight of pixels above the lamp surface
# How far nucleolus detection looks outside the nucleus: the eosin smoothing's reach
# (sigma 0.7 px truncated at 4 sigma: 3 px) plus the top-hat opening's (disk(4) twice: 8 px).
NUCLEOLUS_CONTEXT_PX = 12


def _PLANE(y: np.ndarray, x: np.ndarray) -> tuple:
    return (1.0, x, y)


def _QUADRATIC(y: np.ndarray, x: np.ndarray) -> tuple:
    return (1.0, x, y, x * x, x * y, y * y)


def _design(terms, rows: np.ndarray, cols: np.ndarray, height: int, width: int) -> np.ndarray:
    """Least-squares design matrix (n, k) of a surface's terms at pixels (rows, cols),
    coordinates scaled to [-0.5, 0.5) of the image's height and width."""
    return np.column_stack(np.broadcast_arrays(*terms(rows / height - 0.5, cols / width - 0.5)))


def _surface_on_grid(terms, coef: np.ndarray, height: int, width: int) -> np.ndarray:
    """A fitted surface at every pixel: float64 (H, W), or (H, W, C) for coef (k, C).

    Sums coefficient x term with each term broadcast from a row or a column of
    coordinates: a per-pixel design matrix (H*W, k) cost seconds and gigabytes on a
    4096 px image, for the same numbers.
    """
    y = (np.arange(height) / height - 0.5)[:, None]
    x = (np.arange(width) / width - 0.5)[None, :]
    # Terms of one coordinate (1, x, y, x^2, y^2) are summed along their own axis first,
    # so only the final sum and the x*y term cost a pass over every pixel.
    parts: dict[tuple, np.ndarray] = {}
    for term, c in zip(terms(y, x), coef):
        product = np.multiply.outer(term, c)
        key = np.shape(term)
        parts[key] = parts[key] + product if key in parts else product
    total = np.zeros((height, width) + coef.shape[1:])
    for part in parts.values():
        total += part
    return total


def _glass_threshold(od_sum: np.ndarray) -> float:
    """OD above which a pixel is not clear glass.

    Glass is the tallest narrow peak of the OD histogram, near 0; its spread is measured on
    the peak's left flank (no stain there to widen it). Otsu would not do: with a dense
    nucleus and pale cytoplasm it splits nucleus from cytoplasm instead.
    """
    values = od_sum.ravel()
    top = np.percentile(values, 99.5)
    counts, edges = np.histogram(values, bins=256, range=(0.0, max(top, 1e-6)))
    mode = 0.5 * (edges[np.argmax(counts)] + edges[np.argmax(counts) + 1])
    left = values[values <= mode]
    spread = np.sqrt(np.mean((left - mode) ** 2)) if left.size > 10 else 0.0
    spread = max(spread, 0.5 * (edges[1] - edges[0]))
    return float(mode + 5.0 * spread + 0.01)


def _component_nearest_centre(binary: np.ndarray) -> np.ndarray:
    """The connected component that covers, or lies closest to, the image centre; weighted
    by size so a speck at the centre does not beat the cell next to it."""
    labels, count = ndi.label(binary)
    if count <= 1:
        return binary.copy()
    centre = np.array(binary.shape, dtype=np.float64) / 2
    best, best_score = 1, -np.inf
    for region in measure.regionprops(labels):
        coords = region.coords.astype(np.float64)
        distance = np.sqrt(((coords - centre) ** 2).sum(axis=1)).min()
        score = np.log(region.area) - distance / (0.25 * max(binary.shape))
        if score > best_score:
            best, best_score = region.label, score
    return labels == best


def open_with_disk(binary: np.ndarray, radius: int) -> np.ndarray:
    """Morphological opening of a boolean image by a disk, in time linear in its pixels.

    binary: bool (H, W); radius: int >= 1 (px). Returns bool (H, W), the same as
    ``skimage.morphology.opening(binary, skimage.morphology.disk(radius))`` (mirrored
    edges), pixel for pixel. The disk's footprint grows with the image here (1% of its
    side), and a footprint filter costs pixels x footprint area, i.e. quadratic in pixel
    count (8 of 22 s on a 1800 px image); exact Euclidean distance transforms give the
    same erosion and dilation at a cost independent of the radius: a pixel survives
    erosion by disk(r) when no background pixel lies within r of it, and the dilation
    of that keeps every pixel within r of a survivor.
    """
    # Mirrored by the radius, as skimage's mode="reflect" does: the disk never reaches
    # past the padding, so its distances are those of the endless mirrored image.
    def within_radius_of_false(pixels: np.ndarray) -> np.ndarray:
        padded = np.pad(pixels, radius, mode="symmetric")
        if padded.all():
            return np.zeros(pixels.shape, dtype=bool)
        near = ndi.distance_transform_edt(padded) <= radius
        return near[radius:-radius, radius:-radius]

    eroded = ~within_radius_of_false(binary)
    return within_radius_of_false(~eroded)


def segment_cell(image: np.ndarray, background: np.ndarray | None = None) -> np.ndarray:
    """Segment one cell image into PathMaster's 4 regions.

    image: uint8 (H, W, 3) RGB, the cell roughly centred (as in Herlev/SIPaKMeD crops).
    background: optional uint8 (H, W, 3) blank slide; it makes the OD exact. Without it,
    `estimate_background(image)` stands in.
    Returns uint8 (H, W): 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus. The nucleus is
    never empty: if no darker region is found, the densest part of the cell is used.
    """
    check_cell(image, None, background, "segment_cell input")
    return _segment_cell(image, background)


def _segment_cell(image: np.ndarray, background: np.ndarray | None) -> np.ndarray:
    """`segment_cell` of arrays that passed `check_cell`."""
    height, width = image.shape[:2]
    small = min(height, width)
    if background is None:
        background = _estimate_background(image, None)
    od_sum = ndi.gaussian_filter(optical_density(image, background).sum(axis=2), 1.0)

    # Cell: everything stained, i.e. above the clear-glass peak of the OD histogram.
    cell = od_sum > _glass_threshold(od_sum)
    cell = open_with_disk(cell, max(1, small // 100))
    if not cell.any():
        cell = np.ones((height, width), dtype=bool)
    cell = ndi.binary_fill_holes(_component_nearest_centre(cell))

    # Nucleus: the dense part of the cell. Density alone, not a haematoxylin channel from
    # fixed stain vectors: real Pap images' colour balance varies too much for those (on
    # the Herlev sample they halve the nuclei found).
    score = od_sum
    inside = score[cell]
    nucleus = np.zeros_like(cell)
    if inside.size > 10 and np.ptp(inside) > 0:
        # Otsu splits the cell in two. A small nucleus in a large cell is a tiny mode of
        # the histogram, and Otsu then cuts the cytoplasm in halves of similar density;
        # multi-Otsu's top class may find it, and failing that the nucleus is an outlier
        # of the cytoplasm's density (median + 5 MAD). A nucleus is markedly denser than
        # the rest of its cell: a later split replaces Otsu's only if its density ratio
        # (core / rest) is clearly higher, since a coarse nucleus's own clumps also
        # stand out a little from it.
        median = np.median(inside)
        thresholds = [filters.threshold_otsu(inside)]
        if np.unique(inside).size > 3:
            thresholds.append(filters.threshold_multiotsu(inside, classes=3)[-1])
        thresholds.append(median + 5 * 1.4826 * np.median(np.abs(inside - median)))
        best_contrast, core = 0.0, cell & (score > thresholds[0])
        for threshold in thresholds:
            candidate = cell & (score > threshold)
            rest = cell & ~candidate
            if not candidate.any():
                continue
            contrast = score[candidate].mean() / score[rest].mean() if rest.any() else np.inf
            if contrast > SPLIT_PREFERENCE * best_contrast:
                best_contrast, core = contrast, candidate
        nucleus = _refine_nucleus(od_sum, filters.sobel(od_sum), cell, core)
    if not nucleus.any():  # fall back to the densest disc of the cell
        peak = np.unravel_index(np.argmax(np.where(cell, score, -np.inf)), score.shape)
        disc = np.zeros_like(cell)
        disc[peak] = True
        nucleus = ndi.binary_dilation(disc, morphology.disk(max(2, small // 40))) & cell

    mask = np.full((height, width), BACKGROUND, dtype=np.uint8)
    mask[cell] = CYTOPLASM
    mask[nucleus] = NUCLEUS
    # Nucleoli lie in the nucleus, and their filters look NUCLEOLUS_CONTEXT_PX around it at
    # most: colour deconvolution and filtering of the rest of a large image would be wasted.
    box = _bounding_box(nucleus, NUCLEOLUS_CONTEXT_PX)
    eosin = color.rgb2hed(_normalise_to_lamp(image[box], background[box]))[..., 1]
    mask[box][_nucleoli(eosin, nucleus[box])] = NUCLEOLUS
    return mask


def _bounding_box(region: np.ndarray, margin: int) -> tuple[slice, slice]:
    """Slices of the bounding box of a non-empty bool (H, W) region, grown by `margin` px
    on every side and clipped to the image."""
    rows, cols = np.nonzero(region)
    return (slice(max(rows.min() - margin, 0), rows.max() + margin + 1),
            slice(max(cols.min() - margin, 0), cols.max() + margin + 1))


def _normalise_to_lamp(image: np.ndarray, background: np.ndarray) -> np.ndarray:
    """Transmittance I / I0 = 10**-OD, float64 (H, W, 3) in [0, 1]: the image divided by
    its blank slide, i.e. on a white lamp, so colour deconvolution sees the stain and not
    the lamp's tint and vignetting."""
    return 10.0 ** -optical_density(image, background)


def _refine_nucleus(od_sum: np.ndarray, gradient: np.ndarray, cell: np.ndarray, core: np.ndarray) -> np.ndarray:
    """Watershed on the OD gradient from markers: the nucleus core (eroded) against the
    cytoplasm well away from it. Puts the boundary on the steepest edge, not on a level."""
    core = _component_nearest_centre(morphology.opening(core, morphology.disk(1))) if core.any() else core
    if not core.any():
        return core
    core = ndi.binary_fill_holes(core)
    markers = np.zeros(cell.shape, dtype=np.int32)
    markers[~cell] = 1
    grown = ndi.binary_dilation(core, iterations=3)
    markers[cell & ~grown] = 1
    seed = ndi.binary_erosion(core, iterations=1)
    markers[seed if seed.any() else core] = 2
    # Only pixels within 3 px of the core are unlabelled, so the flood happens in their
    # bounding box (plus the ring of markers around it); outside it everything is label 1.
    # Flooding the whole image cost O(N log N) heap pushes for the fixed markers alone.
    box = _bounding_box(grown, 1)
    nucleus = np.zeros(cell.shape, dtype=bool)
    nucleus[box] = segmentation.watershed(gradient[box], markers[box]) == 2
    nucleus = ndi.binary_fill_holes(nucleus & cell)
    return _component_nearest_centre(nucleus) if nucleus.any() else core


def _nucleoli(eosin: np.ndarray, nucleus: np.ndarray) -> np.ndarray:
    """Nucleoli: small eosinophilic spots in the nucleus (red against blue chromatin in a Pap
    stain). White top-hat of the eosin channel above the nucleus's own variation (median +
    4 MAD); 3 px up to 1/5 of the nucleus in area."""
    if nucleus.sum() < 40:
        return np.zeros_like(nucleus)
    smooth = ndi.gaussian_filter(eosin, 0.7)
    tophat = morphology.white_tophat(np.where(nucleus, smooth, smooth[nucleus].min()), morphology.disk(4))
    values = tophat[nucleus]
    median = np.median(values)
    mad = np.median(np.abs(values - median)) + 1e-9
    spots = nucleus & (tophat > median + 4 * 1.4826 * mad) & ndi.binary_erosion(nucleus, iterations=2)
    spots = morphology.remove_small_objects(spots, max_size=2)
    labels, count = ndi.label(spots)
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


def _estimate_background(image: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """`estimate_background` of arrays that passed `check_cell` / `check_mask`."""
    glass = _clear_glass(image)
    if mask is not None:
        # A mask's "background" can hold neighbouring cells and debris (real crops do):
        # only the part of it that is also clear glass shows the lamp.
        # Too little of it and the lamp is taken as flat (see _fit_lamp).
        glass = glass & (mask == BACKGROUND)
    glass = ndi.binary_erosion(glass, iterations=2, border_value=1)  # clear of the blurred edge
    lamp = _fit_lamp(image, glass).astype(np.float64)
    # Stain only absorbs: the lamp is at least as bright as the cell. A crop with no glass
    # in it (the cell fills the frame) fools the fit; lift it above 99% of the cell.
    cell = ~glass
    if cell.any():
        smooth = ndi.gaussian_filter(image, (1.0, 1.0, 0), output=np.float64)
        excess = np.percentile((smooth - lamp)[cell], 99, axis=0)
        lamp += np.maximum(excess, 0.0)
    return np.clip(np.rint(lamp), 1, 255).astype(np.uint8)


def _clear_glass(image: np.ndarray) -> np.ndarray:
    """Boolean (H, W): pixels where the lamp shines through clear glass.

    Stain only ever darkens the lamp, so the lamp is the upper envelope of the image.
    Asymmetric least squares (Eilers & Boelens 2005) finds it: pixels above the surface
    weigh ENVELOPE_WEIGHT, those below 1 - ENVELOPE_WEIGHT, refit until stable. Glass is
    what lies within noise of the envelope. A brightness threshold would fail: with
    vignetting the corners can be darker than a pale cytoplasm.
    """
    level = ndi.gaussian_filter(image.sum(axis=2, dtype=np.float64), 1.5)
    noise = 1.4826 * np.median(np.abs(level - ndi.gaussian_filter(level, 3.0))) + 1e-6
    # The envelope is smooth: a grid of ~4000 pixels pins it down as well as all of them.
    height, width = level.shape
    stride = max(1, int(np.sqrt(level.size / 4000)))
    rows, cols = (g.ravel() for g in np.mgrid[0:height:stride, 0:width:stride])
    values = level[rows, cols]
    terms = _QUADRATIC if len(values) >= QUADRATIC_MIN_PIXELS else _PLANE
    design = _design(terms, rows, cols, height, width)
    weights = np.ones(len(values))
    for _ in range(20):
        root_w = np.sqrt(weights)
        coef, *_ = np.linalg.lstsq(design * root_w[:, None], values * root_w, rcond=None)
        residual = values - design @ coef
        updated = np.where(residual > 0, ENVELOPE_WEIGHT, 1 - ENVELOPE_WEIGHT)
        if (updated == weights).all():
            break
        weights = updated
    keep = residual > -4.0 * noise
    coef, *_ = np.linalg.lstsq(design[keep], values[keep], rcond=None)
    envelope = _surface_on_grid(terms, coef, height, width)
    return level - envelope > -4.0 * noise


def _fit_surface(level: np.ndarray, where: np.ndarray) -> np.ndarray:
    """Least-squares surface (quadratic, or a plane with few points) through `level` at
    the `where` pixels, evaluated everywhere: float64 of level's shape. level: (H, W) or
    (H, W, C), any real dtype (only the fitted pixels are converted to float64)."""
    height, width = level.shape[:2]
    rows, cols = np.nonzero(where)
    if len(rows) > 20000:  # a quadratic needs far fewer points; keep it fast
        pick = np.linspace(0, len(rows) - 1, 20000).astype(int)
        rows, cols = rows[pick], cols[pick]
    # Few glass pixels (a tight crop) cannot pin down curvature: fit a plane instead.
    terms = _QUADRATIC if len(rows) >= QUADRATIC_MIN_PIXELS else _PLANE
    values = level[rows, cols].astype(np.float64)
    coef, *_ = np.linalg.lstsq(_design(terms, rows, cols, height, width), values, rcond=None)
    return _surface_on_grid(terms, coef, height, width)


def _fit_lamp(image: np.ndarray, glass: np.ndarray) -> np.ndarray:
    """Surface per channel through the glass pixels, as uint8 (H, W, 3)."""
    pixels = image[glass].astype(np.float64)
    if len(pixels) < min(MIN_BACKGROUND_PIXELS, max(20, 0.05 * glass.size)):
        flat = np.percentile(image.reshape(-1, 3).astype(np.float64), 99, axis=0)
        return np.broadcast_to(np.rint(flat).astype(np.uint8), image.shape).copy()
    full = _fit_surface(image, glass)
    # Far from the glass pixels the fit can sag; the lamp is not dimmer than the dim glass.
    floor = np.percentile(pixels, 1, axis=0)
    return np.clip(np.rint(np.maximum(full, floor)), 1, 255).astype(np.uint8)


def complete_cell(record: CellRecord) -> CellRecord:
    """Fill in a record's missing mask and background, flagging what was estimated.

    Checks the record's arrays once (`check_cell`, naming its source_id), then segments
    a missing mask (with the background when there is one) and estimates a missing
    background from the image and mask. Returns the same record, updated.
    Raises InvalidInput for arrays that do not fit together.
    """
    check_cell(record.image, record.mask, record.background, record.source_id)
    if record.mask is None:
        record.mask = _segment_cell(record.image, record.background)
        record.mask_estimated = True
    if record.background is None:
        record.background = _estimate_background(record.image, record.mask)
        record.background_estimated = True
    return record
