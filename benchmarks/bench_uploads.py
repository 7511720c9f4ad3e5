"""Segmentation of realistic uploads against Herlev's hand-drawn masks, before vs after.

    python benchmarks/bench_uploads.py [--before REV] [--every N] [--json]

The uploads: ../shared/data/herlev-224-dev (or $PATHMASTER_SHARED/data/...), real Herlev
cells as 224 px JPEG, letter-boxed with flat bars, neighbouring cells in the crop, no mask
and no blank slide. The same cells are in ../herlev-40px with Herlev's masks, downscaled
(stretched) to 40 x 40 px: each upload is paired with its 40 px copy by the least mean
squared difference of the upload's picture (bars cut off, shrunk to 40 x 40) against the
40 px cells of its class (every pair is unambiguous: the best match differs by ~6 grey
levels squared, the second best by ~550). An upload is segmented as `complete_cell` does
it (image alone), the mask's picture shrunk to 40 x 40 (nearest) and scored against the
40 px mask: Dice of nucleus and of cell, and the nucleus-to-cell area ratio's agreement
(median absolute difference). Printed per class, for git revision REV (default 08f044c,
loaded from `git show`) and this checkout side by side, with the median ms per upload.

Measured on all 462 uploads, 08f044c -> this branch (letter-box bars left out, the lamp
never sagging under the cell, the cell the piece holding the nucleus with its pale
cytoplasm looked for again): nucleus Dice 0.870 -> 0.898, cell 0.742 -> 0.817, nucleus
share of the cell off by 0.140 -> 0.087 (median); intermediate cells' cell Dice 0.536 ->
0.914, mild dysplasia's 0.620 -> 0.774; ~100 ms per upload either way.
Which dense piece is the nucleus (`segmentation.NUCLEUS_CENTRE_REACH`, the size-for-distance
trade): every third upload gave the same nucleus Dice (median 0.883) at reach 0.05, 0.10
and 0.15 of the image side, 0.883 / 0.882 at 0.25 / 0.5 with 1-2 more nuclei missed: the
piece nearest the centre, a larger one only when a speck is nearer, is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from PIL import Image

from bench_segmentation import dice, module_at  # the same side-by-side loading and overlap

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "08f044c"
SIDE = 40  # px, the masks' side


def pairs(uploads: Path, masks: Path):
    """(diagnosis folder, upload path, its 40 px image path) for every upload."""
    from pathmaster.image.segmentation import picture_box

    for folder in sorted(p for p in uploads.iterdir() if p.is_dir()):
        small = sorted((masks / folder.name).glob("*.BMP"))
        stack = np.stack([np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) for p in small])
        for path in sorted(folder.glob("*.jpg")):
            image = np.asarray(Image.open(path).convert("RGB"))
            rows, cols = picture_box(image)
            shrunk = np.asarray(Image.fromarray(image[rows, cols]).resize((SIDE, SIDE), Image.Resampling.BOX),
                                dtype=np.float32)
            best = int(((stack - shrunk) ** 2).mean(axis=(1, 2, 3)).argmin())
            yield folder.name, path, small[best]


def score(mask: np.ndarray, truth: np.ndarray, box) -> dict:
    """Nucleus and cell Dice and nucleus share of the cell, of ``mask``'s picture shrunk to the truth's size."""
    from pathmaster.records import CYTOPLASM, NUCLEUS

    picture = mask[box]
    shrunk = np.asarray(Image.fromarray(picture).resize((SIDE, SIDE), Image.Resampling.NEAREST))
    ratio = (shrunk >= NUCLEUS).sum() / max(1, (shrunk >= CYTOPLASM).sum())
    true_ratio = (truth >= NUCLEUS).sum() / max(1, (truth >= CYTOPLASM).sum())
    return {"nucleus": dice(shrunk >= NUCLEUS, truth >= NUCLEUS), "cell": dice(shrunk >= CYTOPLASM, truth >= CYTOPLASM),
            "ratio_error": abs(ratio - true_ratio)}


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    from pathmaster.image import segmentation
    from pathmaster.importers.herlev import decode_colour_mask
    from pathmaster.records import CellRecord

    shared = Path(os.environ.get("PATHMASTER_SHARED", ROOT.parent / "shared"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=shared / "data")
    parser.add_argument("--before", default=BASELINE)
    parser.add_argument("--every", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    uploads, masks = args.data / "herlev-224-dev", args.data / "herlev-40px"
    if not uploads.is_dir() or not masks.is_dir():
        print(f"no Herlev uploads or masks under {args.data}", file=sys.stderr)
        return 1
    methods = {"before": module_at(args.before, "image/segmentation").complete_cell, "after": segmentation.complete_cell}
    rows = []
    for number, (folder, upload, small) in enumerate(pairs(uploads, masks)):
        if number % args.every:
            continue
        image = np.asarray(Image.open(upload).convert("RGB"))
        truth, _ = decode_colour_mask(np.asarray(Image.open(small.with_name(f"{small.stem}-d.bmp")).convert("RGB")),
                                      str(small))
        box = segmentation.picture_box(image)
        row = {"class": folder}
        for name, complete in methods.items():
            started = time.perf_counter()
            record = complete(CellRecord(upload.stem, None, image))
            row[f"{name}_ms"] = 1000 * (time.perf_counter() - started)
            for key, value in score(record.mask, truth, box).items():
                row[f"{name}_{key}"] = value
        rows.append(row)
    return _report(rows, args)


def _report(rows: list[dict], args) -> int:
    classes = sorted({r["class"] for r in rows}) + ["all"]
    table = {}
    for label in classes:
        chosen = [r for r in rows if label in ("all", r["class"])]
        table[label] = {"n": len(chosen)}
        for key in ("nucleus", "cell", "ratio_error", "ms"):
            for name in ("before", "after"):
                table[label][f"{key}_{name}"] = float(np.median([r[f"{name}_{key}"] for r in chosen]))
    if args.json:
        print(json.dumps({"before": args.before, "classes": table}, indent=1))
        return 0
    print(f"uploads (224 px JPEG, letter-boxed) against Herlev's 40 px masks, {len(rows)} cells; medians; "
          f"before = {args.before}, after = this checkout")
    print(f"{'class':22s} {'n':>4s}  {'nucleus Dice':>15s}  {'cell Dice':>15s}  {'|ratio error|':>15s}")
    for label, row in table.items():
        cells = [f"{row[f'{key}_before']:.3f} -> {row[f'{key}_after']:.3f}" for key in ("nucleus", "cell", "ratio_error")]
        print(f"{label:22s} {row['n']:4d}  {cells[0]:>15s}  {cells[1]:>15s}  {cells[2]:>15s}")
    every = table["all"]
    print(f"median ms per upload: before {every['ms_before']:.1f}, after {every['ms_after']:.1f} "
          f"(ratio {every['ms_after'] / every['ms_before']:.2f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
