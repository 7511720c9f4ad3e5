"""The gateway's Prometheus metrics, by the conventions of services/metrics.py (a registry of
its own with build info and process metrics; times as histograms; `class` and `outcome`
labels), served at GET /metrics to loopback callers and signed-in admins only.

- `pathmaster_gateway_requests_total{route, method, status}`: every HTTP request, by its
  route's template (``/api/case``; "unmatched" for paths no route serves, so a scanner
  cannot grow the label set) and the status sent;
- `pathmaster_gateway_case_seconds{class, outcome}`: a case from its upload checked to its
  last event (outcome: ok, partial, failed, cancelled: the browser went away);
- `pathmaster_gateway_login_failures_total{how}`: refused sign-ins ("password", "link")
  and those refused while throttled ("throttled").
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from services.metrics import SECONDS_BUCKETS, new_registry

UNMATCHED = "unmatched"  # the route label of a path no route serves
UNKNOWN_CLASS = "unknown"  # the class label of a class the coordinator did not name
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})  # others: "other"
LOGIN_FAILURES = ("password", "link", "throttled")


class GatewayMetrics:
    """The gateway's registry and its metrics (see the module docstring)."""

    def __init__(self):
        self.registry = new_registry("gateway")
        self.requests = Counter("pathmaster_gateway_requests", "HTTP requests, by route template and status",
                                ["route", "method", "status"], registry=self.registry)
        self.case_seconds = Histogram("pathmaster_gateway_case_seconds",
                                      "A case's time at the gateway, upload checked to its last event",
                                      ["class", "outcome"], registry=self.registry, buckets=SECONDS_BUCKETS)
        self.login_failures = Counter("pathmaster_gateway_login_failures", "Refused sign-ins, by how",
                                      ["how"], registry=self.registry)
        for how in LOGIN_FAILURES:
            self.login_failures.labels(how)


class RequestMetrics:
    """ASGI middleware counting every HTTP request in `metrics.requests` once its response
    has started (or 500 when the app failed before answering)."""

    def __init__(self, app, metrics: GatewayMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = 500

        async def noted(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, noted)
        finally:
            route = scope.get("route")  # FastAPI puts the matched route in the (shared) scope
            path = getattr(route, "path", None) or UNMATCHED
            method = scope["method"] if scope["method"] in METHODS else "other"
            self.metrics.requests.labels(path, method, str(status)).inc()
