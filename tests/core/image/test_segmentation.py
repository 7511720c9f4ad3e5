"""Automatic segmentation and background estimate, scored against the synthetic ground
truth (mask and blank-slide image) and checked on real Herlev cells against their
hand-drawn masks."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage as ndi

from pathmaster.records import BACKGROUND, CYTOPLASM, DIAGNOSES, NUCLEOLUS, NUCLEUS, CellRecord, InvalidInput
from pathmaster.image.segmentation import complete_cell, estimate_background, segment_cell
from pathmaster.image.synth import cell_rng, synth_cell

MIN_NUCLEUS_DICE = 0.85
MIN_CELL_DICE = 0.88


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * (a & b).sum() / (a.sum() + b.sum())


@pytest.fixture(scope="module")
def cells() -> list[CellRecord]:
    """Two cells of every class."""
    return [synth_cell(DIAGNOSES[i % 7], cell_rng(21, i)) for i in range(14)]


def test_nucleus_and_cell_match_ground_truth_with_background(cells):
    for record in cells:
        mask = segment_cell(record.image, record.background)
        assert mask.dtype == np.uint8 and mask.shape == record.mask.shape
        assert set(np.unique(mask)) <= {BACKGROUND, CYTOPLASM, NUCLEUS, NUCLEOLUS}
        nucleus_dice = dice(mask >= NUCLEUS, record.mask >= NUCLEUS)
        cell_dice = dice(mask >= CYTOPLASM, record.mask >= CYTOPLASM)
        assert nucleus_dice >= MIN_NUCLEUS_DICE, (record.diagnosis, nucleus_dice)
        assert cell_dice >= MIN_CELL_DICE, (record.diagnosis, cell_dice)


def test_segmentation_without_background_is_nearly_as_good(cells):
    scores = [dice(segment_cell(r.image) >= NUCLEUS, r.mask >= NUCLEUS) for r in cells]
    assert min(scores) >= MIN_NUCLEUS_DICE - 0.05, scores


def test_nucleoli_found_where_they_are():
    # Cells with prominent nucleoli: the ground truth has some, and so should the estimate.
    found = truth = 0
    for index in range(40):
        record = synth_cell("carcinoma_in_situ", cell_rng(22, index))
        if not (record.mask == NUCLEOLUS).any():
            continue
        truth += 1
        mask = segment_cell(record.image, record.background)
        hit = (mask == NUCLEOLUS) & ndi.binary_dilation(record.mask == NUCLEOLUS, iterations=2)
        found += bool(hit.any())
        if truth == 8:
            break
    assert truth == 8
    assert found >= 5, f"nucleoli found in {found} of {truth} cells"


def _nucleolus_count(mask: np.ndarray) -> int:
    return int(ndi.label(mask == NUCLEOLUS, structure=np.ones((3, 3)))[1])


def test_a_cell_four_times_larger_as_a_jpeg_shows_as_few_nucleoli():
    """Nucleoli are looked for at the nucleus's scale: the same cells upscaled 4x (camera
    noise, JPEG at quality 90) show as many nucleoli as there are, not their chromatin
    grains and JPEG blocks (searched at the image's pixels: 4-31 a cell, 128 in 8)."""
    import io

    from PIL import Image

    rng = np.random.default_rng(0)

    def large(array: np.ndarray) -> np.ndarray:
        smooth = ndi.gaussian_filter(np.repeat(np.repeat(array, 4, axis=0), 4, axis=1).astype(float), (2.0, 2.0, 0))
        noisy = np.clip(np.round(smooth + rng.normal(0, 3.0, smooth.shape)), 0, 255).astype(np.uint8)
        encoded = io.BytesIO()
        Image.fromarray(noisy).save(encoded, "JPEG", quality=90)
        return np.asarray(Image.open(encoded).convert("RGB"))

    truth = found = 0
    for index in range(8):
        record = synth_cell("carcinoma_in_situ", cell_rng(22, index))
        count = _nucleolus_count(segment_cell(large(record.image), large(record.background)))
        assert count <= 5, (index, count)  # more than a few visible nucleoli is not a cell
        truth += _nucleolus_count(record.mask)
        found += count
    assert truth >= 8 and found <= 2 * truth, (found, truth)


@pytest.mark.slow
def test_real_uploads_show_about_as_many_nucleoli_as_the_same_cells_at_40_px(herlev_224_dev, herlev_40px):
    """224 px JPEG uploads against their 40 px copies (every 8th): the nucleolus count per
    cell agrees in the mean (every 4th: 1.15 against 0.47; searched at the image's pixels
    it was 11.5, up to 85) and few cells show more than 5."""
    from PIL import Image

    large, small = [], []
    for image, _, pair in _upload_pairs(herlev_224_dev, herlev_40px, 8):
        large.append(_nucleolus_count(complete_cell(CellRecord(pair.stem, None, image)).mask))
        small.append(_nucleolus_count(segment_cell(np.asarray(Image.open(pair).convert("RGB")))))
    assert len(large) >= 50
    assert np.mean(large) <= 3 * np.mean(small) + 0.5, (np.mean(large), np.mean(small))
    assert np.mean(np.array(large) > 5) <= 0.05


def test_large_image_is_segmented_like_the_small_one():
    """A cell upscaled 5x (about 1000 x 1000 px, fresh camera noise) goes through the
    large-image paths (a wide opening, the watershed's crop); its masks still match the
    upscaled ground truth."""
    record = synth_cell("carcinoma_in_situ", cell_rng(24, 0))
    rng = np.random.default_rng(0)

    def upscaled(array: np.ndarray) -> np.ndarray:
        return np.repeat(np.repeat(array, 5, axis=0), 5, axis=1)

    def exposed(array: np.ndarray) -> np.ndarray:
        smooth = ndi.gaussian_filter(upscaled(array).astype(float), (2.0, 2.0, 0))
        return np.clip(np.round(smooth + rng.normal(0, 4.0, smooth.shape)), 0, 255).astype(np.uint8)

    image, background, truth = exposed(record.image), exposed(record.background), upscaled(record.mask)
    mask = segment_cell(image, background)
    assert mask.shape == truth.shape and min(mask.shape) >= 950
    assert dice(mask >= NUCLEUS, truth >= NUCLEUS) >= MIN_NUCLEUS_DICE
    assert dice(mask >= CYTOPLASM, truth >= CYTOPLASM) >= MIN_CELL_DICE


def test_background_estimate_matches_the_blank_slide(cells):
    for record in cells[:7]:
        for mask in (record.mask, None):
            estimate = estimate_background(record.image, mask)
            assert estimate.dtype == np.uint8 and estimate.shape == record.background.shape
            # Compare the lamp fields: smooth away the two exposures' independent noise. Under
            # a big cell the lamp is extrapolated; 2% of the lamp level is an OD error < 0.009.
            error = ndi.gaussian_filter(estimate.astype(float) - record.background.astype(float), (4, 4, 0))
            tolerance = 0.02 * record.background.mean()
            assert np.abs(error).mean() < tolerance, (record.diagnosis, mask is None, np.abs(error).mean())
            # The estimate follows the vignetting rather than a flat level.
            assert np.corrcoef(estimate[..., 1].ravel(), ndi.gaussian_filter(record.background[..., 1].astype(float), 4).ravel())[0, 1] > 0.8


def test_background_estimate_of_a_crop_with_no_glass_is_flat_and_bright():
    record = synth_cell("normal_superficial", cell_rng(23, 0))
    centre = record.mask.shape[0] // 2, record.mask.shape[1] // 2
    crop = record.image[centre[0] - 15 : centre[0] + 15, centre[1] - 15 : centre[1] + 15].copy()
    estimate = estimate_background(crop, np.ones(crop.shape[:2], np.uint8))
    assert (estimate == estimate[0, 0]).all()
    assert (estimate[0, 0] >= np.percentile(crop.reshape(-1, 3), 98, axis=0) - 1).all()


def test_complete_cell_fills_and_flags_only_what_is_missing(cells):
    given = cells[0]
    record = CellRecord("a", given.diagnosis, given.image.copy(), mask=given.mask.copy())
    complete_cell(record)
    assert record.background_estimated and not record.mask_estimated
    np.testing.assert_array_equal(record.mask, given.mask)
    record = CellRecord("b", given.diagnosis, given.image.copy(), background=given.background.copy())
    complete_cell(record)
    assert record.mask_estimated and not record.background_estimated
    assert (record.mask == NUCLEUS).any()


def test_segmentation_refuses_bad_input_by_name():
    with pytest.raises(InvalidInput, match="segment_cell input: image must be RGB"):
        segment_cell(np.zeros((10, 10), np.uint8))
    with pytest.raises(InvalidInput, match="background is"):
        segment_cell(np.zeros((10, 10, 3), np.uint8), np.zeros((10, 11, 3), np.uint8))


def test_real_herlev_cells_agree_with_their_hand_drawn_masks(herlev_40px):
    """At 40 px the real cells are tiny and often fill the frame (carcinoma in situ) or hold
    a nucleus of a few pixels (superficial cells); the automatic regions should still match
    the pathologists' in every class. Floors sit ~0.05 below what every third cell gives
    (benchmarks/bench_segmentation.py measures all 917, before vs after); the segmentation
    of its baseline commit failed them (nucleus median 0.26 on superficial, 0.42 on carcinoma in situ)."""
    from pathmaster.importers import iter_dataset

    records = [r for r in iter_dataset(herlev_40px, layout="herlev") if isinstance(r, CellRecord)][::3]
    nucleus, cell = {}, {}
    for record in records:
        mask = segment_cell(record.image)
        nucleus.setdefault(record.diagnosis, []).append(dice(mask >= NUCLEUS, record.mask >= NUCLEUS))
        cell.setdefault(record.diagnosis, []).append(dice(mask >= CYTOPLASM, record.mask >= CYTOPLASM))
    assert len(records) >= 300 and len(nucleus) == 7
    every_nucleus = np.concatenate(list(nucleus.values()))
    assert np.median(every_nucleus) >= 0.85 and np.percentile(every_nucleus, 25) >= 0.7
    assert np.median(np.concatenate(list(cell.values()))) >= 0.75
    for diagnosis, scores in nucleus.items():
        assert np.median(scores) >= 0.65, (diagnosis, np.median(scores))
        assert np.median(cell[diagnosis]) >= 0.7, (diagnosis, np.median(cell[diagnosis]))


def test_more_than_three_values_agrees_with_numpy_unique():
    from pathmaster.image.segmentation import _more_than_three_values

    rng = np.random.default_rng(0)
    for distinct in range(1, 7):
        for _ in range(50):
            values = rng.integers(0, distinct, (5, 7)).astype(np.float64) * 0.1
            assert _more_than_three_values(values) == (np.unique(values).size > 3), values


def test_upload_without_mask_or_slide_matches_both_ground_truths(cells):
    """An upload as most users have it (the image alone, ~200 px): complete_cell finds the
    cell coarsely, estimates the slide round it and segments once against that slide. The
    mask is as good as segmenting with the true slide, the slide as good as estimating it
    with the true mask (the tolerances of the tests above)."""
    for record in cells:
        upload = complete_cell(CellRecord("upload", None, record.image.copy()))
        assert upload.mask_estimated and upload.background_estimated
        assert dice(upload.mask >= NUCLEUS, record.mask >= NUCLEUS) >= MIN_NUCLEUS_DICE - 0.05, record.diagnosis
        assert dice(upload.mask >= CYTOPLASM, record.mask >= CYTOPLASM) >= MIN_CELL_DICE, record.diagnosis
        error = ndi.gaussian_filter(upload.background.astype(float) - record.background.astype(float), (4, 4, 0))
        assert np.abs(error).mean() < 0.02 * record.background.mean(), (record.diagnosis, np.abs(error).mean())


def _letter_boxed(image: np.ndarray, top: int, left: int, colour=(70, 60, 90)) -> np.ndarray:
    """The image padded with flat bars of one colour (as a resize to a square pads a crop),
    with a little noise on the bars, as JPEG leaves on a flat colour."""
    height, width = image.shape[:2]
    padded = np.empty((height + 2 * top, width + 2 * left, 3), np.uint8)
    noise = np.random.default_rng(0).integers(-2, 3, padded.shape)
    padded[:] = np.clip(np.array(colour) + noise, 0, 255)
    padded[top: top + height, left: left + width] = image
    return padded


def test_letter_box_bars_are_found_and_left_out(cells):
    from pathmaster.image.segmentation import BAR_RINGING_PX, CHOICE_REASONS, picture_box

    record = cells[4]
    height, width = record.image.shape[:2]
    assert picture_box(record.image) == (slice(0, height), slice(0, width))  # no bars
    boxed = _letter_boxed(record.image, 30, 0)
    rows, cols = picture_box(boxed)
    assert (rows, cols) == (slice(30 + BAR_RINGING_PX, 30 + height - BAR_RINGING_PX), slice(0, width))
    plain = complete_cell(CellRecord("plain", None, record.image.copy()))
    padded = complete_cell(CellRecord("boxed", None, boxed))
    assert padded.mask.shape == boxed.shape[:2] and padded.background.shape == boxed.shape
    assert (padded.mask[:30 + BAR_RINGING_PX] == BACKGROUND).all() and (padded.mask[-30:] == BACKGROUND).all()
    inner = padded.mask[30: 30 + height]
    assert dice(inner >= NUCLEUS, record.mask >= NUCLEUS) >= MIN_NUCLEUS_DICE - 0.05
    assert dice(inner >= CYTOPLASM, plain.mask >= CYTOPLASM) >= 0.95
    choice = padded.extra["cell_choice"]
    assert choice["reason"] in CHOICE_REASONS and choice["bars"] == [32, 32, 0, 0]
    assert plain.extra["cell_choice"]["bars"] == [0, 0, 0, 0]
    # The dark bars are no stain: the segmentation alone leaves them out too.
    assert (segment_cell(boxed)[:30] == BACKGROUND).all()


def test_the_cell_at_the_centre_is_taken_over_a_neighbour_and_the_choice_said():
    from pathmaster.image.segmentation import picture_box

    centre = synth_cell("moderate_dysplasia", cell_rng(29, 1))
    neighbour = synth_cell("carcinoma_in_situ", cell_rng(29, 2))
    height, width = centre.image.shape[:2]
    side = width // 3
    # The neighbour's left third shows at the crop's right edge, on the same glass.
    shown = neighbour.image[:height, :side]
    shown = np.pad(shown, ((0, height - len(shown)), (0, 0), (0, 0)), mode="edge")
    image = np.concatenate([centre.image, shown], axis=1)
    assert picture_box(image) == (slice(0, height), slice(0, width + side))
    record = complete_cell(CellRecord("pair", None, image))
    nucleus = record.mask >= NUCLEUS
    assert dice(nucleus[:, :width], centre.mask >= NUCLEUS) >= MIN_NUCLEUS_DICE - 0.05
    assert not nucleus[:, width:].any()
    choice = record.extra["cell_choice"]
    assert choice["reason"] in ("covers_centre", "nearest_centre", "only_candidate")
    assert choice["centre_offset"] < 0.3


def test_a_lamp_that_would_sag_under_the_cell_is_fitted_as_a_plane():
    from pathmaster.image.segmentation import _fit_surface

    # Glass only at the top and bottom, brighter there than a quadratic's dip between them
    height, width = 60, 80
    level = np.full((height, width), 200.0)
    level[:10] -= np.linspace(0, 6, 10)[:, None]  # a slight vignette at the edges
    level[-10:] -= np.linspace(6, 0, 10)[:, None]
    where = np.zeros((height, width), bool)
    where[:10] = where[-10:] = True
    surface = _fit_surface(level, where)
    assert surface[height // 2].min() >= level[where].min() - 1.0  # no dip under the cell


def _upload_pairs(uploads, masks, every):
    """(upload image, its picture box, its 40 px copy's path) of every `every`-th upload per
    class, paired as benchmarks/bench_uploads.py pairs them."""
    from PIL import Image

    from pathmaster.image.segmentation import picture_box

    for folder in sorted(p for p in uploads.iterdir() if p.is_dir()):
        small = sorted((masks / folder.name).glob("*.BMP"))
        stack = np.stack([np.asarray(Image.open(p).convert("RGB"), dtype=np.float32) for p in small])
        for path in sorted(folder.glob("*.jpg"))[::every]:
            image = np.asarray(Image.open(path).convert("RGB"))
            box = picture_box(image)
            shrunk = np.asarray(Image.fromarray(image[box]).resize((40, 40), Image.Resampling.BOX), dtype=np.float32)
            yield image, box, small[int(((stack - shrunk) ** 2).mean(axis=(1, 2, 3)).argmin())]


def _dice_by_class(uploads, masks, every):
    """Median nucleus and cell Dice of uploads against their 40 px copies' masks."""
    from PIL import Image

    from pathmaster.importers.herlev import decode_colour_mask

    nucleus, cell = [], []
    for image, box, pair in _upload_pairs(uploads, masks, every):
        truth, _ = decode_colour_mask(np.asarray(Image.open(pair.with_name(f"{pair.stem}-d.bmp")).convert("RGB")),
                                      str(pair))
        mask = complete_cell(CellRecord(pair.stem, None, image)).mask[box]
        ours = np.asarray(Image.fromarray(mask).resize((40, 40), Image.Resampling.NEAREST))
        nucleus.append(dice(ours >= NUCLEUS, truth >= NUCLEUS))
        cell.append(dice(ours >= CYTOPLASM, truth >= CYTOPLASM))
    return np.median(nucleus), np.median(cell), len(nucleus)


@pytest.mark.slow
def test_real_uploads_agree_with_the_hand_drawn_masks_of_the_same_cells(herlev_224_dev, herlev_40px):
    """224 px letter-boxed JPEG uploads, segmented alone, against Herlev's masks of the same
    cells at 40 px. Every third upload gave nucleus 0.88, cell 0.80 (08f044c: 0.86, 0.72;
    benchmarks/bench_uploads.py); floors ~0.04 below on every sixth."""
    nucleus, cell, n = _dice_by_class(herlev_224_dev, herlev_40px, 6)
    assert n >= 70
    assert nucleus >= 0.84 and cell >= 0.75, (nucleus, cell)


def test_the_cell_is_the_piece_holding_the_nucleus():
    from pathmaster.image.segmentation import _piece_holding

    binary = np.zeros((20, 40), bool)
    binary[5:15, 2:12] = True     # a piece at the left
    binary[4:16, 18:30] = True    # the piece nearer the centre
    nucleus = np.zeros_like(binary)
    nucleus[8:11, 5:8] = True     # inside the left piece
    chosen = _piece_holding(binary, nucleus)
    assert chosen[10, 5] and not chosen[10, 20]
    # no nucleus: the piece nearest the centre
    centre = _piece_holding(binary, np.zeros_like(binary))
    assert centre[10, 20] and not centre[10, 5]


def test_a_picture_with_no_nucleus_is_refused_by_its_code_not_a_crash():
    """A black-and-white checkerboard (what a fuzzer sent a site) segments to no nucleus:
    segment_cell says so with an empty mask, and the analysis refuses it with its code."""
    from pathmaster.image.segmentation import NO_NUCLEUS_FOUND
    from pathmaster.analysis.cell import analyse_cell

    rows, cols = np.mgrid[:40, :40]
    checkerboard = np.repeat((((rows + cols) % 2) * 255).astype(np.uint8)[:, :, None], 3, axis=2)
    assert not np.isin(segment_cell(checkerboard), (NUCLEUS, NUCLEOLUS)).any()
    with pytest.raises(InvalidInput) as refused:
        analyse_cell(checkerboard, source="board.png")
    assert refused.value.code == NO_NUCLEUS_FOUND and refused.value.source == "board.png"
