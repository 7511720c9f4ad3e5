"""Bursty UDP cross traffic after seed 003 (Q-Pod, Figure 23): a Pareto rate held for 2 s slots.

Each slot of `slot_s` seconds sends at a rate drawn from a Pareto distribution,
F(x) = 1 - (k/x)^alpha for x >= k, capped at `cap_bps`. Seed 003 used k = 40 Mbit/s,
alpha = 1.05, cap 155 Mbit/s on an OC-3 link; `scaled_to_link` keeps those proportions
on another link rate. Rates count IP packet + 14-byte Ethernet header, as the bottleneck does.

Both ends are processes for a testbed node. Each prints READY once it has its socket and
its SIGTERM handler (a stop before that would lose the summary), then, when stopped or
done, one line of JSON:

    python -m qos.traffic.pareto sink --port 6001                    # prints JSON on SIGTERM
    python -m qos.traffic.pareto send --dst 10.42.2.3 --port 6001 --dscp 1 --k-bps 2.6e6 \\
        --cap-bps 1e7 --seed 3                                        # prints JSON on SIGTERM
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import time

import numpy as np

SEED_003_K_BPS = 40e6
SEED_003_CAP_BPS = 155e6
SEED_003_ALPHA = 1.05
SLOT_S = 2.0
PAYLOAD_BYTES = 1472           # a 1500-byte IP packet
FRAME_BYTES = PAYLOAD_BYTES + 8 + 20 + 14
READY = "READY"


def scaled_to_link(link_bps: float) -> tuple[float, float]:
    """Seed 003's (k, cap) in bit/s scaled from its 155 Mbit/s link to `link_bps`."""
    scale = link_bps / SEED_003_CAP_BPS
    return SEED_003_K_BPS * scale, SEED_003_CAP_BPS * scale


def slot_rates(n_slots: int, k_bps: float, alpha: float = SEED_003_ALPHA,
               cap_bps: float = float("inf"), seed: int = 0) -> np.ndarray:
    """The sending rate (bit/s, float64) of each of `n_slots` slots: Pareto(k, alpha) capped at `cap_bps`."""
    if k_bps <= 0 or alpha <= 0:
        raise ValueError(f"need k > 0 and alpha > 0, got k={k_bps} alpha={alpha}")
    u = 1.0 - np.random.default_rng(seed).random(n_slots)      # uniform on (0, 1]
    return np.minimum(k_bps * u ** (-1.0 / alpha), cap_bps).astype(np.float64)


def capped_mean(k_bps: float, alpha: float = SEED_003_ALPHA, cap_bps: float = float("inf")) -> float:
    """The expected slot rate of `slot_rates` (bit/s): E[min(X, cap)] for X ~ Pareto(k, alpha).

    Use it to pick k for a wanted mean load: the mean is proportional to k for a fixed cap/k.
    """
    if cap_bps <= k_bps:
        return cap_bps
    if alpha == 1.0:
        return k_bps * (1.0 + np.log(cap_bps / k_bps))
    # integral of P[X > x] from 0 to cap = k + k^a (cap^(1-a) - k^(1-a)) / (1 - a)
    return float(k_bps + k_bps ** alpha * (cap_bps ** (1 - alpha) - k_bps ** (1 - alpha)) / (1 - alpha))


class _Stop:
    """Set by SIGTERM/SIGINT so the loops can print their summary and exit."""

    def __init__(self):
        self.requested = False
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._set)

    def _set(self, *_):
        self.requested = True


def send(dst: str, port: int, dscp: int, k_bps: float, cap_bps: float, alpha: float, seed: int,
         duration_s: float, slot_s: float = SLOT_S) -> dict:
    """Send paced UDP datagrams slot by slot until `duration_s` or SIGTERM; return what was sent."""
    stop = _Stop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
    payload = bytes(PAYLOAD_BYTES)
    n_slots = max(1, int(np.ceil(duration_s / slot_s)))
    rates = slot_rates(n_slots, k_bps, alpha, cap_bps, seed)
    print(READY, flush=True)
    start = time.monotonic()
    sent = packets = 0
    slot_packets, slot_paced_s = [], []
    for i, rate in enumerate(rates):
        interval = FRAME_BYTES * 8 / rate
        slot_start = start + i * slot_s
        slot_end = min(start + (i + 1) * slot_s, start + duration_s)
        due = max(time.monotonic(), slot_start)
        skipped = due - slot_start  # s of the slot given up because the process was not running
        in_slot = 0
        while not stop.requested and due < slot_end:
            now = time.monotonic()
            if due > now:
                time.sleep(due - now)
            elif due < now - 0.05:
                skipped += now - due
                due = now  # descheduled for a while: resume the pace rather than burst to catch up
            try:
                sent += sock.sendto(payload, (dst, port))
                packets += 1
                in_slot += 1
            except OSError:  # a full socket buffer or an unreachable host for a moment: keep the pace
                pass
            due += interval
        slot_packets.append(in_slot)
        # The time this slot was paced: from its start to its end or the stop, less what was
        # skipped. What it sent in that time is its rate, however busy the machine was.
        slot_paced_s.append(max(0.0, min(due, slot_end) - slot_start - skipped))
        if stop.requested or time.monotonic() >= start + duration_s:
            break
    seconds = time.monotonic() - start
    return {"role": "send", "dscp": dscp, "k_bps": k_bps, "cap_bps": cap_bps, "alpha": alpha,
            "seed": seed, "slot_s": slot_s, "slot_rates_bps": rates[: i + 1].tolist(),
            "slot_packets": slot_packets, "slot_paced_s": slot_paced_s,
            "payload_bytes": sent, "packets": packets, "seconds": seconds,
            "frame_bps": packets * FRAME_BYTES * 8 / seconds if seconds else 0.0}


def sink(port: int, duration_s: float) -> dict:
    """Receive and count UDP datagrams on `port` until `duration_s` or SIGTERM."""
    stop = _Stop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port))
    sock.settimeout(0.1)  # wake up to notice SIGTERM
    print(READY, flush=True)
    received = packets = 0
    first = last = None
    end = time.monotonic() + duration_s
    while not stop.requested and time.monotonic() < end:
        try:
            data = sock.recv(65535)
        except socket.timeout:
            continue
        except InterruptedError:
            continue
        last = time.monotonic()
        first = first or last
        received += len(data)
        packets += 1
    # Stopped: what already arrived is still in the socket (a busy sink reads late); count it.
    sock.setblocking(False)
    while True:
        try:
            received += len(sock.recv(65535))
        except (BlockingIOError, InterruptedError):
            break
        packets += 1
    seconds = (last - first) if first and last and last > first else 0.0
    return {"role": "sink", "payload_bytes": received, "packets": packets, "seconds": seconds,
            "frame_bps": packets * FRAME_BYTES * 8 / seconds if seconds else 0.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qos.traffic.pareto", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--dscp", type=int, default=0)
    s.add_argument("--k-bps", type=float, required=True)
    s.add_argument("--cap-bps", type=float, required=True)
    s.add_argument("--alpha", type=float, default=SEED_003_ALPHA)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--slot-s", type=float, default=SLOT_S)
    s.add_argument("--duration-s", type=float, default=86400.0)
    r = sub.add_parser("sink")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--duration-s", type=float, default=86400.0)
    args = parser.parse_args(argv)
    if args.role == "send":
        out = send(args.dst, args.port, args.dscp, args.k_bps, args.cap_bps, args.alpha, args.seed,
                   args.duration_s, args.slot_s)
    else:
        out = sink(args.port, args.duration_s)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
