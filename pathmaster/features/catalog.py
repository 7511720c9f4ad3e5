"""What a feature is: a name, a unit, a one-line doc and the group it belongs to.

Each group module (geometry, density, texture) declares the features it computes as a
tuple of `Feature`, in the order they appear in the vector, and a function that returns
a {name: value} dict with exactly those names. `extract.py` checks that the two agree, so
the catalogue cannot drift from the code.
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
