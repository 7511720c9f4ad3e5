"""A line of three namespaces, client - router - server: the smallest routed path with real packets.

    with line_topology(netns.new_tag("x"), "10.78.1.0/24", "10.78.2.0/24") as line:
        line.client.cmd("ping", "-c", "1", line.server.ip)
        line.out_interface      # the router's interface towards the server

Each end host takes the first address of its subnet and the router the last one
(``10.78.1.1`` client, ``10.78.1.254`` / ``10.78.2.254`` router, ``10.78.2.1`` server).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterator
from contextlib import contextmanager

from qos.testbed.topology import Topology


def _ends(subnet: str) -> tuple[str, str]:
    """The host's (first) and router's (last) address on `subnet`, with its prefix length."""
    network = ipaddress.IPv4Network(subnet)
    if network.num_addresses < 4:
        raise ValueError(f"subnet {subnet!r} has no room for a host and a router; use a /30 or larger")
    return (f"{network.network_address + 1}/{network.prefixlen}",
            f"{network.broadcast_address - 1}/{network.prefixlen}")


class LineTopology(Topology):
    """Host ``c`` - Router ``r`` - Host ``s``, with `client_subnet` on the left link and `server_subnet` on the right."""

    def __init__(self, tag: str, client_subnet: str = "10.79.1.0/24", server_subnet: str = "10.79.2.0/24"):
        super().__init__(tag)
        client_address, router_left = _ends(client_subnet)
        server_address, router_right = _ends(server_subnet)
        self.client = self.add_host("c")
        self.router = self.add_router("r")
        self.server = self.add_host("s")
        self.to_router = self.add_link(self.client, self.router, client_address, router_left)
        self.to_server = self.add_link(self.router, self.server, router_right, server_address)

    @property
    def out_interface(self) -> str:
        """The router's interface towards the server: where client -> server traffic leaves it."""
        return self.to_server.intf1.name

    def configure_routes(self) -> None:
        self.client.set_default_route(self.to_router.intf2.ip)
        self.server.set_default_route(self.to_server.intf1.ip)


@contextmanager
def line_topology(tag: str, client_subnet: str = "10.79.1.0/24",
                  server_subnet: str = "10.79.2.0/24") -> Iterator[LineTopology]:
    """Build a `LineTopology` in the namespaces of `tag`, yield it, and delete its namespaces
    (with their processes) on the way out, also when building it failed half way."""
    line = LineTopology(tag, client_subnet, server_subnet)
    try:
        line.build()
        yield line
    finally:
        line.destroy()
