"""The page's words for a match (services/gateway/static/words.js), run in the browser as
the page runs them: a similarity that only the test cell itself reads as 100%, and "why
close" whose ratios are bounded and shown only where the site could compare the values."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

WORDS_JS = Path(__file__).parents[2] / "services" / "gateway" / "static" / "words.js"


@pytest.fixture
def words(page):
    page.set_content("<!doctype html><title>words</title>")
    page.add_script_tag(content="var state = {};\n" + WORDS_JS.read_text())
    return lambda expression, *args: page.evaluate(expression, *args)


def test_only_the_same_cell_reads_100_percent(words):
    texts = words("""() => [0.99889, 0.9949, 0.5, 0.004].map((s) => similarityText({similarity: s}))""")
    assert texts == ["99% similar", "99% similar", "50% similar", "<1% similar"]
    same = words("() => similarityText({similarity: 1, same_cell: true})")
    assert same.startswith("same cell") and "100%" in same


def test_ratios_are_bounded_and_shown_only_where_comparable(words):
    said = words("""() => [
        measureWords({concept: "cytoplasm", ratio: 1 / 55.6, share: 0.6}, true),
        measureWords({concept: "nucleus_size", ratio: 42.2, share: 0.6}, true),
        measureWords({concept: "nucleus_size", ratio: 1.9, share: 0.6}, true),
        measureWords({concept: "cytoplasm", ratio: null, share: 0.6}, true),
        measureWords({concept: "chromatin", ratio: 1.02, share: 0.6}, true, true),
        measureWords({concept: "chromatin", ratio: 1.02, share: 0.1})]""")
    assert said == ["cell more than 3x smaller", "nucleus more than 3x larger", "nucleus 1.9x larger",
                    "cytoplasm differs", "chromatin texture", "chromatin alike"]
    # A measure the site could not compare is never offered as what is close.
    close = words("""() => measureSummary([{concept: "nucleus_size", ratio: 2, share: 0.9},
                                          {concept: "cytoplasm", ratio: null, share: 0.05}]).close""")
    assert close is None
