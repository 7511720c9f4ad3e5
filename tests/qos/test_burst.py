"""qos.traffic.burst on loopback: every datagram recorded in order with a kernel time, each class ended."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from qos.traffic import burst


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sink_records_every_class_in_order_until_each_has_ended():
    port, result, listening = free_udp_port(), {}, threading.Event()
    sink = threading.Thread(target=lambda: result.update(burst.receive(port, 3, timeout=10, ready=listening.set)))
    sink.start()
    assert listening.wait(10)
    before = time.time_ns()
    sent = burst.send("127.0.0.1", port, [(46, 50), (0, 20), (10, 0)])
    after = time.time_ns()
    sink.join(15)
    assert sent["sent"] == [50, 20, 0] and sent["unacknowledged"] == [] and sent["send_errors"] == 0
    assert result["ended"] == [0, 1, 2] and result["sent"] == {0: 50, 1: 20, 2: 0}
    packets = result["packets"]
    assert [p[:2] for p in packets if p[0] == 0] == [[0, i] for i in range(50)]
    assert [p[:2] for p in packets if p[0] == 1] == [[1, i] for i in range(20)]
    # Interleaved as sent (loopback keeps the order), each stamped by the kernel on arrival
    # (on loopback, stamps of successive packets may be out of order by a fraction of a ms).
    assert [p[0] for p in packets[:6]] == [0, 1, 0, 1, 0, 1]
    assert all(before <= p[2] <= after for p in packets)


def test_sink_gives_up_after_its_timeout_and_keeps_what_came():
    port = free_udp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        listening = threading.Event()
        result = {}
        sink = threading.Thread(target=lambda: result.update(burst.receive(port, 1, timeout=0.5,
                                                                           ready=listening.set)))
        sink.start()
        assert listening.wait(10)
        s.sendto(burst.HEADER.pack(burst.MAGIC, burst.DATA, 0, 7) + bytes(100), ("127.0.0.1", port))
        s.sendto(b"not ours", ("127.0.0.1", port))
        sink.join(10)
    assert [p[:2] for p in result["packets"]] == [[0, 7]] and result["ended"] == []


def test_bursts_are_dscp_colon_count():
    assert burst.parse_bursts(["46:10", "0:0"]) == [(46, 10), (0, 0)]
    for bad in ("46", "64:1", "0:-1"):
        with pytest.raises(ValueError, match="DSCP:COUNT"):
            burst.parse_bursts([bad])
