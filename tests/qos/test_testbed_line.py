"""The client - router - server line (qos.testbed.line) in real network namespaces."""

from __future__ import annotations

import json

import pytest

from qos import netns
from qos.testbed.line import LineTopology, line_topology
from qos.testbed.node import Host

pytestmark = [pytest.mark.netns, pytest.mark.timing]


def test_subnets_too_small_for_two_ends_are_refused():
    with pytest.raises(ValueError, match="10.79.1.0/31"):
        LineTopology("x", client_subnet="10.79.1.0/31")


def test_the_line_forwards_tcp_and_leaves_no_namespace_behind(netns_ok):
    tag = netns.new_tag("ln")
    prefix = netns.tag_prefix(tag)
    with line_topology(tag, "10.76.1.0/24", "10.76.2.0/24") as line:
        assert netns.list_namespaces(prefix) == sorted(
            n.namespace for n in (line.client, line.router, line.server))
        assert (line.client.ip, line.server.ip) == ("10.76.1.1", "10.76.2.1")
        assert "10.76.2.254/24" in line.router.cmd("ip", "-o", "addr", "show", line.out_interface)
        assert "via 10.76.1.254" in line.client.cmd("ip", "route", "show", "default")
        # Real bytes from client to server through the router's forwarding.
        server = line.server.popen(["iperf3", "-s", "-1", "-p", "5311"])
        line.server.wait_listening(5311)
        out = line.client.cmd("iperf3", "-c", line.server.ip, "-p", "5311", "-n", "1M", "-J", timeout=20)
        end = json.loads(out)["end"]
        received = end["sum_received"]["bytes"]
        assert end["sum_sent"]["bytes"] >= 1024 * 1024
        assert received > 0  # what was still in flight when the client stopped is not counted
        # The router did the forwarding: its link to the server carried at least what arrived.
        stats = json.loads(line.router.cmd("ip", "-j", "-s", "link", "show", line.out_interface))
        assert stats[0]["stats64"]["tx"]["bytes"] >= received
        # A process left running inside is stopped on the way out, not leaked.
        sleeper = line.client.popen(["sleep", "60"])
    assert netns.list_namespaces(prefix) == []
    assert sleeper.wait(5) is not None
    assert server.poll() is not None


def test_a_failure_while_building_still_removes_what_was_made(netns_ok, monkeypatch):
    # A route that cannot be set is hard to cause for real once the addresses are valid;
    # fail the last step of the build so every namespace exists when it goes wrong.
    def refuse(self, gateway):
        raise netns.CommandError(self.namespace, ["ip", "route"], 2, "refused for the test")

    monkeypatch.setattr(Host, "set_default_route", refuse)
    tag = netns.new_tag("ln")
    with pytest.raises(netns.CommandError, match="refused for the test"):
        with line_topology(tag):
            pytest.fail("the body must not run when the build failed")
    assert netns.list_namespaces(netns.tag_prefix(tag)) == []
