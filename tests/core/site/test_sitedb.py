"""The SQLite site database: schema, transactions, config, consistency check."""

from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from pathmaster.site.database import SCHEMA_VERSION, SiteDB, CellRow, cell_id_for
from pathmaster.files import write_atomic


def _cell(site, source, diagnosis="mild_dysplasia", n=3):
    cid = cell_id_for(source)
    for suffix in ("", "-thumb"):
        write_atomic(site / f"cells/{cid}{suffix}.png", b"png")
    return CellRow(cid, source, diagnosis, "test", f"cells/{cid}.png", f"cells/{cid}-thumb.png",
                   None, None, True, False, np.arange(n, dtype=float) + len(source))


def test_missing_database_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no site database here"):
        SiteDB(tmp_path / "nowhere")


def test_cells_round_trip_with_features_and_flags(tmp_path):
    with SiteDB(tmp_path, create=True) as db:
        db.set_config("feature_names", ["a", "b", "c"])
        with db.transaction():
            db.add_cell(_cell(tmp_path, "herlev/x/1.BMP"))
            db.add_cell(_cell(tmp_path, "herlev/x/22.BMP", "carcinoma_in_situ"))
    with SiteDB(tmp_path) as db:  # reopened: the data is on disk
        assert len(db) == 2
        row = db.cell(cell_id_for("herlev/x/22.BMP"))
        assert row.diagnosis == "carcinoma_in_situ" and row.mask_estimated and not row.background_estimated
        np.testing.assert_array_equal(row.features, [15.0, 16.0, 17.0])
        ids, X = db.feature_matrix()
        assert ids == [cell_id_for("herlev/x/1.BMP"), cell_id_for("herlev/x/22.BMP")]
        assert X.shape == (2, 3) and X.dtype == np.float64
        assert db.check() == []
        with pytest.raises(KeyError):
            db.cell("0000000000000000")


def test_a_failed_transaction_leaves_nothing_behind(tmp_path):
    with SiteDB(tmp_path, create=True) as db:
        db.set_config("feature_names", ["a", "b", "c"])
        with pytest.raises(sqlite3.IntegrityError):
            with db.transaction():
                db.add_cell(_cell(tmp_path, "one"))
                db.add_cell(_cell(tmp_path, "one"))  # same source id twice
        assert len(db) == 0


def test_fingerprint_follows_the_cell_set(tmp_path):
    with SiteDB(tmp_path, create=True) as db:
        db.set_config("feature_names", ["a", "b", "c"])
        empty = db.fingerprint()
        with db.transaction():
            db.add_cell(_cell(tmp_path, "one"))
        assert db.fingerprint() != empty


def test_check_reports_missing_files_and_wrong_vector_length(tmp_path):
    with SiteDB(tmp_path, create=True) as db:
        db.set_config("feature_names", ["a", "b", "c", "d"])
        with db.transaction():
            db.add_cell(_cell(tmp_path, "one"))
        (tmp_path / f"cells/{cell_id_for('one')}-thumb.png").unlink()
        issues = db.check()
        assert any("-thumb.png is missing" in i for i in issues)
        assert any("3 features stored, expected 4" in i for i in issues)


def test_problems_are_kept_and_cleared_when_the_cell_later_ingests(tmp_path):
    with SiteDB(tmp_path, create=True) as db:
        db.set_config("feature_names", ["a", "b", "c"])
        db.record_problem("one", "mask has no nucleus pixels")
        db.record_problem("two", "not an image file")
        with db.transaction():
            db.add_cell(_cell(tmp_path, "one"))
        assert db.problems() == [("two", "not an image file")]


def test_cell_ids_are_stable_and_distinct():
    assert cell_id_for("a/1.png") == cell_id_for("a/1.png") != cell_id_for("a/2.png")
    assert len(cell_id_for("x")) == 16


def test_a_version_1_database_is_migrated_and_keeps_its_cells(tmp_path):
    """A database written before groups and image hashes: opened, it gains both columns
    (unknown for its cells) and keeps every cell; a re-run of ingest would fill them in."""
    from pathmaster.site import database

    conn = sqlite3.connect(tmp_path / database.DB_NAME)
    conn.executescript(database.SCHEMA.replace(
        ",\n    group_id             TEXT,           -- the slide image the cell was cropped from; NULL unknown\n"
        "    image_hash           TEXT            -- image_hash() of its pixels; NULL in cells from before v2\n", "\n"))
    assert "group_id" not in {r[1] for r in conn.execute("PRAGMA table_info(cells)")}
    conn.execute("INSERT INTO config VALUES ('schema_version', '1')")
    conn.execute("INSERT INTO cells (cell_id, source_id, diagnosis, origin, image_path, thumbnail_path, "
                 "mask_estimated, background_estimated, features, added_at) VALUES "
                 "('c1', 's1', 'mild_dysplasia', 'test', 'i.png', 't.png', 0, 0, ?, 'then')",
                 (np.ones(3).tobytes(),))
    conn.commit()
    conn.close()
    with SiteDB(tmp_path) as db:
        assert db.get_config("schema_version") == database.SCHEMA_VERSION == 3
        (row,) = db.cells()
        assert (row.cell_id, row.group, row.image_hash) == ("c1", None, None)
        digest = database.image_hash(np.zeros((4, 4, 3), np.uint8))
        with db.transaction():
            assert db.fill_in("s1", "slide-7", digest)
        assert (db.cells()[0].group, db.cells_with_hash(digest)) == ("slide-7", ["c1"])
    with SiteDB(tmp_path) as db:  # opened again: nothing left to migrate
        assert db.cells()[0].group == "slide-7"


def test_image_hash_is_of_the_pixels_not_the_file():
    from pathmaster.site.database import image_hash

    image = np.arange(48, dtype=np.uint8).reshape(4, 4, 3)
    assert image_hash(image) == image_hash(image.copy()) and len(image_hash(image)) == 32
    assert image_hash(image) != image_hash(image.reshape(2, 8, 3))
    changed = image.copy()
    changed[0, 0, 0] += 1
    assert image_hash(changed) != image_hash(image)


def test_cell_files_are_stored_in_the_database_not_as_files(tmp_path):
    from pathmaster.site.ingest import ingest
    from pathmaster.site.search import SiteIndex
    from pathmaster.image.synth import cell_rng, synth_cell

    records = [synth_cell("normal_superficial", cell_rng(4, i), source_id=f"s/{i}") for i in range(3)]
    ingest("synthetic", tmp_path, records=records, build_index=False)
    assert not (tmp_path / "cells").exists()                       # no small files at all
    with SiteDB(tmp_path) as db:
        assert db.check() == [] and db.get_config("schema_version") == SCHEMA_VERSION
        cell = db.cells()[0]
        png = db.read_file(cell.thumbnail_path)
    assert png.startswith(b"\x89PNG")
    assert SiteIndex.open(tmp_path).thumbnail_png(cell.cell_id) == png


def test_a_site_that_kept_its_files_beside_the_database_is_read_still(tmp_path):
    with SiteDB(tmp_path, create=True) as db:   # the files on disk, the row naming them
        db.set_config("feature_names", ["a", "b", "c"])
        with db.transaction():
            db.add_cell(_cell(tmp_path, "legacy"))
        cell = db.cells()[0]
        assert db.read_file(cell.image_path) == b"png" and db.check() == []


def test_bulk_reads_equal_the_rows_read_one_by_one(tmp_path):
    """feature_matrix (one buffer), fingerprint (one string), labels and cells (positional rows)
    give what reading and hashing each row on its own gives: stored fingerprints stay valid."""
    import dataclasses
    import hashlib

    sources = [f"s/{i}" for i in range(7)]
    with SiteDB(tmp_path, create=True) as db:
        db.set_config("feature_names", ["a", "b", "c"])
        with db.transaction():
            for i, source in enumerate(sources):
                db.add_cell(_cell(tmp_path, source, None if i == 2 else "mild_dysplasia"))
        ids, X = db.feature_matrix()
        assert ids == [cell_id_for(s) for s in sources] and X.flags.writeable
        np.testing.assert_array_equal(X, np.vstack([db.cell(c).features for c in ids]))
        tail_ids, tail = db.feature_matrix(5)
        assert tail_ids == ids[5:] and np.array_equal(tail, X[5:])
        for limit in (-1, 3):
            one_by_one = hashlib.sha1()
            for cell_id in ids[:None if limit < 0 else limit]:
                one_by_one.update(cell_id.encode())
            assert db.fingerprint(limit) == one_by_one.hexdigest()
        assert db.labels() == [c.diagnosis for c in db.cells()] and db.labels()[2] is None
        assert [c.cell_id for c in db.cells()] == ids
        assert db.cells()[3] == dataclasses.replace(db.cell(ids[3]), features=None)


def test_vectors_of_another_length_are_refused_by_the_bulk_read(tmp_path):
    with SiteDB(tmp_path, create=True) as db:
        db.set_config("feature_names", ["a", "b", "c"])
        with db.transaction():
            db.add_cell(_cell(tmp_path, "one", n=3))
            db.add_cell(_cell(tmp_path, "two", n=4))
        with pytest.raises(ValueError, match="differ in length"):
            db.feature_matrix()


def test_the_columns_of_a_database_have_its_fingerprint(tmp_path):
    """A served site checks its index against the columns it read (one read of the rows)."""
    with SiteDB(tmp_path, create=True) as db:
        assert db.cell_columns().fingerprint() == db.fingerprint()
        with db.transaction():
            for i, source in enumerate(["a", "préparation/μ-1", "c"]):
                db.add_cell(CellRow(f"id-{i}é" if i else "x", source, None, "vectors", f"v/{i}.png", f"v/{i}-t.png",
                                    None, None, False, False, np.zeros(3)))
        columns = db.cell_columns()
        assert columns.fingerprint() == db.fingerprint() and columns.cell_ids() == ["x", "id-1é", "id-2é"]
        with db.transaction():
            db.remove_cells(["id-1é"])
        assert db.cell_columns().fingerprint() == db.fingerprint() != columns.fingerprint()
