"""Completion records and per-class completion-time statistics.

Every case the coordinator finishes leaves one JSON line in the case log (case id, its log
tag, class, DSCP, sites with their status, times and bytes each way, total time); the file
is its owner's only (0600) and rotated by size. Per class, the coordinator keeps the most
recent completion times (a bounded window) and reports their mean, standard deviation,
coefficient of variation, median and 95th percentile, through the GetClassStats RPC and
as Prometheus gauges. Only completed cases (at least one site answered) have a completion
time: a failed or cancelled case is counted under its outcome, never in the statistics.
`CoordinatorMetrics` holds the Prometheus side: the case and per-site histograms (labels
`class`, `outcome`, `site`), sites up, cases in flight (services/metrics.py for the rest).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from logging.handlers import RotatingFileHandler
from pathlib import Path

import numpy as np
from prometheus_client import Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from qos.classes import ClassTable
from services.config import STATS_WINDOW_CASES
from services.metrics import COMPLETED, OUTCOMES, SECONDS_BUCKETS, new_registry

CASE_LOG_MAX_BYTES = 64 * 1024 * 1024   # then it is rotated to .1, .2, ...
CASE_LOG_BACKUPS = 5                    # rotated files kept

CASE_LOG_MODE = 0o600  # case ids may be accession numbers


def summarise(times_s) -> dict:
    """{"cases", "mean_s", "std_s", "cv", "p50_s", "p95_s"} of completion times in seconds.

    std is the sample standard deviation (n - 1); cv = std / mean; all 0.0 for no data
    (std and cv 0.0 for one value). Percentiles interpolate linearly (NumPy's default).
    """
    t = np.asarray(list(times_s), dtype=np.float64)
    if t.size == 0:
        return {"cases": 0, "mean_s": 0.0, "std_s": 0.0, "cv": 0.0, "p50_s": 0.0, "p95_s": 0.0}
    mean = float(t.mean())
    std = float(t.std(ddof=1)) if t.size > 1 else 0.0
    return {
        "cases": int(t.size),
        "mean_s": mean,
        "std_s": std,
        "cv": std / mean if mean > 0 else 0.0,
        "p50_s": float(np.percentile(t, 50)),
        "p95_s": float(np.percentile(t, 95)),
    }


class ClassStats:
    """Completion times per request class; thread-safe.

    window: how many recent times per class the statistics cover. `cases` in `summary`
    counts every completed case since start, the other figures cover the window. Cases
    with another outcome (failed, cancelled) are counted apart (`outcomes`).
    """

    def __init__(self, classes: ClassTable, window: int = STATS_WINDOW_CASES):
        self.classes = classes
        self._times = {c.name: deque(maxlen=window) for c in classes}
        self._counts = {c.name: dict.fromkeys(OUTCOMES, 0) for c in classes}
        self._lock = threading.Lock()

    def add(self, class_name: str, total_s: float, outcome: str = "ok") -> None:
        """Count a case of `outcome`; its time joins the statistics only when it completed."""
        with self._lock:
            self._counts[class_name][outcome] += 1
            if outcome in COMPLETED:
                self._times[class_name].append(float(total_s))

    def outcomes(self, class_name: str) -> dict[str, int]:
        """{outcome: cases} of the class since start."""
        with self._lock:
            return dict(self._counts[class_name])

    def summary(self, class_name: str) -> dict:
        """summarise() of the class's window, with "cases" = all completed cases, "dscp" and "recent_s"."""
        with self._lock:
            times = list(self._times[class_name])
            count = sum(self._counts[class_name][o] for o in COMPLETED)
        out = summarise(times)
        out.update(request_class=class_name, dscp=self.classes[class_name].dscp,
                   cases=count, recent_s=times[-50:])
        return out

    def collect(self):
        """Prometheus collector protocol: per-class gauges computed on each scrape."""
        names = [c.name for c in self.classes]
        cases = CounterMetricFamily("pathmaster_cases", "Cases ended, by outcome", labels=["class", "outcome"])
        gauges = {
            key: GaugeMetricFamily(f"pathmaster_case_{key}", help_, labels=["class"])
            for key, help_ in [
                ("mean_seconds", "Mean case completion time (recent window of completed cases)"),
                ("std_seconds", "Standard deviation of case completion time (recent window)"),
                ("cv", "Coefficient of variation of case completion time (recent window)"),
                ("p50_seconds", "Median case completion time (recent window)"),
                ("p95_seconds", "95th percentile of case completion time (recent window)"),
            ]
        }
        fields = {"mean_seconds": "mean_s", "std_seconds": "std_s", "cv": "cv",
                  "p50_seconds": "p50_s", "p95_seconds": "p95_s"}
        for name in names:
            for outcome, count in self.outcomes(name).items():
                cases.add_metric([name, outcome], count)
            s = self.summary(name)
            for key, gauge in gauges.items():
                gauge.add_metric([name], s[fields[key]])
        yield cases
        yield from gauges.values()


class CoordinatorMetrics:
    """The coordinator's Prometheus registry (one per coordinator: several may run in one
    process) and its metrics, with the per-class statistics `stats` as gauges.

    case_seconds{class, outcome}: each case's time, from arrival to its summary;
    site_seconds{site, class, outcome}: each site call, from sending to its answer or
    failure (outcome "ok" or "failed"); sites_up{site}: 1 while the site's health says
    SERVING, 0 otherwise or when it cannot be reached (sitewatch.py); in_flight{class}:
    cases in progress.
    """

    def __init__(self, stats: ClassStats):
        self.stats = stats
        self.registry = new_registry("coordinator")
        self.registry.register(stats)
        self.case_seconds = Histogram("pathmaster_case_seconds", "Case time, arrival to summary",
                                      ["class", "outcome"], registry=self.registry, buckets=SECONDS_BUCKETS)
        self.site_seconds = Histogram("pathmaster_site_call_seconds", "A site call's time, sent to answer or failure",
                                      ["site", "class", "outcome"], registry=self.registry, buckets=SECONDS_BUCKETS)
        self.sites_up = Gauge("pathmaster_site_up", "1 while the site's health says SERVING",
                              ["site"], registry=self.registry)
        self.in_flight = Gauge("pathmaster_cases_in_flight", "Cases in progress", ["class"],
                               registry=self.registry)
        for c in stats.classes:
            self.in_flight.labels(c.name)
            for outcome in OUTCOMES:
                self.case_seconds.labels(c.name, outcome)

    def case(self, class_name: str, outcome: str, total_s: float) -> None:
        """A case ended: its histogram and the per-class statistics (completed cases only)."""
        self.case_seconds.labels(class_name, outcome).observe(total_s)
        self.stats.add(class_name, total_s, outcome)

    def site_call(self, site: str, class_name: str, ok: bool, seconds: float) -> None:
        self.site_seconds.labels(site, class_name, "ok" if ok else "failed").observe(seconds)


class _PrivateRotatingFile(RotatingFileHandler):
    """A RotatingFileHandler whose files are created readable by their owner only (0600)."""

    def _open(self):
        return open(self.baseFilename, self.mode, encoding=self.encoding, errors=self.errors,
                    opener=lambda path, flags: os.open(path, flags, CASE_LOG_MODE))


class CaseLog:
    """Completion records appended as JSON lines to `path` (None: records are dropped).

    Case ids may be accession numbers: each record names its case by
    ``pathmaster.ids.keyed_id`` under `key` (the deployment's secret), or as sent when `key`
    is None (the operator kept them: ``keep_case_ids``), and says which in "case_ids"
    ("keyed" or "kept"). The file is created mode 0600 (an existing one is made so), and
    rotated when it passes `max_bytes` (to path.1, path.2, ... keeping `backups`;
    ``logging.handlers.RotatingFileHandler``).
    """

    def __init__(self, path: Path | None, max_bytes: int = CASE_LOG_MAX_BYTES, backups: int = CASE_LOG_BACKUPS,
                 key: bytes | None = None):
        self.path = Path(path) if path else None
        self.key = key
        self._handler = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                os.chmod(self.path, CASE_LOG_MODE)
            self._handler = _PrivateRotatingFile(self.path, maxBytes=max_bytes, backupCount=backups,
                                                 encoding="utf-8", delay=True)

    def case_name(self, case_id: str) -> str:
        """How this log names the case `case_id`: its keyed hash, or the id when kept."""
        from pathmaster.ids import keyed_id

        return case_id if self.key is None else keyed_id(case_id, self.key)

    def write(self, record: dict) -> None:
        """Append `record` (a dict with "case_id", as the client sent it), the case named
        as `case_name` says."""
        if self._handler is None:
            return
        named = {**record, "case_id": self.case_name(record["case_id"]),
                 "case_ids": "kept" if self.key is None else "keyed"}
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **named}, sort_keys=True)
        self._handler.handle(logging.makeLogRecord({"msg": line, "levelno": logging.INFO}))
        self._handler.flush()

    def close(self) -> None:
        if self._handler is not None:
            self._handler.close()
