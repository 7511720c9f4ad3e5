"""Optical density (OD) of a cell image against its blank slide (Beer-Lambert).

A stain of optical density OD passes I = I0 * 10**(-OD) of the lamp's light, so
OD = -log10(I / I0) with I the cell image and I0 the background (blank slide, same
lighting) at the same pixel. The segmentation finds stained regions by it and the density
features (``pathmaster.features.density``) measure it per region.
"""

from __future__ import annotations

import cv2
import numpy as np


# Intensities below this grey level are raised to it, so that black pixels (and a black
# background) give a finite OD: at most log10(255 / 1) ~= 2.41.
INTENSITY_FLOOR = 1.0

# The blank slide's illumination (vignetting, tint) varies over tens of pixels; smoothing
# it removes its pixel noise and uint8 rounding, which would otherwise add to every OD.
BACKGROUND_SIGMA_PX = 2.0

# log10 of every uint8 grey level (floored), looked up instead of computed per pixel.
_LOG10_GREY = np.log10(np.maximum(np.arange(256, dtype=np.float64), INTENSITY_FLOOR))


def optical_density(image: np.ndarray, background: np.ndarray) -> np.ndarray:
    """Per-channel optical density of a cell image against its blank-slide background.

    The one optical density of PathMaster: the features and the segmentation both use it.

    Parameters
    ----------
    image : ndarray of uint8, shape (H, W, 3)
        The cell image, I (grey levels).
    background : ndarray of uint8, shape (H, W, 3)
        The blank slide under the same lighting, I0 (grey levels).

    Returns
    -------
    ndarray of float64, shape (H, W, 3)
        OD = -log10(I / I0), unitless (OD units), with I0 the background smoothed by a
        Gaussian of BACKGROUND_SIGMA_PX px (its pixel noise would add to every OD), both
        intensities floored at INTENSITY_FLOOR grey levels (so a black pixel gives at
        most log10(255) ~= 2.41, not infinity), and clipped below at 0 (a pixel brighter
        than the blank slide is noise, not negative stain).
    """
    # The slide is smoothed in float32 (its rounding, ~1e-7 relative, is far below the
    # 0.5-grey-level rounding of the camera) because it is the costliest step here.
    if background.ndim == 3 and background.strides[:2] == (0, 0):
        # One colour broadcast over the image (segmentation's flat lamp): smoothing a
        # constant gives the constant, so take its log once per channel. Each channel's
        # OD then depends on the grey level alone: a table of the 256 values (the same
        # subtraction and clip per entry) read by cv2.LUT costs one pass, where
        # subtracting a (3,) lamp over (H, W, 3) took numpy 0.3 ms on a 200 px image.
        lamp = np.log10(np.maximum(background[0, 0].astype(np.float64), INTENSITY_FLOOR))
        table = np.maximum(lamp - _LOG10_GREY[:, None], 0.0)  # (256, C)
        return cv2.LUT(np.ascontiguousarray(image), np.ascontiguousarray(table[None]))
    # One float64 array carries the lamp to the OD, each step in place (the same
    # operations as fresh arrays): every (H, W, 3) float64 temporary of a 224 px upload is
    # 1.2 MB of new pages, which cost about as much CPU to fault in as the arithmetic.
    smooth = cv2.GaussianBlur(background.astype(np.float32), (0, 0), BACKGROUND_SIGMA_PX)
    od = smooth.astype(np.float64)
    np.maximum(od, INTENSITY_FLOOR, out=od)
    np.log10(od, out=od)
    # cv2.LUT reads the same table as _LOG10_GREY[image], several times faster.
    np.subtract(od, cv2.LUT(np.ascontiguousarray(image), _LOG10_GREY), out=od)
    return np.maximum(od, 0.0, out=od)


def grey_optical_density(image: np.ndarray, background: np.ndarray) -> np.ndarray:
    """Optical density averaged over the three channels: float64 (H, W), OD units."""
    return channel_mean(optical_density(image, background))


def channel_mean(values: np.ndarray) -> np.ndarray:
    """``values.mean(axis=2)`` of a float64 (H, W, 3) image, by adding its channels in the
    order numpy does and dividing by 3: the same numbers, without numpy's slow reduction
    over a short last axis."""
    return (values[..., 0] + values[..., 1] + values[..., 2]) / 3.0
