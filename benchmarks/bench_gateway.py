"""Benchmark of the web gateway: what it adds to a case, and what idle connections cost.

    python benchmarks/bench_gateway.py [--repeats 7] [--cells 14] [--idle 200] [--json out.json]

Starts three small synthetic sites and a coordinator on loopback (as tests/clients does)
and a gateway in front of them, in this process. Then, in one run:

- a 6-cell case (cells with backgrounds and masks) is sent `--repeats` times each way,
  alternating: straight to the coordinator as `pathmaster query` does (the client
  library, in process, so Python's start-up is not counted), and through the gateway as
  the page does (multipart upload, NDJSON stream, signed-in session). Printed: the median
  wall time from sending to the summary, each way, and their ratio;
- the gateway's check of the case's files from their headers (what it does) and by
  decoding every file (what it did before): medians side by side;
- `--idle` connections are opened to the gateway and left idle: printed, this process's
  resident memory before and with them (the gateway runs in it), and how many the
  gateway has closed once its head deadline has passed.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def upload_check_times(files: dict[str, bytes], repeats: int) -> tuple[float, float]:
    """Median seconds of the gateway's check of `files`: from headers (`check_upload`,
    what it does) and by decoding every file (`cell_problem`, what it did)."""
    from services.gateway.pairing import pair_files
    from services.gateway.upload import cell_problem, check_upload

    cells = pair_files(files).cells
    header, decode = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        check_upload(files)
        header.append(time.perf_counter() - started)
        started = time.perf_counter()
        assert not any(cell_problem(files, cell) for cell in cells)
        decode.append(time.perf_counter() - started)
    return statistics.median(header), statistics.median(decode)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--cells", type=int, default=14, help="cells per site database")
    parser.add_argument("--idle", type=int, default=200)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import ray

    from services.client import CoordinatorClient
    from services.demo import DemoSite, LoopbackDeployment, demo_databases
    from services.gateway import start_gateway
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.site.synthetic import cache_root, synthetic_case_cells
    from services.site.worker import ensure_ray
    from tests.clients.web import WebClient

    ensure_ray()
    databases = demo_databases([DemoSite(n, s, "flat") for n, s in
                                (("site-a", 11), ("site-b", 12), ("site-c", 13))],
                               cells=args.cells, cache=cache_root() / "bench-gateway")
    deployment = LoopbackDeployment(databases, metrics_port=None).start()
    gateway = start_gateway(deployment.coordinator.address, head_timeout_s=5.0)
    try:
        cells = synthetic_case_cells(6, seed=4242)
        files = {}
        for n, c in enumerate(cells, start=1):
            files.update({f"cell{n}.png": c["image"], f"cell{n}-background.png": c["background"],
                          f"cell{n}-mask.png": c["mask"]})
        case = [pb.CellImage(cell_id=f"cell{n}", image=c["image"], background=c["background"],
                             mask=c["mask"]) for n, c in enumerate(cells, start=1)]
        web = WebClient(gateway, "bench")
        direct, through = [], []
        with CoordinatorClient(deployment.coordinator.address) as client:
            for _ in range(2):  # warm both paths: Ray actors, channels
                list(client.submit(case, "urgent"))
                web.post_case(files, "urgent")
            for _ in range(args.repeats):
                started = time.perf_counter()
                events = list(client.submit(case, "urgent"))
                direct.append(time.perf_counter() - started)
                assert events[-1].WhichOneof("event") == "summary"
                started = time.perf_counter()
                events = web.post_case(files, "urgent")
                through.append(time.perf_counter() - started)
                assert events[-1]["type"] == "summary", events[-1]
        d, g = statistics.median(direct), statistics.median(through)
        print(f"6-cell case, {args.repeats} runs each, alternating:")
        print(f"  direct (as pathmaster query)  median {d:.3f} s  (min {min(direct):.3f}, max {max(direct):.3f})")
        print(f"  through the gateway           median {g:.3f} s  (min {min(through):.3f}, max {max(through):.3f})")
        print(f"  gateway / direct              {g / d:.3f}")
        header_s, decode_s = upload_check_times(files, args.repeats)
        print(f"the gateway's check of the case's files, {args.repeats} runs each:")
        print(f"  headers only (check_upload)   median {header_s * 1e3:.2f} ms")
        print(f"  every file decoded            median {decode_s * 1e3:.2f} ms  "
              f"(the check before; the sites still decode)  ratio {decode_s / header_s:.0f}x")

        parts = urlsplit(gateway.url)
        before = rss_bytes()
        idle = [socket.create_connection((parts.hostname, parts.port), timeout=30) for _ in range(args.idle)]
        web.get("api/session")  # the gateway has accepted them all by the time it answers this
        with_idle = rss_bytes()
        print(f"{args.idle} idle connections: resident memory {before / 2**20:.1f} MiB -> "
              f"{with_idle / 2**20:.1f} MiB (+{(with_idle - before) / 1024:.0f} KiB, "
              f"{(with_idle - before) / max(args.idle, 1) / 1024:.1f} KiB each); "
              f"a request meanwhile: HTTP {web.get('api/session')[0]}")
        closed = 0
        for sock in idle:
            if sock.recv(1) == b"":  # blocks until the gateway's head deadline closes it
                closed += 1
            sock.close()
        print(f"  closed by the gateway's head deadline: {closed}/{args.idle}")
        if args.json:
            args.json.write_text(json.dumps({"direct_s": direct, "gateway_s": through, "ratio": g / d,
                                             "check_headers_s": header_s, "check_decode_s": decode_s,
                                             "idle": args.idle, "rss_before": before,
                                             "rss_idle": with_idle, "idle_closed": closed}, indent=1))
    finally:
        gateway.stop()
        deployment.stop()
        ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
