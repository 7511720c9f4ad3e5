"""Prometheus metrics shared by the coordinator and the sites.

Each server keeps a registry of its own (several may run in one process: tests, the demo)
holding what every PathMaster process exports: build info and the process's own CPU,
memory and file descriptors (prometheus_client's process, platform and GC collectors).
Times are histograms, so that several coordinators or sites can be aggregated with
`histogram_quantile` (a precomputed percentile cannot be). Labels: `class` (the request
class), `outcome` (see `OUTCOMES`), `site`.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Info, start_http_server
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector

import pathmaster
from qos.transport import connect_address, split_address

# A case or a site call ends as one of these: every site answered, some did, none did (the
# case failed: it is never counted as completed), or its client went away first.
OUTCOMES = ("ok", "partial", "failed", "cancelled")
COMPLETED = ("ok", "partial")  # outcomes whose time is a completion time
# Seconds; a case of 6 study cells takes ~1-10 s, a teaching batch case up to minutes.
SECONDS_BUCKETS = (0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 60, 120, 300)


def case_outcome(answered: int, failed: int, cancelled: bool = False) -> str:
    """The `outcome` label of a case from how many sites answered and failed.

    Parameters
    ----------
    answered, failed : int
        Sites that answered, sites that did not (any error, the deadline included).
    cancelled : bool
        The client went away before the end.

    Returns
    -------
    str
        One of `OUTCOMES`.
    """
    if cancelled:
        return "cancelled"
    if answered == 0:
        return "failed"
    return "ok" if failed == 0 else "partial"


def new_registry(role: str) -> CollectorRegistry:
    """A registry with build info (`pathmaster_build_info{version, python, role}`) and the
    process, platform and garbage-collector metrics of this process.

    Parameters
    ----------
    role : str
        "coordinator" or "site": the `role` label of the build info.
    """
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    Info("pathmaster_build", "PathMaster build", registry=registry).info(
        {"version": pathmaster.__version__, "python": platform.python_version(), "role": role})
    return registry


def serve_metrics(address: str, registry: CollectorRegistry):
    """Serve `registry` over HTTP at `address` (HOST:PORT; port 0: any free port).

    Returns
    -------
    tuple
        (the HTTP server, to `shutdown()` and `server_close()`; its URL, ".../metrics").
    """
    host, port = split_address(address)
    server, _ = start_http_server(port, addr=host.strip("[]"), registry=registry)
    return server, f"http://{connect_address(host, server.server_port)}/metrics"


def stop_metrics(server) -> None:
    """Stop a server made by `serve_metrics` (None: nothing to stop)."""
    if server is not None:
        server.shutdown()
        server.server_close()
