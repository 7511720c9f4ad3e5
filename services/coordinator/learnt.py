"""Features mode for sites that compare a learnt embedding: their networks, fetched once.

A site that learnt its similarity from its own cells (pathmaster/learnt.py) names its
network by content hash in SiteInfo.model_sha256. The coordinator, which analyses a case's
cells once, fetches each such network once with the site's GetModel, checks the bytes
against the hash, keeps it by hash (sites with the same network share it) and adds to each
cell's features its embedding by that network (pathmaster.embedding, NumPy only: 64 floats,
so the request stays small). The embedding needs the cell's patch, which the coordinator's
analysers return with the features (CellFeatures.patch is never sent to a site).
"""

from __future__ import annotations

import hashlib
import logging
import threading

import numpy as np

from pathmaster.embedding import PATCH_PX, Embedder
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

log = logging.getLogger("pathmaster.coordinator")

MODEL_TIMEOUT_S = 10.0
MAX_MODELS = 32  # networks kept (by hash); a coordinator talks to a few sites


class SiteModels:
    """Sites' learnt networks by content hash, fetched on first use (thread-safe)."""

    def __init__(self):
        self._models: dict[str, Embedder] = {}
        self._lock = threading.Lock()

    def get(self, sha256: str, stub) -> Embedder:
        """The network `sha256`, from the cache or the site's GetModel (`stub`: its Site
        stub). ValueError when the bytes do not hash to `sha256` or are no network;
        grpc.RpcError when the site cannot give it."""
        with self._lock:
            if sha256 in self._models:
                return self._models[sha256]
        reply = stub.GetModel(pb.ModelRequest(sha256=sha256), timeout=MODEL_TIMEOUT_S)
        if hashlib.sha256(reply.npz).hexdigest() != sha256:
            raise ValueError(f"the site's network does not match its hash {sha256[:16]}")
        model = Embedder.from_bytes(reply.npz)
        with self._lock:
            if len(self._models) >= MAX_MODELS:
                self._models.pop(next(iter(self._models)))
            self._models[sha256] = model
        log.info("fetched a site's network %s (%d bytes)", sha256[:16], len(reply.npz))
        return model


def patch_of(features: pb.CellFeatures) -> np.ndarray:
    """The cell's patch (uint8 (S, S, 3)) carried by the coordinator's own CellFeatures."""
    return np.frombuffer(features.patch, np.uint8).reshape(PATCH_PX, PATCH_PX, 3)


def with_embeddings(features: list[pb.CellFeatures], model: Embedder | None, sha256: str = "") -> list[pb.CellFeatures]:
    """Copies of `features` for one site: without the patch, and with each cell's embedding
    by `model` (named `sha256`) when the site needs one. A cell without a patch of the
    right size (its features came from a client that sent none) gets no embedding: the site then refuses the request
    and the fan-out falls back to images."""
    copies = []
    patches = [f for f in features if len(f.patch) == PATCH_PX * PATCH_PX * 3]
    embedded = {}
    if model is not None and patches:
        vectors = model.embed(np.stack([patch_of(f) for f in patches]))
        embedded = {id(f): v for f, v in zip(patches, vectors)}
    for f in features:
        copy = pb.CellFeatures(cell_id=f.cell_id, values=f.values, background_estimated=f.background_estimated,
                               mask_estimated=f.mask_estimated, image_sha256=f.image_sha256)
        if id(f) in embedded:
            copy.embedding.extend(float(v) for v in embedded[id(f)])
            copy.model_sha256 = sha256
        copies.append(copy)
    return copies
