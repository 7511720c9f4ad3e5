"""The coordinator's prediction of its own analysis time (services/coordinator/analysis.py)
and the cells its dispatcher counts ahead of a new case's (services/dispatch.py)."""

from __future__ import annotations

import pytest

from services.coordinator.analysis import Analysers, AnalyseTimed
from services.dispatch import Job, PriorityDispatcher

URGENT, BULK = 0, 3  # priorities: smaller is more favoured


def cell(cell_id: str) -> AnalyseTimed:
    """A cell's analysis (its bytes do not matter: nothing runs it)."""
    return AnalyseTimed(cell_id, b"", b"", b"", None)


def held_dispatcher(workers: list) -> PriorityDispatcher:
    """A dispatcher whose loop is stopped: submitted jobs stay waiting, none runs."""
    dispatcher = PriorityDispatcher(workers)
    dispatcher.stop()
    return dispatcher


def analysers_with(per_cell_s: list[float], waiting: dict[int, int]) -> Analysers:
    """Two fake actors, the service times seen so far, and `waiting` cells by priority."""
    analysers = Analysers(count=0, cpus=0)  # no actors: the estimate alone
    analysers.dispatcher.stop()
    analysers.actors = ["a", "b"]
    analysers.dispatcher = held_dispatcher(analysers.actors)
    for seconds in per_cell_s:
        analysers.seconds_per_cell.add(seconds)
    for priority, cells in waiting.items():
        for _ in range(cells):
            analysers.dispatcher.submit(priority, cell("cell"))
    return analysers


def test_the_coordinators_analysis_estimate_counts_the_cells_ahead():
    analysers = Analysers(count=0, cpus=0)
    assert analysers.estimate_s(6) is None  # nothing analysed yet
    analysers.dispatcher.stop()
    # The first time is held apart (maybe cold: RecentMedian).
    assert analysers_with([0.1, 0.1, 0.1, 0.5], {}).estimate_s(6) == pytest.approx(0.1 * 3)  # 2 at a time
    busy = analysers_with([0.1, 0.1, 0.1, 0.5], {URGENT: 10})  # another case's cells wait
    assert busy.estimate_s(6, URGENT) == pytest.approx(0.1 * 8)


def test_an_urgent_cases_estimate_leaves_out_the_bulk_cells_it_will_overtake():
    analysers = analysers_with([0.1, 0.1, 0.1, 0.5], {BULK: 10})
    assert analysers.estimate_s(6, URGENT) == pytest.approx(0.1 * 3)  # the bulk cells start after it
    assert analysers.estimate_s(6, BULK) == pytest.approx(0.1 * 8)    # a bulk case waits behind them


def test_the_dispatcher_counts_waiting_cells_at_the_same_or_a_more_favoured_priority_and_running_ones():
    dispatcher = held_dispatcher(["w"])
    for priority, cells in ((URGENT, 2), (1, 3), (BULK, 4)):
        dispatcher.submit(priority, cell("case"), cells=cells)
    cancelled = dispatcher.submit(URGENT, cell("gone"), cells=5)
    dispatcher.cancel(cancelled)
    assert [dispatcher.ahead(p) for p in (URGENT, 1, 2, BULK)] == [2, 5, 5, 9]
    # A bulk job already on a worker is not interrupted: every class waits for it.
    running = Job(cell("running"), cells=1)
    running.priority = BULK
    dispatcher._running[object()] = (running, 0, "w")
    assert [dispatcher.ahead(p) for p in (URGENT, BULK)] == [2 + 1, 9 + 1]


def test_the_estimate_scales_the_wall_time_of_a_round_as_cases_saw_it():
    analysers = analysers_with([0.1], {})    # an actor's own service time of a cell
    for seconds in (0.15, 0.15, 0.15, 0.9):  # a round's wall time: Ray's calls and hand-offs too
        analysers.seconds_per_round.add(seconds)
    assert analysers.estimate_s(6) == pytest.approx(0.15 * 3)
