"""The case rule on real cells: case sensitivity/specificity of simulated 6-cell cases.

Every cell of a labelled folder (default: the Herlev development half at 224 px) is analysed
as an upload is (automatic segmentation and blank-slide estimate), then queried in 5 folds
split by slide image (file-name prefix before the last '-NNN'): each fold's cells search a
database of the other 4/5, whose similarity is fitted on those cells only, as `pathmaster
index` fits a site's. Each held-out cell's abnormal score is the share of its k matches in
abnormal Bethesda terms (`pathmaster.conclusion.abnormal_share`); `simulate_cases` draws
6-cell cases from them and prints the case figures at the default threshold and at the one
it chooses for a case specificity of 0.90.

    .venv/bin/python benchmarks/case_rule.py [FOLDER] [--k 5] [--weighting uniform]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

from pathmaster import conclusion
from pathmaster.learning import similarity
from pathmaster.features import FEATURES
from pathmaster.image.io import decode_image
from pathmaster.analysis.cell import analyse_cell
from pathmaster.vocabulary import BETHESDA_TERMS, BUILTIN, majority

DEFAULT = Path(os.environ.get("PATHMASTER_SHARED", Path(__file__).resolve().parents[1].parent / "shared"),
               "data", "herlev-224-dev")


def load(folder: Path):
    vocabulary = BUILTIN["herlev"]
    X, labels, groups = [], [], []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        label = vocabulary.label(sub.name)
        for path in sorted(sub.glob("*.jpg")) + sorted(sub.glob("*.bmp")) + sorted(sub.glob("*.png")):
            X.append(analyse_cell(decode_image(path.read_bytes(), path.name), source=path.name).features)
            labels.append(label)
            groups.append(re.sub(r"-\d+$", "", path.stem))
    return np.array(X), np.array(labels, dtype=object), np.array(groups), vocabulary


def held_out_terms(X, labels, groups, vocabulary, k: int, seed: int = 0):
    """Each cell's k nearest (terms, distances) in a database of the other folds."""
    from sklearn.model_selection import StratifiedGroupKFold

    names = [f.name for f in FEATURES]
    terms = np.empty((len(labels), k), dtype=object)
    distances = np.empty((len(labels), k))
    splitter = StratifiedGroupKFold(n_splits=5, shuffle=True, random_state=seed)
    for train, test in splitter.split(X, labels, groups):
        normalization, projection = similarity.fit_similarity(X[train], labels[train], names, "auto", seed=seed)
        V_train = projection.apply(normalization.apply(X[train]))
        V_test = projection.apply(normalization.apply(X[test]))
        d = ((V_test ** 2).sum(1)[:, None] - 2 * V_test @ V_train.T + (V_train ** 2).sum(1)[None, :])
        order = np.argsort(d, axis=1, kind="stable")[:, :k]
        terms[test] = np.vectorize(vocabulary.to_bethesda, otypes=[object])(labels[train][order])
        distances[test] = np.sqrt(np.maximum(np.take_along_axis(d, order, axis=1), 0))
    return terms, distances


def majority_rule(terms, truth, groups, usable) -> tuple[float, float]:
    """Case sensitivity and specificity of the majority Bethesda term over every match of the
    case (a tie to the more severe), on the same drawn cases as `simulate_cases`."""
    counts = np.array([[sum(t == term for t in row) for term in BETHESDA_TERMS] for row in terms])
    normal, mixed = conclusion.draw_cases(truth, groups, usable=usable)

    def abnormal(case) -> bool:
        return majority([term for term, n in zip(BETHESDA_TERMS, counts[case].sum(axis=0)) for _ in range(n)],
                        BETHESDA_TERMS).label != "NILM"

    return float(np.mean([abnormal(c) for c in mixed])), float(np.mean([not abnormal(c) for c in normal]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--weighting", choices=conclusion.WEIGHTINGS, default="uniform")
    args = parser.parse_args(argv)
    if not args.folder.is_dir():
        print(f"no data folder at {args.folder}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    X, labels, groups, vocabulary = load(args.folder)
    print(f"{len(labels)} cells from {len(set(groups))} slide images analysed in {time.perf_counter() - started:.0f} s")
    terms, distances = held_out_terms(X, labels, groups, vocabulary, args.k)
    scores = np.array([conclusion.abnormal_share(tuple(t), tuple(d), args.weighting)
                       for t, d in zip(terms, distances)], dtype=np.float64)
    truth = np.array([label in vocabulary.abnormal for label in labels])
    from sklearn.metrics import roc_auc_score

    print(f"per-cell abnormal score ({args.weighting}, k={args.k}): ROC AUC {roc_auc_score(truth, scores):.3f}")
    default = conclusion.DEFAULT_THRESHOLD
    cell_sens, cell_spec = (scores[truth] >= default).mean(), (scores[~truth] < default).mean()
    print(f"per cell at the default {default:.2f}: sensitivity {cell_sens:.3f}, specificity {cell_spec:.3f}")
    sim = conclusion.simulate_cases(scores, truth, groups)
    sens, spec = conclusion.at_threshold(sim, default)
    print(f"simulated {sim['cases']} all-normal and {sim['cases']} abnormal (1-2 of 6 cells) cases "
          f"from {sim['cells']['normal']} normal + {sim['cells']['abnormal']} abnormal cells, {sim['groups']} images")
    old_sens, old_spec = majority_rule(terms, truth, groups, ~np.isnan(scores))
    print(f"  the case's majority term over every match (the rule before): case sensitivity {old_sens:.3f}, "
          f"case specificity {old_spec:.3f}")
    print(f"  default threshold {default:.2f}: case sensitivity {sens:.3f}, case specificity {spec:.3f}")
    print(f"  chosen threshold {sim['chosen']:.2f} (target case specificity {sim['target_specificity']:.2f}, "
          f"{'met' if sim['met'] else 'NOT met'}): case sensitivity {sim['chosen_sensitivity']:.3f}, "
          f"case specificity {sim['chosen_specificity']:.3f}")
    for t, se, sp in zip(sim["thresholds"], sim["sensitivity"], sim["specificity"]):
        print(f"    {t:.3f}  sens {se:.3f}  spec {sp:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
