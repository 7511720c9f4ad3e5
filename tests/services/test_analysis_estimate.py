"""The coordinator's prediction of its own analysis time (services/coordinator/analysis.py)."""

from __future__ import annotations

import pytest

from services.coordinator.analysis import Analysers


def test_the_coordinators_analysis_estimate_counts_the_cells_ahead():
    analysers = Analysers(count=0, cpus=0)  # no actors: the estimate alone
    assert analysers.estimate_s(6) is None  # nothing analysed yet
    analysers.actors = ["a", "b"]
    for seconds in (0.1, 0.1, 0.1, 0.5):  # the first is held apart (maybe cold: RecentMedian)
        analysers.seconds_per_cell.add(seconds)
    assert analysers.estimate_s(6) == pytest.approx(0.1 * 3)  # 6 cells, 2 at a time
    analysers._pending = 10  # another case's cells are being analysed
    assert analysers.estimate_s(6) == pytest.approx(0.1 * 8)


def test_the_estimate_scales_the_wall_time_of_a_round_as_cases_saw_it():
    analysers = Analysers(count=0, cpus=0)
    analysers.actors = ["a", "b"]
    analysers.seconds_per_cell.add(0.1)      # an actor's own service time of a cell
    for seconds in (0.15, 0.15, 0.15, 0.9):  # a round's wall time: Ray's calls and hand-offs too
        analysers.seconds_per_round.add(seconds)
    assert analysers.estimate_s(6) == pytest.approx(0.15 * 3)
