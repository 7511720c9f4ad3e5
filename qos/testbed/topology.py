"""Topologies: nodes and links that build themselves; the PathMaster 2002 testbed (seed 000, Figure 4).

    topo = PathMaster2002(load_config())
    topo.build()
    topo.node("A1").cmd("ip", "route")
    topo.uplinks["B"]       # the rB <-> core link, one of the bottlenecks
"""

from __future__ import annotations

import ipaddress

from qos.testbed.config import TestbedConfig
from qos.testbed.link import Lan, Link
from qos.testbed.node import Host, Node, Router


class Topology:
    """A set of nodes, LANs and links in the namespaces of one tag; `build` creates them all."""

    def __init__(self, tag: str):
        self.tag = tag
        self.nodes: dict[str, Node] = {}
        self.lans: list[Lan] = []
        self.links: list[Link] = []

    def add_host(self, name: str) -> Host:
        return self._add(Host(name, self.tag))

    def add_router(self, name: str) -> Router:
        return self._add(Router(name, self.tag))

    def _add(self, node: Node) -> Node:
        if node.name in self.nodes:
            raise ValueError(f"topology already has a node {node.name!r}")
        self.nodes[node.name] = node
        return node

    def add_lan(self, router: Router, address: str) -> Lan:
        lan = Lan(router, address)
        self.lans.append(lan)
        return lan

    def add_link(self, node1: Node, node2: Node, address1: str | None = None,
                 address2: str | None = None) -> Link:
        link = Link(node1, node2, address1, address2)
        self.links.append(link)
        return link

    def node(self, name: str) -> Node:
        try:
            return self.nodes[name]
        except KeyError:
            raise KeyError(f"no node {name!r} in the topology; nodes: {', '.join(self.nodes)}") from None

    def build(self) -> None:
        """Create every namespace, LAN and link (idempotent), then the routes."""
        for node in self.nodes.values():
            node.create()
        for lan in self.lans:
            lan.create()
        for link in self.links:
            link.create()
        self.configure_routes()

    def configure_routes(self) -> None:
        """Install routes once everything exists; topologies override it."""

    def destroy(self) -> None:
        for node in self.nodes.values():
            node.destroy()


class PathMaster2002(Topology):
    """Subnets A, B, C, each with hosts X1 (server), X2 (worker), X3 (utility) on a LAN in router rX;
    the routers joined through `core`, the shared 10 Mbit/s segment (see default.toml for addresses).
    """

    def __init__(self, config: TestbedConfig):
        super().__init__(config.tag)
        self.config = config
        base = config.address_range.network_address
        self.core = self.add_router("core")
        self.routers: dict[str, Router] = {}
        self.subnet_lans: dict[str, Lan] = {}
        self.uplinks: dict[str, Link] = {}
        self.subnet_networks: dict[str, ipaddress.IPv4Network] = {}
        for n, subnet in enumerate(config.subnets, start=1):
            network = ipaddress.IPv4Network((int(base) + 256 * n, 24))
            self.subnet_networks[subnet] = network
            router = self.add_router(f"r{subnet}")
            self.routers[subnet] = router
            lan = self.add_lan(router, f"{network.network_address + 254}/24")
            self.subnet_lans[subnet] = lan
            for k in range(1, config.hosts_per_subnet + 1):
                lan.attach(self.add_host(f"{subnet}{k}"), f"{network.network_address + k}/24")
            p2p = int(base) + 4 * (n - 1)
            self.uplinks[subnet] = self.add_link(
                router, self.core,
                f"{ipaddress.IPv4Address(p2p + 1)}/30", f"{ipaddress.IPv4Address(p2p + 2)}/30")

    @property
    def master(self) -> Host:
        return self.node(self.config.master)

    def configure_routes(self) -> None:
        for subnet, router in self.routers.items():
            uplink = self.uplinks[subnet]
            router.add_route("default", uplink.intf2.ip)
            self.core.add_route(str(self.subnet_networks[subnet]), uplink.intf1.ip)
            for k in range(1, self.config.hosts_per_subnet + 1):
                self.node(f"{subnet}{k}").set_default_route(self.subnet_lans[subnet].gateway)

    def bottleneck_interfaces(self, subnet: str) -> list:
        """The two egress interfaces of subnet `subnet`'s uplink: router -> core, then core -> router."""
        uplink = self.uplinks[subnet]
        return [uplink.intf1, uplink.intf2]
