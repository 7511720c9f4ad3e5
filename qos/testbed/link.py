"""Links: veth pairs between two nodes' namespaces, and LANs (a bridge inside a router).

    link = Link(a1, ra, "10.42.1.1/24")      # a1:A1-eth0 <-> ra:rA-eth0
    link.create()

Segmentation and receive offloads (GRO, GSO, TSO) are switched off on both ends so that
the kernel shaper and the user-space emulator see MTU-sized packets, as on a real wire,
instead of 64 KB super-packets.
"""

from __future__ import annotations

from qos.testbed.node import Interface, Node

OFFLOADS = ("gro", "gso", "tso")


def _interface_exists(intf: Interface) -> bool:
    done = intf.node.run("ip", "link", "show", "dev", intf.name, check=False)
    return done.returncode == 0


def configure_interface(intf: Interface, master: str | None = None) -> None:
    """Offloads off, the address (if any) on, attached to bridge `master` (if given), then up."""
    node = intf.node
    args = []
    for feature in OFFLOADS:
        args += [feature, "off"]
    node.cmd("ethtool", "-K", intf.name, *args)
    if intf.address:
        node.cmd("ip", "addr", "replace", intf.address, "dev", intf.name)
    if master:
        node.cmd("ip", "link", "set", intf.name, "master", master)
    node.cmd("ip", "link", "set", intf.name, "up")


class Link:
    """A veth pair joining `node1` and `node2`, with optional addresses on either end.

    `bridge2` names a bridge inside node2 that node2's end joins (how hosts join a LAN).
    """

    def __init__(self, node1: Node, node2: Node, address1: str | None = None,
                 address2: str | None = None, name1: str | None = None,
                 name2: str | None = None, bridge2: str | None = None):
        self.intf1 = Interface(node1, name1 or node1.new_interface_name(), address1)
        node1.interfaces.append(self.intf1)
        self.intf2 = Interface(node2, name2 or node2.new_interface_name(), address2)
        node2.interfaces.append(self.intf2)
        self.bridge2 = bridge2

    @property
    def node1(self) -> Node:
        return self.intf1.node

    @property
    def node2(self) -> Node:
        return self.intf2.node

    def create(self) -> None:
        """Create the veth pair directly inside both namespaces and configure its ends (idempotent)."""
        if not _interface_exists(self.intf1):
            # Created inside node1's namespace with the peer placed in node2's: the pair
            # never appears in the root namespace, so names need only be unique per node.
            self.node1.cmd("ip", "link", "add", "name", self.intf1.name, "type", "veth",
                           "peer", "name", self.intf2.name, "netns", self.node2.namespace)
        configure_interface(self.intf1)
        configure_interface(self.intf2, master=self.bridge2)

    def interface_of(self, node: Node) -> Interface:
        """This link's interface on `node`."""
        for intf in (self.intf1, self.intf2):
            if intf.node is node:
                return intf
        raise KeyError(f"link {self} does not touch node {node.name}")

    def __repr__(self) -> str:
        return f"Link({self.intf1} <-> {self.intf2})"


class Lan:
    """An Ethernet LAN: a bridge inside `router` holding the router's address on the subnet.

    Hosts join with `attach`, which creates a link whose router end is a bridge port.
    """

    def __init__(self, router: Node, address: str, name: str | None = None):
        self.router = router
        self.name = name or f"{router.name}-lan"
        self.interface = Interface(router, self.name, address)
        router.interfaces.append(self.interface)
        self.links: list[Link] = []

    def create(self) -> None:
        """Create the bridge with the router's address (idempotent); attached links create themselves."""
        if not _interface_exists(self.interface):
            self.router.cmd("ip", "link", "add", "name", self.name, "type", "bridge")
        self.router.cmd("ip", "addr", "replace", self.interface.address, "dev", self.name)
        self.router.cmd("ip", "link", "set", self.name, "up")
        for link in self.links:
            link.create()

    def attach(self, host: Node, address: str) -> Link:
        """Plan a link from `host` (with `address`) into this LAN; `create` builds it."""
        link = Link(host, self.router, address, bridge2=self.name)
        self.links.append(link)
        return link

    @property
    def gateway(self) -> str:
        return self.interface.ip
