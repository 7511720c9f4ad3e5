"""The NFQUEUE process: real packets through the emulated links, one event loop, one thread.

Inside a router's namespace, an iptables rule per link direction sends the forwarded
packets to an NFQUEUE; this process reads them (only their first `HEADER_BYTES`), feeds
each to its direction's `EmulatedLink` at the current time, and gives the kernel its verdict
(accept = send on, drop) when the link releases or drops the packet. Between packets the
loop sleeps in `select` until the next departure, so releasing is driven by one timer.

Order of life, so that no packet meets a queue with nobody reading it:
bind the queues -> insert the iptables rules -> print READY -> loop -> (SIGTERM/SIGINT
or --duration) -> delete the rules -> accept whatever is still held -> write the
statistics -> unbind.

Release lateness (actual minus scheduled release time) is measured for every packet and
reported as median / p99 / max with the statistics.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import random
import select
import signal
import socket
import subprocess
import sys
import time
from array import array
from pathlib import Path

from qos.emulator.config import EmulatorConfig, build_links
from qos.emulator.link import EmulatedLink
from qos.emulator.packet import HEADER_BYTES, MalformedPacket, parse_ipv4
from qos.emulator.stats import LATENESS_EDGES_S, LinkStats, lateness_bin, write_json_atomic

# NFQUEUE holds up to this many packets waiting for a verdict; the kernel's default of
# 1024 overflows silently under a full buffer plus the packets in propagation delay.
QUEUE_MAXLEN = 16384
SOCKET_BUFFER = 8 << 20
LATENESS_SAMPLES_MAX = 2_000_000
PROC_NFQUEUE = Path("/proc/net/netfilter/nfnetlink_queue")
_PR_SET_TIMERSLACK = 29
REALTIME_PRIORITY = 10


class RuleError(RuntimeError):
    """An iptables command failed; the message has the command and iptables' own words."""


def iptables_rule(direction_match: list[str], queue: int, chain: str = "FORWARD") -> list[str]:
    """The iptables rule body (after -I/-D CHAIN) sending matching packets to NFQUEUE `queue`."""
    return [*direction_match, "-j", "NFQUEUE", "--queue-num", str(queue)]


def _iptables(action: str, chain: str, rule: list[str], check: bool = True) -> bool:
    argv = ["iptables", "-w", "5", action, chain, *rule]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuleError(f"{' '.join(argv)!r} failed: {done.stderr.strip()}")
    return done.returncode == 0


def insert_rule(queue: int, match: list[str], chain: str = "FORWARD") -> None:
    _iptables("-I", chain, iptables_rule(match, queue))


def delete_rule(queue: int, match: list[str], chain: str = "FORWARD") -> bool:
    """Delete every copy of the rule; True if there was one."""
    found = False
    while _iptables("-D", chain, iptables_rule(match, queue), check=False):
        found = True
    return found


def nfqueue_unavailable_reason() -> str | None:
    """Why this kernel cannot run the emulator (no NFQUEUE), or None when it can."""
    if not PROC_NFQUEUE.exists():
        # The module loads on first use of the NFQUEUE target; ask for it explicitly once.
        subprocess.run(["modprobe", "-q", "nfnetlink_queue"], capture_output=True, timeout=30)
    if not PROC_NFQUEUE.exists():
        return f"the kernel has no NFQUEUE support ({PROC_NFQUEUE} missing; module nfnetlink_queue)"
    try:
        import netfilterqueue  # noqa: F401
    except ImportError as e:
        return f"the Python package netfilterqueue is missing: {e}"
    return None


def kernel_queue_counters() -> dict[int, dict[str, int]]:
    """Per NFQUEUE number in this namespace: packets waiting and the kernel's drop counters."""
    out = {}
    try:
        lines = PROC_NFQUEUE.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        f = line.split()
        if len(f) >= 7:
            out[int(f[0])] = {"waiting": int(f[2]), "queue_dropped": int(f[5]), "user_dropped": int(f[6])}
    return out


def _tight_timers() -> None:
    # select() may wake up to 50 us late by default (timer slack); ask for 1 us.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def raise_priority(realtime: bool) -> str:
    """Ask for SCHED_FIFO (a router's forwarding plane does not wait behind batch jobs);
    fall back to a lower nice value. Returns what was obtained, for the statistics.

    The kernel's real-time throttling (sched_rt_runtime_us) still leaves other
    processes 5% of each CPU, and this loop sleeps whenever no packet is due.
    """
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
            return f"SCHED_FIFO {REALTIME_PRIORITY}"
        except (OSError, AttributeError):
            pass
    try:
        os.nice(-10)
        return "nice -10"
    except OSError:
        return "default"


def percentiles(values, qs=(50, 99)) -> dict[str, float | None]:
    """{'p50': ..., 'p99': ..., 'max': ..., 'count': n} of a sequence (nearest-rank)."""
    data = sorted(values)
    out: dict[str, float | None] = {}
    for q in qs:
        out[f"p{q}"] = data[min(len(data) - 1, math.ceil(q / 100 * len(data)) - 1)] if data else None
    out["max"] = data[-1] if data else None
    out["count"] = len(data)
    return out


class _Direction:
    """A link direction bound to its NFQUEUE."""

    def __init__(self, spec, link: EmulatedLink):
        self.spec = spec
        self.link = link
        self.nfq = None
        self.unparsed = 0


class Runner:
    """Run the links of `config` on their NFQUEUEs until stopped.

    `stats_path`: where the per-run JSON goes. While running, a small progress snapshot
    (counters and packets held, no time series or lateness: `"final": false`) replaces it
    every `stats_every` s, so others can watch the queues drain; the full record at the end.
    `rules`: insert/delete the iptables rules here (False when someone else manages them).
    """

    def __init__(self, config: EmulatorConfig, stats_path: str | Path | None = None,
                 rules: bool = True, stats_every: float = 0.5, realtime: bool = True):
        self.config = config
        self.realtime = realtime
        self.scheduling = "default"
        self.stats_path = Path(stats_path) if stats_path else None
        self.rules = rules
        self.stats_every = stats_every
        seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**32)
        self.seed = seed
        links = build_links(config.directions, seed, lambda: LinkStats(config.sample_interval_s))
        self.directions = [_Direction(spec, link) for spec, link in zip(config.directions, links)]
        self.links = list({id(link): link for link in links}.values())  # a medium's once
        self.lateness = array("d")
        self.lateness_counts = [0] * (len(LATENESS_EDGES_S) + 1)  # cumulative, in every snapshot
        self.lateness_max = 0.0
        self._stop = False
        self._t0 = time.monotonic()
        self._started_wall = time.time()
        self._rules_in: list[tuple[int, list[str], str]] = []

    # -- set-up and tear-down ----------------------------------------------------------

    def _bind(self) -> None:
        from netfilterqueue import COPY_PACKET, NetfilterQueue

        for d in self.directions:
            nfq = NetfilterQueue()
            nfq.bind(d.spec.queue, self._callback(d), max_len=QUEUE_MAXLEN, mode=COPY_PACKET,
                     range=HEADER_BYTES, sock_len=SOCKET_BUFFER)
            d.nfq = nfq

    def _insert_rules(self) -> None:
        for d in self.directions:
            insert_rule(d.spec.queue, d.spec.match, d.spec.chain)
            self._rules_in.append((d.spec.queue, d.spec.match, d.spec.chain))

    def _delete_rules(self) -> None:
        while self._rules_in:
            delete_rule(*self._rules_in.pop())

    def _callback(self, d: _Direction):
        # The links' virtual clock is time.monotonic() - self._t0 everywhere: the callbacks
        # and the loop must agree on it to the microsecond.
        link, t0, clock = d.link, self._t0, time.monotonic
        station = d.spec.name if d.spec.medium else ""

        def on_packet(nfq_packet) -> None:
            try:
                pkt = parse_ipv4(nfq_packet.get_payload(), nfq_packet)
            except MalformedPacket:
                d.unparsed += 1
                nfq_packet.accept()  # not ours to judge: pass it on untouched
                return
            pkt.station = station
            link.enqueue(pkt, clock() - t0)

        return on_packet

    # -- the loop ------------------------------------------------------------------------

    def run(self, duration: float | None = None, ready=None) -> dict:
        """Bind, install rules, call `ready()`, loop until stopped or `duration` s; return the stats."""
        _tight_timers()
        self.scheduling = raise_priority(self.realtime)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        old_handlers = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            old_handlers[sig] = signal.signal(sig, self._on_signal)
        old_wakeup = signal.set_wakeup_fd(wake_w)
        try:
            self._bind()
            if self.rules:
                self._insert_rules()
            if ready is not None:
                ready()
            self._loop(duration, wake_r)
        finally:
            if self.rules:
                self._delete_rules()
            self._release_all()
            result = self.collect()
            if self.stats_path:
                write_json_atomic(self.stats_path, result)
            for d in self.directions:
                if d.nfq is not None:
                    d.nfq.unbind()
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            os.close(wake_r)
            os.close(wake_w)
        return result

    def _on_signal(self, signum, frame) -> None:
        self._stop = True

    def _loop(self, duration: float | None, wake_fd: int) -> None:
        by_fd = {d.nfq.get_fd(): d.nfq for d in self.directions}
        fds = [*by_fd, wake_fd]
        links = self.links
        lateness, clock, t0 = self.lateness, time.monotonic, self._t0
        counts = self.lateness_counts
        end = math.inf if duration is None else duration
        next_stats = self.stats_every
        while not self._stop:
            now = clock() - t0
            if now >= end:
                return
            wake = min(min(link.next_event() for link in links), end, now + 0.25)
            ready, _, _ = select.select(fds, [], [], max(0.0, wake - now))
            for fd in ready:
                if fd == wake_fd:
                    os.read(wake_fd, 512)
                else:
                    by_fd[fd].run(block=False)
            now = clock() - t0
            for link in links:
                if link.next_event() <= now:
                    for due, pkt in link.advance(now):
                        pkt.handle.accept()
                        late = clock() - t0 - due
                        counts[lateness_bin(late)] += 1
                        if late > self.lateness_max:
                            self.lateness_max = late
                        if len(lateness) < LATENESS_SAMPLES_MAX:
                            lateness.append(late)
            if self.stats_path and now >= next_stats:
                write_json_atomic(self.stats_path, self.collect(final=False), durable=False)
                next_stats = now + self.stats_every

    def _release_all(self) -> None:
        for link in self.links:
            for pkt in link.drain():
                if pkt.handle is not None:
                    pkt.handle.accept()

    # -- results -------------------------------------------------------------------------

    def collect(self, final: bool = True) -> dict:
        """The run's statistics: per direction, per class; timer lateness; kernel queue drops.

        `final=False` gives the cheap progress snapshot (no time series, no exact lateness
        percentiles); both carry the cumulative lateness histogram (`lateness_counts` over
        `qos.emulator.stats.LATENESS_EDGES_S`) and its running max, for a window's lateness.
        """
        counters = kernel_queue_counters()
        out = {
            "final": final,
            "started_unix_s": self._started_wall,
            "duration_s": time.monotonic() - self._t0,
            "seed": self.seed,
            "scheduling": self.scheduling,
            "config_path": str(self.config.path),
            "written_unix_s": time.time(),
            "lateness_counts": list(self.lateness_counts),
            "lateness_max_s": self.lateness_max,
            "directions": {
                d.spec.name: {
                    "queue": d.spec.queue,
                    "match": d.spec.match,
                    "settings": d.spec.settings,
                    "medium": d.spec.medium,  # directions on one medium report its shared counters
                    "held_packets": d.link.held(),
                    "unparsed_packets": d.unparsed,
                    "kernel_queue": counters.get(d.spec.queue),
                    **d.link.stats.to_dict(samples=final),
                }
                for d in self.directions
            },
        }
        if final:
            late = percentiles(self.lateness)
            out["release_lateness_s"] = {"median": late["p50"], "p99": late["p99"], "max": late["max"],
                                         "count": late["count"]}
        return out


def run_from_args(config: EmulatorConfig, stats_path: str | None, duration: float | None,
                  rules: bool = True, realtime: bool = True) -> dict:
    """What `python -m qos.emulator` does: run, print READY (one JSON line) when packets may flow."""

    def ready() -> None:
        print("READY " + json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                     "queues": [d.queue for d in config.directions]}), flush=True)

    runner = Runner(config, stats_path, rules=rules, realtime=realtime)
    result = runner.run(duration, ready)
    print(f"emulator stopped after {result['duration_s']:.1f} s; "
          f"lateness median {result['release_lateness_s']['median']}", file=sys.stderr)
    return result
