"""Who is calling, and whether they may: mutual TLS roles, and the caller's identity.

Every certificate from deploy/make-certs.sh carries one role as the URI
`pathmaster://role/ROLE` (coordinator, site, client, gateway). A server that demands client
certificates checks, on every call, that the caller's role may call that service
(`SERVICE_CALLERS`, the one role table: sites accept coordinators only, the coordinator
clients and gateways) and refuses others with PERMISSION_DENIED (`RoleCheck`); health
checking and reflection answer any caller the CA vouches for, as the gRPC health-checking
protocol expects of load balancers and probes.
"""

from __future__ import annotations

from typing import Callable

import grpc
from grpc_health.v1 import health_pb2
from grpc_reflection.v1alpha import reflection

from qos.channels import is_loopback

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


def peer_role(context: grpc.ServicerContext) -> str | None:
    """The role in the caller's certificate (`pathmaster://role/ROLE`); None when it has
    no certificate, no role, more than one, or one we do not know."""
    uris = (context.auth_context() or {}).get("peer_uri", [])
    roles = {u.decode(errors="replace")[len(ROLE_URI):] for u in uris if u.startswith(ROLE_URI.encode())}
    return roles.pop() if len(roles) == 1 and roles <= set(ROLES) else None


class RoleCheck(grpc.ServerInterceptor):
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
