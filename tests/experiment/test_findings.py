"""The study's findings checked on cells with known answers (each can come out either way)."""

import numpy as np

from qos.experiment.report import Cell, study_findings

STRATEGIES = [
    {"name": "fifo", "discipline": "fifo", "shape_kbit": None},
    {"name": "prio", "discipline": "prio", "shape_kbit": None},
    {"name": "wfq", "discipline": "wfq", "shape_kbit": None},
    {"name": "wred", "discipline": "wred", "shape_kbit": None},
    {"name": "s4000", "discipline": "wfq", "shape_kbit": 4000},
    {"name": "s200", "discipline": "wfq", "shape_kbit": 200},
]
META = {"experiment": {"strategies": STRATEGIES}}


def _cells(means: dict[str, tuple[float, float, float]], stds: dict[str, float]) -> dict:
    """Cells at levels 0, 4 and 8 whose samples have exactly the given means (and stds at 8)."""
    base = np.array([-1.0, 1.0, -1.0, 1.0]) / np.std([-1.0, 1.0, -1.0, 1.0], ddof=1)
    cells = {}
    for name, (idle, mid, loaded) in means.items():
        for level, mean, spread in ((0, idle, 0.02), (4, mid, 0.05), (8, loaded, stds.get(name, 0.05))):
            cell = Cell(name, level, "L", "urgent")
            cell.times = list(mean + spread * base)
            cells[cell.key] = cell
    return cells


def _verdicts(cells) -> dict[str, bool]:
    return {row["finding"][0]: row["agrees"] for row in study_findings(META, cells)}


def test_data_like_the_study_agree_with_every_finding():
    means = {"fifo": (1.0, 3.0, 6.0), "prio": (1.0, 1.5, 2.0), "wfq": (1.0, 1.1, 1.3),
             "wred": (1.0, 1.4, 1.2), "s4000": (1.0, 1.3, 1.5), "s200": (1.0, 1.0, 1.05)}
    verdicts = _verdicts(_cells(means, {"fifo": 2.0}))
    assert verdicts == {"1": True, "2": True, "3": True, "4": True, "5": True, "6": True}


def test_data_unlike_the_study_disagree():
    means = {"fifo": (1.0, 1.2, 1.5), "prio": (2.0, 2.5, 3.0), "wfq": (1.0, 3.0, 4.0),
             "wred": (1.0, 3.0, 5.0), "s4000": (1.0, 1.1, 1.1), "s200": (1.0, 2.0, 3.0)}
    verdicts = _verdicts(_cells(means, {"prio": 1.0}))
    assert verdicts == {"1": False, "2": False, "3": False, "4": False, "5": False, "6": False}


def test_links_table_has_a_row_per_link_with_its_mean():
    from qos.experiment.report import links_table

    meta = {"experiment": {"strategies": STRATEGIES[:1], "links": [
        {"name": "near", "core_kbit": 10000, "delay_ms": 0.1, "mtu": 1500},
        {"name": "far", "core_kbit": 10000, "delay_ms": 800, "mtu": 9000}]}}
    cells = {}
    for link, times in (("near", [1.0, 1.2]), ("far", [20.0, 22.0])):
        cell = Cell("fifo", 0, link, "urgent")
        cell.times, cell.ratios, cell.throughput_kbit = times, [1.1, 1.1], [100.0, 100.0]
        cells[cell.key] = cell
    rows = [line for line in links_table(meta, cells).splitlines() if line.startswith("| near") or line.startswith("| far")]
    assert len(rows) == 2
    assert "1.10 (0.14)" in rows[0] and "| 0.1 | 1500 |" in rows[0]
    assert "21.00 (1.4)" in rows[1] and "| 800 | 9000 |" in rows[1]
