"""CPU time of a whole upload's analysis on real 224 px cells, the eye included, before vs after.

    python benchmarks/bench_upload_cpu.py [--before REV] [--eyes 160x1,144x2] [--every 10] [--repeats 5]
                                          [--rounds 3] [--json]

An upload as a user sends it: a real Herlev cell as a 224 px JPEG, letter-boxed, no mask
and no blank slide (../shared/data/herlev-224-dev, or $PATHMASTER_SHARED/data/...; every
`every`-th file). Timed per upload, in CPU seconds of one thread (OMP/OpenBLAS/MKL and
OpenCV pinned to 1): "analyse" is `pathmaster.analysis.cell.analyse_cell(image)` (segmentation,
blank-slide estimate, the features and the patch) and "learnt" what a site runs on that
patch besides: the pretrained eye (`pathmaster.eye`, its default options) and a lens and head
on top (fitted to random vectors: the time does not depend on their values); on a tree
from before the eye, the learnt network of that tree with random weights. Each upload's
figure is the median of `repeats`; printed are the medians over uploads.

Before and after run in fresh processes of their own trees (git revision REV in a
temporary worktree, and this working tree), `rounds` times in alternation, so machine
noise hits both alike; each round's medians and their ratio are printed, then the
median over rounds. With ``--eyes`` (side in px x views averaged) this tree runs once per
variant of the eye's options in each round (the patch made at its side, the eye resizing it
to the variant's), each against the same before. Results: benchmarks/results/upload-cpu-*.txt.
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
BASELINE = "cbe92cb"  # the last tree with the from-scratch network
SHARED = Path(os.environ.get("PATHMASTER_SHARED", REPO.parent / "shared"))
PARTS = ("analyse", "learnt", "total")


def worker(uploads: Path, every: int, repeats: int, eye: str = "") -> dict:
    """Median CPU ms per upload of each part, with whatever pathmaster is first on sys.path;
    ``eye`` "SIDExVIEWS" for other options of its eye than the defaults ("")."""
    import cv2
    import numpy as np
    from PIL import Image

    import pathmaster
    from pathmaster.analysis.cell import analyse_cell

    cv2.setNumThreads(1)
    learnt = _learnt_part(eye)
    images = [np.asarray(Image.open(p).convert("RGB")) for p in sorted(uploads.glob("*/*.jpg"))[::every]]

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
            "learnt_included": learnt.__doc__ or "",
            **{f"{part}_ms": statistics.median(values) for part, values in per_upload.items()}}


def _learnt_part(variant: str = ""):
    """``learnt(analysis)``: what a site runs on an upload's patch besides its analysis, in
    the tree first on sys.path (its docstring says which); ``variant`` "SIDExVIEWS": the
    eye with those options."""
    import numpy as np

    try:
        from pathmaster.learning.abnormality import fit_classifier
        from pathmaster.learning.lens import fit_lens
        from pathmaster.eye import open_eye
    except ImportError:  # a tree from before the eye: its learnt network, random weights
        from pathmaster.learning.policy import Embedder
        from pathmaster.learning.choice import init_params

        embedder = Embedder(init_params(0, 2), ["normal", "abnormal"], np.array([False, True]))

        def learnt(analysis) -> None:
            """the site's learnt network (random weights)"""
            embedder.abnormal_probability(embedder.embed(analysis.patch))
        return learnt
    side, _, views = variant.partition("x")
    eye = open_eye(**({"resolution": int(side), "views": int(views)} if variant else {}))
    vectors = np.random.default_rng(0).normal(size=(400, eye.dim))
    lens = fit_lens(vectors, eye.describe())
    lens.head = fit_classifier(lens.embed(vectors), np.array(["a", "b"] * 200), {"b"}, range(lens.dim), 1.0)

    def learnt(analysis) -> None:
        """the pretrained eye and a lens and head on top"""
        lens.abnormal_probability(lens.embed(eye.features(analysis.patch[None])))
    views = f"{eye.views} view{'s' if eye.views > 1 else ''}"
    learnt.__doc__ = f"the pretrained eye ({eye.resolution} px, {views}) and a lens and head on top"
    return learnt


def _run(tree: Path, args, eye: str = "") -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", "--uploads", str(args.uploads),
                          "--every", str(args.every), "--repeats", str(args.repeats),
                          *(["--eyes", eye] if eye else [])],
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
    parser.add_argument("--eyes", default="", help="this tree's eye as variants SIDExVIEWS, comma-separated, e.g. "
                                                   "160x1,144x2 (default: its defaults)")
    parser.add_argument("--every", type=int, default=10, help="every n-th upload (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=5, help="timings per upload (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating before/after rounds (default %(default)s)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        import old_layout  # this tree's names in a tree from before the core's rooms

        old_layout.install()
        print(json.dumps(worker(args.uploads, args.every, args.repeats, args.eyes)))
        return 0
    if not args.uploads.is_dir():
        print(f"no uploads at {args.uploads}", file=sys.stderr)
        return 1
    afters = {(f"after {eye}" if eye else "after"): eye for eye in (args.eyes.split(",") if args.eyes else [""])}
    rounds = []
    with tempfile.TemporaryDirectory(prefix="bench-upload-cpu-") as tmp:
        old_tree = Path(tmp) / "tree"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(old_tree), args.before],
                       check=True)
        try:
            for number in range(args.rounds):
                row = {"before": _run(old_tree, args)}
                row.update({side: _run(REPO, args, eye) for side, eye in afters.items()})
                row["load_average"] = os.getloadavg()[0]
                rounds.append(row)
                if not args.json:
                    for side in afters:
                        print(_line(f"round {number + 1}", row, side), flush=True)
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old_tree)], check=False)
    summary = {side: {f"{part}_ms": statistics.median(r[side][f"{part}_ms"] for r in rounds) for part in PARTS}
               for side in ("before", *afters)}
    if args.json:
        print(json.dumps({"before": args.before, "eyes": args.eyes, "every": args.every, "repeats": args.repeats,
                          "rounds": rounds, "median_over_rounds": summary}, indent=1))
        return 0
    for side in afters:
        print(_line("median over rounds", summary, side))
    first = rounds[0]
    print(f"{first['before']['uploads']} uploads of {args.uploads.name}, median of {args.repeats} CPU timings each, "
          f"one thread; before = {args.before} (learnt: {first['before']['learnt_included']}), after = this "
          "working tree (learnt: " + "; ".join(first[side]["learnt_included"] for side in afters) + ")")
    return 0


def _line(name: str, row: dict, after: str = "after") -> str:
    parts = []
    for part in PARTS:
        before, later = row["before"][f"{part}_ms"], row[after][f"{part}_ms"]
        parts.append(f"{part} {before:.1f} -> {later:.1f} ms (x{before / later:.2f})")
    load = f" (load {row['load_average']:.1f})" if "load_average" in row else ""
    return f"{name}{load}{after[len('after'):]}: " + "; ".join(parts)


if __name__ == "__main__":
    raise SystemExit(main())
