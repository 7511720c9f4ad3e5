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

# The 5 SIPaKMeD classes (Plissiti et al., ICIP 2018). The dataset's authors group them as
# normal (superficial-intermediate, parabasal), benign (metaplastic) and abnormal
# (koilocytotic, dyskeratotic); benign counts as not abnormal here.
SIPAKMED_DIAGNOSES = (
    "superficial_intermediate",
    "parabasal",
    "metaplastic",
    "koilocytotic",
    "dyskeratotic",
)

NORMAL_DIAGNOSES = frozenset(DIAGNOSES[:3]) | frozenset(SIPAKMED_DIAGNOSES[:3])
ALL_DIAGNOSES = DIAGNOSES + SIPAKMED_DIAGNOSES

# Folder names used by the public datasets and common spellings -> our vocabulary.
# Keys are compared after `_folder_key` (lower case, '-'/' ' -> '_', no leading 'im_').
DIAGNOSIS_ALIASES = {
    # Herlev's own folder names (French spelling of superficial included).
    "normal_superficiel": "normal_superficial",
    "light_dysplastic": "mild_dysplasia",
    "moderate_dysplastic": "moderate_dysplasia",
    "severe_dysplastic": "severe_dysplasia",
    "carcinoma_in_situ": "carcinoma_in_situ",
    "mild_dysplastic": "mild_dysplasia",
    "light_dysplasia": "mild_dysplasia",
    "cis": "carcinoma_in_situ",
    # SIPaKMeD's folder names are im_<Class>; the prefix is dropped before lookup.
    "superficial_intermediate": "superficial_intermediate",
    "parabasal": "parabasal",
    "metaplastic": "metaplastic",
    "koilocytotic": "koilocytotic",
    "dyskeratotic": "dyskeratotic",
}


def _folder_key(name: str) -> str:
    key = name.strip().lower().replace("-", "_").replace(" ", "_")
    return key[3:] if key.startswith("im_") else key


def diagnosis_from_name(name: str, source: str | Path | None = None) -> str:
    """Map a class-folder name (Herlev, SIPaKMeD or our own spelling) to a diagnosis.

    Returns one of ALL_DIAGNOSES; raises InvalidInput naming `source` for an unknown name.
    """
    key = _folder_key(name)
    if key in ALL_DIAGNOSES:
        return key
    if key in DIAGNOSIS_ALIASES:
        return DIAGNOSIS_ALIASES[key]
    raise InvalidInput(
        f"unknown diagnosis class {name!r}; known: {', '.join(ALL_DIAGNOSES)} "
        f"(or the Herlev/SIPaKMeD folder names)",
        source,
    )


def is_abnormal(diagnosis: str) -> bool:
    """True for the dysplasias, carcinoma in situ and SIPaKMeD's koilocytotic/dyskeratotic
    cells; raises InvalidInput on an unknown diagnosis."""
    if diagnosis not in ALL_DIAGNOSES:
        raise InvalidInput(f"unknown diagnosis {diagnosis!r}; known: {', '.join(ALL_DIAGNOSES)}")
    return diagnosis not in NORMAL_DIAGNOSES


class InvalidInput(ValueError):
    """Bad user input: the message names the file (or cell) and says what is wrong.

    code: a stable reason code for programs and tests (e.g. "image_format_not_accepted"),
    "" where none is given; the message is for people.
    """

    def __init__(self, problem: str, source: str | Path | None = None, code: str = ""):
        self.problem = problem
        self.source = None if source is None else str(source)
        self.code = code
        super().__init__(problem if source is None else f"{source}: {problem}")


class ConfigError(InvalidInput):
    """A configuration file (or table) that cannot be used.

    The one configuration error of the project: every loader raises it, and its message
    names the file and the key, e.g. ``site.toml: [site] workrs: unknown key``.
    """

    def __init__(self, problem: str, source: str | Path | None = None, key: str | None = None):
        self.key = key
        super().__init__(problem if key is None else f"{key}: {problem}", source)


@dataclass
class CellRecord:
    """One cell as imported or generated, before features.

    image: uint8 (H, W, 3) RGB.
    mask: uint8 (H, W) with labels in MASK_LABELS, or None when not yet segmented.
    background: uint8 (H, W, 3) blank-slide image, or None when the dataset has none.
    background_estimated / mask_estimated: True when PathMaster made them itself.
    group: the slide image the cell was cropped from, when the dataset says (cells of one
    image share stain, focus and patient, so evaluation never splits them); None unknown.
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
    group: str | None = None


@dataclass(frozen=True)
class Why:
    """A decision or a finding as a stable code and the values its words need.

    Every layer says why with these; services/reasons.py is the one table that turns a
    code into words (plain for a pathologist, full for a researcher). Programs and tests
    read `code`; `params` maps names to str, int or float values.
    """

    code: str
    params: dict = field(default_factory=dict)
