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


@pytest.fixture(scope="session")
def herlev_224_dev() -> Path:
    """Half of the real Herlev cells as 224 px letter-boxed JPEG uploads (no masks) in
    ../shared/data/herlev-224-dev; skips where absent."""
    path = SHARED / "data" / "herlev-224-dev"
    if not path.is_dir():
        pytest.skip(f"real Herlev uploads not found at {path} (set PATHMASTER_SHARED)")
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


# The folders whose tests run on the one local Ray below, in the order they run: last, so
# the Ray started for the first of them serves both and idles beside no network test.
RAY_FOLDERS = ("clients", "services")


def pytest_collection_modifyitems(session, config, items) -> None:
    """Run tests/clients then tests/services after every other test (a stable sort: each
    folder keeps its own order), so that they share one Ray started once per session."""
    tests = Path(__file__).resolve().parent

    def rank(item) -> int:
        path = Path(item.path).resolve()
        parts = path.relative_to(tests).parts if path.is_relative_to(tests) else ()
        return RAY_FOLDERS.index(parts[0]) + 1 if len(parts) > 1 and parts[0] in RAY_FOLDERS else 0

    items.sort(key=rank)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the clients' and the services' tests (2 CPUs, no dashboard),
    started by the first test that needs it and ended with the session."""
    import ray

    from services.site.worker import ensure_ray

    started_here = not ray.is_initialized()
    ensure_ray(num_cpus=2)  # the service's own way: loopback, workers at the service's priority
    yield ray
    if started_here:
        ray.shutdown()
