"""A whole PathMaster deployment on loopback in one process: sites + coordinator, one Ray.

`pathmaster demo` runs this with three sites named after the study's (Connecticut,
New York, California), each with its own synthetic database (its own seed, built on first
run and cached) and its own comparison algorithm; or, with `--data FOLDER`, with a real
dataset's cells dealt over the three sites slide by slide (`dataset_databases`), less the
slides of the demo case's real cells (`dataset_case`): no site holds a cell of the case, as
no site holds a new patient's. Tests and benchmarks start the same thing with smaller
databases.
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pathmaster.records import CellRecord
from services.config import CoordinatorConfig, SiteConfig, SiteEndpoint
from services.shared import COORDINATOR_PORT, DEMO_CELLS
from services.coordinator.analysis import ANALYSIS_READY_S
from services.coordinator.server import CASE_ID_KEY_FILE, CoordinatorServer
from services.ray_local import ensure_ray
from services.site.server import SiteServer
from services.synthetic import READY, build_synthetic_site, cache_root, is_current, ready_stamp

log = logging.getLogger("pathmaster.demo")


@dataclass(frozen=True)
class DemoSite:
    """A demo site: name, database seed, comparison algorithm ("flat", "ivf", "hnsw")."""

    name: str
    seed: int
    algorithm: str


DEMO_SITES = (
    DemoSite("connecticut", 1, "flat"),
    DemoSite("new-york", 2, "hnsw"),
    DemoSite("california", 3, "ivf"),
)
CASE_SEED = 2026  # the demo case's test cells; no site database uses this seed


def demo_databases(sites=DEMO_SITES, cells: int = DEMO_CELLS, cache: Path | None = None) -> dict[str, Path]:
    """{site name: database folder}, building the missing ones in parallel on Ray (the
    caller has connected to Ray). Cached under `cache` (default: cache_root()/demo)."""
    import ray

    cache = Path(cache) if cache else cache_root() / "demo"
    folders = {s.name: cache / f"{s.name}-seed{s.seed}-{cells}cells" for s in sites}
    build = ray.remote(num_cpus=1)(build_synthetic_site)
    missing = [s for s in sites if not is_current(folders[s.name])]
    if missing:
        print(f"building {len(missing)} synthetic site database(s) of {cells} cells in {cache} "
              "(first run only) ...", flush=True)
        ray.get([build.remote(folders[s.name], cells, s.seed, s.algorithm) for s in missing])
    return folders


def slide_of(source_id: str) -> str:
    """The slide a cell's file came from: its name without its last '-NNN' (Herlev's
    157181599-157181627-001.BMP is slide 157181599-157181627), else the whole name."""
    stem = Path(source_id).stem
    head, _, tail = stem.rpartition("-")
    return head if head and tail.isdigit() else stem


def dataset_case(folder: Path, cells: int, seed: int = CASE_SEED) -> tuple[list[dict], set[str]]:
    """The demo case of a real dataset: one abnormal cell of its most severe diagnosis and
    `cells` - 1 normal ones, each from a slide of its own, drawn with `seed`; as uploads
    (the image alone, PNG). Returns ([{"cell_id", "image", "background", "mask",
    "diagnosis"}], the case's slides, which no site database holds)."""
    import numpy as np

    from pathmaster.importers import default_vocabulary, iter_dataset
    from pathmaster.image.io import encode_png

    records = [r for r in iter_dataset(folder) if isinstance(r, CellRecord) and r.diagnosis]
    vocabulary = default_vocabulary(folder)
    abnormal = [label for label in vocabulary.labels if label in vocabulary.abnormal]
    rng = np.random.default_rng(seed)
    severe = [r for r in records if r.diagnosis == abnormal[-1]]
    normal_slides = sorted({slide_of(r.source_id) for r in records if r.diagnosis not in vocabulary.abnormal})
    chosen = [severe[rng.integers(len(severe))]]
    for slide in rng.permutation(normal_slides)[:cells - 1]:
        members = [r for r in records if slide_of(r.source_id) == slide and r.diagnosis not in vocabulary.abnormal]
        chosen.append(members[rng.integers(len(members))])
    order = rng.permutation(len(chosen))
    case = [{"cell_id": f"cell-{i + 1}.png", "image": encode_png(chosen[j].image), "background": b"", "mask": b"",
             "diagnosis": chosen[j].diagnosis} for i, j in enumerate(order)]
    return case, {slide_of(r.source_id) for r in chosen}


def dataset_databases(folder: Path, sites=DEMO_SITES, cache: Path | None = None,
                      held_out: frozenset[str] = frozenset()) -> dict[str, Path]:
    """{site name: database folder} of a real dataset's cells dealt over `sites`: whole
    slides (`slide_of`) in turn, so no slide is at two sites, as at real sites; the
    `held_out` slides at none. Indexed in parallel on Ray (the caller has connected to it),
    cached under `cache` (default cache_root()/demo) by the dataset's folder name; rebuilt
    unless current (is_current) and holding out the same slides."""
    import hashlib

    import ray

    from pathmaster.importers import iter_dataset

    folder = Path(folder)
    slides = sorted({slide_of(r.source_id) for r in iter_dataset(folder) if isinstance(r, CellRecord)} - held_out)
    site_of_slide = {slide: sites[i % len(sites)].name for i, slide in enumerate(slides)}
    cache = Path(cache) if cache else cache_root() / "demo"
    folders = {s.name: cache / f"{s.name}-{folder.name}" for s in sites}
    apart = "held_out=" + hashlib.sha256("\n".join(sorted(held_out)).encode()).hexdigest()[:16]
    missing = [s for s in sites if not is_current(folders[s.name])
               or apart not in (folders[s.name] / READY).read_text().split()]
    if missing:
        print(f"indexing {folder} dealt over {len(sites)} sites ({len(slides)} slides) in {cache} "
              "(first run only) ...", flush=True)
        build = ray.remote(num_cpus=1)(_index_share)
        ray.get([build.remote(folder, folders[s.name], s.name, s.algorithm, site_of_slide, apart) for s in missing])
    return folders


def _index_share(folder: Path, site_dir: Path, site: str, algorithm: str, site_of_slide: dict[str, str],
                 apart: str) -> None:
    """Index the cells of `folder` whose slide `site_of_slide` gives `site` into `site_dir`."""
    from pathmaster.importers import default_vocabulary, iter_dataset
    from pathmaster.site.ingest import ingest

    records = (r for r in iter_dataset(folder)
               if not isinstance(r, CellRecord) or site_of_slide.get(slide_of(r.source_id)) == site)
    site_dir = Path(site_dir)
    if site_dir.exists():  # unfinished, or built by other code
        shutil.rmtree(site_dir)
    ingest(folder, site_dir, records=records, algorithm=algorithm, vocabulary=default_vocabulary(folder))
    (site_dir / READY).write_text(f"{apart} " + ready_stamp(dataset=folder.name, site=site))


class LoopbackDeployment:
    """Sites and a coordinator on 127.0.0.1, all in this process, on one local Ray.

    databases: {site name: database folder}; algorithms: {site name: algorithm} ("" keeps
    each database's own). worker_cpus is small because several sites share one machine's Ray. `start()` then `.coordinator.address`; `stop()` ends everything
    (Ray stays connected for reuse).
    """

    def __init__(self, databases: dict[str, Path], algorithms: dict[str, str] | None = None, *,
                 coordinator_port: int = 0, metrics_port: int | None = 0, case_log: Path | None = None,
                 case_id_key: Path | None = None,
                 workers: int = 1, worker_cpus: float = 0.25, ray_address: str = "",
                 analysis_workers: int = 1):
        self.databases = databases
        self.algorithms = algorithms or {}
        self.coordinator_port = coordinator_port
        self.metrics_port = metrics_port
        self.case_log = case_log
        self.case_id_key = case_id_key  # the secret the case log's ids are keyed by (None: the default file)
        self.workers = workers
        self.worker_cpus = worker_cpus
        self.ray_address = ray_address
        self.analysis_workers = analysis_workers
        self.sites: dict[str, SiteServer] = {}
        self.coordinator: CoordinatorServer | None = None

    def start(self) -> "LoopbackDeployment":
        ensure_ray(self.ray_address)
        try:
            self._start_sites()
            metrics = "" if self.metrics_port is None else f"127.0.0.1:{self.metrics_port}"
            self.coordinator = CoordinatorServer(CoordinatorConfig(
                sites=[SiteEndpoint(name=name, address=site.address) for name, site in self.sites.items()],
                listen=f"127.0.0.1:{self.coordinator_port}", metrics=metrics, case_log=self.case_log,
                case_id_key=self.case_id_key,
                analysis_workers=self.analysis_workers,
            )).start()
            # Cases go as features only once the coordinator's analysers are up: wait, so
            # the first case behaves like every other.
            self.coordinator.wait_analysers(ANALYSIS_READY_S)
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sites(self) -> None:
        """Start every site side by side (most of a start is waiting for its Ray workers to
        load the database); the first error is raised once all have finished starting, and
        stop() then stops every site, started or not (a site's stop skips what it never made)."""
        self.sites = {name: SiteServer(SiteConfig(name=name, db=Path(db), algorithm=self.algorithms.get(name, ""),
                                                  workers=self.workers, worker_cpus=self.worker_cpus))
                      for name, db in self.databases.items()}
        with ThreadPoolExecutor(max_workers=len(self.sites) or 1, thread_name_prefix="site-start") as pool:
            starts = [pool.submit(site.start) for site in self.sites.values()]
        for start in starts:
            if start.exception() is not None:
                raise start.exception()

    def stop(self) -> None:
        if self.coordinator is not None:
            self.coordinator.stop(0.5)
            self.coordinator = None
        for site in self.sites.values():
            site.stop(0.5)
        self.sites.clear()

    def __enter__(self) -> "LoopbackDeployment":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def start_demo(cells: int = DEMO_CELLS, cache: Path | None = None, coordinator_port: int = COORDINATOR_PORT,
               metrics_port: int = 0, ray_address: str = "", data: Path | None = None,
               held_out: frozenset[str] = frozenset()) -> LoopbackDeployment:
    """Connect to Ray, build/reuse the three demo databases (synthetic, or `data` dealt over
    them less the `held_out` slides), start the deployment."""
    started = time.perf_counter()
    ensure_ray(ray_address)
    log.info("Ray ready in %.1f s", time.perf_counter() - started)
    folders = (dataset_databases(data, DEMO_SITES, cache, held_out) if data
               else demo_databases(DEMO_SITES, cells, cache))
    cache_dir = next(iter(folders.values())).parent
    return LoopbackDeployment(
        folders, {s.name: s.algorithm for s in DEMO_SITES}, coordinator_port=coordinator_port,
        metrics_port=metrics_port, case_log=cache_dir / "cases.jsonl", case_id_key=cache_dir / CASE_ID_KEY_FILE,
        ray_address=ray_address,
    ).start()
