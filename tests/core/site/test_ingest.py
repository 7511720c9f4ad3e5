"""Ingest: idempotent, crash-safe (kill -9 mid-run, then re-run), bad cells reported, nothing lost."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time

import numpy as np
import pytest

from pathmaster.site.ingest import ingest
from pathmaster.records import DIAGNOSES
from pathmaster.site.database import SiteDB
from pathmaster.image.synth import cell_rng, synth_cell, write_dataset


def synthetic_records(n, seed=11, start=0):
    return [synth_cell(DIAGNOSES[i % len(DIAGNOSES)], cell_rng(seed, i), source_id=f"synth/{seed}/{i}")
            for i in range(start, start + n)]


def test_rerunning_an_ingest_adds_nothing_twice(tmp_path):
    records = synthetic_records(12)
    first = ingest("synthetic", tmp_path, records=records[:8], build_index=False)
    second = ingest("synthetic", tmp_path, records=records, build_index=False)
    assert (first.added, second.added, second.skipped) == (8, 4, 8)
    with SiteDB(tmp_path) as db:
        assert len(db) == 12 and db.check() == []
        assert sorted(db.source_ids()) == sorted(r.source_id for r in records)


def test_bad_cells_are_reported_by_name_and_the_rest_is_ingested(tmp_path):
    good = synthetic_records(6)
    no_nucleus = synthetic_records(1, start=6)[0]
    no_nucleus.mask = np.where(no_nucleus.mask >= 2, 1, no_nucleus.mask).astype(np.uint8)
    wrong_size = synthetic_records(1, start=7)[0]
    wrong_size.mask = wrong_size.mask[:-3]
    report = ingest("synthetic", tmp_path, records=[good[0], no_nucleus, *good[1:3], wrong_size, *good[3:]],
                    build_index=False)
    assert report.added == 6
    problems = dict(report.problems)
    assert "no nucleus" in problems[no_nucleus.source_id]
    assert "mask is" in problems[wrong_size.source_id] and "pixels" in problems[wrong_size.source_id]
    with SiteDB(tmp_path) as db:
        assert dict(db.problems()) == problems
        assert len(db) == 6
    # the user fixes one file and runs again: it goes in and its problem is cleared
    fixed = synthetic_records(1, start=7)[0]
    again = ingest("synthetic", tmp_path, records=[*good, fixed], build_index=False)
    assert (again.added, again.skipped) == (1, 6)
    with SiteDB(tmp_path) as db:
        assert [source for source, _ in db.problems()] == [no_nucleus.source_id]


def _committed(db_path) -> int:
    try:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5) as conn:
            return conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def test_killed_ingest_leaves_a_consistent_database_and_rerun_completes_it(tmp_path):
    n = 24
    dataset = write_dataset(tmp_path / "data", n, seed=5)
    site = tmp_path / "site"
    child = subprocess.Popen([sys.executable, "-m", "pathmaster", "index", str(dataset), "--db", str(site),
                              "--quiet", "--batch-size", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 90
    try:
        while _committed(site / "site.sqlite") < 6:
            assert child.poll() is None, f"ingest ended before it could be killed: {child.stderr.read().decode()}"
            assert time.monotonic() < deadline, "ingest made no progress in 90 s"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    with SiteDB(site) as db:
        survived = len(db)
        assert 6 <= survived < n
        assert db.check() == []  # every row's files exist, every vector has its full length
        assert db.get_config("index") is None  # the killed run never reached the index step
    report = ingest(dataset, site)  # the same command again
    assert report.skipped == survived and report.added == n - survived and not report.problems
    with SiteDB(site) as db:
        assert len(db) == n and db.check() == []
        assert db.get_config("index")["fingerprint"] == db.fingerprint()
    assert list(site.rglob("*.tmp")) == []  # a half-written file of the killed run is cleaned up


def test_ingest_stores_group_and_image_hash_and_fills_them_in_on_a_rerun(tmp_path):
    from pathmaster.site.database import image_hash

    records = synthetic_records(3)
    for number, record in enumerate(records):
        record.group = f"slide-{number // 2}"
    ingest("synthetic", tmp_path, records=records, build_index=False)
    with SiteDB(tmp_path) as db:
        assert [c.group for c in db.cells()] == ["slide-0", "slide-0", "slide-1"]
        assert [c.image_hash for c in db.cells()] == [image_hash(r.image) for r in records]
        db.conn.execute("UPDATE cells SET group_id = NULL, image_hash = NULL")  # as a migrated database
    again = ingest("synthetic", tmp_path, records=records, build_index=False)
    assert (again.added, again.skipped) == (0, 3)
    with SiteDB(tmp_path) as db:
        assert [c.group for c in db.cells()] == ["slide-0", "slide-0", "slide-1"]
        assert db.cells_with_hash(image_hash(records[2].image)) == [db.cells()[2].cell_id]


def site_rows(site) -> list[tuple]:
    """Every cell row of a site, in row order, with its files' bytes and its features."""
    with SiteDB(site) as db:
        rows = []
        for cell in db.cells():
            files = tuple(db.read_file(p) for p in (cell.image_path, cell.thumbnail_path,
                                                     cell.mask_path, cell.background_path))
            rows.append((cell.cell_id, cell.source_id, cell.diagnosis, cell.mask_estimated,
                         cell.background_estimated, db.cell(cell.cell_id).features.tobytes(), files))
        return rows


def test_parallel_ingest_equals_serial_ingest_cell_for_cell(tmp_path):
    dataset = write_dataset(tmp_path / "data", 21, seed=8)
    serial = ingest(dataset, tmp_path / "serial", workers=1, build_index=False)
    parallel = ingest(dataset, tmp_path / "parallel", workers=2, files_per_task=2, build_index=False)
    assert (serial.added, parallel.added) == (21, 21) and serial.problems == parallel.problems == []
    assert parallel.workers == 2
    assert site_rows(tmp_path / "parallel") == site_rows(tmp_path / "serial")   # same rows, same order, same bytes
    with SiteDB(tmp_path / "serial") as a, SiteDB(tmp_path / "parallel") as b:
        assert a.fingerprint() == b.fingerprint()


@pytest.mark.parametrize("files, workers", [(160, 2), (7, 2), (1000, 16), (33, 1)])
def test_tasks_shrink_toward_one_file_at_the_end_and_hand_out_every_file(files, workers):
    from pathmaster.site.ingest import FILES_PER_TASK, task_size

    sizes, remaining = [], files
    while remaining:
        sizes.append(task_size(remaining, workers))
        remaining -= sizes[-1]
    assert sum(sizes) == files and max(sizes) <= FILES_PER_TASK
    assert sizes == sorted(sizes, reverse=True) and sizes[-1] == 1
    assert task_size(None, workers) == FILES_PER_TASK


def test_a_file_that_crashes_its_worker_is_reported_by_name_and_the_rest_goes_in(tmp_path):
    from pathmaster.importers import Unread

    records = synthetic_records(7)
    crasher = Unread("slides/boom.png", None, os._exit, (3,))   # its reading kills the process
    report = ingest("synthetic", tmp_path, records=[*records[:3], crasher, *records[3:]], workers=2,
                    files_per_task=3, build_index=False)
    assert report.added == 7
    assert [source for source, _ in report.problems] == ["slides/boom.png"]
    with SiteDB(tmp_path) as db:
        assert [source for source, _ in db.problems()] == ["slides/boom.png"]
        assert sorted(db.source_ids()) == sorted(r.source_id for r in records)


def _children(pid: int) -> set[int]:
    """Every descendant of `pid` alive now."""
    found, frontier = set(), [pid]
    while frontier:
        parent = frontier.pop()
        try:
            kids = {int(p) for t in os.listdir(f"/proc/{parent}/task")
                    for p in open(f"/proc/{parent}/task/{t}/children").read().split()}
        except OSError:
            continue
        frontier += list(kids - found)
        found |= kids
    return found


def test_killed_parallel_ingest_is_completed_by_the_same_command(tmp_path):
    n = 40
    dataset = write_dataset(tmp_path / "data", n, seed=6)
    site = tmp_path / "site"
    command = [sys.executable, "-m", "pathmaster", "index", str(dataset), "--db", str(site), "--quiet",
               "--batch-size", "2", "--workers", "2"]
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while _committed(site / "site.sqlite") < 6:
            assert child.poll() is None, f"ingest ended before it could be killed: {child.stderr.read().decode()}"
            assert time.monotonic() < deadline, "ingest made no progress in 120 s"
            time.sleep(0.05)
        helpers = _children(child.pid)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    assert helpers  # it really analysed in other processes
    with SiteDB(site) as db:
        survived = len(db)
        assert 6 <= survived < n and db.check() == []
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with SiteDB(site) as db:
        assert len(db) == n and db.check() == [] and db.problems() == []
        assert db.get_config("index")["fingerprint"] == db.fingerprint()
    assert list(site.rglob("*.tmp")) == []
    # the killed run's workers end once their task does: none is left running
    deadline = time.monotonic() + 60
    while any(os.path.exists(f"/proc/{pid}") for pid in helpers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in helpers if os.path.exists(f"/proc/{pid}")]


def test_a_cell_stored_before_image_hashes_gets_the_hash_of_its_stored_pixels(tmp_path):
    from pathmaster.site.database import image_hash

    records = synthetic_records(2)
    ingest("synthetic", tmp_path, records=records, build_index=False)
    with SiteDB(tmp_path) as db:
        db.conn.execute("UPDATE cells SET image_hash = NULL")  # as a cell of an older database
        assert len(db.cells_without_hash()) == 2
    ingest("synthetic", tmp_path, records=[], build_index=False)  # nothing met again: the stored PNGs tell
    with SiteDB(tmp_path) as db:
        assert db.cells_without_hash() == []
        assert [c.image_hash for c in db.cells()] == [image_hash(r.image) for r in records]


def test_a_site_records_the_pixel_size_its_importers_know(tmp_path):
    from pathmaster.importers import dataset_pixel_um
    from pathmaster.site.search import SiteIndex
    from pathmaster.image.synth import PIXEL_UM

    synthetic = tmp_path / "synthetic"
    write_dataset(synthetic, 2, seed=3)
    assert dataset_pixel_um(synthetic) == PIXEL_UM  # the generator draws at one scale
    ingest(synthetic, tmp_path / "site", build_index=False)
    with SiteDB(tmp_path / "site") as db:
        assert db.get_config("pixel_um") == PIXEL_UM
    # Cells whose pixel size nobody stated (records without it) make it unknown: not a wrong scale.
    records = [synth_cell(DIAGNOSES[0], cell_rng(9, 0), source_id="other-0")]
    ingest(synthetic, tmp_path / "site", records=records)
    with SiteDB(tmp_path / "site") as db:
        assert db.get_config("pixel_um") is None
    assert SiteIndex.open(tmp_path / "site").pixel_um is None
    # Class folders of plain images say nothing about their pixels.
    folders = tmp_path / "folders" / "normal_superficial"
    folders.mkdir(parents=True)
    from pathmaster.image.io import encode_png

    (folders / "c1.png").write_bytes(encode_png(synth_cell(DIAGNOSES[0], cell_rng(9, 1)).image))
    assert dataset_pixel_um(tmp_path / "folders") is None
