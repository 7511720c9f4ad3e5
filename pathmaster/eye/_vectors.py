"""A cell's eye vector as the rest of the product handles it.

``eye_vectors_of(eye, patches)`` float32 (m, dim); ``pack_eye_vector`` /
``unpack_eye_vector`` its bytes on the wire (float32, little-endian); ``eye_id(description)``
the short id by which a site, the coordinator and a client check they use the same eye;
``eye_from(description)`` opens the eye a description names.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np


def eye_vectors_of(eye, patches: np.ndarray) -> np.ndarray:
    """float32 (m, D): the eye's vectors of uint8 patches (m, S, S, 3), rounded to half
    precision: the one form of an eye vector, at a site, in its store and on the wire
    (``pack_eye_vector``), so a cell compared by its image or by its vector is compared alike."""
    return np.asarray(eye.features(patches), np.float32).astype(np.float16).astype(np.float32)


def pack_eye_vector(vector: np.ndarray) -> bytes:
    """An eye vector (D,) as IEEE half floats, little endian (2 bytes a value)."""
    return np.asarray(vector, np.float32).astype("<f2").tobytes()


def unpack_eye_vector(data: bytes) -> np.ndarray:
    """float32 (D,) of ``pack_eye_vector`` bytes; ValueError for an odd length."""
    if len(data) % 2:
        raise ValueError(f"an eye vector is 2 bytes a value, got {len(data)} bytes")
    return np.frombuffer(data, "<f2").astype(np.float32)


def eye_id(description: dict) -> str:
    """The content id of an eye: SHA-256 over its description (its name, version, weights'
    SHA-256 and options), so two sites with the same id compute the same vectors."""
    return hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()


def eye_from(description: dict):
    """The eye a description names (``pathmaster.eye.open_eye`` with its options), checked:
    ``pathmaster.eye.EyeUnavailable`` when this installation's eye of that name is another
    (other weights, version or options) or cannot be opened."""
    from pathmaster.eye import EYE_OPTIONS, EyeUnavailable, open_eye

    eye = open_eye(description.get("name", ""), **{k: description[k] for k in EYE_OPTIONS if k in description})
    if eye_id(eye.describe()) != eye_id(description):
        raise EyeUnavailable(f"the installed eye {eye.name} {eye.version} is not the one the site was indexed with "
                             f"({description.get('name')} {description.get('version')}, weights "
                             f"{str(description.get('sha256', ''))[:16]}): install that one, or index the site again",
                             eye.name)
    return eye
