"""Features mode for sites that look through a pretrained eye: the eyes, opened once here.

A site that compares or scores what its eye sees (pathmaster/site/fitting.py) names the eye in its
SiteInfo: ``model_sha256`` its content id, ``eye`` its description. The eye is public (a
frozen network from a registry package, the same wherever it is installed), so the
coordinator, which analyses a case's cells once, opens the same eye itself, checks that its
id is the site's, keeps it by id (sites with the same eye share it) and adds to each cell's
features its eye vector (pathmaster.eye, NumPy only). The site applies its own lens on top;
nothing learnt by a site leaves it. The vector needs the cell's patch, which the
coordinator's analysers return with the features (CellFeatures.patch is never sent to a site).
"""

from __future__ import annotations

import json
import logging
import threading

import numpy as np

from pathmaster.analysis.cell import PATCH_PX
from pathmaster.eye._vectors import eye_from, eye_id, eye_vectors_of, pack_eye_vector
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

log = logging.getLogger("pathmaster.coordinator")

MAX_EYES = 8  # eyes kept (by id); sites mostly share one


class SiteEyes:
    """Sites' pretrained eyes by content id, opened on first use (thread-safe)."""

    def __init__(self):
        self._eyes: dict[str, object] = {}
        self._lock = threading.Lock()

    def get(self, identity: str, description: str):
        """The eye `identity` that `description` (SiteInfo.eye, JSON) names, opened once.
        ValueError when the description is no eye's or names another id;
        ``pathmaster.eye.EyeUnavailable`` when this installation cannot open that eye."""
        with self._lock:
            if identity in self._eyes:
                return self._eyes[identity]
        try:
            described = json.loads(description)
        except ValueError:
            raise ValueError("the site's eye description is not JSON") from None
        if not isinstance(described, dict) or eye_id(described) != identity:
            raise ValueError(f"the site's eye description does not match its id {identity[:16]}")
        eye = eye_from(described)
        with self._lock:
            if len(self._eyes) >= MAX_EYES:
                self._eyes.pop(next(iter(self._eyes)))
            self._eyes[identity] = eye
        log.info("opened the eye %s (%s)", identity[:16], described.get("name"))
        return eye


def patch_of(features: pb.CellFeatures) -> np.ndarray:
    """The cell's patch (uint8 (S, S, 3)) carried by the coordinator's own CellFeatures."""
    return np.frombuffer(features.patch, np.uint8).reshape(PATCH_PX, PATCH_PX, 3)


def with_embeddings(features: list[pb.CellFeatures], eye, identity: str = "") -> list[pb.CellFeatures]:
    """Copies of `features` for one site: without the patch, and with each cell's vector by
    `eye` (named `identity`) when the site needs one: the vector a client sent by that eye,
    else one made here from the cell's patch. A cell with neither gets no vector: the site
    then refuses the request and the fan-out falls back to images."""
    copies = []
    patches = [f for f in features if len(f.patch) == PATCH_PX * PATCH_PX * 3]
    embedded = {}
    if eye is not None and patches:
        vectors = eye_vectors_of(eye, np.stack([patch_of(f) for f in patches]))
        embedded = {id(f): v for f, v in zip(patches, vectors)}
    for f in features:
        copy = pb.CellFeatures(cell_id=f.cell_id, values=f.values, background_estimated=f.background_estimated,
                               mask_estimated=f.mask_estimated, image_sha256=f.image_sha256)
        if identity and f.embedding and f.model_sha256 == identity:
            copy.embedding, copy.model_sha256 = f.embedding, identity
        elif id(f) in embedded:
            copy.embedding, copy.model_sha256 = pack_eye_vector(embedded[id(f)]), identity
        copies.append(copy)
    return copies
