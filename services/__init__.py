"""gRPC services: per-site servers, the coordinator, the HTTP gateway and clients."""

import qos  # noqa: F401  (first: it sets how gRPC treats fork before grpc is imported)
