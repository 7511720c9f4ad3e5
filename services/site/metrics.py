"""A site's Prometheus metrics (services/metrics.py has what every server exports).

analyse_seconds{class, outcome}: each Analyse call, arrival to reply (outcome "ok",
"failed" or "cancelled"); cases_in_flight{class}; cells_waiting (queued, not started);
workers{state="alive"|"configured"}; worker_restarts_total (replacements ready) and
worker_failed_starts_total (replacements that did not start).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

from qos.classes import ClassTable
from services.metrics import SECONDS_BUCKETS, new_registry

UNKNOWN_CLASS = "unknown"  # the label of a class the site does not know (labels stay bounded)


class SiteMetrics:
    """One site's registry and metrics (see the module docstring)."""

    def __init__(self, classes: ClassTable):
        self.classes = classes
        self.registry = new_registry("site")
        self.analyse_seconds = Histogram("pathmaster_site_analyse_seconds", "Analyse call time at the site",
                                         ["class", "outcome"], registry=self.registry, buckets=SECONDS_BUCKETS)
        self.in_flight = Gauge("pathmaster_site_cases_in_flight", "Analyse calls in progress", ["class"],
                               registry=self.registry)
        self.cells_waiting = Gauge("pathmaster_site_cells_waiting", "Cells queued, not started",
                                   registry=self.registry)
        self.workers = Gauge("pathmaster_site_workers", "Ray workers", ["state"], registry=self.registry)
        self.restarts = Counter("pathmaster_site_worker_restarts", "Dead workers replaced", registry=self.registry)
        self.failed_starts = Counter("pathmaster_site_worker_failed_starts", "Replacements that did not start",
                                     registry=self.registry)
        for c in classes:
            self.in_flight.labels(c.name)

    def label(self, class_name: str) -> str:
        """The `class` label of a request's class: its name, or "unknown" for one not in the table."""
        return class_name if class_name in self.classes else UNKNOWN_CLASS
