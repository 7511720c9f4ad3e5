"""One small real deployment for every test under tests/clients: three sites on Ray and a
coordinator on loopback, a gateway in front of it, and a second coordinator whose third
site is down (its address has nothing listening), for the failure paths.

The fixtures are package-scoped (tests/clients has an __init__.py) so the deployment, and
the Ray CPUs its workers hold, are released before the next test folder runs. Ray itself is
the session's (ray_session in tests/conftest.py), which the services' tests then use too.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

SITE_CELLS = 14  # 2 per diagnosis: enough for 5 matches per cell, quick to build
SITES = (("site-a", 11), ("site-b", 12), ("site-c", 13))


@pytest.fixture(scope="package")
def stack(ray_session):
    """A running LoopbackDeployment of 3 small synthetic sites + coordinator."""
    from services.demo import DemoSite, LoopbackDeployment, demo_databases
    from services.synthetic import cache_root

    databases = demo_databases([DemoSite(name, seed, "flat") for name, seed in SITES],
                               cells=SITE_CELLS, cache=cache_root() / "test-clients")
    deployment = LoopbackDeployment(databases, metrics_port=None).start()
    yield deployment
    deployment.stop()


def dead_address() -> str:
    """A loopback address where nothing listens: a port the kernel gave us, then closed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="package")
def down_coordinator(stack):
    """A second coordinator over site-a, site-b and "site-down", which is not running."""
    from services.config import CoordinatorConfig, SiteEndpoint
    from services.coordinator.server import CoordinatorServer

    sites = [SiteEndpoint(name=name, address=stack.sites[name].address) for name in ("site-a", "site-b")]
    sites.append(SiteEndpoint(name="site-down", address=dead_address()))
    # Images to every site (no analysers here): the live sites do the feature extraction,
    # so a refused site's result visibly streams before theirs.
    coordinator = CoordinatorServer(CoordinatorConfig(sites=sites, analysis_workers=0)).start()
    yield coordinator
    coordinator.stop(0.5)


@pytest.fixture
def nowhere() -> str:
    """A loopback "host:port" with nothing listening."""
    return dead_address()


@pytest.fixture(scope="package")
def gateway(stack):
    from services.gateway import start_gateway

    handle = start_gateway(stack.coordinator.address)
    yield handle
    handle.stop()


@pytest.fixture(scope="package")
def down_gateway(down_coordinator):
    from services.gateway import start_gateway

    handle = start_gateway(down_coordinator.address)
    yield handle
    handle.stop()


@pytest.fixture(scope="package")
def case_dir(tmp_path_factory) -> Path:
    """A synthetic 6-cell case as a pathologist's files: cell1-3 with NAME-background.png
    and NAME-mask.png, cell4-6 alone (the sites estimate them)."""
    from services.synthetic import synthetic_case_cells

    folder = tmp_path_factory.mktemp("case")
    for n, cell in enumerate(synthetic_case_cells(6, seed=4242), start=1):
        (folder / f"cell{n}.png").write_bytes(cell["image"])
        if n <= 3:
            (folder / f"cell{n}-background.png").write_bytes(cell["background"])
            (folder / f"cell{n}-mask.png").write_bytes(cell["mask"])
    return folder


@pytest.fixture(scope="package")
def bad_files(tmp_path_factory) -> dict[str, Path]:
    """A file that is not an image though named .png, and one over the gateway's size limit."""
    from services.gateway.upload import MAX_FILE_BYTES

    folder = tmp_path_factory.mktemp("bad")
    not_image = folder / "scan-notes.png"
    not_image.write_text("this is a note, not a picture\n")
    oversize = folder / "huge.png"
    with open(oversize, "wb") as f:
        f.truncate(MAX_FILE_BYTES + 2**20)  # clearly over: 9.4 MB against 8.4 MB
    return {"not_image": not_image, "oversize": oversize}


from tests.clients.browser import browser, page  # noqa: E402,F401  (fixtures for the browser tests)
