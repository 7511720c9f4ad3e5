"""What the priority dispatcher hands a worker, with fakes (no Ray): the most favoured
waiting job first, one job per idle worker, a cancelled job never, and each job as a call of
the worker method its record names with the record's fields as the arguments
(services/dispatch.py)."""

from __future__ import annotations

from types import SimpleNamespace

from services.coordinator.analysis import AnalyseTimed
from services.site.worker import AnalyseCell, FeatureCell, FetchImage, SearchFeatures, SiteWorker
from tests.services.test_analysis_estimate import held_dispatcher

URGENT, ROUTINE, BULK = 0, 1, 3


class FakeActor:
    """An actor handle that notes each `handle.<method>.remote(*args)` in `calls`."""

    def __init__(self, name: str, calls: list):
        self._name, self._calls = name, calls

    def __getattr__(self, method: str):
        def remote(*args):
            self._calls.append((self._name, method, args))
            return f"ref-{len(self._calls)}"
        return SimpleNamespace(remote=remote)


def started(dispatcher) -> None:
    """One pass of the dispatcher's loop: idle workers are given waiting jobs."""
    with dispatcher._changed:
        dispatcher._start_waiting_jobs()


def test_idle_workers_get_the_most_favoured_jobs_as_calls_of_the_named_method():
    calls = []
    dispatcher = held_dispatcher([FakeActor("w0", calls), FakeActor("w1", calls)])
    bulk = dispatcher.submit(BULK, AnalyseCell("bulk", b"i", b"", b"", 5, None, None))
    gone = dispatcher.submit(URGENT, FetchImage("gone"), cells=0)
    dispatcher.cancel(gone)
    routine = dispatcher.submit(ROUTINE, SearchFeatures([FeatureCell("r", [1.0], False, True)], 3, None, None))
    urgent = dispatcher.submit(URGENT, AnalyseCell("urgent", b"i", b"b", b"m", 5, 12.5, {"nc_ratio": 2.0}))
    started(dispatcher)
    assert [(method, args) for _, method, args in calls] == [
        ("analyse", ("urgent", b"i", b"b", b"m", 5, 12.5, {"nc_ratio": 2.0})),
        ("search_many", ([FeatureCell("r", [1.0], False, True)], 3, None, None)),
    ]
    assert {name for name, _, _ in calls} == {"w0", "w1"}  # one job per idle worker
    assert urgent.ref and routine.ref and bulk.ref is None and gone.ref is None
    assert dispatcher.waiting() == 1 and dispatcher.running() == 2


def test_every_record_names_a_method_of_its_worker_that_takes_its_fields():
    import inspect

    from services.coordinator.analysis import CellAnalyser

    for record, worker in ((AnalyseCell, SiteWorker), (SearchFeatures, SiteWorker), (FetchImage, SiteWorker),
                           (AnalyseTimed, CellAnalyser)):
        parameters = list(inspect.signature(getattr(worker, record.method)).parameters)[1:]
        assert parameters[:len(record._fields)] == list(record._fields), record.__name__
