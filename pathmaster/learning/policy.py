"""``LearntSimilarity``: how a site turns a cell into its search vector and its abnormality
score, as its cross-validation chose them.

It compares the 130 features, the eye's vector through the site's lens, or both fused
(``SIMILARITY_MODES``), and scores abnormality by its lens's posterior, the neighbours'
share, their mean, a logistic regression over the features, or their ensemble
(``ABNORMAL_SCORES``; ``SCORE_WORDS`` says each in plain words). ``reads_network`` tells
whether a mode and score need the eye's vector of a query.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
    over its features, ``pathmaster.learning.abnormality``, whose weights ``classifier`` holds, or
    "ensemble": the mean of those the site has among network, neighbours and classifier) and
    threshold: the score at or above which a cell supports an abnormality (the operating
    point, chosen for the case: ``thresholds.case_operating_point``).
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
