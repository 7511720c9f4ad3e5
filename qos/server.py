"""Replies: per-class server ports, each marking its replies with its class's DSCP.

Our choice among per-class ports, `tcp_reflect_tos` and netfilter marking: `MarkedServer`
runs one gRPC server per class, each created with `grpc.dscp` set to that class's DSCP;
Linux copies the listening socket's TOS to every accepted connection, so each reply carries
the class's DSCP too. It needs no root, no sysctl and no firewall rule, and it works the
same in a namespace testbed and on a real network. A control port (unmarked, DSCP 0) serves
Info, health checks and reflection; the server advertises its class ports in its Info reply.
Sites do this for the coordinator (`SiteInfo.class_ports`), the coordinator for its clients
(`CoordinatorInfo.class_ports`); tests/services/test_dscp_wire.py checks every hop, both
ways, on the wire. A class port refuses a request of another class (FAILED_PRECONDITION):
its replies would carry the wrong DSCP; that happens only to a caller whose port map is
stale (the server restarted on other free ports). Every port, the control port too,
refuses a class not in the table and a request that does not parse with INVALID_ARGUMENT
(`_RequestCheck`); grpcio itself answers a message over the size limit RESOURCE_EXHAUSTED
and an unknown method UNIMPLEMENTED before any handler runs.
"""

from __future__ import annotations

import logging
from concurrent import futures
from typing import Callable, Iterable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from pathmaster.ids import shown
from qos.authz import RoleCheck
from qos.channels import MAX_MESSAGE_BYTES, size_options
from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.tls import TLSFiles

log = logging.getLogger("pathmaster.transport")

class _Unparsed:
    """What a handler is given for request bytes that do not parse: the parser's error."""

    __slots__ = ("error",)

    def __init__(self, error: str):
        self.error = error


def _tolerant(deserializer):
    """`deserializer` that returns an `_Unparsed` instead of raising: grpcio answers a
    deserializer's exception with INTERNAL before any of our code runs, INVALID_ARGUMENT
    is the caller's mistake, so the handler (`_RequestCheck`) answers it."""
    if deserializer is None:
        return None

    def deserialize(data: bytes):
        try:
            return deserializer(data)
        except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError, or whatever a parser raises
            return _Unparsed(f"{type(exc).__name__}: {str(exc)[:200]}")
    return deserialize


class _RequestCheck(grpc.ServerInterceptor):
    """On every port: a request that does not parse is INVALID_ARGUMENT, so is a
    `request_class` not in the table; on a class port (`class_name`), a request naming
    another known class is FAILED_PRECONDITION (its replies would carry the wrong DSCP).
    An empty `request_class` passes (the service's default). Requests that stream are
    checked message by message."""

    KINDS = (("unary_unary", grpc.unary_unary_rpc_method_handler),
             ("unary_stream", grpc.unary_stream_rpc_method_handler),
             ("stream_unary", grpc.stream_unary_rpc_method_handler),
             ("stream_stream", grpc.stream_stream_rpc_method_handler))

    def __init__(self, classes: ClassTable, class_name: str | None = None):
        self.classes = classes
        self.class_name = class_name

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        for kind, make in self.KINDS:
            behaviour = getattr(handler, kind)
            if behaviour is not None:
                checked = self._checked_stream if handler.request_streaming else self._checked
                return make(checked(behaviour, handler_call_details.method),
                            _tolerant(handler.request_deserializer), handler.response_serializer)
        return handler

    def _checked(self, behaviour, method: str):
        def checked(request, context):
            self.check(request, context, method)
            return behaviour(request, context)
        return checked

    def _checked_stream(self, behaviour, method: str):
        def checked(requests, context):
            def each():
                for request in requests:
                    self.check(request, context, method)
                    yield request
            return behaviour(each(), context)
        return checked

    def check(self, request, context: grpc.ServicerContext, method: str) -> None:
        """Abort the call unless `request` parsed and names a class this port serves."""
        if isinstance(request, _Unparsed):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"the request to {method} is not its message ({request.error})")
        asked = getattr(request, "request_class", "")
        if not asked:
            return
        if asked not in self.classes:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown request class {shown(asked)}; known classes: {', '.join(self.classes.names())}")
        if self.class_name is not None and asked != self.class_name:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"this port serves class {self.class_name!r} only, not {asked!r}: "
                          f"ask Info for the class ports again (the server may have restarted)")


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
    the control server and for every class server. Each port has its own pool of
    `max_workers` threads: a call holds its thread until it ends (a case streams for its
    whole length, a site call waits for its cells), so calls of a less favoured class that
    hold every thread must not keep a more favoured class's calls waiting for one.
    `service_names` are the full names announced by health checking and reflection
    (served on every port). `class_ports` maps class -> port (0: any free port);
    None serves only the control port (replies then unmarked). Every port refuses a request
    that does not parse or names an unknown class, a class port one naming another class
    (`_RequestCheck`). `interceptors`: the caller's own
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
        self._executors: list[futures.ThreadPoolExecutor] = []
        names = list(service_names)
        extra = list(interceptors)  # the caller's (e.g. tracing), outermost

        def build(class_name: str | None) -> grpc.Server:
            # No SO_REUSEPORT: a second server on a busy port must fail, not share it.
            options: list[tuple[str, object]] = size_options(max_message_bytes) + [("grpc.so_reuseport", 0)]
            interceptors = [RoleCheck()] if tls is not None and tls.mutual else []
            if class_name is not None:
                options.append(("grpc.dscp", int(classes[class_name].dscp)))
            interceptors.append(_RequestCheck(classes, class_name))  # innermost: after the role check
            executor = futures.ThreadPoolExecutor(max_workers=max_workers,
                                                  thread_name_prefix=f"grpc-{class_name or 'control'}")
            self._executors.append(executor)
            server = grpc.server(executor, options=options, interceptors=[*extra, *interceptors])
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
        for executor in self._executors:
            executor.shutdown(wait=False, cancel_futures=True)

    def wait(self) -> None:
        self._servers[0].wait_for_termination()
