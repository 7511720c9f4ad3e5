"""Weighted fair queuing by deficit round robin (Shreedhar & Varghese, 1995).

Two flavours share one round-robin core:

* `ClassWfq`: one queue per class with a weight; a backlogged class gets a share of the
  link proportional to its weight (Cisco's class-based WFQ, "bandwidth" per class).
* `FlowFq`: one queue per flow (5-tuple), equal weights, and one overall buffer cap;
  when the buffer is full the longest flow loses a packet, so a greedy flow cannot
  push out a thin one (Cisco's flow-based WFQ with its hold-queue limit).

DRR serves each backlogged queue in turn; a queue may send while its deficit counter
covers the head packet and earns `quantum` bytes per round. With quanta of at least one
MTU every visit sends something, and long-run shares are proportional to the quanta.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable

from pathmaster import defaults
from qos.emulator.disciplines.base import OVERFLOW, TAIL, Discipline, Drops, PacketQueue
from qos.emulator.packet import Packet

MTU_QUANTUM = 1514  # bytes: one full Ethernet frame per unit of weight


class _DeficitRoundRobin:
    """The DRR core over queues named by any hashable key."""

    def __init__(self):
        self.queues: dict[Hashable, PacketQueue] = {}
        self.quantum: dict[Hashable, int] = {}
        self.deficit: dict[Hashable, int] = {}
        self.active: deque[Hashable] = deque()
        self.count = 0

    def push(self, key: Hashable, pkt: Packet) -> None:
        queue = self.queues[key]
        if not queue:
            self.active.append(key)
            self.deficit[key] = 0
        queue.push(pkt)
        self.count += 1

    def pop(self) -> Packet | None:
        if not self.count:
            return None
        active, deficit = self.active, self.deficit
        while True:
            key = active[0]
            queue = self.queues[key]
            if deficit[key] >= queue.head().length:
                pkt = queue.pop()
                deficit[key] -= pkt.length
                if not queue:
                    deficit[key] = 0
                    active.popleft()
                self.count -= 1
                return pkt
            # Not enough credit: earn this round's quantum and let the next queue go.
            deficit[key] += self.quantum[key]
            active.rotate(-1)

    def backlog_bytes(self) -> int:
        return sum(q.bytes for q in self.queues.values())


class ClassWfq(Discipline):
    """Class-based weighted fair queuing.

    Parameters
    ----------
    weights : dict
        Class name -> positive weight; shares of a saturated link follow the weights of
        the backlogged classes. Classes not listed share the "default" class.
    limit : int
        Queue limit per class, packets.
    default_weight : float
        Weight of the default class.
    """

    name = "wfq"

    def __init__(self, weights: dict[str, float], limit: int = defaults.CONGESTIVE_DISCARD_PACKETS, default_weight: float = 1.0):
        self._drr = _DeficitRoundRobin()
        all_weights = {**weights, "default": weights.get("default", default_weight)}
        smallest = min(all_weights.values())
        for klass, weight in all_weights.items():
            if not weight > 0:
                raise ValueError(f"class {klass!r}: WFQ weight must be positive, got {weight}")
            self._drr.queues[klass] = PacketQueue(limit)
            # The smallest weight gets one MTU per round so every visit can send.
            self._drr.quantum[klass] = round(MTU_QUANTUM * weight / smallest)
        self.weights = all_weights

    def _key(self, klass: str) -> str:
        return klass if klass in self._drr.queues else "default"

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        key = self._key(pkt.klass)
        if self._drr.queues[key].full():
            return [(pkt, TAIL)]
        self._drr.push(key, pkt)
        return []

    def dequeue(self, now: float) -> Packet | None:
        return self._drr.pop()

    def __len__(self) -> int:
        return self._drr.count

    def backlog_bytes(self) -> int:
        return self._drr.backlog_bytes()


class FlowFq(Discipline):
    """Flow-based fair queuing: one DRR queue per 5-tuple under one buffer cap (packets)."""

    name = "fq"

    def __init__(self, limit: int = defaults.FAIR_QUEUE_CAP_PACKETS, quantum: int = MTU_QUANTUM):
        if limit < 1:
            raise ValueError(f"fair-queue buffer cap must be at least 1 packet, got {limit}")
        self.limit = int(limit)
        self._quantum = int(quantum)
        self._drr = _DeficitRoundRobin()

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        drr = self._drr
        queue = drr.queues.get(pkt.flow)
        if queue is None:
            # Per-flow queues are bounded only by the overall cap.
            queue = drr.queues[pkt.flow] = PacketQueue(self.limit)
            drr.quantum[pkt.flow] = self._quantum
        drops: Drops = []
        if drr.count >= self.limit:
            longest = max(drr.active, key=lambda k: drr.queues[k].bytes)
            if longest == pkt.flow or drr.queues[longest].bytes <= queue.bytes:
                if not queue:
                    self._forget(pkt.flow)
                return [(pkt, OVERFLOW)]
            victim = drr.queues[longest].pop_tail()
            drr.count -= 1
            if not drr.queues[longest]:
                drr.active.remove(longest)
                self._forget(longest)
            drops.append((victim, OVERFLOW))
        drr.push(pkt.flow, pkt)
        return drops

    def dequeue(self, now: float) -> Packet | None:
        pkt = self._drr.pop()
        if pkt is not None and not self._drr.queues[pkt.flow]:
            self._forget(pkt.flow)
        return pkt

    def _forget(self, flow) -> None:
        # Idle flows leave the table so it stays as small as the set of active flows.
        drr = self._drr
        del drr.queues[flow], drr.quantum[flow]
        drr.deficit.pop(flow, None)

    def __len__(self) -> int:
        return self._drr.count

    def backlog_bytes(self) -> int:
        return self._drr.backlog_bytes()
