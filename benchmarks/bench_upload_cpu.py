"""CPU time of a whole upload's analysis on real 224 px cells, learnt part included, before vs after.

    python benchmarks/bench_upload_cpu.py [--before REV] [--every 10] [--repeats 5] [--rounds 3] [--json]

An upload as a user sends it: a real Herlev cell as a 224 px JPEG, letter-boxed, no mask
and no blank slide (../shared/data/herlev-224-dev, or $PATHMASTER_SHARED/data/...; every
`every`-th file). Timed per upload, in CPU seconds of one thread (OMP/OpenBLAS/MKL and
OpenCV pinned to 1): "analyse" is `pathmaster.site.analyse_cell(image)` (segmentation,
blank-slide estimate, the features and the network's patch) and "learnt" the site's
network on that patch (`Embedder.embed` and `abnormal_probability`, as a site and the
coordinator run it), with weights drawn at random (`pathmaster.learn.init_params`: the
time does not depend on their values; without the [learn] extra the learnt part is left
out and says so). Each upload's figure is the median of `repeats`; printed are the
medians over uploads.

Before and after run in fresh processes of their own trees (git revision REV in a
temporary worktree, and this working tree), `rounds` times in alternation, so machine
noise hits both alike; each round's medians and their ratio are printed, then the
median over rounds.

Where the CPU of an upload went at 152bf4d (19 uploads, per-function CPU clocks at load ~3,
so ~10% above the quiet figures): the segmentation and blank-slide
estimate ~14 ms (three passes of `_cell_and_nucleus` ~6.8, `_clear_glass` ~2.4, lamp fits
~1.8, nucleoli ~0.9), the features ~10 ms (geometry ~3.2, nuclear texture ~3.2, density
~2.8), the patch ~0.9 ms; the network ~7.8 ms, ~4 of them its first convolution, mostly
page faults of fresh im2col and output arrays. Page faults are a large share throughout:
a 224 px upload touches ~1,500 new 4 KB pages (`resource.getrusage` minor faults), as
glibc hands freed arrays back to the system and faults them in again; with
MALLOC_TRIM_THRESHOLD_=64 MB and MALLOC_MMAP_THRESHOLD_=32 MB in the environment (one round,
`--every 20`, load 9) uploads took 25.7 / 24.0 ms to analyse (before / after) instead of
28.8 / 29.4 ms, and the network before 4.8 ms instead of 8.8.

Measured on the shared 2-core VM (load average 6-7 from other work; `--every 5 --repeats 5
--rounds 3`, 93 uploads), 152bf4d -> 8f6ddae (the network's inference in reused buffers,
pooling before its bias and ReLU; the patch from a table; regional extrema and shape
moments by OpenCV; optical density in place): analyse 25.8 -> 26.8 ms (x0.96; rounds x1.00,
x0.96, x0.91), learnt 8.5 -> 3.8 ms (x2.21), total 35.1 -> 30.9 ms (x1.14; rounds x1.14,
x1.11, x1.08); at b2b54e3 (buffers per thread) total x1.18, analyse x1.03. The analysis
without the network beside it takes ~1.1 ms less (29.3 -> 28.2 ms, 24 uploads, load 9),
but within the benchmark it now faults in ~1,450 pages an upload where it faulted ~150-900:
the network no longer frees 2.6 MB arrays, which raised glibc's trim threshold for the
whole process. The embedding, abnormal probability, patch, mask and blank slide are the
same bits, the features the same to 5.6e-12 (`check_identical_outputs.py --rtol 1e-9
--atol 1e-9`, every case).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BASELINE = "152bf4d"  # the tree this work started from
SHARED = Path(os.environ.get("PATHMASTER_SHARED", REPO.parent / "shared"))
PARTS = ("analyse", "learnt", "total")


def worker(uploads: Path, every: int, repeats: int) -> dict:
    """Median CPU ms per upload of each part, with whatever pathmaster is first on sys.path."""
    import cv2
    import numpy as np
    from PIL import Image

    import pathmaster
    from pathmaster.site import analyse_cell

    cv2.setNumThreads(1)
    embedder = None
    try:
        from pathmaster.embedding import Embedder
        from pathmaster.learn import init_params

        labels = ["normal", "abnormal"]
        embedder = Embedder(init_params(0, len(labels)), labels, np.array([False, True]))
    except ImportError:
        pass
    images = [np.asarray(Image.open(p).convert("RGB")) for p in sorted(uploads.glob("*/*.jpg"))[::every]]

    def learnt(analysis) -> None:
        if embedder is not None:
            embedder.abnormal_probability(embedder.embed(analysis.patch))

    learnt(analyse_cell(images[0]))  # lazy imports and caches out of the timing
    per_upload: dict[str, list[float]] = {part: [] for part in PARTS}
    for image in images:
        times: dict[str, list[float]] = {part: [] for part in PARTS}
        for _ in range(repeats):
            started = time.process_time()
            analysis = analyse_cell(image)
            analysed = time.process_time()
            learnt(analysis)
            ended = time.process_time()
            times["analyse"].append(analysed - started)
            times["learnt"].append(ended - analysed)
            times["total"].append(ended - started)
        for part in PARTS:
            per_upload[part].append(1000 * statistics.median(times[part]))
    return {"package": str(Path(pathmaster.__file__).resolve().parent), "uploads": len(images),
            "learnt_included": embedder is not None,
            **{f"{part}_ms": statistics.median(values) for part, values in per_upload.items()}}


def _run(tree: Path, args) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", "--uploads", str(args.uploads),
                          "--every", str(args.every), "--repeats", str(args.repeats)],
                         env={**os.environ, "PYTHONPATH": str(tree)}, check=True, capture_output=True, text=True,
                         timeout=3600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["package"]) != (tree / "pathmaster").resolve():
        raise RuntimeError(f"the worker for {tree} imported pathmaster from {result['package']}")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uploads", type=Path, default=SHARED / "data" / "herlev-224-dev")
    parser.add_argument("--before", default=BASELINE, help=f"git revision to compare with (default {BASELINE})")
    parser.add_argument("--every", type=int, default=10, help="every n-th upload (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per upload (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating before/after rounds (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.uploads, args.every, args.repeats)))
        return 0
    if not args.uploads.is_dir():
        print(f"no uploads at {args.uploads}", file=sys.stderr)
        return 1
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-upload-cpu-") as tmp:
        old_tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(old_tree), args.before],
                       check=True)
        try:
            for number in range(args.rounds):
                row = {"before": _run(old_tree, args), "after": _run(REPO, args), "load_average": os.getloadavg()[0]}
                rounds.append(row)
                if not args.json:
                    print(_line(f"round {number + 1}", row), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)], check=False)
    summary = {side: {f"{part}_ms": statistics.median(r[side][f"{part}_ms"] for r in rounds) for part in PARTS}
               for side in ("before", "after")}
    if args.json:
        print(json.dumps({"before": args.before, "every": args.every, "repeats": args.repeats, "rounds": rounds,
                          "median_over_rounds": summary}, indent=1))
        return 0
    first = rounds[0]["after"]
    print(_line("median over rounds", summary))
    print(f"{first['uploads']} uploads of {args.uploads.name}, median of {args.repeats} CPU timings each, one thread; "
          f"before = {args.before}, after = this working tree; learnt part "
          f"{'included (random weights)' if first['learnt_included'] else 'NOT included: no [learn] extra'}")
    return 0


def _line(name: str, row: dict) -> str:
    parts = []
    for part in PARTS:
        before, after = row["before"][f"{part}_ms"], row["after"][f"{part}_ms"]
        parts.append(f"{part} {before:.1f} -> {after:.1f} ms (x{before / after:.2f})")
    load = f" (load {row['load_average']:.1f})" if "load_average" in row else ""
    return f"{name}{load}: " + "; ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
