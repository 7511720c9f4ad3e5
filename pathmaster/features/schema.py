"""The feature schema: one identity for "these feature vectors are comparable".

Two feature vectors may be compared only if they were made by the same catalogue (names,
units, order), the same code (every module that turns pixels into values: decoding,
segmentation, background estimate, the feature groups) and the same versions of the
libraries that compute them (NumPy, SciPy, scikit-image, mahotas, OpenCV).
`feature_schema()` hashes all of that into a short string such as ``fs1-3f9a0c12d4e5b678``.

A site stores the schema its index was built with and advertises it; the coordinator
sends feature vectors only to sites whose schema equals its own, and images to the rest.
The hash covers the code's syntax tree without comments and docstrings, so rewording a
docstring does not split the network, while any change that could move a value does
(which, at worst, costs a site the cheaper feature path until it re-indexes).
"""

from __future__ import annotations

import ast
import hashlib
from functools import lru_cache
from importlib import metadata
from pathlib import Path

SCHEMA_VERSION = "fs1"  # the scheme of this hash itself
_PACKAGE = Path(__file__).resolve().parents[1]
# Every module whose code can move a feature value, relative to the pathmaster package.
VALUE_MODULES = (
    "image/io.py",
    "image/optics.py",
    "image/morphology.py",
    "image/segmentation.py",
    "features/catalog.py",
    "features/regions.py",
    "features/density.py",
    "features/geometry.py",
    "features/texture.py",
    "features/extract.py",
)
VALUE_LIBRARIES = ("numpy", "scipy", "scikit-image", "mahotas", "opencv-python-headless")


def code_digest(source: str) -> str:
    """The syntax tree of a module without docstrings (comments never reach it)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def library_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


@lru_cache(maxsize=1)
def feature_schema() -> str:
    """The schema identity of the feature vectors this installation makes.

    Returns
    -------
    str
        ``"fs1-"`` followed by 16 hex digits of a SHA-256 over the catalogue, the value
        modules' code and the value libraries' versions.
    """
    from pathmaster.features.catalog import FEATURES

    h = hashlib.sha256(SCHEMA_VERSION.encode())
    for feature in FEATURES:
        h.update(f"{feature.name}|{feature.unit}|{feature.group}\n".encode())
    for rel in VALUE_MODULES:
        h.update(rel.encode())
        h.update(code_digest((_PACKAGE / rel).read_text()).encode())
    for lib in VALUE_LIBRARIES:
        h.update(f"{lib}=={library_version(lib)}\n".encode())
    return f"{SCHEMA_VERSION}-{h.hexdigest()[:16]}"
