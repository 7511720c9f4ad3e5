"""The feature catalogue: every feature's name, unit, one-line doc and group, in vector order.

One tuple of `Feature` per group (GEOMETRIC, DENSITY, TEXTURE), with the settings that
decide which features exist (Fourier harmonics, channels, Haralick distances, LBP
settings); each group module (geometry, density, texture) computes its tuple's features
and returns a {name: value} dict with exactly those names, and `extract.py` checks that
the two agree, so the catalogue cannot drift from the code. This module imports nothing
that analyses images: a site checks its stored feature names against these without
loading scikit-image, OpenCV or mahotas.
"""

from __future__ import annotations

from dataclasses import dataclass

GROUPS = ("geometric", "density", "texture")


@dataclass(frozen=True)
class Feature:
    """One entry of the feature vector.

    name: unique snake_case name, e.g. "nucleus_area".
    unit: "px", "px^2", "OD", "OD*px^2" (integrated optical density) or "1" (dimensionless).
    doc: one line saying what is measured and how.
    group: one of GROUPS.
    """

    name: str
    unit: str
    doc: str
    group: str

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise ValueError(f"feature {self.name!r}: unknown group {self.group!r}")


# ---------------------------------------------------------------- the catalogue, in vector order

# Fourier descriptors of the nucleus contour: harmonics 2..FOURIER_HARMONICS are reported
# (harmonic 1 is the best-fitting ellipse).
FOURIER_HARMONICS = 8

_SHAPE = (
    ("area", "px^2", "area (pixel count)"),
    ("perimeter", "px", "perimeter (scikit-image regionprops, 4-connected contour with diagonal weights)"),
    ("form_factor", "1", "form factor 4*pi*area/perimeter^2 (1 for a disk, smaller when elongated or ragged)"),
    ("eccentricity", "1", "eccentricity of the ellipse with the same second moments (0 for a disk)"),
    ("solidity", "1", "area / area of the convex hull of the pixel outlines"),
    ("major_axis", "px", "major axis length of the ellipse with the same second moments"),
    ("minor_axis", "px", "minor axis length of the ellipse with the same second moments"),
    ("feret_max", "px", "maximum Feret (caliper) diameter of the pixel outlines"),
    ("feret_min", "px", "minimum Feret (caliper) diameter: narrowest width over all directions"),
)

GEOMETRIC: tuple[Feature, ...] = (
    *(Feature(f"{region}_{key}", unit, f"{label}: {doc}", "geometric")
      for region, label in (("nucleus", "nucleus"), ("cell", "whole cell (cytoplasm and nucleus)"))
      for key, unit, doc in _SHAPE),
    Feature("nucleus_radial_cv", "1",
            "contour irregularity: std / mean of the distance from the nucleus centroid to its contour",
            "geometric"),
    *(Feature(f"nucleus_fourier_{k}", "1",
              f"Fourier descriptor {k} of the nucleus contour: amplitude of harmonics +-{k} over harmonics +-1",
              "geometric")
      for k in range(2, FOURIER_HARMONICS + 1)),
    Feature("nc_ratio", "1", "nucleus/cytoplasm ratio as nucleus area / whole cell area (Herlev's N/C)",
            "geometric"),
    Feature("nucleus_offset", "1",
            "distance from cell centroid to nucleus centroid over the cell's equivalent radius", "geometric"),
    Feature("nucleolus_count", "1", "number of nucleoli (8-connected pieces labelled 3)", "geometric"),
    Feature("nucleolus_area", "px^2", "total area of the nucleoli", "geometric"),
    Feature("nucleolus_fraction", "1", "total nucleolus area / nucleus area", "geometric"),
)

CHANNELS = ("red", "green", "blue")
STAT_REGIONS = ("nucleus", "cytoplasm")

DENSITY: tuple[Feature, ...] = (
    *(f for region in STAT_REGIONS for f in (
        Feature(f"{region}_od_mean", "OD", f"mean optical density of the {region}", "density"),
        Feature(f"{region}_od_std", "OD", f"standard deviation of the optical density of the {region}",
                "density"),
        Feature(f"{region}_od_skew", "1", f"skewness of the optical density of the {region}", "density"),
        Feature(f"{region}_od_kurtosis", "1",
                f"kurtosis (Pearson: 3 for a normal distribution) of the optical density of the {region}", "density"),
        Feature(f"{region}_od_integrated", "OD*px^2",
                f"integrated optical density (sum over pixels) of the {region}", "density"),
    )),
    *(Feature(f"{region}_od_{channel}", "OD", f"mean optical density of the {region} in the {channel} channel",
              "density")
      for region in STAT_REGIONS for channel in CHANNELS),
    Feature("nucleolus_od_excess", "OD",
            "mean OD of the nucleoli minus mean OD of the nucleus (0 when there is no nucleolus)", "density"),
    *(Feature(f"cytoplasm_od_{channel}_share", "1",
              f"cytoplasm stain, {doc}: mean OD of the cytoplasm in the {channel} channel over its sum over "
              "the three channels (1/3 each for unstained or no cytoplasm)", "density")
      for channel, doc in (("red", "cyanophilic (light green absorbs red)"),
                           ("green", "eosinophilic (eosin absorbs green)"))),
    *(f for region in STAT_REGIONS for f in (
        *(Feature(f"{region}_brightness_{channel}", "1",
                  f"mean transmitted light of the {region} in the {channel} channel, grey level / 255 "
                  f"(Herlev's '{region} brightness'; 1 where there is no {region})", "density")
          for channel in CHANNELS),
        Feature(f"{region}_brightness_std", "1",
                f"standard deviation over the {region}'s pixels of their grey level (mean of R, G, B) / 255",
                "density"),
    )),
    Feature("nucleus_brightness_min", "1", "darkest grey level (mean of R, G, B) / 255 in the nucleus",
            "density"),
    Feature("nucleus_brightness_p10", "1",
            "10th percentile (numpy's linear) of the nucleus's grey levels (mean of R, G, B) / 255", "density"),
    Feature("nucleus_od_contrast", "1",
            "hyperchromasia against the cell's own stain: mean OD of the nucleus / (that + mean OD of the "
            "cytoplasm); 1 with no cytoplasm, 0.5 when both are unstained", "density"),
    *(Feature(f"cytoplasm_local_{kind}", "1",
              f"Herlev's 'cytoplasm {kind}': number of regional {kind} of the grey level (R + G + B; "
              f"scikit-image local_{kind}, 8-connected), counted as 8-connected pieces inside the cytoplasm",
              "density")
      for kind in ("maxima", "minima")),
)

HARALICK_DISTANCES = (1, 2, 4)
# mahotas.features.haralick's 13 features, in its order.
HARALICK_NAMES = (
    ("asm", "angular second moment (energy): sum of squared co-occurrence probabilities"),
    ("contrast", "contrast: mean squared level difference of pixel pairs (levels^2)"),
    ("correlation", "correlation of the levels of pixel pairs"),
    ("variance", "variance of the levels (levels^2)"),
    ("idm", "inverse difference moment (homogeneity)"),
    ("sum_average", "mean of the sum of the two levels"),
    ("sum_variance", "variance of the sum of the two levels"),
    ("sum_entropy", "entropy of the sum of the two levels (bits)"),
    ("entropy", "entropy of the co-occurrence matrix (bits)"),
    ("difference_variance", "variance of the level difference |x - y|"),
    ("difference_entropy", "entropy of the level difference (bits)"),
    ("imc1", "information measure of correlation 1"),
    ("imc2", "information measure of correlation 2"),
)
# Rotation-invariant uniform LBP: (points, radius); P + 2 histogram bins each.
LBP_SETTINGS = ((8, 1), (16, 2))

TEXTURE: tuple[Feature, ...] = (
    *(Feature(f"nucleus_haralick_{name}_d{d}", "1",
              f"nuclear texture, Haralick {doc}, quantised OD, pairs {d} px apart in 4 directions",
              "texture")
      for d in HARALICK_DISTANCES for name, doc in HARALICK_NAMES),
    *(Feature(f"nucleus_lbp_p{p}r{r}_{code}", "1",
              f"nuclear texture, fraction of nucleus pixels with uniform LBP code {code} of the OD "
              f"({p} neighbours at {r} px{'; code ' + str(p + 1) + ' = non-uniform' if code == p + 1 else ''})",
              "texture")
      for p, r in LBP_SETTINGS for code in range(p + 2)),
)

# Vector order: geometric, then density, then texture.
FEATURES: tuple[Feature, ...] = GEOMETRIC + DENSITY + TEXTURE
_NAMES = tuple(f.name for f in FEATURES)
if len(set(_NAMES)) != len(_NAMES):
    raise ImportError("pathmaster.features: two features share a name")


def feature_names() -> tuple[str, ...]:
    """Names of the features, in vector order."""
    return _NAMES
