"""An image is one cell before it is matched: masks and fields of view are refused with a
code, on the core check and on every path that decodes a cell (page, batch, sites, search)."""

from __future__ import annotations

import io
import numpy as np
import pytest
from PIL import Image

from pathmaster.importers.herlev import COLOUR_CODE
from pathmaster.records import BACKGROUND, CYTOPLASM, DIAGNOSES, NUCLEUS
from pathmaster.image.synth import cell_rng, synth_cell, synth_field
from pathmaster.analysis.uploads import NotACell, check_cell_image



def herlev_coloured(mask: np.ndarray) -> np.ndarray:
    """A 0-3 label mask in Herlev's colours (its -d.bmp files, `importers.herlev.COLOUR_CODE`):
    uint8 (H, W, 3); nucleoli are drawn as nucleus, as Herlev has no colour for them."""
    colour = {label: c for c, label in reversed(COLOUR_CODE.items())}
    palette = np.array([colour[BACKGROUND], colour[CYTOPLASM], colour[NUCLEUS], colour[NUCLEUS]], np.uint8)
    return palette[mask]


def jpeg(image: np.ndarray) -> np.ndarray:
    """The image saved as a JPEG (quality 85) and decoded again, as a renamed file arrives."""
    out = io.BytesIO()
    Image.fromarray(image).save(out, "JPEG", quality=85)
    return np.asarray(Image.open(out).convert("RGB"))


def code_of(image: np.ndarray) -> str | None:
    try:
        check_cell_image(image, "upload.png")
    except NotACell as exc:
        assert exc.source == "upload.png"
        return exc.code
    return None


@pytest.fixture(scope="module")
def cells():
    return [synth_cell(DIAGNOSES[i % len(DIAGNOSES)], cell_rng(11, i)) for i in range(14)]


def test_synthetic_cells_pass(cells):
    assert [code_of(c.image) for c in cells] == [None] * len(cells)


@pytest.mark.parametrize("saved_as", ["png", "jpeg"])
@pytest.mark.parametrize("colours", ["herlev", "grey labels"])
def test_a_mask_is_refused_as_a_mask(cells, saved_as, colours):
    for cell in cells[:7]:
        image = herlev_coloured(cell.mask) if colours == "herlev" else \
            np.repeat((cell.mask * 60)[..., None], 3, axis=2).astype(np.uint8)
        assert code_of(jpeg(image) if saved_as == "jpeg" else image) == "looks_like_mask"


def test_real_masks_are_refused(herlev_40px):
    """Herlev's own masks (-d.bmp), as the issue's renamed n6.bmp was."""
    masks = sorted(herlev_40px.glob("*/*-d.bmp"))[:40]
    assert masks
    codes = {code_of(np.asarray(Image.open(p).convert("RGB"))) for p in masks}
    assert codes == {"looks_like_mask"}


def test_a_field_of_twelve_cells_is_refused_as_a_field():
    field = synth_field(np.random.default_rng(5), rows=3, cols=4)
    assert field.shape == (672, 896, 3)
    with pytest.raises(NotACell) as refused:
        check_cell_image(jpeg(field), "field.jpg")
    assert refused.value.code == "looks_like_field" and refused.value.values["cells"] >= 6
    assert "field of view" in str(refused.value) and "field.jpg" in str(refused.value)


def test_a_blank_image_is_left_to_the_analysis():
    assert code_of(np.full((64, 64, 3), 200, np.uint8)) is None


def test_no_real_cell_is_refused(herlev_224_dev):
    refused = []
    for path in sorted(herlev_224_dev.glob("*/*.jpg")):
        code = code_of(np.asarray(Image.open(path).convert("RGB")))
        if code:
            refused.append((path.name, code))
    assert refused == []


def test_the_sites_and_the_gateway_refuse_with_the_same_code(cells):
    """decode_cell (sites, the coordinator's analysis, `query --analyse-locally`) and the
    gateway's checks (page staging, batch) go through the one check."""
    from pathmaster.image.io import encode_png
    from services.gateway.pairing import CellFiles
    from services.gateway.upload import cell_problem, check_file
    from services.cells import decode_cell

    mask_png = encode_png(herlev_coloured(cells[0].mask))
    with pytest.raises(NotACell) as at_site:
        decode_cell("n6", mask_png)
    assert at_site.value.code == "looks_like_mask"
    with pytest.raises(NotACell) as staged:
        check_file("n6.png", mask_png)
    assert staged.value.code == "looks_like_mask"
    problem = cell_problem({"n6.png": mask_png}, CellFiles(cell_id="n6", image="n6.png"))
    assert problem is not None and "segmentation mask" in problem
    assert check_file("cell.png", encode_png(cells[0].image))[0] == "image"
