"""Memory of a loaded deployment over time: is it flat, or does it grow?

    python benchmarks/bench_memory.py [--duration-s 1800] [--clients 20] [--sample-s 10] [--out FILE]

The demo's three sites and coordinator on loopback (one process: the coordinator and the
sites' gRPC servers; Ray's processes: the sites' workers, their analysis processes, Ray's
own daemons) under `--clients` concurrent clients, each submitting 6-cell cases of the four
classes in turn, back to back, for `--duration-s` seconds (default 30 minutes). Every
`--sample-s` seconds the RSS of each group is read from /proc:

- service: this process (coordinator + site servers + clients' channels);
- workers: Ray worker processes (SiteWorker actors, coordinator analysers) and their
  analysis processes;
- ray: Ray's daemons (GCS, raylet, agents), also each on its own (`DAEMONS`: gcs_server,
  raylet, dashboard_head, dashboard_agent, runtime_env_agent, log_monitor,
  autoscaler_monitor, other), with the raylet's
  shared-memory pages (its object store, `RssShmem`) apart as raylet_shm: those are touched
  once and kept, and are not a leak.

Prints the first and last samples (medians of the first and last tenth of the run), the
least-squares slope of each group and daemon in MiB per hour (scipy.stats.linregress,
with its standard error), and the cases by outcome (answered by every site; by some;
by none; the call failed, by gRPC status); `--out` writes every sample as CSV.
A slope within about two standard errors of 0 is flat; a short run says little about a
slow leak, so the figure to quote is from a run of the default length.
"""

from __future__ import annotations

import argparse
import csv
import os
import re
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GROUPS = ("service", "workers", "ray")
# Ray's daemons by a piece of their program (the executable, the script Python runs, or the
# name a daemon gives itself), first match wins; "other" for the rest (this process's
# watchdog, services/fate.py, among them)
DAEMON_MARKS = (("gcs_server", "gcs/gcs_server"), ("raylet", "raylet/raylet"),
                ("dashboard_head", "dashboard/dashboard.py"), ("dashboard_agent", "ray::DashboardAgent"),
                ("runtime_env_agent", "ray::RuntimeEnvAgent"), ("log_monitor", "log_monitor.py"),
                ("autoscaler_monitor", "autoscaler/_private/monitor.py"))
DAEMONS = (*(name for name, _ in DAEMON_MARKS), "other", "raylet_shm")
CLASSES = ("urgent", "routine", "teaching", "bulk")
FAILED_PAUSE_S = 1.0  # a client waits this long after a failed case before its next


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """Resident set size of `pid` in KiB (0 when it has ended); `field` another line of
    /proc/PID/status (RssShmem: its shared-memory pages)."""
    try:
        return int(re.search(rf"{field}:\s+(\d+)", Path(f"/proc/{pid}/status").read_text()).group(1))
    except (OSError, AttributeError):
        return 0


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def group_of(pid: int) -> str:
    """Which group a descendant of this process belongs to (see the module docstring)."""
    if daemon_of(pid) != "other":
        return "ray"
    line = command_line(pid)
    # Ray names its worker processes "ray::<actor or task>" (default_worker.py before that);
    # the analysis processes are forked by multiprocessing's fork server
    if line.startswith("ray::") or "default_worker.py" in line or "multiprocessing" in line:
        return "workers"
    return "ray"


def daemon_of(pid: int) -> str:
    """Which of `DAEMONS` a Ray daemon is, by its program: the first words of its command
    line that are not options (the rest may name other daemons: the raylet's names the GCS)."""
    program = " ".join(word for word in command_line(pid).split()[:3] if not word.startswith("-"))
    return next((name for name, mark in DAEMON_MARKS if mark in program), "other")


def sample() -> dict[str, float]:
    """RSS in MiB of each group and of each Ray daemon now."""
    from services.fate import descendants

    totals = dict.fromkeys((*GROUPS, *DAEMONS), 0)
    totals["service"] = rss_kib(os.getpid())
    for pid in descendants(os.getpid()):
        group, rss = group_of(pid), rss_kib(pid)
        totals[group] += rss
        if group == "ray":
            daemon = daemon_of(pid)
            if daemon == "raylet":
                shm = rss_kib(pid, "RssShmem")
                totals["raylet_shm"] += shm
                rss -= shm
            totals[daemon] += rss
    return {k: v / 1024 for k, v in totals.items()}


def outcome(events) -> tuple[str, list[str]]:
    """A case's outcome from its events ("every site", "some sites", "no site") and its
    sites' non-OK statuses (gRPC status names, with the summary's decisions left out)."""
    import grpc

    names = {code.value[0]: code.name for code in grpc.StatusCode}
    statuses = [names.get(e.site_result.status_code, str(e.site_result.status_code))
                for e in events if e.HasField("site_result") and e.site_result.status_code != 0]
    if not events or not events[-1].HasField("summary"):
        return "no summary", statuses
    summary = events[-1].summary
    if summary.sites_failed == 0:
        return "every site", statuses
    return ("some sites" if summary.sites_ok else "no site"), statuses


def load(address: str, cells, clients: int, stop: threading.Event, counts: Counter, lock: threading.Lock):
    """`clients` threads submitting cases back to back until `stop`; counts each case's
    outcome in `counts` ("case: ...") and each failed site's or call's status ("site: ...",
    "call: ...")."""
    import grpc

    from services.client import CoordinatorClient

    def run(i: int):
        with CoordinatorClient(address) as client:
            n = 0
            while not stop.is_set():
                request_class = CLASSES[(i + n) % len(CLASSES)]
                n += 1
                try:
                    result, statuses = outcome(list(client.submit(cells, request_class, deadline_s=120)))
                    keys = [f"case: {result}", *(f"site: {s}" for s in statuses)]
                except grpc.RpcError as exc:  # a refused or failed case is counted, not fatal
                    result, keys = "call failed", ["case: call failed", f"call: {exc.code().name}"]
                except Exception as exc:  # noqa: BLE001 - counted, not fatal
                    result, keys = "call failed", ["case: call failed", f"call: {type(exc).__name__}"]
                with lock:
                    counts["ok" if result == "every site" else "failed"] += 1
                    counts.update(keys)
                if result != "every site":  # a refused or failed case comes back at once: a user would wait
                    stop.wait(FAILED_PAUSE_S)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    return threads


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration-s", type=float, default=1800.0, help="how long the load runs (s)")
    parser.add_argument("--clients", type=int, default=20, help="concurrent clients")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between memory samples")
    parser.add_argument("--out", type=Path, help="CSV of every sample (t_s, MiB per group, cases)")
    args = parser.parse_args()
    if args.duration_s <= 0 or args.sample_s <= 0 or args.clients < 1:
        parser.error("--duration-s and --sample-s must be > 0, --clients >= 1")

    import logging

    from scipy.stats import linregress

    from services.demo import CASE_SEED, DEMO_SITES, LoopbackDeployment, demo_databases
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.synthetic import synthetic_case_cells
    from services.ray_local import ensure_ray

    logging.basicConfig(level=logging.WARNING)
    print(f"bench_memory: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start; "
          f"{args.clients} clients for {args.duration_s:.0f} s, a sample every {args.sample_s:.0f} s")
    ensure_ray()
    databases = demo_databases(DEMO_SITES)
    cells = [pb.CellImage(cell_id=c["cell_id"], image=c["image"], background=c["background"], mask=c["mask"])
             for c in synthetic_case_cells(6, CASE_SEED)]
    rows = []
    counts, lock, stop = Counter(ok=0, failed=0), threading.Lock(), threading.Event()
    with LoopbackDeployment(databases, {s.name: s.algorithm for s in DEMO_SITES}, metrics_port=None) as deployment:
        threads = load(deployment.coordinator.address, cells, args.clients, stop, counts, lock)
        started = time.monotonic()
        try:
            while (now := time.monotonic() - started) < args.duration_s:
                with lock:
                    done = counts["ok"] + counts["failed"]
                rows.append({"t_s": round(now, 1), **{k: round(v, 1) for k, v in sample().items()}, "cases": done})
                stop.wait(min(args.sample_s, max(0.0, args.duration_s - now)))
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=180)
        rows.append({"t_s": round(time.monotonic() - started, 1),
                     **{k: round(v, 1) for k, v in sample().items()}, "cases": counts["ok"] + counts["failed"]})
    if args.out:
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    tenth = max(1, len(rows) // 10)
    print(f"cases: {counts['ok']} answered by every site, {counts['failed']} not, in {rows[-1]['t_s']:.0f} s; "
          f"{len(rows)} samples")
    for key, n in sorted(counts.items()):
        if ":" in key:
            print(f"  {key:40} {n:7d}")
    print(f"{'group':22} {'first MiB':>10} {'last MiB':>10} {'slope MiB/h':>12} {'+-':>8}")
    for group in (*GROUPS, "total", *(f"ray:{d}" for d in DAEMONS)):
        values = [sum(r[g] for g in GROUPS) if group == "total" else r[group.removeprefix("ray:")] for r in rows]
        first, last = statistics.median(values[:tenth]), statistics.median(values[-tenth:])
        if len(rows) >= 3:
            fit = linregress([r["t_s"] for r in rows], values)
            slope, error = fit.slope * 3600, fit.stderr * 3600
        else:
            slope = error = float("nan")
        print(f"{group:22} {first:10.0f} {last:10.0f} {slope:12.1f} {error:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
