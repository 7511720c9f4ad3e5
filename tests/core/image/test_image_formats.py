"""The one allow-list of image formats (pathmaster.image.io.ACCEPTED_FORMATS): PNG, BMP,
TIFF and JPEG decode; the 11 other formats Pillow can read are refused from their header,
with code FORMAT_NOT_ACCEPTED, by every entry point that reads an upload or a dataset file,
and none of their openers or decoders runs."""

from __future__ import annotations

import io
import zlib

import numpy as np
import pytest
from PIL import Image

from pathmaster.image import io as imageio
from pathmaster.analysis.budget import check_analysis_size
from pathmaster.image.io import (
    ACCEPTED_FORMATS,
    FORMAT_NOT_ACCEPTED,
    accepted_format,
    decode_image,
    decode_mask,
    probe_image,
    read_image,
)
from pathmaster.records import InvalidInput
from services.cells import decode_cell, probe_cell
from services.client import cells_from_files
from services.gateway.upload import check_file

# The formats a site used to decode beyond the documented four (an outside fuzzer's list),
# each with the mode Pillow writes it in.
REFUSED = {"GIF": "P", "PPM": "RGB", "TGA": "RGB", "SGI": "RGB", "PCX": "RGB", "ICO": "RGBA",
           "WEBP": "RGB", "QOI": "RGB", "SPIDER": "F", "DDS": "RGB", "IM": "RGB"}


def encoded(fmt: str, mode: str = "RGB", size: tuple[int, int] = (24, 16)) -> bytes:
    """A small image of `mode` and `size` (width, height) saved by Pillow as `fmt`."""
    rgb = np.random.default_rng(0).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    picture = Image.fromarray(rgb).convert(mode)
    buffer = io.BytesIO()
    picture.save(buffer, format=fmt)
    return buffer.getvalue()


@pytest.fixture(params=sorted(REFUSED))
def other_format(request) -> tuple[str, bytes]:
    fmt = request.param
    data = encoded(fmt, REFUSED[fmt])
    assert Image.open(io.BytesIO(data)).format == fmt  # Pillow alone would read it
    return fmt, data


def entry_points(tmp_path):
    """Every reading of an upload or a dataset file, by who calls it: (name, call(data))."""
    def from_file(data):
        path = tmp_path / "cell.png"  # a misleading suffix: the header decides
        path.write_bytes(data)
        return path

    return {
        "decode_image (site, index)": lambda data: decode_image(data, "cell.png"),
        "probe_image (coordinator, gateway, batch)": lambda data: probe_image(data, "cell.png"),
        "decode_mask (site, coordinator)": lambda data: decode_mask(data, "cell-mask.png", (16, 24)),
        "read_image (index)": lambda data: read_image(from_file(data)),
        "check_analysis_size (site)": lambda data: check_analysis_size(data, "cell.png"),
        "accepted_format": lambda data: accepted_format(data, "cell.png"),
        "probe_cell (coordinator)": lambda data: probe_cell("c1", data),
        "decode_cell (site)": lambda data: decode_cell("c1", data),
        "check_file (gateway)": lambda data: check_file("cell.png", data),
        "cells_from_files (query)": lambda data: cells_from_files([from_file(data)]),
    }


def test_every_entry_point_refuses_another_format_by_its_code(other_format, tmp_path, monkeypatch):
    fmt, data = other_format
    tried = []
    for name, (factory, accept) in list(Image.OPEN.items()):
        if name not in ACCEPTED_FORMATS:
            def spy(*args, _factory=factory, _name=name):
                tried.append(_name)
                return _factory(*args)
            monkeypatch.setitem(Image.OPEN, name, (spy, accept))
    for who, call in entry_points(tmp_path).items():
        with pytest.raises(InvalidInput) as refused:
            call(data)
        assert refused.value.code == FORMAT_NOT_ACCEPTED, (who, refused.value)
        for accepted in ACCEPTED_FORMATS:
            assert accepted in refused.value.problem, who  # the message names what would do
    assert tried == []  # no other format's opener looked at the bytes, so no decoder ran


@pytest.mark.parametrize("fmt", sorted(ACCEPTED_FORMATS))
def test_the_accepted_formats_decode_through_every_entry_point(fmt, tmp_path):
    data = encoded(fmt, "L" if fmt == "TIFF" else "RGB")
    assert accepted_format(data, "cell") == fmt
    assert decode_image(data, "cell").shape == (16, 24, 3)
    for who, call in entry_points(tmp_path).items():
        if "mask" not in who:
            call(data)  # raises nothing


def test_bytes_that_are_no_image_are_refused_as_not_an_accepted_format():
    with pytest.raises(InvalidInput) as refused:
        decode_image(b"GIF89a but then a note, not a picture", "note.png")
    assert refused.value.code == FORMAT_NOT_ACCEPTED
    assert refused.value.source == "note.png"


def test_a_decompression_bomb_header_is_refused_before_decoding():
    # A PNG header that claims 100000 x 100000 pixels over a few bytes of data.
    png = encoded("PNG", "L", (1, 1))
    ihdr = b"IHDR" + (100000).to_bytes(4, "big") * 2 + png[24:29]
    bomb = png[:12] + ihdr + zlib.crc32(ihdr).to_bytes(4, "big") + png[33:]
    with pytest.raises(InvalidInput) as refused:
        probe_image(bomb, "bomb.png")
    assert refused.value.code == imageio.TOO_MANY_PIXELS
