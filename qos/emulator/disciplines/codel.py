"""CoDel, Controlled Delay active queue management (RFC 8289), and CoDel per DiffServ class.

CoDel drops at the head of a queue, when a packet leaves, from how long that packet waited
(its sojourn time), not from how many packets are queued. If the sojourn time has stayed
above TARGET (5 ms) for a whole INTERVAL (100 ms), the queue is "bad": CoDel drops that
packet and enters its dropping state, and while the sojourn time stays above TARGET it drops
the packet at the head again at times INTERVAL / sqrt(count) apart (the control law: the drop
rate grows as the square root of the drops so far, which is what a TCP flow's rate answers to
linearly). As soon as a packet leaves with a sojourn time below TARGET, or when the queue holds
at most one MTU, it stops dropping. Coming back into the dropping state soon after it left
(within 16 intervals), it resumes near the drop rate that controlled the queue last time.

This follows the pseudo-code of RFC 8289 §5 (`dodequeue`, `dequeue`, `control_law`) on the
emulator's virtual clock, in float seconds; the Linux and ns-3 implementations' fixed-point
inverse square root is not needed here. No library implements CoDel for a user-space
packet scheduler in Python, hence this module.

* `Codel`: one FIFO managed by CoDel (Linux's `codel` qdisc).
* `ClassCodel`: DiffServ classes, each its own queue managed by its own CoDel, scheduled by
  deficit round robin with per-class weights (as `ClassWfq`; CAKE's diffserv tins in spirit):
  the competing class's standing queue is kept near TARGET without touching the others.
"""

from __future__ import annotations

import math
from collections import deque

from qos.emulator.disciplines.base import TAIL, Discipline, Drops, PacketQueue
from qos.emulator.disciplines.fifo import Fifo
from qos.emulator.disciplines.wfq import MTU_QUANTUM
from qos.emulator.packet import Packet

# CoDel (RFC 8289, Nichols, Jacobson et al., 2018), its published constants: TARGET 5 ms of
# standing queue (§4.4) and INTERVAL 100 ms (§4.5, a worst-case RTT); Linux's `codel` qdisc
# uses the same defaults and a 1000-packet buffer limit (tc-codel(8)).
CODEL_TARGET_MS = 5.0
CODEL_INTERVAL_MS = 100.0
CODEL_LIMIT_PACKETS = 1000

CODEL = "codel"  # drop reason: CoDel dropped the packet at the head of its queue
MTU_BYTES = 1514  # RFC 8289's maxpacket: a queue holding at most this is never "bad"


class CodelState:
    """The controller of one queue: RFC 8289's per-queue variables and its dequeue.

    Parameters
    ----------
    target, interval : float
        Seconds (RFC 8289: 0.005 and 0.1).
    """

    __slots__ = ("target", "interval", "first_above_time", "drop_next", "count", "lastcount", "dropping")

    def __init__(self, target: float = CODEL_TARGET_MS / 1000,
                 interval: float = CODEL_INTERVAL_MS / 1000):
        if not (0 < target < interval):
            raise ValueError(f"CoDel needs 0 < target < interval, got target={target} s, interval={interval} s")
        self.target, self.interval = float(target), float(interval)
        self.first_above_time: float | None = None  # when the sojourn time will have been above target for an interval
        self.drop_next = 0.0   # the next drop's time, in the dropping state
        self.count = 0         # drops since entering the dropping state
        self.lastcount = 0     # count when the dropping state was last entered
        self.dropping = False

    def control_law(self, t: float) -> float:
        """The time of the next drop after a drop at `t`: INTERVAL / sqrt(count) later."""
        return t + self.interval / math.sqrt(self.count)

    def _dodequeue(self, queue: PacketQueue, now: float) -> tuple[Packet | None, bool]:
        """Pop the head of `queue`: (packet or None, whether CoDel may drop it)."""
        if not queue:
            self.first_above_time = None
            return None, False
        pkt = queue.pop()
        sojourn = now - pkt.arrival
        if sojourn < self.target or queue.bytes <= MTU_BYTES:
            self.first_above_time = None  # below target: good queue for at least an interval
            return pkt, False
        if self.first_above_time is None:
            self.first_above_time = now + self.interval
            return pkt, False
        return pkt, now >= self.first_above_time

    def dequeue(self, queue: PacketQueue, now: float, dropped: Drops) -> Packet | None:
        """The packet `queue` sends at `now` (None: empty); those CoDel drops first are
        appended to `dropped` with the reason CODEL."""
        pkt, ok_to_drop = self._dodequeue(queue, now)
        if pkt is None:
            self.dropping = False
            return None
        if self.dropping:
            if not ok_to_drop:
                self.dropping = False  # sojourn time below target: leave the dropping state
            while self.dropping and now >= self.drop_next:
                dropped.append((pkt, CODEL))
                self.count += 1
                pkt, ok_to_drop = self._dodequeue(queue, now)
                if not ok_to_drop:
                    self.dropping = False
                else:
                    self.drop_next = self.control_law(self.drop_next)
        elif ok_to_drop:
            dropped.append((pkt, CODEL))
            pkt, _ = self._dodequeue(queue, now)
            self.dropping = True
            # Back soon after leaving: start near the drop rate that controlled the queue then.
            delta = self.count - self.lastcount
            self.count = delta if delta > 1 and now - self.drop_next < 16 * self.interval else 1
            self.lastcount = self.count
            self.drop_next = self.control_law(now)
        return pkt


class Codel(Fifo):
    """One FIFO of at most `limit` packets (tail drop when full), managed by CoDel.

    Parameters
    ----------
    limit : int
        Packets (Linux's codel: 1000).
    target_ms, interval_ms : float
        CoDel's TARGET and INTERVAL, milliseconds (RFC 8289: 5 and 100).
    """

    name = "codel"

    def __init__(self, limit: int = CODEL_LIMIT_PACKETS, target_ms: float = CODEL_TARGET_MS,
                 interval_ms: float = CODEL_INTERVAL_MS):
        super().__init__(limit)
        self.codel = CodelState(target_ms / 1000, interval_ms / 1000)
        self._dropped: Drops = []

    def dequeue(self, now: float) -> Packet | None:
        return self.codel.dequeue(self.queue, now, self._dropped)

    def take_dropped(self) -> Drops:
        dropped, self._dropped = self._dropped, []
        return dropped

    def snapshot(self) -> dict:
        return {"codel_dropping": int(self.codel.dropping), "codel_count": self.codel.count}


class ClassCodel(Discipline):
    """DiffServ classes, each a queue with its own CoDel, served by deficit round robin.

    Parameters
    ----------
    weights : dict
        Class name -> positive weight (shares of a saturated link, as `ClassWfq`); classes
        not listed share "default".
    limit : int
        Packets per class queue.
    target_ms, interval_ms : float
        CoDel's TARGET and INTERVAL for every class, milliseconds.
    """

    name = "class_codel"

    def __init__(self, weights: dict[str, float], limit: int = CODEL_LIMIT_PACKETS,
                 target_ms: float = CODEL_TARGET_MS, interval_ms: float = CODEL_INTERVAL_MS):
        all_weights = {**weights, "default": weights.get("default", 1.0)}
        for klass, weight in all_weights.items():
            if not weight > 0:
                raise ValueError(f"class {klass!r}: weight must be positive, got {weight}")
        smallest = min(all_weights.values())
        self.weights = all_weights
        self.queues = {k: PacketQueue(limit) for k in all_weights}
        self.codels = {k: CodelState(target_ms / 1000, interval_ms / 1000) for k in all_weights}
        self.quantum = {k: round(MTU_QUANTUM * w / smallest) for k, w in all_weights.items()}
        self.deficit = dict.fromkeys(all_weights, 0)
        self.active: deque[str] = deque()
        self._count = 0
        self._dropped: Drops = []

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        key = pkt.klass if pkt.klass in self.queues else "default"
        queue = self.queues[key]
        if queue.full():
            return [(pkt, TAIL)]
        if not queue:
            self.active.append(key)
            self.deficit[key] = 0
        queue.push(pkt)
        self._count += 1
        return []

    def dequeue(self, now: float) -> Packet | None:
        while self.active:
            key = self.active[0]
            queue = self.queues[key]
            if self.deficit[key] < queue.head().length:
                self.deficit[key] += self.quantum[key]  # this round's credit; the next class goes
                self.active.rotate(-1)
                continue
            before = len(queue)
            pkt = self.codels[key].dequeue(queue, now, self._dropped)
            self._count -= before - len(queue)
            if pkt is not None:
                self.deficit[key] -= pkt.length
            if not queue:
                self.deficit[key] = 0
                self.active.popleft()
            if pkt is not None:
                return pkt
        return None

    def take_dropped(self) -> Drops:
        dropped, self._dropped = self._dropped, []
        return dropped

    def __len__(self) -> int:
        return self._count

    def backlog_bytes(self) -> int:
        return sum(q.bytes for q in self.queues.values())

    def snapshot(self) -> dict:
        return {"codel_dropping": sum(c.dropping for c in self.codels.values())}  # classes dropping now
