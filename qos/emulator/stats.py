"""Per-class counters of one emulated link direction, and the per-run JSON they end up in.

For every class: packets and bytes that arrived, were queued and were sent, drops by
reason, and the mean and max queueing delay (arrival to the start of transmission,
shaping hold time included). A coarse time series of the backlog (and of WRED's
average) is kept too, so plots can be drawn from the raw data afterwards.
"""

from __future__ import annotations

import bisect
import json
import os
from collections import Counter
from pathlib import Path


class QueueCounters:
    """Counters of one class on one link direction."""

    __slots__ = ("arrived_packets", "arrived_bytes", "enqueued_packets", "enqueued_bytes",
                 "sent_packets", "sent_bytes", "drops", "delay_sum", "delay_max")

    def __init__(self):
        self.arrived_packets = self.arrived_bytes = 0
        self.enqueued_packets = self.enqueued_bytes = 0
        self.sent_packets = self.sent_bytes = 0
        self.drops: Counter[str] = Counter()
        self.delay_sum = 0.0
        self.delay_max = 0.0

    def to_dict(self) -> dict:
        return {
            "arrived_packets": self.arrived_packets, "arrived_bytes": self.arrived_bytes,
            "enqueued_packets": self.enqueued_packets, "enqueued_bytes": self.enqueued_bytes,
            "sent_packets": self.sent_packets, "sent_bytes": self.sent_bytes,
            "drops": dict(self.drops), "dropped_packets": sum(self.drops.values()),
            "queueing_delay_mean_s": self.delay_sum / self.sent_packets if self.sent_packets else None,
            "queueing_delay_max_s": self.delay_max if self.sent_packets else None,
        }


class LinkStats:
    """Counters of one link direction, by class, plus a backlog time series.

    `sample_interval` (s) spaces the time series; `max_samples` bounds its memory.
    """

    def __init__(self, sample_interval: float = 0.1, max_samples: int = 100_000):
        self.classes: dict[str, QueueCounters] = {}
        # On a shared medium: station -> class -> counters, so a drop is told by the queue it
        # happened in (the master's card, the router's port) and not only by the medium.
        self.stations: dict[str, dict[str, Counter]] = {}
        self.samples: list[list[float]] = []
        self.sample_fields: list[str] = ["t_s", "backlog_packets", "backlog_bytes"]
        self.sample_interval = sample_interval
        self.max_samples = max_samples
        self._next_sample = 0.0

    def of(self, klass: str) -> QueueCounters:
        stats = self.classes.get(klass)
        if stats is None:
            stats = self.classes[klass] = QueueCounters()
        return stats

    def arrived(self, klass: str, length: int) -> None:
        s = self.of(klass)
        s.arrived_packets += 1
        s.arrived_bytes += length

    def enqueued(self, klass: str, length: int) -> None:
        s = self.of(klass)
        s.enqueued_packets += 1
        s.enqueued_bytes += length

    def dropped(self, klass: str, reason: str, station: str = "") -> None:
        self.of(klass).drops[reason] += 1
        if station:
            self._station(station, klass)[reason] += 1

    def _station(self, station: str, klass: str) -> Counter:
        by_class = self.stations.get(station)
        if by_class is None:
            by_class = self.stations[station] = {}
        counts = by_class.get(klass)
        if counts is None:
            counts = by_class[klass] = Counter()
        return counts

    def sent(self, klass: str, length: int, queueing_delay: float, station: str = "") -> None:
        if station:
            counts = self._station(station, klass)
            counts["sent_packets"] += 1
            counts["sent_bytes"] += length
        s = self.of(klass)
        s.sent_packets += 1
        s.sent_bytes += length
        s.delay_sum += queueing_delay
        if queueing_delay > s.delay_max:
            s.delay_max = queueing_delay

    def sample_due(self, now: float) -> bool:
        """Whether `sample` should be called at `now` (at most once per `sample_interval`)."""
        return now >= self._next_sample and len(self.samples) < self.max_samples

    def sample(self, now: float, backlog_packets: int, backlog_bytes: int, extra: dict) -> None:
        """Record the backlog (and discipline-specific `extra` values) at `now`."""
        if len(self.sample_fields) == 3 and extra:
            self.sample_fields += list(extra)
        self.samples.append([round(now, 6), backlog_packets, backlog_bytes, *extra.values()])
        self._next_sample = now + self.sample_interval

    def to_dict(self, samples: bool = True) -> dict:
        """Counters by class; with `samples`, also the backlog time series."""
        out = {"classes": {k: v.to_dict() for k, v in sorted(self.classes.items())}}
        if self.stations:  # per station and class: sent_packets, sent_bytes and drops by reason
            out["stations"] = {name: {k: dict(c) for k, c in sorted(by_class.items())}
                               for name, by_class in sorted(self.stations.items())}
        if samples:
            out["sample_fields"] = self.sample_fields
            out["samples"] = self.samples
        return out


# The emulator's release lateness (actual minus scheduled release, s) is also counted in a
# cumulative histogram over these edges (10 per decade, 1 us to 10 s; bin 0: below 1 us, the
# last: 10 s and more), written with every progress snapshot, so that the lateness during
# any window (one experiment run) is the difference of two snapshots' counts.
LATENESS_EDGES_S = tuple(10.0 ** (e / 10) for e in range(-60, 11))


def lateness_bin(late_s: float) -> int:
    """The histogram bin (index into counts of len(LATENESS_EDGES_S) + 1) of one lateness."""
    return bisect.bisect_right(LATENESS_EDGES_S, late_s)


def histogram_quantiles(counts: list[int], qs=(0.5, 0.99, 1.0)) -> dict[float, float | None]:
    """Upper bin edges at which the cumulative `counts` reach each quantile in `qs`.

    Parameters
    ----------
    counts : list of int
        Lateness histogram (len(LATENESS_EDGES_S) + 1 bins).
    qs : tuple of float
        Quantiles in (0, 1]; 1.0 gives the upper edge of the highest non-empty bin (the max,
        to within a bin: +26 %).

    Returns
    -------
    dict
        q -> seconds (the last bin reports its lower edge, 10 s); None for an empty histogram.
    """
    total = sum(counts)
    out: dict[float, float | None] = {}
    for q in qs:
        if total == 0:
            out[q] = None
            continue
        need, running = q * total, 0
        for i, c in enumerate(counts):
            running += c
            if running >= need and c:
                out[q] = LATENESS_EDGES_S[min(i, len(LATENESS_EDGES_S) - 1)]
                break
    return out


def write_json_atomic(path: str | Path, data: dict, durable: bool = True) -> None:
    """Write `data` as JSON so a reader never sees half a file (temp file, then rename).

    `durable` also waits for the disk (fsync); progress snapshots skip that wait.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
