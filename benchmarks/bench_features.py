"""Feature extraction speed: PathMaster's extract_features against a CellProfiler-style
measurement (cp_measure) of the same cells, side by side in one run, on one core.

    python benchmarks/bench_features.py [--cells-per-class 5] [--repeats 5] [--seed 0] [--json]
    python benchmarks/bench_features.py --sweep [--sizes 128,256,512,1024,1800] [--before REV] [--cells N]

Cells come from the synthetic generator (~200 x 200 px, every diagnosis). Each cell is
measured by both methods in alternation, `repeats` times, so machine noise hits both
alike; the per-cell time is the median over repeats and the figure printed is the median
over cells. The CellProfiler-style measurement covers what our vector covers: size/shape
and Feret diameters of the nucleus and cytoplasm objects, their intensities, and Haralick
texture at 256 grey levels at the same three distances (cp_measure's MeasureTexture scales).
If cp_measure cannot run, scikit-image regionprops + graycoprops at 256 grey levels stand in.

--sweep: time against image size. One synthetic cell is upscaled to each size (S x S px,
bilinear, camera noise of 4 grey levels added afterwards so it is not unnaturally smooth)
and analysed as an upload is: `analyse_cell(image)` segments it, estimates its blank
slide and extracts the features; "features" alone is extract_features with the true mask
and slide. Printed: median seconds per image (wall and CPU) and ms per megapixel, which
stays flat when the cost is linear in pixels. With --before REV each size is also timed
with the code of git revision REV (a temporary git worktree), before and after alternating
size by size in fresh processes so machine noise hits both alike. Measured on the 2-core
development VM, --repeats 3 --before 8a00fe4 (the code before the large-image work), CPU s:
analyse 1024 px 3.07 -> 1.47, 1800 px 19.2 -> 4.73, 4096 px 29.9 (1.2-1.8 s per megapixel
from 512 px up, was 2.1-5.9 and rising); features alone 40-60 ms per megapixel, unchanged.
The upload of a ~200 px cell (targets: features <= 20 ms, whole analysis <= 30 ms),
`--sweep --sizes 200 --repeats 9 --before 04f2148` (OpenCV openings and smoothing, hole
filling by labelling, lamp fits by normal equations on <= 4000 glass pixels), median CPU
on the shared 2-core VM: analyse 102 -> 59 ms at load average 14, 93 -> 48 ms at 7; features
5-10 ms either way (target met; the whole analysis is not yet at 30 ms).
Then `--sweep --sizes 200,200,200 --repeats 9 --before 10bb84e` (an upload without mask or
slide: the cell found at half resolution, the slide estimated round it, one segmentation
against it; 128 features), three alternating rounds at load average 12-19 on the 2-core
VM, median CPU: analyse 67 -> 47, 50 -> 41, 49 -> 51 ms, and in an earlier run 72 -> 37,
78 -> 56, 60 -> 46 ms (x1.0-1.9, typically x1.3); features 5-8 ms. Still above 30 ms
on this loaded machine.
Then analysis workers keep freed memory (pathmaster.analysis.budget.keep_freed_memory: about a
fifth of the CPU had been the kernel zeroing ~1 MB temporaries anew) and OpenCV labelling,
erosion and dilation; same masks, slides and features. `--sweep --sizes 200,200,200
--repeats 9 --before bf7ea4a` ("after" as the product's analysis workers run, "before"
with glibc's defaults, which is how bf7ea4a's workers ran), median CPU: 128 features
(de90edd and the tree just before it), load 12-21: analyse 51 -> 36, 50 -> 33, 52 -> 28 ms;
load 14-29 (beside other jobs of ours): 54 -> 32, 68 -> 47, 69 -> 56 ms; 130 features
(84fc58a), load 15-24: 54 -> 36, 52 -> 39, 52 -> 40 ms; features 6-10 ms either way.
`--allocator default` (both with glibc's defaults, the code alone), load 16-21:
44 -> 41, 58 -> 33, 48 -> 41 ms. Measured alone
(no other job of ours) the whole analysis is ~28-32 ms at load ~20.
Then the same work in fewer passes, outputs bit-identical (benchmarks/check_identical_outputs.py
--before 8df5790: masks, slides and features of 140 synthetic cells x 4 ways and the 917
Herlev cells x 3 ways, 8739 arrays, none differs): lamp surfaces summed channels-first,
thresholds from one histogram helper, flat-lamp OD and the slide's lift by 256-entry
tables, the nucleolus top-hat by OpenCV, disk footprints made once, brightness by table.
`--sweep --sizes 200,200,200 --repeats 9 --cells 20 --before 8df5790`, median CPU over 20
cells, load 4-5: analyse 22.6 -> 17.3, 24.2 -> 20.7, 23.4 -> 21.5 ms (x1.1-1.3);
features 5.6-6.1 -> 4.7-6.0 ms.
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
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Callable  # noqa: E402

import cv2  # noqa: E402
import numpy as np  # noqa: E402

import old_layout  # noqa: E402  (this tree's names in a tree from before the core's rooms)

old_layout.install()
from pathmaster.features import FEATURES, extract_features  # noqa: E402
from pathmaster.features.texture import HARALICK_DISTANCES  # noqa: E402
from pathmaster.records import CYTOPLASM, DIAGNOSES, NUCLEUS  # noqa: E402
from pathmaster.image.synth import synth_cell  # noqa: E402

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


# ------------------------------------------------------------------ size sweep

REPO = Path(__file__).resolve().parents[1]
SWEEP_SIZES = (128, 256, 512, 1024, 1800)
BEFORE_MAX_SIZE = 1800  # the old code needs minutes per image above this


def sweep_cell(side: int, seed: int = 0):
    """(image, background, mask) of one synthetic carcinoma-in-situ cell upscaled to side x side px."""
    from skimage.transform import resize

    cell = synth_cell("carcinoma_in_situ", np.random.default_rng(seed))
    noise = np.random.default_rng(seed + 1)

    def upscale(array: np.ndarray, order: int) -> np.ndarray:
        return resize(array, (side, side), order=order, preserve_range=True, anti_aliasing=False)

    def exposed(array: np.ndarray) -> np.ndarray:
        return np.clip(upscale(array, 1) + noise.normal(0.0, 4.0, (side, side, 3)), 0, 255).round().astype(np.uint8)

    return exposed(cell.image), exposed(cell.background), upscale(cell.mask, 0).astype(np.uint8)


def timed(task: Callable[[], object]) -> tuple[object, float, float]:
    """Run `task` once: (its result, wall seconds, CPU seconds of this process). On a shared
    machine the wall clock also counts waiting for a core, CPU time only the work."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = task()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def sweep_worker(side: int, repeats: int, seed: int, allocator: str = "worker", cells: int = 1) -> dict:
    """Median wall and CPU seconds of analyse_cell(image) and extract_features at one size,
    with whatever pathmaster is first on sys.path (this tree or a worktree of REV).
    allocator "worker": the process keeps freed memory as an analysis worker of that tree
    does (`pathmaster.analysis.budget.keep_freed_memory`, where the tree has it); "default": glibc's.
    cells: how many sweep cells (seeds seed, seed + 1, ...); each is timed `repeats` times
    and the figure is the median over cells of each cell's median."""
    import pathmaster
    from pathmaster.analysis import budget
    from pathmaster.analysis.cell import analyse_cell

    kept = allocator == "worker" and hasattr(budget, "keep_freed_memory") and budget.keep_freed_memory()

    per_cell: dict[str, dict[str, list]] = {name: {"wall_s": [], "cpu_s": []} for name in ("analyse", "features")}
    for index in range(cells):
        image, background, mask = sweep_cell(side, seed + index)
        tasks = {"analyse": lambda: analyse_cell(image),
                 "features": lambda: extract_features(image, background, mask)}
        extract_features(image, background, mask)  # lazy imports out of the timing
        for name, task in tasks.items():
            wall, cpu = [], []
            for _ in range(repeats):
                _, w, c = timed(task)
                wall.append(w)
                cpu.append(c)
            per_cell[name]["wall_s"].append(statistics.median(wall))
            per_cell[name]["cpu_s"].append(statistics.median(cpu))
    result = {name: {clock: statistics.median(values) for clock, values in clocks.items()}
              for name, clocks in per_cell.items()}
    result["package"] = str(Path(pathmaster.__file__).resolve().parent)
    result["freed_memory_kept"] = bool(kept)
    return result


def _run_worker(tree: Path, side: int, repeats: int, seed: int, allocator: str = "worker", cells: int = 1) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--sweep-worker", str(side), "--repeats", str(repeats),
                          "--seed", str(seed), "--allocator", allocator, "--cells", str(cells)], env=env, check=True, capture_output=True, text=True, timeout=1800)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["package"]) != (tree / "pathmaster").resolve():
        raise RuntimeError(f"worker for {tree} imported pathmaster from {result['package']}")
    return result


def sweep(sizes: list[int], repeats: int, seed: int, before: str | None, as_json: bool,
          allocator: str = "worker", cells: int = 1) -> int:
    """Time analysis against image size; with `before`, side by side with git revision `before`."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-before-") as tmp:
        old_tree = None
        if before:
            old_tree = Path(tmp) / "tree"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(old_tree), before],
                           check=True)
        try:
            for side in sizes:
                row = {"size": side, "megapixels": side * side / 1e6,
                       "after": _run_worker(REPO, side, repeats, seed, allocator, cells)}
                if old_tree is not None and side <= BEFORE_MAX_SIZE:
                    row["before"] = _run_worker(old_tree, side, repeats if side <= 1024 else 1, seed, allocator, cells)
                rows.append(row)
                if as_json:  # progress, since a sweep takes minutes
                    print(_sweep_line(row), file=sys.stderr, flush=True)
        finally:
            if old_tree is not None:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)], check=False)
    if as_json:
        print(json.dumps({"repeats": repeats, "cells": cells, "before": before, "allocator": allocator, "rows": rows,
                          "load_average": os.getloadavg()[0]}, indent=2))
    else:
        old = f"; before = {before}, timed once above 1024 px" if before else ""
        print(f"analysis time against image size, median of {repeats} (median over {cells} cells), one core; "
              f"after = this working tree{old}; "
              f"allocator {allocator!r}")
        for row in rows:
            print(_sweep_line(row))
        print(f"load average at the end: {os.getloadavg()[0]:.2f}")
    return 0


def _sweep_line(row: dict) -> str:
    kept = "; freed memory kept: " + ", ".join(f"{name} {'yes' if row[name]['freed_memory_kept'] else 'no'}"
                                                for name in ("after", "before") if name in row)
    parts = [f"{row['size']:5d} px ({row['megapixels']:6.2f} MP){kept}:"]
    for task in ("analyse", "features"):
        after = row["after"][task]
        text = (f"{task} {after['wall_s']:8.3f} s wall {after['cpu_s']:8.3f} s CPU "
                f"{1000 * after['cpu_s'] / row['megapixels']:8.1f} ms CPU/MP")
        if "before" in row:
            old = row["before"][task]
            text += f" | before {old['wall_s']:8.3f} s wall {old['cpu_s']:8.3f} s CPU (x{old['cpu_s'] / after['cpu_s']:.1f})"
        parts.append(text)
    return "\n    ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells-per-class", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--sweep", action="store_true", help="time analysis against image size instead")
    parser.add_argument("--sizes", default=",".join(map(str, SWEEP_SIZES)), help="--sweep: image sides in px")
    parser.add_argument("--before", metavar="REV", help="--sweep: also time git revision REV, side by side")
    parser.add_argument("--allocator", choices=("worker", "default"), default="worker",
                        help="--sweep: keep freed memory as an analysis worker does (default), or glibc's defaults")
    parser.add_argument("--cells", type=int, default=1,
                        help="--sweep: cells per size (seeds seed, seed+1, ...); the median over cells is printed")
    parser.add_argument("--sweep-worker", type=int, metavar="SIDE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.sweep_worker:
        import old_layout  # this tree's names in a tree from before the core's rooms

        old_layout.install()
        print(json.dumps(sweep_worker(args.sweep_worker, args.repeats, args.seed, args.allocator, args.cells)))
        return 0
    if args.sweep:
        return sweep([int(v) for v in args.sizes.split(",")], args.repeats, args.seed, args.before, args.json,
                     args.allocator, args.cells)

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
    per_cell = {(method, clock): [] for method in ("ours", "ref") for clock in ("wall", "cpu")}
    ref_values = 0
    for cell in cells:
        samples = {key: [] for key in per_cell}
        for _ in range(args.repeats):
            for method, task in (("ours", lambda: ours(cell)), ("ref", lambda: reference(cell.image, cell.mask))):
                value, wall, cpu = timed(task)
                if method == "ref":
                    ref_values = value
                samples[(method, "wall")].append(1000 * wall)
                samples[(method, "cpu")].append(1000 * cpu)
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
