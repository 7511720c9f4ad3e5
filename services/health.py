"""`pathmaster health site|coordinator --config FILE`: is the server of this file serving?

Asks the server's gRPC health service (grpc.health.v1, overall status "") on the control port
its file names, with the TLS of that file (its own certificate as the client's, for a server
that demands one). Exit status 0 when SERVING, 1 otherwise, 2 for a bad file: a readiness
probe for Kubernetes (whose own gRPC probes cannot speak TLS) and a check for operators.
"""

from __future__ import annotations

import argparse
import sys

HEALTH_TIMEOUT_S = 5.0


def check(address: str, tls=None, timeout_s: float = HEALTH_TIMEOUT_S) -> str:
    """The health status name ("SERVING", "NOT_SERVING", ...) of the server at `address`,
    or "UNREACHABLE" when it does not answer within `timeout_s`."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from qos.transport import open_channel

    channel = open_channel(address, tls=tls)
    try:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""),
                                                          timeout=timeout_s)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    except grpc.RpcError:
        return "UNREACHABLE"
    finally:
        channel.close()


def run_health(args: argparse.Namespace) -> int:
    from pathmaster.records import ConfigError
    from qos.transport import connect_address
    from services.config import load_coordinator_config, load_site_config

    load = load_site_config if args.role == "site" else load_coordinator_config
    try:
        config = load(args.config)
    except ConfigError as exc:
        print(f"pathmaster health {args.role}: {exc}", file=sys.stderr)
        return 2
    host, _, port = config.listen.rpartition(":")
    address = connect_address(host, int(port))
    status = check(address, config.tls, args.timeout)
    print(f"{args.role} at {address}: {status}")
    return 0 if status == "SERVING" else 1


def register(subparsers) -> None:
    health = subparsers.add_parser("health", help="is the site or coordinator of a config file serving? (exit 0 if so)")
    health.add_argument("role", choices=["site", "coordinator"], metavar="ROLE", help="site or coordinator")
    health.add_argument("--config", required=True, help="that server's TOML file (its listen address and [tls])")
    health.add_argument("--timeout", type=float, default=HEALTH_TIMEOUT_S,
                        help="seconds to wait for an answer (default %(default)s)")
    health.set_defaults(func=run_health)
