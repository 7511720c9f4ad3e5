"""iperf3 in testbed nodes: servers, clients, and what their JSON says was achieved.

    server = IperfServer(b3, port=5201).start()
    result = run_client(a1, b3.ip, port=5201, seconds=3, dscp=34)   # blocks
    result.receiver_bps                                             # goodput, bit/s

Goodput is TCP/UDP payload. To compare with a link rate counted in frames, use
`frame_bps`, which adds the per-packet headers back (see `frame_overhead_bytes`).
"""

from __future__ import annotations

import json
import signal
import subprocess
from dataclasses import dataclass

from qos import netns
from qos.testbed.node import Node

IP_HEADER = 20
TCP_HEADER_WITH_TIMESTAMPS = 32
UDP_HEADER = 8
ETHERNET_HEADER = 14
PACE_WITHIN = 0.5  # a UDP client's rate in each report interval, as a share of its own (kept_pace)


class IperfError(RuntimeError):
    """iperf3 failed or printed no usable JSON; the message carries iperf3's own error."""


@dataclass(frozen=True)
class IperfResult:
    """What one iperf3 client run achieved (from its JSON)."""

    protocol: str            # "tcp" or "udp"
    seconds: float           # measured duration
    sent_bytes: int
    received_bytes: int
    receiver_bps: float      # payload bit/s at the receiver (goodput)
    mss: int | None          # TCP maximum segment size, bytes
    retransmits: int | None  # TCP
    mean_rtt_ms: float | None  # TCP, sender's smoothed RTT averaged over streams
    lost_percent: float | None  # UDP
    packets: int | None      # UDP datagrams sent
    interrupted: bool        # stopped by a signal before its planned end
    raw: dict

    def sent_per_interval(self) -> list[tuple[float, int]]:
        """(seconds, bytes) the client sent in each of its report intervals (`interval`)."""
        return [(float(i["sum"]["seconds"]), int(i["sum"]["bytes"])) for i in self.raw.get("intervals", ())]

    def kept_pace(self, rate_bps: float, within: float = PACE_WITHIN) -> bool:
        """Whether a UDP client sent every whole report interval at `rate_bps` to within
        `within` (a share). iperf3 keeps its average rate: a client held up by other work on
        the machine sends what it owes in a burst, which a short queue then drops."""
        intervals = self.sent_per_interval()
        longest = max((s for s, _ in intervals), default=0.0)
        whole = [(s, b) for s, b in intervals if s > 0.5 * longest]  # the last report may be a sliver
        return all(abs(b * 8 / s - rate_bps) <= within * rate_bps for s, b in whole)

    def frame_overhead_bytes(self, l2_bytes: int = ETHERNET_HEADER) -> int:
        """Header bytes per packet on a link that counts `l2_bytes` of L2 overhead per packet."""
        transport = TCP_HEADER_WITH_TIMESTAMPS if self.protocol == "tcp" else UDP_HEADER
        return IP_HEADER + transport + l2_bytes

    def frame_bps(self, l2_bytes: int = ETHERNET_HEADER, payload_bytes: int | None = None) -> float:
        """Receiver goodput scaled to the rate of frames (payload + headers), bit/s.

        `payload_bytes` is the payload per packet: the MSS for TCP (full-sized segments,
        which a bulk flow sends) or the datagram length for UDP.
        """
        payload = payload_bytes or self.mss
        if not payload:
            raise ValueError("payload per packet unknown: pass payload_bytes")
        return self.receiver_bps * (payload + self.frame_overhead_bytes(l2_bytes)) / payload


def parse(text: str) -> IperfResult:
    """An IperfResult from iperf3 -J output; IperfError if iperf3 reported an error without results."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise IperfError(f"iperf3 printed no JSON ({exc}): {text[:200]!r}") from None
    error = data.get("error", "")
    end = data.get("end", {})
    interrupted = error.startswith("interrupt")
    if error and not interrupted:
        raise IperfError(f"iperf3: {error}")
    start = data.get("start", {})
    protocol = start.get("test_start", {}).get("protocol", "TCP").lower()
    if protocol == "udp":
        s = end.get("sum", {})
        rx = end.get("sum_received", s)
        return IperfResult("udp", float(s.get("seconds", 0.0)), int(s.get("bytes", 0)),
                           int(rx.get("bytes", 0)), float(rx.get("bits_per_second", 0.0)),
                           None, None, None, float(s.get("lost_percent", 0.0)),
                           int(s.get("packets", 0)), interrupted, data)
    sent, received = end.get("sum_sent", {}), end.get("sum_received", {})
    rtts = [st["sender"]["mean_rtt"] for st in end.get("streams", [])
            if "mean_rtt" in st.get("sender", {})]
    return IperfResult("tcp", float(received.get("seconds", 0.0)), int(sent.get("bytes", 0)),
                       int(received.get("bytes", 0)), float(received.get("bits_per_second", 0.0)),
                       start.get("tcp_mss_default"), sent.get("retransmits"),
                       sum(rtts) / len(rtts) / 1000.0 if rtts else None, None, None, interrupted, data)


class IperfServer:
    """An iperf3 server on `node`: one client test at a time per port, as iperf3 works."""

    def __init__(self, node: Node, port: int = 5201):
        self.node = node
        self.port = port
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> "IperfServer":
        self.proc = self.node.popen(["iperf3", "-s", "-p", str(self.port)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            self.node.wait_listening(self.port, timeout=timeout)
        except TimeoutError:
            self.stop()
            raise IperfError(f"iperf3 server on {self.node.name}:{self.port} did not start: "
                             f"{self.proc.stderr.read() if self.proc.stderr else ''}") from None
        return self

    def stop(self) -> None:
        if self.proc is not None:
            netns.stop_process(self.proc)
            self.proc = None

    def __enter__(self) -> "IperfServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def client_argv(server_ip: str, port: int = 5201, seconds: float | None = 3.0, dscp: int = 0,
                reverse: bool = False, parallel: int = 1, udp_bps: float | None = None,
                length: int | None = None, nbytes: int | None = None, omit: float = 0.0,
                interval: float | None = None) -> list[str]:
    """The iperf3 client command line (JSON output, --dscp marking of what the client sends).

    With `reverse` the server sends, and iperf3 3.12's server does not apply the client's
    DSCP to it: mark such data at the server's edge (see `qos.traffic.competing.mark_source_port`).

    `omit` seconds at the start (slow start) are run but left out of the results; `interval`:
    seconds between iperf3's reports (its default 1 s).
    """
    argv = ["iperf3", "-c", server_ip, "-p", str(port), "-J", "--dscp", str(int(dscp))]
    if interval:
        argv += ["-i", f"{interval:g}"]
    if omit:
        argv += ["-O", f"{omit:g}"]
    if nbytes:
        argv += ["-n", str(int(nbytes))]
    elif seconds:
        argv += ["-t", f"{seconds:g}"]
    if reverse:
        argv.append("-R")
    if parallel > 1:
        argv += ["-P", str(int(parallel))]
    if udp_bps is not None:
        argv += ["-u", "-b", str(int(udp_bps))]
    if length:
        argv += ["-l", str(int(length))]
    return argv


def start_client(node: Node, server_ip: str, **options) -> subprocess.Popen:
    """Start an iperf3 client on `node` (options as `client_argv`); collect it with `finish_client`."""
    return node.popen(client_argv(server_ip, **options), stdout=subprocess.PIPE,
                      stderr=subprocess.PIPE, text=True)


def finish_client(proc: subprocess.Popen, timeout: float = 30.0, interrupt: bool = False) -> IperfResult:
    """Wait for (or, if `interrupt`, first SIGINT) a client from `start_client`; parse its JSON."""
    if interrupt and proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        netns.stop_process(proc, sig=signal.SIGKILL)
        raise IperfError(f"iperf3 client did not finish within {timeout} s") from None
    if not out.strip():
        raise IperfError(f"iperf3 client exited {proc.returncode} without output: {err.strip()}")
    return parse(out)


def run_client(node: Node, server_ip: str, timeout: float | None = None, **options) -> IperfResult:
    """Run an iperf3 client on `node` to completion and return what it achieved."""
    seconds = (options.get("seconds") or 3.0) + options.get("omit", 0.0)
    return finish_client(start_client(node, server_ip, **options), timeout=timeout or seconds + 20.0)
