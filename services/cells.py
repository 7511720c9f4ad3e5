"""One submitted cell (encoded image, optional background and mask): checked at the
coordinator, decoded at the site, each once.

The coordinator refuses a cell that would fail at every site before fanning it out, but
does not decode its images: `probe_cell` reads the headers (format, size limits, pixel
count, sizes that agree, a PNG or JPEG cut short) and decodes only the mask, whose
labels and nucleus no header shows (a one-channel label image, cheap). Each site, which
must not trust its caller, decodes once (`decode_cell`) and checks the arrays once where
it analyses them (`pathmaster.analysis.cell.analyse_cell`).
"""

from __future__ import annotations

import numpy as np

from pathmaster.analysis.budget import check_analysis_size
from pathmaster.image.io import check_cell, decode_image, decode_mask, probe_image
from pathmaster.records import InvalidInput
from pathmaster.analysis.uploads import check_cell_image


def _name(cell_id: str) -> str:
    return f"cell {cell_id!r}"


def probe_cell(cell_id: str, image: bytes, background: bytes = b"", mask: bytes = b"") -> None:
    """Check encoded cell parts without decoding the image or background.

    Empty background/mask bytes mean "not sent". Raises InvalidInput naming the cell and
    the part (image, background or mask) that is missing, not an image, over a limit
    (MAX_ANALYSIS_PIXELS: a field of view, not a cell),
    visibly cut short, of another size than the image, or (mask) with labels outside 0-3
    or no nucleus.
    """
    name = _name(cell_id)
    if not image:
        raise InvalidInput("no image", f"{name} image")
    header = probe_image(image, f"{name} image")
    check_cell_size(cell_id, image, background, mask)
    if background:
        found = probe_image(background, f"{name} background")
        if found.shape != header.shape:
            raise InvalidInput(
                f"background is {found.width} x {found.height} pixels but the image is "
                f"{header.width} x {header.height} (width x height)", name)
    if mask:
        labels = decode_mask(mask, f"{name} mask", header.shape)
        # The cell rule's mask part, against a stand-in image of the header's size.
        check_cell(np.broadcast_to(np.zeros(3, np.uint8), header.shape + (3,)), labels, None,
                   f"{name} mask")


def decode_cell(cell_id: str, image: bytes, background: bytes = b"", mask: bytes = b""
                ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Encoded cell parts -> (image uint8 (H, W, 3), background or None, mask uint8 (H, W) or None).

    Empty background/mask bytes mean "not sent". Each part is decoded once. Raises
    InvalidInput naming the cell and the part (image, background or mask) that is
    missing or does not decode; a mask of another size than the image, or with labels
    outside 0-3, is refused here too (`decode_mask`), and so is an image that is a mask or a
    field of view, not one cell (`pathmaster.analysis.uploads.check_cell_image`). Whether the parts fit together as
    a cell is `check_cell`'s to say, where they are analysed. A part over
    MAX_ANALYSIS_PIXELS is refused from its header, before anything is decoded.
    """
    name = _name(cell_id)
    if not image:
        raise InvalidInput("no image", f"{name} image")
    check_cell_size(cell_id, image, background, mask)
    rgb = decode_image(image, f"{name} image")
    check_cell_image(rgb, f"{name} image")
    bg = decode_image(background, f"{name} background") if background else None
    labels = decode_mask(mask, f"{name} mask", rgb.shape) if mask else None
    return rgb, bg, labels


def check_cell_size(cell_id: str, image: bytes, background: bytes = b"", mask: bytes = b"") -> int:
    """The pixel cap (MAX_ANALYSIS_PIXELS), from the parts' headers before
    anything is decoded: InvalidInput naming the cell and part, saying the limit and "crop
    the cell". Returns the image's pixel count (what its analysis budget is scaled by)."""
    name = f"cell {cell_id!r}"
    pixels = check_analysis_size(image, f"{name} image")
    for part, data in (("background", background), ("mask", mask)):
        if data:
            check_analysis_size(data, f"{name} {part}")
    return pixels
