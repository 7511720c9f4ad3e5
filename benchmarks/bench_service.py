"""Distributed PathMaster: case latency, its overhead, concurrency, demo start-up and memory.

    python benchmarks/bench_service.py [--reps 15] [--clients 20] [--cases-per-client 2]

1. Warm 6-cell case over the 3 demo sites on loopback (gRPC + Ray): median and p95; in
   the same run, interleaved, the same work in one process without gRPC or Ray (the three
   sites' SiteWorker code called directly, one after another): the overhead ratio.
2. `--clients` concurrent clients, classes in turn: cases/s and p50/p95 per class.
3. `pathmaster demo` in a process of its own: time from start to ready (Ray included)
   and the memory of all its processes (Ray's included), RSS and PSS summed.
Prints medians and ratios; the machine is shared, so compare figures of one run only.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def percentile(values, q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q))


# ------------------------------------------------------------------ 3. demo start-up and memory


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc."""
    from services.fate import descendants

    return [root, *descendants(root)]


def memory_kib(pids: list[int]) -> tuple[int, int]:
    """(summed RSS, summed PSS) in KiB of `pids` (PSS counts shared pages once overall)."""
    rss = pss = 0
    for pid in pids:
        try:
            rss += int(re.search(r"VmRSS:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))
            pss += int(re.search(r"Pss:\s+(\d+)", Path(f"/proc/{pid}/smaps_rollup").read_text()).group(1))
        except (OSError, AttributeError):
            continue  # the process ended or is a kernel thread
    return rss, pss


def bench_demo_startup(cache: Path) -> dict:
    """Start `pathmaster demo` (databases cached), wait for "ready", measure, stop it."""
    env = dict(os.environ, PATHMASTER_CACHE=str(cache))
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pathmaster", "demo", "--port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    ready_s = None
    output = []
    try:
        for line in proc.stdout:
            output.append(line)
            if line.startswith("ready in"):
                ready_s = time.perf_counter() - started
            if "Ctrl-C to stop" in line:
                break
            if time.perf_counter() - started > 600:
                break
        pids = process_tree(proc.pid)
        rss, pss = memory_kib(pids)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    if ready_s is None:
        raise RuntimeError("the demo never became ready:\n" + "".join(output[-30:]))
    return {"ready_s": ready_s, "processes": len(pids), "rss_mib": rss / 1024, "pss_mib": pss / 1024}


# ------------------------------------------------------------------ 1. and 2.


def bench_case_latency(deployment, databases: dict, cells, reps: int) -> dict:
    """Interleaved: a case through the coordinator, then the same work in-process."""
    from services.client import CoordinatorClient
    from services.site.worker import SiteWorker

    local = [SiteWorker(db) for db in databases.values()]
    parts = [(c.cell_id, c.image, c.background, c.mask) for c in cells]

    def in_process():
        for worker in local:
            for part in parts:
                result = worker.analyse(*part, 5)
                assert not result.error, result.error

    distributed, baseline = [], []
    with CoordinatorClient(deployment.coordinator.address) as client:
        def case():
            events = list(client.submit(cells, "urgent", deadline_s=120))
            assert events[-1].summary.sites_ok == len(databases), events[-1]
        for _ in range(2):  # warm: imports, first connections, caches
            case()
            in_process()
        for _ in range(reps):
            t = time.perf_counter()
            case()
            distributed.append(time.perf_counter() - t)
            t = time.perf_counter()
            in_process()
            baseline.append(time.perf_counter() - t)
    return {"distributed": distributed, "in_process": baseline}


def bench_concurrency(deployment, cells, clients: int, per_client: int) -> dict:
    """`clients` threads, each its own client, submitting cases of class i % 4 in turn."""
    from services.client import CoordinatorClient

    classes = ["urgent", "routine", "teaching", "bulk"]
    times: dict[str, list[float]] = {c: [] for c in classes}
    failures = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def run(i: int):
        request_class = classes[i % len(classes)]
        with CoordinatorClient(deployment.coordinator.address) as client:
            barrier.wait()
            for _ in range(per_client):
                t = time.perf_counter()
                events = list(client.submit(cells, request_class, deadline_s=600))
                elapsed = time.perf_counter() - t
                with lock:
                    if events[-1].summary.sites_failed:
                        failures.append(events[-1].summary)
                    times[request_class].append(elapsed)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=900)
    wall = time.perf_counter() - started
    return {"wall_s": wall, "cases": sum(map(len, times.values())), "times": times, "failures": len(failures)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--cases-per-client", type=int, default=2)
    parser.add_argument("--skip-demo", action="store_true", help="skip the demo start-up measurement")
    args = parser.parse_args()

    import logging

    from services.demo import CASE_SEED, DEMO_SITES, LoopbackDeployment, demo_databases
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.synthetic import cache_root, synthetic_case_cells
    from services.ray_local import ensure_ray

    logging.basicConfig(level=logging.WARNING)
    print(f"bench_service: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    if not args.skip_demo:
        demo = bench_demo_startup(cache_root())  # builds the demo databases on its first run
        print(f"demo start-up: ready in {demo['ready_s']:.1f} s (Ray included; databases cached); "
              f"{demo['processes']} processes, RSS {demo['rss_mib']:.0f} MiB summed, PSS {demo['pss_mib']:.0f} MiB")

    ensure_ray()
    databases = demo_databases(DEMO_SITES)
    cells = [pb.CellImage(cell_id=c["cell_id"], image=c["image"], background=c["background"], mask=c["mask"])
             for c in synthetic_case_cells(6, CASE_SEED)]
    with LoopbackDeployment(databases, {s.name: s.algorithm for s in DEMO_SITES}, metrics_port=None) as deployment:
        lat = bench_case_latency(deployment, databases, cells, args.reps)
        d, b = lat["distributed"], lat["in_process"]
        ratio = statistics.median(d) / statistics.median(b)
        print(f"warm 6-cell case, 3 sites (gRPC + Ray, {args.reps} reps): median {statistics.median(d):.3f} s, "
              f"p95 {percentile(d, 95):.3f} s")
        print(f"same work in one process, no gRPC/Ray (3 sites one after another): median "
              f"{statistics.median(b):.3f} s, p95 {percentile(b, 95):.3f} s")
        paired = [x / y for x, y in zip(d, b)]
        print(f"overhead ratio distributed / in-process: {ratio:.2f}x (median of paired ratios "
              f"{statistics.median(paired):.2f}x; goal <= 1.5x)")

        conc = bench_concurrency(deployment, cells, args.clients, args.cases_per_client)
        print(f"{args.clients} concurrent clients x {args.cases_per_client} cases: {conc['cases']} cases in "
              f"{conc['wall_s']:.1f} s = {conc['cases'] / conc['wall_s']:.2f} cases/s, "
              f"{conc['failures']} with a failed site")
        for name, times in conc["times"].items():
            if times:
                print(f"  {name:<9} n={len(times):<3} p50 {percentile(times, 50):6.2f} s  "
                      f"p95 {percentile(times, 95):6.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
