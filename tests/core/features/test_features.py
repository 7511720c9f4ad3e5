"""Cell features against known answers and independent scikit-image / scipy / mahotas calls.

The cells here are drawn with skimage.draw and rendered with Beer-Lambert optics over a
vignetted, tinted blank slide, so that their true optical densities are known.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import ndimage, stats
from skimage import draw, measure
from skimage.feature import graycomatrix, graycoprops, local_binary_pattern

from pathmaster.features import FEATURES, GROUPS, extract_features, feature_names
from pathmaster.features import texture
from pathmaster.records import CYTOPLASM, NUCLEOLUS, NUCLEUS, InvalidInput

NAMES = feature_names()
UNITS = {"px", "px^2", "OD", "OD*px^2", "1"}
# Stain absorbance per RGB channel relative to the grey OD (their mean, which is 1).
ABSORBANCE = np.array([1.0, 1.15, 0.85])


def slide(size: tuple[int, int], lamp: float) -> np.ndarray:
    """Float blank slide (H, W, 3): lamp intensity with vignetting and a warm tint."""
    h, w = size
    yy, xx = np.mgrid[:h, :w]
    r2 = ((yy - h / 2) ** 2 + (xx - w / 2) ** 2) / (max(h, w) / 2) ** 2
    return lamp * (1.0 - 0.15 * r2)[..., None] * np.array([1.0, 0.97, 0.93])


def render(od: np.ndarray, background: np.ndarray, noise: np.ndarray | None = None,
           scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Beer-Lambert: (image, background) as uint8 from a grey OD map and a float slide.

    `scale` multiplies the lamp (and the camera noise with it) before the single uint8
    rounding a camera does.
    """
    image = background * 10.0 ** (-od[..., None] * ABSORBANCE)
    if noise is not None:
        image = image + noise[0]
        background = background + noise[1]
    as_uint8 = lambda a: np.clip(np.round(a * scale), 0, 255).astype(np.uint8)  # noqa: E731
    return as_uint8(image), as_uint8(background)


def realistic_cell(seed: int = 0, size: int = 200, nucleoli: int = 2, zoom: float = 1.0):
    """A ~200 px cell: returns (od, slide, noise, mask) before rendering.

    Cytoplasm OD 0.15, nucleus 0.6 with smoothed-noise chromatin, nucleoli 0.95,
    slight optical blur, camera noise of 1.5 grey levels at a lamp of 205.
    zoom enlarges the nucleus and spreads the nucleoli (for large images); chromatin
    grain, blur and noise keep their pixel scale, as under a higher-resolution camera.
    """
    rng = np.random.default_rng(seed)
    mask = np.zeros((size, size), np.uint8)
    c = size / 2
    mask[draw.ellipse(c, c, 0.4 * size, 0.3 * size, rotation=0.4, shape=mask.shape)] = CYTOPLASM
    mask[draw.ellipse(c + 5 * zoom, c - 4 * zoom, 28 * zoom, 22 * zoom, rotation=-0.3, shape=mask.shape)] = NUCLEUS
    for k in range(nucleoli):
        mask[draw.disk((c + (2 + 10 * k) * zoom, c + (-8 + 6 * k) * zoom), 3, shape=mask.shape)] = NUCLEOLUS
    chromatin = ndimage.gaussian_filter(rng.normal(size=mask.shape), 1.5)
    chromatin /= chromatin.std()
    od = np.zeros(mask.shape)
    od[mask == CYTOPLASM] = 0.15
    nucleus = mask >= NUCLEUS
    od[nucleus] = 0.6 + 0.12 * chromatin[nucleus]
    od[mask == NUCLEOLUS] = 0.95
    od = ndimage.gaussian_filter(np.clip(od, 0, None), 0.7)
    noise = (rng.normal(0, 1.5, mask.shape + (3,)), rng.normal(0, 1.0, mask.shape + (3,)))
    return od, slide(mask.shape, 205.0), noise, mask


def value(vector: np.ndarray, name: str) -> float:
    return float(vector[NAMES.index(name)])


def reference_od(image: np.ndarray, background: np.ndarray) -> np.ndarray:
    """Grey OD written out independently: -log10(I / I0), I0 the background smoothed
    (sigma 2 px, mirrored edges, as documented), intensities floored at 1, OD >= 0."""
    smooth = np.stack([ndimage.gaussian_filter(background[..., k].astype(float), 2.0, mode="mirror",
                                               truncate=4.0) for k in range(3)], axis=2)
    ratio = np.maximum(image.astype(float), 1.0) / np.maximum(smooth, 1.0)
    return np.maximum(-np.log10(ratio), 0.0).mean(axis=2)


def flat_cell(nucleus_mask: np.ndarray, cell_mask: np.ndarray, lamp: float = 200.0,
              nucleus_od: float = 0.5, cytoplasm_od: float = 0.1):
    """Uniform-density cell from boolean masks, no noise: (image, background, label mask)."""
    mask = np.zeros(cell_mask.shape, np.uint8)
    mask[cell_mask] = CYTOPLASM
    mask[nucleus_mask] = NUCLEUS
    od = np.where(nucleus_mask, nucleus_od, np.where(cell_mask, cytoplasm_od, 0.0))
    image, background = render(od, slide(mask.shape, lamp))
    return image, background, mask


def disk_mask(shape, centre, radius):
    out = np.zeros(shape, bool)
    out[draw.disk(centre, radius, shape=shape)] = True
    return out


# --- the catalogue -------------------------------------------------------------------

def test_catalogue_names_units_groups_match_the_vector():
    od, background, noise, mask = realistic_cell()
    vector = extract_features(*render(od, background, noise), mask)
    assert vector.dtype == np.float64 and vector.shape == (len(FEATURES),)
    assert len(set(NAMES)) == len(NAMES)
    for f in FEATURES:
        assert f.unit in UNITS, f
        assert f.group in GROUPS and f.doc.strip(), f
    assert {f.group for f in FEATURES} == set(GROUPS)
    # Groups are contiguous in the vector: geometric, density, texture.
    order = [f.group for f in FEATURES]
    assert order == sorted(order, key=GROUPS.index)


# The comparisons with independent implementations run on a Herlev-sized cell and on a
# 1024 x 1024 px one with a 5x larger nucleus: large uploads take other code paths' costs
# (contours, hulls, co-occurrence over ~70 000 nucleus pixels) and must give the same values.
REFERENCE_SIZES = pytest.mark.parametrize("size, zoom", [(200, 1.0), (1024, 5.0)], ids=["200px", "1024px"])


# --- geometry: known shapes and regionprops --------------------------------------------

def test_disk_in_disk_known_answers():
    shape, r_n, r_c = (200, 200), 30, 60
    nucleus = disk_mask(shape, (100, 100), r_n)
    image, background, mask = flat_cell(nucleus, disk_mask(shape, (100, 100), r_c))
    v = extract_features(image, background, mask)
    assert value(v, "nucleus_area") == pytest.approx(np.pi * r_n**2, rel=0.02)
    assert value(v, "cell_area") == pytest.approx(np.pi * r_c**2, rel=0.02)
    assert value(v, "nucleus_form_factor") == pytest.approx(1.0, abs=0.1)
    assert value(v, "nucleus_eccentricity") < 0.05
    assert value(v, "nucleus_solidity") > 0.97
    for name in ("nucleus_feret_max", "nucleus_feret_min", "nucleus_major_axis", "nucleus_minor_axis"):
        assert value(v, name) == pytest.approx(2 * r_n, abs=1.5), name
    assert value(v, "nc_ratio") == pytest.approx((r_n / r_c) ** 2, rel=0.03)
    assert value(v, "nucleus_offset") < 0.01
    assert value(v, "nucleus_radial_cv") < 0.03
    assert max(value(v, f"nucleus_fourier_{k}") for k in range(2, 9)) < 0.02
    assert value(v, "nucleolus_count") == 0 and value(v, "nucleolus_area") == 0


def test_ellipse_and_square_known_answers():
    shape = (200, 200)
    ellipse = np.zeros(shape, bool)
    ellipse[draw.ellipse(100, 100, 20, 40, shape=shape)] = True  # semi-axes 20 (rows), 40 (cols)
    image, background, mask = flat_cell(ellipse, disk_mask(shape, (100, 100), 70))
    v = extract_features(image, background, mask)
    assert value(v, "nucleus_major_axis") == pytest.approx(80, abs=1.5)
    assert value(v, "nucleus_minor_axis") == pytest.approx(40, abs=1.5)
    assert value(v, "nucleus_feret_max") == pytest.approx(80, abs=1.5)
    assert value(v, "nucleus_feret_min") == pytest.approx(40, abs=1.5)
    assert value(v, "nucleus_eccentricity") == pytest.approx(np.sqrt(1 - 0.5**2), abs=0.01)

    square = np.zeros(shape, bool)
    square[80:120, 80:120] = True
    image, background, mask = flat_cell(square, disk_mask(shape, (100, 100), 70))
    v = extract_features(image, background, mask)
    assert value(v, "nucleus_area") == 1600
    assert value(v, "nucleus_solidity") == pytest.approx(1.0, abs=1e-9)
    assert value(v, "nucleus_feret_min") == pytest.approx(40, abs=1e-6)
    assert value(v, "nucleus_feret_max") == pytest.approx(40 * np.sqrt(2), abs=1e-6)


@REFERENCE_SIZES
def test_geometry_matches_regionprops_on_a_realistic_cell(size, zoom):
    od, background, noise, mask = realistic_cell(seed=3, size=size, zoom=zoom)
    v = extract_features(*render(od, background, noise), mask)
    for name, region in (("nucleus", mask >= NUCLEUS), ("cell", mask > 0)):
        props = measure.regionprops(region.astype(np.uint8))[0]
        assert value(v, f"{name}_area") == props.area
        assert value(v, f"{name}_perimeter") == pytest.approx(props.perimeter, rel=1e-9)
        assert value(v, f"{name}_form_factor") == pytest.approx(4 * np.pi * props.area / props.perimeter**2)
        assert value(v, f"{name}_eccentricity") == pytest.approx(props.eccentricity, rel=1e-9)
        assert value(v, f"{name}_major_axis") == pytest.approx(props.axis_major_length, rel=1e-9)
        assert value(v, f"{name}_minor_axis") == pytest.approx(props.axis_minor_length, rel=1e-9)
        # Solidity and maximum Feret come from the hull of pixel outlines, regionprops
        # rasterises its own hull: close, not identical.
        assert value(v, f"{name}_solidity") == pytest.approx(props.solidity, abs=0.02)
        assert value(v, f"{name}_feret_max") == pytest.approx(props.feret_diameter_max, abs=1.5)
    assert value(v, "nucleolus_count") == 2
    assert value(v, "nucleolus_area") == np.count_nonzero(mask == NUCLEOLUS)
    assert value(v, "nc_ratio") == pytest.approx(np.count_nonzero(mask >= NUCLEUS) / np.count_nonzero(mask))


def lobed_mask(shape, centre, radius, lobes=5, depth=0.2, turn=0.0):
    angles = np.linspace(0, 2 * np.pi, 400, endpoint=False)
    r = radius * (1 + depth * np.cos(lobes * (angles - turn)))
    out = np.zeros(shape, bool)
    out[draw.polygon(centre[0] + r * np.sin(angles), centre[1] + r * np.cos(angles), shape=shape)] = True
    return out


def test_lobed_nucleus_is_irregular_and_a_smooth_one_is_not():
    shape = (200, 200)
    lobed = lobed_mask(shape, (100, 100), 30)
    smooth = disk_mask(shape, (100, 100), 30)
    cell = disk_mask(shape, (100, 100), 70)
    v_lobed = extract_features(*flat_cell(lobed, cell))
    v_smooth = extract_features(*flat_cell(smooth, cell))
    assert value(v_lobed, "nucleus_radial_cv") > 3 * value(v_smooth, "nucleus_radial_cv")
    # Five lobes put the contour's energy in harmonics +-5 (4 and 6 around the fundamental).
    assert value(v_lobed, "nucleus_fourier_4") + value(v_lobed, "nucleus_fourier_6") > 0.1
    assert value(v_lobed, "nucleus_solidity") < value(v_smooth, "nucleus_solidity") - 0.03
    assert value(v_lobed, "nucleus_form_factor") < value(v_smooth, "nucleus_form_factor") - 0.1


def test_contour_descriptors_ignore_size_and_rotation():
    shape = (260, 260)
    cell = disk_mask(shape, (130, 130), 125)
    small = extract_features(*flat_cell(lobed_mask(shape, (130, 130), 30), cell))
    large = extract_features(*flat_cell(lobed_mask(shape, (130, 130), 60, turn=0.3), cell))
    for name in ["nucleus_radial_cv"] + [f"nucleus_fourier_{k}" for k in range(2, 9)]:
        assert value(large, name) == pytest.approx(value(small, name), abs=0.01), name
    assert value(large, "nucleus_area") == pytest.approx(4 * value(small, "nucleus_area"), rel=0.02)


def test_nucleoli_counted():
    shape = (200, 200)
    image, background, mask = flat_cell(disk_mask(shape, (100, 100), 35), disk_mask(shape, (100, 100), 70))
    for centre in ((90, 90), (110, 105), (95, 115)):
        mask[disk_mask(shape, centre, 3)] = NUCLEOLUS
    v = extract_features(image, background, mask)
    assert value(v, "nucleolus_count") == 3
    assert value(v, "nucleolus_area") == np.count_nonzero(mask == NUCLEOLUS)
    assert value(v, "nucleolus_fraction") == pytest.approx(
        np.count_nonzero(mask == NUCLEOLUS) / np.count_nonzero(mask >= NUCLEUS))


# --- optical density ---------------------------------------------------------------------

def test_uniform_stain_gives_its_optical_density():
    shape = (160, 160)
    image, background, mask = flat_cell(disk_mask(shape, (80, 80), 25), disk_mask(shape, (80, 80), 60),
                                        nucleus_od=0.5, cytoplasm_od=0.1)
    v = extract_features(image, background, mask)
    # uint8 rounding of I ~ 60-180 grey levels bounds the error to ~0.005 OD.
    assert value(v, "nucleus_od_mean") == pytest.approx(0.5, abs=0.005)
    assert value(v, "cytoplasm_od_mean") == pytest.approx(0.1, abs=0.005)
    assert value(v, "nucleus_od_std") < 0.01
    for channel, absorbance in zip(("red", "green", "blue"), ABSORBANCE):
        assert value(v, f"nucleus_od_{channel}") == pytest.approx(0.5 * absorbance, abs=0.005)
        assert value(v, f"cytoplasm_od_{channel}") == pytest.approx(0.1 * absorbance, abs=0.005)
    n_nucleus = np.count_nonzero(mask == NUCLEUS)
    assert value(v, "nucleus_od_integrated") == pytest.approx(value(v, "nucleus_od_mean") * n_nucleus)


@pytest.mark.parametrize("spectrum, stain", [((1.6, 0.9, 0.5), "cyanophilic"), ((0.5, 1.6, 0.9), "eosinophilic")])
def test_cytoplasm_stain_shares_and_nuclear_contrast_have_their_known_answers(spectrum, stain):
    """A cytoplasm whose stain absorbs red (light green: cyanophilic) or green (eosin:
    eosinophilic) light, drawn by Beer-Lambert with a known spectrum: the shares are that
    spectrum's, and the nucleus (0.5 OD) against the cytoplasm (grey 0.1 OD) gives 0.5 / 0.6."""
    shape = (160, 160)
    nucleus, cell = disk_mask(shape, (80, 80), 25), disk_mask(shape, (80, 80), 60)
    mask = np.where(nucleus, NUCLEUS, np.where(cell, CYTOPLASM, 0)).astype(np.uint8)
    cytoplasm_od = 0.1 * np.array(spectrum) / np.mean(spectrum)
    od = np.where(nucleus[..., None], 0.5 * ABSORBANCE, np.where(cell[..., None], cytoplasm_od, 0.0))
    background = slide(shape, 200.0)
    image = np.clip(np.rint(background * 10.0 ** (-od)), 0, 255).astype(np.uint8)
    v = extract_features(image, np.clip(np.rint(background), 0, 255).astype(np.uint8), mask)
    red, green = (s / sum(spectrum) for s in spectrum[:2])
    assert value(v, "cytoplasm_od_red_share") == pytest.approx(red, abs=0.02)
    assert value(v, "cytoplasm_od_green_share") == pytest.approx(green, abs=0.02)
    if stain == "cyanophilic":
        assert value(v, "cytoplasm_od_red_share") > value(v, "cytoplasm_od_green_share")
    else:
        assert value(v, "cytoplasm_od_green_share") > value(v, "cytoplasm_od_red_share")
    assert value(v, "nucleus_od_contrast") == pytest.approx(0.5 / 0.6, abs=0.01)
    # a bare nucleus (no cytoplasm): neutral shares, full contrast
    bare = extract_features(image, np.clip(np.rint(background), 0, 255).astype(np.uint8),
                            np.where(nucleus, NUCLEUS, 0).astype(np.uint8))
    assert value(bare, "cytoplasm_od_red_share") == value(bare, "cytoplasm_od_green_share") == pytest.approx(1 / 3)
    assert value(bare, "nucleus_od_contrast") == 1.0



@REFERENCE_SIZES
def test_od_statistics_match_scipy_on_a_realistic_cell(size, zoom):
    od, background, noise, mask = realistic_cell(seed=5, size=size, zoom=zoom)
    image, slide_u8 = render(od, background, noise)
    v = extract_features(image, slide_u8, mask)
    grey = reference_od(image, slide_u8)
    nucleus, cytoplasm = grey[mask >= NUCLEUS], grey[mask == CYTOPLASM]
    for name, values in (("nucleus", nucleus), ("cytoplasm", cytoplasm)):
        assert value(v, f"{name}_od_mean") == pytest.approx(values.mean(), rel=1e-6)
        assert value(v, f"{name}_od_std") == pytest.approx(values.std(), rel=1e-6)
        assert value(v, f"{name}_od_skew") == pytest.approx(stats.skew(values), rel=1e-5)
        assert value(v, f"{name}_od_kurtosis") == pytest.approx(stats.kurtosis(values, fisher=False), rel=1e-5)
        assert value(v, f"{name}_od_integrated") == pytest.approx(values.sum(), rel=1e-6)
    excess = grey[mask == NUCLEOLUS].mean() - nucleus.mean()
    assert value(v, "nucleolus_od_excess") == pytest.approx(excess, rel=1e-6)
    # And the rendered densities come back: true nucleus OD is 0.6 before blur.
    assert value(v, "nucleus_od_mean") == pytest.approx(od[mask >= NUCLEUS].mean(), abs=0.01)


@REFERENCE_SIZES
def test_brightness_matches_regionprops_on_a_realistic_cell(size, zoom):
    od, background, noise, mask = realistic_cell(seed=5, size=size, zoom=zoom)
    image, slide_u8 = render(od, background, noise)
    v = extract_features(image, slide_u8, mask)
    labels = np.where(mask >= NUCLEUS, 1, np.where(mask == CYTOPLASM, 2, 0))
    colour = measure.regionprops_table(labels, image / 255.0, properties=("label", "intensity_mean"))
    grey = measure.regionprops_table(labels, image.mean(axis=2) / 255.0,
                                     properties=("label", "intensity_std", "intensity_min"))
    for row, name in ((0, "nucleus"), (1, "cytoplasm")):
        for index, channel in enumerate(("red", "green", "blue")):
            assert value(v, f"{name}_brightness_{channel}") == pytest.approx(colour[f"intensity_mean-{index}"][row], rel=1e-9)
        assert value(v, f"{name}_brightness_std") == pytest.approx(grey["intensity_std"][row], rel=1e-9)
    assert value(v, "nucleus_brightness_min") == pytest.approx(grey["intensity_min"][0], rel=1e-9)
    nucleus = image.mean(axis=2)[mask >= NUCLEUS] / 255.0
    assert value(v, "nucleus_brightness_p10") == pytest.approx(np.percentile(nucleus, 10), rel=1e-9)


@REFERENCE_SIZES
def test_cytoplasm_extrema_counts_match_mahotas_regional_extrema(size, zoom):
    import mahotas

    od, background, noise, mask = realistic_cell(seed=5, size=size, zoom=zoom)
    image, slide_u8 = render(od, background, noise)
    v = extract_features(image, slide_u8, mask)
    # The features count on the cell's crop; regional extrema of the whole image differ
    # only where a plateau reaches the crop's edge, which is 8 px of glass from the cell.
    grey = image.sum(axis=2, dtype=np.int32)
    eight = np.ones((3, 3), bool)
    for kind, regional in (("maxima", mahotas.regmax), ("minima", mahotas.regmin)):
        expected = ndimage.label(regional(grey, Bc=eight) & (mask == CYTOPLASM), structure=eight)[1]
        assert value(v, f"cytoplasm_local_{kind}") == expected > 0


def test_cytoplasm_extrema_counts_have_their_known_answer():
    # A flat cytoplasm (one plateau: a maximum and a minimum of the grey level at once)
    # with three bright specks and two dark ones, 2 x 2 px each, apart from one another.
    mask = np.zeros((60, 60), np.uint8)
    mask[10:50, 10:50] = CYTOPLASM
    mask[26:34, 26:34] = NUCLEUS
    image = np.full((60, 60, 3), 230, np.uint8)
    image[mask == CYTOPLASM] = 180
    image[mask == NUCLEUS] = 90
    for r, c in ((14, 14), (14, 40), (44, 14)):
        image[r:r + 2, c:c + 2] = 200
    for r, c in ((44, 40), (20, 30)):
        image[r:r + 2, c:c + 2] = 150
    v = extract_features(image, np.full_like(image, 240), mask)
    # The flat cytoplasm is neither (its bright specks and the glass rise above it, its
    # dark ones and the nucleus fall below it): only the specks count.
    assert value(v, "cytoplasm_local_maxima") == 3 and value(v, "cytoplasm_local_minima") == 2


def test_brightness_follows_the_lamp_where_od_does_not():
    od, background, noise, mask = realistic_cell(seed=1)
    base = extract_features(*render(od, background, noise), mask)
    dimmer = extract_features(*render(od, background, noise, scale=0.8), mask)
    ratio = value(dimmer, "nucleus_brightness_green") / value(base, "nucleus_brightness_green")
    assert ratio == pytest.approx(0.8, abs=0.02)
    assert value(dimmer, "nucleus_od_mean") == pytest.approx(value(base, "nucleus_od_mean"), rel=0.01)


def _od_feature_drift(base: np.ndarray, moved: np.ndarray) -> dict[str, float]:
    """How far each density feature moved, as a fraction of its scale.

    The scale is the feature's own magnitude, except for skewness, which is centred on 0
    (a symmetric distribution): 1% of a skew of 0.02 would demand 0.0002, which no
    measurement has; its scale is max(|skew|, 1), its natural unit.
    """
    drift = {}
    for i, f in enumerate(FEATURES):
        if f.group != "density" or "_od" not in f.name:  # brightness follows the lamp, by design
            continue
        scale = max(abs(base[i]), 1.0) if f.name.endswith("_skew") else abs(base[i])
        drift[f.name] = abs(moved[i] - base[i]) / max(scale, 1e-12)
    return drift


@pytest.mark.parametrize("factor", [0.8, 0.9, 1.1, 1.2])
@pytest.mark.parametrize("how", ["rescaled", "re-exposed"])
def test_optical_density_features_are_lamp_invariant(factor, how):
    od, background, noise, mask = realistic_cell(seed=1)
    image, slide_u8 = render(od, background, noise)
    base = extract_features(image, slide_u8, mask)
    if how == "rescaled":
        # The uint8 images scaled and rounded once more (the slide peaks at 205 * 1.2 < 255,
        # so nothing clips).
        scaled = [np.clip(np.round(a * factor), 0, 255).astype(np.uint8) for a in (image, slide_u8)]
    else:
        # The same scene photographed under the other lamp: one rounding, as a camera does.
        scaled = render(od, background, noise, scale=factor)
    moved = extract_features(*scaled, mask)
    drift = _od_feature_drift(base, moved)
    assert max(drift.values()) < 0.01, {k: round(d, 4) for k, d in drift.items() if d >= 0.01}
    # Texture is measured on OD too, so it barely moves: LBP fractions by < 0.02, Haralick
    # features by < 5% (but for correlation and imc1, which sit near 0 at 4 px, where a
    # relative change means nothing).
    for i, f in enumerate(FEATURES):
        if f.group == "texture" and "lbp" in f.name:
            assert abs(moved[i] - base[i]) < 0.02, f.name
        elif f.group == "texture" and "imc1" not in f.name and "correlation" not in f.name:
            assert abs(moved[i] - base[i]) <= 0.05 * abs(base[i]) + 1e-9, f.name


def test_lamp_invariance_check_catches_a_missing_background_correction():
    """Scaling the image alone (a background from another lamp) must move OD features:
    the invariance test above would catch features that ignored the background."""
    od, background, noise, mask = realistic_cell(seed=1)
    image, slide_u8 = render(od, background, noise)
    base = extract_features(image, slide_u8, mask)
    moved = extract_features(np.clip(np.round(image * 0.8), 0, 255).astype(np.uint8), slide_u8, mask)
    assert _od_feature_drift(base, moved)["nucleus_od_mean"] > 0.1


# --- texture -------------------------------------------------------------------------

def _reference_levels(image, background):
    """Quantised OD written out from the documented scale: levels 1..OD_LEVELS."""
    grey = reference_od(image, background)
    return np.clip(np.floor(grey / texture.OD_STEP), 0, texture.OD_LEVELS - 1).astype(np.uint8) + 1


def pooled_glcm(levels: np.ndarray, d: int) -> np.ndarray:
    """scikit-image's co-occurrence matrix for pairs d px apart in the four directions,
    pooled, pairs touching level 0 (outside the nucleus) dropped. A diagonal pair d px
    apart along both axes is sqrt(2) * d away, which is the distance skimage is given."""
    straight = graycomatrix(levels, [d], [0, np.pi / 2], levels=texture.OD_LEVELS + 1, symmetric=True)
    diagonal = graycomatrix(levels, [d * np.sqrt(2)], [np.pi / 4, 3 * np.pi / 4],
                            levels=texture.OD_LEVELS + 1, symmetric=True)
    pooled = straight.sum(axis=3, keepdims=True) + diagonal.sum(axis=3, keepdims=True)
    return pooled[1:, 1:].astype(float)


@REFERENCE_SIZES
def test_haralick_matches_skimage_glcm_at_every_distance(size, zoom):
    od, background, noise, mask = realistic_cell(seed=2, size=size, zoom=zoom)
    image, slide_u8 = render(od, background, noise)
    v = extract_features(image, slide_u8, mask)
    levels = np.where(mask >= NUCLEUS, _reference_levels(image, slide_u8), 0)
    for d in texture.HARALICK_DISTANCES:
        glcm = pooled_glcm(levels, d)
        for ours, theirs in (("contrast", "contrast"), ("asm", "ASM"), ("idm", "homogeneity"),
                             ("correlation", "correlation")):
            expected = graycoprops(glcm, theirs)[0, 0]
            assert value(v, f"nucleus_haralick_{ours}_d{d}") == pytest.approx(expected, rel=1e-6), (ours, d)
        # mahotas measures entropy in bits, scikit-image in nats.
        entropy_bits = graycoprops(glcm, "entropy")[0, 0] / np.log(2)
        assert value(v, f"nucleus_haralick_entropy_d{d}") == pytest.approx(entropy_bits, rel=1e-6)
        assert value(v, f"nucleus_haralick_variance_d{d}") == pytest.approx(graycoprops(glcm, "variance")[0, 0],
                                                                         rel=1e-6)
    # Texture grows with distance for a smooth chromatin pattern: contrast at 4 px > at 1 px.
    assert value(v, "nucleus_haralick_contrast_d4") > 2 * value(v, "nucleus_haralick_contrast_d1")


@pytest.mark.filterwarnings("ignore:Applying `local_binary_pattern` to floating-point")
@REFERENCE_SIZES
def test_lbp_histograms_match_skimage(size, zoom):
    od, background, noise, mask = realistic_cell(seed=2, size=size, zoom=zoom)
    image, slide_u8 = render(od, background, noise)
    v = extract_features(image, slide_u8, mask)
    grey = reference_od(image, slide_u8)
    nucleus = mask >= NUCLEUS
    for p, r in texture.LBP_SETTINGS:
        codes = local_binary_pattern(grey, p, r, method="uniform")[nucleus].astype(int)
        expected = np.bincount(codes, minlength=p + 2) / codes.size
        ours = [value(v, f"nucleus_lbp_p{p}r{r}_{code}") for code in range(p + 2)]
        # Exact but for a rare neighbour within rounding (1e-16 OD) of its centre.
        np.testing.assert_allclose(ours, expected, atol=2.0 / codes.size)
        assert sum(ours) == pytest.approx(1.0)


def test_perimeter_equals_scikit_images():
    """Random regions of many shapes, touching the border, one pixel and empty included."""
    from pathmaster.features.geometry import perimeter

    rng = np.random.default_rng(11)
    for _ in range(60):
        shape = tuple(int(v) for v in rng.integers(1, 70, size=2))
        region = ndimage.gaussian_filter(rng.normal(size=shape), rng.uniform(0.5, 4.0)) > rng.uniform(-0.5, 0.8)
        assert perimeter(region) == measure.perimeter(region, 4)
    assert perimeter(np.ones((1, 1), bool)) == measure.perimeter(np.ones((1, 1), bool), 4) == 0.0
    assert perimeter(np.zeros((5, 5), bool)) == 0.0


@pytest.mark.filterwarnings("ignore:Applying `local_binary_pattern` to floating-point")
def test_uniform_lbp_codes_equal_skimages_bit_for_bit():
    """Random images of many shapes, continuous and with exact ties (quantised), the
    circle reaching past the border: every code equal."""
    rng = np.random.default_rng(7)
    for trial in range(40):
        shape = tuple(int(v) for v in rng.integers(1, 60, size=2))
        grey = rng.random(shape) if trial % 2 else np.round(rng.random(shape) * 3) / 3
        for p, r in texture.LBP_SETTINGS:
            expected = local_binary_pattern(grey, p, r, method="uniform")
            np.testing.assert_array_equal(texture.uniform_lbp(grey, p, r), expected, err_msg=f"{shape} P={p} R={r}")
    assert len(np.unique(texture.uniform_lbp(rng.random((40, 40)), 16, 2))) >= 10  # many codes: not trivially equal


def test_uniform_nucleus_has_no_texture_and_mottled_one_has():
    shape = (160, 160)
    nucleus, cell = disk_mask(shape, (80, 80), 30), disk_mask(shape, (80, 80), 60)
    v_flat = extract_features(*flat_cell(nucleus, cell))
    assert value(v_flat, "nucleus_haralick_contrast_d1") == 0
    assert value(v_flat, "nucleus_haralick_asm_d1") == 1
    od, background, noise, mask = realistic_cell(seed=4)
    v_mottled = extract_features(*render(od, background, noise), mask)
    assert value(v_mottled, "nucleus_haralick_contrast_d1") > 0.5
    assert value(v_mottled, "nucleus_haralick_asm_d1") < 0.1


# --- invariances and robustness ----------------------------------------------------------

def test_more_slide_around_the_cell_changes_nothing():
    od, background, noise, mask = realistic_cell(seed=6, size=120)
    image, slide_u8 = render(od, background, noise)
    base = extract_features(image, slide_u8, mask)
    pad = ((30, 10), (5, 40))
    padded = extract_features(np.pad(image, pad + ((0, 0),), mode="reflect"),
                              np.pad(slide_u8, pad + ((0, 0),), mode="reflect"),
                              np.pad(mask, pad))
    np.testing.assert_allclose(padded, base, rtol=1e-9, atol=1e-12)


def test_quarter_turn_keeps_the_features():
    od, background, noise, mask = realistic_cell(seed=7)
    image, slide_u8 = render(od, background, noise)
    base = extract_features(image, slide_u8, mask)
    turned = extract_features(np.rot90(image).copy(), np.rot90(slide_u8).copy(), np.rot90(mask).copy())
    contour = [i for i, n in enumerate(NAMES) if "fourier" in n or "radial" in n]
    rest = [i for i in range(len(NAMES)) if i not in contour]
    np.testing.assert_allclose(turned[rest], base[rest], rtol=1e-6, atol=1e-9)
    # Fourier descriptors resample the contour from another starting pixel.
    np.testing.assert_allclose(turned[contour], base[contour], rtol=0.05, atol=0.005)


@pytest.mark.parametrize("case", ["one_pixel", "two_pixels", "bare_nucleus", "at_image_edge"])
def test_degenerate_but_valid_cells_give_finite_features(case):
    shape = (40, 40)
    cell = disk_mask(shape, (20, 20), 12)
    nucleus = np.zeros(shape, bool)
    if case == "one_pixel":
        nucleus[20, 20] = True
    elif case == "two_pixels":
        nucleus[20, 20:22] = True
    elif case == "bare_nucleus":
        nucleus = cell.copy()
    else:
        cell = disk_mask(shape, (3, 20), 10)
        nucleus = disk_mask(shape, (1, 20), 4)
    v = extract_features(*flat_cell(nucleus, cell))
    assert np.isfinite(v).all(), [n for n, x in zip(NAMES, v) if not np.isfinite(x)]
    assert value(v, "nucleus_area") == np.count_nonzero(nucleus)


def test_cell_without_nucleus_is_rejected_with_its_name():
    shape = (80, 80)
    image, background, mask = flat_cell(np.zeros(shape, bool), disk_mask(shape, (40, 40), 30))
    with pytest.raises(InvalidInput, match="no nucleus") as err:
        extract_features(image, background, mask, source="case7/cell3.png")
    assert "case7/cell3.png" in str(err.value)


@pytest.mark.parametrize("problem, match", [
    ("mask_size", "mask shape"),
    ("mask_label", "outside 0-3"),
    ("float_image", "uint8"),
    ("grey_image", r"\(H, W, 3\)"),
    ("background_size", "background shape"),
    ("float_mask", "integer"),
])
def test_bad_arrays_are_rejected_clearly(problem, match):
    shape = (80, 80)
    image, background, mask = flat_cell(disk_mask(shape, (40, 40), 10), disk_mask(shape, (40, 40), 30))
    if problem == "mask_size":
        mask = mask[:-1]
    elif problem == "mask_label":
        mask = mask.copy()
        mask[0, 0] = 7
    elif problem == "float_image":
        image = image / 255.0
    elif problem == "grey_image":
        image = image[..., 0]
    elif problem == "background_size":
        background = background[:, :-2]
    else:
        mask = mask.astype(float)
    with pytest.raises(InvalidInput, match=match) as err:
        extract_features(image, background, mask, source="cell.bmp")
    assert str(err.value).startswith("cell.bmp: ")


def test_synthetic_cells_of_every_diagnosis_give_finite_features_that_follow_it():
    from pathmaster.records import DIAGNOSES
    from pathmaster.image.synth import synth_cell

    vectors = {}
    for diagnosis in DIAGNOSES:
        cells = [synth_cell(diagnosis, np.random.default_rng(seed)) for seed in range(3)]
        vectors[diagnosis] = np.array([extract_features(c.image, c.background, c.mask) for c in cells])
        assert np.isfinite(vectors[diagnosis]).all(), diagnosis

    def median(diagnosis, name):
        return float(np.median(vectors[diagnosis][:, NAMES.index(name)]))

    # Carcinoma in situ: enlarged nucleus, high N/C ratio (the generator's cytology criteria).
    assert median("carcinoma_in_situ", "nc_ratio") > 5 * median("normal_intermediate", "nc_ratio")
    assert median("carcinoma_in_situ", "nucleus_area") > 2 * median("normal_intermediate", "nucleus_area")


def test_catalogue_prints_every_feature_with_its_unit(capsys):
    from pathmaster.features.__main__ import main

    assert main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == len(FEATURES)
    for line, f in zip(out, FEATURES):
        index, name, unit = line.split()[:3]
        assert (name, unit) == (f.name, f.unit)


def test_feature_schema_changes_with_code_that_moves_values_not_with_docs(monkeypatch, tmp_path):
    """The schema identity hashes the value modules' code without docstrings or comments."""
    from pathmaster.features import schema

    base = schema.feature_schema()
    assert base.startswith("fs1-") and len(base) == 20
    assert schema.feature_schema() == base  # stable within one installation
    src = (schema._PACKAGE / "features" / "density.py").read_text()
    assert schema.code_digest(src) == schema.code_digest(src.replace('"""', '"""Reworded. ', 1) + "\n# a comment\n")
    assert schema.code_digest(src) != schema.code_digest(src + "\nEPS = 1e-9\n")
    # A different library version is a different schema.
    schema.feature_schema.cache_clear()
    monkeypatch.setattr(schema, "library_version", lambda name: "0.0" if name == "mahotas" else "1")
    changed = schema.feature_schema()
    schema.feature_schema.cache_clear()
    assert changed != base
