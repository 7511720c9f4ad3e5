"""A site's archive at scale: parallel ingest, growing without a rebuild, a million cells served.

    python benchmarks/bench_archive.py                 # all parts (~15-30 min, ~4 GB RAM at peak)
    python benchmarks/bench_archive.py --quick         # smaller sizes (a few minutes)
    python benchmarks/bench_archive.py --parts ingest  # or nodes, growth, serve (comma-separated)

ingest: real synthetic cells (``pathmaster synth``) ingested by ``pathmaster.site.ingest.ingest``
with 1 worker (in process) and with 2 worker processes, alternating, each run into a new
site; medians of cells/s and their ratio. The workers' fork server, which imports the
analysis once per process (~1 s, what any ``pathmaster index`` run pays once whatever its
size), is started before the timed runs and its start-up printed apart; each run's pool
start (forking its workers) is timed in it. The one writer's
own cost per cell is timed apart (rows and PNGs of already analysed cells into SQLite): it
bounds what any number of workers can reach, and with the measured per-cell analysis cost
and the 2-worker scaling it projects 1M cells on 16 nodes x 16 cores.

nodes (root; skipped with the reason otherwise): the same cells ingested on a Ray cluster of
one node and of two, the nodes testbed namespaces on one LAN, each ``ray start --num-cpus 1``
pinned to one CPU (``services.experiment.ingest_nodes``); the driver runs in the head's
namespace on the head's CPU. Each run is a new driver: it connects, warms the cluster's worker
processes with one file a task (they import the analysis once a job; timed and printed
apart), then ``ingest(..., ray_address=...)`` times the cells; the two clusters alternate.
Medians of cells/s and their ratio.

growth: a 100,000-cell site (feature vectors synthetic: 7 classes of 130 correlated
values, rows without images: the index part only) indexed from scratch as ``pathmaster
index`` does (z-scores, the site's feature choice, FAISS), then 10,000 cells added
(``growth.update_search_index``: drift check, FAISS add), against indexing all 110,000
from scratch; both plus the analysis of their cells at the per-cell cost measured in
`ingest` give the whole commands' ratio. Checks the added site answers as a rebuild with
the same representation (same ids).

serve: a site of N synthetic-vector cells (1M by default) built and indexed by the same
path (IVF above 200k cells) in a fresh process (its wall and CPU time, every thread's, and
its peak RSS), opened in another as a site worker opens it; with --before COMMIT the same
rows are indexed by COMMIT's code too (exported with git archive), and the two sites are
opened alternately, each open a fresh process (--opens, 3 each; medians), side by side.
Opening: its time (the imports the open itself makes included: the queries are read from a
file, so nothing of the analysis is imported before it), the process's RSS growth from
opening it, per million cells, then with the analysis imported as a site worker does (the
image libraries, ~60 MiB whatever the cells), and the p50/p99 of one top-5
search (``SiteIndex.search``: z-scores, projection, FAISS on one thread, the matches)
over 2,000 queries, searched at niceness 0 as a served site runs (the benchmark's own nice
would measure the nice), each query's wall time beside its own thread's CPU time: on a
loaded machine the wall p99 is the wait for a core, the CPU p99 the work. FAISS alone is
timed the same way. Disk per cell of the database is printed too (vectors and rows only
here; the images' bytes per cell are measured in `ingest`). --serve-cells sets N (e.g.
300000 where 1M takes too long to build: the search's cost grows with nlist + nprobe x
N/nlist, about sqrt(N)).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from pathmaster.records import DIAGNOSES


def load() -> str:
    return f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


def cpu_seconds_used() -> float:
    """CPU seconds this process and its descendants used so far, ended ones included: the
    workers of a fork server count once it has reaped them, so this waits (up to 5 s) until
    the fork server's ended workers are gone. Linux /proc; a load-independent measure of
    the work an ingest did, beside its wall time."""
    import resource

    tick = os.sysconf("SC_CLK_TCK")
    total = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                for f in ("ru_utime", "ru_stime"))
    deadline = time.monotonic() + 5
    for child in _children(os.getpid()):
        while _children(child) and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(f"/proc/{child}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += sum(int(v) for v in fields[11:15]) / tick   # utime stime cutime cstime
    return total


# ---------------------------------------------------------------- ingest


def bench_ingest(tmp: Path, cells: int, repeats: int) -> dict:
    from pathmaster.site.ingest import ingest
    from pathmaster.image.synth import write_dataset

    dataset = write_dataset(tmp / "data", cells, seed=0)
    t0 = time.perf_counter()   # the fork server's one-off start: 4 files on 2 workers
    warm = ingest(write_dataset(tmp / "warm-data", 4, seed=1), tmp / "warm-site", workers=2, build_index=False)
    assert warm.added == 4, warm.problems
    start_s = time.perf_counter() - t0
    rates, cpu_ms = {1: [], 2: []}, {1: [], 2: []}
    for r in range(repeats):
        for workers in (1, 2) if r % 2 == 0 else (2, 1):   # alternate: both see the same load
            site = tmp / f"site-{workers}-{r}"
            cpu0 = cpu_seconds_used()
            report = ingest(dataset, site, workers=workers, build_index=False)
            cpu_ms[workers].append(1000 * (cpu_seconds_used() - cpu0) / cells)
            assert report.added == cells and not report.problems, report.problems
            rates[workers].append(cells / report.seconds)
            shutil.rmtree(site)
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    cpu_one, cpu_two = statistics.median(cpu_ms[1]), statistics.median(cpu_ms[2])
    writer_ms, writer_cpu_ms, bytes_per_cell = writer_cost(dataset, tmp)
    print(f"ingest of {cells} synthetic cells ({load()}): 1 process {one:.1f} cells/s, 2 processes "
          f"{two:.1f} cells/s: x{two / one:.2f} (target >= 1.8; runs {repeats} each, alternating)")
    print(f"  CPU time a cell, every process of the run (workers, writer): 1 process {cpu_one:.1f} ms, "
          f"2 processes {cpu_two:.1f} ms; with 2 idle cores 2 processes could reach at most "
          f"x{2 * cpu_one / cpu_two:.2f}")
    print(f"  one-off start of the workers' fork server (imports the analysis once a process; with "
          f"4 cells): {start_s:.1f} s, not in the runs above")
    print(f"  the one writer: {writer_ms:.2f} ms/cell wall, {writer_cpu_ms:.2f} ms CPU (rows + PNGs into SQLite) = at most "
          f"{1000 / writer_ms:.0f} cells/s whatever the workers; images {bytes_per_cell / 1024:.1f} KiB/cell")
    return {"one": one, "two": two, "writer_ms": writer_ms, "writer_cpu_ms": writer_cpu_ms, "bytes_per_cell": bytes_per_cell, "start_s": start_s,
            "cpu_ms": {"one": cpu_one, "two": cpu_two}}


def writer_cost(dataset: Path, tmp: Path, copies: int = 20) -> tuple[float, float, float]:
    """(wall ms per cell of the writer alone, its CPU ms per cell, stored image bytes per
    cell), from 50 analysed cells written `copies` times under new ids."""
    from dataclasses import replace

    from pathmaster.importers import iter_dataset
    from pathmaster.site.ingest import AnalysedCell, IngestReport, _Writer, analyse_units
    from pathmaster.site.database import SiteDB

    units = [u for _, u in zip(range(50), iter_dataset(dataset, unread=True))]
    cells = analyse_units(units, _vocabulary())
    with SiteDB(tmp / "writer", create=True) as db:
        writer = _Writer(db, IngestReport(), set(), 32)
        t0, c0 = time.perf_counter(), time.process_time()
        for c in range(copies):
            for cell in cells:
                row = replace(cell.row, cell_id=f"{c:04x}{cell.row.cell_id[4:]}", source_id=f"{c}/{cell.row.source_id}")
                writer.take(AnalysedCell(row, {f"{c}/{p}": b for p, b in cell.files.items()}))
        writer.commit()
        seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    size = sum(len(b) for cell in cells for b in cell.files.values()) / len(cells)
    return 1000 * seconds / (copies * len(cells)), 1000 * cpu_s / (copies * len(cells)), size


def _vocabulary():
    from pathmaster.vocabulary import BUILTIN, DEFAULT

    return BUILTIN[DEFAULT]


# ---------------------------------------------------------------- Ray nodes in namespaces


NODE_DRIVER = """
import json, os, sys, time
import ray
from pathmaster.site.ingest import ingest
from qos import netns
address, dataset, warm_dataset, site, warm_site, *namespaces = sys.argv[1:]
def cpu_s(namespace):   # CPU seconds of the processes in `namespace` now, this driver's left out
    tick, total = os.sysconf("SC_CLK_TCK"), 0.0
    for pid in set(netns.pids(namespace)) - {os.getpid()}:
        try:
            total += sum(int(v) for v in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[11:13]) / tick
        except OSError:
            pass
    return total
t0 = time.perf_counter()
ray.init(address=address, logging_level="warning", log_to_driver=False)
connect_s = time.perf_counter() - t0
t0 = time.perf_counter()
warm = ingest(warm_dataset, warm_site, ray_address=address, files_per_task=1, build_index=False)
warm_s = time.perf_counter() - t0
before, driver = {n: cpu_s(n) for n in namespaces}, time.process_time()
report = ingest(dataset, site, ray_address=address, build_index=False)
used = {n: cpu_s(n) - before[n] for n in namespaces}
print(json.dumps({"connect_s": connect_s, "warm_s": warm_s, "seconds": report.seconds, "added": report.added,
                  "problems": len(report.problems) + len(warm.problems), "workers": report.workers,
                  "node_cpu_s": used, "driver_cpu_s": time.process_time() - driver}))
"""


def nodes_unavailable() -> str | None:
    """Why the Ray-nodes part cannot run here, or None."""
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    missing = [tool for tool in ("ip", "taskset") if shutil.which(tool) is None]
    if missing:
        return f"{', '.join(missing)} not found"
    if len(os.sched_getaffinity(0)) < 2:
        return "needs two CPUs"
    return None


def bench_nodes(tmp: Path, cells: int, repeats: int) -> dict | None:
    reason = nodes_unavailable()
    if reason:
        print(f"nodes: skipped ({reason})")
        return None
    from pathmaster.image.synth import write_dataset
    from qos import netns
    from services.experiment.ingest_nodes import ingest_clusters

    dataset = write_dataset(tmp / "data", cells, seed=0)
    warm_data = write_dataset(tmp / "warm-data", 6, seed=1)
    rates, starts, cpu_ms = {"one": [], "two": []}, {"one": [], "two": []}, {"one": [], "two": []}
    t0 = time.perf_counter()
    with ingest_clusters(netns.new_tag("arc")) as clusters:
        up_s = time.perf_counter() - t0
        for r in range(repeats):
            for name in ("one", "two") if r % 2 == 0 else ("two", "one"):   # alternate: the same load
                cluster = clusters[name]
                jobs = cluster.worker_jobs(cluster.nodes[-1])
                done = cluster.driver(["-c", NODE_DRIVER, cluster.address, str(dataset), str(warm_data),
                                       str(tmp / f"site-{name}-{r}"), str(tmp / f"warm-{name}-{r}"),
                                       *[node.namespace for node in cluster.nodes]], timeout=1800)
                assert done.returncode == 0, done.stderr[-3000:]
                out = json.loads(done.stdout.splitlines()[-1])
                assert out["added"] == cells and not out["problems"] and out["workers"] == len(clusters[name].nodes), out
                assert len(cluster.nodes) == 1 or cluster.worker_jobs(cluster.nodes[-1]) - jobs, "no task on the worker node"
                rates[name].append(cells / out["seconds"])
                starts[name].append(out["connect_s"] + out["warm_s"])
                # CPU ms a cell on each CPU: the head's with the driver's, the worker node's
                on_cpu = [1000 * (cpu + (out["driver_cpu_s"] if i == 0 else 0)) / cells
                          for i, cpu in enumerate(out["node_cpu_s"].values())]
                cpu_ms[name].append(on_cpu)
                shutil.rmtree(tmp / f"site-{name}-{r}")
    one, two = statistics.median(rates["one"]), statistics.median(rates["two"])
    print(f"ingest on Ray nodes in namespaces, one CPU each, {cells} synthetic cells ({load()}): 1 node "
          f"{one:.1f} cells/s, 2 nodes {two:.1f} cells/s: x{two / one:.2f} (target >= 1.8; runs {repeats} each, "
          f"alternating)")
    print(f"  each run's start (connect, warm the workers: one file on each): 1 node "
          f"{statistics.median(starts['one']):.1f} s, 2 nodes {statistics.median(starts['two']):.1f} s, not in the "
          f"rates above; both clusters up in {up_s:.0f} s")
    per_cpu = {name: [statistics.median(run[i] for run in runs) for i in range(len(runs[0]))]
               for name, runs in cpu_ms.items()}
    bound = 2 * sum(per_cpu["one"]) / sum(per_cpu["two"])   # tasks go to whichever CPU is free
    print(f"  CPU time a cell on each node's CPU (all its processes: Ray's daemons, idle ones too, and workers, "
          f"any started during the run included; the driver's on the head's): 1 node "
          f"{per_cpu['one'][0]:.1f} ms; 2 nodes {per_cpu['two'][0]:.1f} ms (head) + {per_cpu['two'][1]:.1f} ms "
          f"(worker node; the split follows which CPU was free); with both CPUs idle 2 nodes could reach at most "
          f"x{bound:.2f}")
    return {"one": one, "two": two, "start_s": {k: statistics.median(v) for k, v in starts.items()},
            "cpu_ms": per_cpu, "bound": bound}


# ---------------------------------------------------------------- synthetic-vector sites


def feature_rows(n: int, seed: int, start: int = 0) -> tuple[np.ndarray, list[str]]:
    """n raw feature vectors (float64, 130 values) in 7 classes, and their diagnoses."""
    from pathmaster.features import feature_names

    d = len(feature_names())
    rng = np.random.default_rng(1000)   # the same classes for every call
    mixing = rng.normal(0, 1 / 4, size=(16, d))
    centres = rng.normal(0, 1.5, size=(len(DIAGNOSES), 16))
    scale = np.exp(rng.normal(0, 2, size=d))   # raw features in many units
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, len(DIAGNOSES), n)
    latent = centres[labels] + rng.normal(0, 0.8, size=(n, 16))
    X = (latent @ mixing + rng.normal(0, 0.2, size=(n, d))) * scale + 10 * scale
    return X, [DIAGNOSES[i] for i in labels]


def add_vector_cells(db, n: int, seed: int, start: int) -> None:
    """n rows with synthetic features (no image files: the index part only), committed."""
    from pathmaster.site.database import CellRow

    for begin in range(0, n, 50_000):
        m = min(50_000, n - begin)
        X, labels = feature_rows(m, seed + begin, start + begin)
        with db.transaction():
            for i in range(m):
                cid = f"{start + begin + i:016x}"
                db.add_cell(CellRow(cid, f"v/{start + begin + i}", labels[i], "vectors", f"v/{cid}.png",
                                    f"v/{cid}-t.png", None, None, False, False, X[i]))


def new_vector_site(path: Path, n: int, seed: int = 0):
    from pathmaster.features import feature_names
    from pathmaster.site.database import SiteDB

    db = SiteDB(path, create=True)
    db.set_config("feature_names", list(feature_names()))
    db.set_config("vocabulary", _vocabulary().as_dict())
    # Its cells are vectors without images: it compares features (nothing to learn a network from).
    db.set_config("index_options", {"algorithm": "auto", "features": "auto", "similarity": "features"})
    add_vector_cells(db, n, seed, 0)
    return db


# ---------------------------------------------------------------- growth


def bench_growth(tmp: Path, base: int, added: int, per_cell_s: float | None) -> dict:
    from pathmaster.site.growth import representation, update_search_index
    from pathmaster.site.index import build_search_index

    with new_vector_site(tmp / "grown", base) as db:
        build_search_index(db)
        fitted = db.get_config("index")
        add_vector_cells(db, added, seed=7, start=base)
        t0 = time.perf_counter()
        config = update_search_index(db)
        add_s = time.perf_counter() - t0
    assert representation(config)["id"] == representation(fitted)["id"], "the representation was re-learnt"
    shutil.copytree(tmp / "grown", tmp / "scratch")
    from pathmaster.site.database import SiteDB

    with SiteDB(tmp / "scratch") as db:   # the same 110k cells, indexed from scratch
        db.set_config("index", None)
        t0 = time.perf_counter()
        build_search_index(db)
        scratch_s = time.perf_counter() - t0
    same = same_answers(tmp / "grown", config)
    print(f"growth ({load()}): adding {added:,} cells to a {base:,}-cell site {add_s:.1f} s; indexing the "
          f"{base + added:,} from scratch {scratch_s:.1f} s: {100 * add_s / scratch_s:.1f}% (index part, "
          f"synthetic vectors); answers equal to a rebuild with the same representation: {same}")
    out = {"add_s": add_s, "scratch_s": scratch_s, "same": same}
    if per_cell_s:
        whole_add, whole_scratch = added * per_cell_s + add_s, (base + added) * per_cell_s + scratch_s
        print(f"  with each cell's analysis at the measured {1000 * per_cell_s:.0f} ms/cell (one core): "
              f"{100 * whole_add / whole_scratch:.1f}% (target <= 10%)")
        out["whole_ratio"] = whole_add / whole_scratch
    return out


def same_answers(site_dir: Path, config: dict, queries: int = 200) -> bool:
    """Top-5 ids of the grown site's FAISS index == those of one rebuilt from its stored vectors."""
    from pathmaster.learning import similarity
    from pathmaster.site import faiss_index
    from pathmaster.site.index import read_index_file, stored_vectors
    from pathmaster.site.database import SiteDB

    with SiteDB(site_dir) as db:
        grown = read_index_file(site_dir, config)
        vectors = stored_vectors(db, config)
    rebuilt = faiss_index.build_index(vectors, config["algorithm"])
    X, _ = feature_rows(queries, seed=99)
    q = similarity.Projection.from_dict(config["projection"]).apply(
        similarity.Normalization.from_dict(config["normalization"]).apply(X))
    return bool(np.array_equal(faiss_index.search(grown, q, 5)[1], faiss_index.search(rebuilt, q, 5)[1]))


# ---------------------------------------------------------------- serve


SERVE = """
import gc, json, sys, time
import numpy as np
def rss():
    return int(next(l for l in open('/proc/self/status') if l.startswith('VmRSS')).split()[1]) * 1024
import faiss
faiss.omp_set_num_threads(1)
from pathmaster.site.search import SiteIndex
queries = np.load(sys.argv[2])   # made by the parent: nothing of the analysis imported before the open
before = rss()
t0, c0 = time.perf_counter(), time.process_time()
site = SiteIndex.open(sys.argv[1])
open_s, open_cpu_s = time.perf_counter() - t0, time.process_time() - c0
after = rss()
image_libraries = sorted(m for m in ("skimage", "cv2", "mahotas") if m in sys.modules)
import pathmaster.features.extract, pathmaster.image.segmentation   # what a site worker imports to analyse uploads
served = rss()
def timed(call, items):
    wall, cpu = [], []
    for item in items:
        t0, c0 = time.perf_counter(), time.thread_time()
        call(item)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    return {f"{what}_{p}_ms": 1e3 * float(np.percentile(v, int(p[1:]))) for what, v in (("wall", wall), ("cpu", cpu))
            for p in ("p50", "p99")}
import os
try:   # opened at the benchmark's niceness; searched at a served site's (0), where permitted
    os.setpriority(os.PRIO_PROCESS, 0, 0)
except PermissionError:
    pass
nice = os.getpriority(os.PRIO_PROCESS, 0)
gen2 = gc.get_stats()[2]["collections"]
whole = timed(lambda q: site.search(q, k=5), queries)
gen2 = gc.get_stats()[2]["collections"] - gen2
vectors = site._vectors(queries, None)
alone = timed(lambda v: site._index.search(v[None, :], 5), vectors)
print(json.dumps({"rss_bytes": after - before, "served_rss_bytes": served - before, "image_libraries": image_libraries,
                  "open_s": open_s, "open_cpu_s": open_cpu_s, "cells": len(site), "algorithm": site.algorithm,
                  "search": whole, "faiss": alone, "full_collections": gen2, "nice": nice, "tracked_objects": len(gc.get_objects()),
                  "p50_ms": whole["wall_p50_ms"], "p99_ms": whole["wall_p99_ms"]}))
"""


ANSWERS = """
import hashlib, json, sys
import numpy as np
from pathmaster.site.search import SiteIndex
rows = SiteIndex.open(sys.argv[1]).search_many(np.load(sys.argv[2])[:int(sys.argv[3])], k=5)
answers = [[(m.cell_id, m.diagnosis, m.distance, m.source_id) for m in row] for row in rows]
print(json.dumps({"sha256": hashlib.sha256(repr(answers).encode()).hexdigest(), "matches": sum(map(len, rows))}))
"""


INDEX = """
import json, resource, sys, time
from pathmaster.site.index import build_search_index
from pathmaster.site.database import SiteDB
with SiteDB(sys.argv[1]) as db:
    t0, c0 = time.perf_counter(), time.process_time()
    config = build_search_index(db)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"index_s": wall, "index_cpu_s": cpu, "algorithm": config["algorithm"], "nprobe": config.get("nprobe"),
                  "recall_at_5": config.get("recall_at_5", 1.0),
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def code_tree(tmp: Path, commit: str | None) -> Path:
    """The source tree to run: this checkout, or `commit` exported (``git archive``) under `tmp`."""
    repo = Path(__file__).resolve().parents[1]
    if commit is None:
        return repo
    tree = tmp / f"tree-{commit}"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    return tree


def run_in(tree: Path, script: str, *args: str, timeout: int = 7200) -> dict:
    """Run `script` with the code of `tree` in a fresh process; its last line, parsed."""
    script = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import old_layout; " \
             f"old_layout.install()\n{script}"  # this tree's names in a tree from before the core's rooms
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def bench_serve(tmp: Path, cells: int, queries: int = 2000, before: str | None = None, opens: int = 3) -> dict:
    """The rows written once; each tree (``--before`` COMMIT's, then this one's) indexes a copy
    in a fresh process; then each copy is opened and searched `opens` times, each time in a
    fresh process, the trees alternating (both see the same load); medians over the opens."""
    t0 = time.perf_counter()
    with new_vector_site(tmp / "rows", cells):
        rows_s = time.perf_counter() - t0
    query_file = tmp / "queries.npy"
    np.save(query_file, feature_rows(queries, seed=123)[0])
    print(f"serve: a {cells:,}-cell site's rows written in {rows_s:.0f} s ({load()})")
    trees = {**({f"before ({before})": code_tree(tmp, before)} if before else {}), "this tree": code_tree(tmp, None)}
    built, runs = {}, {name: [] for name in trees}
    for i, (name, tree) in enumerate(trees.items()):
        site = tmp / f"site-{i}"
        shutil.copytree(tmp / "rows", site)
        built[name] = {**run_in(tree, INDEX, str(site)), "rows_s": rows_s,
                       "disk_per_cell": sum(p.stat().st_size for p in site.iterdir() if p.is_file()) / cells}
    shutil.rmtree(tmp / "rows")
    for r in range(opens):
        for i, (name, tree) in enumerate(trees.items() if r % 2 == 0 else reversed(trees.items())):
            runs[name].append(run_in(tree, SERVE, str(tmp / f"site-{list(trees).index(name)}"), str(query_file)))
    results = {}
    if before:   # the same site (the first tree's) asked the same queries by each tree's code
        answers = {name: run_in(tree, ANSWERS, str(tmp / "site-0"), str(query_file), "500") for name, tree in trees.items()}
        results["answers_identical"] = len({a["sha256"] for a in answers.values()}) == 1
        print(f"  the first site's top-5 answers to 500 queries (ids, diagnoses, distances, source ids; "
              f"{next(iter(answers.values()))['matches']} matches) by each tree's code identical: "
              f"{results['answers_identical']}")
    for name in trees:
        out = median_run(runs[name])
        results[name] = out = {**out, **built[name], "rss_per_million": out["rss_bytes"] * 1e6 / cells,
                               "served_rss_per_million": out["served_rss_bytes"] * 1e6 / cells, "opens": runs[name]}
        print_serve(name, cells, queries, out)
    if before:
        old, new = results[f"before ({before})"], results["this tree"]
        print(f"  this tree / before: indexed x{new['index_s'] / old['index_s']:.2f} wall, "
              f"x{new['index_cpu_s'] / old['index_cpu_s']:.2f} CPU; opened x{new['open_s'] / old['open_s']:.2f} wall, "
              f"x{new['open_cpu_s'] / old['open_cpu_s']:.2f} CPU; RSS from opening x{new['rss_bytes'] / old['rss_bytes']:.2f}, "
              f"with the analysis imported x{new['served_rss_bytes'] / old['served_rss_bytes']:.2f}; search p99 wall "
              f"x{new['search']['wall_p99_ms'] / old['search']['wall_p99_ms']:.2f}, CPU "
              f"x{new['search']['cpu_p99_ms'] / old['search']['cpu_p99_ms']:.2f} (medians of {opens} opens each)")
    return results


def median_run(runs: list[dict]) -> dict:
    """Each number of the runs' results (nested one level too) as its median; the rest from the first."""
    def merged(values: list):
        if isinstance(values[0], dict):
            return {k: merged([v[k] for v in values]) for k in values[0]}
        if isinstance(values[0], int) and not isinstance(values[0], bool):
            return statistics.median_low(values)
        if isinstance(values[0], float):
            return statistics.median(values)
        return values[0]
    return merged(runs)


def print_serve(name: str, cells: int, queries: int, out: dict) -> None:
    print(f"{name}: {cells:,} cells ({load()}): indexed in {out['index_s']:.0f} s wall, {out['index_cpu_s']:.0f} s CPU "
          f"(every thread), peak RSS {out['peak_rss_bytes'] / 2**30:.2f} GiB ({out['algorithm']}, nprobe "
          f"{out['nprobe'] or '-'}, recall@5 {out['recall_at_5']:.3f}); disk {out['disk_per_cell']:.0f} B/cell "
          f"(vectors and rows); opened in a fresh process in {out['open_s']:.1f} s wall, {out['open_cpu_s']:.1f} s CPU "
          f"(image libraries loaded by the open: {', '.join(out['image_libraries']) or 'none'})")
    w, f = out["search"], out["faiss"]
    print(f"  top-5 search (SiteIndex.search): p50 {w['wall_p50_ms']:.2f} ms, p99 {w['wall_p99_ms']:.2f} ms wall "
          f"(target p99 <= 5 ms) over {queries} queries at nice {out['nice']}; its own CPU time p50 {w['cpu_p50_ms']:.2f} ms, p99 "
          f"{w['cpu_p99_ms']:.2f} ms (wall minus CPU: waiting for a core); full GC passes during them: "
          f"{out['full_collections']} ({out['tracked_objects']:,} objects tracked)")
    print(f"  of which FAISS alone: p50 {f['wall_p50_ms']:.2f} ms, p99 {f['wall_p99_ms']:.2f} ms wall; CPU p50 "
          f"{f['cpu_p50_ms']:.2f} ms, p99 {f['cpu_p99_ms']:.2f} ms")
    print(f"  serve-time RSS from opening {out['rss_bytes'] / 2**20:.0f} MiB = {out['rss_per_million'] / 2**30:.2f} GiB "
          f"per million cells{'' if cells >= 1e6 else ' (extrapolated linearly)'}; with the analysis imported too (what a "
          f"site worker holds; its libraries ~60 MiB whatever the cells) {out['served_rss_bytes'] / 2**20:.0f} MiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="60 cells ingested, a 20k+2k growth, a 200k-cell site")
    parser.add_argument("--parts", default="ingest,nodes,growth,serve")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--serve-cells", type=int, help="cells of the served site (default 1M; 200k with --quick)")
    parser.add_argument("--opens", type=int, default=3, help="serve: fresh-process opens of each site (medians)")
    parser.add_argument("--before", metavar="COMMIT", help="serve: index and open the same rows with COMMIT's code "
                        "too (exported with git archive), before this tree's, side by side")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    ingest_cells, base, added, served = (60, 20_000, 2_000, 200_000) if args.quick else (320, 100_000, 10_000, 1_000_000)
    print(f"{load()} at start; timings from this run only, side by side")
    with tempfile.TemporaryDirectory(prefix="pm-bench-archive-") as tmp:
        results = {}
        if "ingest" in parts:
            results["ingest"] = r = bench_ingest(Path(tmp) / "ingest", ingest_cells, args.repeats)
            cores, nodes = 16, 16
            efficiency = r["two"] / (2 * r["one"])
            hours = 1e6 / min(r["one"] * cores * nodes * efficiency, 1000 / r["writer_ms"]) / 3600
            print(f"  projected: 1M cells on {nodes} nodes x {cores} cores at {r['one']:.1f} cells/s a core and the "
                  f"measured 2-core efficiency {efficiency:.2f}: {hours * 60:.0f} min (bounded by the writer's "
                  f"{1000 / r['writer_ms']:.0f} cells/s: {1e6 * r['writer_ms'] / 1000 / 60:.0f} min)")
        if "nodes" in parts:
            results["nodes"] = bench_nodes(Path(tmp) / "nodes", ingest_cells, args.repeats)
        if "growth" in parts:
            per_cell = 1 / results["ingest"]["one"] if "ingest" in results else None
            results["growth"] = bench_growth(Path(tmp) / "growth", base, added, per_cell)
            shutil.rmtree(Path(tmp) / "growth")
        if "serve" in parts:
            results["serve"] = bench_serve(Path(tmp) / "serve", args.serve_cells or served, before=args.before,
                                           opens=args.opens)
        print(json.dumps(results, default=float))
    print(f"{load()} at end")


if __name__ == "__main__":
    main()
