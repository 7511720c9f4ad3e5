"""Reply bytes of a site's first answer with and without its explanations (each match's
comparable similarity and packed measures, services/site/explain.py), side by side.

    python benchmarks/bench_explained_reply.py [--cells 6] [--cases 10] [--site-cells 140]

Builds one synthetic site database (--site-cells, the demo's size; cached under the test
cache), opens it in a `SiteWorker` in this process, analyses `--cases` synthetic 6-cell
cases, and makes each into the site's wire reply (`services.site.server.cell_result`, as
the site sends it) twice: as the worker answered (explained) and with the explanations
left out (the reply before them). Prints the median and max reply bytes of each, their
ratio, the TCP segments of the whole gRPC response, whether it fits one initial
congestion window; and per cell the median time of the search and of explaining its matches.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

MSS_BYTES = 1448


def segments(message_bytes: int) -> int:
    from qos.network import GRPC_REPLY_FRAMING_BYTES

    return math.ceil((message_bytes + GRPC_REPLY_FRAMING_BYTES) / MSS_BYTES)


def main(argv=None) -> None:
    from pathmaster import defaults
    from qos.network import TCP_INITIAL_WINDOW_BYTES
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.site.server import cell_result
    from services.synthetic import build_synthetic_site, cache_root, is_current, synthetic_case_cells
    from services.site.worker import SiteWorker

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=6)
    parser.add_argument("--cases", type=int, default=10)
    parser.add_argument("--site-cells", type=int, default=140)
    args = parser.parse_args(argv)
    folder = cache_root() / "bench" / f"explained-seed5-{args.site_cells}cells"
    if not is_current(folder):
        build_synthetic_site(folder, args.site_cells, seed=5)
    worker = SiteWorker(folder, budget=None, warm_up=False)
    window = TCP_INITIAL_WINDOW_BYTES // MSS_BYTES
    sizes = {"without explanations": [], "with explanations": []}
    search_s, explain_s = [], []
    for case in range(args.cases):
        outcomes = []
        for cell in synthetic_case_cells(args.cells, seed=1000 + case):
            features, *_ = worker._extract(cell["cell_id"], cell["image"], cell["background"], cell["mask"], None)
            values = [float(v) for v in features]
            outcome = worker.search(cell["cell_id"], values, defaults.K)
            outcomes.append(outcome)
            # The explanations' own cost, on top of the search: what the worker adds per cell.
            query = np.asarray(values)
            t0 = time.perf_counter()
            worker.explainer.similarities([m.distance for m in outcome.matches])
            for m in outcome.matches:
                worker.explainer.measures(query, m.cell_id)
            explain_s.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            worker.index.search(values, defaults.K)
            search_s.append(time.perf_counter() - t0)
        for label, keep in (("without explanations", False), ("with explanations", True)):
            cells = [cell_result(o if keep else dataclasses.replace(o, similarity=(), measures=()))
                     for o in outcomes]
            reply = pb.AnalyseReply(site="bench", algorithm=worker.index.algorithm, cells=cells,
                                    database_cells=len(worker.index),
                                    timing=pb.SiteTiming(site_wall_s=0.01, queue_s=0.001, search_s=0.005))
            sizes[label].append(reply.ByteSize())
    print(f"{args.cases} cases of {args.cells} cells, K={defaults.K}, a synthetic site of {args.site_cells} cells; "
          f"one initial window = {window} x {MSS_BYTES} B")
    base = statistics.median(sizes["without explanations"])
    for label, values in sizes.items():
        median = statistics.median(values)
        fits = sum(segments(v) <= window for v in values) / len(values)
        print(f"  {label:22s} reply median {median:7.0f} B max {max(values):6d} B (x{median / base:.3f}) "
              f"= {segments(int(median))}-{segments(max(values))} segments, one window: {fits:.0%}")
    print(f"  per cell, median: search {1000 * statistics.median(search_s):.2f} ms, explaining its "
          f"{defaults.K} matches {1000 * statistics.median(explain_s):.2f} ms")


if __name__ == "__main__":
    main()
