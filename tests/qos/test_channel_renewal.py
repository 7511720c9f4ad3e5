"""ClassChannels(renew=True): each case after the first goes out on a fresh TCP connection,
opened between cases; the replaced connection is closed once its calls' deadline has passed."""

import time
from concurrent import futures

import grpc
import pytest

from qos.transport import ClassChannels

METHOD = "/test.Peer/Who"


@pytest.fixture
def peer_server():
    """A server whose one method answers with the caller's address (one per TCP connection)."""
    handler = grpc.method_handlers_generic_handler("test.Peer", {
        "Who": grpc.unary_unary_rpc_method_handler(lambda request, context: context.peer().encode()),
    })
    server = grpc.server(futures.ThreadPoolExecutor(2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def who(channel: grpc.Channel) -> str:
    return channel.unary_unary(METHOD)(b"", timeout=10).decode()


def test_renewed_lane_sends_the_next_case_on_a_new_connection(peer_server):
    channels = ClassChannels({"s": peer_server}, renew=True)
    try:
        first = channels.channel("s", "urgent", 1, busy_until=time.monotonic())  # its calls' deadline: passed
        peer_first = who(first)
        assert channels.refresh() == channels.spares  # for the one lane the case used
        grpc.channel_ready_future(channels._spares[("s", "urgent", 1)][0]).result(timeout=10)
        second = channels.channel("s", "urgent", 1, busy_until=time.monotonic() + 60)
        assert second is not first
        assert who(second) != peer_first  # another TCP connection (another client port)
        with pytest.raises(ValueError):  # the replaced channel, its deadline passed, is closed
            who(first)
        assert channels.refresh() == 1  # the spare taken is replaced; the other still waits
    finally:
        channels.close()


def test_without_renew_every_case_shares_the_connection(peer_server):
    channels = ClassChannels({"s": peer_server})
    try:
        peer_first = who(channels.channel("s", "urgent", 1))
        assert channels.refresh() == 0
        assert who(channels.channel("s", "urgent", 1)) == peer_first
    finally:
        channels.close()


def test_opening_connections_ahead_is_not_a_use(peer_server):
    channels = ClassChannels({"s": peer_server}, renew=True)
    try:
        channels.connect("s", ["urgent", "routine"], lanes=2)
        assert channels.refresh() == 0  # nothing was used: nothing to renew
        channels.channel("s", "routine", 0, busy_until=time.monotonic() + 60)
        assert channels.refresh() == channels.spares
    finally:
        channels.close()
