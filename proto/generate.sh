#!/usr/bin/env bash
# Generate the Python gRPC code for proto/ into services/pb/ (committed; a test checks it is current).
# The -I mapping makes the generated modules import each other as services.pb.pathmaster.v1.*,
# so they never clash with the core `pathmaster` package.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m grpc_tools.protoc -Iservices/pb=proto \
    --python_out=. --grpc_python_out=. --pyi_out=. \
    services/pb/pathmaster/v1/pathmaster.proto
