"""A site whose worker dies: NOT_SERVING (health and ListSites) while it cannot serve, a
failed case counted as failed (not completed), SERVING again once the worker is replaced.

The site's database is moved away while its only worker is killed, so the replacement
cannot start (the site stays down, whatever the machine's speed) until it is put back:
the backoff's retries then bring the site back.
"""

from __future__ import annotations

import queue
import shutil
import threading
import time
import urllib.request

import grpc
import pytest
import ray
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from services.client import CoordinatorClient
from services.config import CoordinatorConfig, SiteConfig, SiteEndpoint
from services.coordinator.server import CoordinatorServer
from services.site.server import SITE_SERVICE, SiteServer

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


def samples(url: str) -> dict:
    """{(name, frozenset(labels)): value} of a Prometheus endpoint, read by Prometheus' parser."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def wait_for_sample(url: str, key: tuple, value: float, timeout_s: float = 30) -> None:
    """Until the endpoint reports `value` for `key` (a gauge another thread sets)."""
    deadline = time.monotonic() + timeout_s
    while (found := samples(url).get(key)) != value:
        assert time.monotonic() < deadline, f"{key} is {found}, not {value}"
        time.sleep(0.1)


def watch_health(address: str) -> tuple[queue.Queue, grpc.Channel]:
    """Every status the site's health reports for its service, in order (gRPC health Watch)."""
    channel = grpc.insecure_channel(address)
    statuses: queue.Queue = queue.Queue()
    stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SITE_SERVICE))

    def follow():
        try:
            for reply in stream:
                statuses.put(reply.status)
        except grpc.RpcError:
            pass  # the channel closed at the end of the test

    threading.Thread(target=follow, daemon=True).start()
    return statuses, channel


def case_events(address: str, cells) -> list:
    with CoordinatorClient(address) as client:
        return list(client.submit(cells, "urgent", deadline_s=60))


def test_worker_death_not_serving_then_serving(ray_session, site_db, case, tmp_path):
    db = shutil.copytree(site_db, tmp_path / "db")
    site = SiteServer(SiteConfig(name="omega", db=db, listen="127.0.0.1:0", workers=1, metrics="127.0.0.1:0",
                                 worker_restart_min_s=0.2, worker_restart_max_s=1.0)).start()
    coordinator = CoordinatorServer(CoordinatorConfig(
        sites=[SiteEndpoint(name="omega", address=site.address)], listen="127.0.0.1:0", metrics="127.0.0.1:0",
        analysis_workers=0)).start()
    statuses, channel = watch_health(site.address)
    try:
        assert statuses.get(timeout=30) == SERVING
        site_up = ("pathmaster_site_up", frozenset({("site", "omega")}))
        wait_for_sample(coordinator.metrics_url, site_up, 1)
        away = db.rename(tmp_path / "away")  # the replacement cannot open the database
        ray.kill(site.workers[0], no_restart=True)
        assert statuses.get(timeout=60) == NOT_SERVING
        wait_for_sample(coordinator.metrics_url, site_up, 0)  # the coordinator follows the site's health

        with CoordinatorClient(coordinator.address) as client:
            (listed,) = client.sites()
            with pytest.raises(grpc.RpcError) as err:
                client.image("omega", "cell-1")
        assert not listed.serving and listed.info.workers == 0
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        events = case_events(coordinator.address, case[:1])
        (result,) = [e.site_result for e in events if e.HasField("site_result")]
        assert result.status_code == UNAVAILABLE and "no worker is alive" in result.status_message
        assert events[-1].summary.sites_ok == 0
        with CoordinatorClient(coordinator.address) as client:
            (urgent,) = client.class_stats("urgent")
        assert urgent.cases == 0 and urgent.mean_s == 0  # a failed case is no completion time
        metrics = samples(coordinator.metrics_url)
        failed = frozenset({("class", "urgent"), ("outcome", "failed")})
        assert metrics[("pathmaster_cases_total", failed)] == 1
        assert metrics[("pathmaster_case_seconds_count", failed)] == 1

        away.rename(db)  # the next attempt starts a worker
        assert statuses.get(timeout=120) == SERVING
        wait_for_sample(coordinator.metrics_url, site_up, 1)
        assert site.supervisor.restarts == 1
        with CoordinatorClient(coordinator.address) as client:
            (listed,) = client.sites()
        assert listed.serving and listed.info.workers == 1
        events = case_events(coordinator.address, case[:1])
        (result,) = [e.site_result for e in events if e.HasField("site_result")]
        assert result.status_code == 0 and len(result.cells[0].matches) == 5
        metrics = samples(coordinator.metrics_url)
        assert metrics[("pathmaster_cases_total", frozenset({("class", "urgent"), ("outcome", "ok")}))] == 1
        at_site = samples(site.metrics_url)
        assert at_site[("pathmaster_site_worker_restarts_total", frozenset())] == 1
        assert at_site[("pathmaster_site_workers", frozenset({("state", "alive")}))] == 1
        assert at_site[("pathmaster_site_analyse_seconds_count",
                        frozenset({("class", "urgent"), ("outcome", "ok")}))] == 1
    finally:
        channel.close()
        coordinator.stop(0)
        site.stop(0)
