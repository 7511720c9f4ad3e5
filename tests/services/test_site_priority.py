"""A site's priority dispatch as the coordinator sees it, with fakes (no Ray): the work
ahead of each class it reports (services/site/server.py `load`, read by
services/coordinator/directory.py), and the large-image fetch queued behind every cell."""

from __future__ import annotations

import threading

import grpc
import pytest

from qos.predict import RecentMedian
from services.coordinator.directory import site_load
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.site.server import SiteServicer
from services.site.worker import AnalyseCell, FetchImage
from tests.services.conftest import CallFailed
from tests.services.test_analysis_estimate import held_dispatcher
from tests.services.test_coordinator import poll_until

URGENT, ROUTINE, BULK = 0, 1, 3  # the default classes' priorities
INFO = {"algorithm": "fake", "database_cells": 1, "diagnoses": []}


def cell(cell_id: str) -> AnalyseCell:
    """An image-mode cell's work (its bytes do not matter: nothing runs it)."""
    return AnalyseCell(cell_id, b"", b"", b"", 5, None, None)


class Context:
    """What GetImage uses of a grpc.ServicerContext: the caller may go away."""

    def __init__(self):
        self.active = True

    def is_active(self):
        return self.active

    def time_remaining(self):
        return None

    def abort(self, code, details):
        raise CallFailed(code, details)


@pytest.fixture
def servicer():
    """A site servicer over one fake worker whose dispatcher runs nothing: jobs stay queued."""
    site = SiteServicer("here", ["w"], INFO)
    site.dispatcher.stop()
    site.dispatcher = held_dispatcher(site.workers)
    return site


def test_the_dispatcher_counts_the_work_a_new_job_of_a_priority_would_wait_for(servicer):
    dispatcher = servicer.dispatcher
    dispatcher.submit(URGENT, cell("a"), cells=1)
    dispatcher.submit(BULK, cell("b"), cells=4)
    per_cell = {"analyse": 0.5}
    assert dispatcher.work_ahead_s(per_cell, URGENT) == pytest.approx(0.5)   # the bulk cells start after it
    assert dispatcher.work_ahead_s(per_cell, BULK) == pytest.approx(2.5)
    assert dispatcher.work_ahead_s(per_cell) == pytest.approx(2.5)           # every waiting cell


def test_a_site_reports_each_class_its_own_work_ahead_and_the_coordinator_reads_it(servicer):
    servicer.seconds_per_cell["images"] = RecentMedian()
    servicer.seconds_per_cell["images"].add(0.5)
    servicer.dispatcher.submit(URGENT, cell("a"), cells=1)
    servicer.dispatcher.submit(BULK, cell("b"), cells=4)
    load = servicer.load()
    assert dict(load.waiting_s_by_class) == pytest.approx({"urgent": 0.5, "routine": 0.5, "teaching": 0.5,
                                                           "bulk": 2.5})
    assert load.waiting_s == pytest.approx(2.5)
    seen = site_load(load)
    assert seen.ahead_s("urgent") == pytest.approx(0.5) and seen.ahead_s("bulk") == pytest.approx(2.5)
    # A site that reports only the total: it stands for every class.
    older = site_load(pb.SiteLoad(waiting_cells=5, workers=1, waiting_s=2.5))
    assert older.waiting_s_by_class is None and older.ahead_s("urgent") == pytest.approx(2.5)


def fetch_in_background(servicer, context, cell_id="db-7"):
    """GetImage in a thread, as gRPC runs it: (thread, {"reply" or "error"})."""
    out = {}

    def fetch():
        try:
            out["reply"] = servicer.GetImage(pb.ImageRequest(site="here", cell_id=cell_id), context)
        except CallFailed as exc:
            out["error"] = exc

    thread = threading.Thread(target=fetch, daemon=True)
    thread.start()
    return thread, out


def queued(dispatcher) -> list[tuple[int, str]]:
    """(priority, method) of the waiting jobs, in the order they would start."""
    return [(priority, job.method) for priority, _, job in sorted(dispatcher._heap, key=lambda e: e[:2])]


def test_a_large_image_is_read_in_its_turn_after_every_queued_cell(servicer):
    servicer.dispatcher.submit(BULK, cell("bulk cell"))
    servicer.dispatcher.submit(URGENT, cell("urgent cell"))
    thread, out = fetch_in_background(servicer, Context())
    poll_until(lambda: len(servicer.dispatcher._heap) == 3, 10, "the image read queued")
    assert queued(servicer.dispatcher) == [(URGENT, "analyse"), (BULK, "analyse"), (BULK, "image")]
    assert servicer.dispatcher.waiting() == 2  # a read is not a cell to analyse
    image_job = next(job for _, _, job in servicer.dispatcher._heap if job.method == "image")
    assert image_job.work == FetchImage("db-7")
    image_job.result = {"image": b"png", "diagnosis": "NILM", "mask": b""}
    image_job.done.set()
    thread.join(10)
    assert out["reply"] == pb.ImageReply(cell_id="db-7", image=b"png", diagnosis="NILM")


def test_an_unknown_cell_is_not_found_and_a_gone_caller_leaves_no_read_queued(servicer):
    thread, out = fetch_in_background(servicer, Context(), cell_id="nope")
    poll_until(lambda: len(servicer.dispatcher._heap) == 1, 10, "the image read queued")
    job = servicer.dispatcher._heap[0][2]
    job.error = KeyError("nope")
    job.done.set()
    thread.join(10)
    assert out["error"].code() == grpc.StatusCode.NOT_FOUND

    context = Context()
    thread, out = fetch_in_background(servicer, context)
    poll_until(lambda: len(servicer.dispatcher._heap) == 2, 10, "the second read queued")
    context.active = False
    thread.join(10)
    assert out["reply"] == pb.ImageReply()
    assert next(job for _, _, job in servicer.dispatcher._heap if job.work == FetchImage("db-7")).cancelled
