"""The figures of a report, drawn with matplotlib from the cells that report.py built.

    fig7_mean_LINK_CLASS       mean completion time vs competing traffic, one line per
                               unshaped strategy, 95% CI bars (the study's Figure 7)
    fig8_std_LINK_CLASS        standard deviation of the same (Figure 8)
    fig9_shaping_LINK_CLASS    WFQ with the competing traffic shaped 4000..200 kbit/s (Figure 9)
    ratio_LINK_CLASS           mean completion time / lower bound, every strategy
    box_LINK_CLASS             box plots of every strategy at every level
    cdf_LINK_CLASS             CDF of completion time per strategy at the highest level
    links_CLASS                with a delay sweep: mean time and throughput against delay, per MTU

Each is written as PNG and SVG.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from qos.experiment.spec import competing_unit  # noqa: E402
from qos.experiment.stats import summarise  # noqa: E402


def _save(fig, folder: Path, stem: str) -> list[Path]:
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    fig.tight_layout()
    for p in paths:
        fig.savefig(p, dpi=120)
    plt.close(fig)
    return paths


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


def _line(ax, cells, strategy, levels, link, cls, stat: str, label: str) -> None:
    xs, ys, lo, hi = [], [], [], []
    for lv in levels:
        cell = cells.get((strategy, lv, link, cls))
        if cell is None or not cell.times:
            continue
        s = summarise(cell.times)
        value = {"mean": s.mean, "std": s.std, "ratio": float(np.mean(cell.ratios))}[stat]
        xs.append(lv)
        ys.append(value)
        lo.append(s.mean - s.ci_low if stat == "mean" and s.n > 1 else 0.0)
        hi.append(s.ci_high - s.mean if stat == "mean" and s.n > 1 else 0.0)
    if xs:
        ax.errorbar(xs, ys, yerr=[lo, hi] if stat == "mean" else None, marker="o", capsize=3, label=label)


def write_figures(meta: dict, cells: dict, folder: Path) -> list[Path]:
    """Draw every figure that the experiment's matrix supports; returns the files written."""
    strategies = meta["experiment"]["strategies"]
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    xlabel = f"competing traffic ({unit})"
    unshaped = [s["name"] for s in strategies if s.get("shape_kbit") is None]
    shaped = sorted((s for s in strategies if s.get("shape_kbit") is not None), key=lambda s: -s["shape_kbit"])
    written: list[Path] = []
    pairs = sorted({(k[2], k[3]) for k in cells})
    for link, cls in pairs:
        levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
        tag = _safe(f"{link}_{cls}")
        present = [s["name"] for s in strategies if any((s["name"], lv, link, cls) in cells for lv in levels)]
        if len(levels) > 1:
            for stat, stem, ylabel in (("mean", "fig7_mean", "mean completion time (s)"),
                                       ("std", "fig8_std", "std of completion time (s)")):
                fig, ax = plt.subplots(figsize=(6, 4))
                for name in unshaped:
                    _line(ax, cells, name, levels, link, cls, stat, name)
                ax.set(xlabel=xlabel, ylabel=ylabel, title=f"{stem.split('_')[0]}: {link}, {cls}")
                ax.legend()
                written += _save(fig, folder, f"{stem}_{tag}")
            if shaped:
                fig, ax = plt.subplots(figsize=(6, 4))
                base = [s["name"] for s in strategies if s["discipline"] == shaped[0]["discipline"]
                        and s.get("shape_kbit") is None]
                for name in base:
                    _line(ax, cells, name, levels, link, cls, "mean", f"{name} (unshaped)")
                for s in shaped:
                    _line(ax, cells, s["name"], levels, link, cls, "mean", f"shaped to {s['shape_kbit']:g} kbit/s")
                ax.set(xlabel=xlabel, ylabel="mean completion time (s)", title=f"fig9: shaping, {link}, {cls}")
                ax.legend(fontsize="small")
                written += _save(fig, folder, f"fig9_shaping_{tag}")
            fig, ax = plt.subplots(figsize=(6, 4))
            for name in present:
                _line(ax, cells, name, levels, link, cls, "ratio", name)
            ax.axhline(1.0, color="grey", linestyle=":", label="lower bound")
            ax.set(xlabel=xlabel, ylabel="completion time / lower bound", title=f"ratio to bound: {link}, {cls}")
            ax.legend(fontsize="small")
            written += _save(fig, folder, f"ratio_{tag}")

        fig, axes = plt.subplots(1, len(levels), figsize=(max(4, 3.2 * len(levels)), 4), sharey=True, squeeze=False)
        for ax, lv in zip(axes[0], levels):
            names = [n for n in present if cells.get((n, lv, link, cls)) and cells[(n, lv, link, cls)].times]
            if names:
                ax.boxplot([cells[(n, lv, link, cls)].times for n in names])
                ax.set_xticks(range(1, len(names) + 1), names, rotation=60, fontsize="small")
            ax.set_title(f"{lv:g} {unit}")
        axes[0][0].set_ylabel("completion time (s)")
        written += _save(fig, folder, f"box_{tag}")

        top = levels[-1]
        fig, ax = plt.subplots(figsize=(6, 4))
        for name in present:
            cell = cells.get((name, top, link, cls))
            if cell and cell.times:
                x = np.sort(cell.times)
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=name)
        ax.set(xlabel="completion time (s)", ylabel="fraction of runs", title=f"CDF at {top:g} {unit}: {link}, {cls}")
        ax.legend(fontsize="small")
        written += _save(fig, folder, f"cdf_{tag}")

    links = meta["experiment"]["links"]
    if len(links) > 1 and len({item["delay_ms"] for item in links}) > 1:
        # A delay sweep (seed 002): time and throughput against one-way delay, a line per
        # (core rate, MTU, strategy, level), log-log so a round-trip bound shows as a slope.
        groups: dict[tuple, list[dict]] = {}
        for item in links:
            groups.setdefault((item["core_kbit"], item["mtu"]), []).append(item)
        for cls in sorted({k[3] for k in cells}):
            fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4))
            for (core, mtu), members in groups.items():
                members = sorted(members, key=lambda item: item["delay_ms"])
                for name in [s["name"] for s in strategies]:
                    for lv in sorted({k[1] for k in cells}):
                        picked = [(item["delay_ms"], cells[(name, lv, item["name"], cls)]) for item in members
                                  if (name, lv, item["name"], cls) in cells and cells[(name, lv, item["name"], cls)].times]
                        if not picked:
                            continue
                        label = f"{name}, MTU {mtu}, {core:g} kbit/s" + (f", {lv:g} {unit}" if lv else "")
                        xs = [d for d, _ in picked]
                        ax_t.plot(xs, [np.mean(c.times) for _, c in picked], marker="o", label=label)
                        ax_r.plot(xs, [np.mean(c.throughput_kbit) for _, c in picked], marker="o", label=label)
            for ax in (ax_t, ax_r):
                ax.set(xscale="log", yscale="log", xlabel="one-way delay between subnets (ms)")
            ax_t.set(ylabel="mean completion time (s)", title=f"delay sweep, {cls}")
            ax_r.set(ylabel="effective case throughput (kbit/s)")
            ax_t.legend(fontsize="small")
            written += _save(fig, folder, f"links_{_safe(cls)}")
    return written
