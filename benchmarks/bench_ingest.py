"""Ingest throughput: synthetic cells from disk into a site database, in cells per second.

    python benchmarks/bench_ingest.py [--cells 140] [--seed 0]

Writes a synthetic dataset (not timed), then times ``pathmaster.site.ingest.ingest`` on it:
reading and decoding the files, feature extraction, writing image/thumbnail/mask/background
PNGs and committing rows, and separately the index build (z-scores, feature choice,
FAISS). A second ingest of the same dataset measures how fast a re-run skips cells already
there (what completing an interrupted ingest costs). Prints medians of per-cell times and
the ratio of skip to ingest speed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from pathmaster.importers import iter_dataset
from pathmaster.site.ingest import ingest
from pathmaster.site.database import SiteDB
from pathmaster.site.index import build_search_index
from pathmaster.image.synth import write_dataset


def timed_records(dataset: Path, gaps: list[float]):
    """The dataset's records, noting the time between consecutive records (one cell's work)."""
    last = time.perf_counter()
    for record in iter_dataset(dataset):
        yield record
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=140)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pm-bench-ingest-") as tmp:
        dataset = write_dataset(Path(tmp) / "data", args.cells, args.seed)
        site = Path(tmp) / "site"

        gaps: list[float] = []
        t0 = time.perf_counter()
        report = ingest(dataset, site, records=timed_records(dataset, gaps), build_index=False)
        ingest_s = time.perf_counter() - t0
        assert report.added == args.cells and not report.problems, report.problems

        t0 = time.perf_counter()
        with SiteDB(site) as db:
            config = build_search_index(db)
        index_s = time.perf_counter() - t0

        skip_gaps: list[float] = []
        t0 = time.perf_counter()
        again = ingest(dataset, site, records=timed_records(dataset, skip_gaps), build_index=False)
        rerun_s = time.perf_counter() - t0
        assert again.added == 0 and again.skipped == args.cells

    per_cell = statistics.median(gaps) * 1e3
    per_skip = statistics.median(skip_gaps) * 1e3
    print(f"ingest of {args.cells} synthetic cells: {ingest_s:.1f} s = {args.cells / ingest_s:.1f} cells/s; "
          f"median {per_cell:.1f} ms per cell (import + features + 4 PNGs + row)")
    print(f"index build ({config['algorithm']}, features by {config['projection']['method']}, "
          f"{len(config['projection']['columns'])} of them): {index_s:.1f} s")
    print(f"re-run skipping all {args.cells} cells: {rerun_s:.1f} s = {args.cells / rerun_s:.1f} cells/s; "
          f"median {per_skip:.1f} ms per cell; skip/ingest speed ratio x{per_cell / per_skip:.1f}")


if __name__ == "__main__":
    main()
