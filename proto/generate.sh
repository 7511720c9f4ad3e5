#!/usr/bin/env bash
# Generate the Python gRPC code for proto/ into services/pb/ (committed; a test checks it is current).
# The -I mapping makes the generated modules import each other as services.pb.pathmaster.v1.*,
# so they never clash with the core `pathmaster` package.
# It runs grpcio-tools from the project's .venv (the `dev` extra, pinned to the version the
# committed code was made with; deploy/setup.sh installs it, or `uv sync --extra dev`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
if ! "$PY" -c 'import grpc_tools.protoc' 2>/dev/null; then
    echo "generate.sh: no grpcio-tools in $PY: run bash deploy/setup.sh (or uv sync --extra dev)" >&2
    exit 1
fi
"$PY" -m grpc_tools.protoc -Iservices/pb=proto \
    --python_out=. --grpc_python_out=. --pyi_out=. \
    services/pb/pathmaster/v1/pathmaster.proto
