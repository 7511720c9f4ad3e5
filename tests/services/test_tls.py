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
    subprocess.run(["bash", str(REPO / "deploy" / "make-certs.sh"), str(out), "coordinator", "site", "client",
                    "gateway", "site:site-b"], check=True, capture_output=True)
    return out


def party(certs: Path, name: str, mutual: bool = False) -> TLSFiles:
    return TLSFiles(cert=certs / f"{name}.pem", key=certs / f"{name}.key", ca=certs / "ca.pem", mutual=mutual)


@pytest.fixture(scope="module")
def secure(ray_session, site_dbs, certs):
    """A site and a coordinator that both demand client certificates."""
    site = SiteServer(SiteConfig(name="secure", db=site_dbs["alpha"], worker_cpus=0.25,
                                 tls=party(certs, "site", mutual=True))).start()
    coordinator = CoordinatorServer(CoordinatorConfig(
        sites=[SiteEndpoint(name="secure", address=site.address)], tls=party(certs, "coordinator", mutual=True),
        site_tls=party(certs, "coordinator"), analysis_workers=0)).start()  # images over TLS; no analyser actors
    yield coordinator, site
    coordinator.stop(0)
    site.stop(0)


def test_mutual_tls_case_end_to_end(secure, certs, case):
    coordinator, _ = secure
    with CoordinatorClient(coordinator.address, tls=party(certs, "client")) as client:
        events = list(client.submit(case[:2], "urgent", deadline_s=60))
        # The case went to the coordinator's urgent port (marked replies), over TLS too.
        assert client.class_address("urgent").endswith(f":{coordinator.class_ports['urgent']}")
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
        sites=[SiteEndpoint(name="secure", address=site.address)], site_tls=TLSFiles(ca=certs / "ca.pem"),
        analysis_workers=0)).start()
    try:
        with CoordinatorClient(coordinator.address) as client:
            events = list(client.submit(case[:1], "routine", deadline_s=10))
        (result,) = [e.site_result for e in events if e.HasField("site_result")]
        assert result.status_code == grpc.StatusCode.UNAVAILABLE.value[0]
    finally:
        coordinator.stop(0)


# ------------------------------------------------------------------ roles


def call(address: str, certs: Path, name: str, service: str = "site"):
    """Info on the site's or the coordinator's `address`, presenting `name`'s certificate."""
    from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
    from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

    tls = party(certs, name)
    with grpc.secure_channel(address, tls.channel_credentials(), options=[("grpc.use_local_subchannel_pool", 1)]) as ch:
        if service == "site":
            return pb_grpc.SiteStub(ch).Info(pb.SiteInfoRequest(), timeout=30)
        return pb_grpc.CoordinatorStub(ch).Info(pb.CoordinatorInfoRequest(), timeout=30)


@pytest.mark.parametrize("name", ["client", "gateway"])
def test_a_site_answers_coordinators_only(secure, certs, name):
    _, site = secure
    urgent = site.address.rsplit(":", 1)[0] + f":{site.server.class_ports['urgent']}"
    for address in (site.address, urgent):  # the control port and a class port, where cases arrive
        with pytest.raises(grpc.RpcError) as refused:
            call(address, certs, name)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "answers coordinators only" in refused.value.details()
        assert f"is a {name} certificate" in refused.value.details()
    assert call(site.address, certs, "coordinator").site == "secure"
    assert call(urgent, certs, "coordinator").site == "secure"


def test_a_site_certificate_cannot_call_a_site_or_the_coordinator(secure, certs):
    """A site's certificate may open a connection (its own health probe presents it), but its
    role may call neither a site nor the coordinator."""
    coordinator, site = secure
    for address, service in ((site.address, "site"), (coordinator.address, "coordinator")):
        with pytest.raises(grpc.RpcError) as refused:
            call(address, certs, "site-b", service)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_the_coordinator_answers_clients_and_the_gateway_only(secure, certs):
    coordinator, _ = secure
    for name in ("client", "gateway"):
        assert call(coordinator.address, certs, name, "coordinator").class_ports["urgent"] == \
            coordinator.class_ports["urgent"]
    with pytest.raises(grpc.RpcError) as refused:
        call(coordinator.address, certs, "coordinator", "coordinator")
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "answers pathologists' clients and the web gateway only" in refused.value.details()


def test_health_checks_answer_any_certificate_of_the_ca(secure, certs):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    _, site = secure
    with grpc.secure_channel(site.address, party(certs, "client").channel_credentials()) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=30)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_the_role_table_names_our_services():
    from qos.transport import ROLES, SERVICE_CALLERS
    from services.coordinator.server import COORDINATOR_SERVICE
    from services.site.server import SITE_SERVICE

    assert SERVICE_CALLERS == {SITE_SERVICE: {"coordinator"}, COORDINATOR_SERVICE: {"client", "gateway"}}
    assert all(roles <= set(ROLES) for roles in SERVICE_CALLERS.values())


def test_certificates_carry_their_role_and_only_the_usage_it_needs(certs):
    def text(name: str) -> str:
        return subprocess.run(["openssl", "x509", "-in", str(certs / f"{name}.pem"), "-noout", "-text"],
                              check=True, capture_output=True, text=True).stdout

    usages = {"coordinator": "TLS Web Server Authentication, TLS Web Client Authentication",
              "site": "TLS Web Server Authentication, TLS Web Client Authentication", "client": "TLS Web Client Authentication",
              "gateway": "TLS Web Server Authentication, TLS Web Client Authentication"}
    for name, usage in usages.items():
        body = text(name)
        assert f"URI:pathmaster://role/{name}" in body
        eku = body.split("X509v3 Extended Key Usage:")[1].split("\n")[1].strip()
        assert eku == usage, name
        assert "CA:FALSE" in body
    assert "DNS:localhost" in text("site") and "DNS:localhost" not in text("client")
    assert "CA:TRUE" in text("ca")


def test_make_certs_refuses_an_unknown_role(tmp_path):
    made = subprocess.run(["bash", str(REPO / "deploy" / "make-certs.sh"), str(tmp_path), "site-c"],
                          capture_output=True, text=True)
    assert made.returncode == 2 and "site:site-c" in made.stderr
    assert not (tmp_path / "site-c.pem").exists()


def test_server_tls_needs_cert_and_key(certs):
    with pytest.raises(ValueError, match="cert.*key"):
        TLSFiles(ca=certs / "ca.pem").server_credentials()
    with pytest.raises(ValueError, match="no-such.pem"):
        TLSFiles(cert=certs / "no-such.pem", key=certs / "site.key").server_credentials()


# ------------------------------------------------------------------ batch and gateway over TLS


def tls_flags(certs: Path, name: str = "client") -> list[str]:
    return ["--tls-ca", str(certs / "ca.pem"), "--tls-cert", str(certs / f"{name}.pem"),
            "--tls-key", str(certs / f"{name}.key")]


@pytest.fixture(scope="module")
def cell_folder(case_cells, tmp_path_factory) -> Path:
    """Two test cells as files, each with NAME-background.png and NAME-mask.png."""
    folder = tmp_path_factory.mktemp("cells")
    for cell in case_cells[:2]:
        stem = Path(cell["cell_id"]).stem
        for part, suffix in (("image", ""), ("background", "-background"), ("mask", "-mask")):
            (folder / f"{stem}{suffix}.png").write_bytes(cell[part])
    return folder


def test_batch_runs_over_mutual_tls_and_says_why_without_it(secure, certs, cell_folder, tmp_path, capsys):
    from pathmaster.cli import main
    from services.gateway.batch import ResultsFile

    coordinator, _ = secure
    command = ["batch", str(cell_folder), "--coordinator", coordinator.address, "--quiet"]
    out = tmp_path / "tls.jsonl"
    assert main(command + ["--out", str(out)] + tls_flags(certs)) == 0
    rows = ResultsFile(out).read()
    assert len(rows) == 2
    assert all(r["status"] == "ok" and len(r["matches"]["secure"]) == 5 for r in rows.values())

    # No CA: the cells fail (to be retried), and each row says to connect with TLS.
    plain = tmp_path / "plain.jsonl"
    assert main(command + ["--out", str(plain)]) == 1
    errors = [r["error"] for r in ResultsFile(plain).read().values()]
    assert len(errors) == 2 and all("UNAVAILABLE" in e and "--tls-ca" in e for e in errors)

    # Bad flags stop the run before anything is sent or written.
    capsys.readouterr()
    half = tmp_path / "half.jsonl"
    assert main(command + ["--out", str(half), "--tls-cert", str(certs / "client.pem")]) == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    assert main(command + ["--out", str(half), "--tls-ca", str(certs / "no-such-ca.pem")]) == 2
    assert "no-such-ca.pem" in capsys.readouterr().err
    assert not half.exists()


def test_gateway_relays_a_case_over_mutual_tls_and_says_why_without_it(secure, certs, case_cells):
    from pathmaster.cli import build_parser
    from services.command_line import tls_from_args
    from services.gateway import start_gateway
    from tests.clients.web import WebClient

    coordinator, _ = secure
    args = build_parser().parse_args(["gateway", "--coordinator", coordinator.address] + tls_flags(certs, "gateway"))
    with_tls, without = start_gateway(coordinator.address, tls=tls_from_args(args)), start_gateway(coordinator.address)
    try:
        web = WebClient(with_tls)
        status, body = web.get_json("api/sites")
        assert status == 200 and [(s["site"], s["serving"]) for s in body["sites"]] == [("secure", True)]
        cell = case_cells[0]
        events = web.post_case({"c.png": cell["image"], "c-mask.png": cell["mask"]}, "urgent")
        assert events[-1]["type"] == "summary", events[-1]
        (site,) = [e for e in events if e["type"] == "site"]
        assert site["ok"] and site["site"] == "secure" and len(site["cells"][0]["matches"]) == 5

        # No CA: the page's call fails with a message that says to connect with TLS.

        status, body = WebClient(without).get_json("api/sites")
        assert status == 502 and "UNAVAILABLE" in body["error"] and "--tls-ca" in body["error"]
    finally:
        with_tls.stop()
        without.stop()


def test_query_uses_the_same_flags(secure, certs, cell_folder, capsys):
    from pathmaster.cli import main

    coordinator, _ = secure
    command = ["query", str(cell_folder / "test-2026-0.png"), "--coordinator", coordinator.address]
    assert main(command + tls_flags(certs)) == 0
    assert "secure" in capsys.readouterr().out
    assert main(command) == 1
    assert "--tls-ca" in capsys.readouterr().err
