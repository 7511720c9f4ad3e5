"""Features of one cell: geometric, optical density and nuclear texture.

    from pathmaster.features import extract_features, FEATURES, feature_names
    vector = extract_features(image, background, mask)   # float64 (len(FEATURES),)

Modules: catalog (what a feature is, every feature in vector order), regions (input
checks, cropping), geometry, density (optical density from the background), texture
(Haralick, LBP), extract. The catalogue is imported at once; the analysing names (and
scikit-image, OpenCV, mahotas with them) on first use, so that reading the names costs
no image library.
`python -m pathmaster.features [--markdown]` prints every feature with its unit and doc.
"""

from importlib import import_module

from .catalog import FEATURES, GROUPS, Feature, feature_names

# Name -> the module that defines it, imported when the name is first used (PEP 562).
_LAZY = {"extract_features": ".extract", "grey_optical_density": "pathmaster.image.optics", "optical_density": "pathmaster.image.optics",
         "quantise_od": ".texture"}

__all__ = ["FEATURES", "GROUPS", "Feature", "extract_features", "feature_names",
           "grey_optical_density", "optical_density", "quantise_od"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name], __name__), name)
    globals()[name] = value
    return value
