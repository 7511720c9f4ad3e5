"""Nuclear texture: Haralick (grey-level co-occurrence) features and LBP histograms.

Both are computed on the nucleus's optical density, not on raw intensities, because OD
does not depend on the lamp. Haralick features (mahotas) need grey levels: OD is
quantised on a fixed scale (OD_STEP per level), which keeps texture comparable between
cells (a hyperchromatic nucleus uses higher levels). LBP only compares
each pixel with its neighbours, so it runs on the continuous OD: on quantised levels,
flat patches make exact ties that the interpolation of the LBP circle then decides at
floating-point precision, differently for a rotated or shifted copy of the same cell.

`uniform_lbp` is scikit-image's ``local_binary_pattern(..., method="uniform")`` written
again as whole-array NumPy: the same interpolation, in the same floating-point
operations, so the same codes bit for bit (tests/core/features/test_features.py checks it), about
twice as fast on the nucleus of a 224 px upload (0.9 against 1.7 ms a call, two calls a
cell; 1.7 against 5.1 ms on a 110 px square), where a whole upload may take 30 ms.
"""

from __future__ import annotations

import numpy as np
from mahotas.features.texture import cooccurence, haralick_features as mahotas_haralick_features

from .catalog import HARALICK_DISTANCES, HARALICK_NAMES, LBP_SETTINGS, TEXTURE

# One grey level per OD_STEP of optical density; OD above OD_STEP * OD_LEVELS is the top level.
# Stained nuclei lie at roughly 0.2-1.5 OD, which this spreads over ~30 levels.
OD_STEP = 0.04
OD_LEVELS = 64

FEATURES = TEXTURE  # the features this module computes, in vector order (the catalogue's)


def quantise_od(od: np.ndarray) -> np.ndarray:
    """Optical density (float, OD units) -> uint8 levels 1..OD_LEVELS on the fixed OD_STEP scale.

    Level k holds OD in [(k-1) * OD_STEP, k * OD_STEP); level 0 is left free so callers
    can mark pixels outside a region with it.
    """
    levels = np.floor(np.asarray(od, dtype=np.float64) / OD_STEP).astype(np.int64)
    return (np.clip(levels, 0, OD_LEVELS - 1) + 1).astype(np.uint8)


def haralick_features(levels: np.ndarray, region: np.ndarray) -> dict[str, float]:
    """Haralick features of `region` in a quantised image, at each of HARALICK_DISTANCES.

    levels: uint8 (h, w) from quantise_od(); region: bool (h, w). At each distance the
    symmetric co-occurrence matrices of the 4 directions (0, 45, 90, 135 degrees) are
    pooled into one, which is rotation-invariant, works for a nucleus with pairs in only
    some directions, and costs one feature evaluation instead of four. Pairs with a pixel
    outside the region are ignored. A region with no pixel pair at some distance (a
    nucleus of a pixel or two) gets zeros there: it has no texture at that scale.
    """
    inside = np.where(region, levels, 0).astype(np.uint8)
    values: dict[str, float] = {}
    for d in HARALICK_DISTANCES:
        pooled = sum(cooccurence(inside, direction, symmetric=True, distance=d) for direction in range(4))
        if pooled[1:, 1:].any():
            # VAR[|x-y|] rather than VAR[P(|x-y|)]: the latter depends on the matrix size,
            # i.e. on the cell's darkest level rather than on its texture.
            row = mahotas_haralick_features([pooled], ignore_zeros=True, use_x_minus_y_variance=True)[0]
        else:
            row = np.zeros(len(HARALICK_NAMES))
        for (name, _), value in zip(HARALICK_NAMES, row):
            values[f"nucleus_haralick_{name}_d{d}"] = float(value)
    return values


def uniform_lbp(image: np.ndarray, points: int, radius: float) -> np.ndarray:
    """Rotation-invariant uniform LBP codes of a grey image.

    Parameters
    ----------
    image : ndarray of float64, shape (h, w)
    points : int
        Neighbours on the circle, P.
    radius : float
        The circle's radius (px), R.

    Returns
    -------
    ndarray of float64, shape (h, w)
        ``skimage.feature.local_binary_pattern(image, points, radius, method="uniform")``,
        the same values: each neighbour bilinearly interpolated (0 beyond the border) at
        offsets rounded to 5 decimals, a bit set where it is not below the centre, the
        pattern's number of set bits where it changes at most twice along the chain of
        neighbours (not wrapping from the last to the first, as scikit-image counts), else
        P + 1.

    Notes
    -----
    The neighbours at an offset (dr, dc) sit at one whole-pixel shift of the image for
    every pixel, so each is read as four shifted slices of a zero-padded copy; the
    interpolation weights are formed per row and per column, r + dr - floor(r + dr), as
    scikit-image forms them per pixel, so rounding agrees too.
    """
    image = np.ascontiguousarray(image, dtype=np.float64)
    rows, cols = image.shape
    angles = 2 * np.pi * np.arange(points, dtype=np.float64) / points
    pad = int(np.ceil(radius)) + 1
    padded = np.zeros((rows + 2 * pad, cols + 2 * pad))
    padded[pad:pad + rows, pad:pad + cols] = image
    row_positions, col_positions = np.arange(rows, dtype=np.float64), np.arange(cols, dtype=np.float64)
    ones = np.zeros((rows, cols), dtype=np.int8)
    changes = np.zeros((rows, cols), dtype=np.int8)
    # Buffers reused for every neighbour: the same operations as fresh arrays, fewer allocations.
    top, bottom, part = (np.empty((rows, cols)) for _ in range(3))
    bit, previous = np.empty((rows, cols), dtype=bool), np.empty((rows, cols), dtype=bool)

    def shifted(row: int, col: int) -> np.ndarray:
        return padded[row:row + rows, col:col + cols]

    def blend(out: np.ndarray, weight_a: np.ndarray, a: np.ndarray, weight_b: np.ndarray, b: np.ndarray) -> None:
        np.multiply(weight_a, a, out=out)  # out = weight_a * a + weight_b * b, in that order
        np.multiply(weight_b, b, out=part)
        np.add(out, part, out=out)

    for index, (row_offset, col_offset) in enumerate(zip(np.round(-radius * np.sin(angles), 5),
                                                         np.round(radius * np.cos(angles), 5))):
        low_row, high_row = pad + int(np.floor(row_offset)), pad + int(np.ceil(row_offset))
        low_col, high_col = pad + int(np.floor(col_offset)), pad + int(np.ceil(col_offset))
        if low_row == high_row and low_col == high_col:
            texture = shifted(low_row, low_col)
        else:
            at_row, at_col = row_positions + row_offset, col_positions + col_offset
            down = (at_row - np.floor(at_row))[:, None]
            right = (at_col - np.floor(at_col))[None, :]
            blend(top, 1 - right, shifted(low_row, low_col), right, shifted(low_row, high_col))
            blend(bottom, 1 - right, shifted(high_row, low_col), right, shifted(high_row, high_col))
            blend(top, 1 - down, top, down, bottom)
            texture = top
        np.greater_equal(np.subtract(texture, image, out=part), 0, out=bit)
        ones += bit
        if index:
            changes += previous != bit
        bit, previous = previous, bit
    return np.where(changes <= 2, ones, points + 1).astype(np.float64)


def lbp_features(od: np.ndarray, region: np.ndarray) -> dict[str, float]:
    """Normalised histograms of rotation-invariant uniform LBP codes over `region`.

    od: float64 (h, w) optical density (the whole crop: neighbours outside the region
    still count, so the nucleus border shows as an edge); region: bool (h, w), not empty.
    """
    values: dict[str, float] = {}
    for p, r in LBP_SETTINGS:
        codes = uniform_lbp(od, p, r)[region].astype(np.int64)
        histogram = np.bincount(codes, minlength=p + 2) / codes.size
        for code in range(p + 2):
            values[f"nucleus_lbp_p{p}r{r}_{code}"] = float(histogram[code])
    return values


def texture_features(nucleus: np.ndarray, od: np.ndarray) -> dict[str, float]:
    """The FEATURES of this module: nucleus bool (h, w), od float64 (h, w) grey optical density."""
    # Work on the nucleus's bounding box, with room for the widest LBP circle: texture
    # only looks at nucleus pixels and their neighbours, and LBP costs per pixel.
    margin = max(r for _, r in LBP_SETTINGS) + 1
    rows, cols = np.nonzero(nucleus)
    box = (slice(max(rows.min() - margin, 0), rows.max() + margin + 1),
           slice(max(cols.min() - margin, 0), cols.max() + margin + 1))
    region = nucleus[box]
    return {**haralick_features(quantise_od(od[box]), region), **lbp_features(od[box], region)}
