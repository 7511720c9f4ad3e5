"""Importers on fixtures written here in exactly the Herlev and SIPaKMeD formats, on plain
class folders and synthetic datasets, and on the real 917-cell Herlev sample."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import ndimage as ndi
from skimage import measure

from pathmaster.importers import ImportProblem, detect_layout, iter_dataset
from pathmaster.image.io import write_png
from pathmaster.records import CYTOPLASM, NUCLEOLUS, NUCLEUS, CellRecord, InvalidInput
from pathmaster.image.synth import cell_rng, synth_cell, write_dataset

HERLEV_COLOURS = {0: (255, 0, 0), 1: (0, 0, 128), 2: (0, 0, 255), 3: (0, 0, 255)}
UNSURE = (128, 128, 128)


def dice(a: np.ndarray, b: np.ndarray) -> float:
    return 2.0 * (a & b).sum() / (a.sum() + b.sum())


def split(items) -> tuple[dict[str, CellRecord], list[ImportProblem]]:
    records, problems = {}, []
    for item in items:
        if isinstance(item, ImportProblem):
            problems.append(item)
        else:
            assert item.source_id not in records
            records[item.source_id] = item
    return records, problems


@pytest.fixture(scope="module")
def pool() -> list[CellRecord]:
    names = ["normal_superficial", "mild_dysplasia", "carcinoma_in_situ", "normal_columnar"]
    return [synth_cell(d, cell_rng(31, i)) for i, d in enumerate(names)]


# --- Herlev -----------------------------------------------------------------------------

def write_herlev_cell(folder: Path, name: str, record: CellRecord) -> None:
    """NAME.BMP (24-bit RGB) and NAME-d.bmp (8-bit palette, Herlev colour code) with a
    1-pixel ring of 'unsure' grey just outside the cell, as in the real masks."""
    folder.mkdir(parents=True, exist_ok=True)
    Image.fromarray(record.image).save(folder / f"{name}.BMP", format="BMP")
    colour = np.zeros(record.image.shape, np.uint8)
    for label, rgb in HERLEV_COLOURS.items():
        colour[record.mask == label] = rgb
    cell = record.mask > 0
    colour[ndi.binary_dilation(cell) & ~cell] = UNSURE
    Image.fromarray(colour).convert("P", palette=Image.Palette.ADAPTIVE, colors=8).save(folder / f"{name}-d.bmp", format="BMP")


def test_herlev_layout_masks_and_vocabulary(tmp_path, pool):
    write_herlev_cell(tmp_path / "normal_superficiel", "153-1", pool[0])
    write_herlev_cell(tmp_path / "light_dysplastic", "3-12", pool[1])
    write_herlev_cell(tmp_path / "carcinoma_in_situ", "0-7", pool[2])
    assert Image.open(tmp_path / "light_dysplastic" / "3-12-d.bmp").mode == "P"
    assert detect_layout(tmp_path) == "herlev"
    records, problems = split(iter_dataset(tmp_path))
    assert problems == []
    assert {k: r.diagnosis for k, r in records.items()} == {
        "normal_superficiel/153-1": "normal_superficial",
        "light_dysplastic/3-12": "mild_dysplasia",
        "carcinoma_in_situ/0-7": "carcinoma_in_situ",
    }
    record = records["light_dysplastic/3-12"]
    truth = np.where(pool[1].mask == NUCLEOLUS, NUCLEUS, pool[1].mask)  # Herlev has no nucleolus colour
    np.testing.assert_array_equal(record.mask, truth)
    np.testing.assert_array_equal(record.image, pool[1].image)
    ring = ndi.binary_dilation(pool[1].mask > 0) & (pool[1].mask == 0)
    assert record.extra["unsure_pixels"] == int(ring.sum())
    assert record.background_estimated and not record.mask_estimated
    assert record.origin == "herlev" and record.background.shape == record.image.shape


def test_herlev_missing_mask_is_segmented_and_flagged(tmp_path, pool):
    write_herlev_cell(tmp_path / "light_dysplastic", "3-12", pool[1])
    (tmp_path / "light_dysplastic" / "3-12-d.bmp").unlink()
    write_herlev_cell(tmp_path / "light_dysplastic", "3-13", pool[3])  # keeps the layout detectable
    records, problems = split(iter_dataset(tmp_path))
    assert problems == []
    record = records["light_dysplastic/3-12"]
    assert record.mask_estimated and record.background_estimated
    assert dice(record.mask >= NUCLEUS, pool[1].mask >= NUCLEUS) > 0.85
    assert not records["light_dysplastic/3-13"].mask_estimated


def test_herlev_bad_files_are_reported_and_the_rest_imported(tmp_path, pool):
    folder = tmp_path / "severe_dysplastic"
    for name, record in zip(("1", "2", "3", "4"), pool):
        write_herlev_cell(folder, name, record)
    # 1: truncated image; 2: a colour outside the code; 3: mask of another size.
    data = (folder / "1.BMP").read_bytes()
    (folder / "1.BMP").write_bytes(data[: len(data) // 3])
    colour = np.array(Image.open(folder / "2-d.bmp").convert("RGB"))
    colour[:3, :3] = (0, 255, 0)
    Image.fromarray(colour).save(folder / "2-d.bmp", format="BMP")
    Image.open(folder / "3-d.bmp").crop((0, 0, 50, 40)).save(folder / "3-d.bmp", format="BMP")
    # An orphan mask, an unknown class folder, a mask without any nucleus.
    Image.open(folder / "4-d.bmp").save(folder / "9-d.bmp", format="BMP")
    write_herlev_cell(tmp_path / "benign_looking", "5", pool[0])
    no_nucleus = CellRecord("x", None, pool[0].image, mask=np.where(pool[0].mask >= NUCLEUS, CYTOPLASM, pool[0].mask).astype(np.uint8))
    write_herlev_cell(tmp_path / "normal_intermediate", "6", no_nucleus)

    records, problems = split(iter_dataset(tmp_path))
    assert list(records) == ["severe_dysplastic/4"]
    found = {Path(p.path).relative_to(tmp_path).as_posix(): p.problem for p in problems}
    assert set(found) == {"severe_dysplastic/1.BMP", "severe_dysplastic/2-d.bmp", "severe_dysplastic/3-d.bmp",
                          "severe_dysplastic/9-d.bmp", "benign_looking", "normal_intermediate/6-d.bmp"}
    assert "truncated or corrupt" in found["severe_dysplastic/1.BMP"]
    assert "(0, 255, 0) x 9" in found["severe_dysplastic/2-d.bmp"] and "Herlev code" in found["severe_dysplastic/2-d.bmp"]
    assert "mask is 50 x 40 pixels but its image is" in found["severe_dysplastic/3-d.bmp"]
    assert "mask without its cell image" in found["severe_dysplastic/9-d.bmp"]
    assert "unknown diagnosis class 'benign_looking'" in found["benign_looking"]
    assert "no nucleus pixels" in found["normal_intermediate/6-d.bmp"]


def test_real_herlev_sample(herlev_40px):
    """The 917 real cells: every one imports, class counts as the dataset's README says."""
    assert detect_layout(herlev_40px) == "herlev"
    records, problems = split(iter_dataset(herlev_40px))
    assert problems == []
    counts = collections.Counter(r.diagnosis for r in records.values())
    assert counts == {
        "normal_superficial": 74, "normal_intermediate": 70, "normal_columnar": 98,
        "mild_dysplasia": 182, "moderate_dysplasia": 146, "severe_dysplasia": 197,
        "carcinoma_in_situ": 150,
    }
    for record in records.values():
        assert record.image.shape == (40, 40, 3) and record.mask.shape == (40, 40)
        assert (record.mask == NUCLEUS).any() and record.background_estimated and not record.mask_estimated
        # The estimated lamp is brighter than the cell it shines through, on average.
        assert record.background[record.mask > 0].mean() > record.image[record.mask > 0].mean()


# --- SIPaKMeD ---------------------------------------------------------------------------

def write_boundary(path: Path, region: np.ndarray, offset: tuple[int, int] = (0, 0)) -> None:
    """The region's outer contour as SIPaKMeD writes it: one 'x,y' line per vertex
    (column, row; floats such as ``1146.5,489``), the first vertex repeated to close it,
    shifted by `offset` (x, y) into a whole slide's coordinates."""
    contour = max(measure.find_contours(np.pad(region, 1).astype(float), 0.5), key=len) - 1
    assert np.array_equal(contour[0], contour[-1])  # closed, as in the dataset
    dx, dy = offset
    path.write_text("".join(f"{col + dx:g},{row + dy:g}\n" for row, col in contour))


def write_sipakmed_cell(cropped: Path, name: str, record: CellRecord) -> None:
    cropped.mkdir(parents=True, exist_ok=True)
    Image.fromarray(record.image).save(cropped / f"{name}.bmp", format="BMP")
    write_boundary(cropped / f"{name}_cyt.dat", record.mask >= CYTOPLASM)
    write_boundary(cropped / f"{name}_nuc.dat", record.mask >= NUCLEUS)


def test_sipakmed_layout_boundaries_and_vocabulary(tmp_path, pool):
    parabasal = tmp_path / "im_Parabasal" / "im_Parabasal"
    write_sipakmed_cell(parabasal / "CROPPED", "001_01", pool[0])
    write_sipakmed_cell(tmp_path / "im_Dyskeratotic" / "CROPPED", "012_03", pool[2])
    # A full-slide image with numbered boundaries sits beside CROPPED; it is not a cell.
    Image.fromarray(pool[1].image).save(parabasal / "001.bmp", format="BMP")
    write_boundary(parabasal / "001_cyt01.dat", pool[1].mask >= CYTOPLASM)
    assert detect_layout(tmp_path) == "sipakmed"
    records, problems = split(iter_dataset(tmp_path))
    assert problems == []
    assert {k: r.diagnosis for k, r in records.items()} == {
        "im_Parabasal/im_Parabasal/CROPPED/001_01": "parabasal",
        "im_Dyskeratotic/CROPPED/012_03": "dyskeratotic",
    }
    for record, truth in ((records["im_Parabasal/im_Parabasal/CROPPED/001_01"], pool[0]),
                          (records["im_Dyskeratotic/CROPPED/012_03"], pool[2])):
        assert dice(record.mask >= NUCLEUS, truth.mask >= NUCLEUS) > 0.9
        assert dice(record.mask >= CYTOPLASM, truth.mask >= CYTOPLASM) > 0.97
        assert set(np.unique(record.mask)) == {0, CYTOPLASM, NUCLEUS}
        assert record.background_estimated and not record.mask_estimated and record.origin == "sipakmed"


def test_sipakmed_bad_files_are_reported_and_the_rest_imported(tmp_path, pool):
    cropped = tmp_path / "im_Koilocytotic" / "CROPPED"
    for name, record in zip(("001_01", "001_02", "001_03", "001_04"), pool):
        write_sipakmed_cell(cropped, name, record)
    lines = (cropped / "001_01_nuc.dat").read_text().splitlines()
    lines[4] = "12.5;abc"
    (cropped / "001_01_nuc.dat").write_text("\n".join(lines))
    (cropped / "001_02_nuc.dat").unlink()
    (cropped / "001_03_cyt.dat").write_text("5000.0,12.0\n5010.0,30.0\n5020.0,12.0\n")
    (cropped / "001_04_cyt.dat").unlink()
    (cropped / "001_04_nuc.dat").unlink()  # neither boundary: segment automatically
    (tmp_path / "im_Metaplastic").mkdir()  # no CROPPED folder
    Image.fromarray(pool[0].image).save(tmp_path / "im_Metaplastic" / "005.bmp", format="BMP")

    records, problems = split(iter_dataset(tmp_path))
    assert list(records) == ["im_Koilocytotic/CROPPED/001_04"]
    assert records["im_Koilocytotic/CROPPED/001_04"].mask_estimated
    found = {Path(p.path).relative_to(tmp_path).as_posix(): p.problem for p in problems}
    assert set(found) == {"im_Koilocytotic/CROPPED/001_01_nuc.dat", "im_Koilocytotic/CROPPED/001_02_nuc.dat",
                          "im_Koilocytotic/CROPPED/001_03_cyt.dat", "im_Metaplastic"}
    assert "line 5 is '12.5;abc', expected 'x,y'" in found["im_Koilocytotic/CROPPED/001_01_nuc.dat"]
    assert "boundary file missing" in found["im_Koilocytotic/CROPPED/001_02_nuc.dat"]
    assert "3 of 3 vertices lie outside" in found["im_Koilocytotic/CROPPED/001_03_cyt.dat"]
    assert "no CROPPED folder" in found["im_Metaplastic"]


def test_sipakmed_whole_slides_cells_cut_out_in_slide_coordinates(tmp_path, pool):
    """No CROPPED folder: each NNN_cytMM.dat/NNN_nucMM.dat pair (full-slide pixels) cuts
    cell MM out of NNN.bmp with its mask; a pair missing a partner is reported."""
    folder = tmp_path / "im_Koilocytotic" / "im_Koilocytotic"
    folder.mkdir(parents=True)
    glass = np.median(pool[0].background.reshape(-1, 3), axis=0).astype(np.uint8)
    slide = np.tile(glass, (600, 900, 1))
    places = {"01": (pool[0], (660, 360)), "02": (pool[2], (37, 15))}  # (x, y) of each cell's corner
    for number, (record, (x, y)) in places.items():
        h, w = record.mask.shape
        slide[y:y + h, x:x + w] = record.image
        write_boundary(folder / f"003_cyt{number}.dat", record.mask >= CYTOPLASM, (x, y))
        write_boundary(folder / f"003_nuc{number}.dat", record.mask >= NUCLEUS, (x, y))
    Image.fromarray(slide).save(folder / "003.bmp", format="BMP")
    assert "." in (folder / "003_cyt01.dat").read_text()  # float vertices, e.g. 712.5,430
    write_boundary(folder / "003_cyt03.dat", pool[1].mask >= CYTOPLASM, (300, 300))  # no _nuc03

    records, problems = split(iter_dataset(tmp_path))
    assert [Path(p.path).name for p in problems] == ["003_cyt03.dat"]
    assert "without its partner" in problems[0].problem
    assert sorted(records) == ["im_Koilocytotic/im_Koilocytotic/003_01", "im_Koilocytotic/im_Koilocytotic/003_02"]
    for number, (truth, (x, y)) in places.items():
        record = records[f"im_Koilocytotic/im_Koilocytotic/003_{number}"]
        x0, y0, width, height = record.extra["cut_out"]
        assert record.image.shape == (height, width, 3) and record.mask.shape == (height, width)
        assert np.array_equal(record.image, slide[y0:y0 + height, x0:x0 + width])
        # The mask sits where the cell is: compare in slide coordinates.
        placed = np.zeros(slide.shape[:2], bool)
        placed[y0:y0 + height, x0:x0 + width] = record.mask >= NUCLEUS
        expected = np.zeros(slide.shape[:2], bool)
        expected[y:y + truth.mask.shape[0], x:x + truth.mask.shape[1]] = truth.mask >= NUCLEUS
        assert dice(placed, expected) > 0.9
        assert record.diagnosis == "koilocytotic" and not record.mask_estimated and record.background_estimated
        assert (record.mask[[0, -1], :] == 0).all() and (record.mask[:, [0, -1]] == 0).all()  # glass around


def test_sipakmed_slide_coordinates_in_a_cropped_file_are_reported(tmp_path, pool):
    """A cropped cell's boundary in whole-slide coordinates does not fit its crop: reported."""
    cropped = tmp_path / "im_Parabasal" / "CROPPED"
    write_sipakmed_cell(cropped, "001_01", pool[0])
    write_boundary(cropped / "001_01_cyt.dat", pool[0].mask >= CYTOPLASM, (1100, 480))
    records, problems = split(iter_dataset(tmp_path))
    assert records == {} and len(problems) == 1
    assert "lie outside the" in problems[0].problem and "cropped image" in problems[0].problem


# --- plain class folders and synthetic datasets -----------------------------------------

def test_plain_class_folders_segment_and_estimate(tmp_path, pool):
    (tmp_path / "severe_dysplasia").mkdir()
    write_png(tmp_path / "severe_dysplasia" / "a.png", pool[1].image)
    write_png(tmp_path / "severe_dysplasia" / "b.png", pool[2].image)
    write_png(tmp_path / "severe_dysplasia" / "b-mask.png", pool[2].mask)
    write_png(tmp_path / "severe_dysplasia" / "b-background.png", pool[2].background)
    (tmp_path / "Koilocytotic").mkdir()
    Image.fromarray(pool[3].image).save(tmp_path / "Koilocytotic" / "c.jpg", quality=95)
    (tmp_path / "lymphocytes").mkdir()
    write_png(tmp_path / "lymphocytes" / "d.png", pool[0].image)
    write_png(tmp_path / "stray.png", pool[0].image)
    (tmp_path / "severe_dysplasia" / "notes.txt").write_text("not a cell")

    assert detect_layout(tmp_path) == "folders"
    records, problems = split(iter_dataset(tmp_path))
    assert sorted(records) == ["Koilocytotic/c", "severe_dysplasia/a", "severe_dysplasia/b"]
    a, b, c = records["severe_dysplasia/a"], records["severe_dysplasia/b"], records["Koilocytotic/c"]
    assert a.mask_estimated and a.background_estimated
    assert dice(a.mask >= NUCLEUS, pool[1].mask >= NUCLEUS) > 0.85
    assert not b.mask_estimated and not b.background_estimated
    np.testing.assert_array_equal(b.mask, pool[2].mask)
    np.testing.assert_array_equal(b.background, pool[2].background)
    assert c.diagnosis == "koilocytotic" and (c.mask == NUCLEUS).any()
    assert sorted(Path(p.path).name for p in problems) == ["lymphocytes", "stray.png"]


def test_synthetic_dataset_round_trip_and_a_damaged_file(tmp_path):
    root = write_dataset(tmp_path / "synth", n_cells=3, seed=5)
    assert detect_layout(root) == "synthetic"
    records, problems = split(iter_dataset(root))
    assert problems == [] and list(records) == ["synth-5-000000", "synth-5-000001", "synth-5-000002"]
    original = synth_cell("normal_superficial", cell_rng(5, 0))
    first = records["synth-5-000000"]
    for field in ("image", "background", "mask"):
        np.testing.assert_array_equal(getattr(first, field), getattr(original, field))
    assert not first.mask_estimated and not first.background_estimated and first.origin == "synthetic"

    (root / "normal_intermediate" / "synth-5-000001-mask.png").write_bytes(b"\x89PNG\r\n\x1a\n garbage")
    records, problems = split(iter_dataset(root))
    assert list(records) == ["synth-5-000000", "synth-5-000002"]
    assert len(problems) == 1 and problems[0].path.endswith("synth-5-000001-mask.png")


def test_not_a_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(InvalidInput, match="not a dataset folder"):
        detect_layout(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InvalidInput, match="empty: no dataset found"):
        list(iter_dataset(tmp_path / "empty"))
    with pytest.raises(InvalidInput, match="unknown layout 'dicom'"):
        list(iter_dataset(tmp_path, layout="dicom"))


# --- groups: the slide image each cell was cropped from -----------------------------------

def test_groups_come_from_herlev_and_sipakmed_names_and_are_none_otherwise(tmp_path, pool):
    herlev = tmp_path / "herlev"
    write_herlev_cell(herlev / "carcinoma_in_situ", "153956040-153956058-001", pool[2])
    write_herlev_cell(herlev / "carcinoma_in_situ", "153956040-153956058-002", pool[1])
    write_herlev_cell(herlev / "normal_columnar", "5-12", pool[3])  # the 40 px copy's names
    records, problems = split(iter_dataset(herlev))
    assert problems == []
    assert {k: r.group for k, r in records.items()} == {
        "carcinoma_in_situ/153956040-153956058-001": "153956040-153956058",
        "carcinoma_in_situ/153956040-153956058-002": "153956040-153956058",
        "normal_columnar/5-12": None,
    }
    folders = tmp_path / "folders" / "normal_columnar"
    folders.mkdir(parents=True)
    Image.fromarray(pool[3].image).save(folders / "149182550-149182608-003.jpg", quality=95)
    Image.fromarray(pool[0].image).save(folders / "cell-7.png")
    records, _ = split(iter_dataset(tmp_path / "folders"))
    assert {k: r.group for k, r in records.items()} == {
        "normal_columnar/149182550-149182608-003": "149182550-149182608", "normal_columnar/cell-7": None}
    sipakmed = tmp_path / "sipakmed" / "im_Parabasal"
    write_sipakmed_cell(sipakmed / "CROPPED", "001_01", pool[0])
    write_sipakmed_cell(sipakmed / "CROPPED", "001_02", pool[1])
    write_sipakmed_cell(sipakmed / "CROPPED", "002_01", pool[2])
    records, _ = split(iter_dataset(tmp_path / "sipakmed"))
    assert sorted(r.group for r in records.values()) == ["im_Parabasal/001", "im_Parabasal/001", "im_Parabasal/002"]
