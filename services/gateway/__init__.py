"""The clients of the coordinator: the pathologist's web page (an HTTP gateway) and batch.

    from services.gateway import start_gateway
    handle = start_gateway("127.0.0.1:50051")   # -> .url, .stop()
"""

from __future__ import annotations


def start_gateway(coordinator_address: str, host: str = "127.0.0.1", port: int = 0, **kwargs):
    """Serve the page for the coordinator at "host:port"; see `server.start_gateway`."""
    # Imported here so that `pathmaster --help` does not load gRPC.
    from services.gateway.server import start_gateway as start

    return start(coordinator_address, host=host, port=port, **kwargs)


__all__ = ["start_gateway"]
