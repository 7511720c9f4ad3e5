"""Certificate rotation without a restart: a running MarkedServer takes new
certificate, key and CA files for its next connections, and keeps its last good pair while
a rotation is half done."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from qos.transport import MarkedServer, TLSFiles

REPO = Path(__file__).resolve().parents[2]


def make_certs(out: Path) -> Path:
    subprocess.run(["bash", str(REPO / "deploy" / "make-certs.sh"), str(out), "site", "coordinator"],
                   check=True, capture_output=True)
    return out


def replace(source: Path, target: Path) -> None:
    """Put `source`'s content at `target` the way an operator should: write beside, rename over."""
    temp = target.with_name(target.name + ".new")
    shutil.copyfile(source, temp)
    os.replace(temp, target)


def health_of(port: int, certs: Path) -> str:
    """The server's health as the coordinator of `certs` sees it, on a new connection;
    "refused" when the TLS handshake fails."""
    tls = TLSFiles(cert=certs / "coordinator.pem", key=certs / "coordinator.key", ca=certs / "ca.pem")
    options = [("grpc.use_local_subchannel_pool", 1), ("grpc.ssl_target_name_override", "site")]
    with grpc.secure_channel(f"127.0.0.1:{port}", tls.channel_credentials(), options=options) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=20)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return "refused"
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


@pytest.fixture
def two_cas(tmp_path) -> tuple[Path, Path]:
    return make_certs(tmp_path / "old"), make_certs(tmp_path / "new")


def test_a_running_server_takes_rotated_files_for_new_connections(tmp_path, two_cas):
    old, new = two_cas
    live = tmp_path / "live"
    live.mkdir()
    for name in ("site.pem", "site.key", "ca.pem"):
        shutil.copyfile(old / name, live / name)
    tls = TLSFiles(cert=live / "site.pem", key=live / "site.key", ca=live / "ca.pem", mutual=True)
    server = MarkedServer(lambda s: None, [], "127.0.0.1", 0, tls=tls).start()
    try:
        assert (health_of(server.port, old), health_of(server.port, new)) == ("SERVING", "refused")

        # Half a rotation (the new certificate, the old key): kept out, the old pair still serves.
        replace(new / "site.pem", live / "site.pem")
        assert (health_of(server.port, old), health_of(server.port, new)) == ("SERVING", "refused")

        # The whole rotation: the new CA's parties are served, the old CA's refused; no restart.
        replace(new / "site.key", live / "site.key")
        replace(new / "ca.pem", live / "ca.pem")
        assert (health_of(server.port, old), health_of(server.port, new)) == ("refused", "SERVING")
    finally:
        server.stop(0)


def test_a_mismatched_key_is_refused_at_start(two_cas):
    old, new = two_cas
    with pytest.raises(ValueError, match="does not match"):
        TLSFiles(cert=new / "site.pem", key=old / "site.key", ca=old / "ca.pem", mutual=True).server_credentials()


def test_channels_take_rotated_client_files_for_new_calls(tmp_path, two_cas):
    """The coordinator's channels to its sites (ClassChannels): after both ends rotate to a
    new CA, the next call opens a new channel with the new files."""
    from qos.transport import ClassChannels

    old, new = two_cas
    server_dir, client_dir = tmp_path / "server", tmp_path / "client"
    server_dir.mkdir()
    client_dir.mkdir()
    for name in ("site.pem", "site.key", "ca.pem"):
        shutil.copyfile(old / name, server_dir / name)
    for name in ("coordinator.pem", "coordinator.key", "ca.pem"):
        shutil.copyfile(old / name, client_dir / name)
    server = MarkedServer(lambda s: None, [], "127.0.0.1", 0, tls=TLSFiles(
        cert=server_dir / "site.pem", key=server_dir / "site.key", ca=server_dir / "ca.pem", mutual=True)).start()
    channels = ClassChannels({"site": f"127.0.0.1:{server.port}"}, tls=TLSFiles(
        cert=client_dir / "coordinator.pem", key=client_dir / "coordinator.key", ca=client_dir / "ca.pem",
        server_name="site"))

    def check() -> str:
        stub = health_pb2_grpc.HealthStub(channels.channel("site"))
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=20, wait_for_ready=False)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.UNAVAILABLE, err
            return "refused"
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)

    try:
        assert check() == "SERVING"
        first = channels.channel("site")
        for name in ("site.pem", "site.key", "ca.pem"):
            replace(new / name, server_dir / name)
        replace(new / "coordinator.pem", client_dir / "coordinator.pem")  # half done: channels kept
        assert channels.channel("site") is first
        replace(new / "coordinator.key", client_dir / "coordinator.key")
        replace(new / "ca.pem", client_dir / "ca.pem")
        assert channels.channel("site") is not first
        assert check() == "SERVING"
    finally:
        channels.close()
        server.stop(0)
