"""What the gateway checks of a case's files before sending (their headers, not their
pixels), and the per-site closeness it adds to each match."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from pathmaster.imageio import decode_image
from pathmaster.records import InvalidInput
from services.gateway.events import add_closeness
from services.gateway.upload import check_upload


def png(width: int, height: int, value: int = 128) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.full((height, width, 3), value, np.uint8)).save(out, format="PNG")
    return out.getvalue()


def corrupt_pixels(data: bytes) -> bytes:
    """The PNG with its compressed pixel data replaced by garbage of the same length and a
    valid chunk CRC: the header and the file's end are intact, decoding fails."""
    start = data.index(b"IDAT") - 4
    length = int.from_bytes(data[start:start + 4], "big")
    garbage = bytes((7 * i + 3) % 256 for i in range(length))
    crc = zlib.crc32(b"IDAT" + garbage).to_bytes(4, "big")
    return data[:start + 8] + garbage + crc + data[start + 12 + length:]


def test_headers_refuse_what_they_can_show_and_name_the_file():
    files = {"a.png": png(40, 30), "a-mask.png": png(20, 30),          # mask of another size
             "b.png": b"a note, not a picture", "c.png": png(40, 30)[:60],  # cut short
             "d.png": png(40, 30), "d-background.png": png(40, 30, 250)}
    checked = check_upload(files)
    assert [c.cell_id for c in checked.cells] == ["d"]
    problems = dict(checked.rejected)
    assert "a-mask.png" in problems["a"] and "20 x 30" in problems["a"] and "40 x 30" in problems["a"]
    assert "not an image file" in problems["b"] and "b.png" in problems["b"]
    assert "c.png" in problems["c"]
    assert checked.cells[0].background == files["d-background.png"]


def test_pixels_are_left_to_the_sites_which_decode_them():
    broken = corrupt_pixels(png(40, 30))
    with pytest.raises(InvalidInput):
        decode_image(broken, "broken.png")  # what a site's decoding says of it
    assert [c.cell_id for c in check_upload({"broken.png": broken}).cells] == ["broken"]


def test_closeness_ranks_a_sites_matches_on_one_scale():
    cells = [{"matches": [{"distance": d} for d in (0.10, 0.20, 0.40)]},
             {"matches": [{"distance": d} for d in (0.20, 0.30, 0.90)]},
             {"matches": []}]
    add_closeness(cells)
    got = [[m["closeness"] for m in c["matches"]] for c in cells]
    # 6 matches: the closest is 100, ties share the higher value, the farthest is 100/6.
    assert got == [[100.0, 83.3, 33.3], [83.3, 50.0, 16.7], []]
    scaled = [{"matches": [{"distance": 10 * m["distance"]} for m in c["matches"]]} for c in cells]
    add_closeness(scaled)  # a site measuring distances 10x larger gets the same scores
    assert [[m["closeness"] for m in c["matches"]] for c in scaled] == got
