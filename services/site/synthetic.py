"""Synthetic site databases for the demo, tests and benchmarks, built once and cached.

The same as `pathmaster synth --out D --cells N --seed S` followed by
`pathmaster index D --db SITE`, without writing the dataset's PNG files in between:
the generator's records go straight into the ingest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

READY = "READY"  # written last: a folder without it is a build that did not finish


def cache_root() -> Path:
    """Where demo databases are cached: $PATHMASTER_CACHE or ~/.cache/pathmaster."""
    return Path(os.environ.get("PATHMASTER_CACHE", Path.home() / ".cache" / "pathmaster"))


def ready_stamp(cells: int, seed: int) -> str:
    """What a finished database's READY file says: its size, seed and feature schema, so a
    PathMaster whose features differ rebuilds it instead of comparing unlike vectors."""
    from pathmaster.features.schema import feature_schema

    return f"cells={cells} seed={seed} schema={feature_schema()}\n"


def is_current(site_dir: str | Path) -> bool:
    """True when `site_dir` holds a finished build whose vectors this PathMaster makes
    alike (same feature schema); its size and seed are the caller's to name."""
    ready = Path(site_dir) / READY
    schema = ready_stamp(0, 0).split()[-1]
    return ready.is_file() and schema in ready.read_text().split()


def build_synthetic_site(site_dir: str | Path, cells: int, seed: int, algorithm: str | None = None) -> Path:
    """A site database of `cells` synthetic cells (diagnoses in turn) from `seed`, at `site_dir`,
    its search index built with `algorithm` ("flat", "ivf", "hnsw"; None: by size).

    Reuses a finished database already there; removes and rebuilds an unfinished one.
    Returns the site folder.
    """
    from pathmaster.ingest import ingest
    from pathmaster.records import DIAGNOSES
    from pathmaster.synth import cell_rng, synth_cell

    site_dir = Path(site_dir)
    if is_current(site_dir):
        return site_dir  # built by this PathMaster: its vectors compare with ours
    if site_dir.exists():
        shutil.rmtree(site_dir)
    site_dir.parent.mkdir(parents=True, exist_ok=True)
    records = (
        synth_cell(DIAGNOSES[i % len(DIAGNOSES)], cell_rng(seed, i), source_id=f"synth-{seed}-{i:06d}")
        for i in range(cells)
    )
    ingest(site_dir / f"synthetic-seed{seed}", site_dir, records=records, algorithm=algorithm)
    (site_dir / READY).write_text(ready_stamp(cells, seed))
    return site_dir


def synthetic_case_cells(count: int, seed: int) -> list[dict]:
    """`count` synthetic test cells as encoded PNG bytes: [{"cell_id", "image",
    "background", "mask", "diagnosis"}], from a seed no demo database uses."""
    from pathmaster.imageio import encode_png
    from pathmaster.records import DIAGNOSES
    from pathmaster.synth import cell_rng, synth_cell

    out = []
    for i in range(count):
        record = synth_cell(DIAGNOSES[i % len(DIAGNOSES)], cell_rng(seed, i))
        out.append({"cell_id": f"test-{seed}-{i}.png", "image": encode_png(record.image),
                    "background": encode_png(record.background), "mask": encode_png(record.mask),
                    "diagnosis": record.diagnosis})
    return out
