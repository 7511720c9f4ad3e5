"""Turning one submitted cell (encoded image, optional background and mask) into arrays.

Used twice on purpose: the coordinator decodes every cell before fan-out so a corrupt
one is refused once, naming it; each site decodes again because it must not trust its
caller.
"""

from __future__ import annotations

import numpy as np

from pathmaster.budget import check_analysis_size
from pathmaster.imageio import check_cell, decode_image, decode_mask
from pathmaster.records import InvalidInput


def decode_cell(cell_id: str, image: bytes, background: bytes = b"", mask: bytes = b""
                ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Encoded cell parts -> (image uint8 (H, W, 3), background or None, mask uint8 (H, W) or None).

    Empty background/mask bytes mean "not sent". Raises InvalidInput naming the cell and
    the part (image, background or mask) that is missing, corrupt or does not fit; a part
    over MAX_ANALYSIS_PIXELS is refused from its header, before anything is decoded.
    """
    name = f"cell {cell_id!r}"
    if not image:
        raise InvalidInput("no image", f"{name} image")
    check_cell_size(cell_id, image, background, mask)
    rgb = decode_image(image, f"{name} image")
    bg = decode_image(background, f"{name} background") if background else None
    labels = decode_mask(mask, f"{name} mask", rgb.shape) if mask else None
    check_cell(rgb, labels, bg, name)
    return rgb, bg, labels


def check_cell_size(cell_id: str, image: bytes, background: bytes = b"", mask: bytes = b"") -> int:
    """The pixel cap (MAX_ANALYSIS_PIXELS, issue 10 item 5), from the parts' headers before
    anything is decoded: InvalidInput naming the cell and part, saying the limit and "crop
    the cell". Returns the image's pixel count (what its analysis budget is scaled by)."""
    name = f"cell {cell_id!r}"
    pixels = check_analysis_size(image, f"{name} image")
    for part, data in (("background", background), ("mask", mask)):
        if data:
            check_analysis_size(data, f"{name} {part}")
    return pixels
