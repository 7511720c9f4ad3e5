"""Weighted random early detection by DSCP (Floyd & Jacobson's RED, weighted per code point).

One FIFO, one exponentially weighted moving average (EWMA) of its length, and per DSCP a
profile {minimum threshold, maximum threshold, mark-probability denominator}:

* average below the minimum: the packet is queued;
* between the thresholds: dropped with a probability rising linearly from 0 to
  1/denominator, spread out by Floyd's count of packets since the last drop;
* at or above the maximum: dropped.

The average follows Cisco: avg <- avg * (1 - 2**-n) + q * 2**-n with the exponential
weighting constant n = 9 by default, updated on every arrival. After an idle period
the average decays as if `packet_time`-long packets had left, as in RED's paper, so a
queue that drained is not punished for its past.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from qos.cisco import (WRED_DEFAULT_PROFILE, WRED_MARK_DENOMINATOR, WRED_MAX_THRESHOLD,
                       WRED_PRECEDENCE_MIN_THRESHOLDS, WRED_WEIGHT_EXPONENT)
from qos.emulator.disciplines.base import TAIL, WRED_EARLY, WRED_FORCED, Discipline, Drops, PacketQueue
from qos.emulator.packet import Packet
from qos.network import ROUTER_QUEUE_PACKETS


@dataclass(frozen=True)
class WredProfile:
    """Thresholds on the average queue (packets) and the drop probability's denominator."""

    min_th: float
    max_th: float
    mark_denominator: float

    def __post_init__(self):
        if not 0 <= self.min_th < self.max_th or self.mark_denominator < 1:
            raise ValueError(
                f"WRED profile needs 0 <= min < max and denominator >= 1, got "
                f"min={self.min_th} max={self.max_th} denominator={self.mark_denominator}")


def _profiles(table: dict[int, tuple]) -> dict[int, WredProfile]:
    return {dscp: WredProfile(*values) for dscp, values in table.items()}


# Cisco IOS defaults for `random-detect dscp-based`, as in the default-values table of the
# `random-detect dscp` command reference: AFx1 32/40, AFx2 28/40, AFx3 24/40, CSn 20+2n/40,
# EF 36/40, everything else 20/40; mark-probability denominator 10 throughout. (The table
# itself could not be fetched again when this was written; a config can override any entry.)
CISCO_DSCP_DEFAULTS: dict[int, WredProfile] = _profiles({
    **{(x << 3) | 2: (32, 40, 10) for x in range(1, 5)},
    **{(x << 3) | 4: (28, 40, 10) for x in range(1, 5)},
    **{(x << 3) | 6: (24, 40, 10) for x in range(1, 5)},
    **{n << 3: (20 + 2 * n, 40, 10) for n in range(1, 8)},
    46: (36, 40, 10),
})
CISCO_DEFAULT_PROFILE = WredProfile(*WRED_DEFAULT_PROFILE)

# Cisco IOS defaults for precedence-based WRED (`random-detect` on an interface, what the
# 2002 routers ran): every DSCP takes its IP precedence's profile (qos.cisco has
# the table and where it comes from).
CISCO_PRECEDENCE_DEFAULTS: dict[int, WredProfile] = {
    dscp: WredProfile(WRED_PRECEDENCE_MIN_THRESHOLDS[dscp >> 3], WRED_MAX_THRESHOLD,
                      WRED_MARK_DENOMINATOR)
    for dscp in range(64)}

# Seed 003 (Q-Pod) thresholds for the AF1 drop precedences: {min, max, 1/denominator}.
SEED003_AF1: dict[int, WredProfile] = _profiles({10: (50, 70, 40), 12: (5, 40, 10), 14: (3, 4, 1)})

CISCO_WEIGHT_EXPONENT = WRED_WEIGHT_EXPONENT


class Wred(Discipline):
    """A FIFO with DSCP-weighted random early detection.

    Parameters
    ----------
    profiles : dict
        DSCP -> `WredProfile`; DSCPs not listed use `default_profile`.
    default_profile : WredProfile
    limit : int
        Physical buffer, packets (tail drop beyond it whatever the average says).
    weight_exponent : int
        n in the EWMA weight 2**-n.
    packet_time : float
        Seconds one typical packet takes on the link; sets how fast the average decays
        while the queue is idle.
    rng : random.Random, optional
        Source of the drop decisions (seed it for repeatable runs).
    """

    name = "wred"

    def __init__(self, profiles: dict[int, WredProfile], default_profile: WredProfile = CISCO_DEFAULT_PROFILE,
                 limit: int = ROUTER_QUEUE_PACKETS, weight_exponent: int = CISCO_WEIGHT_EXPONENT,
                 packet_time: float = 1500 * 8 / 10e6, rng: random.Random | None = None):
        if not 0 <= weight_exponent <= 16:
            raise ValueError(f"WRED weight exponent must be 0-16, got {weight_exponent}")
        if packet_time <= 0:
            raise ValueError(f"WRED packet_time must be positive, got {packet_time}")
        self.queue = PacketQueue(limit)
        self.profiles = dict(profiles)
        self.default_profile = default_profile
        self.weight = 2.0 ** -weight_exponent
        self.packet_time = packet_time
        self.rng = rng or random.Random()
        self.avg = 0.0
        self._idle_since: float | None = 0.0
        self._count: dict[int, int] = {}

    def _update_average(self, now: float) -> None:
        if not self.queue and self._idle_since is not None:
            # Still idle until a packet is actually queued: a dropped arrival does not end it.
            idle_packets = max(0.0, now - self._idle_since) / self.packet_time
            self.avg *= (1.0 - self.weight) ** idle_packets
            self._idle_since = now
        self.avg += self.weight * (len(self.queue) - self.avg)

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        self._update_average(now)
        profile = self.profiles.get(pkt.dscp, self.default_profile)
        avg = self.avg
        if avg >= profile.max_th:
            self._count[pkt.dscp] = 0
            return [(pkt, WRED_FORCED)]
        if avg >= profile.min_th:
            count = self._count.get(pkt.dscp, 0) + 1
            pb = (avg - profile.min_th) / (profile.max_th - profile.min_th) / profile.mark_denominator
            pa = 1.0 if count * pb >= 1.0 else pb / (1.0 - count * pb)
            if self.rng.random() < pa:
                self._count[pkt.dscp] = 0
                return [(pkt, WRED_EARLY)]
            self._count[pkt.dscp] = count
        else:
            self._count[pkt.dscp] = 0
        if self.queue.full():
            return [(pkt, TAIL)]
        self.queue.push(pkt)
        self._idle_since = None
        return []

    def dequeue(self, now: float) -> Packet | None:
        if not self.queue:
            return None
        pkt = self.queue.pop()
        if not self.queue:
            self._idle_since = now
        return pkt

    def __len__(self) -> int:
        return len(self.queue)

    def backlog_bytes(self) -> int:
        return self.queue.bytes

    def snapshot(self) -> dict:
        return {"wred_avg": self.avg}
