"""Urgent first under overload: urgent's p95 beside bulk's, on loopback, in one run.

    python benchmarks/bench_urgent.py [--clients 12] [--seconds 60] [--max-cases 200]

Three small synthetic sites and a coordinator (with its analysers) on one local Ray (the
demo's deployment: the coordinator and the sites' gRPC servers share this process), then
`--clients` concurrent clients in a process of their own (as real clients are), each its
own connection, sending 1-cell cases of the classes in turn (client i: class i mod 4) as
fast as they are answered, for `--seconds` (at most `--max-cases` cases a client). A
refused case (RESOURCE_EXHAUSTED) waits the coordinator's retry-after (at most 0.5 s)
before the client's next. Prints, per class, the cases answered and refused and the p50
and p95 of the answered ones' completion times, then urgent's p95 over bulk's. The machine is shared: compare figures of one run only.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CLASSES = ("urgent", "routine", "teaching", "bulk")


def percentile(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def overload(address: str, cell: dict, clients: int, seconds: float, max_cases: int) -> dict:
    """Run the clients; {class: {"times": [...], "refused": n, "failed": n}} and the wall time."""
    import grpc

    from services.client import CoordinatorClient
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

    cells = [pb.CellImage(cell_id=cell["cell_id"], image=cell["image"], background=cell["background"],
                          mask=cell["mask"])]

    found = {c: {"times": [], "refused": 0, "failed": 0} for c in CLASSES}
    lock = threading.Lock()
    barrier = threading.Barrier(clients)
    stop_at: list[float] = []

    def run(i: int) -> None:
        request_class = CLASSES[i % len(CLASSES)]
        with CoordinatorClient(address) as client:
            client.learn_class_ports()
            barrier.wait()
            for _ in range(max_cases):
                if time.monotonic() >= stop_at[0]:
                    return
                started = time.monotonic()
                try:
                    events = list(client.submit(cells, request_class, deadline_s=60))
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                        with lock:
                            found[request_class]["failed"] += 1
                        continue
                    with lock:
                        found[request_class]["refused"] += 1
                    retry = dict(exc.trailing_metadata() or ()).get("retry-after", "0.5")
                    time.sleep(min(0.5, float(retry)))  # the client's pacing, as a polite client's
                    continue
                elapsed = time.monotonic() - started
                with lock:
                    if events[-1].summary.sites_failed:
                        found[request_class]["failed"] += 1
                    else:
                        found[request_class]["times"].append(elapsed)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    started = time.monotonic()
    stop_at.append(started + seconds)
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 120)
    return {"classes": found, "wall_s": time.monotonic() - started}


def overload_apart(*args) -> dict:
    """`overload` in a process of its own: its clients' gRPC work does not share this
    process's interpreter with the coordinator and the sites' servers."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(overload, *args).result()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--max-cases", type=int, default=200, help="at most this many cases a client")
    parser.add_argument("--site-cells", type=int, default=14, help="cells per synthetic site database")
    args = parser.parse_args()

    import logging

    from services.demo import CASE_SEED, DEMO_SITES, LoopbackDeployment, demo_databases
    from services.synthetic import cache_root, synthetic_case_cells
    from services.ray_local import ensure_ray

    logging.basicConfig(level=logging.ERROR)
    print(f"bench_urgent: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    ensure_ray()
    databases = demo_databases(DEMO_SITES, cells=args.site_cells, cache=cache_root() / "bench" / "urgent")
    cell = synthetic_case_cells(1, CASE_SEED)[0]
    with LoopbackDeployment(databases, {s.name: s.algorithm for s in DEMO_SITES}, metrics_port=None) as deployment:
        run = overload_apart(deployment.coordinator.address, cell, args.clients, args.seconds, args.max_cases)
    answered = sum(len(c["times"]) for c in run["classes"].values())
    print(f"{args.clients} clients, 1-cell cases, classes in turn, {run['wall_s']:.0f} s: {answered} answered "
          f"({answered / run['wall_s']:.1f} cases/s)")
    for name, found in run["classes"].items():
        times = found["times"]
        print(f"  {name:<9} answered {len(times):<5} refused {found['refused']:<5} failed {found['failed']:<3} "
              f"p50 {percentile(times, 50):6.2f} s  p95 {percentile(times, 95):6.2f} s")
    urgent, bulk = run["classes"]["urgent"]["times"], run["classes"]["bulk"]["times"]
    print(f"urgent p95 / bulk p95: {percentile(urgent, 95) / percentile(bulk, 95):.2f} "
          f"(p50: {percentile(urgent, 50) / percentile(bulk, 50):.2f}); below 1: urgent served first")
    return 0


if __name__ == "__main__":
    sys.exit(main())
