"""The coordinator's view of whether each site serves: its gRPC health, followed live.

One thread per site holds a health Watch stream on the site's control channel; every
status the site reports sets `pathmaster_site_up{site}` (1 for SERVING, 0 otherwise), and
a lost stream (the site gone) sets 0 and is opened again after `retry_s`. So the gauge
follows the site's own word (NOT_SERVING while it has no worker) without waiting for a
case to fail there.
"""

from __future__ import annotations

import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from qos.transport import ClassChannels
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

SITE_WATCH_RETRY_S = 2.0         # the coordinator follows each site's health; after a lost stream, again after this

SITE_SERVICE = pb.DESCRIPTOR.services_by_name["Site"].full_name  # what a site's health names
SERVING = health_pb2.HealthCheckResponse.SERVING


class SiteWatch:
    """Follows every site's health into `gauge` (a Gauge labelled by site) and
    `on_status(site, serving)` until `stop()`."""

    def __init__(self, channels: ClassChannels, sites: list[str], gauge,
                 retry_s: float = SITE_WATCH_RETRY_S, on_status=None):
        self.channels = channels
        self.gauge = gauge
        self.on_status = on_status or (lambda site, serving: None)
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._calls: dict[str, grpc.Future] = {}
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._follow, args=(site,), daemon=True, name=f"watch-{site}")
                         for site in sites]
        for site in sites:
            gauge.labels(site).set(0)

    def start(self) -> "SiteWatch":
        for thread in self._threads:
            thread.start()
        return self

    def _follow(self, site: str) -> None:
        while not self._stop.is_set():
            stub = health_pb2_grpc.HealthStub(self.channels.channel(site))
            call = stub.Watch(health_pb2.HealthCheckRequest(service=SITE_SERVICE))
            with self._lock:
                self._calls[site] = call
            if self._stop.is_set():
                call.cancel()
            try:
                for reply in call:
                    self._set(site, reply.status == SERVING)
            except grpc.RpcError:
                pass  # the site is gone, or we are stopping
            self._set(site, False)
            self._stop.wait(self.retry_s)

    def _set(self, site: str, serving: bool) -> None:
        self.gauge.labels(site).set(int(serving))
        self.on_status(site, serving)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for call in self._calls.values():
                call.cancel()
        for thread in self._threads:
            thread.join(timeout=5)
