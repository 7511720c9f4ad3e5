"""Generated gRPC code; see proto/generate.sh."""
