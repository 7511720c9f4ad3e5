"""`pathmaster index --ray-address`: the analysis as Ray tasks makes the same database as in one process."""

from __future__ import annotations

from pathmaster.site.ingest import ingest
from pathmaster.site.database import SiteDB
from pathmaster.image.synth import write_dataset


def _rows(site) -> list[tuple]:
    with SiteDB(site) as db:
        return [(c.cell_id, c.source_id, c.diagnosis, db.cell(c.cell_id).features.tobytes(),
                 db.read_file(c.image_path), db.read_file(c.thumbnail_path))
                for c in db.cells()]


def test_ingest_on_ray_equals_ingest_in_one_process(ray_session, tmp_path):
    dataset = write_dataset(tmp_path / "data", 14, seed=9)
    address = ray_session.get_runtime_context().gcs_address
    serial = ingest(dataset, tmp_path / "serial", build_index=False)
    on_ray = ingest(dataset, tmp_path / "ray", ray_address=address, files_per_task=3, build_index=False)
    assert serial.added == on_ray.added == 14 and not on_ray.problems
    assert "Ray" in on_ray.where and on_ray.workers >= 1
    assert _rows(tmp_path / "ray") == _rows(tmp_path / "serial")
    assert ray_session.is_initialized()   # the session's Ray, used and left running for the others
