"""The loopback deployment starts its sites side by side: one that cannot start fails the
whole start, by its name, and takes down the sites that did start."""

from __future__ import annotations

import time

import pytest

import services.demo as demo


def test_a_site_that_cannot_start_fails_the_start_and_the_others_are_stopped(ray_session, site_dbs, tmp_path, monkeypatch):
    started = []

    class Recorded(demo.SiteServer):
        def start(self):
            super().start()
            started.append(list(self.workers))  # the handles, before stop() forgets them
            return self

    monkeypatch.setattr(demo, "SiteServer", Recorded)
    databases = {"alpha": site_dbs["alpha"], "missing": tmp_path / "no-such-site", "gamma": site_dbs["gamma"]}
    deployment = demo.LoopbackDeployment(databases)
    with pytest.raises(FileNotFoundError, match="no-such-site"):
        deployment.start()
    assert len(started) == 2 and deployment.sites == {} and deployment.coordinator is None
    for workers in started:  # every worker of the sites that started goes (ray.kill is asynchronous)
        for worker in workers:
            assert _dies(ray_session, worker, within_s=60)


def _dies(ray, actor, within_s: float) -> bool:
    """Whether `actor`'s calls fail as a dead actor's within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ready.remote(), timeout=max(0.1, deadline - time.monotonic()))
        except ray.exceptions.RayActorError:
            return True
        except ray.exceptions.GetTimeoutError:
            return False
    return False
