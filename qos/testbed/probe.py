"""ICMP echo (ping) from inside a node, for reachability and round-trip times.

The machine has no `ping` binary, and a testbed node needs only this: send ICMP echo
requests on a raw socket (we are root) and time the kernel's replies.

    python -m qos.testbed.probe 10.42.2.1 10.42.3.1 --count 3     # JSON {address: [rtt_ms, ...]}
    ping(node, ["10.42.2.1"], count=3)                            # the same, run inside `node`
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import sys
import time

ICMP_ECHO_REQUEST, ICMP_ECHO_REPLY = 8, 0
SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux


def checksum(data: bytes) -> int:
    """The Internet checksum (RFC 1071) of `data`."""
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    total = (total >> 16) + (total & 0xFFFF)
    total += total >> 16
    return ~total & 0xFFFF


def echo_request(ident: int, seq: int, payload: bytes = b"pathmaster-probe") -> bytes:
    header = struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, 0, ident, seq)
    return struct.pack("!BBHHH", ICMP_ECHO_REQUEST, 0, checksum(header + payload), ident, seq) + payload


def ping_addresses(addresses: list[str], count: int = 1, timeout: float = 1.0, interval: float = 0.05,
                   tos: int = 0) -> dict[str, list[float | None]]:
    """Round-trip times in ms (None for no reply within `timeout` s) of `count` echoes to each address.

    A reply is timed by the kernel's receive stamp (SO_TIMESTAMPNS), not by when this process
    got round to reading it: on a busy host that wake-up can add milliseconds.
    """
    ident = os.getpid() & 0xFFFF
    out: dict[str, list[float | None]] = {}
    with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP) as sock:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, tos)
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        seq = 0
        for address in addresses:
            rtts: list[float | None] = []
            for _ in range(count):
                seq = (seq + 1) & 0xFFFF
                sent = time.time_ns()  # the receive stamp's clock (CLOCK_REALTIME)
                sock.sendto(echo_request(ident, seq), (address, 0))
                rtts.append(_wait_reply(sock, address, ident, seq, sent, timeout))
                if interval:
                    time.sleep(interval)
            out[address] = rtts
    return out


def _wait_reply(sock: socket.socket, address: str, ident: int, seq: int, sent_ns: int,
                timeout: float) -> float | None:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            packet, anc, _, (source, _) = sock.recvmsg(2048, socket.CMSG_SPACE(16))
        except socket.timeout:
            return None
        header_len = (packet[0] & 0x0F) * 4
        kind, _, _, r_ident, r_seq = struct.unpack("!BBHHH", packet[header_len:header_len + 8])
        if kind == ICMP_ECHO_REPLY and source == address and (r_ident, r_seq) == (ident, seq):
            stamp = next((struct.unpack("qq", d[:16]) for level, typ, d in anc
                          if level == socket.SOL_SOCKET and typ == SO_TIMESTAMPNS), None)
            received = stamp[0] * 1_000_000_000 + stamp[1] if stamp else time.time_ns()
            return (received - sent_ns) / 1e6
    return None


def ping(node, addresses: list[str], count: int = 1, timeout: float = 1.0, tos: int = 0) -> dict[str, list[float | None]]:
    """`ping_addresses` run inside testbed node `node` (one process for all addresses).

    The process runs this file by its path: ``-m`` would import all of qos.testbed first,
    which takes seconds on a busy machine."""
    out = node.cmd(sys.executable, __file__, *addresses, "--count", str(count),
                   "--timeout", str(timeout), "--tos", str(tos), timeout=30 + len(addresses) * count * timeout)
    return json.loads(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m qos.testbed.probe", description=__doc__.split("\n")[0])
    parser.add_argument("addresses", nargs="+")
    parser.add_argument("--count", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for each reply")
    parser.add_argument("--tos", type=int, default=0, help="IP TOS byte (DSCP << 2)")
    args = parser.parse_args(argv)
    print(json.dumps(ping_addresses(args.addresses, args.count, args.timeout, tos=args.tos)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
