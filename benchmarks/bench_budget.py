"""An urgent 6-cell case alone, and with a hostile upload at the same site.

    python benchmarks/bench_budget.py [--runs 3] [--before-runs 1] [--before-side 2048]

Each phase runs in a process of its own (its own local Ray, 2 CPUs), one site of 70
synthetic cells and a coordinator on loopback:

* before: the code before the budget (the base commit, exported with `git archive`), one
  Ray worker: the hostile upload is a flat --before-side^2 PNG (the incident's 4096^2 took
  269 s and 10.9 GB; 2048^2 keeps this run to about a minute, so it understates "before").
* after, 1 and 2 Ray workers: the flat 4096^2 PNG (refused from its header), and a flat
  1024^2 PNG, the costliest legal upload (cap MAX_ANALYSIS_PIXELS), under the default budget.

Prints per configuration the median urgent-case time alone and with the hostile upload,
their difference, and the peak RSS of the Ray worker (VmHWM) and of the analysis workers.
The machine is shared: compare figures of one run only.

    python benchmarks/bench_budget.py --replacement [--processes 3] [--rounds 5] [--replacement-before REV]

The worker that replaces a killed one, without Ray: an `AnalysisPool` (default budget, the
PRELOAD of services.analysis) with the code of git revision REV ("before"; default the
commit before the warm fork server) and of this tree ("after"), in alternating fresh
processes (a process has one fork server). Each round: an urgent ~200 px cell (image only,
as users send it) on a worker that has served cells; a hostile 1024^2 checkerboard stopped
at its 0.15 s deadline (its worker killed); the same urgent cell at once, on the replacement
worker. Printed side by side: the replacement's CPU before its task (start, initializer)
and in its first analysis, the modules that analysis imported, the urgent cell's wall time
from the kill to its answer against a served worker's, the fork server's RSS and threads.

    python benchmarks/bench_budget.py --killed 1.0 [--processes 2] [--runs 3]

The same through the whole service (Ray, a coordinator analysing the cells, one site),
REV and this tree alternating: an urgent 6-cell case alone, and sent while a bulk case of
one 1024^2 checkerboard runs, whose deadline (1.0 s) stops it and kills its worker; the
urgent cells queued behind it at that analyser run on the replacement.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_COMMIT = "c9670ca"  # the last commit before the budget
WARM_BASE_COMMIT = "1d408ee"  # the last commit before the warm fork server


def flat_png(side: int) -> bytes:
    import numpy as np

    from pathmaster.image.io import encode_png

    return encode_png(np.full((side, side, 3), 200, np.uint8), compress_level=9)


def vm_hwm_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def phase(args) -> dict:
    """Runs in its own process: one deployment, the measurements, a JSON line out."""
    import logging

    import grpc
    import ray

    from services.client import CoordinatorClient
    from services.config import CoordinatorConfig, SiteConfig, SiteEndpoint
    from services.coordinator.server import CoordinatorServer
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.site.server import SiteServer
    from services.synthetic import build_synthetic_site, synthetic_case_cells

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    out = {"phase": args.phase, "workers": args.workers}
    with tempfile.TemporaryDirectory() as tmp:
        db = build_synthetic_site(Path(tmp) / "site", 70, seed=1)
        site = SiteServer(SiteConfig(name="s", db=db, workers=args.workers, worker_cpus=0.5)).start()
        coordinator = CoordinatorServer(CoordinatorConfig(sites=[SiteEndpoint(name="s", address=site.address)])).start()
        case = [pb.CellImage(cell_id=c["cell_id"], image=c["image"], background=c["background"], mask=c["mask"])
                for c in synthetic_case_cells(6, seed=2026)]
        pids = [ray.get(w.__ray_call__.remote(lambda self: os.getpid())) for w in site.workers]

        def submit(cells, request_class, deadline_s=600.0):
            started = time.perf_counter()
            with CoordinatorClient(coordinator.address) as client:
                try:
                    events = list(client.submit(cells, request_class, deadline_s=deadline_s))
                except grpc.RpcError as exc:
                    return time.perf_counter() - started, exc.code().name, []
            results = [e.site_result for e in events if e.HasField("site_result")]
            errors = [c.error for r in results for c in r.cells if c.error]
            return time.perf_counter() - started, results[0].status_code if results else "none", errors

        submit(case, "urgent")  # warm
        out["alone_s"] = [submit(case, "urgent")[0] for _ in range(args.runs)]
        for side in args.hostile:
            # "checker<side>:<deadline s>": a costly checkerboard stopped at its case's deadline
            # (its analysis worker killed and replaced); "<side>": a flat image, deadline 600 s
            shape, _, deadline = side.partition(":")
            image = checkerboard_png(int(shape[7:])) if shape.startswith("checker") else flat_png(int(shape))
            hostile = [pb.CellImage(cell_id=f"hostile-{shape}.png", image=image)]
            hostile_deadline_s = float(deadline or 600)
            timings, notes = [], []
            for _ in range(args.runs):
                before = len(site.servicer.cases_started)
                box = {}
                thread = threading.Thread(target=lambda: box.update(r=submit(hostile, "bulk", hostile_deadline_s)))
                thread.start()
                while len(site.servicer.cases_started) == before and thread.is_alive():
                    time.sleep(0.01)  # until the site has the hostile case (or it was refused)
                urgent_s, status, errors = submit(case, "urgent")
                thread.join()
                timings.append(urgent_s)
                notes.append({"urgent_errors": len(errors), "hostile_s": round(box["r"][0], 2),
                              "hostile_status": str(box["r"][1]), "hostile_error": (box["r"][2] or [""])[0][:100]})
            out[f"with_{side}_s"] = timings
            out[f"with_{side}_notes"] = notes
        out["ray_worker_peak_rss"] = max(vm_hwm_bytes(p) for p in pids)
        if args.phase == "after":
            out["analysis_worker_peak_rss"] = max(ray.get(w.budget_stats.remote())["peak_rss_bytes"]
                                                  for w in site.workers)
        coordinator.stop(0.5)
        site.stop(0.5)
    ray.shutdown()
    return out


# ------------------------------------------------------------------ worker replacement


def checkerboard_png(side: int, square: int = 2) -> bytes:
    """Small as a file, costly to segment (tests/services/test_budget_site.py's hostile cell)."""
    import numpy as np

    from pathmaster.image.io import encode_png

    yy, xx = np.mgrid[:side, :side]
    grey = np.where((yy // square + xx // square) % 2 == 0, 40, 220).astype(np.uint8)
    return encode_png(np.repeat(grey[..., None], 3, axis=2), compress_level=9)


def timed_analysis(image: bytes) -> dict:
    """In a worker: one image-only analysis; the CPU this process had used before it (its
    start and initializer, for a new worker), the analysis's CPU and wall seconds, and how
    many modules it imported."""
    import resource
    import sys

    from services.analysis import analyse_encoded

    def cpu_s():
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    before, modules, wall = cpu_s(), set(sys.modules), time.perf_counter()
    analyse_encoded("urgent.png", image, b"", b"")
    return {"pid": os.getpid(), "cpu_before_task_s": before, "cpu_s": cpu_s() - before,
            "wall_s": time.perf_counter() - wall, "imported": len(set(sys.modules) - modules)}


def replacement_phase(args) -> dict:
    """Runs in its own process (its own fork server): `args.rounds` kills and replacements."""
    import multiprocessing.forkserver

    from pathmaster.analysis.budget import AnalysisPool, CellBudget, CellStopped
    from services.analysis import PRELOAD  # of the tree on PYTHONPATH
    from services.synthetic import synthetic_case_cells

    urgent = synthetic_case_cells(1, seed=2026)[0]["image"]
    hostile = checkerboard_png(1024)
    out = {"phase": args.phase, "rounds": []}
    t0 = time.perf_counter()
    with AnalysisPool(workers=1, budget=CellBudget(), preload=PRELOAD) as pool:
        pool.warm_up()
        out["pool_start_s"] = time.perf_counter() - t0
        server = multiprocessing.forkserver._forkserver._forkserver_pid
        out["server_rss"] = int(Path(f"/proc/{server}/status").read_text().split("VmRSS:")[1].split()[0]) * 1024
        out["server_threads"] = len(os.listdir(f"/proc/{server}/task"))
        pool.run(timed_analysis, urgent)  # the worker has served a cell
        for _ in range(args.rounds):
            served = pool.run(timed_analysis, urgent)
            try:
                pool.run(timed_analysis, hostile, pixels=1024 * 1024, deadline=time.time() + 0.15)
                continue  # it finished inside its deadline (an idle machine): no kill, no round
            except CellStopped:
                killed = time.perf_counter()
            first = pool.run(timed_analysis, urgent)
            first["after_kill_s"] = time.perf_counter() - killed
            assert first["pid"] != served["pid"]
            out["rounds"].append({"served": served, "first": first})
        out["worker_peak_rss"] = pool.stats.peak_rss_bytes
    return out


def replacement(processes: int, rounds: int, before: str) -> None:
    results = {"before": [], "after": []}
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as old:
        archive = subprocess.run(["git", "-C", str(REPO), "archive", before], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
        for _ in range(processes):
            for name, tree in (("before", old), ("after", str(REPO))):
                cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", "replacement", "--rounds", str(rounds)]
                done = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=tree), cwd=tree, capture_output=True,
                                      text=True, timeout=900)
                lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
                if done.returncode or not lines:
                    raise RuntimeError(f"{name} phase failed:\n{done.stderr[-3000:]}")
                results[name].append(json.loads(lines[-1]))
    load = f"{load:.1f}-{os.getloadavg()[0]:.1f}"
    med = statistics.median
    rows = [
        ("new worker's CPU before its task, ms", lambda r: r["first"]["cpu_before_task_s"] * 1e3),
        ("first analysis on it, CPU ms", lambda r: r["first"]["cpu_s"] * 1e3),
        ("  a served worker's analysis, CPU ms", lambda r: r["served"]["cpu_s"] * 1e3),
        ("modules the first analysis imported", lambda r: r["first"]["imported"]),
        ("urgent cell, kill -> answer, wall ms", lambda r: r["first"]["after_kill_s"] * 1e3),
        ("  on a served worker, wall ms", lambda r: r["served"]["wall_s"] * 1e3),
    ]
    print(f"\nworker replacement after a hostile cell is killed: before = {before}, after = this tree; "
          f"{processes} processes x {rounds} rounds each, alternating; load average {load}; medians")
    print(f"{'':40s} {'before':>9s} {'after':>9s}  ratio")
    for label, get in rows:
        b, a = (med([get(r) for p in results[n] for r in p["rounds"]]) for n in ("before", "after"))
        ratio = f"x{b / a:.1f}" if a else ""
        print(f"{label:40s} {b:9.1f} {a:9.1f}  {ratio}")
    delay = {n: med([(r["first"]["after_kill_s"] - r["served"]["wall_s"]) * 1e3 for p in results[n]
                     for r in p["rounds"]]) for n in results}
    print(f"{'urgent delay from the replacement, ms':40s} {delay['before']:9.1f} {delay['after']:9.1f}")
    for label, key in (("fork server RSS, MiB", "server_rss"), ("analysis worker peak RSS, MiB", "worker_peak_rss")):
        b, a = (med([p[key] / 2**20 for p in results[n]]) for n in ("before", "after"))
        print(f"{label:40s} {b:9.0f} {a:9.0f}")
    b, a = (med([p["pool_start_s"] for p in results[n]]) for n in ("before", "after"))
    print(f"{'pool start (fork server + 1st worker), s':40s} {b:9.2f} {a:9.2f}")
    print(f"fork server threads: before {sorted({p['server_threads'] for p in results['before']})}, "
          f"after {sorted({p['server_threads'] for p in results['after']})}")


def run_phase(name: str, path: Path, workers: int, runs: int, hostile: list) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--phase", name, "--workers", str(workers),
           "--runs", str(runs), "--hostile", *map(str, hostile)]
    env = dict(os.environ, PYTHONPATH=str(path))
    for _ in range(3):  # a loaded machine sometimes fails Ray's own start: try again
        done = subprocess.run(cmd, env=env, cwd=path, capture_output=True, text=True, timeout=1800)
        if "timed out during startup" not in done.stderr:
            break
    lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{name} phase failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1])


def report(result: dict) -> None:
    mib = 2**20
    alone = statistics.median(result["alone_s"])
    label = f"{result['phase']}, {result['workers']} Ray worker(s)"
    print(f"\n{label}: urgent 6-cell case alone, median of {len(result['alone_s'])}: {alone:.2f} s")
    for key in [k for k in result if k.startswith("with_") and k.endswith("_s")]:
        side = key[5:-2]
        median = statistics.median(result[key])
        what = f"a flat {side} x {side} upload" if side.isdigit() else f"hostile {side} (checkerboard side:deadline s)"
        print(f"  with {what}: median {median:.2f} s  (+{median - alone:.2f} s)  "
              f"runs {[round(t, 2) for t in result[key]]}")
        for note in result[f"with_{side}_notes"][:1]:
            print(f"    hostile: {note}")
    print(f"  peak RSS: Ray worker {result['ray_worker_peak_rss'] / mib:.0f} MiB"
          + (f", analysis worker {result['analysis_worker_peak_rss'] / mib:.0f} MiB" if "analysis_worker_peak_rss" in result else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--before-runs", type=int, default=1)
    parser.add_argument("--before-side", type=int, default=2048)
    parser.add_argument("--skip-before", action="store_true")
    parser.add_argument("--replacement", action="store_true",
                        help="time the worker that replaces a killed one, before and after the warm fork server")
    parser.add_argument("--processes", type=int, default=3, help="--replacement: processes of each kind")
    parser.add_argument("--rounds", type=int, default=5, help="--replacement: kills per process")
    parser.add_argument("--replacement-before", default=WARM_BASE_COMMIT, metavar="REV",
                        help="--replacement, --killed: the revision to compare with")
    parser.add_argument("--killed", type=float, metavar="DEADLINE_S",
                        help="the whole service, --replacement-before vs this tree: an urgent case alone and "
                             "beside a 1024^2 checkerboard (bulk) stopped at its case deadline DEADLINE_S")
    parser.add_argument("--phase", choices=["before", "after", "replacement"], help=argparse.SUPPRESS)
    parser.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--hostile", nargs="*", default=[], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase == "replacement":
        print(json.dumps(replacement_phase(args)), flush=True)
        return
    if args.phase:  # the code under test comes from PYTHONPATH (the old export or this tree)
        print(json.dumps(phase(args)), flush=True)
        return
    if args.replacement:
        replacement(args.processes, args.rounds, args.replacement_before)
        return
    if args.killed:  # the whole service: before and after the warm fork server, alternating
        with tempfile.TemporaryDirectory() as old:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", args.replacement_before],
                                     capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
            for _ in range(args.processes):
                for label, tree in ((f"before ({args.replacement_before})", Path(old)), ("after (this tree)", REPO)):
                    load = os.getloadavg()[0]
                    result = run_phase("after", tree, 1, args.runs, [f"checker1024:{args.killed}"])
                    result["phase"] = f"{label}, load average {load:.1f}-{os.getloadavg()[0]:.1f}"
                    report(result)
        return
    sys.path.insert(0, str(REPO))
    from pathmaster import defaults

    print(f"MAX_ANALYSIS_PIXELS {defaults.MAX_ANALYSIS_PIXELS}, budget {defaults.CELL_CPU_FLOOR_S} s + "
          f"{defaults.CELL_CPU_PER_MEGAPIXEL_S} s/MP of CPU, memory {defaults.ANALYSIS_MEMORY_BYTES / 2**20:.0f} MiB")
    results = []
    if not args.skip_before:
        with tempfile.TemporaryDirectory() as old:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", BASE_COMMIT], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", old], input=archive.stdout, check=True)
            results.append(run_phase("before", Path(old), 1, args.before_runs, [args.before_side]))
            report(results[-1])
    for workers in (1, 2):
        results.append(run_phase("after", REPO, workers, args.runs, [4096, 1024]))
        report(results[-1])


if __name__ == "__main__":
    main()
