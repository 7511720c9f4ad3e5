"""The faster paths of an upload's analysis give the reference's numbers, on synthetic and
on real cells: the patch the eye sees against its definition, the cytoplasm's extrema
against scikit-image's, the shape moments against regionprops'."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pathmaster.analysis.cell import PATCH_PX, cell_patch


def real_uploads(folder: Path, every: int = 20) -> list[np.ndarray]:
    from PIL import Image

    return [np.asarray(Image.open(path).convert("RGB")) for path in sorted(folder.glob("*/*.jpg"))[::every]]


def reference_patch(image: np.ndarray, background: np.ndarray, size: int = PATCH_PX) -> np.ndarray:
    """`cell.cell_patch` as its docstring defines it: padded with the slide's median
    colour (NumPy's median of each channel), resized in float32 and rounded."""
    import cv2

    h, w = image.shape[:2]
    slide = np.median(background.reshape(-1, 3), axis=0).astype(np.uint8)
    side = max(h, w)
    canvas = np.tile(slide, (side, side, 1)).astype(np.float32)
    top, left = (side - h) // 2, (side - w) // 2
    canvas[top:top + h, left:left + w] = image
    resized = cv2.resize(canvas, (size, size), interpolation=cv2.INTER_AREA if side >= size else cv2.INTER_LINEAR)
    return np.clip(np.rint(resized), 0, 255).astype(np.uint8)


def check_cell(image: np.ndarray, background: np.ndarray, mask: np.ndarray) -> None:
    """The patch, the extrema and the shape moments of one cell equal their references."""
    from skimage import measure, morphology

    from pathmaster.features.geometry import ellipse, largest_piece
    from pathmaster.features.regions import crop_regions
    from pathmaster.image.morphology import regional_maxima

    # resized in uint8 or in float32 and rounded: a level apart at most
    difference = np.abs(cell_patch(image, background).astype(int) - reference_patch(image, background))
    assert difference.max() <= 1 and difference.mean() < 0.05
    crop = crop_regions(image, background, mask)
    grey = crop.image.sum(axis=2, dtype=np.int32)
    assert np.array_equal(regional_maxima(grey), morphology.local_maxima(grey, connectivity=2, allow_borders=True))
    assert np.array_equal(regional_maxima(765 - grey), morphology.local_minima(grey, connectivity=2,
                                                                                allow_borders=True))
    for region in (crop.nucleus, crop.cell):
        piece = largest_piece(region)
        props, ours = measure.regionprops(piece.astype(np.uint8))[0], ellipse(piece)
        assert ours.area == props.area and ours.box == props.slice and ours.centroid == props.centroid
        # The eigenvalues to rounding: OpenCV's central moments come from the raw ones.
        np.testing.assert_allclose(ours.eigenvalues, props.inertia_tensor_eigvals, rtol=1e-9, atol=1e-9)
        assert ours.eccentricity == pytest.approx(props.eccentricity, rel=1e-9, abs=1e-6)
        assert ours.major_axis == pytest.approx(props.axis_major_length, rel=1e-9)
        assert ours.minor_axis == pytest.approx(props.axis_minor_length, rel=1e-9, abs=1e-6)


def test_patch_extrema_and_moments_equal_their_references_on_synthetic_cells():
    from pathmaster.records import DIAGNOSES
    from pathmaster.analysis.cell import analyse_cell
    from pathmaster.image.synth import cell_rng, synth_cell

    for i, diagnosis in enumerate(DIAGNOSES):
        cell = synth_cell(diagnosis, cell_rng(31, i))
        check_cell(cell.image, cell.background, cell.mask)
        analysis = analyse_cell(cell.image)  # as an upload: mask and slide estimated
        check_cell(cell.image, analysis.background, analysis.mask)


def test_patch_extrema_and_moments_equal_their_references_on_real_uploads(herlev_224_dev):
    from pathmaster.analysis.cell import analyse_cell

    for image in real_uploads(herlev_224_dev):
        analysis = analyse_cell(image)
        check_cell(image, analysis.background, analysis.mask)
