"""Fixtures shared by every area's tests."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

import qos  # noqa: F401  (before any test imports grpc: gRPC's fork handlers off, see qos/__init__.py)

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("PATHMASTER_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def herlev_40px() -> Path:
    """The 917 real Herlev cells in ../shared/data/herlev-40px; skips where absent."""
    path = SHARED / "data" / "herlev-40px"
    if not path.is_dir():
        pytest.skip(f"real Herlev sample data not found at {path} (set PATHMASTER_SHARED)")
    return path


def netns_unavailable_reason() -> str | None:
    """Why network-namespace tests cannot run here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 'ip' command not found"
    probe = "pmq-probe-netns"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@pytest.fixture(scope="session")
def netns_ok() -> None:
    """Skip the test, with the reason, where network namespaces cannot be made."""
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
