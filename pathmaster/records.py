"""The records every part of PathMaster passes around: one cell, its regions, its diagnosis.

A cell is an RGB image (uint8, H x W x 3), an optional blank-slide background of the
same size (uint8, H x W x 3; it turns intensity into optical density), and a label
mask (uint8, H x W) with the four PathMaster regions below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Mask labels (PathMaster's 4-region segmentation).
BACKGROUND = 0
CYTOPLASM = 1
NUCLEUS = 2
NUCLEOLUS = 3
MASK_LABELS = (BACKGROUND, CYTOPLASM, NUCLEUS, NUCLEOLUS)

# Diagnosis vocabulary: the 7 Herlev Pap-smear classes, in order of severity.
DIAGNOSES = (
    "normal_superficial",
    "normal_intermediate",
    "normal_columnar",
    "mild_dysplasia",
    "moderate_dysplasia",
    "severe_dysplasia",
    "carcinoma_in_situ",
)
NORMAL_DIAGNOSES = frozenset(DIAGNOSES[:3])


def is_abnormal(diagnosis: str) -> bool:
    """True for the dysplasias and carcinoma in situ; raises on an unknown diagnosis."""
    if diagnosis not in DIAGNOSES:
        raise InvalidInput(f"unknown diagnosis {diagnosis!r}; known: {', '.join(DIAGNOSES)}")
    return diagnosis not in NORMAL_DIAGNOSES


class InvalidInput(ValueError):
    """Bad user input: the message names the file (or cell) and says what is wrong."""

    def __init__(self, problem: str, source: str | Path | None = None):
        self.problem = problem
        self.source = None if source is None else str(source)
        super().__init__(problem if source is None else f"{source}: {problem}")


@dataclass
class CellRecord:
    """One cell as imported or generated, before features.

    image: uint8 (H, W, 3) RGB.
    mask: uint8 (H, W) with labels in MASK_LABELS, or None when not yet segmented.
    background: uint8 (H, W, 3) blank-slide image, or None when the dataset has none.
    background_estimated / mask_estimated: True when PathMaster made them itself.
    """

    source_id: str
    diagnosis: str | None
    image: np.ndarray
    mask: np.ndarray | None = None
    background: np.ndarray | None = None
    background_estimated: bool = False
    mask_estimated: bool = False
    origin: str = ""
    extra: dict = field(default_factory=dict)
