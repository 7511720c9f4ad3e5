"""The pathologist's page in a real browser: Debian's chromium driven by Playwright.

Adds a synthetic 6-cell case with the keyboard (file chooser) and by drag and drop, runs
it, and checks what a person would see: 5 matches per cell from each of 3 sites, a vote
per cell, each site's timing, bad files named where they were added, a site that is down
shown on its own row while the other sites' matches still show. Screenshots go to
test-artifacts/clients/.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.clients.browser import ARTIFACTS, choose_files_by_keyboard, drop_file, open_page, run_case

pytestmark = pytest.mark.browser

def test_case_results_stream_into_the_page(page, gateway, case_dir, bad_files):
    open_page(page, gateway)
    assert page.locator("#site-chips .chip-ok").count() == 3

    choose_files_by_keyboard(page, sorted(case_dir.iterdir()) + [bad_files["oversize"]])
    drop_file(page, bad_files["not_image"].name, bad_files["not_image"].read_bytes())
    # The dropped note is uploaded and checked as soon as it is added, and refused there.
    not_image = page.locator("#file-problems li[data-file='scan-notes.png']")
    not_image.wait_for(timeout=30_000)
    assert "not an image file" in not_image.inner_text()

    # The pairing the user sees before sending: companions beside their cell.
    # Its problem may show before the pairing without it comes back (another upload's end
    # redraws the list with the pairing of the moment): wait for the case of six cells.
    rows = page.locator("#pairing tbody tr")
    expect(rows).to_have_count(6, timeout=30_000)  # the note has left the case
    cell1 = page.locator("#pairing tr[data-cell='cell1']")
    assert "cell1-background.png" in cell1.inner_text() and "cell1-mask.png" in cell1.inner_text()
    assert "estimated" in page.locator("#pairing tr[data-cell='cell4']").inner_text()
    # The oversize file is refused where it was added, before anything is sent.
    too_large = page.locator("#file-problems li[data-file='huge.png']")
    assert "too large" in too_large.inner_text()

    # The kinds of case in words; nothing of the network's machinery on the page.
    classes = page.locator("#classes").inner_text()
    assert "Intra-operative — fastest" in classes and "Diagnostic" in classes and "Teaching" in classes
    assert page.locator("#class-bulk").count() == 0
    for jargon in ("AF41", "AF21", "DSCP", "bulk", "UNAVAILABLE"):
        assert jargon not in page.locator("body").inner_text()
    page.fill("#accession", "S26-01234")
    page.click("label[for='class-urgent']")
    run_case(page, "done")
    status = page.locator("#case-status")
    assert "S26-01234" in status.inner_text() and float(status.get_attribute("data-waited-s")) > 0

    cards = page.locator(".cell-card:not(.rejected)")
    assert cards.count() == 6
    for i in range(6):
        card = cards.nth(i)
        assert card.locator(".site-row").count() == 3
        for site in ("site-a", "site-b", "site-c"):
            assert card.locator(f".site-row[data-site='{site}'] .match").count() == 5
        assert card.locator(".vote .dx").inner_text().endswith("/15")
    for site in ("site-a", "site-b", "site-c"):
        site_card = page.locator(f".site-card[data-site='{site}']")
        assert "ok" in site_card.get_attribute("class")
        assert site_card.locator(".site-time").inner_text().endswith(" s")
    assert page.locator(".cell-card[data-cell='scan-notes']").count() == 0  # never sent
    # Completion times of the class now include this case.
    page.wait_for_selector("#expect .expect-mean")
    assert "Intra-operative — fastest:" in page.locator("#expect").inner_text()

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "case-results.png"), full_page=True)

    # Enlarge a match with the keyboard; the full image comes through GetImage.
    first = cards.nth(0).locator(".site-row[data-site='site-a'] .match").first
    first.focus()
    page.keyboard.press("Enter")
    page.wait_for_selector("#viewer-match[data-full='1']", timeout=15_000)
    assert page.evaluate("document.querySelector('#viewer-match').naturalWidth") > 0
    assert page.locator("#viewer").evaluate("d => d.open")
    page.screenshot(path=str(ARTIFACTS / "enlarged-match.png"))
    page.keyboard.press("Escape")
    assert not page.locator("#viewer").evaluate("d => d.open")


def test_a_down_site_shows_on_its_row_and_the_rest_of_the_case_still_shows(
        page, down_gateway, case_dir):
    open_page(page, down_gateway)
    assert page.locator("#site-chips .chip-down[data-site='site-down']").count() == 1

    choose_files_by_keyboard(page, sorted(case_dir.iterdir()))
    run_case(page, "warn")

    assert "1 failed" in page.locator("#case-status").inner_text()
    down = page.locator(".site-card[data-site='site-down']")
    assert "down" in down.get_attribute("class") and "not reachable" in down.inner_text()
    assert "UNAVAILABLE" not in page.locator("body").inner_text()  # status names are for the tooltip
    cards = page.locator(".cell-card:not(.rejected)")
    assert cards.count() == 6
    for i in range(6):
        card = cards.nth(i)
        assert "not reachable" in card.locator(".site-row[data-site='site-down']").inner_text()
        for site in ("site-a", "site-b"):
            assert card.locator(f".site-row[data-site='{site}'] .match").count() == 5
        assert card.locator(".vote .dx").inner_text().endswith("/10")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "site-down.png"), full_page=True)


def test_a_missing_coordinator_is_a_message_on_the_page(page, case_dir, nowhere):
    from services.gateway import start_gateway

    handle = start_gateway(nowhere)
    try:
        open_page(page, handle)
        words = "The coordinator is not reachable; is it running?"
        assert page.locator("#banner").inner_text() == words
        choose_files_by_keyboard(page, [case_dir / "cell1.png"])
        run_case(page, "error")
        assert words in page.locator("#case-status").inner_text()
        body = page.locator("body").inner_text()
        assert body.count("not reachable") == 1 and "UNAVAILABLE" not in body  # once, in words
        assert not page.locator("#submit").is_disabled()  # the user can try again
    finally:
        handle.stop()


def test_a_teacher_is_offered_only_what_a_teacher_may_send(page, gateway):
    open_page(page, gateway, "tess", "teacher")
    assert page.locator("#class-urgent").count() == 0 and page.locator("#class-bulk").count() == 0
    assert page.locator("#class-teaching").count() == 1
    assert "tess (teacher)" in page.locator("#who").inner_text()


def test_signing_in_with_a_password_and_out_again(page, gateway):
    gateway.accounts.add_user("paula", "pathologist", "a long enough password")
    page.goto(gateway.url)
    page.wait_for_selector("#login-form")
    page.fill("#login-name", "paula")
    page.fill("#login-password", "not her password")
    page.press("#login-password", "Enter")
    page.wait_for_selector("#login-error:not([hidden])")
    assert "do not match" in page.locator("#login-error").inner_text()
    page.fill("#login-password", "a long enough password")
    page.press("#login-password", "Enter")
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)
    assert "paula (pathologist)" in page.locator("#who").inner_text()
    page.click("#logout")
    page.wait_for_selector("#login-form")
    assert page.locator("#app").is_hidden()
