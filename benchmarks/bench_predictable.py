"""Predictable completion on loopback: bytes per site, throughput, and the predicted wait.

    python benchmarks/bench_predictable.py [--clients 20] [--cases-per-client 2] [--blocks 2] [--cases 40]

Three sites and a coordinator on loopback (the demo's databases, Ray, gRPC), one process:

1. Bytes per site of the demo's 6-cell case with backgrounds and masks, sent as images
   (every site analyses) and as features (the coordinator analyses once): request bytes
   and reply bytes; "before" replies are the same matches with the site database's 64 px
   PNG thumbnails in place of the 48 px JPEG wire thumbnails and without content hashes.
2. Cases/s with `--clients` concurrent clients (6-cell cases, classes in turn), images and
   features blocks alternating in one run (`--blocks` of each): medians and the ratio.
3. The predicted wait against the actual one over `--cases` sequential cases (classes in
   turn, both modes): median absolute percentage error per case and per site.

Prints medians and ratios measured side by side in one run; the machine is shared.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CLASSES = ["urgent", "routine", "teaching", "bulk"]


def site_results(events):
    return {e.site_result.site: e.site_result for e in events if e.HasField("site_result")}


def bench_bytes(client, cells, databases: dict) -> dict:
    """Request and reply bytes per site, images vs features, and the replies of before."""
    from pathmaster.site import SiteIndex

    indexes = {name: SiteIndex.open(db) for name, db in databases.items()}
    out = {}
    for ship in ("images", "features"):
        results = site_results(client.submit(cells, "routine", deadline_s=120, ship=ship))
        for site, r in results.items():
            assert r.status_code == 0 and r.mode == ship, (site, r.status_message)
            png = sum(len(indexes[site].thumbnail_png(m.cell_id)) for c in r.cells for m in c.matches)
            wire = sum(len(m.thumbnail) + len(m.image_sha256) + 3 for c in r.cells for m in c.matches)
            out.setdefault(site, {})[ship] = {"sent": r.bytes_sent, "received": r.bytes_received,
                                               "received_before": r.bytes_received - wire + png}
    return out


def bench_throughput(address: str, cells, clients: int, per_client: int, ship: str) -> float:
    """Cases/s of `clients` threads, each its own client, `per_client` cases each."""
    from services.client import CoordinatorClient

    done, failed = [], []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def run(i: int):
        with CoordinatorClient(address) as client:
            barrier.wait()
            for j in range(per_client):
                events = list(client.submit(cells, CLASSES[(i + j) % len(CLASSES)], deadline_s=600, ship=ship))
                with lock:
                    if events[-1].summary.sites_failed:
                        failed.extend(r.status_message for r in site_results(events).values() if r.status_code)
                    else:
                        done.append(1)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=1800)
    wall = time.perf_counter() - started
    if failed:
        print(f"  ({ship}: {len(failed)} failed site calls, e.g. {failed[0][:300]!r})")
    return len(done) / wall


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) so far of this process and of each kind of process
    below it (Ray's site workers, the coordinator's analysers, their bounded analysis
    processes, Ray's own daemons), from /proc: where a block's CPU went."""
    from services.fate import descendants

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    parents = {}
    for pid in [os.getpid(), *descendants(os.getpid())]:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        parents[pid] = int(fields[1])
        if pid == os.getpid():
            kind = "bench process (clients, coordinator, site servers)"
        elif "SiteWorker" in cmd:
            kind = "site workers (Ray actors)"
        elif "CellAnalyser" in cmd or "Analyser" in cmd:
            kind = "coordinator analysers (Ray actors)"
        elif "forkserver" in cmd or "multiprocessing" in cmd:
            kind = "bounded analysis processes"
        else:
            kind = "Ray daemons and idle workers"
        # utime, stime, and the children's that were waited for (pebble's replaced workers)
        out[kind] = out.get(kind, 0.0) + sum(int(f) for f in fields[11:15]) / tick
    return out


def bench_prediction(client, cells, cases: int, predictor, verbose: bool = False) -> dict:
    """Predicted vs actual completion, per case and per site, classes and modes in turn;
    and per site the predicted parts (transfer, site work) beside the measured ones."""
    parts = {}  # (site, class, mode) -> the site work predicted in the latest prediction
    predict = predictor.predict

    def recording(site, request_class, mode, nbytes, cells, sharing=1):
        predicted = predict(site, request_class, mode, nbytes, cells, sharing)
        parts[(site, request_class, mode)] = predictor.site(site).site_parts(mode, cells)
        return predicted

    predictor.predict = recording  # this instance only, for the breakdown below
    case_errors, site_errors, pairs, rows = [], [], [], []
    actual = defaultdict(list)  # (site, mode) -> actual seconds, for the noise floor
    try:
        for i in range(cases):
            parts.clear()
            events = list(client.submit(cells, CLASSES[i % len(CLASSES)], deadline_s=120,
                                        ship=("features", "images")[(i // len(CLASSES)) % 2]))
            plan = events[0].plan
            summary = events[-1].summary
            if plan.predicted_s:
                case_errors.append(abs(plan.predicted_s - summary.total_s) / summary.total_s)
                pairs.append((plan.predicted_s, summary.total_s))
            for r in site_results(events).values():
                if r.predicted_s and r.status_code == 0:
                    site_errors.append(abs(r.predicted_s - r.timing.total_s) / r.timing.total_s)
                    actual[(r.site, r.mode)].append(r.timing.total_s)
                    p = parts.get((r.site, r.request_class, r.mode))
                    if p is not None and True:
                        site_s = sum(p.values())
                        rows.append((r.mode, r.predicted_s - site_s, r.timing.transfer_s, site_s,
                                     r.timing.site_wall_s, r.timing.extraction_s + r.timing.search_s,
                                     p["queue_s"], r.timing.queue_s, len(r.decisions)))
                        if verbose:
                            print(f"     {r.site:<10} {r.mode:<8} {r.request_class:<8} predicted {r.predicted_s:.3f} = "
                                  f"transfer {r.predicted_s - site_s:.3f} + queue {p['queue_s']:.3f} + overhead "
                                  f"{p['overhead_s']:.3f} + service {p['service_s']:.3f}; actual {r.timing.total_s:.3f} = "
                                  f"transfer {r.timing.transfer_s:.3f} + queue {r.timing.queue_s:.3f} + rest "
                                  f"{r.timing.site_wall_s - r.timing.queue_s:.3f}; {'; '.join(r.decisions)}")
    finally:
        predictor.predict = predict
    # The best any constant could do per site and mode: the median of its actual times,
    # known afterwards. What is left is the run-to-run noise of the shared machine.
    floor = [abs(np.median(times) - t) / t for times in actual.values() for t in times]
    return {"case": case_errors, "site": site_errors, "pairs": pairs, "rows": rows, "floor": floor}


def print_breakdown(rows) -> None:
    """Median predicted and actual parts per mode (seconds)."""
    for mode in ("features", "images"):
        got = np.array([r[1:] for r in rows if r[0] == mode])
        if not len(got):
            continue
        med = np.median(got, axis=0)
        err = np.median(np.abs(got[:, [0, 2]] - got[:, [1, 3]]) / got[:, [1, 3]], axis=0)
        print(f"   {mode:<9} (n={len(got)}) transfer: predicted {med[0]:.3f} s, actual {med[1]:.3f} s "
              f"(MdAPE {100 * err[0]:.0f}%); site work: predicted {med[2]:.3f} s, actual {med[3]:.3f} s "
              f"(MdAPE {100 * err[1]:.0f}%; the site's own extraction+search {med[4]:.3f} s)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--cases-per-client", type=int, default=2)
    parser.add_argument("--blocks", type=int, default=2, help="throughput blocks of each mode, alternating")
    parser.add_argument("--cases", type=int, default=40, help="sequential cases for the prediction error")
    parser.add_argument("--verbose", action="store_true", help="print every site's predicted and actual parts")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: bytes, throughput")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    import logging

    from services.client import CoordinatorClient
    from services.demo import CASE_SEED, DEMO_SITES, LoopbackDeployment, demo_databases
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.site.synthetic import synthetic_case_cells
    from services.site.worker import ensure_ray

    logging.basicConfig(level=logging.WARNING)
    print(f"bench_predictable: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start")
    ensure_ray()
    databases = demo_databases(DEMO_SITES)
    cells = [pb.CellImage(cell_id=c["cell_id"], image=c["image"], background=c["background"], mask=c["mask"])
             for c in synthetic_case_cells(6, CASE_SEED)]
    with LoopbackDeployment(databases, {s.name: s.algorithm for s in DEMO_SITES}, metrics_port=None,
                            analysis_workers=2) as deployment:
        address = deployment.coordinator.address
        # The bench's 20 clients all come from one loopback address, which the coordinator's
        # per-client cap (meant for distinct machines) would count as one client.
        deployment.coordinator.servicer.admission.per_client = None
        with CoordinatorClient(address) as client:
            for ship in ("images", "features"):  # warm: connections, workers, caches
                list(client.submit(cells, "routine", deadline_s=120, ship=ship))
            sizes = bench_bytes(client, cells, databases) if "bytes" not in skip else {}
        print("1. bytes per site, 6-cell case with backgrounds and masks (KiB):")
        for site, s in sizes.items():
            i, f = s["images"], s["features"]
            print(f"  {site:<12} request: images {i['sent'] / 1024:7.1f}  features {f['sent'] / 1024:6.1f} "
                  f"({i['sent'] / f['sent']:.0f}x less)   reply: before {i['received_before'] / 1024:6.1f}  "
                  f"now {f['received'] / 1024:5.1f} ({f['received'] / i['received_before']:.2f} of before)")

        rates = {"images": [], "features": []}
        cpu = {"images": {}, "features": {}}
        for _ in range(0 if "throughput" in skip else args.blocks):
            for ship in ("images", "features"):
                before = cpu_seconds()
                rates[ship].append(bench_throughput(address, cells, args.clients, args.cases_per_client, ship))
                for kind, seconds in cpu_seconds().items():
                    cpu[ship][kind] = cpu[ship].get(kind, 0.0) + seconds - before.get(kind, 0.0)
        img, feat = (statistics.median(rates[m]) if rates[m] else float("nan") for m in ("images", "features"))
        print(f"2. {args.clients} concurrent clients x {args.cases_per_client} 6-cell cases, {args.blocks} blocks "
              f"each: images {img:.2f} cases/s, features {feat:.2f} cases/s (medians): {feat / img:.2f}x "
              f"(blocks: images {', '.join(f'{r:.2f}' for r in rates['images'])}; "
              f"features {', '.join(f'{r:.2f}' for r in rates['features'])})")
        cases = args.blocks * args.clients * args.cases_per_client
        for kind in sorted(set(cpu["images"]) | set(cpu["features"])):
            i, f = cpu["images"].get(kind, 0.0) / cases, cpu["features"].get(kind, 0.0) / cases
            print(f"   CPU s per case, {kind:<52} images {i:6.3f}  features {f:6.3f}")

        with CoordinatorClient(address) as client:
            pred = bench_prediction(client, cells, args.cases, deployment.coordinator.servicer.predictor, args.verbose)
        case, site = pred["case"], pred["site"]
        print(f"3. predicted vs actual wait, {args.cases} sequential cases (classes and modes in turn): "
              f"MdAPE per case {100 * np.median(case):.1f}% (n={len(case)}), per site "
              f"{100 * np.median(site):.1f}% (n={len(site)}); p90 per case {100 * np.percentile(case, 90):.1f}%")
        print(f"   coordinator's own log: MdAPE {100 * (deployment.coordinator.servicer.predictions.mdape() or 0):.1f}% "
              f"over its last {len(deployment.coordinator.servicer.predictions)} predicted cases")
        print(f"   noise floor per site: {100 * np.median(pred['floor']):.1f}% (MdAPE of the best constant per "
              f"site and mode, the median of its actual times, known only afterwards)")
        print("   per site, medians of predicted and actual parts:")
        print_breakdown(pred["rows"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
