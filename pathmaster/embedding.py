"""A site's learnt cell embedding, run in plain NumPy: the cell's patch, the CNN, its scores.

A site that learns its similarity (``pathmaster.learn``, at index time, with JAX) stores
the weights as an ``.npz`` file named by its content hash; everything that analyses an
upload (the site's workers, the coordinator in features mode, the client) runs the network
here, with NumPy only, so none of them imports JAX. The same functions define the network
for training (``pathmaster.learn`` passes ``jax.numpy`` as ``xp``), so the forward pass is
one definition, checked equal on the same weights by the tests.

- ``cell_patch(image, background)``: the cell's image made square, divided by its blank
  slide's colour (light transmitted, so lamp differences between sites shrink), resized
  to ``PATCH_PX``; uint8 (S, S, 3).
- ``Embedder``: the weights; ``embed(patches)`` -> (m, d) float32 vectors pooled over the
  8 rotations and flips of each patch (cells have no orientation, so the vector does not
  either: exactly, not only approximately as training on rotated copies gives), and
  ``abnormal_probability`` from the classifier head on that vector.

Hand-written because the network is four 3x3 convolutions: NumPy's ``matmul`` over
``sliding_window_view`` windows runs it in a few milliseconds per cell, where an
inference runtime (onnxruntime, TFLite) would be another dependency of every role.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Side of the patch the network sees, in pixels.
PATCH_PX = 48
# Channels of the four convolutions, and the width of the embedding (the penultimate layer).
CHANNELS = (16, 32, 64, 96)
EMBEDDING_DIM = 64


def cell_patch(image: np.ndarray, background: np.ndarray, size: int = PATCH_PX) -> np.ndarray:
    """The cell's image as the network sees it: square, white-balanced, ``size`` px a side.

    Parameters
    ----------
    image, background : ndarray of uint8, shape (H, W, 3)
        The cell and its blank slide (given or estimated).
    size : int
        Side of the patch.

    Returns
    -------
    ndarray of uint8, shape (size, size, 3)
        The whole image, padded to a square with blank slide, each channel divided by the
        slide's median (light transmitted: 1 = blank slide -> 200, so lamp and white
        balance differences between sites shrink), resized.

    Notes
    -----
    The whole upload rather than the segmented cell's box: on the development half of the
    224 px Herlev cells (one grouped fold, the same network and budget) the box gave the
    network's abnormality score a ROC AUC of 0.67, the whole image 0.89; a box round a
    mis-segmented cell (its nucleus alone, or a neighbour) loses what the network needs.
    """
    import cv2

    from pathmaster.morphology import channel_percentile

    h, w = image.shape[:2]
    # The median by counting grey levels (np.median's number: the mean of the two middle
    # values is exact for integers), and each channel's clip(level / white * 200) in
    # float32 read from a table of its 256 values: the same uint8s as computing them per
    # pixel over the float32 image, in ~0.2 of the time of a 224 px upload's ~1.2 ms.
    white = np.maximum(channel_percentile(np.asarray(background).reshape(-1, 3), 50).astype(np.float32), 1.0)
    table = np.clip(np.arange(256, dtype=np.float32)[:, None] / white * 200.0, 0, 255).astype(np.uint8)
    side = max(h, w)
    scaled = np.full((side, side, 3), 200, np.uint8)  # the blank slide: 1 -> 200
    top, left = (side - h) // 2, (side - w) // 2
    scaled[top:top + h, left:left + w] = cv2.LUT(np.ascontiguousarray(image, dtype=np.uint8), table[None])
    # Area averaging: every pixel of the upload counts, as PIL's antialiased reduction; in
    # NumPy out of NumPy, so an upload's pixels are decoded once (services/site/cells.py).
    return cv2.resize(scaled, (size, size), interpolation=cv2.INTER_AREA if side >= size else cv2.INTER_LINEAR)


def dihedral(patches, xp=np):
    """The 8 rotations and flips of each patch: (m, S, S, C) -> (8, m, S, S, C)."""
    views = []
    for flipped in (patches, patches[:, :, ::-1]):
        for turns in range(4):
            views.append(xp.rot90(flipped, turns, axes=(1, 2)))
    return xp.stack(views)


def _conv3x3(x, kernel, bias, xp):
    """'Same' 3x3 convolution of (n, H, W, Cin) with kernel (3, 3, Cin, Cout), then ReLU."""
    n, h, w, c = x.shape
    padded = xp.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
    if xp is np:
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(1, 2))  # n,H,W,C,3,3
        cols = windows.transpose(0, 1, 2, 4, 5, 3).reshape(n * h * w, 9 * c)
        out = (cols @ kernel.reshape(9 * c, -1)).reshape(n, h, w, -1)
    else:  # jax.numpy: XLA's own convolution
        from jax import lax

        out = lax.conv_general_dilated(padded, kernel, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return xp.maximum(out + bias, 0)


def _pool2(x, xp):
    """2x2 max pooling of (n, H, W, C) (H, W even)."""
    n, h, w, c = x.shape
    return x.reshape(n, h // 2, 2, w // 2, 2, c).max(axis=(2, 4))


# Buffers for `Embedder.embed` (~10 MB a set: the im2col matrices and layer outputs of one
# patch's 8 views), reused from call to call: fresh arrays of that size cost as much again
# in page faults as the arithmetic done in them. A call takes a set from the free ones (or
# makes one) and gives it back, so as many sets exist as calls ran at once, and at most
# KEPT_WORKSPACES stay: memory does not grow with the threads that ever embedded.
KEPT_WORKSPACES = 2
_free_workspaces: list[dict] = []  # list.pop and list.append are atomic: no lock to hold over a fork


@contextlib.contextmanager
def _workspace():
    """A set of buffers (name -> float32 array) for one call, returned to the free ones after."""
    try:
        buffers = _free_workspaces.pop()
    except IndexError:
        buffers = {}
    try:
        yield buffers
    finally:
        if len(_free_workspaces) < KEPT_WORKSPACES:
            _free_workspaces.append(buffers)


def _buffer(buffers: dict, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 buffer ``name`` of ``shape`` in a workspace, made (as zeros) on first use:
    callers overwrite what they read, so a padded buffer's border stays zero."""
    buffer = buffers.get(name)
    if buffer is None or buffer.shape != shape:
        buffer = buffers[name] = np.zeros(shape, np.float32)
    return buffer


def _views_padded(buffers: dict, patch: np.ndarray) -> np.ndarray:
    """The network's input for one uint8 patch (S, S, 3): its 8 views (`dihedral`'s order)
    as float32 / 200 - 0.75 (what `forward` subtracts), with the zero border of the first
    convolution: (8, S + 2, S + 2, 3), a buffer of the workspace ``buffers``. Scaled once
    before the views are taken (a rotation moves pixels, it does not change them)."""
    side, channels = patch.shape[0], patch.shape[2]
    scaled = patch.astype(np.float32) / 200.0 - 0.75
    padded = _buffer(buffers, "input", (8, side + 2, side + 2, channels))
    padded[:, 1:-1, 1:-1] = dihedral(scaled[None])[:, 0]
    return padded


def _embed_views(params: dict, buffers: dict, padded: np.ndarray) -> np.ndarray:
    """`forward`'s embeddings (8, EMBEDDING_DIM) of one patch's views (`_views_padded`), in
    NumPy with fewer passes over memory: the same numbers to float32 rounding (bit for bit
    where the BLAS kernel sums a row the same wherever the row lies in the matrix; OpenBLAS's
    Haswell kernel on AMD EPYC does not, and differs by a few ulps).

    Each convolution is `_conv3x3`'s im2col matrix product, into the workspace ``buffers``
    (`_buffer`), its rows ordered so that the four pixels of each 2x2 pooling window fall
    in four contiguous blocks (the rows' order changes a row's sums by rounding at most), so
    the max pooling is three maxima of whole blocks. The pooling runs before the bias and
    ReLU, which is exact (adding a per-channel constant and clipping at 0 are
    non-decreasing in floating point too, so they commute with a maximum) and leaves them
    a quarter of the pixels; it writes into the inside of the next layer's padded input,
    and the bias and ReLU are done in place.
    """
    x = padded
    for i in range(len(CHANNELS)):
        kernel, bias = params[f"conv{i}_w"], params[f"conv{i}_b"]
        n, h, w, c = x.shape[0], x.shape[1] - 2, x.shape[2] - 2, x.shape[3]
        cout = kernel.shape[-1]
        windows = np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(1, 2))  # n,H,W,C,3,3
        pooled = i < len(CHANNELS) - 1
        if pooled:  # rows (row in window, column in window, n, H/2, W/2); H, W even
            cols = _buffer(buffers, f"cols{i}", (2, 2, n, h // 2, w // 2, 3, 3, c))
            np.copyto(cols, windows.reshape(n, h // 2, 2, w // 2, 2, c, 3, 3).transpose(2, 4, 0, 1, 3, 6, 7, 5))
        else:  # rows (n, H, W)
            cols = _buffer(buffers, f"cols{i}", (n, h, w, 3, 3, c))
            np.copyto(cols, windows.transpose(0, 1, 2, 4, 5, 3))
        out = _buffer(buffers, f"out{i}", (n * h * w, cout))
        np.matmul(cols.reshape(n * h * w, 9 * c), kernel.reshape(9 * c, cout), out=out)
        if pooled:  # `_pool2`, into the next layer's padded input
            corners = out.reshape(4, n, h // 2, w // 2, cout)
            x = _buffer(buffers, f"input{i + 1}", (n, h // 2 + 2, w // 2 + 2, cout))
            inside = x[:, 1:-1, 1:-1]
            most = np.maximum(corners[0], corners[1], out=corners[0])
            np.maximum(most, corners[2], out=most)
            np.maximum(most, corners[3], out=inside)
        else:
            x = inside = out.reshape(n, h, w, cout)
        inside += bias
        np.maximum(inside, 0, out=inside)
    pooled = x.mean(axis=(1, 2))
    return np.maximum(pooled @ params["embed_w"] + params["embed_b"], 0)


def forward(params: dict, patches, xp=np):
    """(embedding (n, EMBEDDING_DIM), logits (n, n_classes)) of float patches (n, S, S, 3) in [0, ~1.3].

    ``params``: conv0..conv3 kernels ``convI_w`` (3, 3, Cin, Cout) and ``convI_b``; ``embed_w``
    (C, EMBEDDING_DIM), ``embed_b``; ``head_w`` (EMBEDDING_DIM, n_classes), ``head_b``.
    ``xp`` is ``numpy`` or ``jax.numpy``: training and inference share this definition.
    """
    x = patches - 0.75
    for i in range(len(CHANNELS)):
        x = _conv3x3(x, params[f"conv{i}_w"], params[f"conv{i}_b"], xp)
        if i < len(CHANNELS) - 1:
            x = _pool2(x, xp)
    pooled = x.mean(axis=(1, 2))
    embedding = xp.maximum(pooled @ params["embed_w"] + params["embed_b"], 0)
    return embedding, embedding @ params["head_w"] + params["head_b"]


@functools.lru_cache(maxsize=1)
def _blas_controller():
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def _one_blas_thread():
    """One BLAS thread for a cell's small matrix products: a second one costs CPU (measured
    on 2 busy cores: 8 views of a 48 px patch took 35 ms of CPU with two OpenBLAS threads,
    10 ms with one) and saves no time on products this small."""
    return _blas_controller().limit(limits=1, user_api="blas")


def softmax(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


@dataclass
class Embedder:
    """A site's learnt network: weights (float32), its class labels and which are abnormal.

    ``labels`` are the site's diagnoses in the order of the head's outputs; ``abnormal`` a
    bool per label. ``sha256`` names the weights file (``to_bytes``), so a copy fetched by a
    coordinator is checked and cached by it.
    """

    params: dict
    labels: list[str]
    abnormal: np.ndarray

    def embed(self, patches: np.ndarray) -> np.ndarray:
        """Embeddings (m, EMBEDDING_DIM) float32 of uint8 patches (m, S, S, 3), each the mean
        over its 8 rotations and flips of `forward`'s embedding (by `_embed_views`, the
        same numbers to float32 rounding in about half the CPU). A patch gives the same
        vector bit for bit alone or in a batch: each is embedded on its own."""
        patches = np.asarray(patches)
        if patches.ndim == 3:
            patches = patches[None]
        embeddings = np.empty((patches.shape[0], EMBEDDING_DIM), np.float32)
        with _one_blas_thread(), _workspace() as buffers:
            for row, patch in enumerate(patches):  # one at a time: bounded memory, reused buffers
                embeddings[row] = _embed_views(self.params, buffers, _views_padded(buffers, patch)).mean(axis=0)
        return embeddings

    def probabilities(self, embeddings: np.ndarray) -> np.ndarray:
        """Class probabilities (m, n_labels) from embeddings (m, EMBEDDING_DIM)."""
        return softmax(np.atleast_2d(embeddings) @ self.params["head_w"] + self.params["head_b"])

    def abnormal_probability(self, embeddings: np.ndarray) -> np.ndarray:
        """Probability mass on the abnormal labels, (m,) float64 in [0, 1]."""
        return self.probabilities(embeddings)[:, self.abnormal].sum(axis=1).astype(np.float64)

    def to_bytes(self) -> bytes:
        """The weights as an uncompressed ``.npz`` (deterministic bytes for the same weights)."""
        buffer = io.BytesIO()
        arrays = {k: np.asarray(v, np.float32) for k, v in sorted(self.params.items())}
        np.savez(buffer, labels=np.asarray(self.labels, dtype=str), abnormal=np.asarray(self.abnormal, bool),
                 **arrays)
        return buffer.getvalue()

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Embedder":
        """Load ``to_bytes`` output; ValueError for bytes that are not such a file."""
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                params = {k: npz[k].astype(np.float32) for k in npz.files if k not in ("labels", "abnormal")}
                labels, abnormal = [str(x) for x in npz["labels"]], npz["abnormal"].astype(bool)
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
            raise ValueError(f"not a PathMaster embedding file: {exc}") from None
        expected = {f"conv{i}_{p}" for i in range(len(CHANNELS)) for p in "wb"} | {"embed_w", "embed_b",
                                                                                   "head_w", "head_b"}
        if set(params) != expected or len(labels) != len(abnormal) or params["head_w"].shape[1] != len(labels):
            raise ValueError("not a PathMaster embedding file: unexpected arrays")
        return cls(params, labels, abnormal)

    def save(self, directory: Path) -> Path:
        """Write the weights as ``embedding-<sha256[:16]>.npz`` in ``directory``; its path."""
        from pathmaster.sitedb import write_atomic

        data = self.to_bytes()
        path = Path(directory) / f"embedding-{hashlib.sha256(data).hexdigest()[:16]}.npz"
        write_atomic(path, data)
        return path


# ---------------------------------------------------------------- what a site compares

SIMILARITY_MODES = ("features", "embedding", "fused")
ABNORMAL_SCORES = ("network", "neighbours", "mean", "classifier", "ensemble")
# Each abnormality score in a pathologist's words.
SCORE_WORDS = {"network": "its learnt network's reading of the cell",
               "neighbours": "the share of abnormal cells among its 5 most similar cells",
               "mean": "its learnt network's reading and its most similar cells together",
               "classifier": "its reading of the cell's measurements (a classifier over its features)",
               "ensemble": "its readings of the cell together (its most similar cells, its measurements and, "
                           "when it learnt one, its network)"}


def reads_network(mode: str, score: str, with_network: bool = False) -> bool:
    """True when a site comparing ``mode`` and scoring by ``score`` (a ``SiteInfo``'s
    similarity and abnormal_score) reads each cell's embedding by its network: its search
    does, or its score ("ensemble" only ``with_network``: without one it is the mean of the
    others)."""
    return mode in ("embedding", "fused") or score in ("network", "mean") or (with_network and score == "ensemble")


@dataclass
class LearntSimilarity:
    """How a site turns a cell's feature vector and embedding into its search vector and
    its abnormality score, as its own cross-validation chose them at index time.

    mode: "features" (the feature projection alone), "embedding" (the z-scored embedding
    alone) or "fused" (both blocks side by side, each scaled to unit total variance on the
    site's cells, times its weight). mean, std: the embedding's z-score statistics on the
    site's cells (float64 (EMBEDDING_DIM,)); feature_scale, embedding_scale: each block's
    root total variance there. score: which abnormality score (``ABNORMAL_SCORES``: the
    network's probability of an abnormal label, the share of abnormal labels among the
    ``k`` nearest database cells, their mean, or the probability from the site's classifier
    over its features, ``pathmaster.abnormality``, whose weights ``classifier`` holds, or
    "ensemble": the mean of those the site has among network, neighbours and classifier) and
    threshold: the score at or above which a cell is called abnormal (the operating point).
    model: the network's sha256, "" without one.
    """

    mode: str = "features"
    model: str = ""
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    feature_scale: float = 1.0
    embedding_scale: float = 1.0
    embedding_weight: float = 0.5
    score: str = "neighbours"
    threshold: float = 0.5
    k: int = 5
    report: dict | None = None
    classifier: dict | None = None

    @property
    def needs_embedding(self) -> bool:
        """True when the search or the score reads the cell's embedding."""
        return bool(self.model) and reads_network(self.mode, self.score, with_network=True)

    def vectors(self, feature_vectors: np.ndarray, embeddings: np.ndarray | None) -> np.ndarray:
        """Search vectors (m, d) float32 from the feature projection's vectors (m, p) and
        the embeddings (m, EMBEDDING_DIM) (None allowed in "features" mode)."""
        feature_vectors = np.atleast_2d(np.asarray(feature_vectors, np.float64))
        if self.mode == "features":
            return np.ascontiguousarray(feature_vectors, dtype=np.float32)
        z = (np.atleast_2d(np.asarray(embeddings, np.float64)) - self.mean) / self.std
        if self.mode == "embedding":
            return np.ascontiguousarray(z, dtype=np.float32)
        w = self.embedding_weight
        blocks = [feature_vectors * ((1 - w) / self.feature_scale), z * (w / self.embedding_scale)]
        return np.ascontiguousarray(np.hstack(blocks), dtype=np.float32)

    def abnormal_score(self, network_probability: float | None, neighbour_share: float,
                       classifier_probability: float | None = None) -> float:
        """The chosen score in [0, 1] from the network's abnormal probability, the share of
        abnormal labels among the k nearest database cells and the feature classifier's
        abnormal probability (each None when not computed)."""
        def given(value, what):
            if value is None:
                raise ValueError(f"the site's abnormality score ({self.score}) reads {what}: give it")
            return float(value)

        if self.score == "classifier":
            return given(classifier_probability, "the cell's features")
        if self.score == "ensemble":
            parts = [float(neighbour_share)]
            if self.model:
                parts.append(given(network_probability, "the cell's embedding"))
            if self.classifier:
                parts.append(given(classifier_probability, "the cell's features"))
            return float(np.mean(parts))
        if self.score == "neighbours" or network_probability is None:
            return float(neighbour_share)
        if self.score == "network":
            return float(network_probability)
        return 0.5 * (float(network_probability) + float(neighbour_share))

    def to_dict(self) -> dict:
        data = {k: getattr(self, k) for k in ("mode", "model", "feature_scale", "embedding_scale",
                                              "embedding_weight", "score", "threshold", "k", "report",
                                              "classifier")}
        data["mean"] = None if self.mean is None else self.mean.tolist()
        data["std"] = None if self.std is None else self.std.tolist()
        return data

    @classmethod
    def from_dict(cls, data: dict | None) -> "LearntSimilarity":
        if not data:
            return cls()
        fields = dict(data)
        for key in ("mean", "std"):
            fields[key] = None if fields.get(key) is None else np.asarray(fields[key], np.float64)
        return cls(**fields)


def neighbour_share(diagnoses, abnormal_labels, k: int) -> float:
    """Share of abnormal labels among the first ``k`` labelled diagnoses (0 when none)."""
    labelled = [d for d in diagnoses if d is not None][:k]
    return sum(d in abnormal_labels for d in labelled) / len(labelled) if labelled else 0.0
