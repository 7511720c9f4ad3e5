"""Benchmark of `pathmaster batch`: a teaching set of 300 cells through the demo deployment.

    python benchmarks/bench_batch.py [--cells 300] [--jobs 1,2,4] [--repeats 1] [--json out.json]

Starts the demo's three sites (the cached demo databases, 140 cells each, built on first
run) and a coordinator in this process, writes a labelled synthetic teaching set (cells
with backgrounds and masks, in class folders), then runs the real command line,
`pathmaster batch DIR --class teaching --out results.csv --jobs J`, in a child process
for each --jobs value, side by side in one run. It prints, per setting, the median over
the repeats of:

- cells/s, end to end (wall time of the command, Python start-up included), and the
  ratio to the first setting;
- the median and p95 case completion time the coordinator reported (6 cells per case);
- the accuracy of the voted diagnosis (a sanity check that the work was real);
and the time of a resumed run that finds every cell done (the cost of resuming).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run_cli(args: list[str]) -> tuple[float, subprocess.CompletedProcess]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pathmaster", *args], capture_output=True,
                          text=True, timeout=3600)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"pathmaster {' '.join(args)} failed ({done.returncode}):\n"
                         f"{done.stdout}\n{done.stderr}")
    return elapsed, done


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, default=300)
    parser.add_argument("--jobs", default="1,2,4", help="comma-separated --jobs values")
    parser.add_argument("--case-size", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    jobs_values = [int(j) for j in args.jobs.split(",")]

    from pathmaster.image.synth import write_dataset
    from services.demo import start_demo

    work = Path(tempfile.mkdtemp(prefix="bench-batch-"))
    started = time.perf_counter()
    teaching = write_dataset(work / "teaching", args.cells, seed=90210)
    print(f"teaching set: {args.cells} cells in {time.perf_counter() - started:.1f} s ({teaching})")
    deployment = start_demo(coordinator_port=0, metrics_port=0)
    address = deployment.coordinator.address
    print(f"deployment: sites {', '.join(deployment.sites)}; coordinator {address}")

    figures = {"cells": args.cells, "case_size": args.case_size, "settings": []}
    try:
        for jobs in jobs_values:
            rates, case_medians, case_p95s, accuracies = [], [], [], []
            for repeat in range(args.repeats):
                out = work / f"results-j{jobs}-r{repeat}.csv"
                elapsed, _ = run_cli(["batch", str(teaching), "--class", "teaching",
                                      "--out", str(out), "--coordinator", address,
                                      "--jobs", str(jobs), "--case-size", str(args.case_size),
                                      "--quiet"])
                with open(out, newline="") as f:
                    rows = list(csv.DictReader(f))
                if len(rows) != args.cells or any(r["status"] != "ok" for r in rows):
                    raise SystemExit(f"{out}: expected {args.cells} ok rows")
                case_s = [float(s) for s in {r["case_id"]: r["case_s"] for r in rows}.values()]
                rates.append(args.cells / elapsed)
                case_medians.append(statistics.median(case_s))
                case_p95s.append(percentile(case_s, 0.95))
                accuracies.append(sum(r["correct"] == "True" for r in rows) / len(rows))
            figures["settings"].append({
                "jobs": jobs, "cells_per_s": statistics.median(rates),
                "case_median_s": statistics.median(case_medians),
                "case_p95_s": statistics.median(case_p95s),
                "accuracy": statistics.median(accuracies), "runs": rates})

        resume_s, done = run_cli(["batch", str(teaching), "--out",
                                  str(work / f"results-j{jobs_values[0]}-r0.csv"),
                                  "--coordinator", address, "--quiet"])
        figures["resume_all_done_s"] = resume_s
        assert f"{args.cells} already done" in done.stdout, done.stdout
    finally:
        deployment.stop()

    base = figures["settings"][0]["cells_per_s"]
    print(f"\n{args.cells}-cell teaching set, {args.case_size} cells per case, "
          f"median of {args.repeats} run(s) per setting:")
    print(f"{'jobs':>4} {'cells/s':>8} {'ratio':>6} {'case median':>12} {'case p95':>9} {'accuracy':>9}")
    for s in figures["settings"]:
        print(f"{s['jobs']:>4} {s['cells_per_s']:>8.2f} {s['cells_per_s'] / base:>6.2f} "
              f"{s['case_median_s']:>11.2f}s {s['case_p95_s']:>8.2f}s {100 * s['accuracy']:>8.1f}%")
    print(f"resume with every cell done: {figures['resume_all_done_s']:.2f} s")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
