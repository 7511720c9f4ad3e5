"""gRPC services: per-site servers, the coordinator, the HTTP gateway and clients."""
