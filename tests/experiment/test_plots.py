"""The report's figures, drawn from a small raw-data fixture (a metadata.json
and run files as the runner writes them), checked on the matplotlib objects: captions say what
the error bars are and n, each strategy has its own marker and line style, the competing axis
is base-2 symlog with 0 on it, figures 7-9 are titled in words, box plots and CDFs start at 0,
and the time series shows the competing traffic against the case."""

from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pytest

from qos.experiment.matrix import expand
from qos.experiment.plots import (figure_box, figure_cdf, figure_level_lines, figure_timeseries,
                                  figure_tradeoff, timeseries_runs, write_figures)
from qos.experiment.cells import load_cells
from qos.experiment.spec import parse_spec
from qos.experiment.stats import std_interval_skewed, summarise
from qos.experiment.store import FORMAT_VERSION

SPEC = {
    "experiment": {"name": "tiny", "repetitions": 5, "seed": 7},
    "competing": {"kind": "wget", "levels": [0, 1, 4, 16], "file_bytes": 2_000_000},
    "strategies": {"fifo": {"discipline": "fifo"}, "prio": {"discipline": "prio"},
                   "wfq": {"discipline": "wfq"}, "wred": {"discipline": "wred"},
                   "shape-200": {"discipline": "cbwfq", "shape_kbit": 200}},
    "links": [{"name": "hubs", "core_kbit": 10_000, "network": "2002"}],
}
SLOWDOWN = {"fifo": 1.0, "prio": 0.3, "wfq": 0.4, "wred": 0.8, "shape-200": 0.02}


@pytest.fixture(scope="module")
def raw(tmp_path_factory):
    """An experiment folder of synthetic runs: time grows with the level, per strategy."""
    out = tmp_path_factory.mktemp("raw")
    exp = parse_spec(SPEC)
    order = expand(exp)
    (out / "runs").mkdir()
    (out / "metadata.json").write_text(json.dumps({
        "format": FORMAT_VERSION, "experiment": exp.to_dict(), "fingerprint": exp.fingerprint(),
        "seed": exp.seed, "order": [r.run_id for r in order], "environment": {"git_commit": "x"}}))
    rng = np.random.default_rng(1)
    for run in order:
        t = 2.0 * (1 + SLOWDOWN[run.strategy] * run.competing) + rng.gamma(2, 0.1)
        samples = [[s, int(s * 1e6 * run.competing / 8)] for s in np.arange(0, t, 0.5)] + [[t, int(t * 1e6 * run.competing / 8)]]
        rec = {"format": FORMAT_VERSION, "run": run.to_dict(), "ok": True, "completion_s": t,
               "bytes_up": 40_000, "bytes_down": 30_000, "bound": {"total_s": 2.0},
               "sites": [{"site": "A1", "total_s": t * 0.4}, {"site": "B1", "total_s": t}],
               "competing": {"kind": "wget", "level": run.competing, "achieved_kbit": 1000.0 * run.competing,
                             "samples": samples}}
        (out / "runs" / f"{run.run_id}.json").write_text(json.dumps(rec))
    return out


@pytest.fixture
def cells(raw):
    yield load_cells(raw)
    plt.close("all")


def _lines(ax):
    """The data line of each strategy's error-bar series."""
    return [c.lines[0] for c in ax.containers if c.get_label() in SLOWDOWN]


def test_figure7_says_what_the_bars_are_and_n_and_gives_each_strategy_its_own_style(cells):
    meta, data = cells
    fig = figure_level_lines(meta, data, "hubs", "urgent", "mean", ["fifo", "prio", "wfq", "wred"],
                             "Mean completion time of a PathMaster case vs competing traffic (the study's Figure 7)")
    ax = fig.axes[0]
    assert "95% t-interval of the mean" in fig.caption and "n = 5 runs per point" in fig.caption
    assert "Figure 7" in ax.get_title() and "fig7" not in ax.get_title() and "2002 network" in ax.get_title()
    lines = _lines(ax)
    assert len(lines) == 4
    assert len({line.get_marker() for line in lines}) == 4
    assert len({str(line.get_linestyle()) for line in lines}) == 4
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["fifo", "prio", "wfq", "wred"]
    # the bars are the t-interval of each point's runs
    fifo16 = data[("fifo", 16.0, "hubs", "urgent")].times
    lo, hi = summarise(fifo16).ci_low, summarise(fifo16).ci_high
    bars = [c for c in ax.containers if c.get_label() == "fifo"][0]
    segments = bars.lines[2][0].get_segments()
    assert any(np.isclose(seg[0][1], lo) and np.isclose(seg[1][1], hi) for seg in segments)
    assert ax.get_ylim()[0] == 0


def test_the_streams_axis_is_base2_symlog_with_0_and_the_levels_as_ticks(cells):
    meta, data = cells
    fig = figure_level_lines(meta, data, "hubs", "urgent", "std", ["fifo", "prio"], "Standard deviation (Figure 8)")
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog" and ax.xaxis.get_transform().base == 2
    assert list(ax.get_xticks()) == [0, 1, 4, 16]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "4", "16"]
    assert ax.get_xlim()[0] < 0 < 16 < ax.get_xlim()[1]
    assert "symlog" in ax.get_xlabel() and "processes" in ax.get_xlabel() and "linear from 0 to 1," in fig.caption
    assert "standard deviation" in fig.caption and "Bonett interval of the standard deviation" in fig.caption
    fifo16 = data[("fifo", 16.0, "hubs", "urgent")].times
    lo, hi = std_interval_skewed(fifo16)
    bars = [c for c in ax.containers if c.get_label() == "fifo"][0]
    assert any(np.isclose(seg[0][1], lo) and np.isclose(seg[1][1], hi) for seg in bars.lines[2][0].get_segments())


def test_write_figures_draws_figures_7_to_9_box_cdf_and_time_series(raw, tmp_path):
    meta, data = load_cells(raw)
    records = [json.loads(p.read_text()) for p in sorted((raw / "runs").glob("*.json"))]
    stems = {p.stem for p in write_figures(meta, data, tmp_path, records=records) if p.suffix == ".png"}
    assert stems == {"fig7_mean_hubs_urgent", "fig8_std_hubs_urgent", "fig9_shaping_hubs_urgent", "box_hubs_urgent",
                     "cdf_hubs_urgent", "timeseries_hubs_urgent", "ratio_hubs_urgent", "tradeoff_hubs_urgent"}
    assert all((tmp_path / f"{stem}.svg").stat().st_size > 0 for stem in stems)
    assert timeseries_runs(meta, [], "hubs", "urgent") == {}  # without run files: no time series
    no_samples = [r | {"competing": {k: v for k, v in r["competing"].items() if k != "samples"}} for r in records]
    assert timeseries_runs(meta, no_samples, "hubs", "urgent") == {}  # runs from before the sampler


def test_box_plots_wrap_and_start_at_0_and_cdfs_are_split_by_group(cells):
    meta, data = cells
    box = figure_box(meta, data, "hubs", "urgent")
    shown = [ax for ax in box.axes if ax.get_visible()]
    assert len(shown) == 4 and len({round(ax.get_position().y0, 3) for ax in shown}) == 2  # 3 a row, wrapped
    assert box.get_size_inches()[0] <= 11
    assert all(ax.get_ylim()[0] == 0 for ax in shown)
    assert "whiskers: minimum and maximum" in box.caption and "n = 5" in box.caption
    assert all(t.get_text().endswith("(5)") for t in shown[0].get_xticklabels())  # n under each box
    cdf = figure_cdf(meta, data, "hubs", "urgent")
    assert [ax.get_title() for ax in cdf.axes] == ["queueing disciplines", "shaped or adaptive"]
    assert all(ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0 for ax in cdf.axes)
    assert "16 competing processes" in cdf.get_suptitle()
    labels = [t.get_text() for ax in cdf.axes for t in ax.get_legend().get_texts()]
    assert labels == ["fifo (n = 5)", "prio (n = 5)", "wfq (n = 5)", "wred (n = 5)", "shape-200 (n = 5)"]


def test_figure9_has_a_panel_per_limit_against_the_unshaped_discipline(cells):
    from qos.experiment.plots import figure_shaping

    meta, data = cells
    fig = figure_shaping(meta, data, "hubs", "urgent")
    (ax,) = [a for a in fig.axes if a.get_visible()]
    assert "200 kbit/s" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["cbwfq, unshaped", "shaped to 200 kbit/s"] or labels == ["shaped to 200 kbit/s"]
    assert "95% t-interval" in fig.caption and "n = 5" in fig.caption


def test_figures_7_and_8_name_what_they_add_to_the_studys(cells):
    from qos.experiment.plots import study_figure

    meta, _ = cells
    strategies = meta["experiment"]["strategies"]
    unshaped = [s for s in strategies if s.get("shape_kbit") is None]
    assert study_figure(7, unshaped) == "the study's Figure 7"  # fifo, prio, wfq, wred: the study's own
    more = unshaped + [{"name": "cbwfq", "discipline": "cbwfq"}, {"name": "host-pq", "discipline": "prio",
                                                                   "at": "hosts"}]
    assert study_figure(8, more) == "the study's Figure 8, plus cbwfq, host-pq"


def test_two_levels_are_points_not_the_studys_curves(cells):
    meta, data = cells
    two = {k: v for k, v in data.items() if k[1] in (0.0, 16.0)}
    fig = figure_level_lines(meta, two, "hubs", "urgent", "mean", ["fifo", "prio", "wfq", "wred"],
                             "Mean completion time (the study's Figure 7)")
    ax = fig.axes[0]
    assert "Figure 7" not in ax.get_title() and "points, not curves" in ax.get_title()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "16"]
    for line in _lines(ax):
        xs = line.get_xdata()
        assert line.get_linestyle() == "None"
        assert all(abs(x - round(x)) < 0.4 for x in xs)  # nudged within its level's slot


def test_the_time_series_shows_one_run_per_strategy_against_the_competing_traffic(raw, cells):
    from qos.experiment.plots import windowed_rates

    meta, _ = cells
    records = [json.loads(p.read_text()) for p in sorted((raw / "runs").glob("*.json"))]
    picked = timeseries_runs(meta, records, "hubs", "urgent")
    assert set(picked) == set(SLOWDOWN) and all(r["run"]["competing"] == 16 for r in picked.values())
    for name, rec in picked.items():  # the median run of the cell by completion time, not its fastest
        times = sorted(r["completion_s"] for r in records if r["run"]["competing"] == 16 and r["run"]["strategy"] == name)
        assert rec["completion_s"] == times[2] and rec["of_runs"] == 5 and rec["completion_s"] > times[0]
    even = [r for r in records if r["run"]["strategy"] == "fifo" and r["run"]["competing"] == 16][:4]
    times = sorted(r["completion_s"] for r in even)
    assert timeseries_runs(meta, even, "hubs", "urgent")["fifo"]["completion_s"] == times[1]  # lower middle, a real run
    fig = figure_timeseries(meta, picked, "hubs", "urgent")
    key, *panels = fig.axes  # a strip holding the legend, then a panel per strategy
    assert len(panels) == 5 and [x.get_text() for x in key.get_legend().get_texts()][0] == "competing received"
    for ax in panels:
        rate = [line for line in ax.get_lines() if line.get_label() == "competing received"][0]
        assert np.allclose(rate.get_ydata(), 16_000, rtol=0.05)  # 16 Mbit... as kbit/s: 16 x 1000
        assert ax.get_ylim()[0] == 0
        capacity = [line for line in ax.get_lines() if line.get_label() == "segment capacity"][0]
        assert capacity.get_ydata()[0] == 10_000
    assert "median run of n" in fig.caption and "window of at least" in fig.caption
    assert all("(median run of 5)" in ax.get_title(loc="left") for ax in panels)
    # jittered 0.5 s readings of a steady 8 Mbit/s: per interval up to +-10 %, per >= 2 s window within 3 %
    t = np.cumsum(np.r_[0, 0.5 + np.tile([0.04, -0.04], 20)])
    samples = [[x, int(x * 8e6 / 8 + (3000 if i % 2 else 0))] for i, x in enumerate(t)]
    _, rates = windowed_rates(samples)
    assert np.all(np.abs(rates - 8000) < 0.03 * 8000)


def test_rate_levels_keep_0_apart_and_their_ticks_legible():
    from qos.experiment.plots import level_axis

    fig, ax = plt.subplots()
    level_axis(ax, [0, 2000, 5000, 8000], "kbit/s")
    assert ax.xaxis.get_transform().linthresh == 2000 and ax.xaxis.get_transform().base == 2
    positions = ax.transData.transform([[x, 0] for x in (0, 2000, 5000, 8000)])[:, 0]
    gaps = np.diff(positions)
    assert gaps.min() > 0.1 * gaps.sum()  # no tick crowded onto its neighbour
    plt.close(fig)


def test_the_tradeoff_plots_each_strategys_mean_with_both_intervals(cells):
    meta, cells = cells
    fig = figure_tradeoff(meta, cells, "hubs", "urgent")
    ax = fig.axes[0]
    bars = {c.get_label().split(" (")[0]: c for c in ax.containers}
    assert set(bars) == set(SLOWDOWN)
    for name, container in bars.items():
        cell = cells[(name, 16.0, "hubs", "urgent")]
        x, y = container.lines[0].get_xdata()[0], container.lines[0].get_ydata()[0]
        assert x == pytest.approx(np.mean(cell.achieved_kbit) / 1000)
        assert y == pytest.approx(np.mean(cell.times))
        s = summarise(cell.times)
        segments = [seg for coll in container.lines[2] for seg in coll.get_segments()]
        assert any(np.isclose(seg[0][1], s.ci_low) and np.isclose(seg[1][1], s.ci_high) for seg in segments)
    assert ax.get_xlim()[0] == 0 and ax.get_ylim()[0] == 0
    assert "Ethernet frames" in ax.get_xlabel() and "goodput" not in ax.get_xlabel()
    assert "95% t-intervals of both means" in fig.caption and "n = 5" in fig.caption
    assert "The table gives the same means and intervals" in fig.caption


def test_the_tradeoff_zooms_into_crowded_means_and_tabulates_them(cells):
    from qos.experiment.plots import crowded

    # the faithful matrix at 16: five disciplines within 8.4-8.7 Mbit/s, the shaped ones apart
    xs = [8.67, 8.57, 8.39, 8.53, 8.69, 3.92, 0.93, 0.20]
    assert sorted(crowded(xs, span=9.4)) == [0, 1, 2, 3, 4]
    assert crowded([0.2, 3.9, 8.6], span=9.4) == []  # nothing crowds: no zoom
    meta, data = cells
    fig = figure_tradeoff(meta, data, "hubs", "urgent")  # every strategy received ~16 Mbit/s: all crowd
    main, zoom, table_ax = fig.axes
    assert zoom.get_title().startswith("zoom: the 5 strategies")
    assert {c.get_label().split(" (")[0] for c in zoom.containers} == set(SLOWDOWN)
    assert main.get_xlim()[0] == 0 and zoom.get_xlim()[0] > 0
    table = table_ax.tables[0]
    fifo = data[("fifo", 16.0, "hubs", "urgent")]
    s = summarise(fifo.times)
    assert table[1, 0].get_text().get_text() == "fifo"
    assert table[1, 3].get_text().get_text() == f"{s.mean:.2f} [{s.ci_low:.2f}, {s.ci_high:.2f}]"
