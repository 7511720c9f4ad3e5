"""Synthetic Pap-smear cells with ground truth, deterministic for a seed.

A cell is drawn the way a bright-field microscope sees it:

1. Geometry. A cytoplasm and a nucleus, each a closed curve r(theta) = R (1 + sum of a few
   random harmonics), stretched to an aspect ratio and rotated; 0-3 nucleoli inside the
   nucleus. The mask (0 background, 1 cytoplasm, 2 nucleus, 3 nucleolus) is exact.
2. Stain. Optical density (OD) per pixel and channel = sum over stains of
   concentration x absorption vector: haematoxylin in the nucleus (with a chromatin
   texture), eosin/orange G ("eosinophilic") or light green ("cyanophilic") in the
   cytoplasm, a denser eosinophilic dot per nucleolus.
3. Optics (Beer-Lambert). The lamp through a blank slide gives the background: a tinted
   level with vignetting and a slight gradient. The cell image is background x 10^-OD,
   slightly blurred (the objective's point-spread function). Both images get their own
   sensor noise, since they are two separate exposures.

The 7 Herlev classes differ by the criteria cytologists use (Bethesda; Jantzen et al. 2005):
nuclear size, nucleus/cytoplasm ratio, hyperchromasia (nuclear OD), contour irregularity,
chromatin coarseness, nucleolar prominence, cytoplasm size and staining. Each criterion
is drawn from a class distribution wide enough that adjacent grades overlap, as they do
between real observers, so retrieval is not trivially easy.

Units: lengths in pixels (about 0.5 um per pixel: a superficial squamous cell ~80 um
across), OD in absorbance units (log10).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from scipy import ndimage as ndi

from pathmaster.image.io import write_png
from pathmaster.records import (
    CYTOPLASM,
    DIAGNOSES,
    NUCLEOLUS,
    NUCLEUS,
    CellRecord,
    InvalidInput,
)

GENERATOR = "pathmaster-synth"
PIXEL_UM = 0.5  # micrometres per pixel of every generated cell (see Units above)
FORMAT_VERSION = 1
MANIFEST = "manifest.json"


def _unit(v: Sequence[float]) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


# RGB optical-density vectors of the Papanicolaou stain's dyes. Haematoxylin and eosin
# from Ruifrok & Johnston (2001), as in skimage.color.rgb2hed; light green SF absorbs
# red (~630 nm) and orange G blue-green (~480 nm).
HAEMATOXYLIN = _unit([0.650, 0.704, 0.286])
EOSIN = _unit([0.072, 0.990, 0.105])
LIGHT_GREEN = _unit([0.80, 0.20, 0.56])
ORANGE_G = _unit([0.05, 0.45, 0.89])
EOSINOPHILIC = _unit(EOSIN + 0.5 * ORANGE_G)


@dataclass(frozen=True)
class ClassProfile:
    """Per-class distributions, each a (mean, standard deviation) pair.

    Lengths are equivalent radii in pixels; OD in absorbance units at the dye's peak.
    """

    cyto_radius: tuple[float, float]
    cyto_aspect: tuple[float, float]  # major/minor axis ratio, >= 1
    cyto_irregularity: tuple[float, float]  # relative amplitude of the contour harmonics
    cyto_od: tuple[float, float]
    eosinophilia: tuple[float, float]  # 0 cyanophilic (light green) .. 1 eosinophilic
    nuc_radius: tuple[float, float]
    nuc_aspect: tuple[float, float]
    nuc_irregularity: tuple[float, float]
    nuc_od: tuple[float, float]  # hyperchromasia
    chromatin_contrast: tuple[float, float]  # relative std of the chromatin texture
    chromatin_grain: tuple[float, float]  # texture scale (Gaussian sigma, px): coarser = larger
    nucleoli: float  # mean number of nucleoli (Poisson, capped at 3)
    nucleus_offset: float = 0.15  # nucleus centre offset, fraction of the cytoplasm radius


# The classes, in order of severity. Superficial: big flat polygonal eosinophilic cell with
# a small dark pyknotic nucleus. Intermediate: as big, cyanophilic, small pale vesicular
# nucleus. Columnar: tall narrow cell, basal oval nucleus. Dysplasias: the nucleus grows
# and darkens, its chromatin coarsens and its contour wrinkles while the cytoplasm shrinks
# (N/C rises); carcinoma in situ: scant cytoplasm around a large, dark, coarse nucleus.
PROFILES: dict[str, ClassProfile] = {
    "normal_superficial": ClassProfile(
        cyto_radius=(76, 8), cyto_aspect=(1.25, 0.15), cyto_irregularity=(0.07, 0.02),
        cyto_od=(0.16, 0.04), eosinophilia=(0.7, 0.25),
        nuc_radius=(5.8, 1.1), nuc_aspect=(1.1, 0.08), nuc_irregularity=(0.03, 0.015),
        nuc_od=(0.95, 0.2), chromatin_contrast=(0.06, 0.03), chromatin_grain=(0.8, 0.2),
        nucleoli=0.0, nucleus_offset=0.2),
    "normal_intermediate": ClassProfile(
        cyto_radius=(72, 9), cyto_aspect=(1.3, 0.15), cyto_irregularity=(0.07, 0.02),
        cyto_od=(0.2, 0.05), eosinophilia=(0.3, 0.25),
        nuc_radius=(8.8, 1.6), nuc_aspect=(1.15, 0.1), nuc_irregularity=(0.03, 0.015),
        nuc_od=(0.52, 0.12), chromatin_contrast=(0.12, 0.04), chromatin_grain=(0.9, 0.2),
        nucleoli=0.05, nucleus_offset=0.2),
    "normal_columnar": ClassProfile(
        cyto_radius=(36, 6), cyto_aspect=(2.8, 0.5), cyto_irregularity=(0.04, 0.015),
        cyto_od=(0.25, 0.06), eosinophilia=(0.3, 0.2),
        nuc_radius=(9.5, 1.6), nuc_aspect=(1.45, 0.2), nuc_irregularity=(0.03, 0.015),
        nuc_od=(0.6, 0.12), chromatin_contrast=(0.14, 0.05), chromatin_grain=(1.0, 0.25),
        nucleoli=0.3, nucleus_offset=0.55),
    "mild_dysplasia": ClassProfile(
        cyto_radius=(66, 11), cyto_aspect=(1.3, 0.15), cyto_irregularity=(0.06, 0.02),
        cyto_od=(0.22, 0.06), eosinophilia=(0.4, 0.25),
        nuc_radius=(12.0, 2.5), nuc_aspect=(1.2, 0.12), nuc_irregularity=(0.05, 0.02),
        nuc_od=(0.6, 0.14), chromatin_contrast=(0.18, 0.05), chromatin_grain=(1.1, 0.3),
        nucleoli=0.2),
    "moderate_dysplasia": ClassProfile(
        cyto_radius=(50, 10), cyto_aspect=(1.25, 0.15), cyto_irregularity=(0.05, 0.02),
        cyto_od=(0.26, 0.06), eosinophilia=(0.35, 0.25),
        nuc_radius=(15.5, 2.5), nuc_aspect=(1.22, 0.12), nuc_irregularity=(0.07, 0.025),
        nuc_od=(0.7, 0.14), chromatin_contrast=(0.23, 0.06), chromatin_grain=(1.3, 0.35),
        nucleoli=0.4),
    "severe_dysplasia": ClassProfile(
        cyto_radius=(38, 8), cyto_aspect=(1.25, 0.15), cyto_irregularity=(0.05, 0.02),
        cyto_od=(0.28, 0.07), eosinophilia=(0.3, 0.25),
        nuc_radius=(17.5, 2.6), nuc_aspect=(1.25, 0.14), nuc_irregularity=(0.09, 0.03),
        nuc_od=(0.8, 0.15), chromatin_contrast=(0.28, 0.07), chromatin_grain=(1.5, 0.4),
        nucleoli=0.7),
    "carcinoma_in_situ": ClassProfile(
        cyto_radius=(30, 6), cyto_aspect=(1.25, 0.15), cyto_irregularity=(0.05, 0.02),
        cyto_od=(0.3, 0.07), eosinophilia=(0.25, 0.2),
        nuc_radius=(19.0, 2.7), nuc_aspect=(1.25, 0.14), nuc_irregularity=(0.1, 0.03),
        nuc_od=(0.85, 0.16), chromatin_contrast=(0.33, 0.08), chromatin_grain=(1.7, 0.45),
        nucleoli=1.0),
}

SIZE_RANGE = (190, 222)  # image side in pixels: ~100 KB as a noisy RGB PNG
MIN_CYTO_RIM = 1.3  # the cytoplasm radius is at least this many nuclear radii


def _draw(rng: np.random.Generator, mean_sd: tuple[float, float], low: float, high: float) -> float:
    """One value from a normal distribution, clipped to [low, high]."""
    mean, sd = mean_sd
    return float(np.clip(rng.normal(mean, sd), low, high))


def _shape_mask(
    shape: tuple[int, int],
    centre: tuple[float, float],
    radius: float,
    aspect: float,
    angle: float,
    irregularity: float,
    rng: np.random.Generator,
    harmonics: range = range(2, 9),
) -> np.ndarray:
    """Boolean mask of a closed curve r(theta) = radius (1 + sum_k a_k cos(k theta + phi_k)).

    The harmonic amplitudes fall as 1/k so the contour wrinkles rather than zig-zags; the
    curve is then stretched to `aspect` (area kept) and rotated by `angle` radians.
    """
    ks = np.array(list(harmonics), dtype=np.float64)
    amplitudes = irregularity * rng.normal(1.0, 0.35, ks.size).clip(0.2) / ks * ks[0]
    phases = rng.uniform(0, 2 * np.pi, ks.size)
    # Work only in the curve's bounding window: the curve never leaves radius x (1 + sum a_k)
    # stretched by sqrt(aspect).
    reach = radius * (1 + amplitudes.sum()) * np.sqrt(aspect) + 2
    top, left = max(int(centre[0] - reach), 0), max(int(centre[1] - reach), 0)
    bottom, right = min(int(centre[0] + reach) + 2, shape[0]), min(int(centre[1] + reach) + 2, shape[1])
    inside = np.zeros(shape, dtype=bool)
    if top >= bottom or left >= right:
        return inside
    rows, cols = np.mgrid[top:bottom, left:right].astype(np.float64)
    dy, dx = rows - centre[0], cols - centre[1]
    cos_a, sin_a = np.cos(angle), np.sin(angle)
    u = (dx * cos_a + dy * sin_a) / np.sqrt(aspect)  # along the major axis, unstretched
    v = (-dx * sin_a + dy * cos_a) * np.sqrt(aspect)
    theta = np.arctan2(v, u)
    rho = np.hypot(u, v)
    boundary = radius * (1 + np.tensordot(amplitudes, np.cos(np.multiply.outer(ks, theta) + phases[:, None, None]), axes=1))
    inside[top:bottom, left:right] = rho <= boundary
    return inside


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int], sigma: float) -> np.ndarray:
    """Gaussian-filtered white noise with zero mean and unit standard deviation."""
    field = ndi.gaussian_filter(rng.standard_normal(shape, dtype=np.float32), sigma, mode="wrap")
    return (field - field.mean()) / (field.std() + np.float32(1e-12))


def _blank_slide(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Noise-free lamp field (float64, H x W x 3, grey levels): tint, vignetting, gradient."""
    height, width = shape
    # Exposure leaves headroom: the brightest slide pixel stays near 210, so the same scene under
    # a lamp up to 1.2x brighter still does not clip (optical density needs unclipped pixels).
    level = rng.uniform(180, 198)
    tint = np.array([rng.uniform(-6, 4), rng.uniform(-4, 4), rng.uniform(-2, 8)])  # warm..cool
    rows, cols = np.mgrid[0:height, 0:width].astype(np.float64)
    cy = height / 2 + rng.uniform(-0.3, 0.3) * height
    cx = width / 2 + rng.uniform(-0.3, 0.3) * width
    r2 = ((rows - cy) ** 2 + (cols - cx) ** 2) / (0.5 * max(height, width)) ** 2
    vignetting = 1 - rng.uniform(0.05, 0.14) * r2
    g_angle = rng.uniform(0, 2 * np.pi)
    gradient = 1 + rng.uniform(0, 0.04) * ((cols / width - 0.5) * np.cos(g_angle) + (rows / height - 0.5) * np.sin(g_angle))
    return (level + tint)[None, None, :] * (vignetting * gradient)[:, :, None]


def _expose(light: np.ndarray, rng: np.random.Generator, noise_sd: float) -> np.ndarray:
    """One camera exposure: shot-like noise (sd grows with sqrt of the signal), 8-bit."""
    light = light.astype(np.float32)
    sd = np.float32(noise_sd / np.sqrt(200.0)) * np.sqrt(np.maximum(light, np.float32(1.0)))
    noisy = light + sd * rng.standard_normal(light.shape, dtype=np.float32)
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def _nucleoli(rng: np.random.Generator, shape: tuple, nucleus: np.ndarray, nuc_r: float,
              mean_count: float) -> tuple[int, np.ndarray]:
    """(count, bool (H, W) mask): up to 3 nucleoli (Poisson, mean `mean_count`) of radius
    ~1.3-1.2 + 0.08 * `nuc_r` px, well inside the nucleus."""
    n_nucleoli = int(min(rng.poisson(mean_count), 3))
    nucleoli = np.zeros(shape, dtype=bool)
    candidates = np.argwhere(ndi.binary_erosion(nucleus, iterations=3))
    for _ in range(n_nucleoli if candidates.size else 0):
        cy, cx = candidates[rng.integers(len(candidates))]
        radius = rng.uniform(1.3, 1.2 + 0.08 * nuc_r)
        nucleoli |= _shape_mask(shape, (cy, cx), radius, 1.0, 0.0, 0.0, rng, range(2, 3))
    return n_nucleoli, nucleoli & nucleus


def synth_cell(diagnosis: str, rng: np.random.Generator, source_id: str = "") -> CellRecord:
    """Generate one cell of the given diagnosis (one of `PROFILES`, the Herlev classes).

    rng: the only source of randomness, so equal generator states give equal cells.
    Returns a CellRecord with image and background uint8 (H, W, 3) RGB, H and W in
    SIZE_RANGE, and the ground-truth mask uint8 (H, W) with labels 0-3; `extra` holds the
    drawn parameters (radii in px, OD in absorbance units, number of nucleoli).
    """
    if diagnosis not in PROFILES:
        raise InvalidInput(f"no synthetic profile for diagnosis {diagnosis!r}; known: {', '.join(PROFILES)}")
    p = PROFILES[diagnosis]
    shape = height, width = tuple(int(v) for v in rng.integers(SIZE_RANGE[0], SIZE_RANGE[1] + 1, size=2))

    nuc_r = _draw(rng, p.nuc_radius, 4.0, 30.0)
    cyto_r = max(_draw(rng, p.cyto_radius, 18.0, 92.0), MIN_CYTO_RIM * nuc_r)
    cyto_aspect = _draw(rng, p.cyto_aspect, 1.0, 4.0)
    nuc_aspect = _draw(rng, p.nuc_aspect, 1.0, 2.2)
    cyto_angle = rng.uniform(0, np.pi)
    centre = (height / 2 + rng.normal(0, 4), width / 2 + rng.normal(0, 4))
    cyto = _shape_mask(shape, centre, cyto_r, cyto_aspect, cyto_angle,
                       _draw(rng, p.cyto_irregularity, 0.0, 0.2), rng, range(3, 8))

    # The nucleus sits off-centre along the cell's long axis (basal in columnar cells),
    # and always inside the cytoplasm: shrink the offset until it fits.
    offset = p.nucleus_offset * cyto_r * np.sqrt(cyto_aspect) * rng.uniform(0.4, 1.0) * rng.choice([-1, 1])
    nuc_irregularity = _draw(rng, p.nuc_irregularity, 0.0, 0.25)
    nuc_angle = cyto_angle + rng.normal(0, 0.4)
    state = rng.bit_generator.state
    for shrink in (1.0, 0.6, 0.3, 0.0):
        rng.bit_generator.state = state  # same contour whatever the offset
        nc = (centre[0] + shrink * offset * np.sin(cyto_angle), centre[1] + shrink * offset * np.cos(cyto_angle))
        nucleus = _shape_mask(shape, nc, nuc_r, nuc_aspect, nuc_angle, nuc_irregularity, rng)
        if not (nucleus & ~ndi.binary_erosion(cyto, iterations=2)).any():
            break
    nucleus &= cyto

    n_nucleoli, nucleoli = _nucleoli(rng, shape, nucleus, nuc_r, p.nucleoli)
    mask = np.zeros(shape, dtype=np.uint8)
    mask[cyto], mask[nucleus], mask[nucleoli] = CYTOPLASM, NUCLEUS, NUCLEOLUS

    # Optical density, one channel per RGB colour.
    eosinophilia = _draw(rng, p.eosinophilia, 0.0, 1.0)
    cyto_stain = _unit(eosinophilia * EOSINOPHILIC + (1 - eosinophilia) * LIGHT_GREEN)
    cyto_od = _draw(rng, p.cyto_od, 0.05, 0.6)
    # Cytoplasm: broad mottling plus fine granularity (keratohyalin, folds).
    mottling = 1 + 0.15 * _smooth_noise(rng, shape, 4.0) + 0.08 * _smooth_noise(rng, shape, 0.7)
    nuc_od = _draw(rng, p.nuc_od, 0.2, 1.5)
    contrast = _draw(rng, p.chromatin_contrast, 0.02, 0.6)
    grain = _draw(rng, p.chromatin_grain, 0.5, 3.0)
    chromatin = np.clip(1 + contrast * _smooth_noise(rng, shape, grain), 0.2, None)

    cyto_stain, haem, eosin = (v.astype(np.float32) for v in (cyto_stain, HAEMATOXYLIN, EOSIN))
    od = (cyto * np.float32(cyto_od) * mottling)[:, :, None] * cyto_stain
    od += (nucleus * np.float32(nuc_od) * chromatin)[:, :, None] * haem
    # Nucleoli: dense and eosinophilic (red in a Pap stain), against blue chromatin.
    od += (nucleoli * np.float32(0.6 * nuc_od))[:, :, None] * eosin
    lamp = _blank_slide(rng, shape).astype(np.float32)
    # Mounting medium and glass are not perfectly clear: a faint fine texture that the
    # blank-slide exposure does not share (it is taken at another place on the slide).
    od += (np.float32(0.006) * _smooth_noise(rng, shape, 1.2))[:, :, None]
    blur = rng.uniform(0.6, 1.0)
    transmitted = ndi.gaussian_filter(np.float32(10.0) ** -od, sigma=(blur, blur, 0))
    noise_sd = rng.uniform(4.0, 6.0)
    image = _expose(lamp * transmitted, rng, noise_sd)
    background = _expose(lamp, rng, noise_sd)

    return CellRecord(
        source_id=source_id,
        diagnosis=diagnosis,
        image=image,
        mask=mask,
        background=background,
        origin=GENERATOR,
        extra={
            "nucleus_radius_px": nuc_r, "cytoplasm_radius_px": cyto_r,
            "nucleus_od": nuc_od, "chromatin_contrast": contrast, "chromatin_grain_px": grain,
            "nucleus_irregularity": nuc_irregularity, "nucleoli": n_nucleoli,
            "eosinophilia": eosinophilia,
        },
    )


def cell_rng(seed: int, index: int) -> np.random.Generator:
    """The generator for cell `index` of a dataset: independent of how many cells follow."""
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(index,)))


def cell_files(cell_id: str) -> dict[str, str]:
    """File names of one synthetic cell inside its class folder."""
    return {"image": f"{cell_id}.png", "background": f"{cell_id}-background.png", "mask": f"{cell_id}-mask.png"}


def write_dataset(
    out_dir: str | Path,
    n_cells: int,
    seed: int,
    diagnoses: Sequence[str] = DIAGNOSES,
    progress: Callable[[int], None] | None = None,
) -> Path:
    """Write `n_cells` synthetic cells to `out_dir`; returns `out_dir` as a Path.

    Cell i has diagnosis diagnoses[i % len(diagnoses)] (so 1400 cells = 7 x 200) and is
    drawn from `cell_rng(seed, i)`: the same seed gives byte-identical files. Layout:

        out_dir/manifest.json                         format, seed, and one entry per cell
        out_dir/<diagnosis>/<cell_id>.png             the cell, RGB
        out_dir/<diagnosis>/<cell_id>-background.png  the blank slide, RGB
        out_dir/<diagnosis>/<cell_id>-mask.png        8-bit labels 0-3 (looks black)

    The manifest is written last, so a half-written folder is not taken for a dataset.
    progress: called with the number of cells written so far.
    """
    if n_cells < 1:
        raise InvalidInput(f"need at least 1 cell, got {n_cells}")
    unknown = [d for d in diagnoses if d not in PROFILES]
    if unknown or not diagnoses:
        raise InvalidInput(f"no synthetic profile for {unknown or 'an empty list'}; known: {', '.join(PROFILES)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cells = []
    for index in range(n_cells):
        diagnosis = diagnoses[index % len(diagnoses)]
        cell_id = f"synth-{seed}-{index:06d}"
        record = synth_cell(diagnosis, cell_rng(seed, index), source_id=cell_id)
        folder = out / diagnosis
        folder.mkdir(exist_ok=True)
        names = cell_files(cell_id)
        write_png(folder / names["image"], record.image)
        write_png(folder / names["background"], record.background)
        write_png(folder / names["mask"], record.mask)
        cells.append({"id": cell_id, "diagnosis": diagnosis,
                      **{k: f"{diagnosis}/{v}" for k, v in names.items()}})
        if progress:
            progress(index + 1)
    manifest = {
        "format": GENERATOR,
        "version": FORMAT_VERSION,
        "seed": seed,
        "n_cells": n_cells,
        "diagnoses": list(diagnoses),
        "mask_labels": {"0": "background", "1": "cytoplasm", "2": "nucleus", "3": "nucleolus"},
        "cells": cells,
    }
    tmp = out / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(out / MANIFEST)
    return out


def synth_field(rng: np.random.Generator, rows: int = 3, cols: int = 4,
                diagnoses: Sequence[str] = DIAGNOSES) -> np.ndarray:
    """A field of view: `rows` x `cols` synthetic cells side by side on one slide.

    What a camera shows before anyone crops a cell (the page must refuse it as one
    cell). Each cell's transmittance (its image over its own blank slide) is laid on a
    tile of SIZE_RANGE[1] + 2 px of one shared lamp, so the field is one exposure.
    Returns uint8 (rows * tile, cols * tile, 3) RGB; 3 x 4 gives 672 x 896 px, 12 cells.
    """
    tile = SIZE_RANGE[1] + 2
    shape = (rows * tile, cols * tile)
    transmitted = np.ones(shape + (3,), dtype=np.float32)
    for n in range(rows * cols):
        cell = synth_cell(diagnoses[n % len(diagnoses)], rng)
        ratio = cell.image.astype(np.float32) / np.maximum(cell.background.astype(np.float32), 1.0)
        top, left = (n // cols) * tile, (n % cols) * tile
        height, width = ratio.shape[:2]
        transmitted[top:top + height, left:left + width] = np.minimum(ratio, 1.0)
    return _expose(_blank_slide(rng, shape) * transmitted, rng, noise_sd=5.0)
