"""What the gateway checks of a case's files before sending (their headers, not their
pixels)."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from pathmaster.image.io import decode_image
from pathmaster.records import InvalidInput
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
