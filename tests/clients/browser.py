"""Driving the pathologist's page in Debian's chromium through Playwright: the browser and
page fixtures (tests/clients/conftest.py makes them available), signing in, choosing and
dropping files, running a case. Screenshots go to ARTIFACTS (test-artifacts/clients/).
"""
from __future__ import annotations

import base64
import shutil
from pathlib import Path

import pytest

from tests.clients.web import login_link

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts" / "clients"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
CASE_TIMEOUT_MS = 90_000


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.skip(f"Debian's chromium not found at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: print("browser console:", msg.text))  # shown on failure
    yield page
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def open_page(page, handle, name: str = "dr-pat", role: str = "pathologist") -> None:
    """Sign in at gateway `handle` by a one-time link (as the demo prints) and wait for the page."""
    # A file-chooser listener turns on Playwright's interception of the chooser; set it up
    # before the page loads so the first Enter on the drop zone cannot race it.
    page.on("filechooser", lambda chooser: None)
    page.goto(login_link(handle, name, role))
    page.wait_for_selector("body[data-ready='1']", timeout=15_000)


def choose_files_by_keyboard(page, paths) -> None:
    """Tab-free path a keyboard user takes: focus the drop zone, press Enter, pick files."""
    page.focus("#dropzone")
    with page.expect_file_chooser() as chooser:
        page.keyboard.press("Enter")
    chooser.value.set_files([str(p) for p in paths])


def drop_file(page, name: str, data: bytes) -> None:
    """Drop one file on the drop zone, as dragging it from the desktop does."""
    transfer = page.evaluate_handle(
        """([name, b64]) => {
            const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
            const dt = new DataTransfer();
            dt.items.add(new File([bytes], name, {type: "image/png"}));
            return dt;
        }""", [name, base64.b64encode(data).decode()])
    page.dispatch_event("#dropzone", "drop", {"dataTransfer": transfer})


def run_case(page, status_class: str) -> None:
    page.wait_for_selector("#submit:not([disabled])")
    page.focus("#submit")
    page.keyboard.press("Enter")
    page.wait_for_selector(f"#case-status.{status_class}", timeout=CASE_TIMEOUT_MS)
