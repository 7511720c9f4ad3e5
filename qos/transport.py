"""QoS-aware gRPC transport: every request class travels on its own DSCP, both ways.

Requests: one gRPC channel per (site, class), created with the channel option
`grpc.dscp` (grpcio >= 1.57), so every packet the coordinator sends for a class carries
that class's DSCP. A channel's DSCP is fixed per connection, hence one channel per class.

Replies (our choice among per-class ports, `tcp_reflect_tos` and netfilter marking):
**per-class server ports** (`MarkedServer`). A server runs one gRPC server per class,
each created with `grpc.dscp` set to that class's DSCP; Linux copies the listening
socket's TOS to every accepted connection, so each reply carries the class's DSCP too.
It needs no root, no sysctl and no firewall rule, and it works the same in a namespace
testbed and on a real network. A control port (unmarked, DSCP 0) serves Info, health
checks and reflection; the server advertises its class ports in its Info reply, so a
caller needs only the control address and reaches a class port on that same host
(`ClassChannels`). Sites do this for the coordinator (`SiteInfo.class_ports`), the
coordinator for its clients (`CoordinatorInfo.class_ports`).
(tests/services/test_dscp_wire.py checks every hop, both ways, on the wire with tcpdump.)
A class port refuses a request of another class (FAILED_PRECONDITION): its replies would
carry the wrong DSCP. That happens only to a caller whose port map is stale (the server
restarted on other free ports); like UNAVAILABLE it means "ask Info again"
(`STALE_PORT_CODES`).

Also here: message size limits (a 10 MB image must pass) and TLS / mutual-TLS
credentials from files, used by every server and channel.

Mutual TLS with roles: every certificate from deploy/make-certs.sh carries one role as the
URI `pathmaster://role/ROLE` (coordinator, site, client, gateway). A server that demands
client certificates checks, on every call, that the caller's role may call that service
(`SERVICE_CALLERS`, the one role table: sites accept coordinators only, the coordinator
clients and gateways) and refuses others with PERMISSION_DENIED; health checking and
reflection answer any caller the CA vouches for, as the gRPC health-checking protocol
expects of load balancers and probes. A server re-reads its certificate, key and CA files
when they change (the next connection uses them; connections and calls in progress are
untouched), so certificates are rotated without a restart: replace the files by rename.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import grpc
from cachetools import TTLCache
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pathmaster import defaults
from pathmaster.defaults import MAX_MESSAGE_BYTES
from qos.classes import DEFAULT_CLASSES, ClassTable


log = logging.getLogger("pathmaster.transport")

# --------------------------------------------------------------- mutual TLS: roles
ROLE_URI = "pathmaster://role/"  # + the role: the URI SAN deploy/make-certs.sh writes
ROLES = ("coordinator", "site", "client", "gateway")
# Who may call each service: the one role table. Services named in neither this table nor
# OPEN_SERVICES are refused to everyone (fail closed).
SERVICE_CALLERS: dict[str, frozenset[str]] = {
    "pathmaster.v1.Site": frozenset({"coordinator"}),
    "pathmaster.v1.Coordinator": frozenset({"client", "gateway"}),
}
OPEN_SERVICES = frozenset({health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME})
ROLE_NAMES = {"coordinator": "coordinators", "site": "sites", "client": "pathologists' clients",
              "gateway": "the web gateway"}


MAX_SEND_ID_CHARS = 64  # AnalyseRequest.send_id: a client-chosen value, bounded


def caller_identity(context: grpc.ServicerContext) -> str:
    """Who is calling: the TLS certificate's common name when there is one, else the peer's
    address without its port (the same for all of a caller's connections)."""
    names = context.auth_context().get("x509_common_name") if context.auth_context() else None
    if names:
        return "cn:" + names[0].decode(errors="replace")
    peer = context.peer() or ""
    return peer.rsplit(":", 1)[0] if peer.count(":") > 1 else peer


def client_identity(context: grpc.ServicerContext) -> str:
    """Who is calling, for per-client limits: `caller_identity`, but a loopback peer without
    a certificate (a process on this machine: the demo's clients, a load test) with its
    port, so that each of its connections is a client of its own rather than all one."""
    caller = caller_identity(context)
    return context.peer() if _peer_is_loopback(caller) else caller


def _peer_is_loopback(peer_host: str) -> bool:
    """True for gRPC's "ipv4:127.0.0.1" or "ipv6:[::1]" (a peer's address without its port)."""
    return is_loopback(peer_host.split(":", 1)[1] if peer_host.startswith(("ipv4:", "ipv6:")) else peer_host)


class CopyFilter:
    """A server's memory of the sends it has taken, so that a copy of one that arrives over
    another connection (a client sends a small request as several copies at once,
    `qos.policy.plan_site`) is refused instead of answered again: one reply crosses the
    network, not one per copy.

    A send is known by its caller and its send id (AnalyseRequest.send_id), never by the
    client's case id: a case sent again under the same id, a retry and a hedge are new
    sends with ids of their own. An id is remembered for `memory_s` seconds, at most
    `entries` of them (the oldest forgotten first).
    """

    def __init__(self, memory_s: float = defaults.COPY_MEMORY_S, entries: int = defaults.COPY_MEMORY_ENTRIES,
                 clock: Callable[[], float] = time.monotonic):
        self.memory_s = memory_s
        self.entries = entries
        self._seen: TTLCache = TTLCache(maxsize=entries, ttl=memory_s, timer=clock)
        self._lock = threading.Lock()

    def first(self, key: tuple) -> bool:
        """True the first time `key` is seen (within the memory), False for a copy."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = True  # a full memory forgets its oldest first (TTLCache's LRU order)
            return True

    def refuse_copy(self, context: grpc.ServicerContext, send_id: str) -> None:
        """Abort the call with ALREADY_EXISTS when it is a copy of a send already taken
        (calls without a send id are never copies); a send id longer than MAX_SEND_ID_CHARS
        is INVALID_ARGUMENT."""
        if len(send_id) > MAX_SEND_ID_CHARS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"the send id is too long: at most {MAX_SEND_ID_CHARS} characters")
        # The caller, not its connection: the copies of one send come over several.
        if send_id and not self.first((caller_identity(context), send_id)):
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          "this send is already answered on another connection: this copy is not needed")


def peer_role(context: grpc.ServicerContext) -> str | None:
    """The role in the caller's certificate (`pathmaster://role/ROLE`); None when it has
    no certificate, no role, more than one, or one we do not know."""
    uris = (context.auth_context() or {}).get("peer_uri", [])
    roles = {u.decode(errors="replace")[len(ROLE_URI):] for u in uris if u.startswith(ROLE_URI.encode())}
    return roles.pop() if len(roles) == 1 and roles <= set(ROLES) else None


class _RoleCheck(grpc.ServerInterceptor):
    """Under mutual TLS: refuse a call whose caller's role may not call the service
    (PERMISSION_DENIED, saying who may)."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        service = handler_call_details.method.strip("/").split("/")[0]
        if handler is None or service in OPEN_SERVICES:
            return handler
        allowed = SERVICE_CALLERS.get(service, frozenset())

        def check(context: grpc.ServicerContext) -> None:
            role = peer_role(context)
            if role in allowed:
                return
            who = " and ".join(ROLE_NAMES[r] for r in sorted(allowed)) or "no one"
            have = f"is a {role} certificate" if role else "carries no PathMaster role (deploy/make-certs.sh)"
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"{service} answers {who} only; the caller's certificate {have}")

        return _checked_handler(handler, check)


def _checked_handler(handler, check: Callable[[grpc.ServicerContext], None]):
    """`handler` with `check(context)` run before its behaviour, whatever its kind."""
    kinds = (("unary_unary", grpc.unary_unary_rpc_method_handler),
             ("unary_stream", grpc.unary_stream_rpc_method_handler),
             ("stream_unary", grpc.stream_unary_rpc_method_handler),
             ("stream_stream", grpc.stream_stream_rpc_method_handler))
    for kind, make in kinds:
        behaviour = getattr(handler, kind)
        if behaviour is not None:
            def checked(request, context, behaviour=behaviour):
                check(context)
                return behaviour(request, context)
            return make(checked, handler.request_deserializer, handler.response_serializer)
    return handler


def check_key_pair(cert, key) -> None:
    """ValueError unless the PEM files `cert` and `key` can be read and the key is the
    certificate's (a rotation half done is not)."""
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise ValueError(f"TLS key {key} does not match certificate {cert}: {exc}") from None
    except OSError as exc:
        raise ValueError(f"TLS cert/key {cert}, {key}: {exc.strerror}") from None


def files_signature(paths) -> tuple:
    """What changes when any of the files is replaced or rewritten (inode, size, mtime);
    () when one cannot be read."""
    try:
        return tuple((st.st_ino, st.st_size, st.st_mtime_ns) for st in map(os.stat, paths))
    except OSError:
        return ()


class _ServerFiles:
    """A server's certificate, key and CA files, re-read when they change: grpc calls
    `fetch` before each new connection's handshake (grpc.dynamic_ssl_server_credentials).

    A change is a new inode, size or modification time of any file. A certificate whose key
    does not match it (a rotation half done) is not taken: the server keeps the last good
    pair and takes the new one once both files are in place.
    """

    def __init__(self, tls: "TLSFiles"):
        self.tls = tls
        self._seen = self._signature()
        self.initial = self._configuration()
        self._lock = threading.Lock()

    def _paths(self) -> list[Path]:
        return [Path(p) for p in (self.tls.cert, self.tls.key, self.tls.ca if self.tls.mutual else None) if p]

    def _signature(self) -> tuple:
        return files_signature(self._paths())

    def _configuration(self):
        check_key_pair(self.tls.cert, self.tls.key)
        return grpc.ssl_server_certificate_configuration(
            [(self.tls._read("key"), self.tls._read("cert"))],
            root_certificates=self.tls._read("ca") if self.tls.mutual else None,
        )

    def fetch(self):
        """The new configuration when the files changed since last time, else None (keep)."""
        with self._lock:
            signature = self._signature()
            if not signature or signature == self._seen:
                return None
            try:
                configuration = self._configuration()
            except ValueError as exc:
                log.warning("TLS files changed but cannot be used yet (keeping the current ones): %s", exc)
                return None
            self._seen = signature
            log.info("TLS certificate files changed: new connections use them (%s)",
                     ", ".join(map(str, self._paths())))
            return configuration


@dataclass(frozen=True)
class TLSFiles:
    """PEM files for TLS. `cert`/`key`: this end's certificate chain and private key;
    `ca`: the CA that signed the other end; `mutual`: servers demand client certificates.

    A server needs cert and key (and ca when mutual). A channel needs ca (and cert and
    key when the server demands client certificates).
    """

    cert: Path | None = None
    key: Path | None = None
    ca: Path | None = None
    mutual: bool = False
    server_name: str = ""  # overrides the name checked in the server's certificate

    def _read(self, what: str) -> bytes | None:
        path = getattr(self, what)
        if path is None:
            return None
        try:
            return Path(path).read_bytes()
        except OSError as exc:
            raise ValueError(f"TLS {what} file {path}: {exc.strerror}") from None

    def server_credentials(self) -> grpc.ServerCredentials:
        if self.cert is None or self.key is None:
            raise ValueError("TLS for a server needs both 'cert' and 'key'")
        if self.mutual and self.ca is None:
            raise ValueError("mutual TLS needs 'ca' to check client certificates")
        files = _ServerFiles(self)  # re-read when they change: rotation without a restart
        return grpc.dynamic_ssl_server_credentials(files.initial, files.fetch,
                                                   require_client_authentication=self.mutual)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self._read("ca"),
            private_key=self._read("key"),
            certificate_chain=self._read("cert"),
        )


# A server that was down is retried every second or so, not gRPC's default of up to 2
# minutes apart: a site that comes back is used (and its class ports learnt) at once.
MAX_RECONNECT_BACKOFF_MS = 1000
# A channel argument of our own (gRPC ignores it): it keeps the connections of different lanes
# apart in gRPC's subchannel bookkeeping.
LANE_ARG = "pathmaster.lane"
# Likewise for the successive connections of one lane when they are renewed (ClassChannels).
GENERATION_ARG = "pathmaster.generation"
_READY = 2  # gRPC core's connectivity state READY (grpc.ChannelConnectivity.READY's value)


def _size_options(max_message_bytes: int) -> list[tuple[str, int]]:
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
    options: list[tuple[str, object]] = _size_options(max_message_bytes)
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
        spares: int = defaults.SPARE_CONNECTIONS,
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


class _OwnClassOnly(grpc.ServerInterceptor):
    """On a class port: refuse unary requests whose `request_class` names another class."""

    def __init__(self, class_name: str):
        self.class_name = class_name

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming:
            return handler
        if handler.response_streaming:
            return grpc.unary_stream_rpc_method_handler(
                self._checked(handler.unary_stream), handler.request_deserializer, handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(
            self._checked(handler.unary_unary), handler.request_deserializer, handler.response_serializer)

    def _checked(self, behaviour):
        def checked(request, context):
            asked = getattr(request, "request_class", "")
            if asked and asked != self.class_name:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                              f"this port serves class {self.class_name!r} only, not {asked!r}: "
                              f"ask Info for the class ports again (the server may have restarted)")
            return behaviour(request, context)
        return checked


def _add_port(server: grpc.Server, address: str, tls: TLSFiles | None) -> int:
    try:
        if tls is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, tls.server_credentials())
    except RuntimeError:  # grpcio reports a failed bind this way
        port = 0
    if port == 0:
        raise OSError(f"cannot listen on {address} (address in use or not local)")
    return port


class MarkedServer:
    """A gRPC service on a control port plus one port per request class.

    `add_servicers(server)` registers the service(s) on a grpc.Server; it is called for
    the control server and for every class server, all sharing one thread pool.
    `service_names` are the full names announced by health checking and reflection
    (served on every port). `class_ports` maps class -> port (0: any free port);
    None serves only the control port (replies then unmarked). A class port refuses
    requests naming another class (`_OwnClassOnly`). `interceptors`: the caller's own
    (e.g. tracing), run before the role and class checks.
    """

    def __init__(
        self,
        add_servicers: Callable[[grpc.Server], None],
        service_names: Iterable[str],
        host: str,
        control_port: int,
        class_ports: dict[str, int] | None = None,
        classes: ClassTable = DEFAULT_CLASSES,
        tls: TLSFiles | None = None,
        max_workers: int = 16,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
    ):
        self.classes = classes
        self.health = health.HealthServicer()
        self._executor = futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="grpc")
        names = list(service_names)
        extra = list(interceptors)  # the caller's (e.g. tracing), outermost

        def build(class_name: str | None) -> grpc.Server:
            # No SO_REUSEPORT: a second server on a busy port must fail, not share it.
            options: list[tuple[str, object]] = _size_options(max_message_bytes) + [("grpc.so_reuseport", 0)]
            interceptors = [_RoleCheck()] if tls is not None and tls.mutual else []
            if class_name is not None:
                options.append(("grpc.dscp", int(classes[class_name].dscp)))
                interceptors.append(_OwnClassOnly(class_name))
            server = grpc.server(self._executor, options=options, interceptors=[*extra, *interceptors])
            add_servicers(server)
            health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
            reflection.enable_server_reflection(
                names + [health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
                server,
            )
            return server

        self._servers: list[grpc.Server] = []
        control = build(None)
        self.port = _add_port(control, f"{host}:{control_port}", tls)
        self._servers.append(control)
        self.class_ports: dict[str, int] = {}
        for class_name, port in (class_ports or {}).items():
            server = build(class_name)
            self.class_ports[class_name] = _add_port(server, f"{host}:{port}", tls)
            self._servers.append(server)
        self._service_names = names

    @property
    def class_dscp(self) -> dict[str, int]:
        """class -> the DSCP its port marks replies with (what Info advertises beside the ports)."""
        return {name: self.classes[name].dscp for name in self.class_ports}

    def start(self) -> "MarkedServer":
        for server in self._servers:
            server.start()
        for name in ["", *self._service_names]:
            self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        return self

    def set_serving(self, serving: bool) -> None:
        """What gRPC health says of every service here (and of the server, ""): SERVING or
        NOT_SERVING (a server up that cannot do its work, e.g. a site with no worker)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self._service_names]:
            self.health.set(name, status)

    def stop(self, grace: float | None = 1.0) -> None:
        """Stop every port; in-flight calls get `grace` seconds to finish."""
        self.health.enter_graceful_shutdown()
        events = [server.stop(grace) for server in self._servers]
        for event in events:
            event.wait(timeout=(grace or 0) + 5)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def wait(self) -> None:
        self._servers[0].wait_for_termination()


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
