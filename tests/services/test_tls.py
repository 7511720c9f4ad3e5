"""TLS and mutual TLS on every hop, with certificates from deploy/make-certs.sh."""

from __future__ import annotations

import subprocess
from pathlib import Path

import grpc
import pytest

from qos.transport import TLSFiles
from services.client import CoordinatorClient
from services.config import CoordinatorConfig, SiteConfig, SiteEndpoint
from services.coordinator.server import CoordinatorServer
from services.site.server import SiteServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    subprocess.run(["bash", str(REPO / "deploy" / "make-certs.sh"), str(out), "coordinator", "site", "client"],
                   check=True, capture_output=True)
    return out


def party(certs: Path, name: str, mutual: bool = False) -> TLSFiles:
    return TLSFiles(cert=certs / f"{name}.pem", key=certs / f"{name}.key", ca=certs / "ca.pem", mutual=mutual)


@pytest.fixture(scope="module")
def secure(ray_session, site_dbs, certs):
    """A site and a coordinator that both demand client certificates."""
    site = SiteServer(SiteConfig(name="secure", db=site_dbs["alpha"], worker_cpus=0.25,
                                 tls=party(certs, "site", mutual=True))).start()
    coordinator = CoordinatorServer(CoordinatorConfig(
        sites=[SiteEndpoint("secure", site.address)], tls=party(certs, "coordinator", mutual=True),
        site_tls=party(certs, "coordinator"))).start()
    yield coordinator, site
    coordinator.stop(0)
    site.stop(0)


def test_mutual_tls_case_end_to_end(secure, certs, case):
    coordinator, _ = secure
    with CoordinatorClient(coordinator.address, tls=party(certs, "client")) as client:
        events = list(client.submit(case[:2], "urgent", deadline_s=60))
    (result,) = [e.site_result for e in events if e.HasField("site_result")]
    assert result.status_code == 0, result.status_message
    assert len(result.cells) == 2 and all(len(c.matches) == 5 for c in result.cells)


@pytest.mark.parametrize("tls", ["none", "no-client-cert"])
def test_coordinator_refuses_clients_without_a_certificate(secure, certs, case, tls):
    coordinator, _ = secure
    files = None if tls == "none" else TLSFiles(ca=certs / "ca.pem")
    with CoordinatorClient(coordinator.address, tls=files) as client:
        with pytest.raises(grpc.RpcError) as err:
            list(client.submit(case[:1], "routine", deadline_s=10))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_site_refuses_a_coordinator_without_a_certificate(secure, certs, case):
    _, site = secure
    coordinator = CoordinatorServer(CoordinatorConfig(
        sites=[SiteEndpoint("secure", site.address)], site_tls=TLSFiles(ca=certs / "ca.pem"))).start()
    try:
        with CoordinatorClient(coordinator.address) as client:
            events = list(client.submit(case[:1], "routine", deadline_s=10))
        (result,) = [e.site_result for e in events if e.HasField("site_result")]
        assert result.status_code == grpc.StatusCode.UNAVAILABLE.value[0]
    finally:
        coordinator.stop(0)


def test_server_tls_needs_cert_and_key(certs):
    with pytest.raises(ValueError, match="cert.*key"):
        TLSFiles(ca=certs / "ca.pem").server_credentials()
    with pytest.raises(ValueError, match="no-such.pem"):
        TLSFiles(cert=certs / "no-such.pem", key=certs / "site.key").server_credentials()
