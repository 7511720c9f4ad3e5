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

import struct
import zlib
from collections import deque
from typing import Hashable

from qos.cisco import (CONGESTIVE_DISCARD_PACKETS, WFQ_DYNAMIC_QUEUES, WFQ_HOLD_QUEUE_PACKETS,
                       WFQ_WEIGHT_NUMERATOR)
from qos.emulator.disciplines.base import OVERFLOW, TAIL, Discipline, Drops, PacketQueue
from qos.emulator.packet import Packet

FAIR_QUEUE_CAP_PACKETS = 1000  # flow fair queuing (the emulator's `fq`) buffer cap, all flows

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

    def __init__(self, weights: dict[str, float], limit: int = CONGESTIVE_DISCARD_PACKETS, default_weight: float = 1.0):
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

    def __init__(self, limit: int = FAIR_QUEUE_CAP_PACKETS, quantum: int = MTU_QUANTUM):
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


def ios_weight(dscp: int) -> int:
    """Cisco IOS's WFQ weight of a packet: 32384 // (IP precedence + 1) (IOS 12.0(5)T and later).

    Parameters
    ----------
    dscp : int
        The packet's DiffServ code point, 0-63; its IP precedence is the top three bits.

    Returns
    -------
    int
        The weight; a lower weight is a larger share (precedence 5 gets 6x precedence 0).
    """
    return WFQ_WEIGHT_NUMERATOR // ((dscp >> 3) + 1)


class FlowWfq(Discipline):
    """Cisco IOS flow-based weighted fair queuing (`fair-queue` on an interface).

    Each conversation (source and destination address, protocol, ports and ToS, hashed into
    `dynamic_queues` queues) has its own FIFO. An arriving packet gets a sequence number:
    the number of the packet ahead of it in its queue, or, when its queue is empty, the
    number of the packet last sent, plus ``ios_weight(dscp) * length``. The transmitter
    always sends the head packet with the lowest number, so backlogged conversations share
    the link in proportion to (precedence + 1) and small packets are not stuck behind big ones.

    Drops, as IOS: a full WFQ system (`hold_limit`, 1000 packets by default) drops the
    arrival. When the arrival's conversation already holds `congestive_discard` packets
    (64), the packet with the highest sequence number anywhere is dropped instead if it is
    in another conversation, else the arrival is (Cisco's "WFQ modified tail drop", as
    described in Odom's DQOS guide, a best recollection; IOS's own code is not public).

    Parameters
    ----------
    congestive_discard : int
        Packets one conversation may hold before its arrivals are discarded.
    dynamic_queues : int
        Conversation queues the flows are hashed into (16-4096 in IOS).
    hold_limit : int
        Packets the whole system may hold.
    """

    name = "flow_wfq"

    def __init__(self, congestive_discard: int = CONGESTIVE_DISCARD_PACKETS,
                 dynamic_queues: int = WFQ_DYNAMIC_QUEUES,
                 hold_limit: int = WFQ_HOLD_QUEUE_PACKETS):
        if congestive_discard < 1 or dynamic_queues < 1 or hold_limit < 1:
            raise ValueError(f"fair-queue needs positive congestive discard threshold, queues and hold "
                             f"limit, got {congestive_discard}, {dynamic_queues}, {hold_limit}")
        self.congestive_discard = int(congestive_discard)
        self.dynamic_queues = int(dynamic_queues)
        self.hold_limit = int(hold_limit)
        self._queues: dict[int, deque[tuple[float, Packet]]] = {}  # conversation -> (sequence number, packet)
        self._count = 0
        self._bytes = 0
        self._round = 0.0  # the sequence number of the packet last sent

    def conversation(self, pkt: Packet) -> int:
        """The queue a packet belongs to: its flow and ToS, hashed into `dynamic_queues`."""
        flow = pkt.flow or (b"", b"", 0, 0, 0)
        # crc32, not hash(): the same flow must land in the same queue in every process.
        key = flow[0] + flow[1] + struct.pack("!BHHB", flow[2] & 0xFF, flow[3], flow[4], pkt.dscp)
        return zlib.crc32(key) % self.dynamic_queues

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        if self._count >= self.hold_limit:
            return [(pkt, TAIL)]
        key = self.conversation(pkt)
        queue = self._queues.get(key)
        last = queue[-1][0] if queue else self._round
        number = last + ios_weight(pkt.dscp) * pkt.length
        drops: Drops = []
        if queue is not None and len(queue) >= self.congestive_discard:
            worst_key = max(self._queues, key=lambda k: self._queues[k][-1][0])
            worst = self._queues[worst_key]
            if worst_key == key or worst[-1][0] <= number:
                return [(pkt, TAIL)]
            _, victim = worst.pop()
            self._count -= 1
            self._bytes -= victim.length
            if not worst:
                del self._queues[worst_key]
            drops.append((victim, OVERFLOW))
        self._queues.setdefault(key, deque()).append((number, pkt))
        self._count += 1
        self._bytes += pkt.length
        return drops

    def dequeue(self, now: float) -> Packet | None:
        if not self._count:
            return None
        key = min(self._queues, key=lambda k: self._queues[k][0][0])
        queue = self._queues[key]
        self._round, pkt = queue.popleft()
        if not queue:
            del self._queues[key]
        self._count -= 1
        self._bytes -= pkt.length
        return pkt

    def __len__(self) -> int:
        return self._count

    def backlog_bytes(self) -> int:
        return self._bytes
