"""Is a decoded image one cell? The check every path runs before an image becomes a cell.

The page (staging and sending), `pathmaster batch`, `pathmaster query` (at the coordinator's
analysis and at each site, where the cell is decoded: `services.cells.decode_cell`) and
`pathmaster search` call `check_cell_image` on the decoded RGB array, after the decoders
(`pathmaster.image.io`) have said it is an image at all. A wrong file refused here is refused
with the same code and words on every path; taken as a cell, it would be matched and
counted towards the case's conclusion.

Refused, each with a stable code (`NotACell.code`) and plain words:

- ``looks_like_mask``: a segmentation mask (a label image: a few flat colours, as Herlev's
  ``-d.bmp`` masks or PathMaster's 0-3 masks), not a picture of a cell;
- ``looks_like_field``: a field of view with several whole cells (`whole_cells`), not one
  cell cropped.

Thresholds are set on synthetic cells, masks and fields (`pathmaster.image.synth`), see the
constants; tests/core/analysis/test_uploads.py holds them.
"""

from __future__ import annotations

import numpy as np

from pathmaster.records import InvalidInput
from pathmaster.image.segmentation import whole_cells

# A label image: its MASK_COLOURS commonest colours cover at least MASK_SHARE of its
# pixels. A camera image of a cell has sensor noise on every pixel: on synthetic cells the
# 8 commonest colours cover at most ~42% of the pixels; synthetic masks, coloured as
# Herlev's or grey 0-3 labels, as PNG or JPEG (flat areas stay flat, edges ring), at least
# ~96%. Letter-box bars (one flat colour) raise a real crop's share. Colours are compared at 5 bits a channel, so JPEG's
# +-3 grey levels on flat areas stay one colour.
MASK_COLOURS = 8
MASK_SHARE = 0.9
COLOUR_BITS = 5
# A field of view: at least this many whole cells with a nucleus that stand apart
# (`pathmaster.image.segmentation.whole_cells`). Synthetic single cells show 0 or 1, synthetic
# fields of 12 cells 8 and of 16 cells 13; a hand-cut crop of one cell may hold a few whole
# neighbours, so the line is well above 1.
FIELD_MIN_CELLS = 6

WORDS = {
    "looks_like_mask": "this looks like a segmentation mask, not a cell image: send the picture of the cell "
                       "(a mask goes beside it as NAME-mask.png)",
    "looks_like_field": "this looks like a field of view with {cells} cells, not one cell: crop one cell "
                        "and send each cell as its own image",
}


class NotACell(InvalidInput):
    """An image that decodes but is not one cell; `code` is one of WORDS' keys."""

    def __init__(self, code: str, source: str | None = None, **values):
        self.values = values
        super().__init__(WORDS[code].format(**values), source, code=code)


def label_colour_share(image: np.ndarray) -> float:
    """The share of pixels (0-1) in the image's MASK_COLOURS commonest colours.

    image: uint8 (H, W, 3) RGB; colours compared at COLOUR_BITS bits a channel. Near 1
    for a label image, near 0 for a camera image, whose every pixel carries noise.
    """
    shift = 8 - COLOUR_BITS
    coarse = (image >> shift).astype(np.uint32)
    packed = (coarse[..., 0] << (2 * COLOUR_BITS)) | (coarse[..., 1] << COLOUR_BITS) | coarse[..., 2]
    counts = np.bincount(packed.ravel(), minlength=1 << (3 * COLOUR_BITS))
    return float(np.sort(counts)[-MASK_COLOURS:].sum() / packed.size)


def check_cell_image(image: np.ndarray, source: str | None = None) -> None:
    """Refuse a decoded image that is not one cell: raises `NotACell` naming `source`.

    image: uint8 (H, W, 3) RGB, as `pathmaster.image.io.decode_image` gives it. An image of
    one flat colour is left to the analysis (it is no label image of several regions).
    """
    if label_colour_share(image) >= MASK_SHARE and np.ptp(image.reshape(-1, 3), axis=0).max() > 0:
        raise NotACell("looks_like_mask", source)
    cells = whole_cells(image)
    if cells >= FIELD_MIN_CELLS:
        raise NotACell("looks_like_field", source, cells=cells)
