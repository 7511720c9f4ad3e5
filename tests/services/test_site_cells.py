"""A submitted cell is checked at the coordinator without decoding its image, and
decoded and checked once at the site (services/cells.py, worker.py)."""

from __future__ import annotations

import io
import sys
from collections import Counter

import numpy as np
import pytest
from PIL import Image

from pathmaster.image import io as imageio
from pathmaster.records import InvalidInput
from pathmaster.site.search import Match
from services.cells import decode_cell, probe_cell

COUNTED = {imageio.decode_image: "decode_image", imageio.decode_mask: "decode_mask",
           imageio.check_cell: "check_cell", Image._getdecoder: "pixels decoded"}


def calls(action):
    """(what `action()` returned, Counter of the COUNTED functions it called, however
    they were imported)."""
    codes = {f.__code__: name for f, name in COUNTED.items()}
    counts: Counter = Counter()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            counts[codes[frame.f_code]] += 1

    sys.setprofile(profile)
    try:
        result = action()
    finally:
        sys.setprofile(None)
    return result, counts


def parts(cell: dict) -> tuple:
    return cell["cell_id"], cell["image"], cell["background"], cell["mask"]


def test_the_coordinator_decodes_only_the_mask(case_cells):
    _, counts = calls(lambda: probe_cell(*parts(case_cells[0])))
    assert counts == {"decode_mask": 1, "pixels decoded": 1, "check_cell": 1}
    _, counts = calls(lambda: probe_cell(case_cells[0]["cell_id"], case_cells[0]["image"]))
    assert counts == {}


def test_the_coordinator_refuses_what_a_header_shows(case_cells):
    cell_id, image, background, mask = parts(case_cells[0])
    other = case_cells[1]["image"]
    for bad, words in [
        ((cell_id, b""), ["no image"]),
        ((cell_id, b"not an image"), ["image", "not an image file"]),
        ((cell_id, image[: len(image) // 2]), ["image", "truncated"]),
        ((cell_id, image, other), ["background is"]),
        ((cell_id, image, b"", other), ["mask"]),  # another size, and RGB
        ((cell_id, image, b"", imageio.encode_png(np.zeros(Image.open(io.BytesIO(image)).size[::-1],
                                                            np.uint8))), ["no nucleus"]),
    ]:
        with pytest.raises(InvalidInput) as err:
            probe_cell(*bad)
        assert repr(cell_id) in str(err.value) and all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "BMP", "TIFF"])
def test_probe_image_reads_the_header_and_refuses_a_file_cut_short(fmt):
    rgb = np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, format=fmt)
    data = buffer.getvalue()
    header = imageio.probe_image(data, f"c.{fmt.lower()}")
    assert (header.width, header.height, header.format, header.shape) == (50, 40, fmt, (40, 50))
    with pytest.raises(InvalidInput, match=f"c.{fmt.lower()}: cannot decode image"):
        imageio.probe_image(data[: len(data) * 2 // 3], f"c.{fmt.lower()}")
    with pytest.raises(InvalidInput, match="over the limit of 1000 pixels"):
        imageio.probe_image(data, "big", max_pixels=1000)


def test_the_site_decodes_and_checks_each_part_once(site_db, case_cells):
    from services.site.worker import CellOutcome, SiteWorker

    worker = SiteWorker(site_db, budget=None)  # in this process, so its decodes can be counted
    for cell_id in worker.index.cell_ids():  # the matches' wire thumbnails are made once per database cell
        worker.wire_parts(cell_id)
    outcome, counts = calls(lambda: worker.analyse(*parts(case_cells[0]), 3))
    assert isinstance(outcome, CellOutcome) and outcome.error == ""
    assert counts == {"decode_image": 2, "decode_mask": 1, "pixels decoded": 3, "check_cell": 1}
    # Image alone: segmentation and the background estimate do not check again.
    outcome, counts = calls(lambda: worker.analyse(case_cells[1]["cell_id"], case_cells[1]["image"], b"", b"", 3))
    assert outcome.mask_estimated and outcome.background_estimated and len(outcome.matches) == 3
    assert counts == {"decode_image": 1, "pixels decoded": 1, "check_cell": 1}
    bad = worker.analyse("x.png", case_cells[0]["image"][:100], b"", b"", 3)
    assert "'x.png'" in bad.error and bad.matches == ()


def test_decode_cell_returns_the_arrays(case_cells):
    rgb, background, mask = decode_cell(*parts(case_cells[0]))
    assert rgb.dtype == background.dtype == mask.dtype == np.uint8
    assert rgb.shape == background.shape and mask.shape == rgb.shape[:2]


def test_a_cell_outcome_goes_on_the_wire_with_its_thumbnails():
    from services.site.server import cell_result
    from services.site.worker import CellOutcome

    outcome = CellOutcome("q.png", (Match("a", "normal_superficial", 0.5, "s-a"), Match("b", None, 0.7, "s-b")),
                          (b"JPEG-a", b"JPEG-b"), ("sha-a", "sha-b"), ("NILM", ""), background_estimated=True, extraction_s=0.1)
    result = cell_result(outcome)
    assert result.query_cell_id == "q.png" and result.background_estimated and not result.mask_estimated
    assert [(m.cell_id, m.diagnosis, m.thumbnail, m.source_id, m.image_sha256, m.bethesda) for m in result.matches] == [
        ("a", "normal_superficial", b"JPEG-a", "s-a", "sha-a", "NILM"), ("b", "", b"JPEG-b", "s-b", "sha-b", "")]
    assert result.matches[0].distance == pytest.approx(0.5)
    with pytest.raises(AttributeError):
        outcome.error = "changed"  # frozen


def test_a_worker_and_an_analyser_serve_one_cell_before_they_are_ready(site_db):
    # A fresh process's first cell pays lazy imports, FAISS's first search and the thumbnail
    # codec (the demo's first case: 0.8 s of search at each site against 0.02 s after);
    # served at start, before `ready`, the first case is warm and so is what the predictor
    # learns from it.
    from services.coordinator.analysis import CellAnalyser
    from services.site.worker import SiteWorker

    cold = SiteWorker(site_db, budget=None, warm_up=False)
    assert cold.warm_up_s == {} and cold._wire.cache_info().currsize == 0
    worker = SiteWorker(site_db, budget=None)
    assert set(worker.warm_up_s) == {"analyse_s", "search_s", "thumbnails_s"}
    # every database cell's wire thumbnail is made: a case's matches cost the same, seen or not
    assert worker._wire.cache_info().currsize == len(worker.index.cell_ids()) > 0
    assert CellAnalyser(budget=None, warm_up=False).warm_up_s is None
    assert CellAnalyser(budget=None).warm_up_s is not None
