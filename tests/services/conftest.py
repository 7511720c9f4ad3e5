"""Fixtures for the services tests: one small site database, one deployment (on the
session's one Ray, ray_session in tests/conftest.py).

Kept small for the test budget: one 70-cell synthetic database is built once (cached)
and copied for each site (the sites differ by name and comparison algorithm).
"""

from __future__ import annotations

import contextlib
import io
import shutil
import struct
import tempfile
import zlib
from pathlib import Path

import numpy as np
import grpc
import pytest
from PIL import Image

from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

SITE_CELLS = 70
SITES = {"alpha": "flat", "beta": "hnsw", "gamma": "flat"}


class CallFailed(grpc.RpcError):
    """A gRPC call's failure as a fake site returns it: a status code and its details."""

    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


def cached_synthetic_site(cells: int, seed: int) -> Path:
    """A `cells`-cell synthetic site database (`seed`) in the cache, built once per machine
    and builder (is_current: feature schema and site-building code): cache_root()/test-services/site-seedSEED-CELLScells.
    It compares its features alone (``similarity="features"``): the services' tests are of
    the transport, features mode and the feature subsets; sites that look through their
    eye are served in test_learnt_site.py, test_readme.py and the demo's tests.

    Its ingest is the costliest set-up here (~6 s of CPU for 70 cells; ~10 s of wall time on
    the CI machine, ~30 s when loaded), and its cells depend only on the seed. The build goes
    to a private folder that is renamed into place, so sessions running side by side never
    see half a database. Callers copy it (shutil.copytree) before using it, so that what a
    test writes stays out of the cache.
    """
    from services.synthetic import build_synthetic_site, cache_root, is_current

    cached = cache_root() / "test-services" / f"site-seed{seed}-{cells}cells-features"
    if not is_current(cached):
        cached.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=cached.parent))
        build_synthetic_site(building / "site", cells, seed=seed, similarity="features")
        if cached.exists() and not is_current(cached):  # another builder's build
            shutil.rmtree(cached, ignore_errors=True)
        with contextlib.suppress(OSError):  # another session renamed its build first: theirs is as good
            (building / "site").rename(cached)
        shutil.rmtree(building, ignore_errors=True)
    return cached


@pytest.fixture(scope="session")
def site_db(tmp_path_factory) -> Path:
    """A 70-cell synthetic site database (seed 1), this session's own copy of the cached
    one (cached_synthetic_site), as tests/clients does."""
    cached = cached_synthetic_site(SITE_CELLS, seed=1)
    return Path(shutil.copytree(cached, tmp_path_factory.mktemp("sitedb") / "site"))


@pytest.fixture(scope="session")
def site_dbs(site_db, tmp_path_factory) -> dict[str, Path]:
    """{site name: its own copy of the database}."""
    root = tmp_path_factory.mktemp("sites")
    return {name: Path(shutil.copytree(site_db, root / name)) for name in SITES}


@pytest.fixture(scope="session")
def deployment(ray_session, site_dbs, tmp_path_factory):
    """Three sites (alpha flat, beta hnsw, gamma flat) and a coordinator on loopback, on the
    session's Ray: stopped when it ends, started again with it (tests/conftest.py)."""
    from services.demo import LoopbackDeployment
    from tests.conftest import running_on_ray

    log = tmp_path_factory.mktemp("coordinator") / "cases.jsonl"
    with running_on_ray(LoopbackDeployment(site_dbs, SITES, case_log=log)) as running:
        yield running


@pytest.fixture(scope="session")
def case_cells() -> list[dict]:
    """Six synthetic test cells (encoded PNG parts, with their true diagnosis)."""
    from services.synthetic import synthetic_case_cells

    return synthetic_case_cells(6, seed=2026)


def as_case(cells: list[dict], with_parts: bool = True) -> list[pb.CellImage]:
    """CellImages from synthetic_case_cells() dicts (background and mask when with_parts)."""
    parts = ("image", "background", "mask") if with_parts else ("image",)
    return [pb.CellImage(cell_id=c["cell_id"], **{p: c[p] for p in parts}) for c in cells]


def large_cell(cells: list[dict], side: int) -> bytes:
    """A test cell scaled up to side x side pixels with mild noise, as PNG: slower to analyse."""
    from pathmaster.image.io import decode_image, encode_png

    image = decode_image(cells[3]["image"], "cell")
    big = np.asarray(Image.fromarray(image).resize((side, side), Image.BILINEAR)).astype(np.int16)
    noise = np.random.default_rng(side).integers(-4, 5, big.shape)
    return encode_png(np.clip(big + noise, 0, 255).astype(np.uint8), compress_level=1)


def padded_png(png: bytes, total_bytes: int) -> bytes:
    """`png` grown to `total_bytes` with a private ancillary chunk ("prVt"), as microscope
    software stores vendor data: a file that big, whatever its pixel count. Decoders skip it."""
    end = png.rindex(b"IEND") - 4  # the IEND chunk's length field
    filler = total_bytes - len(png) - 12
    data = np.random.default_rng(0).integers(0, 256, filler, dtype=np.uint8).tobytes()
    chunk = struct.pack(">I", filler) + b"prVt" + data
    chunk += struct.pack(">I", zlib.crc32(b"prVt" + data) & 0xFFFFFFFF)
    out = png[:end] + chunk + png[end:]
    Image.open(io.BytesIO(out)).load()  # still a valid PNG
    return out


@pytest.fixture(scope="session")
def case(case_cells) -> list[pb.CellImage]:
    """The six test cells as CellImages, each with its background and mask."""
    return as_case(case_cells)


@pytest.fixture(scope="session")
def slow_case(case_cells) -> list[pb.CellImage]:
    """Six 800 x 800-pixel cells, ~0.3 s of CPU each: seconds of work per site, for faults in
    mid-case, however idle the machine (250 px cells take ~0.035 s each since the analysis
    was sped up: a site with the CPU to itself finished them before a test's kill or second case
    arrived)."""
    png = large_cell(case_cells, 800)
    return [pb.CellImage(cell_id=f"large-{i}.png", image=png) for i in range(6)]


@pytest.fixture(scope="session")
def ten_mb_png(case_cells) -> bytes:
    """A 10 MB PNG file of one test cell (padded with vendor data)."""
    return padded_png(case_cells[0]["image"], 10 * 1024 * 1024)
