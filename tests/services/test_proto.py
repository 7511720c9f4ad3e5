"""The committed gRPC code in services/pb is what proto/generate.sh makes of the .proto."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED = ["pathmaster_pb2.py", "pathmaster_pb2.pyi", "pathmaster_pb2_grpc.py"]


def test_generated_code_is_current(tmp_path):
    # Same -I mapping as proto/generate.sh, output into tmp_path.
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-Iservices/pb={REPO / 'proto'}",
                    "--python_out=.", "--grpc_python_out=.", "--pyi_out=.",
                    "services/pb/pathmaster/v1/pathmaster.proto"], cwd=tmp_path, check=True)
    for name in GENERATED:
        fresh = (tmp_path / "services" / "pb" / "pathmaster" / "v1" / name).read_text()
        committed = (REPO / "services" / "pb" / "pathmaster" / "v1" / name).read_text()
        assert fresh == committed, f"services/pb/pathmaster/v1/{name} is stale: run bash proto/generate.sh"
