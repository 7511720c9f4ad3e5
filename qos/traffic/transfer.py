"""A fixed-size TCP transfer timed from its first to its last byte at the receiver.

iperf3 cannot time this: with `-n` its test ends when the *sender* has written the last
byte into its socket and said so on the control connection. The receiver's clock stops
when that message arrives, which may be before the data's tail (2 MB sent, 1.76 MB
counted on a 10 Mbit/s link) or, when it waits or is lost behind other traffic, long
after. Here the receiver reads until the sender closes and timestamps what it reads.

    python -m qos.traffic.transfer sink 5400 --interval 0.5     # prints one JSON line
    python -m qos.traffic.transfer send 10.42.2.1 5400 2000000 --dscp 46

The sink prints {"bytes", "seconds" (first to last byte), "interval", "interval_bytes"
(bytes read in each full `interval` from the first byte), "mss"}.
"""

from __future__ import annotations

import argparse
import json
import socket
import time

CHUNK = 1 << 16


def receive(port: int, interval: float = 0.5, timeout: float = 30.0, ready=None) -> dict:
    """Accept one connection on `port`, read it to its end, and return the timing (see above).

    `ready` (optional) is called once the socket listens. `timeout` bounds the wait for the
    connection and every read, in seconds.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("0.0.0.0", port))
        server.listen(1)
        server.settimeout(timeout)
        if ready:
            ready()
        conn, _ = server.accept()
    with conn:
        conn.settimeout(timeout)
        mss = conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        first = last = None
        total = 0
        per_interval: dict[int, int] = {}
        while data := conn.recv(CHUNK):
            last = time.monotonic()
            first = last if first is None else first
            total += len(data)
            slot = int((last - first) // interval)
            per_interval[slot] = per_interval.get(slot, 0) + len(data)
    seconds = (last - first) if total else 0.0
    full = int(seconds // interval)  # the last, partial interval would understate the rate
    return {"bytes": total, "seconds": seconds, "interval": interval, "mss": mss,
            "interval_bytes": [per_interval.get(i, 0) for i in range(full)]}


def send(host: str, port: int, nbytes: int, dscp: int = 0, timeout: float = 30.0) -> None:
    """Connect to `host`:`port` with DSCP `dscp` (SYN included), send `nbytes` and close.

    Returns once the sink has closed too, i.e. after it has read everything.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, int(dscp) << 2)
        sock.settimeout(timeout)
        sock.connect((host, port))
        block = bytes(CHUNK)
        left = int(nbytes)
        while left > 0:
            left -= sock.send(block[:min(left, CHUNK)])
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qos.traffic.transfer", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    sink = sub.add_parser("sink", help="receive one transfer and print its timing as JSON")
    sink.add_argument("port", type=int)
    sink.add_argument("--interval", type=float, default=0.5, help="seconds per rate interval")
    sink.add_argument("--timeout", type=float, default=30.0)
    source = sub.add_parser("send", help="send a transfer")
    source.add_argument("host")
    source.add_argument("port", type=int)
    source.add_argument("bytes", type=int)
    source.add_argument("--dscp", type=int, default=0)
    source.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    if args.role == "sink":
        print(json.dumps(receive(args.port, args.interval, args.timeout)), flush=True)
    else:
        send(args.host, args.port, args.bytes, args.dscp, args.timeout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
