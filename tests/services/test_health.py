"""`pathmaster health`: the readiness check of a site or coordinator, from its own config file."""

from __future__ import annotations

import subprocess
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pathmaster.cli import main

REPO = Path(__file__).resolve().parents[2]


def _server(tls=None):
    """A gRPC server with only the health service, on a free loopback port: (server, port, servicer)."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    address = "127.0.0.1:0"
    port = server.add_secure_port(address, tls.server_credentials()) if tls else server.add_insecure_port(address)
    server.start()
    return server, port, servicer


def _site_file(tmp_path: Path, port: int, tls: str = "") -> Path:
    path = tmp_path / "site.toml"
    path.write_text(f'[site]\nname = "ct"\ndb = "db"\nlisten = "0.0.0.0:{port}"\n{tls}')
    return path


def test_serving_then_not_serving_then_gone(tmp_path, capsys):
    server, port, servicer = _server()
    config = str(_site_file(tmp_path, port))
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert main(["health", "site", "--config", config]) == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)   # a site that cannot serve
        assert main(["health", "site", "--config", config]) == 1
        assert "NOT_SERVING" in capsys.readouterr().out
    finally:
        server.stop(None).wait()
    assert main(["health", "site", "--config", config, "--timeout", "2"]) == 1
    assert "UNREACHABLE" in capsys.readouterr().out


def test_a_bad_file_is_status_2(tmp_path):
    bad = tmp_path / "site.toml"
    bad.write_text('[site]\nname = "ct"\ndb = "db"\nlisten = "nowhere"\n')
    assert main(["health", "site", "--config", str(bad)]) == 2


def test_over_mutual_tls_with_the_servers_own_certificate(tmp_path):
    from qos.transport import TLSFiles

    made = subprocess.run(["bash", str(REPO / "deploy" / "make-certs.sh"), str(tmp_path / "certs"), "site:ct"],
                          capture_output=True, text=True, timeout=120)
    if made.returncode != 0:
        pytest.skip(f"deploy/make-certs.sh could not run here: {made.stderr.strip()[-200:]}")
    certs = tmp_path / "certs"
    tls = TLSFiles(cert=certs / "ct.pem", key=certs / "ct.key", ca=certs / "ca.pem", mutual=True)
    server, port, servicer = _server(tls)
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        with_tls = _site_file(tmp_path, port, '[tls]\ncert = "certs/ct.pem"\nkey = "certs/ct.key"\n'
                                              'ca = "certs/ca.pem"\nmutual = true\n')
        assert main(["health", "site", "--config", str(with_tls)]) == 0
        without = tmp_path / "plain.toml"
        without.write_text(with_tls.read_text().split("[tls]")[0])
        assert main(["health", "site", "--config", str(without), "--timeout", "2"]) == 1  # no TLS: no answer
    finally:
        server.stop(None).wait()
