"""Automatic segmentation against Herlev's hand-drawn masks, per class, before vs after.

    python benchmarks/bench_segmentation.py [--data DIR] [--before REV] [--every 1] [--json]

For each real Herlev cell (../shared/data/herlev-40px by default, or $PATHMASTER_SHARED)
the cell image alone is segmented (no mask, no blank slide: an upload without either),
and the nucleus (labels 2-3) and whole cell (labels 1-3) are scored by Dice against the
cell's own Herlev mask. Printed per class: median and lower quartile of each Dice, for the
segmentation of git revision REV (default: the commit before the issue-14 segmentation,
read with `git show` and loaded as a module) and for this checkout, side by side, plus the
median ms per cell of each. Both run in this one process, cell by cell in alternation, so
machine noise hits both alike.

Measured on the 2-core development VM (shared, loaded), all 917 cells, before a884e40:
nucleus median Dice 0.82 -> 0.91 (carcinoma in situ 0.42 -> 0.88, superficial 0.26 ->
0.74), cell 0.75 -> 0.81.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "a884e40"  # segmentation before the rewrite this benchmark measures


def module_at(revision: str, name: str):
    """The module ``pathmaster/<name>.py`` of a git revision (today's path, e.g.
    ``image/segmentation``, or in a tree from before the core's rooms its file of the same
    name at the top), loaded under another name (its own imports come from this checkout)."""
    for path in (f"pathmaster/{name}.py", f"pathmaster/{name.rsplit('/', 1)[-1]}.py"):
        shown = subprocess.run(["git", "-C", str(ROOT), "show", f"{revision}:{path}"], capture_output=True, text=True)
        if shown.returncode == 0:
            break
    else:
        raise FileNotFoundError(f"{revision} has no pathmaster/{name}.py")
    spec = importlib.util.spec_from_loader(f"{name.replace('/', '_')}_{revision}", loader=None)
    module = importlib.util.module_from_spec(spec)
    exec(compile(shown.stdout, f"{revision}:{path}", "exec"), module.__dict__)
    return module


def dice(a: np.ndarray, b: np.ndarray) -> float:
    """Dice overlap of two bool masks; 1 when both are empty."""
    total = a.sum() + b.sum()
    return 1.0 if total == 0 else float(2.0 * (a & b).sum() / total)


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    from pathmaster.image import segmentation
    from pathmaster.importers import iter_dataset
    from pathmaster.records import DIAGNOSES, NUCLEUS, CYTOPLASM, CellRecord

    shared = Path(os.environ.get("PATHMASTER_SHARED", ROOT.parent / "shared"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=shared / "data" / "herlev-40px")
    parser.add_argument("--before", default=BASELINE, help=f"git revision to compare with (default {BASELINE})")
    parser.add_argument("--every", type=int, default=1, help="use every n-th cell (default 1: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"no Herlev data at {args.data}", file=sys.stderr)
        return 1

    methods = {"before": module_at(args.before, "image/segmentation").segment_cell, "after": segmentation.segment_cell}
    records = [r for r in iter_dataset(args.data, layout="herlev") if isinstance(r, CellRecord)][::args.every]
    scores = {name: {"nucleus": [], "cell": [], "ms": []} for name in methods}
    labels = []
    for record in records:
        labels.append(record.diagnosis)
        for name, segment in methods.items():
            started = time.perf_counter()
            mask = segment(record.image)
            scores[name]["ms"].append(1000 * (time.perf_counter() - started))
            scores[name]["nucleus"].append(dice(mask >= NUCLEUS, record.mask >= NUCLEUS))
            scores[name]["cell"].append(dice(mask >= CYTOPLASM, record.mask >= CYTOPLASM))
    labels = np.array(labels, dtype=object)
    classes = [d for d in DIAGNOSES if d in set(labels)] + ["all"]
    table = {}
    for label in classes:
        rows = np.ones(len(labels), bool) if label == "all" else labels == label
        table[label] = {"n": int(rows.sum())}
        for name in methods:
            for region in ("nucleus", "cell"):
                values = np.asarray(scores[name][region])[rows]
                table[label][f"{region}_{name}"] = [float(np.median(values)), float(np.percentile(values, 25))]
    timing = {name: float(np.median(scores[name]["ms"])) for name in methods}
    if args.json:
        print(json.dumps({"before": args.before, "classes": table, "median_ms_per_cell": timing}, indent=1))
        return 0
    print(f"Dice against Herlev's masks, {len(records)} cells, image alone; median / lower quartile; "
          f"before = {args.before}, after = this checkout")
    print(f"{'class':22s} {'n':>4s}  {'nucleus before':>15s} {'nucleus after':>15s}  {'cell before':>15s} {'cell after':>15s}")
    for label, row in table.items():
        cells = [f"{row[key][0]:.3f} / {row[key][1]:.3f}" for key in
                 ("nucleus_before", "nucleus_after", "cell_before", "cell_after")]
        print(f"{label:22s} {row['n']:4d}  {cells[0]:>15s} {cells[1]:>15s}  {cells[2]:>15s} {cells[3]:>15s}")
    print(f"median ms per cell: before {timing['before']:.1f}, after {timing['after']:.1f} "
          f"(ratio {timing['after'] / timing['before']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
