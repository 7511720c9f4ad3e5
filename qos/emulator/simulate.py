"""Drive a `EmulatedLink` offline on its virtual clock: arrivals in, release times out.

Useful to try a configuration without a network (and the unit tests' workhorse).
"""

from __future__ import annotations

from qos.emulator.link import EmulatedLink
from qos.emulator.packet import Packet


def synthetic_packet(length: int = 1500, dscp: int = 0, flow: int = 0) -> Packet:
    """A packet of `length` bytes and `dscp`; `flow` tells flows apart (as the source port)."""
    return Packet(length, dscp, (b"\x0a\x00\x00\x01", b"\x0a\x00\x00\x02", 6, flow, 5201))


def constant_rate(rate_bps: float, duration: float, length: int = 1500, dscp: int = 0,
                  flow: int = 0, start: float = 0.0) -> list[tuple[float, Packet]]:
    """(time, packet) arrivals of `length`-byte packets at `rate_bps` bits/s for `duration` s."""
    gap = length * 8 / rate_bps
    return [(start + i * gap, synthetic_packet(length, dscp, flow)) for i in range(int(duration / gap))]


def simulate(link: EmulatedLink, arrivals: list[tuple[float, Packet]], until: float) -> list[tuple[float, Packet]]:
    """Feed (time, packet) arrivals into `link`; return every (release time, packet) up to `until`."""
    out = []
    for t, pkt in sorted(arrivals, key=lambda a: a[0]):
        out += link.advance(t)
        link.enqueue(pkt, t)
    out += link.advance(until)
    return out
