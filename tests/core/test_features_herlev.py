"""Features on the 917 real Herlev cells (../shared/data/herlev-40px), masks decoded here
from the Herlev colour code so this test does not depend on the importer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pathmaster.features import extract_features, feature_names
from pathmaster.records import CYTOPLASM, NUCLEUS

# Herlev's segmentation colours (see the data set's README); grey (128,128,128) and black
# mark unsure/other pixels and count as background here.
HERLEV_COLOURS = {(0, 0, 255): NUCLEUS, (0, 0, 128): CYTOPLASM}
NORMAL = ("normal_superficiel", "normal_intermediate")
ABNORMAL = ("severe_dysplastic", "carcinoma_in_situ")


def herlev_cell(image_path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(image, background, mask) of one Herlev cell. Herlev has no blank-slide images: the
    background is the median colour of the pixels the mask calls background."""
    image = np.asarray(Image.open(image_path).convert("RGB"))
    colours = np.asarray(Image.open(image_path.with_name(image_path.stem + "-d.bmp")).convert("RGB"))
    mask = np.zeros(image.shape[:2], np.uint8)
    for colour, label in HERLEV_COLOURS.items():
        mask[(colours == colour).all(axis=2)] = label
    slide = np.median(image[mask == 0], axis=0).astype(np.uint8)
    return image, np.broadcast_to(slide, image.shape).copy(), mask


def test_every_feature_is_finite_on_every_real_herlev_cell(herlev_40px):
    names = feature_names()
    vectors: dict[str, list[np.ndarray]] = {}
    paths = sorted(herlev_40px.glob("*/*.BMP"))
    assert len(paths) == 917
    for path in paths:
        vector = extract_features(*herlev_cell(path), source=str(path))
        bad = [n for n, x in zip(names, vector) if not np.isfinite(x)]
        assert not bad, f"{path}: non-finite {bad}"
        vectors.setdefault(path.parent.name, []).append(vector)

    # The features carry the diagnosis: severe dysplasia and carcinoma in situ have larger,
    # darker nuclei relative to their cells than normal superficial/intermediate cells.
    def median(classes, name):
        return np.median([v[names.index(name)] for c in classes for v in vectors[c]])

    assert median(ABNORMAL, "nc_ratio") > 3 * median(NORMAL, "nc_ratio")
    assert median(ABNORMAL, "nucleus_area") > 3 * median(NORMAL, "nucleus_area")
