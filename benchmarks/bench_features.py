"""Feature extraction speed: PathMaster's extract_features against a CellProfiler-style
measurement (cp_measure) of the same cells, side by side in one run, on one core.

    python benchmarks/bench_features.py [--cells-per-class 5] [--repeats 5] [--seed 0] [--json]

Cells come from the synthetic generator (~200 x 200 px, every diagnosis). Each cell is
measured by both methods in alternation, `repeats` times, so machine noise hits both
alike; the per-cell time is the median over repeats and the figure printed is the median
over cells. The CellProfiler-style measurement covers what our vector covers: size/shape
and Feret diameters of the nucleus and cytoplasm objects, their intensities, and Haralick
texture at 256 grey levels at the same three distances (cp_measure's MeasureTexture scales).
If cp_measure cannot run, scikit-image regionprops + graycoprops at 256 grey levels stand in.
"""

from __future__ import annotations

import os

# One core: set before numpy/OpenCV load their thread pools.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

from pathmaster.features import FEATURES, extract_features  # noqa: E402
from pathmaster.features.texture import HARALICK_DISTANCES  # noqa: E402
from pathmaster.records import CYTOPLASM, DIAGNOSES, NUCLEUS  # noqa: E402
from pathmaster.synth import synth_cell  # noqa: E402

cv2.setNumThreads(1)


def object_labels(mask: np.ndarray) -> np.ndarray:
    """CellProfiler objects from a PathMaster mask: 1 nucleus (with nucleoli), 2 cytoplasm."""
    labels = np.zeros(mask.shape, np.int32)
    labels[mask >= NUCLEUS] = 1
    labels[mask == CYTOPLASM] = 2
    return labels


def cp_measure_method() -> tuple[str, Callable[[np.ndarray, np.ndarray], int]]:
    """The cp_measure measurement as f(image, mask) -> number of values measured."""
    from cp_measure.bulk import get_core_measurements

    core = get_core_measurements()
    shape_fns = [core["sizeshape"], core["feret"]]

    def measure(image: np.ndarray, mask: np.ndarray) -> int:
        labels, pixels = object_labels(mask), image.mean(axis=2) / 255.0
        results = [fn(labels, pixels) for fn in shape_fns]
        results.append(core["intensity"](labels, pixels))
        results += [core["texture"](labels, pixels, scale=d, gray_levels=256) for d in HARALICK_DISTANCES]
        return sum(len(r) for r in results)

    return "cp_measure (sizeshape, feret, intensity, texture x3 scales @256 levels)", measure


def skimage_method() -> tuple[str, Callable[[np.ndarray, np.ndarray], int]]:
    """Fallback: regionprops + graycoprops at 256 grey levels, same objects and distances."""
    from skimage import measure
    from skimage.feature import graycomatrix, graycoprops

    props_names = ("area", "perimeter", "eccentricity", "solidity", "axis_major_length",
                   "axis_minor_length", "feret_diameter_max", "intensity_mean", "intensity_std")
    angles = [0, np.pi / 4, np.pi / 2, 3 * np.pi / 4]

    def measure_cell(image: np.ndarray, mask: np.ndarray) -> int:
        labels, grey = object_labels(mask), image.mean(axis=2).astype(np.uint8)
        table = measure.regionprops_table(labels, grey, properties=props_names)
        count = sum(len(v) for v in table.values())
        for region in measure.regionprops(labels, grey):
            crop = np.where(region.image, region.image_intensity, 0).astype(np.uint8)
            glcm = graycomatrix(crop, list(HARALICK_DISTANCES), angles, levels=256, symmetric=True)
            for prop in ("contrast", "ASM", "homogeneity", "correlation", "energy", "dissimilarity"):
                count += graycoprops(glcm, prop).size
        return count

    return "scikit-image regionprops + graycoprops @256 levels", measure_cell


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells-per-class", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)

    rng = np.random.default_rng(args.seed)
    cells = [synth_cell(d, rng) for d in DIAGNOSES for _ in range(args.cells_per_class)]
    try:
        reference_name, reference = cp_measure_method()
        reference(cells[0].image, cells[0].mask)
    except Exception as exc:  # cp_measure missing or broken here: say so, use the fallback
        print(f"cp_measure unavailable ({exc!r}); using the scikit-image fallback")
        reference_name, reference = skimage_method()
        reference(cells[0].image, cells[0].mask)

    def ours(cell):
        return extract_features(cell.image, cell.background, cell.mask)

    ours(cells[0])  # warm caches and lazy imports before timing
    # Wall time and CPU time of this process: on a shared machine the wall clock also
    # counts waiting for a core, CPU time only the work (both are printed).
    clocks = {"wall": time.perf_counter, "cpu": time.process_time}
    per_cell = {(method, clock): [] for method in ("ours", "ref") for clock in clocks}
    ref_values = 0
    for cell in cells:
        samples = {key: [] for key in per_cell}
        for _ in range(args.repeats):
            for method in ("ours", "ref"):
                starts = {clock: read() for clock, read in clocks.items()}
                if method == "ours":
                    ours(cell)
                else:
                    ref_values = reference(cell.image, cell.mask)
                for clock, read in clocks.items():
                    samples[(method, clock)].append(1000 * (read() - starts[clock]))
        for key, values in samples.items():
            per_cell[key].append(statistics.median(values))
    median = {key: statistics.median(values) for key, values in per_cell.items()}

    sizes = [cell.image.shape[0] * cell.image.shape[1] for cell in cells]
    figures = {
        "cells": len(cells),
        "repeats": args.repeats,
        "median_cell_px": int(statistics.median(sizes)),
        "features": len(FEATURES),
        "ours_median_ms": round(median[("ours", "wall")], 3),
        "ours_median_cpu_ms": round(median[("ours", "cpu")], 3),
        "ours_p90_ms": round(float(np.percentile(per_cell[("ours", "wall")], 90)), 3),
        "reference": reference_name,
        "reference_values": ref_values,
        "reference_median_ms": round(median[("ref", "wall")], 3),
        "reference_median_cpu_ms": round(median[("ref", "cpu")], 3),
        "ratio_reference_over_ours": round(median[("ref", "wall")] / median[("ours", "wall")], 2),
        "ratio_reference_over_ours_cpu": round(median[("ref", "cpu")] / median[("ours", "cpu")], 2),
        "target_ms": 20.0,
        "machine": f"{platform.machine()} {platform.processor() or ''} python {platform.python_version()}".strip(),
        "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    side = int(np.sqrt(figures["median_cell_px"]))
    print(f"{figures['cells']} synthetic cells (~{side} x {side} px), {args.repeats} repeats each, one core")
    print(f"extract_features ({figures['features']} features): median {figures['ours_median_ms']:.2f} ms/cell "
          f"wall (p90 {figures['ours_p90_ms']:.2f}), {figures['ours_median_cpu_ms']:.2f} ms CPU; target <= 20 ms")
    print(f"{reference_name} ({ref_values} values): median {figures['reference_median_ms']:.2f} ms/cell wall, "
          f"{figures['reference_median_cpu_ms']:.2f} ms CPU")
    print(f"ratio reference / ours: {figures['ratio_reference_over_ours']:.1f}x wall, "
          f"{figures['ratio_reference_over_ours_cpu']:.1f}x CPU")
    print(f"load average at the end: {figures['load_average']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
