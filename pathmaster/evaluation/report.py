"""An evaluation's figures as the text ``pathmaster evaluate`` prints."""

from __future__ import annotations


def _interval(ci: dict, key: str) -> str:
    low_high = ci.get(key)
    return "" if low_high is None else f"  [{low_high[0]:.3f}, {low_high[1]:.3f}]"


def _pair(figures: dict) -> str:
    """'sensitivity 0.912 [0.88, 0.94]  specificity ...' of ``binary_figures``."""
    parts = []
    for key in ("sensitivity", "specificity"):
        value = figures[key]
        low, high = figures[f"{key}_ci"]
        parts.append(f"{key} {'n/a' if value is None else f'{value:.3f}'} [{low:.3f}, {high:.3f}]")
    return "  ".join(parts)


def _abnormal_lines(metrics: dict) -> list[str]:
    """The report's lines on abnormal cells, simulated cases and the ROC."""
    abnormal = metrics.get("abnormal")
    if abnormal is None:
        return ["", "abnormal vs normal: n/a (the site's labels have no abnormal and normal side)"]
    majority, point = abnormal["majority"], abnormal["operating_point"]
    lines = ["", f"abnormal ({', '.join(abnormal['labels'])}) vs normal: "
                 f"{majority['positives']} abnormal, {majority['negatives']} normal cells",
             f"  majority of the {metrics['k']} matches   {_pair(majority)}  ({majority['missed']} abnormal called normal)"]
    if point:
        lines.append(f"  match share's operating point {_pair(point)}  ({point['missed']} abnormal called normal;"
                     f" threshold chosen on each training fold for sensitivity >= {point['target_sensitivity']:.2f})")
    curve = abnormal.get("roc")
    if curve:
        lines.append(f"  ROC AUC of the match share {curve['auc']:.3f} [{curve['auc_ci'][0]:.3f}, "
                     f"{curve['auc_ci'][1]:.3f}] ({abnormal['score']})")
    cases = metrics.get("cases")
    if cases:
        lines.append(f"  simulated {cases['cells_per_case']}-cell cases of held-out cells by the match share "
                     f"({cases['cases']}, {cases['abnormal_cases']} with 1-2 abnormal cells): {_pair(cases)}")
    return lines + _site_score_lines(metrics.get("site_score"))


def _site_score_lines(site: dict | None) -> list[str]:
    """The report's lines on the score the site decides by: a pathologist's line, then the figures."""
    from pathmaster.learning.policy import SCORE_WORDS

    if not site:
        return []
    point, names = site["operating_point"], site["score"]
    name = names if isinstance(names, str) else max(set(names), key=names.count)
    lines = ["", f"the site's own abnormality score ({name if isinstance(names, str) else ', '.join(names)}), "
                 "as it answers queries and as the case conclusion reads it:",
             f"  In plain words: the site calls a cell abnormal by {SCORE_WORDS.get(name, name)}; on cells it had "
             f"not seen it found {point['positives'] - point['missed']} of {point['positives']} abnormal cells and "
             f"cleared {point['negatives'] - point['false_alarms']} of {point['negatives']} normal ones "
             "(decision support, not a diagnosis).",
             f"  at its operating point    {_pair(point)}  ({point['missed']} abnormal called normal; "
             f"{point['rule']})"]
    for fold in site.get("per_fold", []):
        shown = {key: "n/a" if fold[key] is None else f"{fold[key]:.3f}" for key in ("sensitivity", "specificity")}
        lines.append(f"    fold: {fold['score']} >= {fold['threshold']:.3f}: sensitivity {shown['sensitivity']}"
                     f"  specificity {shown['specificity']}")
    if site.get("roc"):
        curve = site["roc"]
        lines.append(f"  ROC AUC {curve['auc']:.3f} [{curve['auc_ci'][0]:.3f}, {curve['auc_ci'][1]:.3f}]")
    if site.get("cases"):
        cases = site["cases"]
        lines.append(f"  simulated {cases['cells_per_case']}-cell cases ({cases['cases']}, {cases['abnormal_cases']} "
                     f"with 1-2 abnormal cells): {_pair(cases)}")
    by_cell = site.get("cell_rule")
    if by_cell:
        lines.append(f"  the per-cell rule instead (sensitivity >= {by_cell['operating_point']['target_sensitivity']:.2f}"
                     f" a cell): cells {_pair(by_cell['operating_point'])}"
                     + (f"; cases {_pair(by_cell['cases'])}" if by_cell.get("cases") else ""))
    return lines


def format_report(metrics: dict) -> str:
    """The metrics as a short plain-text report: each metric with its confidence interval,
    abnormal sensitivity and specificity, the ROC AUC, simulated cases, per-class recall,
    the classifier ceilings (when cross-validated) and the confusion matrix."""
    ci = metrics.get("ci", {})
    head = f"queries: {metrics['queries']}"
    if "folds" in metrics:
        groups = metrics.get("groups") or {}
        split = f"split by slide image, {groups['groups']} images" if groups.get("known") else "split by cell"
        head += f" ({metrics['folds']}-fold stratified cross-validation, {split}, seed {metrics['seed']})"
    lines = [head]
    if (metrics.get("groups") or {}).get("note"):
        lines.append(f"note: {metrics['groups']['note']}")
    if ci:
        lines.append(f"{'':16s} {'value':>5s}  {int(round(100 * metrics.get('confidence', 0.95)))}% interval")
    for key in ("top1", "precision_at_5", "majority_at_5", "map", "binary_accuracy"):
        value = metrics.get(key)
        lines.append(f"{key:16s} {'n/a' if value is None else f'{value:.3f}'}{_interval(ci, key)}")
    if "abnormal" in metrics:
        lines += _abnormal_lines(metrics)
    ceilings = metrics.get("ceilings") or {}
    per_class = metrics["per_class"]
    lines.append("")
    lines.append("recall per class (majority@5" + "".join(f" | {name}" for name in ceilings) + "):")
    for label, row in per_class.items():
        cells = [f"{row['majority_at_5']:.3f}{_interval(row, 'recall_ci')}"]
        cells += [f"{c['per_class'][label]['recall']:.3f}" for c in ceilings.values() if label in c["per_class"]]
        lines.append(f"  {label[:21]:21s} n={row['n']:<4d} " + " | ".join(cells))
    if ceilings:
        lines.append("")
        lines.append("classifier ceiling on the same folds and representation (accuracy = its top1; "
                     f"retrieval's majority@5: {metrics['majority_at_5']:.3f}):")
        for name, c in ceilings.items():
            binary = "n/a" if c["binary_accuracy"] is None else f"{c['binary_accuracy']:.3f}"
            lines.append(f"  {name:20s} accuracy {c['accuracy']:.3f}{_interval(c['ci'], 'accuracy')}"
                         f"  binary {binary}{_interval(c['ci'], 'binary_accuracy')}")
    confusion = metrics["confusion"]
    labels = confusion["labels"]
    short = [label[:10] for label in labels]
    lines.append("")
    lines.append(f"confusion ({confusion['rows']} x {confusion['columns']}):")
    lines.append(" " * 22 + " ".join(f"{s:>10s}" for s in short))
    for label, row in zip(labels, confusion["matrix"]):
        lines.append(f"{label[:21]:21s} " + " ".join(f"{c:10d}" for c in row))
    return "\n".join(lines)
