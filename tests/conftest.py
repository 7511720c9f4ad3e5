"""Fixtures shared by every area's tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import subprocess
import time
from pathlib import Path

import pytest

import qos  # noqa: F401  (before any test imports grpc: gRPC's fork handlers off, see qos/__init__.py)
from qos import machine

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
    probe = f"pmq-probe-{os.getpid()}"  # this process's own: sessions side by side probe apart
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


# How long a session's namespace tests wait for an experiment holding the machine (qos.machine)
# before they skip: once, since the skip of this session fixture is kept for every later test.
MACHINE_WAIT_S = 60.0
os.environ.setdefault(machine.WAIT_ENV, str(MACHINE_WAIT_S))  # testbeds made in tests' subprocesses too


@pytest.fixture(scope="session")
def netns_ok() -> None:
    """Skip the test, with the reason, where network namespaces cannot be made or an experiment
    holds the machine (after waiting for it at most machine.wait_s(): MACHINE_WAIT_S unless set); otherwise this process holds
    the machine shared until the session ends, so no experiment starts beside its testbeds."""
    reason = netns_unavailable_reason()
    if reason:
        pytest.skip(reason)
    reason = machine_busy_reason(machine.wait_s())
    if reason:
        pytest.skip(reason)


def machine_busy_reason(wait_s: float, path: Path | None = None) -> str | None:
    """Why this session's testbeds cannot be built now (an experiment holds the machine, named),
    or None once this process holds the machine shared."""
    try:
        machine.share(path, wait=wait_s)
    except machine.MachineBusy as exc:
        return f"{exc.code}: an experiment holds the machine ({machine.describe(exc.holders)})"
    return None


# The folders whose tests run on the one local Ray below, which ends after them: last in a
# serial run, so the Ray started for the first of them serves both and idles beside no network
# test; first on make test's workers (pytest-xdist), which take them before the shorter files.
RAY_FOLDERS = ("clients", "services")


def ray_folder(item) -> str | None:
    """The folder of RAY_FOLDERS that test `item` is in, or None (None too for no test)."""
    if item is None:
        return None
    tests = Path(__file__).resolve().parent
    path = Path(item.path).resolve()
    parts = path.relative_to(tests).parts if path.is_relative_to(tests) else ()
    return parts[0] if len(parts) > 1 and parts[0] in RAY_FOLDERS else None


def pytest_collection_modifyitems(session, config, items) -> None:
    """Mark every test that needs network namespaces (the netns_ok fixture) `netns`; run
    tests/clients then tests/services after every other test in a serial run, so that they
    share one Ray started once per session, and on make test's workers (pytest-xdist) the
    namespace tests, then those two folders, before the shorter files (beside the measuring
    tests, the namespace tests after the two folders); a stable sort: each folder keeps its
    own order."""
    on_worker = "PYTEST_XDIST_WORKER" in os.environ
    gated = bool(os.environ.get(NETNS_AFTER))

    def rank(item) -> int:
        if on_worker and item.get_closest_marker("netns"):
            # The namespace unit first, the longest; beside the measuring tests, after the
            # Ray folders, so that it is reached about when they end (NETNS_AFTER).
            return -1 if gated else -len(RAY_FOLDERS) - 2
        folder = ray_folder(item)
        if folder is not None:
            return RAY_FOLDERS.index(folder) + (-len(RAY_FOLDERS) - 1 if on_worker else 1)
        return 0

    for item in items:
        if "netns_ok" in item.fixturenames and not item.get_closest_marker("netns"):
            item.add_marker(pytest.mark.netns)
    items.sort(key=rank)


# make test, when it runs the rest of the suite beside the measuring tests, names a file here
# that it makes when those end. The rest's namespace tests wait for it: their namespaces,
# emulators (SCHED_FIFO) and traffic are kernel and real-time work that SCHED_IDLE does not
# hold back, and the measuring tests lost packets and rate beside them.
NETNS_AFTER = "PATHMASTER_TEST_NETNS_AFTER"
NETNS_AFTER_WAIT_S = 3600.0   # then they run anyway: the measuring tests have failed or hung
NETNS_AFTER_POLL_S = 0.5


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A namespace test waits for the NETNS_AFTER file, before its time limit (pytest-timeout)
    starts."""
    gate = os.environ.get(NETNS_AFTER)
    if gate and item.get_closest_marker("netns"):
        deadline = time.monotonic() + NETNS_AFTER_WAIT_S
        while not os.path.exists(gate) and time.monotonic() < deadline:
            time.sleep(NETNS_AFTER_POLL_S)
    yield


def worker_unit(nodeid: str, root: Path = REPO) -> str:
    """What one of make test's workers takes whole: tests/clients (its deployment is
    package-scoped, made once); every file with namespace tests, as one unit (one testbed at a
    time, as in a serial run); else a test file (its module fixtures made once). From the node
    id alone: xdist's scheduler sees no markers."""
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/clients/"):
        return "tests/clients"
    if path not in _NETNS_FILES:
        file = root / path
        _NETNS_FILES[path] = file.is_file() and "netns" in file.read_text(errors="replace")
    return "netns" if _NETNS_FILES[path] else path


_NETNS_FILES: dict[str, bool] = {}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """make test's workers (--dist loadfile) take whole units (worker_unit), in collection
    order. xdist_group marks cannot group them under pytest 9.2: its structured node ids drop
    the group suffix xdist 3.8 writes."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Units(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return worker_unit(nodeid)

    return Units(config, log)


RAY_CPUS = 2


def start_ray() -> None:
    """This process's local Ray for the Ray folders, the service's own way (ensure_ray:
    loopback, workers at the service's priority); nothing when it is up."""
    from services.ray_local import ensure_ray

    ensure_ray(num_cpus=RAY_CPUS)


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the clients' and the services' tests (RAY_CPUS, no dashboard),
    started by the first test that needs it. It ends once the tests of those folders are
    over (pytest_runtest_teardown), not with the session: an idle Ray with a deployment on it
    keeps ~0.13 of a core busy, which the tests after them, on the same two cores, would lose."""
    import ray

    start_ray()
    yield ray
    ray.shutdown()


@contextlib.contextmanager
def running_on_ray(deployment):
    """Start `deployment` (start(), stop(): a LoopbackDeployment) for a session fixture of the
    Ray folders: it is stopped before this process's Ray ends and started again with it."""
    deployment.start()
    _on_ray.append(deployment)
    try:
        yield deployment
    finally:
        _on_ray.remove(deployment)
        deployment.stop()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """A test of RAY_FOLDERS after Ray was ended (below) finds it started again, with the
    deployments that ran on it: session fixtures are made once."""
    global _ray_ended
    if _ray_ended and "ray_session" in item.fixturenames and ray_folder(item) is not None:
        start_ray()
        for deployment in _on_ray:
            deployment.start()
        _ray_ended = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of RAY_FOLDERS in a row, stop the session's deployments and end
    this process's Ray. A worker of make test learns its next test before it runs one, so
    nextitem is the test it will really run next."""
    global _ray_ended
    yield
    if "ray" in sys.modules and ray_folder(item) is not None and ray_folder(nextitem) is None:
        import ray

        if ray.is_initialized():
            for deployment in reversed(_on_ray):
                deployment.stop()
            ray.shutdown()
            _ray_ended = True


_on_ray: list = []   # the deployments running_on_ray started, in order
_ray_ended = False   # pytest_runtest_teardown ended this process's Ray
