"""Synthetic site databases for the demo, tests and benchmarks, built once and cached.

The same as `pathmaster synth --out D --cells N --seed S` followed by
`pathmaster index D --db SITE`, without writing the dataset's PNG files in between:
the generator's records go straight into the ingest.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from functools import lru_cache
from pathlib import Path

READY = "READY"  # written last: a folder without it is a build that did not finish


def cache_root() -> Path:
    """Where demo databases are cached: $PATHMASTER_CACHE or ~/.cache/pathmaster."""
    return Path(os.environ.get("PATHMASTER_CACHE", Path.home() / ".cache" / "pathmaster"))


# Libraries whose results a built site holds beyond its feature vectors: its search index
# and what it learnt from its cells.
BUILD_LIBRARIES = ("faiss-cpu", "scikit-learn")


@lru_cache(maxsize=1)
def builder_identity() -> str:
    """The identity of the code that builds a site: the syntax tree of every module of the
    pathmaster package (features, index, learning, the synthetic cells) and the versions of
    `BUILD_LIBRARIES`. A cached database built by other code is rebuilt: what a site learnt
    (its score, its threshold) is not covered by the feature schema."""
    import pathmaster
    from pathmaster.features.schema import code_digest, library_version

    package = Path(pathmaster.__file__).resolve().parent
    h = hashlib.sha256()
    for module in sorted(package.rglob("*.py")):
        h.update(module.relative_to(package).as_posix().encode())
        h.update(code_digest(module.read_text()).encode())
    for lib in BUILD_LIBRARIES:
        h.update(f"{lib}=={library_version(lib)}\n".encode())
    return h.hexdigest()[:16]


def ready_stamp(**about) -> str:
    """What a finished database's READY file says: what it holds (``about``, such as its
    size and seed), its feature schema and its builder (`builder_identity`), so a PathMaster
    whose features or site building differ rebuilds it instead of comparing unlike vectors
    or trusting another rule's threshold."""
    from pathmaster.features.schema import feature_schema

    held = "".join(f"{key}={value} " for key, value in about.items())
    return f"{held}schema={feature_schema()} builder={builder_identity()}\n"


def is_current(site_dir: str | Path) -> bool:
    """True when `site_dir` holds a finished build this PathMaster would make alike (same
    feature schema and builder); its size and seed are the caller's to name."""
    ready = Path(site_dir) / READY
    wanted = ready_stamp().split()
    return ready.is_file() and set(wanted) <= set(ready.read_text().split())


def build_synthetic_site(site_dir: str | Path, cells: int, seed: int, algorithm: str | None = None,
                         similarity: str | None = None) -> Path:
    """A site database of `cells` synthetic cells (diagnoses in turn) from `seed`, at `site_dir`,
    its search index built with `algorithm` ("flat", "ivf", "hnsw"; None: by size), comparing
    `similarity` (``pathmaster index --similarity``; None: the site's own choice).

    Reuses a finished database already there; removes and rebuilds an unfinished one.
    Returns the site folder.
    """
    from pathmaster.site.ingest import ingest
    from pathmaster.records import DIAGNOSES
    from pathmaster.image.synth import PIXEL_UM, cell_rng, synth_cell

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
    ingest(site_dir / f"synthetic-seed{seed}", site_dir, records=records, algorithm=algorithm, similarity=similarity,
           pixel_um=PIXEL_UM)
    (site_dir / READY).write_text(ready_stamp(cells=cells, seed=seed, similarity=similarity or "auto"))
    return site_dir


def synthetic_case_cells(count: int, seed: int) -> list[dict]:
    """`count` synthetic test cells as encoded PNG bytes: [{"cell_id", "image",
    "background", "mask", "diagnosis"}], from a seed no demo database uses."""
    from pathmaster.image.io import encode_png
    from pathmaster.records import DIAGNOSES
    from pathmaster.image.synth import cell_rng, synth_cell

    out = []
    for i in range(count):
        record = synth_cell(DIAGNOSES[i % len(DIAGNOSES)], cell_rng(seed, i))
        out.append({"cell_id": f"test-{seed}-{i}.png", "image": encode_png(record.image),
                    "background": encode_png(record.background), "mask": encode_png(record.mask),
                    "diagnosis": record.diagnosis})
    return out
