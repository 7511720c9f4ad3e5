"""The feature vector of one cell: geometric, optical-density and nuclear-texture features."""

from __future__ import annotations

import numpy as np

from pathmaster.image.optics import channel_mean, optical_density

from . import density, geometry, texture
from .catalog import FEATURES, feature_names
from .regions import CellRegions, cell_regions

__all__ = ["FEATURES", "extract_features", "feature_names", "features_of"]
_NAMES = feature_names()


def extract_features(image: np.ndarray, background: np.ndarray, mask: np.ndarray,
                     source: str | None = None) -> np.ndarray:
    """Feature vector of one cell.

    image: uint8 (H, W, 3) RGB cell image.
    background: uint8 (H, W, 3) blank slide under the same lighting (callers estimate one
        when the user has none); it turns intensity into optical density.
    mask: integer (H, W) labels 0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus.
    source: file or cell id, named in error messages.

    Returns float64 (len(FEATURES),), every value finite, in the order and units of
    FEATURES. Raises pathmaster.records.InvalidInput for bad arrays or a cell with no
    nucleus.
    """
    return features_of(cell_regions(image, background, mask, source))


def features_of(cell: CellRegions) -> np.ndarray:
    """Feature vector of a cell already checked and cut into regions (`cell_regions`, or
    `crop_regions` after `pathmaster.image.io.check_cell`): float64 (len(FEATURES),)."""
    values = geometry.geometry_features(cell)
    od_rgb = optical_density(cell.image, cell.background)
    od_grey = channel_mean(od_rgb)
    values.update(density.density_features(cell, od_rgb, od_grey))
    values.update(texture.texture_features(cell.nucleus, od_grey))
    if len(values) != len(_NAMES) or not values.keys() >= set(_NAMES):
        missing, extra = set(_NAMES) - values.keys(), values.keys() - set(_NAMES)
        raise AssertionError(f"feature catalogue out of step with code: missing {missing}, extra {extra}")
    return np.array([values[name] for name in _NAMES], dtype=np.float64)
