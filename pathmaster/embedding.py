"""What a site sees of a cell: its patch, its frozen pretrained eye's vector, and the lens
the site learns on top of the eye from its own labelled cells.

- ``cell_patch(image, background, size)``: the cell's image made square (padded with its
  blank slide's colour) and resized to the eye's input side; uint8 (S, S, 3).
- The eye (``pathmaster.eye``) turns patches into vectors: a public, frozen network, the
  same at every site that names it, so anyone (the coordinator, a client) can compute a
  cell's eye vector and a site checks it by the eye's id.
- ``SiteLens``: what a site learns on top of the eye when it is indexed: a linear map of
  its eye vectors into the space it compares (the discriminant axes of its diagnoses, by
  shrinkage linear discriminant analysis; the principal axes on a site too small to learn),
  and the discriminant's posterior over its diagnoses (its "network" abnormality score).
  Plain arrays applied with NumPy, stored as an ``.npz`` named by its content hash.
- ``LearntSimilarity``: how the site turns a cell's features and lens vector into its
  search vector and its abnormality score, as its cross-validation chose them.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Side of the patch made of an upload, in pixels: the eye's input side
# (``pathmaster.eye.DEFAULT_RESOLUTION``; it resizes a patch of another side), so a database
# cell and a query are resized alike, once.
PATCH_PX = 160
# The most principal axes of the eye's vectors a plain lens keeps (fewer on a site with
# fewer cells: at most a quarter of them).
LENS_AXES = 64


def cell_patch(image: np.ndarray, background: np.ndarray, size: int = PATCH_PX) -> np.ndarray:
    """The cell's image as the eye sees it: square, ``size`` px a side, its colours as taken.

    Parameters
    ----------
    image, background : ndarray of uint8, shape (H, W, 3)
        The cell and its blank slide (given or estimated).
    size : int
        Side of the patch.

    Returns
    -------
    ndarray of uint8, shape (size, size, 3)
        The whole image, padded to a square with the blank slide's median colour, resized
        (area averaging when shrinking, bilinear when enlarging).

    Notes
    -----
    The whole upload, not the segmented cell's box: a box round a mis-segmented cell (its
    nucleus alone, or a neighbour) loses what the eye needs to see. Its colours as taken,
    not divided by the blank slide: on the development half the division lowered the eye's
    plain nearest-neighbour ROC AUC (0.942 -> 0.934), the eye having learnt photographs.
    """
    import cv2

    from pathmaster.morphology import channel_percentile

    h, w = image.shape[:2]
    side = max(h, w)
    slide = channel_percentile(np.asarray(background).reshape(-1, 3), 50).astype(np.uint8)
    square = np.empty((side, side, 3), np.uint8)
    square[...] = slide
    top, left = (side - h) // 2, (side - w) // 2
    square[top:top + h, left:left + w] = image
    # Area averaging: every pixel of the upload counts, as PIL's antialiased reduction; in
    # NumPy out of NumPy, so an upload's pixels are decoded once (services/site/cells.py).
    return cv2.resize(square, (size, size), interpolation=cv2.INTER_AREA if side >= size else cv2.INTER_LINEAR)


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


@dataclass
class SiteLens:
    """What a site learnt on top of its eye (see the module docstring).

    eye: the eye's description (``pathmaster.eye.Eye.describe``); mean: float64 (D,), the
    eye vectors' mean on the site's cells; axes: float64 (D, r), the map into the space it
    compares; head: a ``pathmaster.abnormality.FeatureClassifier`` over the eye vectors (the
    discriminant's posterior; None on a site too small to fit one).
    """

    eye: dict
    mean: np.ndarray
    axes: np.ndarray
    head: object | None = None

    @property
    def dim(self) -> int:
        """Width of the lens's vectors."""
        return int(self.axes.shape[1])

    @property
    def eye_id(self) -> str:
        return eye_id(self.eye)

    def embed(self, eye_vectors: np.ndarray) -> np.ndarray:
        """Lens vectors (m, r) float64 of eye vectors (m, D)."""
        return (np.atleast_2d(np.asarray(eye_vectors, np.float64)) - self.mean) @ self.axes

    def abnormal_probability(self, eye_vectors: np.ndarray) -> np.ndarray:
        """The head's probability of an abnormal label, (m,) float64, from eye vectors (m, D)."""
        if self.head is None:
            raise ValueError("this lens has no head")
        return self.head.abnormal_probability(eye_vectors)

    def to_bytes(self) -> bytes:
        """The lens as an uncompressed ``.npz`` (deterministic bytes for the same lens)."""
        buffer = io.BytesIO()
        head = json.dumps(None if self.head is None else self.head.to_dict(), sort_keys=True)
        np.savez(buffer, eye=np.asarray(json.dumps(self.eye, sort_keys=True)), head=np.asarray(head),
                 mean=np.asarray(self.mean, np.float64), axes=np.asarray(self.axes, np.float64))
        return buffer.getvalue()

    @property
    def sha256(self) -> str:
        """SHA-256 of the lens's content (its eye, head and arrays, canonically encoded), not
        of its file's bytes, whose zip container differs between Python and NumPy versions."""
        digest = hashlib.sha256()
        digest.update(json.dumps(self.eye, sort_keys=True).encode())
        digest.update(json.dumps(None if self.head is None else self.head.to_dict(), sort_keys=True).encode())
        for array in (self.mean, self.axes):
            array = np.ascontiguousarray(array, "<f8")
            digest.update(str(array.shape).encode())
            digest.update(array.tobytes())
        return digest.hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes) -> "SiteLens":
        """Load ``to_bytes`` output; ValueError for bytes that are not such a file."""
        from pathmaster.abnormality import FeatureClassifier

        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                eye, head = json.loads(str(npz["eye"])), json.loads(str(npz["head"]))
                mean, axes = npz["mean"].astype(np.float64), npz["axes"].astype(np.float64)
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as exc:
            raise ValueError(f"not a PathMaster lens file: {exc}") from None
        if mean.ndim != 1 or axes.ndim != 2 or axes.shape[0] != len(mean) or not isinstance(eye, dict):
            raise ValueError("not a PathMaster lens file: unexpected arrays")
        return cls(eye, mean, axes, FeatureClassifier.from_dict(head))

    def save(self, directory: Path) -> Path:
        """Write the lens as ``lens-<sha256[:16]>.npz`` in ``directory``; its path."""
        from pathmaster.sitedb import write_atomic

        path = Path(directory) / f"lens-{self.sha256[:16]}.npz"
        write_atomic(path, self.to_bytes())
        return path


def fit_lens(eye_vectors: np.ndarray, eye: dict, max_axes: int = LENS_AXES) -> SiteLens:
    """A plain lens: the principal axes of a site's eye vectors (n, D), no labels read.

    At most ``max_axes`` axes, and at most a quarter of the cells; axes of (numerically)
    zero variance are left out. Not whitened: distances in it are the eye's own, less its
    least varying directions. The SVD of the centred vectors (``numpy.linalg.svd``).
    """
    vectors = np.asarray(eye_vectors, np.float64)
    mean = vectors.mean(axis=0)
    _, singular, vt = np.linalg.svd(vectors - mean, full_matrices=False)
    usable = int((singular > singular[0] * 1e-6).sum()) if len(singular) and singular[0] > 0 else 0
    keep = max(min(max_axes, max(len(vectors) // 4, 1), usable), 1)
    return SiteLens(dict(eye), mean, vt[:keep].T.copy())


def fit_discriminant_lens(eye_vectors: np.ndarray, labels, abnormal_labels, eye: dict) -> SiteLens:
    """A lens learnt from a site's labelled cells: shrinkage linear discriminant analysis.

    scikit-learn's ``LinearDiscriminantAnalysis(solver="eigen", shrinkage="auto")`` (the
    within-diagnosis covariance shrunk by the Ledoit-Wolf lemma, as a few hundred cells
    against hundreds of eye dimensions need): the space compared is its discriminant axes
    (at most one fewer than the diagnoses; within-diagnosis variance 1 along each), the head
    its posterior over the diagnoses, whose abnormal mass is the cell's score. Kept as plain
    arrays; the same numbers as the estimator's ``transform`` and ``predict_proba``.
    """
    import warnings

    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    from pathmaster.abnormality import FeatureClassifier

    vectors, labels = np.asarray(eye_vectors, np.float64), np.asarray(labels).astype(str)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)  # collinear eye dimensions
        lda = LinearDiscriminantAnalysis(solver="eigen", shrinkage="auto").fit(vectors, labels)
    classes = [str(c) for c in lda.classes_]
    coef, intercept = np.asarray(lda.coef_, np.float64), np.asarray(lda.intercept_, np.float64)
    if len(classes) == 2:  # one row for two classes: logits (0, w.x + b)
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    axes = np.asarray(lda.scalings_, np.float64)[:, :max(len(classes) - 1, 1)]
    head = FeatureClassifier(list(range(vectors.shape[1])), coef, intercept, classes,
                             np.array([c in set(abnormal_labels) for c in classes], bool), 0.0)
    return SiteLens(dict(eye), vectors.mean(axis=0), axes.copy(), head)


# ---------------------------------------------------------------- what a site compares

SIMILARITY_MODES = ("features", "embedding", "fused")
ABNORMAL_SCORES = ("network", "neighbours", "mean", "classifier", "ensemble")
# Each abnormality score in a pathologist's words.
SCORE_WORDS = {"network": "its reading of the cell's picture (a classifier over what its pretrained network sees)",
               "neighbours": "the share of abnormal cells among its 5 most similar cells",
               "mean": "its reading of the cell's picture and its most similar cells together",
               "classifier": "its reading of the cell's measurements (a classifier over its features)",
               "ensemble": "its readings of the cell together (its most similar cells, its measurements and, "
                           "when it has one, its reading of the picture)"}


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
    site's cells, times its weight). mean, std: the lens vectors' z-score statistics on the
    site's cells (float64 (r,)); feature_scale, embedding_scale: each block's
    root total variance there. score: which abnormality score (``ABNORMAL_SCORES``: the
    network's probability of an abnormal label, the share of abnormal labels among the
    ``k`` nearest database cells, their mean, or the probability from the site's classifier
    over its features, ``pathmaster.abnormality``, whose weights ``classifier`` holds, or
    "ensemble": the mean of those the site has among network, neighbours and classifier) and
    threshold: the score at or above which a cell supports an abnormality (the operating
    point, chosen for the case: ``learn.case_operating_point``).
    model: the lens's sha256 (``SiteLens``), "" without one.
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
        the lens vectors (m, r) (None allowed in "features" mode)."""
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
