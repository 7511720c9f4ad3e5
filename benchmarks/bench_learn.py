"""A site's look through its eye against its features alone, side by side on the same folds.

Each fold of the dataset's cells (grouped by slide image: the file-name prefix before the
last '-NNN', so cells of one image are never on both sides) is indexed as a site
(``pathmaster.site.ingest``: automatic segmentation, the features' choice, the eye's vectors and
the lens and head the site learns on top, its own choice of what to compare and its
operating point, chosen for 6-cell cases), then the held-out cells query it as uploads
(image only: segmented, slide estimated). Per mode (features / embedding / fused) it prints
7-class top-1 (the nearest cell's label) and majority@5, binary accuracy by the 5 nearest;
and the site's abnormality score at its own operating point (sensitivity, specificity, ROC
AUC), plus the time to index and the CPU time of one upload's analysis and of its eye.
Side by side on the same held-out cells and the same score, the thresholds every rule of
the site's report (``thresholds.MARGIN_RULES``) would have chosen: "third" (the point estimate on
the first inner fold's cells), "point" (on every held-out cell), "cpX" (the Clopper-Pearson
margin at confidence X); per fold and pooled.

    python benchmarks/bench_learn.py [--data DIR] [--folds 5] [--only 0,1] [--json FILE]

Needs a labelled image dataset (default: the shared Herlev development half,
../shared/data/herlev-224-dev); nothing learnt is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np


def group_of(source_id: str) -> str:
    """The slide image of a Herlev cell: its file name less the last '-NNN'."""
    return re.sub(r"-\d+$", "", Path(source_id).name)


def query_fold(site, records, modes):
    """Per mode, each query's (label, nearest labels, abnormality score); and analysis CPU times."""
    from pathmaster.site import faiss_index

    analysed, cpu_features, cpu_learnt = [], [], []
    for record in records:
        t0 = time.process_time()
        analysis = site.analyse(record.image, source=record.source_id)
        t1 = time.process_time()
        embedding = site.embed(analysis.patch[None])
        cpu_features.append(t1 - t0)
        cpu_learnt.append(time.process_time() - t1)
        analysed.append((record.diagnosis, analysis.features, embedding))
    chosen = (site.learnt.mode, site.learnt.embedding_weight)
    out = {}
    for mode in modes:
        if mode != "features" and site.lens is None:
            continue
        site.learnt.mode = mode
        if mode == "fused" and chosen[0] != "fused":
            site.learnt.embedding_weight = 0.5
        site._index = faiss_index.build_index(site.vectors())
        rows = []
        for label, features, embedding in analysed:
            matches = site.search(features, 5, embedding=None if embedding is None else embedding[0])
            [score] = site.abnormality(embedding, [matches], features[None])
            rows.append((label, [m.diagnosis for m in matches], score, site.learnt.threshold))
        out[mode] = rows
        site.learnt.mode, site.learnt.embedding_weight = chosen
    return out, float(np.median(cpu_features)), float(np.median(cpu_learnt))


def scores(rows, abnormal_labels):
    from sklearn.metrics import roc_auc_score

    from pathmaster.learning.neighbours import majority_vote

    truth = np.array([row[0] for row in rows])
    nearest = np.array([row[1][0] for row in rows])
    majority = np.array([majority_vote(row[1]) for row in rows])
    abnormal = np.isin(truth, list(abnormal_labels))
    by_vote = np.array([np.mean(np.isin(row[1], list(abnormal_labels))) > 0.5 for row in rows])
    score = np.array([row[2] for row in rows])
    called = score >= np.array([row[3] for row in rows])  # each site's own operating point
    return {"top1": float(np.mean(nearest == truth)), "majority_at_5": float(np.mean(majority == truth)),
            "binary_by_vote": float(np.mean(by_vote == abnormal)),
            "sensitivity": float(called[abnormal].mean()), "specificity": float((~called[~abnormal]).mean()),
            "binary_at_threshold": float(np.mean(called == abnormal)),
            "auc": float(roc_auc_score(abnormal, score)), "n": int(len(rows))}


def rules_table(folds: list[dict]) -> str:
    """Per rule, each fold's and the pooled sensitivity/specificity, one line each."""
    rules = list(dict.fromkeys(r for fold in folds for r in fold["rules"]))
    lines = ["rule      " + "".join(f"  fold {f['fold']} sens/spec" for f in folds) + "  pooled sens/spec (cells)"]
    for rule in rules:
        cells = [f["rules"].get(rule) for f in folds]
        found = sum(c["found"] for c in cells if c)
        cleared = sum(c["cleared"] for c in cells if c)
        sick = sum(c["abnormal"] for c in cells if c)
        well = sum(c["normal"] for c in cells if c)
        lines.append(f"{rule:9s} " + "".join(f"  {c['sensitivity']:.3f} / {c['specificity']:.3f}  " if c else
                                            "  n/a              " for c in cells)
                     + f"  {found / sick:.3f} / {cleared / well:.3f} ({found}/{sick}, {cleared}/{well})")
    return "\n".join(lines)


def rule_figures(rows, abnormal_labels, thresholds: dict) -> dict:
    """{rule: sensitivity, specificity and counts} of each rule's threshold on these rows."""
    abnormal = np.isin([row[0] for row in rows], list(abnormal_labels))
    score = np.array([row[2] for row in rows])
    out = {}
    for rule, threshold in thresholds.items():
        called = score >= threshold
        out[rule] = {"threshold": threshold, "found": int(called[abnormal].sum()), "abnormal": int(abnormal.sum()),
                     "cleared": int((~called[~abnormal]).sum()), "normal": int((~abnormal).sum()),
                     "sensitivity": float(called[abnormal].mean()), "specificity": float((~called[~abnormal]).mean())}
    return out


def cases(rows, abnormal_labels, groups):
    """Simulated 6-cell cases (``conclusion.simulate_cases``) from every fold's held-out cells,
    each score put on the case rule's scale by its own site's operating point
    (``conclusion.aligned_score``), as the coordinator concludes: case sensitivity and
    specificity at the sites' operating points, and the best sensitivity at case
    specificity >= 0.90 (a threshold chosen on the held-out cells: a ceiling, not a result)."""
    from pathmaster.conclusion import DEFAULT_THRESHOLD, aligned_score, at_threshold, simulate_cases

    truth = np.isin([row[0] for row in rows], list(abnormal_labels))
    aligned = np.array([aligned_score(row[2], row[3], DEFAULT_THRESHOLD) for row in rows])
    simulation = simulate_cases(aligned, truth, groups)
    sensitivity, specificity = at_threshold(simulation, DEFAULT_THRESHOLD)
    return {"at_operating_point": [round(sensitivity, 3), round(specificity, 3)],
            "at_case_specificity_0.90": [round(simulation["chosen_sensitivity"], 3),
                                         round(simulation["chosen_specificity"], 3)]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = Path(os.environ.get("PATHMASTER_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--data", type=Path, default=shared / "data" / "herlev-224-dev")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated fold numbers to run (default: all)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if not args.data.is_dir():
        print(f"skipped: no dataset at {args.data}")
        return 0

    from sklearn.model_selection import StratifiedGroupKFold

    from pathmaster.importers import iter_dataset
    from pathmaster.site.ingest import ingest
    from pathmaster.site.index import build_search_index
    from pathmaster.site.search import SiteIndex
    from pathmaster.site.database import SiteDB

    records = [r for r in iter_dataset(args.data) if hasattr(r, "image")]
    labels = np.array([r.diagnosis for r in records])
    groups = np.array([group_of(r.source_id) for r in records])
    only = {int(f) for f in args.only.split(",") if f}
    modes = ("features", "embedding", "fused")
    pooled = {mode: [] for mode in modes}
    pooled_groups = []
    report = {"folds": [], "load_before": os.getloadavg()}
    folds = StratifiedGroupKFold(args.folds, shuffle=True, random_state=args.seed).split(labels, labels, groups)
    for f, (train, test) in enumerate(folds):
        if only and f not in only:
            continue
        with tempfile.TemporaryDirectory(prefix="bench-learn-") as site_dir:
            t0 = time.perf_counter()
            ingest(args.data, site_dir, records=[records[i] for i in train], build_index=False)
            with SiteDB(site_dir) as db:
                build_search_index(db)
            index_s = time.perf_counter() - t0
            site = SiteIndex.open(site_dir)
            rows, cpu_features, cpu_learnt = query_fold(site, [records[i] for i in test], modes)
            abnormal = set(site.vocabulary.abnormal)
            fold = {"fold": f, "index_s": round(index_s, 1), "train_cells": int(len(train)),
                    "chosen": site.learnt.mode, "note": site.similarity_note(), "score": site.learnt.score,
                    "threshold": site.learnt.threshold, "analysis_cpu_ms": round(1000 * cpu_features, 1),
                    "learnt_cpu_ms": round(1000 * cpu_learnt, 1), "load": os.getloadavg(),
                    "case_point": (site.learnt.report or {}).get("case"),
                    "modes": {m: scores(r, abnormal) for m, r in rows.items()}}
            for mode, r in rows.items():
                pooled[mode].extend(r)
            fold["site_choice"] = scores(rows[site.learnt.mode], abnormal)
            fold["rules"] = rule_figures(rows[site.learnt.mode], abnormal,
                                         {"used": site.learnt.threshold,
                                          **((site.learnt.report or {}).get("thresholds") or {})})
            pooled.setdefault("site_choice", []).extend(rows[site.learnt.mode])
            pooled_groups.extend(groups[test])
            report["folds"].append(fold)
            print(json.dumps(fold), flush=True)
    report["pooled"] = {m: {k: round(v, 3) for k, v in scores(r, abnormal).items()} for m, r in pooled.items() if r}
    report["cases"] = cases(pooled["site_choice"], abnormal, np.array(pooled_groups))
    print("pooled over folds (sensitivity/specificity at each fold's site's own operating point):")
    print(json.dumps(report["pooled"], indent=1))
    print("simulated 6-cell cases (case sensitivity, specificity):", json.dumps(report["cases"]))
    print("the site's score at each rule's threshold, on the same held-out cells:")
    print(rules_table(report["folds"]))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
