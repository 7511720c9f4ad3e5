"""One wait per site, predicted from the pathologist's own path: on a slowed link (400 ms
latency, 40 kB/s, Chromium's network emulation) each site card says one wait that adds the
page's own link to the coordinator's prediction, the side panel says the case's (the
slowest site's) and no other number from the plan on, and what a case took beyond its
wait is learnt: the next case's wait includes it. (How close a wait comes to the answer is
the machine's timing, not asserted here.)

The coordinator is test_page_check_by_eye's fake one (no Ray, no sites): its plan predicts
0.3 s for its own analysis of the cells and 0.5 s for each site sent their features after
it, so every second above 0.8 s on a card is the link's.
"""

from __future__ import annotations

import re

import pytest

from tests.clients.test_page_check_by_eye import SITES, case_files, fake, pick, sign_in  # noqa: F401 (fixtures)

pytestmark = pytest.mark.browser

LATENCY_MS = 400
RATE_BYTES_PER_S = 40_000
COORDINATOR_S = 0.3 + 0.5  # the fake's prediction of its analysis, then of each site

# Every text the side panel shows while a site card waits with its wait known (from the plan
# on; before it the panel keeps the kind's past estimate), as the page draws it: looked at on
# any change of the page (texts, the cards' classes and waits: the panel may be drawn before
# the cards are marked), each distinct text once.
WATCH_EXPECT = """() => {
  window.expectTexts = [];
  new MutationObserver(() => {
    if (!document.querySelector('.site-card.waiting[data-predicted-s]')) return;
    const text = document.querySelector('#expect').innerText;
    if (window.expectTexts[window.expectTexts.length - 1] !== text) window.expectTexts.push(text);
  }).observe(document.body, {childList: true, subtree: true, characterData: true,
                             attributes: true, attributeFilter: ['class', 'data-predicted-s']});
}"""


def slow_link(page) -> None:
    cdp = page.context.new_cdp_session(page)
    cdp.send("Network.enable")
    cdp.send("Network.emulateNetworkConditions", {"offline": False, "latency": LATENCY_MS,
                                                  "downloadThroughput": RATE_BYTES_PER_S,
                                                  "uploadThroughput": RATE_BYTES_PER_S})


def test_one_wait_per_site_with_the_link_included(browser, fake, case_files):  # noqa: F811
    gateway, _ = fake
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    page = context.new_page()
    try:
        slow_link(page)
        sign_in(page, gateway)
        page.evaluate(WATCH_EXPECT)
        learnt_s = 0.0  # what the page's earlier cases took beyond their waits
        for attempt in range(2):  # the second case knows the sites' answers on this link
            page.click("#clear")
            pick(page, [case_files / "cell1.png", case_files / "cell2.png"])
            page.wait_for_selector("#pairing tbody tr[data-cell='cell2']")
            page.wait_for_selector("#submit:not([disabled])")
            page.evaluate("() => { window.expectTexts = []; }")
            page.click("#submit")
            page.wait_for_selector("#case-status.done", timeout=60_000)
            waits = [float(page.locator(f".site-card[data-site='{s}']").get_attribute("data-predicted-s"))
                     for s in SITES]
            case_wait = float(page.locator("body").get_attribute("data-case-wait-s"))
            # One wait on each card, and the case's the slowest of them; the coordinator's part
            # of it its analysis and the site's.
            for site in SITES:
                card = page.locator(f".site-card[data-site='{site}']")
                assert float(card.get_attribute("data-coordinator-s")) == pytest.approx(COORDINATOR_S)
                assert card.locator(".site-expected").inner_text().count("~") == 1
                assert card.inner_text().count("expected") == 1  # not the coordinator's own words again
            assert case_wait == max(waits)
            # From the plan on the side panel said that wait (in whole hundredths), no other number.
            shown = [t for t in page.evaluate("() => window.expectTexts") if t.strip()]
            assert shown and all(re.findall(r"\d+\.\d+", t) == [f"{case_wait:.2f}"] for t in shown), shown
            # The link is in it (a round trip over the slowed link beyond the coordinator's
            # part), and so is what the earlier case took beyond its wait.
            assert all(w >= COORDINATOR_S + LATENCY_MS / 1000 + learnt_s - 0.01 for w in waits), (waits, learnt_s)
            waited = float(page.locator("#case-status").get_attribute("data-waited-s"))
            # The page learns this case's own remainder: the wait it took beyond the foreseen.
            foreseen = case_wait - learnt_s
            learnt_now = page.evaluate("() => pathRemainder()")
            if attempt == 0:
                assert learnt_now == pytest.approx(max(0.0, waited - foreseen), abs=0.002), (waited, case_wait)
            learnt_s = learnt_now
    finally:
        context.close()
