"""A site's classifier of abnormal cells over its own features, one of its abnormality scores.

A site scores each query cell's abnormality by the labels of its k nearest database cells,
by its lens's head (``pathmaster.learning.lens``), or by this: a multinomial logistic
regression over the z-scored features the site compares, fitted on the site's labelled
cells when it is indexed; the score is the probability it puts on the site's abnormal
labels. Multinomial over the site's diagnoses, not normal-against-abnormal: the fine
classes (superficial, intermediate, columnar; light to severe dysplasia) are what the
features separate, and summing their probabilities keeps that. Its L2 strength is chosen
by the site's own grouped inner cross-validation. The fitted weights are kept as plain
arrays and applied with NumPy, so a site serves without scikit-learn's estimator objects.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

# Inverse L2 strengths tried (scikit-learn's C; its default is 1.0).
STRENGTHS = (0.03, 0.1, 0.3, 1.0)


@dataclass
class FeatureClassifier:
    """Multinomial logistic weights over the z-scored feature ``columns``.

    coef: float64 (n_labels, len(columns)); intercept: float64 (n_labels,); labels: the
    site's diagnoses in coef's row order; abnormal: bool per label; strength: the C chosen.
    """

    columns: list[int]
    coef: np.ndarray
    intercept: np.ndarray
    labels: list[str]
    abnormal: np.ndarray
    strength: float

    def abnormal_probability(self, Z: np.ndarray) -> np.ndarray:
        """Probability of an abnormal label, (m,) float64, for z-scored features (m, n_features)."""
        logits = np.atleast_2d(np.asarray(Z, np.float64))[:, self.columns] @ self.coef.T + self.intercept
        return softmax(logits)[:, self.abnormal].sum(axis=1)

    def to_dict(self) -> dict:
        return {"columns": list(map(int, self.columns)), "coef": self.coef.tolist(),
                "intercept": self.intercept.tolist(), "labels": list(self.labels),
                "abnormal": self.abnormal.tolist(), "strength": float(self.strength)}

    @classmethod
    def from_dict(cls, data: dict | None) -> "FeatureClassifier | None":
        if not data:
            return None
        return cls([int(c) for c in data["columns"]], np.asarray(data["coef"], np.float64),
                   np.asarray(data["intercept"], np.float64), [str(x) for x in data["labels"]],
                   np.asarray(data["abnormal"], bool), float(data["strength"]))


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of (m, c) logits, float64."""
    z = np.asarray(logits, np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def fit_classifier(Z: np.ndarray, labels, abnormal_labels, columns, strength: float) -> FeatureClassifier:
    """Fit on z-scored features ``Z`` (n, n_features) of labelled cells, reading ``columns``.

    A label with one cell is still a class (its weights are pulled to zero by the penalty).
    """
    from sklearn.linear_model import LogisticRegression

    labels = np.asarray(labels).astype(str)
    columns = [int(c) for c in columns]
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning)
        model = LogisticRegression(C=strength, max_iter=5000).fit(np.asarray(Z, np.float64)[:, columns], labels)
    classes = [str(c) for c in model.classes_]
    coef, intercept = model.coef_, model.intercept_
    if len(classes) == 2:  # scikit-learn keeps one row for two classes: logits (0, w.x + b)
        coef, intercept = np.vstack([np.zeros_like(coef), coef]), np.concatenate([[0.0], intercept])
    abnormal = np.array([c in set(abnormal_labels) for c in classes], bool)
    return FeatureClassifier(columns, np.asarray(coef, np.float64), np.asarray(intercept, np.float64), classes,
                             abnormal, float(strength))


def out_of_fold(Z: np.ndarray, labels, abnormal_labels, columns, folds, strength: float) -> np.ndarray:
    """Each cell's abnormal probability from a classifier fitted without its fold, (n,) float64
    (cells in no test fold get 0)."""
    labels = np.asarray(labels).astype(str)
    scores = np.zeros(len(labels))
    for train, test in folds:
        scores[test] = fit_classifier(Z[train], labels[train], abnormal_labels, columns,
                                      strength).abnormal_probability(Z[test])
    return scores


def choose_strength(Z: np.ndarray, labels, abnormal_labels, columns, folds) -> tuple[float, np.ndarray, dict]:
    """(C, its out-of-fold scores, each C's ROC AUC): the C whose out-of-fold scores rank the
    site's abnormal cells above its normal ones best."""
    from sklearn.metrics import roc_auc_score

    abnormal = np.array([label in set(abnormal_labels) for label in np.asarray(labels).astype(str)])
    tested = np.zeros(len(abnormal), bool)
    for _, test in folds:
        tested[test] = True
    results = {}
    for strength in STRENGTHS:
        scores = out_of_fold(Z, labels, abnormal_labels, columns, folds, strength)
        auc = (float(roc_auc_score(abnormal[tested], scores[tested]))
               if 0 < abnormal[tested].sum() < tested.sum() else 0.5)
        results[strength] = (auc, scores)
    best = max(STRENGTHS, key=lambda s: results[s][0])  # first of equals: the strongest penalty
    return best, results[best][1], {str(s): round(results[s][0], 4) for s in STRENGTHS}
