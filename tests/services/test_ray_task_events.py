"""Calls to our Ray actors leave no task events in Ray's GCS (services.ray_local.RAY_TASK_EVENTS).

Ray records every task and actor call as task events kept in its GCS (for its dashboard
and state API, which the project does not read); under load, with a site's workers
pinged every second, the GCS grew without end (benchmarks/bench_memory.py: +616 MiB/h
in a 30-minute run at 20 clients). The events are read here the way `ray.timeline()`
reads them (from the GCS); a plain actor's call, made after ours, shows when the calls'
events have been reported.
"""

from __future__ import annotations

import ray

from services.coordinator.analysis import _RemoteAnalyser
from services.ray_local import RAY_TASK_EVENTS
from services.site.worker import _RemoteWorker, start_workers, stop_workers
from tests.services.test_coordinator import poll_until

CALLS = 20


@ray.remote
class Plain:
    """An actor with Ray's default (task events on)."""

    def marker(self) -> int:
        return 1


def task_event_names() -> list[str]:
    """The function or method name of every task event the GCS holds now."""
    from ray._private.state import state

    return [event.task_info.func_or_class_name for event in state._get_all_task_events()]


def test_our_actors_are_made_without_task_events():
    assert RAY_TASK_EVENTS is False
    for actor_class in (_RemoteWorker, _RemoteAnalyser):
        assert actor_class._default_options.get("enable_task_events") is False


def test_a_site_workers_calls_leave_no_task_events_in_the_gcs(ray_session, site_db):
    (worker,) = start_workers(site_db, "", 1, cpus=0.5)
    try:
        ray.get([worker.ready.remote() for _ in range(CALLS)])
        ray.get(worker.info.remote())
        plain = Plain.remote()
        ray.get(plain.marker.remote())
        poll_until(lambda: any(name.endswith("Plain.marker") for name in task_event_names()), 60,
                   "the plain actor's call in Ray's task events")
        names = task_event_names()
        assert not [name for name in names if "SiteWorker" in name], names
    finally:
        stop_workers([worker])
