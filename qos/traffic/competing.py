"""Competing traffic in the testbed: bulk downloads, the study's wget fetches, constant-rate UDP,
Pareto bursts.

Every generator runs until stopped and reports what it achieved:

    with BulkDownloads(tb, streams=4) as bulk:        # 4 downloads to each of B3 and C3
        ... run a PathMaster case ...
    bulk.result.bps                                   # achieved goodput, all flows, bit/s

    traffic = from_spec(tb, {"kind": "udp", "rate_bps": 3e6})

Each flow carries a DSCP (default: the "bulk" request class) so the routers can tell it
from PathMaster's classes. Downloads are iperf3 -R from the master; iperf3 3.12's server
does not mark reverse data, so an iptables DSCP rule on the master's server port does,
inside the master's namespace (it goes with the namespace, like everything else).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from scipy.optimize import brentq

from qos import netns
from qos.classes import DEFAULT_CLASSES
from qos.testbed.node import Node
from qos.traffic import pareto
from qos.traffic.iperf import IperfServer, finish_client, start_client

FETCH_FILE_BYTES = 20_000_000  # one competing fetch (the study's 20 MB file)

BULK_DSCP = DEFAULT_CLASSES["bulk"].dscp
LONG_S = 86400  # "until stopped": iperf3 needs a duration
ARRIVED_QUIET_S = 0.2   # no packet landing for this long: nothing is in flight (2 Mbit/s of 1500-byte packets is one every 6 ms)
ARRIVED_LIMIT_S = 3.0   # the longest wait for a path to drain
KINDS = ("downloads", "wget", "udp", "pareto")


@dataclass
class TrafficResult:
    """What a generator achieved between start and stop, summed over its flows.

    `iperf3` keeps, for generators that run iperf3, each flow's own report as iperf3 printed
    it (``{"flow name": {"client": parsed -J output}}``): the raw data behind the totals.
    It is left out of `to_dict`, which is the short summary. `stopped_epoch` (time.time())
    is when the flows were interrupted: with a report's own duration (`end` ... `seconds`)
    it dates the report's intervals to the millisecond, where iperf3's start stamp has
    whole seconds (and the streams' connection time after it).
    """

    kind: str
    dscp: int
    bytes: int               # payload bytes received
    seconds: float           # the longest flow's measured duration
    flows: list[dict] = field(default_factory=list)
    iperf3: dict[str, dict] = field(default_factory=dict)
    stopped_epoch: float = 0.0

    @property
    def bps(self) -> float:
        """Achieved payload rate of all flows together, bit/s."""
        return self.bytes * 8 / self.seconds if self.seconds else 0.0

    def to_dict(self) -> dict:
        return {"kind": self.kind, "dscp": self.dscp, "bytes": self.bytes, "seconds": self.seconds,
                "bps": self.bps, "flows": self.flows}


def mark_source_port(node: Node, protocol: str, port: int, dscp: int, add: bool = True) -> None:
    """Add (or delete) an iptables rule in `node` setting DSCP `dscp` on packets it sends from `port`."""
    node.cmd("iptables", "-t", "mangle", "-A" if add else "-D", "OUTPUT", "-p", protocol,
             "--sport", str(port), "-j", "DSCP", "--set-dscp", str(dscp))


class PortCounter:
    """An iptables rule in `node` counting the packets and bytes it receives on a port (any target):
    its own port (`source=False`, --dport) or the sender's (`source=True`, --sport)."""

    def __init__(self, node: Node, protocol: str, port: int, source: bool = False):
        self.node, self.protocol, self.port = node, protocol, port
        self.comment = f"pm-count-{protocol}-{'s' if source else ''}{port}"
        self._rule = ["INPUT", "-p", protocol, "--sport" if source else "--dport", str(port),
                      "-m", "comment", "--comment", self.comment]

    def add(self) -> "PortCounter":
        self.node.cmd("iptables", "-I", *self._rule)
        return self

    def read(self) -> tuple[int, int]:
        """(packets, IP bytes) counted so far."""
        listing = self.node.cmd("iptables", "-L", "INPUT", "-v", "-x", "-n")
        for line in listing.splitlines():
            if f"/* {self.comment} */" in line:
                packets, nbytes = line.split()[:2]
                return int(packets), int(nbytes)
        raise RuntimeError(f"counter rule {self.comment} missing in {self.node.name}")

    def read_arrived(self, quiet_s: float = ARRIVED_QUIET_S, limit_s: float = ARRIVED_LIMIT_S) -> tuple[int, int]:
        """(packets, IP bytes) once the senders have stopped and what they sent has landed:
        two reads `quiet_s` apart agree (at most `limit_s`). A sender held up, then catching up
        with a burst, leaves up to a queue's worth in flight when it stops (a 100-packet card
        queue at 10 Mbit/s is 0.12 s), which a read at once would count as lost."""
        deadline = time.monotonic() + limit_s
        last = self.read()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.read()
            if now == last:
                break
            last = now
        return last

    def remove(self) -> None:
        self.node.run("iptables", "-D", *self._rule, check=False)


class Traffic:
    """Base of the generators: start() ... stop() -> TrafficResult, or a `with` block.

    Flows go from `source` (default: the master) to each of `targets`, on ports `port`,
    `port` + 1, ..., marked with `dscp`.
    """

    kind = "traffic"

    def __init__(self, testbed, dscp: int, targets: tuple[str, ...], port: int, source: str | None):
        if not 0 <= dscp <= 63:
            raise ValueError(f"DSCP must be 0-63, got {dscp}")
        self.testbed, self.dscp, self.targets, self.port = testbed, dscp, tuple(targets), port
        self.source = testbed.host(source) if source else testbed.master
        self.result: TrafficResult | None = None

    def start(self) -> "Traffic":
        raise NotImplementedError

    def stop(self) -> TrafficResult:
        raise NotImplementedError

    def __enter__(self) -> "Traffic":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    def flow_name(self, target: str) -> str:
        return f"{self.source.name}->{target}"

    def _finish(self, flows: list[dict], iperf3: dict[str, dict] | None = None) -> TrafficResult:
        """Sum per-flow dicts ({"flow", "bytes", "seconds", ...}) into `self.result`."""
        self.result = TrafficResult(self.kind, self.dscp, sum(f["bytes"] for f in flows),
                                    max((f["seconds"] for f in flows), default=0.0), flows, iperf3 or {})
        return self.result


class BulkDownloads(Traffic):
    """`streams` parallel TCP downloads from the master to each of `targets` (the study's wget).

    One iperf3 server per target on the master (ports `port`, `port`+1, ...); each target
    runs ``iperf3 -R -P streams``. Transfers last until `stop`, i.e. they are long downloads
    (a 20 MB file at the ~1 Mbit/s a stream gets here takes minutes, longer than a case).
    """

    kind = "downloads"

    def __init__(self, testbed, streams: int, targets: tuple[str, ...] = ("B3", "C3"),
                 dscp: int = BULK_DSCP, port: int = 5301, source: str | None = None):
        super().__init__(testbed, dscp, targets, port, source)
        if streams < 0:
            raise ValueError(f"streams must be >= 0, got {streams}")
        self.streams = int(streams)
        self._servers: list[IperfServer] = []
        self._clients: list[tuple[str, subprocess.Popen]] = []
        self._marked: list[int] = []

    def start(self) -> "BulkDownloads":
        if self.streams == 0:
            return self
        for i, target in enumerate(self.targets):
            port = self.port + i
            mark_source_port(self.source, "tcp", port, self.dscp)
            self._marked.append(port)
            self._servers.append(IperfServer(self.source, port).start())
            proc = start_client(self.testbed.host(target), self.source.ip, port=port, seconds=LONG_S,
                                reverse=True, parallel=self.streams, dscp=self.dscp)
            self._clients.append((target, proc))
        return self

    def stop(self) -> TrafficResult:
        flows, raw = [], {}
        stopped_epoch = time.time()
        try:
            for target, proc in self._clients:
                r = finish_client(proc, interrupt=True)
                flows.append({"flow": self.flow_name(target), "bytes": r.received_bytes, "seconds": r.seconds,
                              "bps": r.receiver_bps, "retransmits": r.retransmits})
                raw[self.flow_name(target)] = {"client": r.raw}
        finally:
            for server in self._servers:
                server.stop()
            for port in self._marked:
                mark_source_port(self.source, "tcp", port, self.dscp, add=False)
            self._servers, self._clients, self._marked = [], [], []
        self._finish(flows, raw)
        self.result.stopped_epoch = stopped_epoch if raw else 0.0
        return self.result


# IP + TCP header bytes of a data segment (TCP with timestamps), taken off the counted IP bytes.
TCP_IP_HEADER_BYTES = 20 + 32


class FileFetches(Traffic):
    """The study's competing traffic as it was: `processes` wget processes on each of `targets`,
    each fetching a `file_bytes` file from the master again and again (seed 000: 20 MB files).

    Unlike `BulkDownloads`' endless streams, every fetch is a new TCP connection that starts in
    slow start, and the load comes in whole files. The master serves the file with Python's
    http.server (a sparse file: no disk); the clients are the real wget. The applications mark
    nothing; the master's edge marks the served data with `dscp` (the bulk class), as the study's
    routers told the competing traffic from PathMaster's. What arrives is counted by an iptables
    rule at each target (payload = IP bytes less 52 header bytes a segment).
    """

    kind = "wget"

    def __init__(self, testbed, processes: int, targets: tuple[str, ...] = ("B3", "C3"),
                 file_bytes: int = FETCH_FILE_BYTES, dscp: int = BULK_DSCP, port: int = 5601,
                 source: str | None = None):
        super().__init__(testbed, dscp, targets, port, source)
        if processes < 0 or processes != int(processes):
            raise ValueError(f"processes must be a whole number >= 0, got {processes}")
        if file_bytes < 1:
            raise ValueError(f"file_bytes must be >= 1, got {file_bytes}")
        self.processes, self.file_bytes = int(processes), int(file_bytes)
        self._folder: str | None = None
        self._server: subprocess.Popen | None = None
        self._clients: list[tuple[str, subprocess.Popen, PortCounter]] = []
        self._marked = False
        self._started = 0.0

    @property
    def url(self) -> str:
        """The file's address on the master."""
        return f"http://{self.source.ip}:{self.port}/fetch.bin"

    def start(self) -> "FileFetches":
        if self.processes == 0:
            return self
        self._folder = tempfile.mkdtemp(prefix="pm-fetch-")
        with open(os.path.join(self._folder, "fetch.bin"), "wb") as f:
            f.truncate(self.file_bytes)
        self._server = self.source.popen([sys.executable, "-m", "http.server", str(self.port), "--bind",
                                          self.source.ip, "--directory", self._folder],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.source.wait_listening(self.port)
        mark_source_port(self.source, "tcp", self.port, self.dscp)
        self._marked = True
        # One shell per target runs its `processes` fetch loops (stop_process ends its whole group).
        loop = f"while :; do wget -q -O /dev/null {self.url}; done"
        script = f"for i in $(seq {self.processes}); do ( {loop} ) & done; wait"
        self._started = time.monotonic()
        for target in self.targets:
            host = self.testbed.host(target)
            counter = PortCounter(host, "tcp", self.port, source=True).add()
            self._clients.append((target, host.popen(["sh", "-c", script], stdout=subprocess.DEVNULL,
                                                     stderr=subprocess.DEVNULL), counter))
        return self

    def stop(self) -> TrafficResult:
        flows = []
        try:
            # Each target's window ends once its counter has been read, and every counter is
            # read before any fetch loop stops: stopping one takes a while on a busy machine,
            # and the other targets' fetches would go on adding bytes to a window already shut.
            for target, _, counter in self._clients:
                packets, ip_bytes = counter.read()
                seconds = time.monotonic() - self._started
                payload = max(0, ip_bytes - packets * TCP_IP_HEADER_BYTES)
                flows.append({"flow": self.flow_name(target), "bytes": payload, "seconds": seconds,
                              "bps": payload * 8 / seconds, "processes": self.processes,
                              "file_bytes": self.file_bytes, "fetches_completed_at_least": payload // self.file_bytes})
            for _, proc, _ in self._clients:
                netns.stop_process(proc)
        finally:
            for _, _, counter in self._clients:
                counter.remove()
            if self._marked:
                mark_source_port(self.source, "tcp", self.port, self.dscp, add=False)
            if self._server is not None:
                netns.stop_process(self._server)
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
            self._clients, self._server, self._folder, self._marked, self._started = [], None, None, False, 0.0
        return self._finish(flows)


class ConstantRateUDP(Traffic):
    """Constant-rate UDP (iperf3 -u) from the master to `targets`, `rate_bps` in total, split evenly.

    `rate_bps` is the UDP payload rate (iperf3's -b); datagrams carry `length` bytes so
    packets are 1500-byte IP packets. What arrives is counted by an iptables rule at each
    target, because an interrupted iperf3 reports only what it sent.
    """

    kind = "udp"

    def __init__(self, testbed, rate_bps: float, targets: tuple[str, ...] = ("B3", "C3"),
                 dscp: int = BULK_DSCP, port: int = 5401, source: str | None = None):
        super().__init__(testbed, dscp, targets, port, source)
        if rate_bps < 0:
            raise ValueError(f"rate_bps must be >= 0, got {rate_bps}")
        self.rate_bps = float(rate_bps)
        self._servers: list[IperfServer] = []
        self._clients: list[tuple[str, subprocess.Popen, PortCounter]] = []

    def start(self) -> "ConstantRateUDP":
        if self.rate_bps == 0:
            return self
        for i, target in enumerate(self.targets):
            host = self.testbed.host(target)
            counter = PortCounter(host, "udp", self.port + i).add()
            self._servers.append(IperfServer(host, self.port + i).start())
            proc = start_client(self.source, host.ip, port=self.port + i, seconds=LONG_S,
                                udp_bps=self.rate_bps / len(self.targets), dscp=self.dscp,
                                length=pareto.PAYLOAD_BYTES)
            self._clients.append((target, proc, counter))
        return self

    def stop(self) -> TrafficResult:
        flows, raw = [], {}
        try:
            for target, proc, counter in self._clients:
                sent = finish_client(proc, interrupt=True)
                raw[self.flow_name(target)] = {"client": sent.raw}
                packets, ip_bytes = counter.read_arrived()
                received = ip_bytes - packets * (20 + 8)
                flows.append({"flow": self.flow_name(target), "bytes": received,
                              "seconds": sent.seconds, "bps": received * 8 / sent.seconds if sent.seconds else 0.0,
                              "sent_bytes": sent.sent_bytes,
                              "lost_percent": 100.0 * max(0, sent.sent_bytes - received) / sent.sent_bytes
                              if sent.sent_bytes else 0.0})
        finally:
            for server in self._servers:
                server.stop()
            for _, _, counter in self._clients:
                counter.remove()
            self._servers, self._clients = [], []
        return self._finish(flows, raw)


def k_for_mean(mean_bps: float, cap_bps: float, alpha: float = pareto.SEED_003_ALPHA) -> float:
    """The Pareto scale k whose capped slot rate has mean `mean_bps` (must be below `cap_bps`)."""
    if not 0 < mean_bps < cap_bps:
        raise ValueError(f"mean rate {mean_bps} bit/s must be above 0 and below the cap {cap_bps}")
    return brentq(lambda k: pareto.capped_mean(k, alpha, cap_bps) - mean_bps, mean_bps * 1e-6, mean_bps)


class ParetoBursts(Traffic):
    """Seed 003's bursty UDP: a Pareto(k, alpha) rate, capped, held for 2 s slots, master -> each target.

    By default k and the cap are seed 003's scaled to the bottleneck rate; pass `mean_bps`
    to pick k for a mean load instead (per target).
    """

    kind = "pareto"

    def __init__(self, testbed, mean_bps: float | None = None, targets: tuple[str, ...] = ("B3", "C3"),
                 dscp: int = BULK_DSCP, port: int = 5501, seed: int = 0,
                 alpha: float = pareto.SEED_003_ALPHA, source: str | None = None,
                 slot_s: float = pareto.SLOT_S):
        super().__init__(testbed, dscp, targets, port, source)
        link_bps = testbed.config.bottleneck.rate_kbit * 1000
        self.k_bps, self.cap_bps = pareto.scaled_to_link(link_bps)
        if mean_bps is not None:
            self.k_bps = k_for_mean(mean_bps, self.cap_bps, alpha)
        self.seed, self.alpha, self.slot_s = seed, alpha, slot_s
        self._procs: list[tuple[str, subprocess.Popen, subprocess.Popen]] = []

    def start(self) -> "ParetoBursts":
        for i, target in enumerate(self.targets):
            host, port = self.testbed.host(target), self.port + i
            # Both ends run pareto.py by its path: `-m` would import all of qos.traffic (scipy)
            # first, ~10 s apiece when the machine is busy.
            sink = host.popen([sys.executable, pareto.__file__, "sink", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            _wait_ready(sink, f"pareto sink on {target}")
            sender = self.source.popen(
                [sys.executable, pareto.__file__, "send", "--dst", host.ip, "--port", str(port),
                 "--dscp", str(self.dscp), "--k-bps", repr(self.k_bps), "--cap-bps", repr(self.cap_bps),
                 "--alpha", repr(self.alpha), "--seed", str(self.seed + i), "--slot-s", repr(self.slot_s)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            try:
                _wait_ready(sender, f"pareto sender to {target}")
            except BaseException:
                netns.stop_process(sink)
                raise
            self._procs.append((target, sender, sink))
        return self

    def stop(self) -> TrafficResult:
        flows = []
        for target, sender, sink in self._procs:
            sent = _json_of(sender)
            received = _json_of(sink)
            flows.append({"flow": self.flow_name(target), "bytes": received["payload_bytes"],
                          "seconds": received["seconds"], "bps": received["payload_bytes"] * 8 / received["seconds"]
                          if received["seconds"] else 0.0, "sent_bytes": sent["payload_bytes"],
                          "slot_rates_bps": sent["slot_rates_bps"], "slot_packets": sent["slot_packets"],
                          "slot_paced_s": sent["slot_paced_s"]})
        self._procs = []
        return self._finish(flows)


def _wait_ready(proc: subprocess.Popen, what: str, timeout: float = 60.0) -> None:
    """Wait for the READY line of a pareto process (it imports numpy first, slow on a busy machine)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline().strip() if ready else ""
    if line != pareto.READY:
        netns.stop_process(proc)
        raise RuntimeError(f"{what} did not start within {timeout} s: {line or proc.stderr.read()[-500:]}")


def _json_of(proc: subprocess.Popen, timeout: float = 10.0) -> dict:
    """Stop a pareto send/sink process and read the JSON summary it prints."""
    netns.stop_process(proc, timeout=timeout)
    out, err = proc.communicate()
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise RuntimeError(f"pareto process exited {proc.returncode} without a summary: {err.strip()[-500:]}") from None


def from_spec(testbed, spec: dict) -> Traffic:
    """A generator from a table: {"kind": "downloads", "streams": 4} | {"kind": "wget", "processes": 4,
    "file_bytes": 20e6} | {"kind": "udp", "rate_bps": 3e6}
    | {"kind": "pareto", "mean_bps": 2e6, "seed": 1}; optional "targets", "dscp"."""
    spec = dict(spec)
    kind = spec.pop("kind", None)
    makers = {"downloads": BulkDownloads, "wget": FileFetches, "udp": ConstantRateUDP, "pareto": ParetoBursts}
    if kind not in makers:
        raise ValueError(f"competing traffic kind {kind!r} is not one of {', '.join(KINDS)}")
    if "targets" in spec:
        spec["targets"] = tuple(spec["targets"])
    try:
        return makers[kind](testbed, **spec)
    except TypeError as exc:
        raise ValueError(f"competing traffic {kind!r}: {exc}") from None
