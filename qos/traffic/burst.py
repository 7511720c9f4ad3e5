"""UDP bursts per class and a sink that records their order and kernel receive times.

A scheduler's decisions can be read without trusting anyone's clock: send a burst of
numbered datagrams of each class at once, so every queue is backlogged, and look at the
order in which they come out. Strict priority empties the favoured queue first; a shaped
class gets its share of the departures; a FIFO keeps the queue limit and never reorders.
The sink also keeps each datagram's kernel receive time (SO_TIMESTAMPNS, stamped when the
packet arrives, not when a busy sink gets round to reading it), from which the service
time per packet follows by a robust fit.

Both ends are processes for a testbed node. The sink prints READY once it listens and, at
the end, one line of JSON. The sender sends the bursts interleaved, then an end marker
per class until the sink acknowledges it: within a class the queue is first in, first
out, so when a class's marker arrives every datagram of that class that was kept has
arrived before it. The sink stops when every class has ended (or after `timeout` s
without a datagram).

    python -m qos.traffic.burst sink --port 6101 --classes 2          # JSON on stdout
    python -m qos.traffic.burst send --dst 10.42.2.1 --port 6101 --burst 46:200 --burst 0:200
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import sys
import time

PAYLOAD_BYTES = 1472          # a 1500-byte IP packet
FRAME_BYTES = PAYLOAD_BYTES + 8 + 20 + 14  # on the link, with its Ethernet header (as the bottleneck counts)
HEADER = struct.Struct("!4sBBI")  # magic, kind, class index, sequence number
MAGIC = b"PMB1"
DATA, END, ACK = 0, 1, 2
READY = "READY"
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)   # Linux
SO_RCVBUFFORCE = getattr(socket, "SO_RCVBUFFORCE", 33)    # Linux, root: beyond rmem_max
RCVBUF_BYTES = 16 << 20
MARKER_TRIES = 100
MARKER_WAIT_S = 0.1


def parse_bursts(specs: list[str]) -> list[tuple[int, int]]:
    """"DSCP:COUNT" strings -> [(dscp, count), ...], in class index order."""
    out = []
    for spec in specs:
        dscp, _, count = spec.partition(":")
        if not count or int(dscp) not in range(64) or int(count) < 0:
            raise ValueError(f"burst {spec!r} is not DSCP:COUNT with DSCP 0-63 and COUNT >= 0")
        out.append((int(dscp), int(count)))
    return out


def send(dst: str, port: int, bursts: list[tuple[int, int]], length: int = PAYLOAD_BYTES) -> dict:
    """Send `bursts` [(dscp, count)] interleaved as fast as possible, then each class's end marker
    until acknowledged (at most MARKER_TRIES rounds of MARKER_WAIT_S s). Returns what was sent."""
    if length < HEADER.size:
        raise ValueError(f"datagrams need at least {HEADER.size} bytes, got {length}")
    socks = []
    for dscp, _ in bursts:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8 << 20)
        s.connect((dst, port))
        socks.append(s)
    pad = bytes(length - HEADER.size)
    sent = [0] * len(bursts)
    errors = 0
    first = time.monotonic()
    for seq in range(max((n for _, n in bursts), default=0)):
        for k, (_, count) in enumerate(bursts):
            if seq < count:
                try:
                    socks[k].send(HEADER.pack(MAGIC, DATA, k, seq) + pad)
                    sent[k] += 1
                except OSError:  # a full local buffer: the datagram never left, and is not counted
                    errors += 1
    span = time.monotonic() - first
    pending, tries = set(range(len(bursts))), 0
    while pending and tries < MARKER_TRIES:
        tries += 1
        for k in pending:
            try:
                socks[k].send(HEADER.pack(MAGIC, END, k, sent[k]) + pad)
            except OSError:
                pass
        deadline = time.monotonic() + MARKER_WAIT_S
        while pending and (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([socks[k] for k in pending], [], [], left)
            for s in ready:
                try:
                    magic, kind, k, _ = HEADER.unpack(s.recv(2048)[:HEADER.size])
                except (OSError, struct.error):
                    continue
                if magic == MAGIC and kind == ACK:
                    pending.discard(k)
    for s in socks:
        s.close()
    return {"role": "send", "dscp": [d for d, _ in bursts], "sent": sent, "send_errors": errors,
            "send_span_s": span, "marker_rounds": tries, "unacknowledged": sorted(pending)}


def receive(port: int, classes: int, timeout: float = 30.0, ready=None) -> dict:
    """Record datagrams on `port` until `classes` classes have ended or `timeout` s pass without one.

    Returns {"packets": [[class index, sequence, kernel receive time ns], ...] in arrival order,
    "ended": [class indices whose marker arrived], "sent": {class index: count the marker gave}}.
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, RCVBUF_BYTES)
    except PermissionError:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    sock.bind(("0.0.0.0", port))
    sock.settimeout(timeout)
    if ready:
        ready()
    packets, sent = [], {}
    while len(sent) < classes:
        try:
            data, anc, _, peer = sock.recvmsg(2048, socket.CMSG_SPACE(16))
        except socket.timeout:
            break
        try:
            magic, kind, k, seq = HEADER.unpack(data[:HEADER.size])
        except struct.error:
            continue
        if magic != MAGIC:
            continue
        if kind == DATA:
            stamp = next((struct.unpack("qq", d[:16]) for level, typ, d in anc
                          if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS), None)
            packets.append([k, seq, stamp[0] * 1_000_000_000 + stamp[1] if stamp else time.time_ns()])
        elif kind == END:
            sent.setdefault(k, seq)
            sock.sendto(HEADER.pack(MAGIC, ACK, k, seq), peer)
    sock.close()
    return {"role": "sink", "packets": packets, "ended": sorted(sent), "sent": sent}


def through(src, dst, classes: list[tuple[int, int]], port: int, timeout: float = 60.0) -> tuple[dict, list[list[int]]]:
    """Send `classes` [(dscp, count)] at once from testbed node `src` to node `dst` (qos.testbed.node);
    return the sender's record and the datagrams [class index, sequence, kernel receive ns]
    in the order they arrived. Raises RuntimeError if a class's end never arrived.

    The sender runs real-time (chrt), so that busy loops cannot stretch the burst: it takes
    a few ms of CPU, and a queue it is meant to fill must see it arrive at once. Both ends
    run this file by its path: ``-m`` would import all of qos.traffic (scipy) first, which
    takes seconds on a busy machine.
    """
    import subprocess  # here, not at the top: the two ends need none of it

    from qos import netns

    sink = dst.popen([sys.executable, __file__, "sink", "--port", str(port), "--classes", str(len(classes))],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        dst.wait_listening(port, protocol="udp")
        sent = json.loads(src.cmd("chrt", "-f", "10", sys.executable, __file__, "send", "--dst", dst.ip,
                                  "--port", str(port), *(f"--burst={dscp}:{count}" for dscp, count in classes),
                                  timeout=timeout + MARKER_TRIES * MARKER_WAIT_S))
        out, err = sink.communicate(timeout=timeout)
    finally:
        netns.stop_process(sink)
    received = json.loads(out.splitlines()[-1])  # after the READY line
    if received["ended"] != list(range(len(classes))):
        raise RuntimeError(f"burst to {dst.ip}:{port}: classes {received['ended']} ended, sender {sent}; {err}")
    return sent, received["packets"]


def service_s(packets: list[list[int]]) -> float:
    """Seconds per packet on the link that `packets` (from `through`) crossed while it was backlogged:
    the Theil-Sen slope of kernel receive time against arrival position. A robust fit: a busy
    emulator releases what fell due late in a bunch, which moves a few points off the line
    but not the line."""
    import numpy as np
    from scipy.stats import theilslopes

    return float(theilslopes(np.array([p[2] for p in packets], dtype=float) / 1e9).slope)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qos.traffic.burst", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    s = sub.add_parser("send")
    s.add_argument("--dst", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--burst", action="append", required=True, help="DSCP:COUNT, one per class, in class order")
    s.add_argument("--length", type=int, default=PAYLOAD_BYTES, help="UDP payload bytes")
    r = sub.add_parser("sink")
    r.add_argument("--port", type=int, required=True)
    r.add_argument("--classes", type=int, required=True)
    r.add_argument("--timeout", type=float, default=30.0, help="s without a datagram before giving up")
    args = parser.parse_args(argv)
    if args.role == "send":
        out = send(args.dst, args.port, parse_bursts(args.burst), args.length)
    else:
        out = receive(args.port, args.classes, args.timeout, ready=lambda: print(READY, flush=True))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
