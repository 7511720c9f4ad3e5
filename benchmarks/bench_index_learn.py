"""Indexing a site of ~1,000 real cells, learning included: wall time by stage.

    python benchmarks/bench_index_learn.py [--data DIR] [--cells 1000] [--workers 2]

The cells are the shared Herlev development half (224 px JPEG uploads, no masks) and, to
reach ``--cells``, the same cells turned by 90, 180 and 270 degrees (distinct images with
the same labels, as a site that scanned a slide twice would hold). Times
``pathmaster.site.ingest`` (segmentation and features on ``--workers`` local processes) and the
index build (features fitted, the feature classifier, the eye's look at every cell, the lens
and head fitted on inner folds and on every cell, FAISS), and prints what the site chose.
The target: at most 3 minutes in all on this 2-core machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def turned(records, cells: int):
    """`records`, then their 90/180/270-degree turns, until there are `cells` of them."""
    out = list(records)
    for turns in (1, 2, 3):
        for record in records:
            if len(out) >= cells:
                return out[:cells]
            out.append(dataclasses.replace(record, image=np.ascontiguousarray(np.rot90(record.image, turns)),
                                           source_id=f"{record.source_id}@rot{90 * turns}"))
    return out[:cells]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = Path(os.environ.get("PATHMASTER_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--data", type=Path, default=shared / "data" / "herlev-224-dev")
    parser.add_argument("--cells", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if not args.data.is_dir():
        print(f"skipped: no dataset at {args.data}")
        return 0
    from pathmaster.importers import iter_dataset
    from pathmaster.site.ingest import ingest
    from pathmaster.site.index import build_search_index
    from pathmaster.site.search import SiteIndex
    from pathmaster.site.database import SiteDB

    records = turned([r for r in iter_dataset(args.data) if hasattr(r, "image")], args.cells)
    with tempfile.TemporaryDirectory(prefix="bench-index-learn-") as site_dir:
        t0 = time.perf_counter()
        report = ingest(args.data, site_dir, records=records, build_index=False, workers=args.workers)
        t1 = time.perf_counter()
        with SiteDB(site_dir) as db:
            build_search_index(db)
        t2 = time.perf_counter()
        site = SiteIndex.open(site_dir)
        learnt = site.learnt.report or {}
        result = {"cells": report.added, "problems": len(report.problems), "workers": args.workers,
                  "ingest_s": round(t1 - t0, 1), "index_and_learn_s": round(t2 - t1, 1), "total_s": round(t2 - t0, 1),
                  "case_point": learnt.get("case"),
                  "note": site.similarity_note(), "load": os.getloadavg()}
    print(json.dumps(result, indent=1))
    print(f"{result['cells']} cells indexed with learning in {result['total_s']:.0f} s "
          f"(target <= 180 s): ingest {result['ingest_s']:.0f} s, index and learning {result['index_and_learn_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
