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

With ``--eyes 160x1,160x2,144x2`` (side in px x views averaged) each fold's cells are ingested
once and indexed once per variant of the eye's options (``pathmaster index --eye-resolution
--eye-views``): the same folds, the same held-out uploads analysed once; per variant the
figures above, then a table of them side by side with the eye's median CPU per upload.

    python benchmarks/bench_learn.py [--data DIR] [--folds 5] [--only 0,1] [--eyes 160x1,160x2]
        [--train-share 0.5] [--json FILE]

``--train-share`` indexes each fold's site with that share of its training slide images: run
at a few shares, it is a learning curve (does the site gain from more cells?).

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


def fewer_images(train: np.ndarray, groups: np.ndarray, share: float, seed: int) -> np.ndarray:
    """The training cells of a seeded ``share`` of their slide images (all of them at 1)."""
    if share >= 1.0:
        return train
    images = np.unique(groups[train])
    kept = np.random.default_rng(seed).choice(images, max(1, round(share * len(images))), replace=False)
    return train[np.isin(groups[train], kept)]


def analyse_queries(records):
    """Each held-out record as an upload (image only): (label, its analysis), and the median
    CPU seconds of one analysis; the same for every eye variant of a fold."""
    from pathmaster.analysis.cell import analyse_cell

    analysed, cpu = [], []
    for record in records:
        t0 = time.process_time()
        analysed.append((record.diagnosis, analyse_cell(record.image, source=record.source_id)))
        cpu.append(time.process_time() - t0)
    return analysed, float(np.median(cpu))


def query_fold(site, analysed, modes):
    """Per mode, each query's (label, nearest labels, abnormality score); and the median CPU
    seconds of one upload's eye vector (the site's eye on its patch)."""
    from pathmaster.site import faiss_index

    embedded, cpu_eye = [], []
    for label, analysis in analysed:
        t0 = time.process_time()
        embedding = site.embed(analysis.patch[None])
        cpu_eye.append(time.process_time() - t0)
        embedded.append((label, analysis.features, embedding))
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
        for label, features, embedding in embedded:
            matches = site.search(features, 5, embedding=None if embedding is None else embedding[0])
            [score] = site.abnormality(embedding, [matches], features[None])
            rows.append((label, [m.diagnosis for m in matches], score, site.learnt.threshold))
        out[mode] = rows
        site.learnt.mode, site.learnt.embedding_weight = chosen
    return out, float(np.median(cpu_eye))


def parse_eyes(text: str) -> dict[str, dict]:
    """``"160x1,144x2"`` -> {"160x1": {"resolution": 160, "views": 1}, ...}, each checked as
    indexing checks it (``fitting.eye_options``); "" -> the eye's defaults alone."""
    from pathmaster.site.fitting import eye_options

    variants = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        side, _, views = item.partition("x")
        if not (side.isdigit() and views.isdigit()):
            raise SystemExit(f"--eyes: {item!r} is not SIDExVIEWS, e.g. 160x2")
        variants[item] = eye_options(resolution=int(side), views=int(views))
    if not variants:
        default = eye_options()
        variants[f"{default['resolution']}x{default['views']}"] = default
    return variants


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
    specificity >= 0.90 and the best specificity at case sensitivity >= 0.95 (thresholds chosen
    on the held-out cells: ceilings, not results)."""
    from pathmaster.conclusion import (DEFAULT_THRESHOLD, TARGET_CASE_SENSITIVITY, aligned_score, at_threshold,
                                       simulate_cases)

    truth = np.isin([row[0] for row in rows], list(abnormal_labels))
    aligned = np.array([aligned_score(row[2], row[3], DEFAULT_THRESHOLD) for row in rows])
    simulation = simulate_cases(aligned, truth, groups)
    sensitive = simulate_cases(aligned, truth, groups, target_sensitivity=TARGET_CASE_SENSITIVITY)
    sensitivity, specificity = at_threshold(simulation, DEFAULT_THRESHOLD)
    return {"at_operating_point": [round(sensitivity, 3), round(specificity, 3)],
            "at_case_specificity_0.90": [round(simulation["chosen_sensitivity"], 3),
                                         round(simulation["chosen_specificity"], 3)],
            "at_case_sensitivity_0.95": [round(sensitive["chosen_sensitivity"], 3),
                                         round(sensitive["chosen_specificity"], 3)]}


def variant_report(folds: list[dict], pooled: dict, pooled_groups: list, abnormal) -> dict:
    """One eye variant's pooled figures over its folds, its simulated cases and its costs."""
    report = {"folds": folds}
    report["pooled"] = {m: {k: round(v, 3) for k, v in scores(r, abnormal).items()} for m, r in pooled.items() if r}
    report["cases"] = cases(pooled["site_choice"], abnormal, np.array(pooled_groups))
    report["eye_cpu_ms"] = round(float(np.median([f["learnt_cpu_ms"] for f in folds])), 1)
    report["index_s"] = round(float(np.median([f["index_s"] for f in folds])), 1)
    return report


def print_variant(name: str, report: dict) -> None:
    print(f"eye {name}: pooled over folds (sensitivity/specificity at each fold's site's own operating point):")
    print(json.dumps(report["pooled"], indent=1))
    print(f"eye {name}: simulated 6-cell cases (case sensitivity, specificity):", json.dumps(report["cases"]))
    print(f"eye {name}: the site's score at each rule's threshold, on the same held-out cells:")
    print(rules_table(report["folds"]))


def pooled_rule(folds: list[dict], rule: str) -> tuple[float, float]:
    """A rule's pooled (sensitivity, specificity) over the folds' held-out cells (NaN where
    no fold's site had enough cells for it)."""
    cells = [f["rules"][rule] for f in folds if rule in f["rules"]]
    if not cells:
        return float("nan"), float("nan")
    return (sum(c["found"] for c in cells) / sum(c["abnormal"] for c in cells),
            sum(c["cleared"] for c in cells) / sum(c["normal"] for c in cells))


def variants_table(variants: dict) -> str:
    """The variants side by side: the site's own choice pooled, its per-cell rule, its cases, costs."""
    from pathmaster.learning.thresholds import MARGIN_CONFIDENCE

    rule = f"cp{MARGIN_CONFIDENCE:g}"
    width = max(8, *map(len, variants))
    lines = [f"{'eye':{width}s} AUC    top-1  site point sens/spec  cell rule {rule} sens/spec  cases at point sens/spec  "
             "cases at spec>=0.90 sens/spec  cases at sens>=0.95 sens/spec  eye CPU ms/upload  index s/fold"]
    for name, report in variants.items():
        site = report["pooled"]["site_choice"]
        sens, spec = pooled_rule(report["folds"], rule)
        point, ceiling = report["cases"]["at_operating_point"], report["cases"]["at_case_specificity_0.90"]
        sensitive = report["cases"]["at_case_sensitivity_0.95"]
        lines.append(f"{name:{width}s} {site['auc']:.3f}  {site['top1']:.3f}  {site['sensitivity']:.3f} / "
                     f"{site['specificity']:.3f}         {sens:.3f} / {spec:.3f}               "
                     f"{point[0]:.3f} / {point[1]:.3f}            {ceiling[0]:.3f} / {ceiling[1]:.3f}"
                     f"                  {sensitive[0]:.3f} / {sensitive[1]:.3f}"
                     f"                  {report['eye_cpu_ms']:5.1f}             {report['index_s']:.1f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    shared = Path(os.environ.get("PATHMASTER_SHARED", Path(__file__).resolve().parents[2] / "shared"))
    parser.add_argument("--data", type=Path, default=shared / "data" / "herlev-224-dev")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--only", default="", help="comma-separated fold numbers to run (default: all)")
    parser.add_argument("--eyes", default="", help="eye variants SIDExVIEWS, comma-separated, e.g. 160x1,160x2 "
                                                   "(default: the eye's defaults alone)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-share", type=float, default=1.0,
                        help="index each fold's site with this share of its training slide images "
                             "(a seeded draw; for a learning curve), the held-out cells unchanged")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    if not args.data.is_dir():
        print(f"skipped: no dataset at {args.data}")
        return 0
    eyes = parse_eyes(args.eyes)

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
    pooled = {name: {mode: [] for mode in modes} for name in eyes}
    folds_of = {name: [] for name in eyes}
    pooled_groups = []
    abnormal = set()
    if not 0.0 < args.train_share <= 1.0:
        raise SystemExit("--train-share must be in (0, 1]")
    report = {"eyes": eyes, "train_share": args.train_share, "load_before": os.getloadavg()}
    folds = StratifiedGroupKFold(args.folds, shuffle=True, random_state=args.seed).split(labels, labels, groups)
    for f, (train, test) in enumerate(folds):
        if only and f not in only:
            continue
        train = fewer_images(train, groups, args.train_share, args.seed + f)
        with tempfile.TemporaryDirectory(prefix="bench-learn-") as site_dir:
            t0 = time.perf_counter()
            ingest(args.data, site_dir, records=[records[i] for i in train], build_index=False)
            ingest_s = time.perf_counter() - t0
            analysed, cpu_features = analyse_queries([records[i] for i in test])
            for name, eye in eyes.items():
                t0 = time.perf_counter()
                with SiteDB(site_dir) as db:
                    db.set_config("index", {})  # learn again: variants may share the eye's options
                    build_search_index(db, eye=eye)
                index_s = time.perf_counter() - t0
                site = SiteIndex.open(site_dir)
                rows, cpu_eye = query_fold(site, analysed, modes)
                abnormal = set(site.vocabulary.abnormal)
                fold = {"fold": f, "eye": name, "described": None if site.eye is None else site.eye.describe(),
                        "ingest_s": round(ingest_s, 1), "index_s": round(index_s, 1), "train_cells": int(len(train)),
                        "chosen": site.learnt.mode, "note": site.similarity_note(), "score": site.learnt.score,
                        "threshold": site.learnt.threshold, "analysis_cpu_ms": round(1000 * cpu_features, 1),
                        "learnt_cpu_ms": round(1000 * cpu_eye, 1), "load": os.getloadavg(),
                        "case_point": (site.learnt.report or {}).get("case"),
                        "modes": {m: scores(r, abnormal) for m, r in rows.items()}}
                for mode, r in rows.items():
                    pooled[name][mode].extend(r)
                fold["site_choice"] = scores(rows[site.learnt.mode], abnormal)
                fold["rules"] = rule_figures(rows[site.learnt.mode], abnormal,
                                             {"used": site.learnt.threshold,
                                              **((site.learnt.report or {}).get("thresholds") or {})})
                pooled[name].setdefault("site_choice", []).extend(rows[site.learnt.mode])
                folds_of[name].append(fold)
                print(json.dumps(fold), flush=True)
            pooled_groups.extend(groups[test])
    report["variants"] = {name: variant_report(folds_of[name], pooled[name], pooled_groups, abnormal)
                          for name in eyes}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    for name, variant in report["variants"].items():
        print_variant(name, variant)
    print("the eye's variants side by side (pooled over the same folds; CPU: median over uploads of one fold, "
          "then over folds, of the eye's vector of one upload; index: the eye's look at every cell and what the "
          "site learns, wall):")
    print(variants_table(report["variants"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
