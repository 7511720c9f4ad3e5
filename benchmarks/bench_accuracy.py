"""Right answers on realistic uploads: today's code (08f044c) and this checkout, side by side.

    python benchmarks/bench_accuracy.py [--before REV] [--seed 0] [--cache DIR] [--json]

Data: ../shared/data/herlev-224-dev (or $PATHMASTER_SHARED/data/...), the development half
of Herlev as 224 px letter-boxed JPEG uploads, no masks: every cell is segmented and its
blank slide estimated automatically, as an upload is. 5 folds split by slide image (the
file-name prefix before the last -NNN; scikit-learn's StratifiedGroupKFold, seed
``--seed``): each fold's database is the other 4/5, its queries the 1/5, the same folds for
both trees. Each tree runs in its own process from its own checkout (REV from a temporary
``git worktree``), extracts the features of the 462 cells once (cached per run, or under
``--cache`` across runs) and refits its own representation on each training fold
(``pathmaster.evaluation.crossval.site_similarity_fit``); both trees' 5 nearest matches are then scored
here alike:

- 7-class top-1 (the nearest match's diagnosis) and majority@5;
- binary normal/abnormal accuracy, abnormal sensitivity and specificity by the majority of
  the 5 matches, with Wilson 95% intervals;
- the ROC AUC of the per-cell abnormality score (``pathmaster.evaluation.metrics.abnormality_scores``,
  the case conclusion's distance-weighted share of abnormal matches);
- sensitivity and specificity at the operating point chosen on each training fold alone
  (each training cell queried with its slide image held apart; target sensitivity 0.95),
  and on simulated 6-cell cases of held-out cells (``pathmaster.conclusion.simulate_cases``;
  the case threshold chosen on the training fold's cells for case specificity >= 0.90).

Nothing here is tuned on the queries. Prints medians of feature extraction ms per cell too.

Measured (2 busy cores, seed 0, before 08f044c -> after this branch's segmentation; the
representation is the same features fit on both sides):
  7-class top-1 0.366 -> 0.446, majority@5 0.379 -> 0.457; binary (majority of 5) 0.827 ->
  0.859, sensitivity 0.944 -> 0.968, specificity 0.500 -> 0.557; ROC AUC 0.800 -> 0.826;
  at the training folds' operating point sensitivity 0.941 -> 0.941, specificity 0.508 ->
  0.607; 6-cell cases sensitivity 0.819 -> 0.885, specificity 0.500 -> 0.416 (the case
  threshold the training folds choose for specificity 0.90 does not hold on held-out cells:
  a training cell's neighbours are found in a space fitted to it, so its score flatters).
  Letter-box bars alone (before the cytoplasm fallback): top-1 0.426, binary 0.853.
  Far from the issue's targets (binary >= 0.90, top-1 >= 0.55): features alone on these
  uploads are not enough; the learnt embedding is measured per fold through the site's fit.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
BASELINE = "08f044c"
K = 5


# ---------------------------------------------------------------- the worker (either tree)

def _features(data: Path, cache: Path) -> dict:
    """Features of every cell of ``data`` with the pathmaster on sys.path, cached in ``cache``."""
    if cache.is_file():
        stored = np.load(cache, allow_pickle=False)
        return {key: stored[key] for key in stored.files}
    from pathmaster.importers import iter_dataset
    from pathmaster.records import CellRecord
    from pathmaster.analysis.cell import analyse_cell

    ids, rows, ms = [], [], []
    started = time.perf_counter()
    for record in iter_dataset(data):
        if isinstance(record, CellRecord):
            rows.append(analyse_cell(record.image, record.background, record.mask).features)
            ids.append(record.source_id)
            now = time.perf_counter()
            ms.append(1000 * (now - started))
            started = now
    result = {"ids": np.array(ids), "X": np.vstack(rows), "ms": np.array(ms)}
    np.savez(cache, **result)
    return result


def _neighbours(V_query, V_base, labels_base, exclude=None):
    """(labels (m, K), distances (m, K)) of the K nearest base vectors; ``exclude`` (m, n) bool
    marks base cells a query may not see."""
    d = np.maximum((V_query ** 2).sum(1)[:, None] - 2 * V_query @ V_base.T + (V_base ** 2).sum(1)[None, :], 0.0)
    if exclude is not None:
        d[exclude] = np.inf
    order = np.argsort(d, axis=1, kind="stable")[:, :K]
    return labels_base[order], np.sqrt(np.take_along_axis(d, order, axis=1))


def worker(args) -> int:
    import pathmaster
    from pathmaster.evaluation import crossval
    from pathmaster.features import feature_names

    plan = json.loads(Path(args.plan).read_text())
    cells = _features(args.data, Path(args.cache))
    position = {source: i for i, source in enumerate(cells["ids"].tolist())}
    order = np.array([position[source] for source in plan["ids"]])
    X = cells["X"][order]
    labels = np.array(plan["labels"], dtype=object)
    groups = np.array(plan["groups"])
    names = list(feature_names())
    out = {"package": str(Path(pathmaster.__file__).resolve().parent), "ms_per_cell": float(np.median(cells["ms"])),
           "features": len(names), "test": [], "train": []}
    for test in plan["folds"]:
        test = np.array(test)
        train = np.setdiff1d(np.arange(len(labels)), test)
        transform = crossval.site_similarity_fit(names, "auto", args.seed)(X[train], labels[train])
        V_train, V_test = (np.asarray(transform(X[rows]), dtype=np.float64) for rows in (train, test))
        near, dist = _neighbours(V_test, V_train, labels[train])
        apart = groups[train][:, None] == groups[train][None, :]
        near_train, dist_train = _neighbours(V_train, V_train, labels[train], apart)
        out["test"].append({"labels": near.tolist(), "distances": dist.round(6).tolist()})
        out["train"].append({"labels": near_train.tolist(), "distances": dist_train.round(6).tolist()})
    print(json.dumps(out))
    return 0


# ---------------------------------------------------------------- the parent (this checkout)

def plan(data: Path, seed: int) -> dict:
    """Cells (source ids as the importers name them), labels, slide images and the folds."""
    sys.path.insert(0, str(REPO))
    from pathmaster.learning.folds import stratified_folds
    from pathmaster.importers.base import herlev_group
    from pathmaster.records import diagnosis_from_name

    ids, labels, groups = [], [], []
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):
        for path in sorted(folder.glob("*.jpg")):
            ids.append(f"{folder.name}/{path.stem}")
            labels.append(diagnosis_from_name(folder.name))
            groups.append(herlev_group(path.stem) or path.stem)
    folds = stratified_folds(labels, 5, seed, groups)
    return {"ids": ids, "labels": labels, "groups": groups, "folds": [test.tolist() for _, test in folds]}


def _run(tree: Path, args, plan_path: Path, cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, str(Path(__file__).resolve()), "--worker", "--data", str(args.data),
               "--plan", str(plan_path), "--cache", str(cache), "--seed", str(args.seed)]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=3600, cwd=tree)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["package"]) != (tree / "pathmaster").resolve():
        raise RuntimeError(f"worker for {tree} imported pathmaster from {result['package']}")
    return result


def score(result: dict, layout: dict, seed: int) -> dict:
    """The figures of one tree's matches (module docstring), with this checkout's rules."""
    from pathmaster.evaluation import crossval
    from pathmaster.evaluation import metrics
    from pathmaster.learning import thresholds
    from pathmaster.conclusion import simulate_cases
    from pathmaster.records import NORMAL_DIAGNOSES

    labels = np.array(layout["labels"], dtype=object)
    groups = np.array(layout["groups"])
    n = len(labels)
    positive = ~np.isin(labels, list(NORMAL_DIAGNOSES))
    top = np.empty((n, K), dtype=object)
    scores, called = np.zeros(n), np.zeros(n, bool)
    case_counts = np.zeros(4)
    for number, (test, fold, fitted) in enumerate(zip(layout["folds"], result["test"], result["train"])):
        test = np.array(test)
        train = np.setdiff1d(np.arange(n), test)
        near = np.array(fold["labels"], dtype=object)
        top[test] = near
        scores[test] = metrics.abnormality_scores(~np.isin(near, list(NORMAL_DIAGNOSES)), np.array(fold["distances"]))
        train_scores = metrics.abnormality_scores(~np.isin(np.array(fitted["labels"], dtype=object), list(NORMAL_DIAGNOSES)),
                                             np.array(fitted["distances"]))
        threshold = thresholds.operating_point(train_scores, positive[train])["threshold"]
        called[test] = scores[test] >= threshold
        chosen = simulate_cases(train_scores, positive[train], groups[train], cases=metrics.CASES_PER_FOLD,
                                seed=seed * 1000 + number)["chosen"]
        held = simulate_cases(scores[test], positive[test], groups[test], cases=metrics.CASES_PER_FOLD, thresholds=[chosen],
                              seed=seed * 1000 + number + 500)
        case_counts += [held["sensitivity"][0] * metrics.CASES_PER_FOLD, metrics.CASES_PER_FOLD,
                        held["specificity"][0] * metrics.CASES_PER_FOLD, metrics.CASES_PER_FOLD]
    ranked = metrics.score_rankings(labels, top, None, K, seed=seed)
    majority = np.array([crossval.majority_vote([not (x in NORMAL_DIAGNOSES) for x in row]) for row in top], dtype=bool)
    curve = metrics.roc(positive, scores, seed=seed)
    return {"top1": ranked["top1"], "top1_ci": ranked["ci"]["top1"], "majority_at_5": ranked["majority_at_5"],
            "majority": metrics.binary_figures(positive, majority), "operating_point": metrics.binary_figures(positive, called),
            "auc": curve["auc"], "auc_ci": curve["auc_ci"],
            "cases": metrics.counted_figures(*(round(count) for count in case_counts)),
            "per_class_recall": {label: row["majority_at_5"] for label, row in ranked["per_class"].items()},
            "ms_per_cell": result["ms_per_cell"]}


def _figure(value, interval=None) -> str:
    return f"{value:.3f}" + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")


def report(trees: dict, layout: dict, args) -> None:
    names = list(trees)
    print(f"herlev-224-dev: {len(layout['labels'])} uploads (224 px JPEG, letter-boxed, no masks), "
          f"{len(set(layout['groups']))} slide images, 5 folds by slide image (seed {args.seed}); "
          + " vs ".join(f"{n} = {trees[n]['label']}" for n in names))
    rows = [("7-class top-1", lambda t: _figure(t["top1"], t["top1_ci"])),
            ("7-class majority@5", lambda t: _figure(t["majority_at_5"])),
            ("binary accuracy (majority)", lambda t: _figure(t["majority"]["accuracy"])),
            ("sensitivity (majority)", lambda t: _figure(t["majority"]["sensitivity"], t["majority"]["sensitivity_ci"])),
            ("specificity (majority)", lambda t: _figure(t["majority"]["specificity"], t["majority"]["specificity_ci"])),
            ("ROC AUC, abnormality score", lambda t: _figure(t["auc"], t["auc_ci"])),
            ("binary accuracy (op. point)", lambda t: _figure(t["operating_point"]["accuracy"])),
            ("sensitivity (op. point)", lambda t: _figure(t["operating_point"]["sensitivity"],
                                                          t["operating_point"]["sensitivity_ci"])),
            ("specificity (op. point)", lambda t: _figure(t["operating_point"]["specificity"],
                                                          t["operating_point"]["specificity_ci"])),
            ("6-cell cases sensitivity", lambda t: _figure(t["cases"]["sensitivity"], t["cases"]["sensitivity_ci"])),
            ("6-cell cases specificity", lambda t: _figure(t["cases"]["specificity"], t["cases"]["specificity_ci"])),
            ("ms per cell (features)", lambda t: f"{t['ms_per_cell']:.0f}")]
    print(f"{'':30s}" + "".join(f"{name:>26s}" for name in names))
    for title, cell in rows:
        print(f"{title:30s}" + "".join(f"{cell(trees[name]):>26s}" for name in names))
    print("recall per class (majority@5): " + "; ".join(
        f"{label} " + " -> ".join(f"{trees[n]['per_class_recall'][label]:.2f}" for n in names)
        for label in trees[names[-1]]["per_class_recall"]))


def main(argv: list[str] | None = None) -> int:
    shared = Path(os.environ.get("PATHMASTER_SHARED", REPO.parent / "shared"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=shared / "data" / "herlev-224-dev")
    parser.add_argument("--before", default=BASELINE, metavar="REV", help=f"git revision to compare (default {BASELINE})")
    parser.add_argument("--seed", type=int, default=0, help="fold split seed (default 0)")
    parser.add_argument("--cache", type=Path, help="keep each tree's features here between runs")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"no Herlev uploads at {args.data}", file=sys.stderr)
        return 1
    if args.worker:
        import old_layout  # this tree's names in a tree from before the core's rooms

        old_layout.install()
        return worker(args)
    layout = plan(args.data, args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-accuracy-") as tmp:
        cache = args.cache or Path(tmp)
        cache.mkdir(parents=True, exist_ok=True)
        plan_path = Path(tmp) / "plan.json"
        plan_path.write_text(json.dumps(layout))
        old = Path(tmp) / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(old), args.before],
                       check=True)
        try:
            results = {"before": _run(old, args, plan_path, cache / f"features-{args.before}.npz")}
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False)
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "pathmaster"], capture_output=True,
                               text=True).stdout.strip()
        label = head + ("+changes" if dirty else "")
        # uncommitted changes are never cached beyond this run
        results["after"] = _run(REPO, args, plan_path, (Path(tmp) if dirty else cache) / f"features-{label}.npz")
    trees = {name: {**score(result, layout, args.seed), "label": args.before if name == "before" else label}
             for name, result in results.items()}
    if args.json:
        print(json.dumps({"seed": args.seed, "trees": trees}, indent=1))
    else:
        report(trees, layout, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
