"""One direction of an emulated link on a virtual clock: shaping, scheduling, serialisation, delay.

A packet's way through an `EmulatedLink`:

    arrival --loss?--> [shaper of its class] --> scheduler (FIFO/PRIO/WFQ/WRED/CoDel)
        --> transmitter (one packet at a time, (length + overhead) * 8 / rate seconds)
        --> propagation delay line (delay +- jitter, order kept) --> release

Nothing here reads a clock. The caller says what time it is: `enqueue(pkt, now)` for
an arrival and `advance(now)` for the packets due by `now`, and asks `next_event()`
when to come back. Events between two calls are replayed in time order, so the
result does not depend on how late the caller is (only when a packet is released does).
"""

from __future__ import annotations

import math
import random
from collections import deque
from typing import Callable

from qos.emulator.disciplines.base import LOSS, SHAPER, Discipline
from qos.emulator.disciplines.shaper import TokenBucketShaper
from qos.emulator.packet import Packet
from qos.emulator.stats import LinkStats


class EmulatedLink:
    """One direction of a link.

    Parameters
    ----------
    rate_bps : float
        Line rate, bits/s.
    scheduler : Discipline
        Decides admission and order.
    classify : callable
        DSCP (int) -> class name (str).
    delay, jitter : float
        Propagation delay and its uniform spread (+- jitter), seconds. Jitter never
        reorders packets: a packet is never released before the one sent ahead of it.
    loss : float
        Probability (0-1) that an arriving packet is lost on the wire.
    overhead : int
        Bytes added per packet to the IP length when computing serialisation time
        (e.g. 14 for an Ethernet header, 38 with preamble, FCS and inter-frame gap).
    shapers : dict, optional
        Class name -> `TokenBucketShaper` in front of the scheduler; on a shared medium keyed
        (station, class): each station shapes its own packets.
    rng : random.Random, optional
        For loss and jitter (seed it for repeatable runs).
    stats : LinkStats, optional
    """

    def __init__(self, rate_bps: float, scheduler: Discipline, classify: Callable[[int], str],
                 delay: float = 0.0, jitter: float = 0.0, loss: float = 0.0, overhead: int = 0,
                 shapers: dict[str, TokenBucketShaper] | None = None,
                 rng: random.Random | None = None, stats: LinkStats | None = None, name: str = "link"):
        if rate_bps <= 0:
            raise ValueError(f"link rate must be positive, got {rate_bps} bit/s")
        if delay < 0 or jitter < 0 or jitter > delay:
            raise ValueError(f"need 0 <= jitter <= delay, got delay={delay} jitter={jitter}")
        if not 0.0 <= loss < 1.0:
            raise ValueError(f"loss must be in [0, 1), got {loss}")
        if overhead < 0:
            raise ValueError(f"per-packet overhead must be >= 0 bytes, got {overhead}")
        self.name = name
        self.rate_bps = float(rate_bps)
        self.scheduler = scheduler
        self.classify = classify
        self.delay, self.jitter, self.loss = float(delay), float(jitter), float(loss)
        self.overhead = int(overhead)
        self.shapers = dict(shapers or {})
        self.rng = rng or random.Random()
        self.stats = stats or LinkStats()
        self.busy_until = 0.0         # the transmitter is sending until then
        self._last_release = 0.0
        self._in_flight: deque[tuple[float, Packet]] = deque()  # (release time, packet), in order
        self._seconds_per_byte = 8.0 / self.rate_bps

    # -- the caller's interface -------------------------------------------------------

    def enqueue(self, pkt: Packet, now: float) -> None:
        """A packet arrives at `now`. It is classified, maybe lost, shaped or queued."""
        self._run(now)
        pkt.arrival = now
        pkt.klass = klass = self.classify(pkt.dscp)
        stats = self.stats
        stats.arrived(klass, pkt.length)
        if self.loss and self.rng.random() < self.loss:
            self._drop(pkt, LOSS)
            return
        shaper = self.shapers.get(klass if not pkt.station else (pkt.station, klass))
        if shaper is not None:
            if shaper.push(pkt, now):
                stats.enqueued(klass, pkt.length)
            else:
                self._drop(pkt, SHAPER)
            return
        self._schedule(pkt, now)

    def advance(self, now: float) -> list[tuple[float, Packet]]:
        """Replay events up to `now`; return (release time, packet) for those due, in order."""
        self._run(now)
        released = []
        in_flight = self._in_flight
        while in_flight and in_flight[0][0] <= now:
            released.append(in_flight.popleft())
        return released

    def next_event(self) -> float:
        """Virtual time of the next thing that can happen without a new arrival (inf: none)."""
        t = self._in_flight[0][0] if self._in_flight else math.inf
        if len(self.scheduler):
            t = min(t, self.busy_until)
        for shaper in self.shapers.values():
            t = min(t, shaper.next_time())
        return t

    def held(self) -> int:
        """Packets anywhere inside the link (shapers, queue, on the wire)."""
        return len(self.scheduler) + len(self._in_flight) + sum(len(s) for s in self.shapers.values())

    def drain(self) -> list[Packet]:
        """Give back every packet still inside, in no particular order (for shutdown)."""
        out = [p for _, p in self._in_flight]
        self._in_flight.clear()
        for shaper in self.shapers.values():
            while len(shaper):
                out.append(shaper.queue.pop())
        while True:
            pkt = self.scheduler.dequeue(self.busy_until)
            out.extend(victim for victim, _ in self.scheduler.take_dropped())
            if pkt is None:
                return out
            out.append(pkt)

    # -- the event replay -------------------------------------------------------------

    def _schedule(self, pkt: Packet, now: float) -> None:
        dropped = self.scheduler.enqueue(pkt, now)
        admitted = True
        for victim, reason in dropped:
            if victim is pkt:
                admitted = False
            self._drop(victim, reason)
        if admitted and (pkt.klass if not pkt.station else (pkt.station, pkt.klass)) not in self.shapers:
            self.stats.enqueued(pkt.klass, pkt.length)
        if self.busy_until < now:
            self.busy_until = now  # the transmitter was idle: it starts now
        if self.stats.sample_due(now):  # checked first: backlog_bytes() may walk every queue
            sched = self.scheduler
            self.stats.sample(now, len(sched), sched.backlog_bytes(), sched.snapshot())

    def _drop(self, pkt: Packet, reason: str) -> None:
        self.stats.dropped(pkt.klass, reason, pkt.station)
        handle = pkt.handle
        if handle is not None:
            handle.drop()

    def _run(self, now: float) -> None:
        scheduler, shapers = self.scheduler, self.shapers
        while True:
            t_tx = self.busy_until if len(scheduler) else math.inf
            t_shape, shaper = math.inf, None
            for s in shapers.values():
                t = s.next_time()
                if t < t_shape:
                    t_shape, shaper = t, s
            if min(t_tx, t_shape) > now:
                return
            if t_shape <= t_tx:
                # A shaped packet becomes eligible first (on a tie it competes for this slot).
                self._schedule(shaper.pop(t_shape), t_shape)
                continue
            pkt = scheduler.dequeue(t_tx)
            for victim, reason in scheduler.take_dropped():  # an AQM's drops at the head
                self._drop(victim, reason)
            if pkt is not None:  # else all it held was dropped: the transmitter stays idle
                self._transmit(pkt, t_tx)

    def _transmit(self, pkt: Packet, start: float) -> None:
        done = start + (pkt.length + self.overhead) * self._seconds_per_byte
        self.busy_until = done
        self.stats.sent(pkt.klass, pkt.length, start - pkt.arrival, pkt.station)
        release = done + self.delay
        if self.jitter:
            release += self.rng.uniform(-self.jitter, self.jitter)
        if release < self._last_release:
            release = self._last_release
        self._last_release = release
        self._in_flight.append((release, pkt))
