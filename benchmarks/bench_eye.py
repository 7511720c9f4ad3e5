"""CPU per patch of the eye (pathmaster.eye), one thread: the classifier and the feature blocks.

    python benchmarks/bench_eye.py [--repeats 15] [--blocks 7 10 14]

Side by side in one run, in turns (each repeat times every configuration once, so machine
noise hits all alike): the whole network with its ImageNet classifier at 224 px
(`EfficientNetLite0.classify`), and `features` of the chosen blocks at 224, 160 and 128 px
with 1 and 8 views (rotations/flips). The patch is scikit-learn's ``china.jpg``, its centre
224 px (the time does not depend on the pixels); a smaller resolution is the same patch
resized by the eye. Each figure is the median over repeats of one patch's CPU time
(``time.process_time``, this process, OpenBLAS pinned to one thread) and of its wall time
(which other work on the machine stretches); ratios are of CPU medians against the
classifier's.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from sklearn.datasets import load_sample_image  # noqa: E402

from pathmaster.eye import DEFAULT_BLOCKS, EfficientNetLite0  # noqa: E402

RESOLUTIONS = (224, 160, 128)
VIEWS = (1, 8)


def _patch() -> np.ndarray:
    image = load_sample_image("china.jpg")
    top, left = (image.shape[0] - 224) // 2, (image.shape[1] - 224) // 2
    return np.ascontiguousarray(image[None, top:top + 224, left:left + 224])


def _timed(call, patch) -> tuple[float, float]:
    """(CPU ms, wall ms) of one call on one patch."""
    cpu, wall = time.process_time(), time.perf_counter()
    call(patch)
    return (time.process_time() - cpu) * 1e3, (time.perf_counter() - wall) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--blocks", type=int, nargs="+", default=list(DEFAULT_BLOCKS))
    args = parser.parse_args()
    patch = _patch()
    runs = {"classifier, whole network, 224 px": EfficientNetLite0(resolution=224).classify}
    for resolution in RESOLUTIONS:
        for views in VIEWS:
            eye = EfficientNetLite0(blocks=args.blocks, resolution=resolution, views=views)
            runs[f"features {resolution} px, {views} view{'s' if views > 1 else ''}"] = eye.features
    for call in runs.values():  # warm: buffers, caches
        call(patch)
    samples = {name: [] for name in runs}
    for _ in range(max(1, args.repeats)):
        for name, call in runs.items():
            samples[name].append(_timed(call, patch))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"bench_eye at {commit}: blocks {args.blocks}, {args.repeats} repeats, one thread, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    base = statistics.median(cpu for cpu, _ in samples[next(iter(runs))])
    print(f"{'':36s} {'CPU ms':>8s} {'wall ms':>8s} {'x classifier':>13s}")
    for name, taken in samples.items():
        cpu = statistics.median(c for c, _ in taken)
        wall = statistics.median(w for _, w in taken)
        print(f"{name:36s} {cpu:8.1f} {wall:8.1f} {cpu / base:13.2f}")


if __name__ == "__main__":
    main()
