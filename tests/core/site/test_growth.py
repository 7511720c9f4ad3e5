"""A site grows without a rebuild: cells added, removed, relabelled; what it learnt kept until re-learnt.

The sites here compare their features alone (growth's bookkeeping); a site that looks
through its eye grows in test_learn.py."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from pathmaster.site import growth
from pathmaster.site.growth import drift, relabel_cell, remove_cells, representation, update_search_index
from pathmaster.site.ingest import ingest
from pathmaster.records import DIAGNOSES, InvalidInput
from pathmaster.site.index import index_path
from pathmaster.site.search import SiteIndex
from pathmaster.site.database import SiteDB
from pathmaster.image.synth import cell_rng, synth_cell

FIRST, LATER = 49, 28   # 7 and 4 per Herlev class


def synthetic_records(n, seed=17, start=0):
    return [synth_cell(DIAGNOSES[i % len(DIAGNOSES)], cell_rng(seed, i), source_id=f"synth/{seed}/{i}")
            for i in range(start, start + n)]


@pytest.fixture(scope="module")
def records():
    return synthetic_records(FIRST + LATER + 6)


@pytest.fixture(scope="module")
def queries(records):
    """Feature vectors of cells in neither site."""
    from pathmaster.analysis.cell import analyse_cell

    return np.vstack([analyse_cell(r.image, r.background, r.mask).features for r in records[-6:]])


@pytest.fixture(scope="module")
def grown(tmp_path_factory, records):
    """A site indexed with FIRST cells, then LATER cells added by a second ingest."""
    path = tmp_path_factory.mktemp("grown")
    ingest("synthetic", path, records=records[:FIRST], features="fisher", similarity="features")
    with SiteDB(path) as db:
        fitted = db.get_config("index")
    ingest("synthetic", path, records=records[:FIRST + LATER])
    return path, fitted


def test_added_cells_join_the_index_and_the_learnt_representation_is_kept(grown):
    path, fitted = grown
    with SiteDB(path) as db:
        config = db.get_config("index")
        assert config["fingerprint"] == db.fingerprint() and config["n_cells"] == FIRST + LATER
    assert config["normalization"] == fitted["normalization"] and config["projection"] == fitted["projection"]
    state = representation(config)
    assert state["id"] == representation(fitted)["id"]
    assert (state["fitted_cells"], state["added"], state["removed"]) == (FIRST, LATER, 0)
    assert state["drift"]["drifted"] is False and state["drift"]["new_cells"] == LATER


def test_incremental_add_answers_as_a_full_rebuild_with_the_same_representation(grown, queries, tmp_path):
    path, _ = grown
    rebuilt = tmp_path / "rebuilt"
    shutil.copytree(path, rebuilt)
    with SiteDB(rebuilt) as db:
        index_path(rebuilt, db.get_config("index")["fingerprint"]).unlink()   # rebuilt from the database
    incremental, full = SiteIndex.open(path), SiteIndex.open(rebuilt)
    assert incremental.algorithm == full.algorithm
    a, b = incremental.search_many(queries, k=5), full.search_many(queries, k=5)
    assert [[m.cell_id for m in row] for row in a] == [[m.cell_id for m in row] for row in b]
    assert np.allclose([[m.distance for m in row] for row in a], [[m.distance for m in row] for row in b])
    _assert_cells_find_themselves(incremental, range(FIRST, FIRST + LATER))   # the cells added later


def _assert_cells_find_themselves(site, rows) -> None:
    from pathmaster.site.faiss_index import search

    vectors = site.vectors()
    for row in rows:
        distances, ids = search(site._index, vectors[row:row + 1], 1)
        assert ids[0, 0] == row and distances[0, 0] == pytest.approx(0, abs=1e-4)


def test_relearn_fits_the_representation_to_every_cell(grown, tmp_path):
    path, fitted = grown
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    with SiteDB(copy) as db:
        config = update_search_index(db, relearn=True)
    state = representation(config)
    assert state["id"] != representation(fitted)["id"]
    assert (state["fitted_cells"], state["added"]) == (FIRST + LATER, 0)
    assert config["normalization"] != fitted["normalization"]


def test_an_approximate_index_grows_too_and_measures_its_recall(records, tmp_path):
    ingest("synthetic", tmp_path, records=records[:FIRST], algorithm="ivf", features="all", similarity="features")
    ingest("synthetic", tmp_path, records=records[:FIRST + LATER], similarity="features")
    site = SiteIndex.open(tmp_path)
    assert site.config["algorithm"] == "ivf" and site.config["n_cells"] == FIRST + LATER
    assert representation(site.config)["added"] == LATER
    assert site.config["recall_at_5"] >= 0.95
    _assert_cells_find_themselves(site, (0, FIRST, FIRST + LATER - 1))   # an old cell and new ones


def test_drift_is_a_large_shift_of_nearest_neighbour_distances():
    rng = np.random.default_rng(3)
    old = rng.normal(size=(600, 6)).astype(np.float32)
    reference, others = old[200:], old[:200]
    alike = drift(reference, others, rng.normal(size=(100, 6)).astype(np.float32))
    shifted = drift(reference, others, (rng.normal(size=(100, 6)) + 4).astype(np.float32))
    few = drift(reference, others, (rng.normal(size=(growth.DRIFT_MIN_CELLS - 1, 6)) + 4).astype(np.float32))
    assert alike["drifted"] is False and shifted["drifted"] is True
    assert shifted["effect"] >= growth.DRIFT_EFFECT and shifted["p"] < growth.DRIFT_P
    assert few["drifted"] is False and few["p"] is None


def test_drifted_new_cells_make_the_site_fit_itself_again(records, tmp_path):
    ingest("synthetic", tmp_path, records=records[:FIRST], features="all", similarity="features")
    ingest("synthetic", tmp_path, records=records[:FIRST + LATER], build_index=False, similarity="features")
    with SiteDB(tmp_path) as db:   # the later cells as if from another scanner: every value moved
        with db.transaction():
            for cell in db.cells()[FIRST:]:
                features = db.cell(cell.cell_id).features * 3 + 50
                db.conn.execute("UPDATE cells SET features = ? WHERE cell_id = ?",
                                (features.astype("<f8").tobytes(), cell.cell_id))
        config = update_search_index(db)
    state = representation(config)
    assert state["fitted_cells"] == FIRST + LATER
    assert config["representation"]["refitted_for_drift"]["drifted"] is True


def test_removing_cells_takes_them_out_of_rows_files_and_search(grown, queries, tmp_path):
    path, fitted = grown
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    before = SiteIndex.open(copy)
    gone = [m.cell_id for m in before.search(queries[0], k=2)]
    files = [before.cell(c).image_path for c in gone]
    config = remove_cells(copy, gone)
    after = SiteIndex.open(copy)
    assert len(after) == FIRST + LATER - 2 and config["n_cells"] == len(after)
    assert not set(gone) & {m.cell_id for m in after.search(queries[0], k=10)}
    assert representation(config)["id"] == representation(fitted)["id"]
    assert representation(config)["removed"] == 2
    with SiteDB(copy) as db:
        assert db.check() == []
        for relative in files:   # their images are gone with them
            with pytest.raises(FileNotFoundError):
                db.read_file(relative)
    with pytest.raises(KeyError):
        remove_cells(copy, ["0123456789abcdef"])


def test_relabelling_a_cell_changes_its_diagnosis_and_nothing_learnt(grown, tmp_path):
    path, fitted = grown
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    cell = SiteIndex.open(copy).cell_ids()[0]
    old = SiteIndex.open(copy).cell(cell).diagnosis
    new = next(d for d in DIAGNOSES if d != old)
    assert relabel_cell(copy, cell, new) == new
    site = SiteIndex.open(copy)
    assert site.cell(cell).diagnosis == new
    assert representation(site.config)["id"] == representation(fitted)["id"]
    with pytest.raises(InvalidInput):
        relabel_cell(copy, cell, "no such diagnosis")
    with pytest.raises(KeyError):
        relabel_cell(copy, "0123456789abcdef", new)


def test_the_cells_command_relabels_removes_and_refuses_an_unknown_id(grown, tmp_path):
    import subprocess
    import sys

    path, _ = grown
    copy = tmp_path / "copy"
    shutil.copytree(path, copy)
    first, second = SiteIndex.open(copy).cell_ids()[:2]

    def cells(*args):
        return subprocess.run([sys.executable, "-m", "pathmaster", "cells", *args, "--db", str(copy)],
                              capture_output=True, text=True, timeout=120)

    unknown = cells("remove", "0123456789abcdef")
    assert unknown.returncode == 2 and "0123456789abcdef" in unknown.stderr
    assert cells("relabel", first, "carcinoma_in_situ").returncode == 0
    assert cells("remove", second).returncode == 0
    site = SiteIndex.open(copy)
    assert site.cell(first).diagnosis == "carcinoma_in_situ" and second not in site.cell_ids()
