"""Features of one cell: geometric, optical density and nuclear texture.

    from pathmaster.features import extract_features, FEATURES, feature_names
    vector = extract_features(image, background, mask)   # float64 (len(FEATURES),)

Modules: catalog (what a feature is), regions (input checks, cropping), geometry,
density (optical density from the background), texture (Haralick, LBP), extract.
`python -m pathmaster.features [--markdown]` prints every feature with its unit and doc.
"""

from .catalog import GROUPS, Feature
from .density import grey_optical_density, optical_density
from .extract import FEATURES, extract_features, feature_names
from .texture import quantise_od

__all__ = ["FEATURES", "GROUPS", "Feature", "extract_features", "feature_names",
           "grey_optical_density", "optical_density", "quantise_od"]
