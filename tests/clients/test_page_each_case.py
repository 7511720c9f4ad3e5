"""Each case is its own, and only cells become cells, in Debian's chromium at phone and
desktop width, against the fake coordinator of test_page_check_by_eye.py (known answers):

- a segmentation mask renamed as a cell image (Herlev's colours, n6.bmp) and a field of view
  of 12 cells are refused where they are picked, with their reason code and plain words,
  and are never sent;
- "Clear" takes the last case's conclusion, results, accession number and refine weights
  away, and the first file of a new case after an answer does too.

Screenshots: test-artifacts/clients/refused-{mask,field}-{390,1440}px.png,
cleared-{390,1440}px.png.
"""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from PIL import Image

from pathmaster.image.io import encode_png
from pathmaster.records import DIAGNOSES
from pathmaster.image.synth import cell_rng, synth_cell, synth_field
from tests.clients.browser import ARTIFACTS, run_case
from tests.core.analysis.test_uploads import herlev_coloured
from tests.clients.test_page_check_by_eye import fake, pick, sign_in  # noqa: F401  (fake: a fixture)

pytestmark = pytest.mark.browser

WIDTHS = {390: 844, 1440: 900}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Two synthetic cells, a mask in Herlev's colours saved as n6.bmp, and a 12-cell field."""
    folder = tmp_path_factory.mktemp("each-case")
    cells = [synth_cell(DIAGNOSES[n], cell_rng(21, n)) for n in range(2)]
    for n, cell in enumerate(cells, start=1):
        (folder / f"cell{n}.png").write_bytes(encode_png(cell.image))
    out = io.BytesIO()
    Image.fromarray(herlev_coloured(cells[0].mask)).save(out, "BMP")
    (folder / "n6.bmp").write_bytes(out.getvalue())
    out = io.BytesIO()
    Image.fromarray(synth_field(np.random.default_rng(3))).save(out, "JPEG", quality=90)
    (folder / "field.jpg").write_bytes(out.getvalue())
    return folder


def new_page(browser, width):
    context = browser.new_context(viewport={"width": width, "height": WIDTHS[width]})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return context, page, errors


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_a_mask_and_a_field_are_refused_where_they_are_picked(browser, fake, files, width):  # noqa: F811
    gateway, coordinator = fake
    context, page, errors = new_page(browser, width)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        sign_in(page, gateway)
        sent = len(coordinator.cases)
        for name, code, words in (("n6.bmp", "looks_like_mask", "segmentation mask"),
                                  ("field.jpg", "looks_like_field", "field of view")):
            pick(page, [files / name])
            refused = page.locator(f"#file-problems [data-code='{code}'][data-file='{name}']")
            refused.wait_for()
            assert words in refused.inner_text()
            assert page.locator("#submit").is_disabled()
            page.screenshot(path=str(ARTIFACTS / f"refused-{code.split('_')[-1]}-{width}px.png"), full_page=True)
            page.click("#clear")
            page.wait_for_selector("#file-problems li", state="detached")
        assert len(coordinator.cases) == sent
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def case_shown(page) -> dict:
    """What of a case is on screen: conclusion, results, accession, refine weights, report."""
    return page.evaluate("""() => ({
        conclusion: !document.querySelector('#conclusion').hidden,
        conclusionText: document.querySelector('#conclusion-text').textContent.trim(),
        cells: document.querySelectorAll('.cell-card').length,
        sites: document.querySelectorAll('.site-card').length,
        accession: document.querySelector('#accession').value,
        refine: !document.querySelector('#refine').hidden,
        weights: [...document.querySelectorAll('#refine-concepts select')]
            .filter((s) => Number(s.value) !== 1).length,
        report: !document.querySelector('#export').disabled})""")


NOTHING = {"conclusion": False, "conclusionText": "", "cells": 0, "sites": 0, "accession": "",
           "refine": False, "weights": 0, "report": False}


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_clear_and_a_new_case_leave_nothing_of_the_last(browser, fake, files, width):  # noqa: F811
    gateway, coordinator = fake
    context, page, errors = new_page(browser, width)
    try:
        sign_in(page, gateway)
        pick(page, [files / "cell1.png", files / "cell2.png"])
        page.fill("#accession", "S26-01234")
        run_case(page, "done")
        page.select_option("#refine-concepts select[data-concept='chromatin']", "2")
        shown = case_shown(page)
        assert shown["conclusion"] and shown["cells"] == 2 and shown["weights"] == 1 and shown["report"]

        assert page.locator("#reranked").is_hidden()
        page.click("#refine-run")
        page.wait_for_selector("#reranked:not([hidden])")
        assert "Re-ranked" in page.locator("#reranked").inner_text()
        assert dict(coordinator.cases[-1].concept_weights) == {"chromatin": 2.0}
        assert case_shown(page)["conclusion"]

        page.click("#clear")
        assert case_shown(page) == NOTHING
        assert page.locator("#reranked").is_hidden()
        page.screenshot(path=str(ARTIFACTS / f"cleared-{width}px.png"), full_page=True)

        # The next patient's case, started by adding its files without "Clear".
        pick(page, [files / "cell1.png"])
        run_case(page, "done")
        page.select_option("#refine-concepts select[data-concept='cytoplasm']", "0")
        pick(page, [files / "cell2.png"])
        assert case_shown(page) == NOTHING
        page.wait_for_selector("#pairing tbody tr[data-cell='cell2']")
        assert page.locator("#pairing tbody tr").count() == 1  # the last case's cell1 went too
        # Its first run sends no weights of the last case.
        run_case(page, "done")
        assert dict(coordinator.cases[-1].concept_weights) == {}
        assert [c.cell_id for c in coordinator.cases[-1].cells] == ["cell2"]
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_the_answer_is_large_enough_to_judge_and_in_plain_words(browser, fake, files, width, tmp_path):  # noqa: F811
    gateway, _ = fake
    context = browser.new_context(viewport={"width": width, "height": WIDTHS[width]}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        sign_in(page, gateway)
        pick(page, [files / "cell1.png", files / "cell2.png"])
        run_case(page, "done")
        status = page.locator("#case-status").inner_text()
        assert status.startswith("Answered in") and "c1" not in status and "kB" not in status
        # The full-size images' download is shown with its progress, to the end.
        page.wait_for_function("() => document.body.dataset.largerImagesS !== undefined")
        assert page.locator("#images-line").is_visible()
        progress = page.locator("#images-progress")
        assert progress.get_attribute("value") == progress.get_attribute("max") == "20"  # 2 cells x 2 sites x 5
        assert "all 20 loaded" in page.locator("#images-text").inner_text()
        # Tiles large enough to judge: 120 px on a desktop, 3 to a row (~100 px) on a phone.
        tile = page.locator(".match img").first.bounding_box()["width"]
        assert tile >= (120 if width > 600 else 95), tile
        page.screenshot(path=str(ARTIFACTS / f"answer-{width}px.png"), full_page=True)
        page.locator(".match").first.click()
        page.wait_for_selector("#scale-bar[data-zoom]")
        frame = page.locator(".viewer-frame").first.bounding_box()["width"]
        assert frame >= 2 * tile, (frame, tile)
        page.screenshot(path=str(ARTIFACTS / f"viewer-{width}px.png"))
        page.evaluate("document.querySelector('#viewer').close()")
        with page.expect_download() as saved:
            page.click("#export")
        report_file = tmp_path / saved.value.suggested_filename
        saved.value.save_as(report_file)
        report = context.new_page()
        report.goto(report_file.as_uri())
        sent_at = report.locator("tr", has_text="Sent at").locator("td").nth(1).inner_text()
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d [+-]\d\d:\d\d", sent_at), sent_at
        assert report.locator("h1").inner_text().startswith("Case report")  # no internal id as a heading
        assert report.locator("figure img").first.bounding_box()["width"] >= 100
        report.screenshot(path=str(ARTIFACTS / f"report-{width}px.png"), full_page=True)
        report.close()
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"
