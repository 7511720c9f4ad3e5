"""The loopback demo listens on loopback only, and its Ray asks for a token.

Every listening TCP socket and every unconnected UDP socket owned by this process and its
descendants (Ray's GCS, raylet, agents and workers, the sites, the coordinator), read from
/proc: the socket tables of this network namespace, matched by inode to the processes'
open files.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest

from qos.transport import is_loopback
from services.fate import descendants
from services.ray_local import private_token_file

TCP_LISTEN = "0A"       # /proc/net/tcp state of a listening socket
UDP_UNCONNECTED = "07"  # /proc/net/udp state of a socket with no peer (TCP_CLOSE)


def process_tree(root: int) -> dict[int, str]:
    """{pid: command line} of `root` and every descendant."""
    tree = {}
    for pid in [root, *descendants(root)]:
        try:
            tree[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:100]
        except OSError:  # gone meanwhile
            continue
    return tree


def socket_inodes(pids) -> dict[str, int]:
    """{socket inode: pid} of the sockets the processes have open."""
    owners = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners[target[8:-1]] = pid
    return owners


def _address(hex_address: str, v6: bool) -> tuple[str, int]:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # /proc prints each 32-bit word of the address in host (little-endian) order
    raw = b"".join(struct.pack("<I", struct.unpack(">I", raw[i:i + 4])[0]) for i in range(0, len(raw), 4))
    family = socket.AF_INET6 if v6 else socket.AF_INET
    return socket.inet_ntop(family, raw), int(port, 16)


def listening_sockets(root: int) -> list[tuple[str, str, int, int, str]]:
    """(protocol, address, port, pid, command) of every listening TCP socket and unconnected
    UDP socket owned by `root` or a descendant."""
    tree = process_tree(root)
    owners = socket_inodes(tree)
    found = []
    for protocol in ("tcp", "tcp6", "udp", "udp6"):
        lines = Path(f"/proc/net/{protocol}").read_text().splitlines()[1:]
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            # TCP: listening sockets; UDP: unconnected ones (a connected UDP socket, e.g.
            # a DNS lookup's, takes datagrams from its one peer only)
            if inode not in owners or state != (TCP_LISTEN if protocol.startswith("tcp") else UDP_UNCONNECTED):
                continue
            host, port = _address(local, protocol.endswith("6"))
            pid = owners[inode]
            found.append((protocol, host, port, pid, tree[pid]))
    return found


def test_is_loopback():
    assert all(is_loopback(h) for h in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "::ffff:127.0.0.1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "::", "192.0.2.2", "fd00::2", "::ffff:10.0.0.1", "host"))


def test_every_socket_of_the_demo_is_on_loopback(stack, gateway):
    """The demo's deployment and its web page (`pathmaster demo` starts both)."""
    sockets = listening_sockets(os.getpid())
    exposed = [s for s in sockets if not is_loopback(s[1])]
    assert not exposed, "listening beyond loopback:\n" + "\n".join(map(str, exposed))

    # The list is the real one: it holds the coordinator, every site, and Ray's own servers.
    ports = {port for _, _, port, _, _ in sockets}
    assert stack.coordinator.server.port in ports and set(stack.coordinator.class_ports.values()) <= ports
    for site in stack.sites.values():
        assert int(site.address.rsplit(":", 1)[1]) in ports
    assert urlsplit(gateway.url).port in ports
    commands = " ".join(command for *_, command in sockets)
    assert "gcs_server" in commands and "raylet" in commands


def test_ray_refuses_calls_without_its_token(stack):
    """The demo's Ray GCS answers only calls that carry the token (Ray's token
    authentication), and the token file is private."""
    import ray
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    gcs = ray._private.worker.global_worker.node.gcs_address
    assert is_loopback(gcs.rsplit(":", 1)[0])
    token_path = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    assert token_path.stat().st_mode & 0o077 == 0
    with grpc.insecure_channel(gcs) as channel:
        nodes = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        with pytest.raises(grpc.RpcError) as refused:
            nodes.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=30)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        token = token_path.read_text().strip()
        reply = nodes.GetAllNodeInfo(gcs_service_pb2.GetAllNodeInfoRequest(), timeout=30,
                                     metadata=[("authorization", f"Bearer {token}")])
        assert len(reply.node_info_list) >= 1


def test_the_token_file_is_made_once_and_private(tmp_path):
    first = private_token_file(tmp_path)
    token = first.read_text()
    assert len(token) == 64 and first.stat().st_mode & 0o777 == 0o600
    assert private_token_file(tmp_path).read_text() == token
    assert [p.name for p in tmp_path.iterdir()] == [first.name]  # no temporary file left
