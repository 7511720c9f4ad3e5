"""Request bytes per site of a 6-cell case: images, the full feature vectors, and only the
values the site compares (its advertised selection), side by side.

    python benchmarks/bench_request_bytes.py [--cells 6] [--repeats 200]

Behind a full drop-tail queue only the first segment of a request burst tends to get in:
a request of one segment arrives in one round trip, one of five in several.
For each cached demo site database (`pathmaster demo` or bench_predictable.py; skipped when
absent) the site's own feature choice (`SiteInfo.feature_columns`: empty when its
projection reads every feature, as "lda"/"all" do) and the same cells re-indexed with
forward selection (at most defaults.MAX_SELECTED_FEATURES features) in a scratch copy,
the request the coordinator builds (`services.coordinator.fanout.features_request`) is
measured for `--cells` synthetic test cells: message bytes, TCP segments of the whole gRPC
request (message + 5 B gRPC prefix + 9 B HTTP/2 DATA frame header + ~80 B request headers
on a warm HPACK context, 1448 B a segment), and the median time to build it.
The images request (image + background + mask, the test cells' PNGs) is printed once.

Measured (commit 38b2e36, load average 1.5-2.4), 6 cells, bytes of the request message:
images 911,745 (630 segments); full vectors 6,424 (5 segments) to every site; the demo
sites as indexed ("auto" chose lda: every feature) advertise nothing and still get 6,424;
re-indexed with forward selection they keep 11 / 12 / 9 features and get 713 / 762 / 615 B
(1 segment, 8.4-10.5x fewer); the most forward selection keeps, 24, makes 1,363 B (with
15-character cell ids; ~1.3 kB with the testbed's "cellN": one segment there, at the edge of
one here). Building a site's request: ~5 us full, ~25 us subset (median).
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MSS_BYTES = 1448           # TCP payload per segment on a 1500 B MTU path with timestamps
FRAMING_BYTES = 5 + 9 + 80  # gRPC prefix, HTTP/2 DATA header, request headers (warm HPACK)


def segments(message_bytes: int) -> int:
    return math.ceil((message_bytes + FRAMING_BYTES) / MSS_BYTES)


def median_us(build, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        build()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)

    from pathmaster.features import feature_names
    from pathmaster.site.index import build_search_index
    from pathmaster.site.search import SiteIndex
    from pathmaster.site.database import SiteDB
    from services.client import analyse_locally
    from services.coordinator.fanout import features_request
    from services.demo import DEMO_SITES
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.synthetic import cache_root, synthetic_case_cells

    test_cells = synthetic_case_cells(args.cells, seed=2026)
    cells = [pb.CellImage(cell_id=c["cell_id"], image=c["image"], background=c["background"], mask=c["mask"])
             for c in test_cells]
    _, vectors, schema = analyse_locally(cells)  # the real values (their size does not depend on them)
    case_id = "0123456789ab"  # a coordinator-made case id (12 hex)
    images = pb.AnalyseRequest(case_id=case_id, request_class="urgent", cells=cells, k=5)
    print(f"{args.cells}-cell case; schema {schema}, {len(feature_names())} features a cell; "
          f"segments of {MSS_BYTES} B with ~{FRAMING_BYTES} B of gRPC/HTTP2 framing and headers")
    print(f"images (image+background+mask): {images.ByteSize():,} B, {segments(images.ByteSize())} segments")
    header = f"{'site':<28} {'choice':<26} {'values':>6} {'full B':>7} {'seg':>3} {'subset B':>8} {'seg':>3} " \
             f"{'ratio':>6} {'build full us':>13} {'build subset us':>15}"
    print(header)
    scratch = Path(tempfile.mkdtemp(prefix="bench-request-bytes-"))
    try:
        for site in DEMO_SITES:
            folders = sorted((cache_root() / "demo").glob(f"{site.name}-seed{site.seed}-*cells"))
            if not folders:
                print(f"{site.name:<28} (no cached demo database; run `pathmaster demo` once)")
                continue
            copy = Path(shutil.copytree(folders[0], scratch / site.name))
            for label, choice in (("as indexed", None), ("forward selection", "forward")):
                if choice:
                    with SiteDB(copy) as db:
                        build_search_index(db, features=choice)
                index = SiteIndex.open(copy)
                columns = index.compared_columns()
                full = features_request(case_id, "urgent", 5, schema, vectors)
                subset = features_request(case_id, "urgent", 5, schema, vectors, columns)
                full_us = median_us(lambda: features_request(case_id, "urgent", 5, schema, vectors).ByteSize(),
                                    args.repeats)
                subset_us = median_us(lambda: features_request(case_id, "urgent", 5, schema, vectors,
                                                               columns).ByteSize(), args.repeats)
                algorithm = index.algorithm.split("/")[-1]
                print(f"{site.name:<28} {label + ' ' + algorithm:<26} {len(columns) or len(feature_names()):>6} "
                      f"{full.ByteSize():>7,} {segments(full.ByteSize()):>3} {subset.ByteSize():>8,} "
                      f"{segments(subset.ByteSize()):>3} {full.ByteSize() / subset.ByteSize():>6.2f} "
                      f"{full_us:>13.1f} {subset_us:>15.1f}")
        # The most a site's forward selection keeps (the testbed's transfer sites advertise this many).
        from pathmaster import defaults
        from services.experiment.workload import selection_stand_in

        columns = selection_stand_in(len(feature_names()))
        full = features_request(case_id, "urgent", 5, schema, vectors)
        subset = features_request(case_id, "urgent", 5, schema, vectors, columns)
        print(f"{'(any site, the most kept)':<28} {f'forward, {defaults.MAX_SELECTED_FEATURES} max':<26} "
              f"{len(columns):>6} {full.ByteSize():>7,} {segments(full.ByteSize()):>3} {subset.ByteSize():>8,} "
              f"{segments(subset.ByteSize()):>3} {full.ByteSize() / subset.ByteSize():>6.2f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
