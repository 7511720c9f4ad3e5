"""Predictable completion on loopback: bytes per site, throughput, and the predicted wait.

    python benchmarks/bench_predictable.py [--clients 20] [--cases-per-client 2] [--blocks 2] [--cases 40]
                                           [--compare-search] [--verbose] [--skip bytes,throughput]

Three sites and a coordinator on loopback (the demo's databases, Ray, gRPC), one process:

1. Bytes per site of the demo's 6-cell case with backgrounds and masks, sent as images
   (every site analyses) and as features (the coordinator analyses once): request bytes
   and reply bytes; "before" replies are the same matches with the site database's 64 px
   PNG thumbnails in place of the 48 px JPEG wire thumbnails and without content hashes.
2. Cases/s with `--clients` concurrent clients (6-cell cases, classes in turn), images and
   features blocks alternating in one run (`--blocks` of each): medians and the ratio.
3. The predicted wait against the actual one over `--cases` sequential cases (classes in
   turn, both modes): median absolute percentage error per case and per site, side by side
   with the same run's "before" predictions (the sum of the modelled parts, from the same
   observations: a site's was that sum until its own alike calls' recent median replaced it;
   a case's was its analysis estimate plus its slowest site) and with the best constant known
   in hindsight; the load average; and
   where a site call's time goes (median, p90 and std/mean of each part: gRPC request,
   site queue, worker round trip, the worker's own work, the handler's rest, the reply,
   the coordinator's hand-off), measured by hooks in this one process. With
   `--compare-search` this part runs twice: features searched on the sites' Ray workers
   (as before), then in the site servers (SiteConfig.search_in_server).

Prints medians and ratios measured side by side in one run; the machine is shared.
"""

from __future__ import annotations

import argparse
import json
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
    from pathmaster.site.search import SiteIndex

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


class Timeline:
    """Where a site call's time goes, recorded by hooks in this one process (the sites and
    the coordinator share its monotonic clock; cases run one at a time).

    Per site of the current case: when the winning copy was sent (`sent`), when the site's
    handler began and returned (`entry`, `exit`), when the coordinator's gRPC future
    completed (`done`) and when its fan-out thread took the answer (`taken`). Per case:
    the coordinator's per-cell analysis seconds. And every garbage collection's pause.
    """

    def __init__(self):
        self.site: dict[str, dict[str, float]] = defaultdict(dict)
        self.cell_analysis_s: list[float] = []
        self.gc_pauses: list[float] = []
        self._gc_started = 0.0
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self.site.clear()
            self.cell_analysis_s.clear()

    def install(self) -> None:
        """Hook the site handler, the coordinator's fan-out and the garbage collector
        (before the servers start: gRPC binds the handlers then)."""
        import gc

        from services.coordinator import pipeline as coordinator_pipeline
        from services.coordinator.fanout import FanOut
        from services.site.server import SiteServicer

        timeline = self
        analyse = SiteServicer.Analyse

        def timed_analyse(servicer, request, context):
            entry = time.monotonic()
            reply = analyse(servicer, request, context)
            if reply.cells:  # the copy the site took (the others are refused, or cancelled)
                with timeline._lock:
                    timeline.site[servicer.name].update(entry=entry, exit=time.monotonic())
            return reply

        class TimedFanOut(FanOut):
            def _finished(self, site, run, attempt):
                outcome = super()._finished(site, run, attempt)
                if outcome is not None and outcome.reply is not None:
                    with timeline._lock:
                        timeline.site[site].update(sent=attempt.sent_at, taken=time.monotonic(),
                                                   done=attempt.done_at)
                return outcome

        def on_gc(phase, info):
            if phase == "start":
                self._gc_started = time.perf_counter()
            else:
                self.gc_pauses.append(time.perf_counter() - self._gc_started)

        SiteServicer.Analyse = timed_analyse
        coordinator_pipeline.FanOut = TimedFanOut
        gc.callbacks.append(on_gc)

    def watch_analysers(self, analysers) -> None:
        """Collect the per-cell service seconds the coordinator's analysers report."""
        recent = analysers.seconds_per_cell
        add = recent.add

        def collecting(seconds):
            with self._lock:
                self.cell_analysis_s.append(seconds)
            add(seconds)

        recent.add = collecting


SITE_PARTS = {  # part -> what it is, for the breakdown's legend
    "request": "coordinator sends -> site handler begins (gRPC request, server thread hand-off)",
    "queue": "handler begins -> a worker is given the call (site queue, dispatcher hand-off)",
    "worker_rtt": "worker call round trip less its own work (Ray actor call, result back)",
    "work": "the worker's own extraction + search",
    "handler_rest": "worker result -> handler returns (wake-up, reply built)",
    "reply": "handler returns -> coordinator's call completes (gRPC reply)",
    "fanout_hop": "call completes -> coordinator's fan-out thread takes it (in the case's time, not the site's)",
}


def site_parts(r, marks: dict) -> dict[str, float]:
    """One site call's parts (seconds) from its SiteResult and the timeline's marks."""
    t = r.timing
    parts = {"queue": t.queue_s, "worker_rtt": t.service_s - t.extraction_s - t.search_s,
             "work": t.extraction_s + t.search_s, "handler_rest": t.site_wall_s - t.queue_s - t.service_s,
             "total": t.total_s}
    if {"sent", "entry", "exit", "done", "taken"} <= set(marks):
        parts.update(request=marks["entry"] - marks["sent"], reply=marks["done"] - marks["exit"],
                     fanout_hop=marks["taken"] - marks["done"])
    return parts


def spread(values) -> str:
    """'median / p90 / std:mean' of seconds, in ms."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not len(v):
        return "-"
    mean = v.mean()
    return (f"{1000 * np.median(v):7.1f} {1000 * np.percentile(v, 90):7.1f} "
            f"{(v.std() / mean if mean > 0 else float('nan')):6.2f}")


def print_parts(calls: list[dict], cases: list[dict]) -> None:
    """Median, p90 (ms) and std/mean of each part of a site call, per mode; and of a case."""
    print("   where the time goes (ms: median, p90; std/mean), per site call:")
    for mode in ("features", "images"):
        got = [c for c in calls if c["mode"] == mode]
        if not got:
            continue
        print(f"     {mode} (n={len(got)})")
        for part in [*SITE_PARTS, "total"]:
            print(f"       {part:<13} {spread([c.get(part, np.nan) for c in got])}   {SITE_PARTS.get(part, 'site call, as the coordinator saw it')}")
    for mode in ("features", "images"):
        got = [c for c in cases if c["mode"] == mode]
        if not got:
            continue
        print(f"     case, {mode} (n={len(got)}): total {spread([c['total'] for c in got])}; coordinator analysis "
              f"{spread([c['analysis'] for c in got])}; slowest site {spread([c['slowest'] for c in got])}; rest "
              f"{spread([c['total'] - c['analysis'] - c['slowest'] for c in got])}")
        cell = [s for c in got for s in c["cell_analysis"]]
        if cell:
            print(f"       one cell's analysis on an analyser actor (n={len(cell)}): {spread(cell)}")


def bench_prediction(client, cells, cases: int, servicer, verbose: bool = False,
                     timeline: Timeline | None = None) -> dict:
    """Predicted vs actual completion, per case and per site, classes and modes in turn;
    and per site the predicted parts (transfer, site work) beside the measured ones.

    "Before" is the same run's predictions made the old way from the same observations:
    each site's model (queue + transfer + overhead + service, as now), the coordinator's
    analysis at its actors' per-cell service time, and the case the plain sum of its
    analysis and its slowest site."""
    predictor = servicer.predictor
    parts = {}  # (site, class, mode) -> the site work predicted in the latest prediction
    model = {}  # (site, class, mode) -> the sum of the modelled parts ("before")
    analysis_before = []  # the case's analysis estimate at the per-cell service time
    predict = predictor.predict
    analysis_estimate = servicer._analysis_estimate

    def recording(site, request_class, mode, request_bytes, cells, sharing=1):
        predicted = predict(site, request_class, mode, request_bytes, cells, sharing)
        m = predictor.site(site)
        parts[(site, request_class, mode)] = m.site_parts(mode, cells)
        modelled = m.modelled_s(request_class, mode, predictor.call_bytes(site, request_bytes, cells), cells, sharing)
        model[(site, request_class, mode)] = None if modelled is None else m.queue_s() + modelled
        return predicted

    def recording_analysis(cells):
        a = servicer.analysers
        per_cell = a.seconds_per_cell.value() if a else None
        analysis_before.append(0.0 if per_cell is None else per_cell * a.rounds(cells, a._pending))
        return analysis_estimate(cells)

    predictor.predict = recording  # this instance only, for the breakdown below
    servicer._analysis_estimate = recording_analysis
    case_errors, site_errors, pairs, rows = [], [], [], []
    case_before, site_before = [], []
    actual = defaultdict(list)  # (site, mode) -> actual seconds, for the noise floor
    calls, case_parts = [], []
    try:
        for i in range(cases):
            parts.clear()
            model.clear()
            analysis_before.clear()
            if timeline is not None:
                timeline.clear()
            ship = ("features", "images")[(i // len(CLASSES)) % 2]
            events = list(client.submit(cells, CLASSES[i % len(CLASSES)], deadline_s=120, ship=ship))
            plan = events[0].plan
            summary = events[-1].summary
            ok = [r for r in site_results(events).values() if r.status_code == 0]
            for r in ok:
                calls.append({"case": i, "site": r.site, "mode": r.mode, "class": r.request_class,
                              "predicted": r.predicted_s, "before": model.get((r.site, r.request_class, r.mode)),
                              **site_parts(r, timeline.site.get(r.site, {}) if timeline else {})})
            if ok:
                case_parts.append({"case": i, "mode": ship, "predicted": plan.predicted_s,
                                   "total": summary.total_s, "analysis": summary.analysis_s,
                                   "slowest": max(r.timing.total_s for r in ok),
                                   "cell_analysis": list(timeline.cell_analysis_s) if timeline else []})
            befores = {r.site: model.get((r.site, r.request_class, r.mode)) for r in ok}
            if plan.predicted_s:
                case_errors.append(abs(plan.predicted_s - summary.total_s) / summary.total_s)
                pairs.append((plan.predicted_s, summary.total_s))
                if ok and len(ok) == len(plan.sites) and None not in befores.values():
                    before = (analysis_before[-1] if analysis_before and summary.analysis_s else 0.0) \
                        + max(befores.values())
                    case_before.append(abs(before - summary.total_s) / summary.total_s)
            for r in site_results(events).values():
                if r.predicted_s and r.status_code == 0:
                    site_errors.append(abs(r.predicted_s - r.timing.total_s) / r.timing.total_s)
                    actual[(r.site, r.mode)].append(r.timing.total_s)
                    if befores.get(r.site):
                        site_before.append(abs(befores[r.site] - r.timing.total_s) / r.timing.total_s)
                    p = parts.get((r.site, r.request_class, r.mode))
                    if p is not None and befores.get(r.site):
                        site_s = sum(p.values())
                        rows.append((r.mode, befores[r.site] - site_s, r.timing.transfer_s, site_s,
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
        servicer._analysis_estimate = analysis_estimate
    # The best any constant could do per site and mode: the median of its actual times,
    # known afterwards. What is left is the run-to-run noise of the shared machine.
    floor = [abs(np.median(times) - t) / t for times in actual.values() for t in times]
    by_mode = defaultdict(list)
    for c in case_parts:
        by_mode[c["mode"]].append(c["total"])
    case_floor = [abs(np.median(times) - t) / t for times in by_mode.values() for t in times]
    return {"case": case_errors, "site": site_errors, "pairs": pairs, "rows": rows, "floor": floor,
            "calls": calls, "cases": case_parts, "case_floor": case_floor,
            "case_before": case_before, "site_before": site_before}


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
    parser.add_argument("--compare-search", action="store_true",
                        help="run the prediction part twice: features searched on the sites' Ray workers "
                             "(the old way), then in the site servers")
    parser.add_argument("--json", help="write every case's and site call's predicted, before, actual and parts here")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: bytes, throughput")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))

    import logging

    from services.client import CoordinatorClient
    from services.demo import CASE_SEED, DEMO_SITES, LoopbackDeployment, demo_databases
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.synthetic import synthetic_case_cells
    from services.ray_local import ensure_ray

    logging.basicConfig(level=logging.WARNING)
    timeline = Timeline()
    timeline.install()
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
        print("1. bytes per site, 6-cell case with backgrounds and masks (KiB):" + (" skipped" if "bytes" in skip else ""))
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
        if "throughput" in skip:
            print(f"2. {args.clients} concurrent clients: skipped")
        else:
            print(f"2. {args.clients} concurrent clients x {args.cases_per_client} 6-cell cases, {args.blocks} blocks "
                  f"each: images {img:.2f} cases/s, features {feat:.2f} cases/s (medians): {feat / img:.2f}x "
                  f"(blocks: images {', '.join(f'{r:.2f}' for r in rates['images'])}; "
                  f"features {', '.join(f'{r:.2f}' for r in rates['features'])})")
        cases = args.blocks * args.clients * args.cases_per_client
        for kind in sorted(set(cpu["images"]) | set(cpu["features"])):
            i, f = cpu["images"].get(kind, 0.0) / cases, cpu["features"].get(kind, 0.0) / cases
            print(f"   CPU s per case, {kind:<52} images {i:6.3f}  features {f:6.3f}")

        timeline.watch_analysers(deployment.coordinator.servicer.analysers)
        servicer = deployment.coordinator.servicer
        here = {name: site.servicer.local for name, site in deployment.sites.items()}
        phases = [("searches in the site server", True)]
        if args.compare_search:  # the old way first: features searched on the sites' Ray workers
            phases.insert(0, ("searches on the sites' Ray workers (before)", False))
        raw = []
        for label, in_server in phases:
            for name, site in deployment.sites.items():
                site.servicer.local = here[name] if in_server else None
            load_before = os.getloadavg()[0]
            gc_before = len(timeline.gc_pauses)
            with CoordinatorClient(address) as client:
                pred = bench_prediction(client, cells, args.cases, servicer, args.verbose, timeline)
            report_prediction(f"{label}: ", args.cases, pred, load_before, timeline.gc_pauses[gc_before:])
            raw.append({"phase": label, "load_before": load_before, "load_after": os.getloadavg()[0],
                        "calls": pred["calls"], "cases": pred["cases"]})
    if args.json:
        Path(args.json).write_text(json.dumps(raw, indent=1))
    return 0


def report_prediction(label: str, cases: int, pred: dict, load_before: float, pauses: list[float]) -> None:
    """Section 3 of the report: the prediction errors side by side, and where the time went."""
    case, site = pred["case"], pred["site"]
    print(f"3. {label}predicted vs actual wait, {cases} sequential cases (classes and modes in turn): "
          f"MdAPE per case {100 * np.median(case):.1f}% (n={len(case)}), per site "
          f"{100 * np.median(site):.1f}% (n={len(site)}); p90 per case {100 * np.percentile(case, 90):.1f}%")
    md = lambda v: f"{100 * np.median(v):5.1f}%" if len(v) else "    -"  # noqa: E731
    print("   MdAPE side by side, same cases:   before (sum of parts)   now   hindsight constant")
    print(f"     per site (n={len(site):<3})                 {md(pred['site_before'])}        {md(site)}"
          f"        {md(pred['floor'])}")
    print(f"     per case (n={len(case):<3})                 {md(pred['case_before'])}        {md(case)}"
          f"        {md(pred['case_floor'])}")
    print("   (hindsight constant: per site (case) and mode, the median of its actual times, known only afterwards)")
    print(f"   load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after; {len(pauses)} garbage "
          f"collections in this process, {1000 * sum(pauses):.1f} ms in all, longest {1000 * max(pauses, default=0):.1f} ms")
    print("   per site, medians of predicted and actual parts:")
    print_breakdown(pred["rows"])
    print_parts(pred["calls"], pred["cases"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
