"""Transport pieces that need no site: port binding, channel routing, addresses."""

from __future__ import annotations

import threading

import grpc
import pytest

from qos.classes import DEFAULT_CLASSES
from qos.transport import ClassChannels, MarkedServer, connect_address, split_address


def nothing(server):
    """No service of our own: health and reflection are still served."""


def test_busy_port_is_an_error_not_a_shared_port():
    first = MarkedServer(nothing, [], "127.0.0.1", 0).start()
    try:
        with pytest.raises(OSError, match=f"127.0.0.1:{first.port}"):
            MarkedServer(nothing, [], "127.0.0.1", first.port)
    finally:
        first.stop(0)


def test_class_ports_each_get_a_port():
    server = MarkedServer(nothing, [], "127.0.0.1", 0, {c.name: 0 for c in DEFAULT_CLASSES}).start()
    try:
        ports = set(server.class_ports.values()) | {server.port}
        assert set(server.class_ports) == {"urgent", "routine", "teaching", "bulk"} and len(ports) == 5
    finally:
        server.stop(0)


def test_a_class_whose_calls_hold_every_thread_keeps_no_other_class_waiting():
    """Each class port has its own threads: bulk calls that hold all of theirs (as a site's
    calls wait for their cells) do not keep an urgent call from starting."""
    running, release = threading.Semaphore(0), threading.Event()

    def work(request, context):
        if request == b"bulk":
            running.release()
            release.wait(60)
        return request

    handler = grpc.method_handlers_generic_handler("test.Work", {"Do": grpc.unary_unary_rpc_method_handler(work)})
    server = MarkedServer(lambda s: s.add_generic_rpc_handlers((handler,)), [], "127.0.0.1", 0,
                          {"urgent": 0, "bulk": 0}, max_workers=2).start()
    channels = {name: grpc.insecure_channel(f"127.0.0.1:{port}") for name, port in server.class_ports.items()}
    try:
        bulk = [channels["bulk"].unary_unary("/test.Work/Do").future(b"bulk", timeout=90) for _ in range(3)]
        assert running.acquire(timeout=30) and running.acquire(timeout=30)  # both bulk threads held
        assert channels["urgent"].unary_unary("/test.Work/Do")(b"urgent", timeout=15) == b"urgent"
        assert not any(call.done() for call in bulk)
    finally:
        release.set()
        for channel in channels.values():
            channel.close()
        server.stop(0)


def test_class_channels_route_to_class_ports():
    channels = ClassChannels({"a": "10.0.0.5:50051"})
    assert channels.address("a", "urgent") == "10.0.0.5:50051"  # ports not known yet
    channels.set_class_ports("a", {"urgent": 50061})
    assert channels.address("a", "urgent") == "10.0.0.5:50061"
    assert channels.address("a", "bulk") == "10.0.0.5:50051" and channels.address("a") == "10.0.0.5:50051"
    with pytest.raises(KeyError, match="express"):
        channels.channel("a", "express")
    channels.close()


def test_addresses():
    assert split_address("[::1]:80") == ("[::1]", 80)
    with pytest.raises(ValueError, match="HOST:PORT"):
        split_address("localhost")
    assert connect_address("0.0.0.0", 5) == "127.0.0.1:5" and connect_address("::1", 5) == "[::1]:5"


def test_each_loopback_connection_is_a_client_of_its_own_and_a_remote_host_is_one():
    """The per-client cap counts a remote host once whatever its ports, but processes on this
    machine (all 127.0.0.1) are told apart by their connections, so that they are not all
    refused alike."""
    from types import SimpleNamespace

    from qos.transport import client_identity

    def caller(peer, common_name=None):
        auth = {"x509_common_name": [common_name.encode()]} if common_name else {}
        return SimpleNamespace(auth_context=lambda: auth, peer=lambda: peer)

    assert client_identity(caller("ipv4:10.1.2.3:5000")) == client_identity(caller("ipv4:10.1.2.3:6000"))
    assert client_identity(caller("ipv4:127.0.0.1:5000")) != client_identity(caller("ipv4:127.0.0.1:6000"))
    assert client_identity(caller("ipv6:[::1]:5000")) != client_identity(caller("ipv6:[::1]:6000"))
    assert client_identity(caller("ipv4:127.0.0.1:5000", "pathologist-1")) == "cn:pathologist-1"


def test_a_site_remembers_a_send_for_its_memory_and_forgets_the_oldest_when_full():
    from qos.transport import CopyFilter

    now = [0.0]
    seen = CopyFilter(memory_s=120.0, entries=2, clock=lambda: now[0])
    assert seen.first(("caller", "send-1")) and not seen.first(("caller", "send-1"))
    assert seen.first(("other caller", "send-1"))        # another caller's send of the same id
    assert seen.first(("caller", "send-2"))              # the memory is full: the oldest goes
    assert seen.first(("caller", "send-1"))
    now[0] = 121.0
    assert seen.first(("caller", "send-2"))              # remembered 120 s, no longer
