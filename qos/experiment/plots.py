"""The figures of a report, drawn with matplotlib from the raw data only (the cells report.py
built from OUT/runs/*.json, and for the time series the run files themselves).

    fig7_mean_LINK_CLASS       mean completion time vs competing traffic, a line per unshaped
                               strategy, 95% t-interval of the mean (the study's Figure 7, plus
                               the disciplines it did not draw, e.g. CBWFQ)
    fig8_std_LINK_CLASS        standard deviation of the same runs, 95% Bonett interval (skewed
                               cells: stats.std_interval_skewed) (Figure 8, plus the same)
    fig9_shaping_LINK_CLASS    the competing traffic shaped 4000..200 kbit/s, a panel per limit
                               against the same discipline unshaped (Figure 9)
    ratio_LINK_CLASS           mean completion time / lower bound, every strategy
    box_LINK_CLASS             box plots of every strategy, a panel per level (3 a row), n per box
    cdf_LINK_CLASS             CDF of completion time at the highest level, a panel per group
    tradeoff_LINK_CLASS        at the highest level, per strategy: the case's mean time against
                               the competing frames received, both with 95% t-intervals, and
                               the same numbers in a table beside it (the points crowd)
    timeseries_LINK_CLASS      the median run (by completion time) per strategy at the highest
                               level: the competing traffic
                               the targets received during the case, and when each site answered
                               (runs that recorded samples: runner.CompetingSampler)
    links_CLASS                with a delay sweep: mean time and throughput against delay, per MTU

Every figure says in its caption (the text under the axes) what its points and error bars
are and how many runs each holds. A sweep of fewer than three levels is drawn as points per
level, not as the study's curves, and is not titled as the study's figure. Each strategy keeps one colour, marker and line style in
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
from qos.experiment.stats import BONETT_MIN_N, std_interval_skewed, summarise  # noqa: E402

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*", "p")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 3, 2, 3)))
COLOURS = plt.get_cmap("tab10").colors
CI_TEXT = "Error bars: 95% t-interval of the mean (Student's t, n - 1 degrees of freedom; none where n < 2)."
STD_CI_TEXT = ("Error bars: 95% Bonett interval of the standard deviation (the chi-square interval widened by "
               "the cell's kurtosis, for skewed cells, where the normal-theory chi-square interval and a "
               f"bootstrap are too narrow; none where n < {BONETT_MIN_N}).")


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


STUDY_FORM_MIN_LEVELS = 3  # fewer levels are not the study's curves: points per level, no lines


def study_form(levels: list[float]) -> bool:
    """Whether a sweep has enough levels to be drawn as the study's curves (else grouped points)."""
    return len(levels) >= STUDY_FORM_MIN_LEVELS


def level_axis(ax, levels: list[float], unit: str) -> None:
    """A competing-traffic x axis: base-2 symlog, linear up to the lowest level above 0 (so that
    0 has its own place), ticks at the levels run; with fewer than STUDY_FORM_MIN_LEVELS
    levels, one category per level (positions 0, 1, ...)."""
    if not study_form(levels):
        ax.set_xticks(range(len(levels)), [f"{lv:g}" for lv in levels])
        ax.set_xlim(-0.6, len(levels) - 0.4)
        ax.set_xlabel(f"competing traffic ({unit} per target)")
        return
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
            value, (low, high) = s.std, std_interval_skewed(cell.times)
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
          slot: int = 0, slots: int = 1, step: float = 0.035, colour=None) -> list[int]:
    xs, ys, lo, hi, ns = _series(cells, strategy, levels, link, cls, stat, seed)
    if xs:
        st = style(index) | ({"color": colour} if colour else {})
        if study_form(levels):
            xs = dodge(xs, slot, slots, linear_part(levels), step)
        else:  # categories: points side by side within each level's slot, no line between levels
            width = min(0.8 / max(slots, 1), 0.12)
            xs = [levels.index(x) + width * (slot - (slots - 1) / 2) for x in xs]
            st["linestyle"] = "none"
        ax.errorbar(xs, ys, yerr=[lo, hi], capsize=3, label=label, markersize=6, linewidth=1.4,
                    markerfacecolor="white" if index % 2 else None, **st)
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
    fig, ax = plt.subplots(figsize=(7.6, 4.4), layout="constrained")
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
    if not study_form(levels):  # not the study's curves: say so instead of naming its figure
        title = title.split(" (the study's")[0] + f" ({len(levels)} levels: points, not curves)"
    ax.set_title(textwrap.fill(title, 62) + f"\n{describe_link(meta, link)}, {cls} class", fontsize="medium")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small", title="strategy", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    what = {"mean": "Each point: the mean completion time of the runs of one cell.",
            "std": "Each point: the sample standard deviation (ddof = 1) of the completion times of "
                   "one cell's runs.",
            "ratio": "Each point: the mean over runs of completion time / that run's physical lower bound."}[stat]
    nudged = " Points at one level are nudged sideways so that their bars do not overlap." if len(strategies) > 1 else ""
    axis = symlog_text(linear_part(levels)) if study_form(levels) else "One category per level run."
    caption(fig, " ".join([what, n_text(counts) + ".", CI_TEXT if stat != "std" else STD_CI_TEXT, axis + nudged]))
    return fig


BOX_COLUMNS = 3  # box-plot panels per row: a wide sweep wraps instead of running off the page


def figure_box(meta: dict, cells: dict, link: str, cls: str) -> Figure:
    """Box plots of completion time, a panel per competing level (at most BOX_COLUMNS a row),
    each strategy's n under its box, y axis from 0."""
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
    present = [n for n in _names(meta) if any((n, lv, link, cls) in cells for lv in levels)]
    ncols = min(BOX_COLUMNS, len(levels))
    nrows = -(-len(levels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(min(11.0, 1.2 + 0.42 * len(present) * ncols), 3.4 * nrows + 0.9),
                             sharey=True, squeeze=False, layout="constrained")
    counts: list[int] = []
    for ax, lv in zip(axes.flat, levels):
        names = [n for n in present if cells.get((n, lv, link, cls)) and cells[(n, lv, link, cls)].times]
        if names:
            data = [cells[(n, lv, link, cls)].times for n in names]
            counts += [len(d) for d in data]
            ax.boxplot(data, whis=(0, 100), medianprops={"color": "black"})
            ax.set_xticks(range(1, len(names) + 1), [f"{n} ({len(d)})" for n, d in zip(names, data)],
                          rotation=60, ha="right", fontsize="x-small")
        ax.set_title(f"{lv:g} {unit} per target", fontsize="small")
        ax.grid(True, axis="y", alpha=0.3)
    for ax in list(axes.flat)[len(levels):]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("completion time (s)")
    axes[0][0].set_ylim(bottom=0)
    fig.suptitle(f"Completion time per strategy at each level of competing traffic\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    caption(fig, f"Boxes: quartiles and median of one cell's runs; whiskers: minimum and maximum; the number "
                 f"of runs of each box is in brackets after its strategy. {n_text(counts)}. No interval: the "
                 f"boxes show the runs themselves. The time axis starts at 0.")
    return fig


def figure_cdf(meta: dict, cells: dict, link: str, cls: str) -> Figure | None:
    """Empirical CDF of completion time at the highest level: a panel per group of strategies
    (queueing disciplines; shaped or adaptive), lines only, axes from 0; None when no
    strategy has a valid run there (every one kept apart as invalid, or failed)."""
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
    top = levels[-1]
    strategies = meta["experiment"]["strategies"]
    groups = [("queueing disciplines", [s["name"] for s in strategies
                                        if s.get("shape_kbit") is None and not s.get("adaptive")]),
              ("shaped or adaptive", [s["name"] for s in strategies if s.get("shape_kbit") is not None
                                      or s.get("adaptive")])]
    groups = [(title, [n for n in names if cells.get((n, top, link, cls)) and cells[(n, top, link, cls)].times])
              for title, names in groups]
    groups = [g for g in groups if g[1]]
    if not groups:
        return None
    fig, axes = plt.subplots(1, len(groups), figsize=(5.2 * len(groups) + 1.0, 4.4), sharey=True,
                             squeeze=False, layout="constrained")
    order = _names(meta)
    counts: list[int] = []
    for ax, (title, names) in zip(axes[0], groups):
        for name in names:
            x = np.sort(cells[(name, top, link, cls)].times)
            counts.append(x.size)
            st = style(order.index(name))
            ax.step(np.concatenate([[0.0], x]), np.arange(0, x.size + 1) / x.size, where="post",
                    label=f"{name} (n = {x.size})", color=st["color"], linestyle=st["linestyle"], linewidth=1.6)
        ax.set_title(title, fontsize="small")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small", loc="center left")
        ax.set_xlabel("completion time of a case (s)")
        ax.set_xlim(left=0)
    axes[0][0].set_ylim(0, 1.02)
    axes[0][0].set_ylabel("fraction of runs finished")
    fig.suptitle(f"Distribution of completion time at {top:g} competing {unit} per target\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    caption(fig, f"Empirical CDF: the fraction of a cell's runs finished by each time, one step per run. "
                 f"{n_text(counts)} (each strategy's n in its legend). No interval. Both axes start at 0.")
    return fig


CROWD_GAP = 0.05  # means closer than this share of the x axis, side by side, count as crowded


def crowded(xs: list[float], span: float, least: int = 3) -> list[int]:
    """Indices of the largest run of at least `least` values of `xs` whose neighbours (sorted)
    lie within CROWD_GAP x `span` of each other; [] when none crowd."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    best: list[int] = []
    run: list[int] = []
    for i in order:
        run = run + [i] if run and xs[i] - xs[run[-1]] <= CROWD_GAP * span else [i]
        best = run if len(run) > len(best) else best
    return best if len(best) >= least else []


def _tradeoff_points(ax, points, size: float) -> None:
    for index, name, x, y, xs, ys in points:
        st = style(index)
        if xs.size == ys.size:
            ax.plot(xs, ys, linestyle="none", marker=st["marker"], color=st["color"], markersize=3, alpha=0.3)
        ax.errorbar([x.mean], [y.mean], xerr=[[x.mean - x.ci_low], [x.ci_high - x.mean]],
                    yerr=[[y.mean - y.ci_low], [y.ci_high - y.mean]], linestyle="none", marker=st["marker"],
                    color=st["color"], markersize=size, capsize=3, label=f"{name} (n = {y.n})")


def figure_tradeoff(meta: dict, cells: dict, link: str, cls: str) -> Figure | None:
    """At the highest competing level, per strategy: the case's mean completion time against the
    competing traffic the targets received during the cases, each with its 95% t-interval, the
    runs behind each mean drawn faintly; where three or more means crowd together (`crowded`),
    a second panel zooms into them; under both, a table of the same means and intervals. None
    when that level carried no competing traffic.

    A zoom and a table rather than labels or jitter: the crowded strategies' intervals overlap
    in both directions, so no placement of labels separates them, and moving a point would
    misstate its mean; the zoom shows their order, the table their numbers."""
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
    top = levels[-1] if levels else 0
    points = []
    for index, name in enumerate(_names(meta)):
        cell = cells.get((name, top, link, cls))
        if cell and len(cell.times) >= 2 and len(cell.achieved_kbit) >= 2:
            points.append((index, name, summarise(np.asarray(cell.achieved_kbit) / 1000), summarise(cell.times),
                           np.asarray(cell.achieved_kbit) / 1000, np.asarray(cell.times)))
    if top <= 0 or not points:
        return None
    x_top = max(max(p[4].max(), p[2].ci_high) for p in points) * 1.08 or 1
    crowd = [points[i] for i in sorted(crowded([p[2].mean for p in points], x_top))]
    rows = 1 + len(points)
    fig = plt.figure(figsize=(11.0 if crowd else 7.6, 4.6 + 0.22 * rows), layout="constrained")
    grid = fig.add_gridspec(2, 2 if crowd else 1, height_ratios=[4.4, 0.26 * rows + 0.2])
    ax = fig.add_subplot(grid[0, 0])
    _tradeoff_points(ax, points, 8)
    ax.set_xlim(0, x_top)
    ax.set_ylim(0, max(max(p[5].max(), p[3].ci_high) for p in points) * 1.08 or 1)
    xlabel = "competing traffic received at the targets' interfaces during the case\n(Mbit/s of Ethernet frames, headers included)"
    ax.set(xlabel=xlabel, ylabel="completion time of a case (s)")
    ax.grid(True, alpha=0.3)
    zoom_text = ""
    if crowd:
        zoom = fig.add_subplot(grid[0, 1])
        _tradeoff_points(zoom, crowd, 9)
        x_lo, x_hi = min(p[2].ci_low for p in crowd), max(p[2].ci_high for p in crowd)
        y_lo, y_hi = min(p[3].ci_low for p in crowd), max(p[3].ci_high for p in crowd)
        pad_x, pad_y = 0.15 * (x_hi - x_lo or 1), 0.15 * (y_hi - y_lo or 1)
        zoom.set_xlim(x_lo - pad_x, x_hi + pad_x)
        zoom.set_ylim(y_lo - pad_y, y_hi + pad_y)
        zoom.set(xlabel="competing traffic received (Mbit/s), zoomed", ylabel="completion time (s), zoomed")
        zoom.set_title(f"zoom: the {len(crowd)} strategies crowded at "
                       f"{min(p[2].mean for p in crowd):.1f}-{max(p[2].mean for p in crowd):.1f} Mbit/s",
                       fontsize="small")
        zoom.grid(True, alpha=0.3)
        zoom.legend(fontsize="x-small", loc="best")
        ax.indicate_inset((zoom.get_xlim()[0], zoom.get_ylim()[0], np.diff(zoom.get_xlim())[0],
                           np.diff(zoom.get_ylim())[0]), edgecolor="grey")
        zoom_text = (" Right: a zoom into the strategies whose means crowd together (its axes do not start "
                     "at 0; runs outside it are cut off); the grey box on the left marks it.")
    ax.legend(fontsize="x-small", title="strategy", loc="best")
    table_ax = fig.add_subplot(grid[1, :])
    table_ax.axis("off")

    def between(v):
        return f"{v.mean:.2f} [{v.ci_low:.2f}, {v.ci_high:.2f}]"

    table = table_ax.table(cellText=[[name, str(y.n), between(x), between(y)] for _, name, x, y, _, _ in points],
                           colLabels=["strategy", "n", "competing received, Mbit/s: mean [95% CI]",
                                      "completion time, s: mean [95% CI]"], colWidths=[0.2, 0.06, 0.37, 0.37],
                           loc="center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    for row, (index, *_rest) in enumerate(points, start=1):
        table[row, 0].get_text().set_color(style(index)["color"])
    fig.suptitle(f"What each strategy costs the competing traffic, at {top:g} {unit} per target\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    caption(fig, "Large markers: per strategy, the mean over its runs of the bytes the competing targets' "
                 "interfaces received during the case (frames with their Ethernet headers, so a little above "
                 "TCP goodput) and the mean completion time; bars: 95% t-intervals of both means. Small faint "
                 f"markers: the runs. {n_text([p[3].n for p in points])}. Lower right is better for both. "
                 f"The left panel's axes start at 0.{zoom_text} The table gives the same means and intervals.")
    return fig


def timeseries_runs(meta: dict, records: list[dict], link: str, cls: str) -> dict[str, dict]:
    """Per strategy at the highest competing level, of its successful runs that recorded
    samples: the median run by completion time (the lower middle one of an even count, so it
    is a run that happened), marked with how many it was chosen from (`"of_runs"`)."""
    usable = [r for r in records if r.get("ok") and r["run"]["link"] == link and r["run"]["request_class"] == cls
              and len(r.get("competing", {}).get("samples") or []) >= 2]
    if not usable:
        return {}
    top = max(float(r["run"]["competing"]) for r in usable)
    by_strategy: dict[str, list[dict]] = {}
    for rec in usable:
        if float(rec["run"]["competing"]) == top:
            by_strategy.setdefault(rec["run"]["strategy"], []).append(rec)
    picked = {}
    for name, runs in by_strategy.items():
        runs = sorted(runs, key=lambda r: (float(r["completion_s"]), r["run"]["run_id"]))
        picked[name] = runs[(len(runs) - 1) // 2] | {"of_runs": len(runs)}
    return picked


RATE_WINDOW_S = 2.0  # the time series' rates are over windows of at least this long


def windowed_rates(samples, window_s: float = RATE_WINDOW_S) -> tuple[np.ndarray, np.ndarray]:
    """(window end times, kbit/s) of cumulative byte `samples` [[t_s, bytes], ...] over
    consecutive windows of at least `window_s` (the last one may be shorter, if at least half;
    a run shorter than `window_s` gets one window over all of it).

    The sampler reads the counters 0.5 s apart, each reading taking a few ms of its own: over
    one interval that jitter alone makes a rate look up to ~10 % above the line's; over a
    second or more it stays within a few per cent."""
    data = np.asarray(samples, dtype=np.float64)
    ts, rates = [], []
    t0, b0 = data[0]
    span = data[-1][0] - t0
    if span <= 0:
        return np.asarray(ts), np.asarray(rates)
    window_s = min(window_s, span)  # a case shorter than a window: one rate over all of it
    for t, b in data[1:]:
        if t - t0 >= window_s:
            ts.append(t)
            rates.append((b - b0) * 8 / 1000 / (t - t0))
            t0, b0 = t, b
    t, b = data[-1]
    if t > t0 and t - t0 >= window_s / 2:
        ts.append(t)
        rates.append((b - b0) * 8 / 1000 / (t - t0))
    return np.asarray(ts), np.asarray(rates)


def _capacity_kbit(meta: dict, link: str) -> float | None:
    for item in meta["experiment"]["links"]:
        if item["name"] == link:
            return float(item["core_kbit"])
    return None


def figure_timeseries(meta: dict, picked: dict[str, dict], link: str, cls: str) -> Figure:
    """For each strategy's picked run: the competing traffic received during the case (kbit/s
    over windows of RATE_WINDOW_S), the shared segment's capacity, and the moments each site
    answered and the case finished."""
    names = [n for n in _names(meta) if n in picked]
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    fig, grid = plt.subplots(len(names) + 1, 1, figsize=(7.4, 1.8 * len(names) + 1.9), squeeze=False,
                             layout="constrained", height_ratios=[0.14] + [1.0] * len(names))
    key_ax, axes = grid[0, 0], grid[1:]  # a strip for the legend: clear of the title and of the panels
    key_ax.axis("off")
    for ax in axes[1:, 0]:
        ax.sharex(axes[0, 0])
        ax.sharey(axes[0, 0])
    for ax in axes[:-1, 0]:
        ax.tick_params(labelbottom=False)  # one time axis, under the last panel
    order = _names(meta)
    capacity = _capacity_kbit(meta, link)
    longest, highest = 0.0, capacity or 1.0
    for ax, name in zip(axes[:, 0], names):
        rec = picked[name]
        t, rate = windowed_rates(rec["competing"]["samples"])
        st = style(order.index(name))
        if t.size:  # each rate drawn over its own window, from the first sample on
            start = float(rec["competing"]["samples"][0][0])
            ax.step(np.r_[start, t], np.r_[rate[0], rate], where="pre", color=st["color"],
                    linestyle=st["linestyle"], label="competing received")
            highest = max(highest, float(rate.max()))
        if capacity:
            ax.axhline(capacity, color="grey", linestyle="--", linewidth=1, label="segment capacity")
        completion = float(rec["completion_s"])
        longest = max(longest, completion, float(t[-1]) if t.size else 0.0)
        ax.axvspan(0, completion, color="grey", alpha=0.12, label="the case")
        answered = sorted((float(x["total_s"]), x["site"]) for x in rec.get("sites", []) if x.get("total_s") is not None)
        for i, (when, site) in enumerate(answered):
            ax.axvline(when, color="black", linestyle=":", linewidth=1)
            ax.text(when, 0.97 - 0.16 * (i % 3), f" {site}", transform=ax.get_xaxis_transform(),
                    fontsize="x-small", va="top", ha="left",
                    bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 0.5})
        ax.set_ylabel("kbit/s", fontsize="small")
        ax.set_title(f"{name}: run {rec['run']['run_id']}, case {completion:.2f} s "
                     f"(median run of {rec.get('of_runs', 1)})", fontsize="small", loc="left")
        ax.grid(True, alpha=0.3)
    axes[0, 0].set_ylim(0, highest * 1.12)
    axes[-1, 0].set_xlim(0, longest * 1.05 if longest else 1)
    axes[-1, 0].set_xlabel("time since the case was submitted (s)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    key_ax.legend(handles, labels, loc="center", fontsize="x-small", ncols=3, frameon=False)
    level = float(next(iter(picked.values()))["run"]["competing"]) if picked else 0
    fig.suptitle(f"The case against the competing traffic, the median run per strategy at {level:g} {unit} per "
                 f"target\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    caption(fig, f"Line: the bytes the competing targets' interfaces received (Ethernet frames) per window of "
                 f"at least {RATE_WINDOW_S:g} s (a shorter case: one window over all of it), as kbit/s; dashed: the shared segment's capacity, which the "
                 f"competing traffic to both targets crosses; shaded: the case, from submission to its last "
                 f"reply; dotted: when each site's reply arrived. One run per strategy (no interval): the median "
                 f"run of n by completion time (the lower middle one when n is even) of the strategy's runs at "
                 f"this level that recorded the competing traffic, n in each panel's title.")
    return fig


def figure_shaping(meta: dict, cells: dict, link: str, cls: str) -> Figure:
    """The study's Figure 9: mean completion time against competing traffic with the competing
    traffic shaped, a panel per limit (so curves that nearly coincide do not hide each other),
    each against the same discipline unshaped (black), 95% t-intervals."""
    strategies = meta["experiment"]["strategies"]
    shaped = sorted((s for s in strategies if s.get("shape_kbit") is not None), key=lambda s: -s["shape_kbit"])
    levels = sorted({k[1] for k in cells if k[2] == link and k[3] == cls})
    unit = competing_unit(meta["experiment"]["competing"]["kind"])
    order = _names(meta)
    ncols = min(3, len(shaped))
    nrows = -(-len(shaped) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(7.0, 3.6 * ncols + 0.6), 3.3 * nrows + 1.3), sharex=True,
                             sharey=True, squeeze=False, layout="constrained")
    counts: list[int] = []
    places = set()
    baselines = 0
    for ax, s in zip(axes.flat, shaped):
        base = next((b["name"] for b in strategies if b["discipline"] == s["discipline"]
                     and b.get("shape_kbit") is None and not b.get("adaptive")), None)
        if base is not None and any((base, lv, link, cls) in cells for lv in levels):
            baselines += 1
            counts += _line(ax, cells, base, levels, link, cls, "mean", f"{base}, unshaped", order.index(base), 0, 0, 2,
                            colour="black")
        counts += _line(ax, cells, s["name"], levels, link, cls, "mean", f"shaped to {s['shape_kbit']:g} kbit/s",
                        order.index(s["name"]), 0, 1, 2)
        where = {"router": "at rA's port to the segment", "host": "at the master's card"}.get(
            s.get("shape_at"), "on every medium it crossed")
        places.add(where)
        ax.set_title(f"{s['name']}: {s['shape_kbit']:g} kbit/s, {where}", fontsize="small")
        level_axis(ax, levels, unit)
        ax.set_xlabel("")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small", loc="upper left")
    axes[-1][(ncols - 1) // 2].set_xlabel(f"competing traffic ({unit} per target)")
    for ax in list(axes.flat)[len(shaped):]:
        ax.set_visible(False)
    for ax in axes.flat:
        ax.set_ylim(bottom=0)
    axes[0][0].set_ylabel("mean completion time (s)")
    form = ("the study's Figure 9, a panel per limit" if study_form(levels)
            else f"{len(levels)} levels: points, not curves")
    fig.suptitle(f"Mean completion time with the competing traffic shaped ({form})\n"
                 f"{describe_link(meta, link)}, {cls} class", fontsize="medium")
    against = (" against the same discipline with the competing traffic unshaped (black)" if baselines else
               " (the matrix has no unshaped run of the same discipline to compare with)")
    caption(fig, f"Each panel: one shaping limit (where it was applied in its title){against}; points: the mean "
                 f"of one cell's runs. "
                 f"{n_text(counts)}. {CI_TEXT} "
                 + (symlog_text(linear_part(levels)) if study_form(levels) else "One category per level run."))
    return fig


STUDY_FIGURE_DISCIPLINES = ("fifo", "prio", "wfq", "wred")  # what the study's Figures 7 and 8 drew, at the routers


def study_figure(number: int, drawn: list[dict]) -> str:
    """"the study's Figure N", plus the strategies drawn that the study's figure did not have
    (another discipline, adaptive, or at the hosts), e.g. "the study's Figure 7, plus cbwfq"."""
    extra = [s["name"] for s in drawn if s["discipline"] not in STUDY_FIGURE_DISCIPLINES or s.get("adaptive")
             or s.get("at", "routers") != "routers"]
    return f"the study's Figure {number}" + (f", plus {', '.join(extra)}" if extra else "")


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
            drawn = [s for s in strategies if s.get("shape_kbit") is None
                     and any((s["name"], lv, link, cls) in cells for lv in levels)]
            written += _save(figure_level_lines(
                meta, cells, link, cls, "mean", unshaped,
                "Mean completion time of a PathMaster case by strategy vs competing traffic "
                f"({study_figure(7, drawn)})"), folder, f"fig7_mean_{tag}")
            written += _save(figure_level_lines(
                meta, cells, link, cls, "std", unshaped,
                f"Standard deviation of completion time by strategy vs competing traffic ({study_figure(8, drawn)})"),
                folder, f"fig8_std_{tag}")
            if shaped:
                written += _save(figure_shaping(meta, cells, link, cls), folder, f"fig9_shaping_{tag}")
            written += _save(figure_level_lines(
                meta, cells, link, cls, "ratio", present,
                "Completion time as a multiple of the physical lower bound"), folder, f"ratio_{tag}")
        written += _save(figure_box(meta, cells, link, cls), folder, f"box_{tag}")
        cdf = figure_cdf(meta, cells, link, cls)
        if cdf is not None:
            written += _save(cdf, folder, f"cdf_{tag}")
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
