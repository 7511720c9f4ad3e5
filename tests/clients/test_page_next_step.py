"""A case that cannot be concluded says so as a sentence and says what to do next, on the
page and in the saved report, in the words of the reason codes (services/reasons.py) that
the CLI prints too. The coordinator is test_page_check_by_eye's fake one, its conclusion
replaced by the coordinator's own for sites that disagree about a cell all-NILM elsewhere."""

from __future__ import annotations

import pytest

from pathmaster.conclusion import SiteCell, conclude_case
from services.conclusion_words import format_conclusion, next_step
from services.coordinator.conclusion import conclusion_message
from tests.clients.browser import run_case
from tests.clients.test_page import no_sideways_scrolling
from tests.clients.test_page_check_by_eye import FakeCoordinator, case_files, pick, sign_in  # noqa: F401 (fixture)

LONG = "149143370-149143378-"  # a Herlev cell's name: two image ids and its number

pytestmark = pytest.mark.browser


def disputed(ids) -> object:
    """The coordinator's conclusion when alpha reads the first cell abnormal and beta NILM."""
    answers = [SiteCell("alpha", ids[0], ("HSIL", "HSIL", "HSIL", "NILM", "NILM")),
               SiteCell("beta", ids[0], ("NILM",) * 5),
               SiteCell("gamma", ids[0], ("NILM",) * 5)] + [SiteCell("alpha", i, ("NILM",) * 5) for i in ids[1:]]
    return conclusion_message(conclude_case(answers, cell_ids=ids))


class Disputed(FakeCoordinator):
    def SubmitCase(self, request, context):
        for event in super().SubmitCase(request, context):
            if event.WhichOneof("event") == "summary":
                event.summary.conclusion.CopyFrom(disputed([c.cell_id for c in request.cells]))
            yield event


@pytest.fixture(scope="module")
def disputed_gateway():
    from concurrent import futures

    import grpc

    from services.gateway import start_gateway
    from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_CoordinatorServicer_to_server(Disputed(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    gateway = start_gateway(f"127.0.0.1:{port}")
    gateway.accounts.add_user("eye", "pathologist", "a long enough password")
    yield gateway
    gateway.stop()
    server.stop(0.5)


def test_the_cli_says_what_to_do_next():
    lines = format_conclusion(disputed(["n1", "n2"]))
    assert lines[0].startswith("Conclusion: ") and "cannot be concluded" in lines[0]
    step = next(line for line in lines if "What to do next: " in line)
    assert "Look at cell n1" in step and "alpha" in step and "beta, gamma" in step
    assert lines.index(step) == 3  # after the conclusion and its two cells, before the statement
    assert next_step(conclusion_message(conclude_case([SiteCell("a", "x", ("NILM",) * 5)]))) == ""


def test_the_page_says_what_to_do_next(browser, disputed_gateway, case_files, tmp_path):  # noqa: F811
    context = browser.new_context(viewport={"width": 390, "height": 844}, accept_downloads=True)
    page = context.new_page()
    try:
        # Herlev-long names, on a phone: they wrap in the list of cells, the page does not widen.
        names = [LONG + "001", LONG + "002"]
        for name, source in zip(names, ("cell1.png", "cell2.png")):
            (tmp_path / f"{name}.png").write_bytes((case_files / source).read_bytes())
        sign_in(page, disputed_gateway)
        pick(page, [tmp_path / f"{name}.png" for name in names])
        page.wait_for_selector(f"#pairing tbody tr[data-cell='{names[1]}']")
        no_sideways_scrolling(page)
        run_case(page, "done")
        no_sideways_scrolling(page)
        conclusion = page.locator("#conclusion")
        assert conclusion.get_attribute("data-outcome") == "cannot_conclude"
        assert conclusion.get_attribute("data-codes").split()[:2] == ["sites_disagree", "next_review_disputed_cell"]
        headline = page.locator("#conclusion-text").inner_text().strip()
        assert headline[0].isupper()  # a sentence, not a fragment
        step = page.locator("#next-step")
        assert step.is_visible() and step.inner_text().startswith(f"What to do next: Look at cell {names[0]}")
        page.screenshot(path=str(tmp_path / "next-step.png"))
        from tests.clients.browser import ARTIFACTS

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        conclusion.screenshot(path=str(ARTIFACTS / "cannot-conclude-390px.png"))
        with page.expect_download() as saved:
            page.click("#export")
        report = saved.value.path().read_text()
        assert "What to do next:" in report and f"Look at cell {names[0]}" in report
        # Clear takes the advice away with the rest of the case.
        page.click("#clear")
        page.wait_for_selector("#conclusion", state="hidden")
    finally:
        context.close()
