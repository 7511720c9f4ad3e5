"""Strict priority queuing with four queues, as Cisco's priority queuing (PQ).

Cisco PQ has the queues high, medium, normal and low; a lower queue is served only
when every higher one is empty. Unclassified traffic goes to `normal`, and the default
queue limits are 20, 40, 60 and 80 packets, both as in Cisco IOS.
"""

from __future__ import annotations

from qos.cisco import PRIORITY_QUEUE_LIMITS_PACKETS
from qos.emulator.disciplines.base import TAIL, Discipline, Drops, PacketQueue
from qos.emulator.packet import Packet

BANDS = ("high", "medium", "normal", "low")
DEFAULT_LIMITS = dict(zip(BANDS, PRIORITY_QUEUE_LIMITS_PACKETS))


class Priority(Discipline):
    """Strict priority over four bands.

    Parameters
    ----------
    bands : dict
        Class name -> band name (one of `BANDS`). Classes not listed go to `default`.
    default : str
        Band of unlisted classes ("normal", as Cisco PQ).
    limits : dict, optional
        Band name -> queue limit in packets; missing bands keep `DEFAULT_LIMITS`.
    """

    name = "priority"

    def __init__(self, bands: dict[str, str], default: str = "normal",
                 limits: dict[str, int] | None = None):
        for klass, band in list(bands.items()) + [("default", default)]:
            if band not in BANDS:
                raise ValueError(f"class {klass!r}: unknown priority band {band!r}; "
                                 f"bands are {', '.join(BANDS)}")
        unknown = set(limits or {}) - set(BANDS)
        if unknown:
            raise ValueError(f"limits for unknown bands {sorted(unknown)}; bands are {', '.join(BANDS)}")
        merged = {**DEFAULT_LIMITS, **(limits or {})}
        self.queues = [PacketQueue(merged[b]) for b in BANDS]
        self._index = {klass: BANDS.index(band) for klass, band in bands.items()}
        self._default = BANDS.index(default)
        self._count = 0

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        queue = self.queues[self._index.get(pkt.klass, self._default)]
        if queue.full():
            return [(pkt, TAIL)]
        queue.push(pkt)
        self._count += 1
        return []

    def dequeue(self, now: float) -> Packet | None:
        if not self._count:
            return None
        for queue in self.queues:
            if queue:
                self._count -= 1
                return queue.pop()
        raise AssertionError("packet count and queues disagree")

    def __len__(self) -> int:
        return self._count

    def backlog_bytes(self) -> int:
        return sum(q.bytes for q in self.queues)
