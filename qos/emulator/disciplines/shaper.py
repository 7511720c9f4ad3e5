"""Token-bucket shaping of one class: the class's packets wait until the bucket covers them.

A shaper sits in front of the link's scheduler (any discipline): a packet of a shaped
class is held in the shaper's own FIFO until the bucket (filling at `rate`, holding at
most `burst` bytes) has its size in tokens, and only then joins the scheduler. So the
class leaves at no more than `rate` in the long run and `burst` bytes at once, and the
other classes keep whatever the scheduler gives them (Cisco's generic traffic shaping
in front of WFQ, or tc's tbf).
"""

from __future__ import annotations

import math

from qos.cisco import CONGESTIVE_DISCARD_PACKETS
from qos.emulator.disciplines.base import PacketQueue
from qos.emulator.packet import Packet


class TokenBucketShaper:
    """Shape one class to `rate_bps` bits/s with a bucket of `burst` bytes.

    `overhead` bytes are charged per packet on top of the IP length, matching the link's
    per-packet L2 overhead so shaped and link rates are in the same units. `limit` is
    the shaper's FIFO in packets; arrivals beyond it are dropped.
    """

    def __init__(self, rate_bps: float, burst: int, limit: int = CONGESTIVE_DISCARD_PACKETS, overhead: int = 0):
        if rate_bps <= 0:
            raise ValueError(f"shaping rate must be positive, got {rate_bps} bit/s")
        if burst < 1600:
            # A bucket smaller than one full frame would never let such a frame through.
            raise ValueError(f"shaping burst {burst} bytes is smaller than one full frame (1600)")
        self.rate_bytes = rate_bps / 8.0
        self.burst = float(burst)
        self.overhead = int(overhead)
        self.queue = PacketQueue(limit)
        self.tokens = self.burst
        self.last = 0.0

    def _refill(self, now: float) -> None:
        if now > self.last:
            self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate_bytes)
            self.last = now

    def push(self, pkt: Packet, now: float) -> bool:
        """Hold `pkt`; False (and nothing held) when the shaper's FIFO is full."""
        if self.queue.full():
            return False
        self._refill(now)
        self.queue.push(pkt)
        return True

    def next_time(self) -> float:
        """When the head packet conforms (inf when nothing is held)."""
        if not self.queue:
            return math.inf
        missing = self.queue.head().length + self.overhead - self.tokens
        return self.last + max(0.0, missing) / self.rate_bytes

    def pop(self, now: float) -> Packet:
        """Release the head packet at `now` (>= `next_time()`), paying its tokens."""
        self._refill(now)
        pkt = self.queue.pop()
        # Float rounding can leave a hair below zero; the bucket never goes into debt.
        self.tokens = max(0.0, self.tokens - (pkt.length + self.overhead))
        return pkt

    def __len__(self) -> int:
        return len(self.queue)
