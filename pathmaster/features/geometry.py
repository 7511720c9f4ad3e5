"""Size and shape of the nucleus and the whole cell, N/C ratio and nucleoli.

Shape measures are scikit-image regionprops' (area, centroid, eccentricity, axis lengths,
from the piece's moments: `ellipse`; perimeter: `perimeter`), computed by OpenCV, and
OpenCV's (contours; the convex hull of the pixel outlines, which gives solidity and the
Feret diameters).
When a region falls apart into several pieces (a binucleate cell, a stray mask pixel),
its shape is that of its largest piece; the N/C ratio and nucleolus measures use every
pixel of the regions.
"""

from __future__ import annotations

from math import sqrt
from typing import NamedTuple

import cv2
import numpy as np

from pathmaster.image.morphology import shrink

from .catalog import FOURIER_HARMONICS, GEOMETRIC
from .regions import CellRegions

# Fourier descriptors: the contour is resampled to this many points by arc length (harmonics:
# catalog.FOURIER_HARMONICS).
FOURIER_POINTS = 64

FEATURES = GEOMETRIC  # the features this module computes, in vector order (the catalogue's)


# skimage.measure.perimeter's neighbourhood codes of a border pixel and the length each adds.
_PERIMETER_CODES = np.array([[10, 2, 10], [2, 1, 2], [10, 2, 10]], dtype=np.float32)
_PERIMETER_WEIGHTS = np.zeros(50)
_PERIMETER_WEIGHTS[[5, 7, 15, 17, 25, 27]] = 1
_PERIMETER_WEIGHTS[[21, 33]] = np.sqrt(2)
_PERIMETER_WEIGHTS[[13, 23]] = (1 + np.sqrt(2)) / 2


def perimeter(piece: np.ndarray) -> float:
    """Perimeter of a boolean region, in px.

    Parameters
    ----------
    piece : ndarray of bool, shape (h, w)

    Returns
    -------
    float
        ``skimage.measure.perimeter(piece, 4)`` (regionprops' ``perimeter``), the same
        number: border pixels (the region less its erosion by a cross, nothing beyond the
        edge, `pathmaster.image.morphology.shrink`) coded by their neighbours, each code's count
        times its length. Coded by OpenCV (integer sums, exact) and counted as scikit-image
        counts them; its scipy filters took ~0.5 ms of a cell's features.
    """
    border = piece & ~shrink(piece, 1)
    codes = cv2.filter2D(border.view(np.uint8), cv2.CV_16S, _PERIMETER_CODES, borderType=cv2.BORDER_CONSTANT)
    return float(np.bincount(codes.ravel(), minlength=50) @ _PERIMETER_WEIGHTS)



class Ellipse(NamedTuple):
    """What a piece's moments up to the second give: area (px^2), bounding box (row and
    column slices), centroid (row, col, px) and the inertia tensor's eigenvalues (px^2,
    ``first >= second >= 0``: the variances along the equivalent ellipse's axes)."""

    area: float
    box: tuple[slice, slice]
    centroid: tuple[float, float]
    eigenvalues: tuple[float, float]

    @property
    def eccentricity(self) -> float:
        first, second = self.eigenvalues
        return 0.0 if first == 0 else sqrt(1 - second / first)

    @property
    def major_axis(self) -> float:
        return 4 * sqrt(self.eigenvalues[0])

    @property
    def minor_axis(self) -> float:
        return 4 * sqrt(self.eigenvalues[1])


def ellipse(piece: np.ndarray) -> Ellipse:
    """The moments of a non-empty boolean piece, by OpenCV.

    Parameters
    ----------
    piece : ndarray of bool, shape (h, w)

    Returns
    -------
    Ellipse
        scikit-image regionprops' ``area``, ``slice``, ``centroid``,
        ``inertia_tensor_eigvals`` (so ``eccentricity``, ``axis_major_length``,
        ``axis_minor_length``) of the piece: area, box and centroid the same numbers
        (integer sums, one division), the eigenvalues to floating-point rounding (~1e-12
        px^2: OpenCV forms the central moments from the raw ones, scikit-image from the
        pixels' offsets). regionprops took ~0.7 ms a piece on a 224 px upload, this ~0.1.
    """
    pixels = piece.view(np.uint8)
    moments = cv2.moments(pixels, binaryImage=True)
    area = moments["m00"]
    left, top, width, height = cv2.boundingRect(pixels)
    # regionprops' inertia tensor [[mu02, -mu11], [-mu11, mu20]] / mu00 (rows, columns);
    # its eigenvalues in closed form (regionprops: numpy.linalg.eigvalsh), a negative
    # one from rounding clipped to 0 as regionprops clips it.
    rows, cross, cols = moments["mu02"] / area, -moments["mu11"] / area, moments["mu20"] / area
    half_sum, radius = (rows + cols) / 2, sqrt(4 * cross * cross + (rows - cols) ** 2) / 2
    return Ellipse(float(area), (slice(top, top + height), slice(left, left + width)),
                   (moments["m01"] / area, moments["m10"] / area),
                   (max(half_sum + radius, 0.0), max(half_sum - radius, 0.0)))


def count_pieces(region: np.ndarray) -> int:
    """Number of 8-connected pieces of a boolean mask."""
    count, _ = cv2.connectedComponents(region.astype(np.uint8), connectivity=8)
    return count - 1


def largest_piece(region: np.ndarray) -> np.ndarray:
    """The largest 8-connected piece of a non-empty boolean mask, as a bool array."""
    count, labels, stats, _ = cv2.connectedComponentsWithStats(region.astype(np.uint8), connectivity=8)
    if count == 2:
        return region
    return labels == 1 + int(np.argmax(stats[1:, cv2.CC_STAT_AREA]))


def outer_contour(piece: np.ndarray) -> np.ndarray:
    """Outer contour of one connected piece: float64 (n, 2) of (x, y) pixel centres, OpenCV order."""
    contours, _ = cv2.findContours(piece.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
    longest = max(contours, key=len)
    return longest.reshape(-1, 2).astype(np.float64)


def outline_hull(piece: np.ndarray) -> np.ndarray:
    """Convex hull of a connected piece's pixel outlines: float64 (m, 2) polygon of (x, y).

    Every contour pixel contributes its four corners, so a one-pixel-wide line is 1 px
    wide and a filled square of n x n pixels has hull area n^2, like its pixel area.
    """
    centres = outer_contour(piece)
    corners = (centres[:, None, :] + np.array([[-0.5, -0.5], [-0.5, 0.5], [0.5, -0.5], [0.5, 0.5]])).reshape(-1, 2)
    return cv2.convexHull(corners.astype(np.float32)).reshape(-1, 2).astype(np.float64)


def feret_diameters(hull: np.ndarray) -> tuple[float, float]:
    """(minimum, maximum) caliper width in px of a convex polygon (m, 2).

    The maximum is the largest distance between two vertices. The minimum width is
    attained with one caliper on a hull edge, so it is the smallest, over edges, of the
    farthest vertex from that edge's line. Both compare all m x m vertex pairs, exactly;
    m stays small because a digital convex outline has O(side^(2/3)) vertices: 568 for a
    4000 px disk (20 ms), so rotating calipers would not pay for their complexity.
    """
    maximum = float(np.sqrt(((hull[:, None, :] - hull[None, :, :]) ** 2).sum(axis=2).max()))
    edges = np.roll(hull, -1, axis=0) - hull
    lengths = np.hypot(edges[:, 0], edges[:, 1])
    keep = lengths > 1e-9
    edges, starts, lengths = edges[keep], hull[keep], lengths[keep]
    offsets = hull[None, :, :] - starts[:, None, :]
    # |cross(edge, vertex - start)| / |edge| is the vertex's distance from the edge's line.
    distances = np.abs(edges[:, None, 0] * offsets[..., 1] - edges[:, None, 1] * offsets[..., 0]) / lengths[:, None]
    return float(distances.max(axis=1).min()), maximum


def _resample_closed(points: np.ndarray, count: int) -> np.ndarray:
    """`count` points spaced evenly by arc length along a closed polygon (n, 2)."""
    closed = np.vstack([points, points[:1]])
    steps = np.hypot(*np.diff(closed, axis=0).T)
    arc = np.concatenate([[0.0], np.cumsum(steps)])
    targets = np.linspace(0.0, arc[-1], count, endpoint=False)
    return np.column_stack([np.interp(targets, arc, closed[:, 0]), np.interp(targets, arc, closed[:, 1])])


def contour_irregularity(piece: np.ndarray, centroid_rc: tuple[float, float]) -> dict[str, float]:
    """Radial coefficient of variation and Fourier descriptors 2..FOURIER_HARMONICS of a piece.

    Fourier descriptors: the contour as complex numbers x + iy, resampled by arc length;
    |Z_k| and |Z_-k| pooled per harmonic and divided by harmonic 1, which removes
    position, size, rotation and starting point. A disk has only harmonic 1 and an
    ellipse small odd ones; lobes and notches raise the rest.
    A piece too small to have a contour of length > 0 gets zeros.
    """
    contour = outer_contour(piece)
    values = {"nucleus_radial_cv": 0.0, **{f"nucleus_fourier_{k}": 0.0 for k in range(2, FOURIER_HARMONICS + 1)}}
    if len(contour) < 3:
        return values
    radii = np.hypot(contour[:, 0] - centroid_rc[1], contour[:, 1] - centroid_rc[0])
    if radii.mean() > 0:
        values["nucleus_radial_cv"] = float(radii.std() / radii.mean())
    samples = _resample_closed(contour, FOURIER_POINTS)
    spectrum = np.abs(np.fft.fft(samples[:, 0] + 1j * samples[:, 1]))
    fundamental = np.hypot(spectrum[1], spectrum[-1])
    if fundamental > 0:
        for k in range(2, FOURIER_HARMONICS + 1):
            values[f"nucleus_fourier_{k}"] = float(np.hypot(spectrum[k], spectrum[-k]) / fundamental)
    return values


def _shape(piece: np.ndarray, name: str) -> tuple[dict[str, float], Ellipse]:
    """Size and shape of one connected piece; also returns its `ellipse`."""
    props = ellipse(piece)
    area, length = props.area, perimeter(piece[props.box])
    # The outline hull serves solidity and both Feret diameters at once; regionprops
    # would rasterise a convex hull image for each, several times slower.
    hull = outline_hull(piece)
    feret_min, feret_max = feret_diameters(hull)
    values = {
        f"{name}_area": area,
        f"{name}_perimeter": length,
        # regionprops gives a perimeter of 0 for a single pixel; call that a disk.
        f"{name}_form_factor": 4.0 * np.pi * area / length**2 if length > 0 else 1.0,
        f"{name}_eccentricity": props.eccentricity,
        f"{name}_solidity": area / cv2.contourArea(hull.astype(np.float32)),
        f"{name}_major_axis": props.major_axis,
        f"{name}_minor_axis": props.minor_axis,
        f"{name}_feret_max": feret_max,
        f"{name}_feret_min": feret_min,
    }
    return values, props


def geometry_features(cell: CellRegions) -> dict[str, float]:
    """The FEATURES of this module for one cell (cropped regions from cell_regions())."""
    nucleus_piece = largest_piece(cell.nucleus)
    cell_piece = largest_piece(cell.cell)
    values, nucleus_props = _shape(nucleus_piece, "nucleus")
    cell_values, cell_props = _shape(cell_piece, "cell")
    values.update(cell_values)
    values.update(contour_irregularity(nucleus_piece, nucleus_props.centroid))

    nucleus_area = float(cell.nucleus.sum())
    values["nc_ratio"] = nucleus_area / float(cell.cell.sum())
    equivalent_radius = np.sqrt(cell_props.area / np.pi)
    values["nucleus_offset"] = float(np.hypot(*np.subtract(nucleus_props.centroid, cell_props.centroid))
                                     / equivalent_radius)
    values["nucleolus_count"] = float(count_pieces(cell.nucleolus))
    values["nucleolus_area"] = float(cell.nucleolus.sum())
    values["nucleolus_fraction"] = values["nucleolus_area"] / nucleus_area
    return values
