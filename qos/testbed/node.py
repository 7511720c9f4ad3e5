"""Hosts and routers: one network namespace each (Mininet's Host, with IP forwarding for Router).

    a1 = Host("A1", tag="t1"); a1.create()
    a1.cmd("ip", "addr")             # stdout of a command run inside A1's namespace
    proc = a1.popen(["iperf3", "-s"])
"""

from __future__ import annotations

import subprocess
import time

from qos import netns


class Interface:
    """One end of a link: its name inside a node's namespace and its address (``10.42.1.1/24``) if any."""

    def __init__(self, node: "Node", name: str, address: str | None = None):
        if len(name) > 15:
            raise ValueError(f"interface name {name!r} is longer than the kernel's 15 characters")
        self.node = node
        self.name = name
        self.address = address

    @property
    def ip(self) -> str | None:
        """The address without its prefix length."""
        return self.address.split("/")[0] if self.address else None

    def __repr__(self) -> str:
        return f"Interface({self.node.name}:{self.name} {self.address or '-'})"


class Node:
    """A network namespace named after the testbed's tag and the node's name."""

    def __init__(self, name: str, tag: str):
        self.name = name
        self.tag = tag
        self.namespace = netns.namespace_name(tag, name)
        self.interfaces: list[Interface] = []

    def create(self) -> None:
        """Create the namespace (idempotent), IPv4 only."""
        netns.add(self.namespace)
        # The testbed is IPv4; IPv6 would add router solicitations and MLD reports to the
        # bottleneck queues' counters (and the u32 DSCP filters match IPv4 only).
        for scope in ("all", "default"):
            self.set_sysctl(f"net.ipv6.conf.{scope}.disable_ipv6", 1)

    def destroy(self) -> None:
        """Kill the node's processes and delete its namespace (idempotent)."""
        netns.delete(self.namespace)

    def exists(self) -> bool:
        return netns.exists(self.namespace)

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a command inside the node and wait for it."""
        return netns.run(self.namespace, list(argv), check=check, timeout=timeout)

    def cmd(self, *argv: str, timeout: float = 30.0) -> str:
        """Run a command inside the node; return its stdout, raise CommandError if it fails."""
        return self.run(*argv, timeout=timeout).stdout

    def popen(self, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start a command inside the node without waiting (see `netns.popen`)."""
        return netns.popen(self.namespace, argv, **kwargs)

    def set_sysctl(self, key: str, value: str | int) -> None:
        """Set a per-namespace sysctl, e.g. ("net.ipv4.ip_forward", 1)."""
        self.cmd("sysctl", "-q", "-w", f"{key}={value}")

    def wait_listening(self, port: int, protocol: str = "tcp", timeout: float = 60.0) -> None:
        """Poll until something listens on `port` inside the node; raise TimeoutError after `timeout` s.

        The default is generous: on a busy host a server's start-up (Python imports) can take
        tens of seconds, and polling costs nothing when it is quick."""
        flag = "-Hltn" if protocol == "tcp" else "-Hlun"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.cmd("ss", flag, f"sport = :{port}").strip():
                return
            time.sleep(0.02)
        raise TimeoutError(f"nothing listens on {protocol} port {port} in {self.name} after {timeout} s")

    def new_interface_name(self) -> str:
        """The next free Mininet-style interface name, ``<node>-eth<n>``."""
        return f"{self.name}-eth{len(self.interfaces)}"

    def interface(self, name: str) -> Interface:
        for intf in self.interfaces:
            if intf.name == name:
                return intf
        raise KeyError(f"node {self.name} has no interface {name!r}")

    @property
    def ip(self) -> str | None:
        """The node's first address (without prefix length), or None."""
        return next((i.ip for i in self.interfaces if i.ip), None)

    def add_route(self, destination: str, via: str) -> None:
        """Route `destination` (``10.42.2.0/24`` or ``default``) through gateway `via` (replace if present)."""
        self.cmd("ip", "route", "replace", destination, "via", via)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name} in {self.namespace})"


class Host(Node):
    """An end host: a namespace with a default route through its subnet's router."""

    def set_default_route(self, gateway: str) -> None:
        self.add_route("default", gateway)


class Router(Node):
    """A namespace that forwards IPv4 between its interfaces."""

    def create(self) -> None:
        super().create()
        self.set_sysctl("net.ipv4.ip_forward", 1)
