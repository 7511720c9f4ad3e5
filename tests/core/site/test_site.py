"""SiteIndex: the facade the site server uses, over a small real site built by ingest.

The site compares its features alone (``similarity="features"``): these tests are about the
facade; a site that looks through its eye is tested in test_learn.py."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from pathmaster.site.ingest import ingest
from pathmaster.records import DIAGNOSES
from pathmaster.site.index import index_path
from pathmaster.site.search import SiteIndex
from pathmaster.site.database import SiteDB
from pathmaster.image.synth import cell_rng, synth_cell

N_CELLS = 42  # 6 per Herlev class


def synthetic_records(n, seed=7, start=0):
    return [synth_cell(DIAGNOSES[i % len(DIAGNOSES)], cell_rng(seed, i), source_id=f"synth/{seed}/{i}")
            for i in range(start, start + n)]


@pytest.fixture(scope="module")
def records():
    return synthetic_records(N_CELLS)


@pytest.fixture(scope="module")
def site_dir(tmp_path_factory, records):
    path = tmp_path_factory.mktemp("site")
    report = ingest("synthetic", path, records=records, similarity="features")
    assert report.added == N_CELLS and report.problems == []
    return path


@pytest.fixture(scope="module")
def site(site_dir):
    return SiteIndex.open(site_dir)


def test_a_database_cell_finds_itself_first_at_distance_zero(site, records):
    cell = records[12]
    analysis = site.analyse(cell.image, cell.background, cell.mask)
    assert not analysis.background_estimated and not analysis.mask_estimated
    matches = site.search(analysis.features, k=5)
    assert len(matches) == 5
    assert matches[0].source_id == cell.source_id and matches[0].diagnosis == cell.diagnosis
    assert matches[0].distance == pytest.approx(0.0, abs=1e-3)
    distances = [m.distance for m in matches]
    assert distances == sorted(distances) and distances[1] > 0


def test_search_many_equals_search_row_by_row(site, records):
    features = np.vstack([site.analyse(r.image, r.background, r.mask).features for r in records[:3]])
    many = site.search_many(features, k=4)
    assert [len(row) for row in many] == [4, 4, 4]
    assert many == [site.search(f, k=4) for f in features]


def test_k_is_capped_at_the_database_size_and_must_be_positive(site, records):
    features = site.analyse(records[0].image, records[0].background, records[0].mask).features
    assert len(site.search(features, k=1000)) == N_CELLS
    with pytest.raises(ValueError, match="k must be at least 1"):
        site.search(features, k=0)


def test_wrong_feature_length_is_a_clear_error(site):
    with pytest.raises(ValueError, match=r"must have \d+ values each"):
        site.search(np.zeros(3))


def test_unsegmented_cell_without_background_is_estimated_and_flagged(site, records):
    cell = records[5]
    analysis = site.analyse(cell.image)
    assert analysis.background_estimated and analysis.mask_estimated
    assert analysis.mask.shape == cell.image.shape[:2] and (analysis.mask == 2).any()
    assert len(site.search(analysis.features)) == 5


def test_images_thumbnails_and_metadata(site, records):
    assert len(site) == N_CELLS
    assert site.diagnoses() == list(DIAGNOSES)
    assert site.algorithm.startswith("faiss-flat-l2/zscore/")
    match = site.search(site.analyse(records[3].image, records[3].background, records[3].mask).features)[0]
    image = np.asarray(Image.open(io.BytesIO(site.image_png(match.cell_id))))
    np.testing.assert_array_equal(image, records[3].image)  # lossless
    thumb = Image.open(io.BytesIO(site.thumbnail_png(match.cell_id)))
    assert max(thumb.size) <= 64 and thumb.format == "PNG"
    with pytest.raises(KeyError):
        site.thumbnail_png("no-such-cell")
    with pytest.raises(KeyError):
        site.image_png("no-such-cell")


def test_missing_or_damaged_index_file_is_rebuilt_from_the_database(site_dir, site, records):
    config = site.config
    path = index_path(site_dir, config["fingerprint"])
    query = site.analyse(records[20].image, records[20].background, records[20].mask).features
    before = site.search(query)
    path.unlink()
    reopened = SiteIndex.open(site_dir)
    assert path.is_file()
    assert reopened.search(query) == before
    assert reopened.config["projection"] == config["projection"]  # same features, not re-selected
    path.write_bytes(path.read_bytes()[:100])  # a damaged file
    assert SiteIndex.open(site_dir).search(query) == before


def test_cells_added_without_an_index_build_are_searchable_after_open(tmp_path):
    first = synthetic_records(12, seed=3)
    ingest("synthetic", tmp_path, records=first, similarity="features")
    late = synthetic_records(4, seed=3, start=12)
    ingest("synthetic", tmp_path, records=late, build_index=False,
           similarity="features")  # as if killed before the index step
    site = SiteIndex.open(tmp_path)
    assert len(site) == 16
    probe = late[2]
    hit = site.search(site.analyse(probe.image, probe.background, probe.mask).features, k=1)[0]
    assert hit.source_id == probe.source_id
    with SiteDB(tmp_path) as db:
        assert db.get_config("index")["fingerprint"] == db.fingerprint()


def test_opening_a_directory_without_a_site_names_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        SiteIndex.open(tmp_path)


def test_switching_to_an_approximate_index_keeps_the_feature_choice_and_measures_recall(tmp_path, records):
    from pathmaster.site.index import build_search_index

    ingest("synthetic", tmp_path, records=records[:35], similarity="features")
    with SiteDB(tmp_path) as db:
        flat = db.get_config("index")
        ivf = build_search_index(db, algorithm="ivf")
        hnsw = build_search_index(db, algorithm="hnsw")
    assert ivf["projection"] == flat["projection"] == hnsw["projection"]
    assert ivf["recall_at_5"] >= 0.95 and ivf["nprobe"] >= 1
    assert 0.0 <= hnsw["recall_at_5"] <= 1.0
    site = SiteIndex.open(tmp_path)
    assert site.algorithm.startswith("faiss-hnsw")
    probe = records[4]
    assert site.search(site.analyse(probe.image, probe.background, probe.mask).features)[0].source_id == probe.source_id


def test_a_site_measured_with_another_feature_set_is_refused_with_a_clear_message(tmp_path, records):
    from pathmaster.records import InvalidInput

    ingest("synthetic", tmp_path, records=records[:8], build_index=False, similarity="features")
    with SiteDB(tmp_path) as db:
        db.set_config("feature_names", ["old_feature"] * 3)
    with pytest.raises(InvalidInput, match="another feature set .*index the dataset again"):
        SiteIndex.open(tmp_path)


def test_learnt_projection_is_stored_with_the_index_rebuilt_from_the_database_and_used_by_search(tmp_path, records):
    from pathmaster.site.index import build_search_index

    ingest("synthetic", tmp_path, records=records, similarity="features")
    with SiteDB(tmp_path) as db:
        learnt = build_search_index(db, features="lda", seed=3)
        db.set_config("index", None)  # as if lost: the next open refits it from the cells
    assert learnt["projection"]["method"] == "lda"
    d = len(learnt["projection"]["columns"])
    assert np.shape(learnt["projection"]["matrix"]) == (d, d + 6)  # z-scores and 6 axes for 7 diagnoses
    site = SiteIndex.open(tmp_path)
    assert site.config["projection"] == learnt["projection"]  # same cells, same seed: the same map
    assert site.algorithm.endswith(f"/zscore/lda-{d}of{d}+6axes")  # 6 discriminant axes beside the d z-scores
    assert site.vectors().shape == (N_CELLS, d + 6)
    cell = records[5]
    hit = site.search(site.analyse(cell.image, cell.background, cell.mask).features, k=1)[0]
    assert hit.source_id == cell.source_id and hit.distance == pytest.approx(0.0, abs=1e-3)


def test_an_index_file_read_at_open_answers_as_one_rebuilt_from_the_database(site_dir, site):
    from pathmaster.site.faiss_index import build_index, search
    from pathmaster.site.index import stored_vectors

    with SiteDB(site_dir) as db:
        vectors = stored_vectors(db, site.config)
    rebuilt = build_index(vectors, site.config["algorithm"])
    opened = SiteIndex.open(site_dir)   # reads the file; nothing rebuilt
    assert opened.config == site.config and opened._index.ntotal == N_CELLS
    for a, b in zip(search(opened._index, vectors, 5), search(rebuilt, vectors, 5)):
        np.testing.assert_array_equal(a, b)


def test_a_stale_index_file_of_other_cells_is_rebuilt_not_trusted(site_dir, site, records, tmp_path):
    """A file under the right name and of the right size, but not the one the config was
    saved with (as after a kill between writing a re-learnt site's file and its config)."""
    import shutil

    import faiss

    from pathmaster.site.faiss_index import build_index

    copy = tmp_path / "copy"
    shutil.copytree(site_dir, copy)
    path = index_path(copy, site.config["fingerprint"])
    other = np.random.default_rng(0).normal(size=(N_CELLS, site._index.d)).astype(np.float32)
    faiss.write_index(build_index(other), str(path))
    query = site.analyse(records[9].image, records[9].background, records[9].mask).features
    reopened = SiteIndex.open(copy)
    assert reopened.search(query) == site.search(query)
    assert reopened.search(query)[0].source_id == records[9].source_id
    with SiteDB(copy) as db:   # the rebuilt file is the one the config now names
        assert SiteIndex.open(copy).config["index_sha1"] == db.get_config("index")["index_sha1"]
    assert path.read_bytes() == index_path(site_dir, site.config["fingerprint"]).read_bytes()


def test_search_vectors_made_a_block_at_a_time_equal_the_whole_at_once(site_dir, site, monkeypatch):
    from pathmaster.site import index as site_module

    with SiteDB(site_dir) as db:
        _, X = db.feature_matrix()
    whole = site_module.search_vectors(X, site._normalization, site._projection, site.learnt, None)
    monkeypatch.setattr(site_module, "VECTOR_BLOCK", 5)   # 42 cells: 9 blocks, the last one short
    blocks = site_module.search_vectors(X, site._normalization, site._projection, site.learnt, None)
    assert blocks.dtype == np.float32 and blocks.shape == whole.shape
    np.testing.assert_allclose(blocks, whole, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(blocks, site._vectors(X), rtol=1e-6, atol=1e-6)   # as a query is turned


def test_the_opened_site_answers_with_its_database_rows(site_dir, site, records):
    """What the site keeps of its rows in memory (columns) answers as the stored rows do."""
    with SiteDB(site_dir) as db:
        rows = db.cells()
    by_id = {row.cell_id: row for row in rows}
    assert site.cell_ids() == [row.cell_id for row in rows] and site.cell_ids(3) == site.cell_ids()[:3]
    assert site.labels() == [row.diagnosis for row in rows]
    assert site.origins() == {rows[0].origin: N_CELLS} and len({row.origin for row in rows}) == 1
    features = np.vstack([site.analyse(r.image, r.background, r.mask).features for r in records[:4]])
    for row in site.search_many(features, k=N_CELLS):
        assert len(row) == N_CELLS and len({m.cell_id for m in row}) == N_CELLS
        for match in row:
            stored = by_id[match.cell_id]
            assert (match.diagnosis, match.source_id) == (stored.diagnosis, stored.source_id)
    assert site.cell(rows[7].cell_id) == rows[7]
    assert site.cells_with_hash(rows[7].image_hash) == [rows[7].cell_id]
    with pytest.raises(KeyError):
        site.cell("no-such-cell")


def test_unlabelled_cells_and_non_ascii_source_ids_come_back_as_stored(tmp_path):
    from pathmaster.site.database import CellRow

    names = [f"préparation/{i}-μ" if i % 3 else f"s{i}" for i in range(40)]
    labels = [None if i % 5 == 0 else DIAGNOSES[i % len(DIAGNOSES)] for i in range(40)]
    rng = np.random.default_rng(0)
    with SiteDB(tmp_path, create=True) as db:
        from pathmaster.features import feature_names

        db.set_config("feature_names", list(feature_names()))
        with db.transaction():
            for i, (name, label) in enumerate(zip(names, labels)):
                db.add_cell(CellRow(f"c{i:02d}", name, label, "vectors", f"v/{i}.png", f"v/{i}-t.png", None, None,
                                    False, False, rng.normal(size=len(feature_names()))))
        from pathmaster.site.index import build_search_index

        build_search_index(db, similarity_choice="features")
        X = db.feature_matrix()[1]
    opened = SiteIndex.open(tmp_path)
    assert opened.labels() == labels and opened.origins() == {"vectors": 40}
    assert opened.diagnoses() == [d for d in DIAGNOSES if d in labels]
    for i in (0, 1, 5, 13):
        first = opened.search(X[i], k=3)[0]
        assert (first.cell_id, first.source_id, first.diagnosis) == (f"c{i:02d}", names[i], labels[i])


def test_opening_a_site_loads_no_image_analysis_library(site_dir):
    """The stored feature names are checked against the catalogue alone: a fresh process
    opens and searches the site without scikit-image, OpenCV or mahotas."""
    import subprocess
    import sys

    code = ("import sys, numpy as np; from pathmaster.site.search import SiteIndex; s = SiteIndex.open(sys.argv[1]); "
            "s.search(np.ones(len(s.feature_names))); "
            "print(sorted(m for m in ('skimage', 'cv2', 'mahotas') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code, str(site_dir)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-1] == "[]"
