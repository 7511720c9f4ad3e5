"""``SiteLens``: what a site learns on top of its eye when it is indexed.

A linear map of its eye vectors into the space it compares (the discriminant axes of its
diagnoses, by shrinkage linear discriminant analysis, ``fit_discriminant_lens``; the
principal axes on a site too small to learn, ``fit_lens``), and the discriminant's posterior
over its diagnoses (its "network" abnormality score). Plain arrays applied with NumPy,
stored as an ``.npz`` named by its content hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pathmaster.eye._vectors import eye_id
# The most principal axes of the eye's vectors a plain lens keeps (fewer on a site with
# fewer cells: at most a quarter of them).
LENS_AXES = 64


@dataclass
class SiteLens:
    """What a site learnt on top of its eye (see the module docstring).

    eye: the eye's description (``pathmaster.eye.Eye.describe``); mean: float64 (D,), the
    eye vectors' mean on the site's cells; axes: float64 (D, r), the map into the space it
    compares; head: a ``pathmaster.learning.abnormality.FeatureClassifier`` over the eye vectors (the
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
        from pathmaster.learning.abnormality import FeatureClassifier

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
        from pathmaster.files import write_atomic

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

    from pathmaster.learning.abnormality import FeatureClassifier

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
