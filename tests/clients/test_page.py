"""The page as a pathologist meets it on a phone (390 px) and a desktop (1440 px), in
Debian's chromium through Playwright: signing in with a password, a 6-cell case, axe-core's
accessibility check (no serious or critical violations), the per-site progress and predicted
wait, each match's similarity and the database notes, the larger images fetched after the
answer, the viewer, the saved case report, and the web app manifest that lets Chromium
install the page as an app. test_page_check_by_eye.py checks what the page shows against a
fake coordinator's known answers.

Screenshots (test-artifacts/clients/): login-, case- and viewer-{390,1440}px.png, the report
as case-report-{390,1440}px.pdf (its print layout), and figures-{390,1440}px.json (each
site's reply bytes, the seconds to the larger images).
"""

from __future__ import annotations

import io
import json
import urllib.request

import pytest
from PIL import Image

from tests.clients.browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, choose_files_by_keyboard, run_case
from tests.clients.web import WebClient, multipart

pytestmark = pytest.mark.browser

WIDTHS = {390: 844, 1440: 900}  # a phone (iPhone 12-15 class) and a desktop screen
SITES = ("site-a", "site-b", "site-c")
BAD_IMPACTS = ("serious", "critical")


def axe_problems(page) -> list[str]:
    """axe-core's serious and critical violations on the page as it is now, one line each."""
    from axe_playwright_python.sync_playwright import Axe

    results = Axe().run(page)
    return [f"{v['id']} ({v['impact']}): {v['help']} at "
            + "; ".join(" ".join(n["target"]) for n in v["nodes"][:3])
            for v in results.response["violations"] if v["impact"] in BAD_IMPACTS]


@pytest.fixture(scope="module")
def warmed_gateway(gateway, case_dir):
    """The package's gateway after one case of the class the page sends, so the
    coordinator has seen each site answer and its plan predicts the next case."""
    web = WebClient(gateway, "warm-up")
    files = {p.name: p.read_bytes() for p in sorted(case_dir.iterdir())}
    body, kind = multipart({"request_class": "routine"}, files)
    status, _, reply = web.post("api/case", body, kind)
    assert status == 200 and json.loads(reply.splitlines()[-1])["type"] == "summary", reply[-500:]
    return gateway


def no_sideways_scrolling(page) -> None:
    width = page.evaluate("window.innerWidth")
    assert page.evaluate("document.documentElement.scrollWidth") <= width
    for box in page.locator(".match").evaluate_all(
            "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; })"):
        assert 0 <= box[0] and box[1] <= width, f"a match is off screen: {box} (width {width})"


# Run in the page before its own scripts: every /api/case reply is cloned and the clone's
# text kept in window.__caseReplies, read by the test once the case is done.
TEE_CASE_REPLIES = """
window.__caseReplies = [];
const pageFetch = window.fetch.bind(window);
window.fetch = async (resource, options) => {
  const reply = await pageFetch(resource, options);
  if (String(resource.url || resource).includes("/api/case")) {
    reply.clone().text().then((text) => window.__caseReplies.push(text));
  }
  return reply;
};
"""

@pytest.mark.parametrize("width", sorted(WIDTHS))
def test_sign_in_and_a_6_cell_case_at_phone_and_desktop_width(browser, warmed_gateway, case_dir,
                                                              width, tmp_path):
    gateway = warmed_gateway
    name = f"paula-{width}"
    if gateway.accounts.role(name) is None:
        gateway.accounts.add_user(name, "pathologist", "a long enough password")
    context = browser.new_context(viewport={"width": width, "height": WIDTHS[width]},
                                  accept_downloads=True)
    page = context.new_page()
    page.add_init_script(TEE_CASE_REPLIES)
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("filechooser", lambda chooser: None)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    try:
        # Signing in with the keyboard: name, Tab, password, Enter.
        page.goto(gateway.url)
        page.wait_for_selector("#login-form")
        assert axe_problems(page) == []
        page.screenshot(path=str(ARTIFACTS / f"login-{width}px.png"), full_page=True)
        page.keyboard.type(name)  # the name field has the focus
        page.keyboard.press("Tab")
        page.keyboard.type("a long enough password")
        page.keyboard.press("Enter")
        page.wait_for_selector("body[data-ready='1']", timeout=15_000)
        assert page.locator("#who").inner_text().startswith(f"{name} (pathologist)")
        page.wait_for_selector("#expect .expect-mean")  # the class's wait, shown before sending
        assert "Expect about" in page.locator("#expect").inner_text()

        choose_files_by_keyboard(page, sorted(case_dir.iterdir()))
        page.wait_for_selector("#pairing tbody tr[data-cell='cell6']")
        page.fill("#accession", f"S26-{width}")
        assert axe_problems(page) == []
        run_case(page, "done")
        # The case's events as the page received them (a copy of its own stream, kept by
        # TEE_CASE_REPLIES): Chromium's DevTools copy of a streamed body may be gone by the
        # time the case is done ("No data found for resource"), as it was in a full run.
        page.wait_for_function("window.__caseReplies && window.__caseReplies.length > 0")
        events = [json.loads(line) for line in page.evaluate("window.__caseReplies[0]").splitlines()]

        cards = page.locator(".cell-card:not(.rejected)")
        assert cards.count() == 6
        for i in range(6):
            for site in SITES:
                assert cards.nth(i).locator(f".site-row[data-site='{site}'] .match").count() == 5
        no_sideways_scrolling(page)

        # Each site's wait on the pathologist's path, and its progress, on its card: the
        # coordinator's part (its analysis first for a site sent features) and this page's link.
        plan = next(e for e in events if e["type"] == "plan")
        for site in plan["sites"]:
            card = page.locator(f".site-card[data-site='{site['site']}']")
            assert site["predicted_s"], plan  # the warm-up case taught the coordinator
            coordinator = site["predicted_s"] + (plan["analysis_s"] if site["mode"] == "features" else 0.0)
            assert float(card.get_attribute("data-coordinator-s")) == pytest.approx(coordinator)
            assert float(card.get_attribute("data-predicted-s")) >= coordinator
            assert "expected in ~" in card.locator(".site-expected").inner_text()
            assert card.locator("progress").evaluate("p => p.value") == 1  # answered
            assert card.locator(".site-time").inner_text().endswith(" s")

        # Similarity: calibrated at each site, so it reads the same at every site; the raw
        # distance only in the tooltip; each match says what differs most.
        first = cards.nth(0)
        for site in SITES:
            tiles = first.locator(f".site-row[data-site='{site}'] .match")
            similarity = [float(tiles.nth(k).get_attribute("data-similarity")) for k in range(5)]
            assert similarity == sorted(similarity, reverse=True) and 0 <= similarity[-1] <= 1
            assert tiles.nth(0).locator(".similarity").inner_text().endswith("% similar")
            assert "distance" in tiles.nth(0).get_attribute("title")
            # A synthetic database is said beside its matches.
            assert first.locator(f".site-row[data-site='{site}'] [data-note='database']").count() == 1
        assert "distance" not in page.locator("#cells").inner_text()
        assert "null" not in page.locator("#cells").inner_text() and "undefined" not in page.locator("#cells").inner_text()
        # The larger images replace the wire thumbnails after the answer.
        page.wait_for_function("() => document.body.dataset.largerImagesS !== undefined", timeout=120_000)
        assert page.locator(".match.full").count() == 6 * 5 * len(SITES)
        # The figures the page's note reports: each site's reply bytes, the time to larger images.
        (ARTIFACTS / f"figures-{width}px.json").write_text(json.dumps({
            "reply_bytes": {e["site"]: e["bytes_received"] for e in events if e["type"] == "site"},
            "larger_images_s": float(page.evaluate("document.body.dataset.largerImagesS")),
            "larger_images": 6 * 5 * len(SITES)}))

        assert axe_problems(page) == []
        page.screenshot(path=str(ARTIFACTS / f"case-{width}px.png"), full_page=True)
        # The viewer: the test cell beside its closest match at one pixel scale, the bar in
        # micrometres (the synthetic sites record their generator's pixel size).
        first.locator(f".site-row[data-site='{SITES[0]}'] .match").first.click()
        page.wait_for_function("() => document.querySelector('#scale-text').textContent.endsWith(' µm')")
        page.screenshot(path=str(ARTIFACTS / f"viewer-{width}px.png"))
        page.keyboard.press("Escape")
        page.wait_for_selector("#viewer", state="hidden")

        # The case report: a file of its own, with the thumbnails, diagnoses, sites and times.
        with page.expect_download() as saved:
            page.click("#export")
        report_file = tmp_path / saved.value.suggested_filename
        saved.value.save_as(report_file)
        assert report_file.name == f"pathmaster-report-S26-{width}.html"
        report = context.new_page()
        report.goto(report_file.as_uri())
        text = report.locator("body").inner_text()
        summary = events[-1]
        assert f"Case S26-{width}" in text and summary["case_id"] in text and "Diagnostic" in text
        assert report.locator(".decision-support").count() == 1
        assert report.locator("section.cell").count() == 6
        for site in SITES:
            assert report.locator(f"section.cell[data-cell='cell1'] .row[data-site='{site}'] img").count() == 5
            assert report.locator(".sites").inner_text().count(site) == 1
        cell = next(e for e in events if e["type"] == "site")["cells"][0]
        section = report.locator(f"section.cell[data-cell='{cell['query_cell_id']}']")
        assert cell["matches"][0]["diagnosis"].replace("_", " ") in section.inner_text()
        assert report.evaluate("[...document.images].every(i => i.complete && i.naturalWidth > 0)")
        assert axe_problems(report) == []
        report.emulate_media(media="print")
        assert report.evaluate(
            "getComputedStyle(document.querySelector('section.cell')).breakInside") == "avoid"
        report.pdf(path=str(ARTIFACTS / f"case-report-{width}px.pdf"), format="A4")
        # The page itself prints as its results, without the controls.
        page.emulate_media(media="print")
        assert page.locator(".controls").is_hidden() and page.locator("#cells").is_visible()
    finally:
        context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


@pytest.fixture
def lone_gateway(nowhere):
    """A gateway without a coordinator: the page, its manifest and icons need none."""
    from services.gateway import start_gateway

    handle = start_gateway(nowhere)
    yield handle
    handle.stop()


def test_the_manifest_lets_chromium_install_the_page(browser, lone_gateway, tmp_path):
    gateway = lone_gateway
    with urllib.request.urlopen(gateway.url + "static/manifest.webmanifest", timeout=30) as reply:
        assert reply.headers["Content-Type"] == "application/manifest+json"
        manifest = json.load(reply)
    assert manifest["display"] == "standalone" and manifest["start_url"] == "/"
    sizes = set()
    for icon in manifest["icons"]:
        with urllib.request.urlopen(gateway.url + icon["src"].lstrip("/"), timeout=30) as reply:
            assert reply.headers["Content-Type"] == icon["type"] == "image/png"
            size = Image.open(io.BytesIO(reply.read())).size
        assert f"{size[0]}x{size[1]}" == icon["sizes"]
        sizes.add(size[0])
    assert {192, 512} <= sizes  # what Chromium asks of an installable app

    # Chromium's own verdict: a profile on disk (an incognito one may not install apps).
    context = browser.browser_type.launch_persistent_context(
        str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
    try:
        page = context.new_page()
        page.goto(gateway.url)
        page.wait_for_selector("#login-form")
        cdp = context.new_cdp_session(page)
        parsed = cdp.send("Page.getAppManifest")
        assert parsed["errors"] == [] and parsed["url"].endswith("/static/manifest.webmanifest")
        assert cdp.send("Page.getInstallabilityErrors")["installabilityErrors"] == []
    finally:
        context.close()
