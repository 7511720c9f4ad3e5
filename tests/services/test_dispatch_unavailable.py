"""A worker that Ray cannot reach for a moment (ActorUnavailableError) is not dead: the
site's dispatcher runs the cell again on it and keeps it, and the supervisor's ping does
not replace it. (Replacing it left a loaded site with no worker for as long as a new one
took to load, and every call failed meanwhile.)"""

from __future__ import annotations

from typing import NamedTuple

import ray

from services.dispatch import PriorityDispatcher
from services.site.supervisor import Supervisor
from tests.services.test_coordinator import poll_until


@ray.remote
class Flaky:
    """Unreachable (as Ray says it) for its first `failures` calls of each method, then answers."""

    def __init__(self, failures: int):
        self.failures = {"work": failures, "ready": failures}
        self.pings = 0

    def _maybe_fail(self, method: str) -> None:
        if self.failures[method] > 0:
            self.failures[method] -= 1
            raise ray.exceptions.ActorUnavailableError("lost touch for a moment", None)

    def work(self, x: int) -> int:
        self._maybe_fail("work")
        return 2 * x

    def ready(self) -> bool:
        self.pings += 1
        self._maybe_fail("ready")
        return True

    def pinged(self) -> int:
        return self.pings


class Work(NamedTuple):
    """`Flaky.work(x)` as the dispatcher sends it."""

    x: int
    method = "work"


def test_a_job_is_run_again_and_the_worker_kept(ray_session):
    dispatcher = PriorityDispatcher([Flaky.remote(2)])
    try:
        job = dispatcher.submit(0, Work(21))
        assert job.done.wait(60)
        assert job.error is None and job.result == 42 and job.attempts == 3
        assert dispatcher.alive() == 1
    finally:
        dispatcher.stop()


def test_a_ping_that_does_not_reach_the_worker_does_not_replace_it(ray_session):
    worker = Flaky.remote(1)
    dispatcher = PriorityDispatcher([worker])
    started = []
    supervisor = Supervisor("flaky", dispatcher, start_worker=lambda: started.append(1) or Flaky.remote(0),
                            ping_s=0.05).start()
    try:
        poll_until(lambda: ray.get(worker.pinged.remote()) >= 3, 60, "a failed ping and two answered")
        assert supervisor.restarts == 0 and not started and dispatcher.alive() == 1
    finally:
        supervisor.stop()
        dispatcher.stop()
