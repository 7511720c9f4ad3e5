"""Requests: one gRPC channel per (site, class, lane), marked with the class's DSCP.

Each channel is created with the channel option `grpc.dscp` (grpcio >= 1.57), so every
packet the coordinator sends for a class carries that class's DSCP; a channel's DSCP is
fixed per connection, hence one channel per class. A caller needs only a server's control
address: it learns the class ports from the server's Info and sends each class to its port
(`ClassChannels`), whose replies are marked too (qos/server.py). A call that fails with
`STALE_PORT_CODES` means "ask Info again". Also here: message size limits (a 10 MB image
must pass) and addresses.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path


import grpc

from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.tls import TLSFiles, check_key_pair, files_signature

MAX_MESSAGE_BYTES = 256 * 1024 * 1024  # one gRPC message, either way (QoS transport)
# Optionally, after a case, each class connection it used to a site is replaced by a fresh one,
# opened then and taken once ready (qos.transport.ClassChannels, `renew`): a connection that met
# losses keeps a congestion window of 2-5 segments for ever after, a new one sends 10 at once.
# Off: measured in the testbed (FIFO, 16 streams) it did not help, because a full drop-tail
# queue takes only the first segment of a burst whatever the window, and it hurt a one-segment
# request (a fresh connection's HPACK table is empty: ~250 B more headers, two segments).
RENEW_CONNECTIONS = False
# Fresh connections opened per renewed one, the first ready taken: a SYN lost behind a full
# queue is sent again only after 1 s, and cases may come sooner than that.
SPARE_CONNECTIONS = 2

log = logging.getLogger("pathmaster.transport")

# A server that was down is retried every second or so, not gRPC's default of up to 2
# minutes apart: a site that comes back is used (and its class ports learnt) at once.
MAX_RECONNECT_BACKOFF_MS = 1000
# A channel argument of our own (gRPC ignores it): it keeps the connections of different lanes
# apart in gRPC's subchannel bookkeeping.
LANE_ARG = "pathmaster.lane"
# Likewise for the successive connections of one lane when they are renewed (ClassChannels).
GENERATION_ARG = "pathmaster.generation"
_READY = 2  # gRPC core's connectivity state READY (grpc.ChannelConnectivity.READY's value)


def size_options(max_message_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def open_channel(
    address: str,
    dscp: int | None = None,
    tls: TLSFiles | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
    lane: int = 0,
    aio: bool = False,
    generation: int = 0,
) -> grpc.Channel:
    """A channel to `address` ("host:port") whose packets carry `dscp` (None: unmarked).

    Channels of lane 0 with the same address and options share one TCP connection (gRPC's
    global subchannel pool); a channel of lane >= 1 has a connection of its own, so that a
    segment lost on one lane does not stall the calls of another; so has a channel of
    `generation` >= 1 (a lane's renewed connection, `ClassChannels`). aio: a `grpc.aio`
    channel (same options) for asyncio code, created on and bound to the running loop.
    """
    kind = grpc.aio if aio else grpc
    options: list[tuple[str, object]] = size_options(max_message_bytes)
    options.append(("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS))
    if lane or generation:
        options += [("grpc.use_local_subchannel_pool", 1), (LANE_ARG, int(lane))]
    if generation:
        options.append((GENERATION_ARG, int(generation)))
    if dscp is not None:
        options.append(("grpc.dscp", int(dscp)))
    if tls is None:
        return kind.insecure_channel(address, options=options)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return kind.secure_channel(address, tls.channel_credentials(), options=options)


def split_address(address: str) -> tuple[str, int]:
    """("host", port) from "host:port" or "[v6]:port"; ValueError naming the address otherwise."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"address {address!r} is not HOST:PORT")
    return host, int(port)


def _core_channel(channel: grpc.Channel):
    """The gRPC core channel under `channel` (grpc.intercept_channel, e.g. tracing, keeps the
    channel it wraps as `_channel`; a plain grpc.Channel keeps its core channel so)."""
    while not hasattr(channel, "check_connectivity_state"):
        channel = channel._channel
    return channel


class ClassChannels:
    """Channels to many servers, one per (target, class), created on first use.

    `targets` maps a name (a site) to its control address. `class_ports(name)` may be set
    later (from the site's Info) to send each class to the port that marks its replies;
    until then a class goes to the control address, still marked on the way out.
    When the TLS files change (a rotated certificate), the next `channel` call opens new
    channels with them; calls in flight on the old ones finish. `wrap(channel)`, when given,
    is applied to each new channel (e.g. tracing interceptors).

    `renew`: the class channels a case used get a fresh TCP connection for the next case,
    opened after the case (`refresh`) and taken by `channel` once it is ready. A connection
    that met losses behind a full drop-tail queue keeps a congestion window of 2-5 segments
    and a slow-start threshold as low, and an idle period never raises it again
    (tcp_slow_start_after_idle restarts at min(initial window, cwnd)): a 6 KB request then
    needs two round trips through the queue. A new connection starts at the initial window
    (10 segments) and sends it in one flight; its handshake crosses the network between
    cases, not during one; `spares` of them are opened per channel, the first ready taken (a
    SYN lost behind a full queue is sent again only after 1 s). Until one is ready the old
    connection serves. A channel
    replaced so is closed once the calls it was handed for have passed their deadline
    (`channel(..., busy_until=)`; without one it stays open until `close`).
    """

    def __init__(
        self,
        targets: dict[str, str],
        classes: ClassTable = DEFAULT_CLASSES,
        tls: TLSFiles | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        wrap: Callable[[grpc.Channel], grpc.Channel] | None = None,
        renew: bool = False,
        spares: int = SPARE_CONNECTIONS,
    ):
        self.targets = dict(targets)
        self.wrap = wrap
        self.renew = renew
        self.spares = spares
        self.classes = classes
        self.tls = tls
        self.max_message_bytes = max_message_bytes
        self._class_ports: dict[str, dict[str, int]] = {}
        self._channels: dict[tuple[str, str | None, int], grpc.Channel] = {}
        self._retired: list[grpc.Channel] = []
        self._lock = threading.Lock()
        self._tls_seen = self._tls_signature()
        # Renewal: the fresh connection waiting to replace each key's channel, the keys used
        # since the last refresh, and until when each handed-out channel has calls running
        # (time.monotonic(); inf: unknown) so that a replaced one is closed only after them.
        self._spares: dict[tuple[str, str | None, int], list[grpc.Channel]] = {}
        self._used: set[tuple[str, str | None, int]] = set()
        self._busy_until: dict[int, float] = {}
        self._generation = 0

    def _usable_tls(self) -> bool:
        """The TLS files are whole (a certificate with its own key), else keep the channels."""
        if self.tls.cert is None or self.tls.key is None:
            return True
        try:
            check_key_pair(self.tls.cert, self.tls.key)
        except ValueError as exc:
            log.warning("TLS files changed but cannot be used yet (keeping the current channels): %s", exc)
            return False
        return True

    def _tls_signature(self) -> tuple:
        if self.tls is None:
            return ()
        return files_signature([Path(p) for p in (self.tls.cert, self.tls.key, self.tls.ca) if p])

    def set_class_ports(self, name: str, ports: dict[str, int]) -> None:
        """Route `name`'s classes to these ports on its host from now on. Channels to the
        old addresses are retired, not closed: calls in flight on them finish normally."""
        with self._lock:
            if self._class_ports.get(name) == dict(ports):
                return
            self._class_ports[name] = dict(ports)
            for key in [k for k in self._channels if k[0] == name and k[1] is not None]:
                self._retired.append(self._channels.pop(key))
            for key in [k for k in self._spares if k[0] == name]:
                for spare in self._spares.pop(key):
                    spare.close()  # to the old ports, and never used

    def has_class_ports(self, name: str) -> bool:
        return bool(self._class_ports.get(name))

    def address(self, name: str, class_name: str | None = None) -> str:
        """Where `class_name`'s calls to `name` go (the control address for None)."""
        control = self.targets[name]
        port = self._class_ports.get(name, {}).get(class_name) if class_name else None
        if not port:
            return control
        host, _ = split_address(control)
        return f"{host}:{port}"

    def channel(self, name: str, class_name: str | None = None, lane: int = 0,
                busy_until: float | None = None) -> grpc.Channel:
        """The channel for (name, class, lane); class None gives the unmarked control channel.
        Each lane >= 1 is a TCP connection of its own (see `open_channel`). `busy_until`
        (time.monotonic()): the deadline of the calls the caller makes on it (with `renew`,
        a replaced channel is closed after it; None: not before `close`; -1: no call, only
        opening it)."""
        with self._lock:
            signature = self._tls_signature()
            if signature and signature != self._tls_seen and self._usable_tls():
                self._tls_seen = signature  # rotated: new connections with the new files
                self._retired.extend(self._channels.values())
                self._channels.clear()
                for spare in [c for spares in self._spares.values() for c in spares]:
                    spare.close()
                self._spares.clear()
            key = (name, class_name, lane)
            spares = self._spares.get(key, [])
            ready = [c for c in spares if _core_channel(c).check_connectivity_state(False) == _READY]
            if ready:
                if key in self._channels:
                    self._retired.append(self._channels[key])
                self._channels[key] = ready[0]
                spares.remove(ready[0])
            if key not in self._channels:
                self._channels[key] = self._open(key)
            channel = self._channels[key]
            if self.renew and class_name is not None and busy_until != -1.0:
                self._used.add(key)
                until = float("inf") if busy_until is None else busy_until
                self._busy_until[id(channel)] = max(self._busy_until.get(id(channel), until), until)
            self._close_drained()
            return channel

    def _open(self, key: tuple[str, str | None, int], generation: int = 0) -> grpc.Channel:
        name, class_name, lane = key
        dscp = self.classes[class_name].dscp if class_name is not None else None
        channel = open_channel(self.address(name, class_name), dscp, self.tls, self.max_message_bytes, lane,
                               generation=generation)
        return self.wrap(channel) if self.wrap else channel

    def _close_drained(self) -> None:
        """Close the replaced channels whose calls have all passed their deadlines (lock held)."""
        now = time.monotonic()
        keep = []
        for channel in self._retired:
            until = self._busy_until.get(id(channel))
            if until is not None and until < now:
                del self._busy_until[id(channel)]
                channel.close()
            else:
                keep.append(channel)
        self._retired = keep

    def refresh(self) -> int:
        """With `renew`: open a fresh connection, now, for every class channel used since the
        last refresh (call it when a case is over, so that the handshakes do not cross the
        network during one); `channel` takes each once it is ready. Returns how many were
        opened (0 without `renew`)."""
        if not self.renew:
            return 0
        with self._lock:
            opened = []
            for key in sorted(self._used, key=repr):
                spares = self._spares.setdefault(key, [])
                while len(spares) < self.spares and key[0] in self.targets:
                    self._generation += 1
                    spares.append(self._open(key, self._generation))
                    opened.append(spares[-1])
            self._used.clear()
        for spare in opened:
            _core_channel(spare).check_connectivity_state(True)  # connect now, without waiting
        return len(opened)

    def connect(self, name: str, class_names: list[str], lanes: int) -> None:
        """Open the connections of `lanes` lanes for each of `class_names` to `name` now,
        without waiting, so that no case has to (a SYN lost behind a full queue is retried
        after 1 s). Channels that are already connected are left as they are; a class this
        side's table does not have (a site may serve more classes) is skipped."""
        for class_name in class_names:
            if class_name not in self.classes:
                continue
            for lane in range(lanes):
                # What grpc.channel_ready_future does first, without its polling thread (which
                # raises if the channel is closed while it polls): ask the core to connect now.
                # busy_until -1: opened, not used by a call (nothing to renew after it).
                _core_channel(self.channel(name, class_name, lane, busy_until=-1.0)).check_connectivity_state(True)

    def close(self) -> None:
        with self._lock:
            for channel in [*self._channels.values(), *self._retired, *(c for s in self._spares.values() for c in s)]:
                channel.close()
            self._channels.clear()
            self._retired.clear()
            self._spares.clear()
            self._busy_until.clear()


# What a call on a class port fails with when the caller's port map may be out of date:
# the server is gone (UNAVAILABLE) or the port now serves another class (FAILED_PRECONDITION).
STALE_PORT_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.FAILED_PRECONDITION)


def connect_address(listen_host: str, port: int) -> str:
    """The address a local client dials for a server listening on `listen_host`:`port`
    (a wildcard listen address is reached through loopback)."""
    host = listen_host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1, "localhost" and IPv4-mapped loopback (::ffff:127.x)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback
