"""Host, Router, Link and Lan in real network namespaces."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from qos import netns
from qos.testbed.link import Lan, Link
from qos.testbed.node import Host, Router

pytestmark = [pytest.mark.netns, pytest.mark.timing]


@pytest.fixture
def tag(netns_ok):
    tag = netns.new_tag("p")
    yield tag
    for name in netns.list_namespaces(netns.tag_prefix(tag)):
        netns.delete(name)


def test_tags_are_checked_and_unique():
    assert netns.new_tag() != netns.new_tag()
    with pytest.raises(ValueError, match="a-z and 0-9"):
        netns.namespace_name("bad-tag", "A1")
    with pytest.raises(ValueError, match="15 characters"):
        Link(Host("averyveryverylongname", "x"), Host("b", "x"))


def test_two_subnets_through_a_router_carry_tcp(tag):
    a1, b1, ra = Host("A1", tag), Host("B1", tag), Router("rA", tag)
    for node in (a1, b1, ra):
        node.create()
    lan = Lan(ra, "10.42.1.254/24")
    lan.attach(a1, "10.42.1.1/24")
    link = Link(b1, ra, "10.42.2.1/24", "10.42.2.254/24")
    lan.create()
    link.create()
    link.create()  # idempotent
    a1.set_default_route(lan.gateway)
    b1.set_default_route("10.42.2.254")

    assert netns.list_namespaces(netns.tag_prefix(tag)) == sorted(n.namespace for n in (a1, b1, ra))
    assert "10.42.1.1/24" in a1.cmd("ip", "-o", "addr", "show", "A1-eth0")
    # Offloads off, so the shaper sees MTU-sized packets.
    features = a1.cmd("ethtool", "-k", "A1-eth0")
    assert "tcp-segmentation-offload: off" in features
    assert "generic-segmentation-offload: off" in features

    # Exactly 2 MiB through the router, counted by the receiver: the sender closes its side
    # when done and the receiver reads to end of stream, so nothing depends on timing.
    receiver = b1.popen(
        [sys.executable, "-c", _RECEIVE_TO_EOF, "5302"], stdout=subprocess.PIPE, text=True
    )
    b1.wait_listening(5302)
    a1.cmd(sys.executable, "-c", _SEND_BYTES, b1.ip, "5302", str(2 * 1024 * 1024), timeout=60)
    out, _ = receiver.communicate(timeout=60)
    assert int(out) == 2 * 1024 * 1024

    # And an iperf3 run (the traffic tool of the experiments) gets through the same way.
    server = b1.popen(["iperf3", "-s", "-1", "-p", "5301"])
    b1.wait_listening(5301)
    out = a1.cmd("iperf3", "-c", b1.ip, "-p", "5301", "-n", "2M", "-J", timeout=60)
    server.wait(30)
    end = json.loads(out)["end"]
    assert end["sum_sent"]["bytes"] >= 2 * 1024 * 1024
    assert end["sum_received"]["bytes"] > 0
    # iperf3's totals at the moment the client stops depend on what was still in flight; what
    # holds always is that the router forwarded at least every byte both transfers delivered.
    forwarded = max(i["stats64"]["tx"]["bytes"] for i in json.loads(ra.cmd("ip", "-j", "-s", "link", "show")))
    assert forwarded >= 2 * 1024 * 1024 + end["sum_received"]["bytes"]


_RECEIVE_TO_EOF = """
import socket, sys
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
server.settimeout(60)
conn, _ = server.accept()
conn.settimeout(60)
total = 0
while chunk := conn.recv(65536):
    total += len(chunk)
print(total)
"""

_SEND_BYTES = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=60) as conn:
    conn.sendall(bytes(int(sys.argv[3])))
    conn.shutdown(socket.SHUT_WR)
"""


def test_destroy_kills_processes_and_removes_everything(tag):
    a1, ra = Host("A1", tag), Router("rA", tag)
    for node in (a1, ra):
        node.create()
    Link(a1, ra, "10.42.1.1/24", "10.42.1.254/24").create()
    sleeper = a1.popen(["sleep", "300"])
    assert sleeper.pid in netns.pids(a1.namespace)

    a1.destroy()
    ra.destroy()
    a1.destroy()  # idempotent
    assert sleeper.wait(5) != 0
    assert netns.list_namespaces(netns.tag_prefix(tag)) == []
