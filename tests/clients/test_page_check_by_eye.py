"""The page a pathologist checks by eye, at 1280 and 390 px in Debian's chromium: the case
conclusion first with its decision-support statement, each cell's Bethesda term and its
spread, a synthetic or small database said beside its matches, matches' similarity and
what makes them close, reason codes in words, the viewer (test cell and match side by side
at one pixel scale, a scale bar, arrow keys), refining by concept and "more like this" by example, the pick-time
checks (a mask of the wrong size, an accession number with '/'), and the saved report.

The coordinator is a fake one on a real gRPC port (no Ray, no sites): it answers every case
with the same canned events, so what the page shows can be checked against known values.
Screenshots: test-artifacts/clients/check-by-eye-{case,viewer}-{1280,390}px.png.
"""

from __future__ import annotations

import io
import json
from concurrent import futures

import grpc
import pytest
from PIL import Image

from qos.classes import DEFAULT_CLASSES
from services.classinfo import class_messages
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from services.shared import pack
from tests.clients.browser import ARTIFACTS, run_case
from tests.clients.test_page import axe_problems, no_sideways_scrolling

pytestmark = pytest.mark.browser

WIDTHS = {390: 844, 1280: 900}
SITES = {"alpha": {"synthetic": 14}, "beta": {"herlev": 4000}}  # database origins: alpha is small and synthetic
PIXEL_UM = {"beta": 0.25}  # micrometres per pixel where a site's database records it (alpha's does not)
MATCH_PX = 120  # a database cell's full image; the test cells are 60 px: half its size on screen


def png(size: int, colour=(180, 120, 160)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (size, size), colour).save(out, "PNG")
    return out.getvalue()


def match(site: str, rank: int) -> pb.Match:
    """A match whose nucleus is 1.9x the test cell's (most of its distance), chromatin alike."""
    return pb.Match(cell_id=f"{site}-{rank}", diagnosis="severe_dysplasia", bethesda="HSIL", distance=0.5 + rank,
                    thumbnail=png(48), source_id=f"{site}/cell{rank}.bmp", image_sha256=f"{rank:064x}",
                    similarity=0.95 - 0.1 * rank, **dict(zip(("measure_log2_ratio", "measure_share"), pack([
                        {"concept": "nucleus_size", "query": 100, "match": 190, "share": 0.7},
                        {"concept": "nucleus_shape", "query": 0.8, "match": 0.6, "share": 0.25},
                        {"concept": "chromatin", "query": 0.5, "match": 0.51, "share": 0.05}]))))


class FakeCoordinator(pb_grpc.CoordinatorServicer):
    """Answers like a coordinator with sites alpha and beta; remembers the cases it got."""

    def __init__(self):
        self.cases: list[pb.CaseRequest] = []

    def Info(self, request, context):
        return pb.CoordinatorInfo(classes=class_messages(DEFAULT_CLASSES))

    def ListSites(self, request, context):
        return pb.SitesReply(sites=[pb.SiteStatus(site=name, address="127.0.0.1:1", serving=True, info=pb.SiteInfo(
            site=name, database_cells=sum(origins.values()), database_origins=origins, pixel_um=PIXEL_UM.get(name, 0.0)))
            for name, origins in SITES.items()])

    def GetClassStats(self, request, context):
        return pb.ClassStatsReply(classes=[pb.ClassStats(request_class=request.request_class or "routine", cases=3,
                                                         mean_s=1.0, p50_s=1.0, p95_s=1.5, recent_s=[1, 1, 1.5])])

    def GetImage(self, request, context):
        return pb.ImageReply(cell_id=request.cell_id, image=png(MATCH_PX), diagnosis="severe_dysplasia",
                             mask=png(MATCH_PX, (2, 2, 2)))

    def SubmitCase(self, request, context):
        self.cases.append(request)
        ids = [c.cell_id for c in request.cells]
        stepped = pb.Reason(code="class_stepped_down_within_deadline", params={"asked": "urgent", "served": "routine"})
        yield pb.CaseEvent(plan=pb.CasePlan(case_id="c1", request_class=request.request_class, analysis_s=0.3, sites=[
            pb.SitePlan(site=s, mode="features", request_class="routine", predicted_s=0.5,
                        why=[stepped, pb.Reason(code="predicted", params={"predicted_s": "0.5"})])
            for s in SITES]))
        for site in SITES:
            yield pb.CaseEvent(site_result=pb.SiteResult(site=site, status_code=0, why=[stepped], cells=[
                pb.CellResult(query_cell_id=i, matches=[match(site, r) for r in range(5)]) for i in ids],
                timing=pb.SiteTiming(total_s=0.2)))
        cells = [pb.CellConclusion(query_cell_id=i, bethesda="HSIL", support=9, total=10, abnormal=True,
                                   abnormal_term="HSIL",
                                   abnormal_score=0.9, spread=[pb.TermCount(bethesda="HSIL", count=9),
                                                               pb.TermCount(bethesda="NILM", count=1)])
                 for i in ids]
        yield pb.CaseEvent(summary=pb.CaseSummary(
            case_id=request.case_id or "c1", request_class=request.request_class, total_s=0.3, sites_ok=2,
            bytes_sent=5400, bytes_received=23_000,
            conclusion=pb.CaseConclusion(outcome="abnormal", bethesda="HSIL", cells_with=len(ids),
                                         cells_total=len(ids), cells=cells, rule="term support >= 0.5",
                                         why=[pb.Reason(code="most_significant_abnormality", params={
                                             "term": "HSIL", "cells_with": str(len(ids)), "cells_total": str(len(ids)),
                                             "abnormal_cells": str(len(ids))}),
                                              pb.Reason(code="decision_support_not_a_specimen",
                                                        params={"cells": str(len(ids))})])))


@pytest.fixture(scope="module")
def fake():
    from services.gateway import start_gateway

    servicer = FakeCoordinator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    gateway = start_gateway(f"127.0.0.1:{port}")
    gateway.accounts.add_user("eye", "pathologist", "a long enough password")
    yield gateway, servicer
    gateway.stop()
    server.stop(0.5)


@pytest.fixture(scope="module")
def case_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eye")
    for n in (1, 2):
        (folder / f"cell{n}.png").write_bytes(png(60))
    (folder / "cell1-mask.png").write_bytes(png(60, (1, 1, 1)))
    (folder / "cell2-mask.png").write_bytes(png(61, (1, 1, 1)))  # the wrong size
    return folder


def pick(page, paths) -> None:
    """Files chosen as the file picker gives them to the page (the keyboard's way to the
    picker is test_page.py's)."""
    page.set_input_files("#file-input", [str(p) for p in paths])


def sign_in(page, gateway):
    page.goto(gateway.url)
    page.wait_for_selector("#login-form")
    page.fill("#login-name", "eye")
    page.fill("#login-password", "a long enough password")
    page.press("#login-password", "Enter")
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)


@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_check_a_case_by_eye(browser, fake, case_files, width, tmp_path):
    gateway, coordinator = fake
    context = browser.new_context(viewport={"width": width, "height": WIDTHS[width]}, accept_downloads=True)
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        sign_in(page, gateway)
        # The recent distribution is not shown from 3 cases; it says how many there are.
        assert page.locator("#expect [data-cases='3']").count() == 1
        sent_before = len(coordinator.cases)
        pick(page, sorted(case_files.iterdir()))
        # Caught at pick: the mask of the wrong size is named and nothing can be sent.
        page.wait_for_selector("#file-problems [data-code='companion_size'][data-file='cell2-mask.png']")
        assert page.locator("#submit").is_disabled()
        assert len(coordinator.cases) == sent_before and page.locator(".site-card").count() == 0
        page.click("#clear")
        page.wait_for_selector("#pairing", state="hidden")
        pick(page, [case_files / "cell1.png", case_files / "cell1-mask.png", case_files / "cell2.png"])
        page.wait_for_selector("#pairing tbody tr[data-cell='cell2']")
        page.fill("#accession", f"S26/{width}")  # a common format: sent with '-'
        assert page.locator("#accession-note").inner_text() == f"Sent as S26-{width}"
        run_case(page, "done")
        assert coordinator.cases[-1].case_id == f"S26-{width}"

        # The conclusion first, with the decision-support statement.
        conclusion = page.locator("#conclusion")
        assert conclusion.get_attribute("data-outcome") == "abnormal"
        assert conclusion.locator("[data-term='HSIL']").count() == 1
        assert conclusion.get_attribute("data-codes").split() == ["most_significant_abnormality",
                                                                  "decision_support_not_a_specimen"]
        # services/conclusion_words.py words the codes; the page shows them, codes kept beside.
        assert "most_significant_abnormality" not in conclusion.inner_text()
        assert "Decision support" in page.locator("#decision-support").inner_text()
        assert page.locator("#conclusion").bounding_box()["y"] < page.locator("#cells").bounding_box()["y"]
        # Each cell's term and its spread.
        card = page.locator(".cell-card[data-cell='cell1']")
        assert card.get_attribute("data-term") == "HSIL"
        assert card.locator(".spread-term").evaluate_all("ts => ts.map(t => t.dataset.term)") == ["HSIL", "NILM"]
        assert card.locator(".supports").get_attribute("data-term") == "HSIL"  # what the case rule reads
        # The small synthetic database is said beside its matches; the large real one is not.
        assert card.locator(".site-row[data-site='alpha'] [data-note='database']").count() == 1
        assert card.locator(".site-row[data-site='beta'] [data-note='database']").count() == 0
        # Reason codes in words on the site cards (the code kept for tests and researchers).
        reason = page.locator(".site-card[data-site='alpha'] .reason[data-code='class_stepped_down_within_deadline']")
        assert "class_stepped_down" not in reason.inner_text() and "urgent" in reason.inner_text()
        # Similarity as the site calibrated it, and what differs most.
        tile = card.locator(".site-row[data-site='alpha'] .match").first
        assert tile.get_attribute("data-similarity") == "0.95"
        assert "1.9x" in tile.locator(".why-far").inner_text()
        # The pathologist's wait, from the click; bytes in their unit.
        status = page.locator("#case-status")
        assert float(status.get_attribute("data-waited-s")) > 0
        # Bytes are the researcher's: in the status's tooltip, not its words.
        assert "5 kB sent" in status.get_attribute("title") and "23 kB received" in status.get_attribute("title")
        assert "kB" not in status.inner_text()
        page.wait_for_function("() => document.body.dataset.largerImagesS !== undefined")
        assert page.locator(".match.full").count() == 2 * 5 * len(SITES)
        no_sideways_scrolling(page)
        assert "null" not in page.locator(".results").inner_text()
        assert axe_problems(page) == []
        page.screenshot(path=str(ARTIFACTS / f"check-by-eye-case-{width}px.png"), full_page=True)

        # The viewer: test cell and match at one pixel scale, a scale bar, arrow keys.
        tile.click()
        page.wait_for_selector("#scale-bar[data-zoom]")
        page.wait_for_function("() => document.querySelector('#viewer-match').naturalWidth === %d" % MATCH_PX)
        page.wait_for_function("() => document.querySelector('#scale-text').textContent.includes('image pixels')")
        assert "pixel scale only" in page.locator("#scale-text").inner_text()  # alpha records no pixel size
        sizes = page.evaluate("""() => ['#viewer-query', '#viewer-match'].map((s) => {
            const i = document.querySelector(s); return [i.naturalWidth, i.getBoundingClientRect().width]; })""")
        (query_px, query_css), (match_px, match_css) = sizes
        assert (query_px, match_px) == (60, MATCH_PX)
        assert query_css / query_px == pytest.approx(match_css / match_px, rel=0.03)  # one scale
        zoom = float(page.locator("#scale-bar").get_attribute("data-zoom"))
        bar_px = int(page.locator("#scale-bar").get_attribute("data-pixels"))
        assert page.locator("#scale-line").bounding_box()["width"] == pytest.approx(bar_px * zoom, abs=1.5)
        assert "cell1" in page.locator("#viewer-title").inner_text()
        assert page.locator("#viewer-measures [data-concept='nucleus_size']").count() == 1
        assert "null" not in page.locator("#viewer").inner_text()
        assert axe_problems(page) == []
        page.screenshot(path=str(ARTIFACTS / f"check-by-eye-viewer-{width}px.png"))
        page.keyboard.press("ArrowRight")
        page.wait_for_function("() => document.querySelector('#viewer-title').textContent.includes('match 2 of 5')")
        # A match from beta, whose database records 0.25 µm per pixel: the bar in micrometres.
        page.evaluate("document.querySelector('#viewer').close()")
        card.locator(".site-row[data-site='beta'] .match").first.click()
        page.wait_for_selector("#scale-bar[data-um]")
        page.wait_for_function("() => document.querySelector('#viewer-match').naturalWidth === %d" % MATCH_PX)
        um = float(page.locator("#scale-bar").get_attribute("data-um"))
        zoom = float(page.locator("#scale-bar").get_attribute("data-zoom"))
        assert page.locator("#scale-text").inner_text() == f"{um:g} µm"
        assert page.locator("#scale-line").bounding_box()["width"] == pytest.approx(um / PIXEL_UM["beta"] * zoom, abs=1.5)
        page.screenshot(path=str(ARTIFACTS / f"check-by-eye-viewer-um-{width}px.png"))

        # The report: conclusion, statement, viewport, the cells' terms.
        with page.expect_download() as saved:
            page.evaluate("document.querySelector('#viewer').close()")
            page.click("#export")
        report_file = tmp_path / saved.value.suggested_filename
        saved.value.save_as(report_file)
        report = context.new_page()
        report.goto(report_file.as_uri())
        assert report.locator("meta[name='viewport']").count() == 1
        assert report.locator(".conclusion").get_attribute("data-outcome") == "abnormal"
        assert "most_significant_abnormality" in report.locator(".conclusion").get_attribute("data-codes")
        assert report.locator(".decision-support").count() == 1
        assert report.locator("section.cell[data-cell='cell1'] .vote").get_attribute("data-term") == "HSIL"
        assert report.evaluate("document.documentElement.scrollWidth") <= width
        assert axe_problems(report) == []
        report.close()

        # Refine by concept: the same cells again, the sites asked to weigh chromatin more.
        before = len(coordinator.cases)
        page.select_option("#refine-concepts select[data-concept='chromatin']", "2")
        page.select_option("#refine-concepts select[data-concept='cytoplasm']", "0")
        page.click("#refine-run")
        page.wait_for_selector("#case-status.done")
        refined = coordinator.cases[-1]
        assert len(coordinator.cases) == before + 1 and len(refined.cells) == 2
        assert dict(refined.concept_weights) == {"chromatin": 2.0, "cytoplasm": 0.0}
        tile = page.locator(".cell-card[data-cell='cell1'] .site-row[data-site='alpha'] .match").first

        # More like this, by example: the match is sent as a new case's test cell.
        tile.click()
        page.wait_for_selector("#scale-bar[data-zoom]")
        before = len(coordinator.cases)
        page.click("#viewer-refine")
        page.wait_for_selector("#case-status.done")
        example = coordinator.cases[before]
        assert [c.cell_id for c in example.cells] == ["like-alpha-0"]
        assert example.cells[0].image == png(MATCH_PX) and example.cells[0].mask == png(MATCH_PX, (2, 2, 2))
        assert page.locator(".cell-card[data-cell='like-alpha-0']").count() == 1
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def test_a_case_refused_before_sending_is_not_sent_nor_audited_as_a_case(fake, case_files):
    from tests.clients.web import WebClient

    gateway, coordinator = fake
    web = WebClient(gateway, "refused-case")
    sent = len(coordinator.cases)
    events = web.post_case({"notes.txt": b"not a cell"})
    assert events[-1]["type"] == "error" and events[-1]["code"] == "nothing_sent"
    assert len(coordinator.cases) == sent
    audit = [json.loads(line) for line in gateway.audit_path.read_text().splitlines()]
    mine = [a["action"] for a in audit if a["user"] == "refused-case"]
    assert "case-refused" in mine and "case" not in mine
    # An accession number as labs write it is mapped, not refused.
    events = web.post_case({"cell1.png": (case_files / "cell1.png").read_bytes()}, case_id="S26/0042 7")
    assert events[-1]["type"] == "summary" and coordinator.cases[-1].case_id == "S26-0042-7"
