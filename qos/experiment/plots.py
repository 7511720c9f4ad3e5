"""The figures of a report, drawn with matplotlib from the raw data only (the cells report.py
built from OUT/runs/*.json, and for the time series the run files themselves).

    fig7_mean_LINK_CLASS       mean completion time vs competing traffic, a line per unshaped
                               strategy, 95% t-interval of the mean (the study's Figure 7)
    fig8_std_LINK_CLASS        standard deviation of the same runs, 95% chi-square CI (Figure 8)
    fig9_shaping_LINK_CLASS    WFQ with the competing traffic shaped 4000..200 kbit/s (Figure 9)
    ratio_LINK_CLASS           mean completion time / lower bound, every strategy
    box_LINK_CLASS             box plots of every strategy at every level
    cdf_LINK_CLASS             CDF of completion time per strategy at the highest level
    tradeoff_LINK_CLASS        at the highest level, per strategy: the case's 95th percentile
                               against the goodput it leaves to the competing traffic
    timeseries_LINK_CLASS      one run per strategy at the highest level: the competing traffic
                               the targets received during the case, and when each site answered
                               (runs that recorded samples: runner.CompetingSampler)
    links_CLASS                with a delay sweep: mean time and throughput against delay, per MTU

Every figure says in its caption (the text under the axes) what its points and error bars
are and how many runs each holds. Each strategy keeps one colour, marker and line style in
every figure (readable in greyscale). The competing-traffic axis is base-2 symlog: linear
between 0 and 1, logarithmic (base 2) above, so 0 sits one decade-width left of 1 and
1, 2, 4, 8, 16 are evenly spaced; its ticks are the levels run.

Each figure is written as PNG and SVG.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from qos.experiment.spec import competing_unit  # noqa: E402
from qos.experiment.stats import std_interval, summarise  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 3, 2, 3)))
COLOURS = plt.get_cmap("tab10").colors
CI_TEXT = "Error bars: 95% t-interval of the mean (Student's t, n - 1 degrees of freedom; none where n < 2)."
STD_CI_TEXT = ("Error bars: 95% chi-square interval of the standard deviation (normal theory, n - 1 degrees "
               "of freedom; none where n < 2).")


def symlog_text(linthresh: float) -> str:
    return f"Competing traffic on a base-2 symlog axis (linear from 0 to {linthresh:g}, log2 above)."


def linear_part(levels: list[float]) -> float:
    """Where the competing axis turns from linear to log2: the lowest level above 0 (1 for counts)."""
    positive = [lv for lv in levels if lv > 0]
    return min(positive) if positive else 1.0


def style(index: int) -> dict:
    """Colour, marker and line style of the `index`-th strategy; no two of the first 12 alike
    in marker, and consecutive ones differ in line style too."""
    return {"color": COLOURS[index % len(COLOURS)], "marker": MARKERS[index % len(MARKERS)],
            "linestyle": LINESTYLES[index % len(LINESTYLES)]}


def _save(fig: Figure, folder: Path, stem: str) -> list[Path]:
    paths = [folder / f"{stem}.png", folder / f"{stem}.svg"]
    for p in paths:
        fig.savefig(p, dpi=150)
    plt.close(fig)
    return paths


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)


def caption(fig: Figure, text: str) -> None:
    """Write `text` as `fig`'s caption, under everything drawn: the figure's supxlabel, left-aligned
    and wrapped to the figure's width, so that constrained layout makes room for it (one
    layout per save, no tight-bbox pass). Also kept as `fig.caption` for whoever checks it."""
    fig.caption = text
    width_chars = max(40, int(fig.get_size_inches()[0] * 14.5))
    fig.supxlabel(textwrap.fill(" ".join(text.split()), width_chars), x=0.01, ha="left",
                  fontsize="small", gid="caption")


def n_text(counts: list[int]) -> str:
    """'n = 10 runs per point' or 'n = 3-10 runs per point (see report)'."""
    counts = sorted(set(counts))
    if not counts:
        return "n = 0"
    if len(counts) == 1:
        return f"n = {counts[0]} run{'s' if counts[0] != 1 else ''} per point"
    return f"n = {counts[0]}-{counts[-1]} runs per point"


def level_axis(ax, levels: list[float], unit: str) -> None:
    """A competing-traffic x axis: base-2 symlog, linear up to the lowest level above 0 (so that
    0 has its own place), ticks at the levels run."""
    linthresh = linear_part(levels)
    ax.set_xscale("symlog", base=2, linthresh=linthresh, linscale=0.5)
    ax.set_xticks(levels, [f"{lv:g}" for lv in levels])
    ax.minorticks_off()
    ax.set_xlabel(f"competing traffic ({unit} per target; symlog base 2)")
    if levels:
        top = max(levels)
        ax.set_xlim(-0.3 * linthresh, top * 1.25 if top > 0 else 1)


def describe_link(meta: dict, link: str) -> str:
    """A link's name in words, e.g. "the study's 2002 network (10 Mbit/s hubs)"."""
    for item in meta["experiment"]["links"]:
        if item["name"] == link:
            rate = f"{item['core_kbit'] / 1000:g} Mbit/s"
            if item.get("network") == "2002":
                text = f"the study's 2002 network ({rate} half-duplex hubs)"
            else:
                text = f"a {rate} core link"
            if item.get("delay_ms"):
                text += f", {item['delay_ms']:g} ms one-way delay"
            return text
    return f"link {link}"


def _series(cells, strategy, levels, link, cls, stat: str, seed: int = 0):
    xs, ys, lo, hi, ns = [], [], [], [], []
    for lv in levels:
        cell = cells.get((strategy, lv, link, cls))
        if cell is None or not cell.times:
            continue
        s = summarise(cell.times)
        if stat == "mean":
            value, low, high = s.mean, s.ci_low, s.ci_high
        elif stat == "std":
            value, (low, high) = s.std, std_interval(cell.times)
        else:
            r = summarise(cell.ratios)
            value, low, high = r.mean, r.ci_low, r.ci_high
        if not np.isfinite(value):
            continue
        xs.append(lv)
        ys.append(value)
        lo.append(value - low if np.isfinite(low) else 0.0)
        hi.append(high - value if np.isfinite(high) else 0.0)
        ns.append(s.n)
    return xs, ys, lo, hi, ns


def dodge(xs: list[float], slot: int, slots: int, linthresh: float = 1.0, step: float = 0.035) -> list[float]:
    """`xs` nudged sideways for the `slot`-th of `slots` series on the symlog axis, so that error
    bars at one level do not hide each other: a factor of 2**(step x offset) in the log part,
    an offset of about the same width in the linear part below `linthresh`."""
    offset = step * (slot - (slots - 1) / 2)
    return [x * 2 ** offset if x >= linthresh else x + offset * linthresh for x in xs]


def _line(ax, cells, strategy, levels, link, cls, stat: str, label: str, index: int, seed: int,
          slot: int = 0, slots: int = 1) -> list[int]:
    xs, ys, lo, hi, ns = _series(cells, strategy, levels, link, cls, stat, seed)
    if xs:
        xs = dodge(xs, slot, slots, linear_part(levels))
        bars = [lo, hi]
        ax.errorbar(xs, ys, yerr=bars, capsize=3, label=label, markersize=6, linewidth=1.4,
                    markerfacecolor="white" if index % 2 else None, **style(index))
    return ns


def _names(meta: dict) -> list[str]:
    return [s["name"] for s in meta["experiment"]["strategies"]]


def figure_level_lines(meta: dict, cells: dict, link: str, cls: str, stat: str, strategies: list[str],
                       title: str, labels: dict[str, str] | None = None) -> Figure:
    """Mean (stat="mean"), std ("std") or mean ratio to the bound ("ratio") of completion time
    against the competing level, a line per strategy, with its caption."""
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
    order = _names(meta)
    seed = int(meta.get("seed") or 0)
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    counts: list[int] = []
    for slot, name in enumerate(strategies):
        counts += _line(ax, cells, name, levels, link, cls, stat, (labels or {}).get(name, name),
                        order.index(name) if name in order else len(order), seed, slot, len(strategies))
    level_axis(ax, levels, unit)
    ylabel = {"mean": "mean completion time of a case (s)",
              "std": "standard deviation of completion time (s)",
              "ratio": "mean completion time / physical lower bound"}[stat]
    ax.set_ylabel(ylabel)
    top = ax.get_ylim()[1]
    ax.set_ylim(0, top * 1.08 if top > 0 else 1)
    if stat == "ratio":
        ax.axhline(1.0, color="grey", linestyle=":", linewidth=1, label="lower bound")
    ax.set_title(textwrap.fill(title, 62) + f"\n{describe_link(meta, link)}, {cls} class", fontsize="medium")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", title="strategy")
    what = {"mean": "Each point: the mean completion time of the runs of one cell.",
            "std": "Each point: the sample standard deviation (ddof = 1) of the completion times of "
                   "one cell's runs.",
            "ratio": "Each point: the mean over runs of completion time / that run's physical lower bound."}[stat]
    nudged = " Points at one level are nudged sideways so that their bars do not overlap." if len(strategies) > 1 else ""
    caption(fig, " ".join([what, n_text(counts) + ".", CI_TEXT if stat != "std" else STD_CI_TEXT,
                           symlog_text(linear_part(levels)) + nudged]))
    return fig


def figure_box(meta: dict, cells: dict, link: str, cls: str) -> Figure:
    """Box plots of completion time, a panel per competing level, y axis from 0."""
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
    present = [n for n in _names(meta) if any((n, lv, link, cls) in cells for lv in levels)]
    fig, axes = plt.subplots(1, len(levels), figsize=(max(4.5, 2.6 + 0.45 * len(present) * len(levels)), 4.4),
                             sharey=True, squeeze=False, layout="constrained")
    counts: list[int] = []
    for ax, lv in zip(axes[0], levels):
        names = [n for n in present if cells.get((n, lv, link, cls)) and cells[(n, lv, link, cls)].times]
        if names:
            data = [cells[(n, lv, link, cls)].times for n in names]
            counts += [len(d) for d in data]
            ax.boxplot(data, whis=(0, 100), medianprops={"color": "black"})
            ax.set_xticks(range(1, len(names) + 1), names, rotation=60, fontsize="small")
        ax.set_title(f"{lv:g} {unit}", fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].set_ylabel("completion time of a case (s)")
    axes[0][0].set_ylim(bottom=0)
    fig.suptitle(f"Completion time per strategy at each level of competing traffic\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    caption(fig, f"Boxes: quartiles and median of one cell's runs; whiskers: minimum and maximum. "
                 f"{n_text(counts)}. The time axis starts at 0.")
    return fig


def figure_cdf(meta: dict, cells: dict, link: str, cls: str) -> Figure:
    """Empirical CDF of completion time per strategy at the highest level, axes from 0."""
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
    top = levels[-1]
    fig, ax = plt.subplots(figsize=(6.4, 4.2), layout="constrained")
    counts: list[int] = []
    for index, name in enumerate(_names(meta)):
        cell = cells.get((name, top, link, cls))
        if cell and cell.times:
            x = np.sort(cell.times)
            counts.append(x.size)
            st = style(index)
            ax.step(np.concatenate([[0.0], x]), np.arange(0, x.size + 1) / x.size, where="post", label=name,
                    color=st["color"], linestyle=st["linestyle"])
            ax.plot(x, np.arange(1, x.size + 1) / x.size, linestyle="none", marker=st["marker"],
                    color=st["color"], markersize=5)
    ax.set_xlim(left=0)
    ax.set_ylim(0, 1.02)
    ax.set(xlabel="completion time of a case (s)", ylabel="fraction of runs finished")
    ax.set_title(f"Distribution of completion time at {top:g} competing {unit} per target\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", title="strategy")
    caption(fig, f"Empirical CDF: the fraction of a cell's runs finished by each time (a marker per run). "
                 f"{n_text(counts)}. Both axes start at 0.")
    return fig


def figure_tradeoff(meta: dict, cells: dict, link: str, cls: str) -> Figure | None:
    """At the highest competing level, per strategy: the 95th percentile of the case's
    completion time against the competing traffic's goodput during the cases (what the
    strategy leaves to the others). None when that level carried no competing traffic."""
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
    top = levels[-1] if levels else 0
    points = []
    for index, name in enumerate(_names(meta)):
        cell = cells.get((name, top, link, cls))
        if cell and cell.times and cell.achieved_kbit:
            points.append((index, name, float(np.mean(cell.achieved_kbit)) / 1000,
                           float(np.percentile(cell.times, 95)), len(cell.times)))
    if top <= 0 or not points:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.4), layout="constrained")
    for index, name, goodput, p95, _ in points:
        st = style(index)
        ax.plot([goodput], [p95], linestyle="none", marker=st["marker"], color=st["color"], markersize=8,
                label=name)
    # Both axes from 0 with room past the largest point, so a marker at the edge is whole.
    ax.set_xlim(0, max(p[2] for p in points) * 1.06 or 1)
    ax.set_ylim(0, max(p[3] for p in points) * 1.08 or 1)
    ax.set(xlabel="competing traffic's goodput during the cases (Mbit/s)",
           ylabel="95th percentile of a case's completion time (s)")
    ax.set_title(f"What each strategy costs the competing traffic, at {top:g} {unit} per target\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small", title="strategy")
    caption(fig, "Each point: one strategy; x the mean over its runs of the competing traffic the targets "
                 "received during the case, y the 95th percentile of its completion times (numpy, linear "
                 f"interpolation: with few runs it lies near the slowest). {n_text([p[4] for p in points])}. "
                 "Lower right is better for both. No error bars. Both axes start at 0.")
    return fig


def timeseries_runs(meta: dict, records: list[dict], link: str, cls: str) -> dict[str, dict]:
    """One successful run per strategy at the highest competing level that recorded samples:
    the first in the experiment's run order."""
    position = {rid: i for i, rid in enumerate(meta.get("order", []))}
    picked: dict[str, dict] = {}
    usable = [r for r in records if r.get("ok") and r["run"]["link"] == link and r["run"]["request_class"] == cls
              and len(r.get("competing", {}).get("samples") or []) >= 2]
    if not usable:
        return picked
    top = max(float(r["run"]["competing"]) for r in usable)
    for rec in sorted(usable, key=lambda r: position.get(r["run"]["run_id"], 1 << 30)):
        if float(rec["run"]["competing"]) == top:
            picked.setdefault(rec["run"]["strategy"], rec)
    return picked


def figure_timeseries(meta: dict, picked: dict[str, dict], link: str, cls: str) -> Figure:
    """For each strategy's picked run: the competing traffic received during the case (kbit/s
    per sampling interval) and the moments each site answered and the case finished."""
    names = [n for n in _names(meta) if n in picked]
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    fig, axes = plt.subplots(len(names), 1, figsize=(6.8, 1.9 * len(names) + 1.2), sharex=True, squeeze=False,
                             layout="constrained")
    order = _names(meta)
    longest = 0.0
    for ax, name in zip(axes[:, 0], names):
        rec = picked[name]
        samples = np.asarray(rec["competing"]["samples"], dtype=np.float64)
        t, b = samples[:, 0], samples[:, 1]
        dt = np.diff(t)
        keep = dt > 0
        rate = np.diff(b)[keep] * 8 / 1000 / dt[keep]  # kbit/s over each interval
        st = style(order.index(name))
        ax.step(t[1:][keep], rate, where="pre", color=st["color"], linestyle=st["linestyle"],
                label="competing traffic received")
        completion = float(rec["completion_s"])
        longest = max(longest, completion, float(t[-1]))
        ax.axvspan(0, completion, color="grey", alpha=0.12, label="the case")
        for site in rec.get("sites", []):
            if site.get("total_s") is not None:
                ax.axvline(float(site["total_s"]), color="black", linestyle=":", linewidth=1)
                ax.text(float(site["total_s"]), 1.0, f" {site['site']}", transform=ax.get_xaxis_transform(),
                        fontsize="x-small", va="top")
        ax.set_ylim(0, max(1.0, float(rate.max()) if rate.size else 0.0) * 1.15)
        ax.set_ylabel("kbit/s", fontsize="small")
        ax.set_title(f"{name}: run {rec['run']['run_id']}, case {completion:.2f} s", fontsize="small", loc="left")
        ax.grid(True, alpha=0.3)
    axes[-1, 0].set_xlim(0, longest * 1.05 if longest else 1)
    axes[-1, 0].set_xlabel("time since the case was submitted (s)")
    axes[0, 0].legend(fontsize="x-small", loc="lower right")
    level = float(next(iter(picked.values()))["run"]["competing"]) if picked else 0
    fig.suptitle(f"The case against the competing traffic, one run per strategy at {level:g} {unit} per target\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    every = np.median([np.median(np.diff(np.asarray(r['competing']['samples'])[:, 0])) for r in picked.values()])
    caption(fig, f"Line: the bytes the competing targets' interfaces received per sampling interval "
                 f"(~{every:.2f} s), as kbit/s; shaded: the case, from submission to its last reply; dotted: "
                 f"when each site's reply arrived. One run per strategy (n = 1 per panel), the first at this "
                 f"level in the run order.")
    return fig


def write_figures(meta: dict, cells: dict, folder: Path, records: list[dict] | None = None) -> list[Path]:
    """Draw every figure that the experiment's matrix supports; returns the files written.

    `records` (the run files) give the time series; without them it is left out.
    """
    strategies = meta["experiment"]["strategies"]
    unshaped = [s["name"] for s in strategies if s.get("shape_kbit") is None]
    shaped = sorted((s for s in strategies if s.get("shape_kbit") is not None), key=lambda s: -s["shape_kbit"])
    written: list[Path] = []
    pairs = sorted({(k[2], k[3]) for k in cells})
    for link, cls in pairs:
        levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
        tag = _safe(f"{link}_{cls}")
        present = [s["name"] for s in strategies if any((s["name"], lv, link, cls) in cells for lv in levels)]
        if len(levels) > 1:
            written += _save(figure_level_lines(
                meta, cells, link, cls, "mean", unshaped,
                "Mean completion time of a PathMaster case vs competing traffic (the study's Figure 7)"),
                folder, f"fig7_mean_{tag}")
            written += _save(figure_level_lines(
                meta, cells, link, cls, "std", unshaped,
                "Standard deviation of completion time vs competing traffic (the study's Figure 8)"),
                folder, f"fig8_std_{tag}")
            if shaped:
                base = [s["name"] for s in strategies if s["discipline"] == shaped[0]["discipline"]
                        and s.get("shape_kbit") is None]
                labels = {n: f"{n}, competing unshaped" for n in base}
                labels |= {s["name"]: f"competing shaped to {s['shape_kbit']:g} kbit/s" for s in shaped}
                written += _save(figure_level_lines(
                    meta, cells, link, cls, "mean", base + [s["name"] for s in shaped],
                    f"Mean completion time with the competing traffic shaped, under "
                    f"{shaped[0]['discipline'].upper()} (the study's Figure 9)", labels),
                    folder, f"fig9_shaping_{tag}")
            written += _save(figure_level_lines(
                meta, cells, link, cls, "ratio", present,
                "Completion time as a multiple of the physical lower bound"), folder, f"ratio_{tag}")
        written += _save(figure_box(meta, cells, link, cls), folder, f"box_{tag}")
        written += _save(figure_cdf(meta, cells, link, cls), folder, f"cdf_{tag}")
        tradeoff = figure_tradeoff(meta, cells, link, cls)
        if tradeoff is not None and len(present) > 1:
            written += _save(tradeoff, folder, f"tradeoff_{tag}")
        picked = timeseries_runs(meta, records or [], link, cls)
        if picked:
            written += _save(figure_timeseries(meta, picked, link, cls), folder, f"timeseries_{tag}")

    links = meta["experiment"]["links"]
    if len(links) > 1 and len({item["delay_ms"] for item in links}) > 1:
        written += _delay_sweep(meta, cells, folder)
    return written


def _delay_sweep(meta: dict, cells: dict, folder: Path) -> list[Path]:
    """A delay sweep (seed 002): time and throughput against one-way delay, a line per
    (core rate, MTU, strategy, level), log-log so a round-trip bound shows as a slope."""
    strategies = meta["experiment"]["strategies"]
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    groups: dict[tuple, list[dict]] = {}
    for item in meta["experiment"]["links"]:
        groups.setdefault((item["core_kbit"], item["mtu"]), []).append(item)
    written: list[Path] = []
    for cls in sorted({k[3] for k in cells}):
        fig, (ax_t, ax_r) = plt.subplots(1, 2, figsize=(11, 4.4), layout="constrained")
        index, counts = 0, []
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
                    counts += [len(c.times) for _, c in picked]
                    ax_t.plot(xs, [np.mean(c.times) for _, c in picked], label=label, **style(index))
                    ax_r.plot(xs, [np.mean(c.throughput_kbit) for _, c in picked], label=label, **style(index))
                    index += 1
        for ax in (ax_t, ax_r):
            ax.set(xscale="log", yscale="log", xlabel="one-way delay between subnets (ms, log scale)")
            ax.grid(True, which="both", alpha=0.3)
        ax_t.set(ylabel="mean completion time of a case (s, log scale)")
        ax_t.set_title(f"Completion time vs delay, {cls} class", fontsize="medium")
        ax_r.set(ylabel="effective case throughput (kbit/s, log scale)")
        ax_r.set_title("Case bytes / completion time vs delay", fontsize="medium")
        ax_t.legend(fontsize="x-small")
        caption(fig, f"Each point: the mean over one cell's runs; no error bars. {n_text(counts)}.")
        written += _save(fig, folder, f"links_{_safe(cls)}")
    return written
