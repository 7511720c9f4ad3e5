"""The segmentation's image primitives give the numbers of the scipy / scikit-image calls
they stand in for, on random images that reach the border."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi
from skimage import exposure, filters, morphology

from pathmaster.image.morphology import (
    FOOTPRINT_RADIUS_PX,
    channel_percentile,
    fill_holes,
    gaussian_smooth,
    grey_histogram,
    grow,
    label_pieces,
    open_with_disk,
    regional_maxima,
    shrink,
    threshold_multiotsu,
    threshold_otsu,
    white_tophat_disk,
)


def blobs(rng: np.random.Generator, shape=(37, 45)) -> np.ndarray:
    return ndi.gaussian_filter(rng.normal(size=shape), rng.uniform(1.0, 4.0)) > rng.uniform(-0.3, 0.5)


def test_disk_opening_equals_scikit_images_pixel_for_pixel():
    """Footprints up to FOOTPRINT_RADIUS_PX, distance transforms beyond, against skimage's
    footprint opening (mirrored edges) at several radii."""
    rng = np.random.default_rng(5)
    changed = 0
    for radius in (1, 2, 3, 5, 8, FOOTPRINT_RADIUS_PX, FOOTPRINT_RADIUS_PX + 1):
        for _ in range(4):
            shape = tuple(int(v) for v in rng.integers(20, 90, size=2))
            binary = blobs(rng, shape)
            expected = morphology.opening(binary, morphology.disk(radius))
            np.testing.assert_array_equal(open_with_disk(binary, radius), expected, err_msg=f"radius {radius}")
            changed += int((expected != binary).any())
    assert changed >= 14  # most openings did remove something: the comparison has teeth
    assert not open_with_disk(np.zeros((9, 9), bool), 3).any()
    assert open_with_disk(np.ones((9, 9), bool), 3).all()


def test_fill_holes_labels_grow_and_shrink_equal_scipys():
    rng = np.random.default_rng(1)
    for _ in range(20):
        binary = blobs(rng)
        for image in (binary, ~binary):
            np.testing.assert_array_equal(fill_holes(image), ndi.binary_fill_holes(image))
            labels, count = label_pieces(image)
            expected, expected_count = ndi.label(image)
            assert count == expected_count
            np.testing.assert_array_equal(labels, expected)
            for steps in (1, 3):
                np.testing.assert_array_equal(grow(image, steps), ndi.binary_dilation(image, iterations=steps))
                for border in (0, 1):
                    np.testing.assert_array_equal(shrink(image, steps, border),
                                                  ndi.binary_erosion(image, iterations=steps, border_value=border))


def test_gaussian_smooth_and_white_tophat_equal_scipys_and_skimages():
    rng = np.random.default_rng(2)
    grey = rng.random((31, 40))
    colour = rng.integers(0, 256, (31, 40, 3)).astype(np.uint8)
    for sigma in (0.7, 1.0, 3.0):
        np.testing.assert_allclose(gaussian_smooth(grey, sigma), ndi.gaussian_filter(grey, sigma), rtol=1e-10)
        np.testing.assert_allclose(gaussian_smooth(colour, sigma),
                                   ndi.gaussian_filter(colour.astype(np.float64), (sigma, sigma, 0)), rtol=1e-10)
    for radius in (1, 4):
        tophat = white_tophat_disk(grey.copy(), radius)
        np.testing.assert_array_equal(tophat, morphology.white_tophat(grey, morphology.disk(radius)))
        assert tophat.max() > 0


def test_histogram_and_otsu_thresholds_equal_skimages():
    rng = np.random.default_rng(3)
    for _ in range(10):
        values = np.concatenate([rng.normal(0.2, 0.05, 500), rng.normal(0.6, 0.1, 300), rng.normal(1.2, 0.1, 80)])
        counts, centres = grey_histogram(values)
        expected_counts, expected_centres = exposure.histogram(values, nbins=256)
        np.testing.assert_array_equal(counts, expected_counts)
        np.testing.assert_array_equal(centres, expected_centres)
        assert threshold_otsu(values) == filters.threshold_otsu(values)
        np.testing.assert_array_equal(threshold_multiotsu(values, 3), filters.threshold_multiotsu(values, classes=3))


@pytest.mark.parametrize("n", [1, 2, 3, 7, 1000, 12345])
def test_channel_percentile_equals_numpys(n):
    rng = np.random.default_rng(n)
    pixels = rng.integers(0, 256, (n, 3)).astype(np.uint8)
    for q in (0, 1, 33.3, 50, 99, 100):
        np.testing.assert_array_equal(channel_percentile(pixels, q), np.percentile(pixels, q, axis=0))
    image = rng.integers(0, 256, (40, 50, 3)).astype(np.uint8)
    where = rng.random((40, 50)) < 0.3
    np.testing.assert_array_equal(channel_percentile(image, 1, where=where), np.percentile(image[where], 1, axis=0))


@pytest.mark.filterwarnings("ignore:maxima can't exist")
def test_regional_maxima_equal_scikit_images_local_maxima_and_minima():
    """Random images with wide plateaus (few grey levels, blocks), one value or a line of
    pixels included: the maxima, and the minima as maxima upside down, pixel for pixel."""
    rng = np.random.default_rng(13)
    found = 0
    for trial in range(400):
        shape = tuple(int(v) for v in rng.integers(1, 40, size=2))
        levels = int(rng.choice([1, 2, 3, 6, 766]))
        image = rng.integers(0, levels, shape).astype(np.int32)
        if trial % 3 == 0:  # 2 x 2 blocks: plateaus that touch one another and the border
            image = np.kron(image, np.ones((2, 2), np.int32))[: shape[0], : shape[1]]
        expected = morphology.local_maxima(image, connectivity=2, allow_borders=True)
        np.testing.assert_array_equal(regional_maxima(image), expected, err_msg=f"trial {trial}")
        np.testing.assert_array_equal(regional_maxima(765 - image),
                                      morphology.local_minima(image, connectivity=2, allow_borders=True))
        found += int(expected.any())
    assert found > 300  # most images have maxima: the comparison saw some
    assert not regional_maxima(np.full((5, 7), 9)).any()  # one value all round: no maximum
