"""The testbed as one object: build, re-configure the bottleneck, inspect, tear down.

    from qos.testbed import Testbed, load_config
    with Testbed(load_config().with_tag("t1")) as tb:       # up() ... down()
        tb.set_strategy({"strategy": "priority"})             # on every bottleneck queue
        server = tb.host("B3").popen(["iperf3", "-s"])
        print(tb.bottleneck_stats())

`up`, `down` and `status` are idempotent. A state file (/run/pathmaster/testbed-<tag>.json)
records what is up; `down` also works from the tag alone (`teardown(tag)`), finding the
namespaces by their ``pm-<tag>-`` prefix, so a crashed run leaves nothing behind either.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

from qos import netns
from qos.machine import STATE_DIR
from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.network import HOST_CARD_QUEUE_PACKETS, HOST_CARD_RATE_KBIT, HUB_RATE_KBIT, ROUTER_QUEUE_PACKETS
from qos.testbed import kernel
from qos.testbed.config import STRATEGY_PLACES, TestbedConfig, load_config
from qos.testbed.node import Interface, Node
from qos.testbed.topology import PathMaster2002



def state_path(tag: str) -> Path:
    return STATE_DIR / f"testbed-{netns.check_tag(tag)}.json"


def teardown(tag: str) -> list[str]:
    """Remove everything of testbed `tag`: processes, namespaces (with their veths, qdiscs and
    iptables rules) and the state file. Works without the config. Returns the namespaces removed."""
    removed = netns.list_namespaces(netns.tag_prefix(tag))
    for name in removed:
        netns.delete(name)
    state_path(tag).unlink(missing_ok=True)
    for workdir in STATE_DIR.glob(f"testbed-{netns.check_tag(tag)}-emulator-*"):
        shutil.rmtree(workdir, ignore_errors=True)
    return removed


class Testbed:
    """The PathMaster 2002 testbed of `config` (default: the packaged default.toml)."""

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, config: TestbedConfig | None = None, classes: ClassTable = DEFAULT_CLASSES):
        self.config = config or load_config()
        self.classes = classes
        self.topology = PathMaster2002(self.config)
        self.disciplines: dict[str, kernel.KernelQdisc] = {}   # "rA:rA-eth1" -> installed discipline
        self.emulators: dict[str, object] = {}                 # subnet (or "core": the 2002 routers' hub) -> emulator
        self.hub_discipline: dict | None = None                # the 2002 network's strategy
        self.strategy_at = "routers"                           # where it runs there: routers | hosts

    @property
    def tag(self) -> str:
        return self.config.tag

    # -- life cycle ---------------------------------------------------------------------------

    def up(self) -> "Testbed":
        """Build the topology and install every bottleneck's discipline (idempotent)."""
        self.topology.build()
        if self.config.tcp_congestion:
            for node in self.topology.nodes.values():
                node.set_sysctl("net.ipv4.tcp_congestion_control", self.config.tcp_congestion)
        if self.config.network == "2002":
            self._configure_cards()
            self._configure_hubs(self.config.bottleneck.discipline)
        else:
            for subnet in self.config.subnets:
                self._configure_uplink(subnet, self.config.link_settings(subnet))
            self._configure_lans()
        self._write_state()
        return self

    # -- the 2002 network (qos/testbed/hubs.py) -------------------------------------------------

    def _configure_cards(self, at: str = "routers") -> None:
        """Each host's 10 Mbit/s card (a FIFO on its end of the veth); routers' ends and the
        router-core veths unshaped: the hubs are the media. With the strategy at the hosts,
        a host's card is its hub station alone (`hubs.subnet_hub`): its end of the veth unshaped."""
        card = kernel.fifo(HOST_CARD_RATE_KBIT * 1000, HOST_CARD_QUEUE_PACKETS,
                           self.config.bottleneck.overhead_bytes)
        for lan in self.topology.lans:
            for link in lan.links:
                if at == "hosts":
                    kernel.clear(link.intf1.node, link.intf1.name)
                    self.disciplines.pop(_key(link.intf1), None)
                else:
                    kernel.install(link.intf1.node, link.intf1.name, card)
                    self.disciplines[_key(link.intf1)] = card
                kernel.clear(link.intf2.node, link.intf2.name)
        for subnet in self.config.subnets:
            for intf in self.topology.bottleneck_interfaces(subnet):
                kernel.clear(intf.node, intf.name)

    def _configure_hubs(self, discipline: dict, at: str = "routers") -> None:
        """(Re)start the hubs' emulators: one per subnet in its router, one for the routers' hub
        in core, the routers' stations running `discipline` (checked before anything stops).
        With `at` = "hosts" the hosts' stations (their cards) run it and the routers' IOS FIFO."""
        from qos import emulator
        from qos.testbed import hubs

        if at not in STRATEGY_PLACES:
            raise ValueError(f"a strategy runs at {' or '.join(STRATEGY_PLACES)}, not {at!r}")
        b = self.config.bottleneck
        topo = self.topology
        routers = hubs.ROUTER_FIFO if at == "hosts" else discipline
        plain, shaped_at = hubs.split_shaping(routers)  # the shaper sits at one port only
        lan_station = hubs.station_settings(plain, HUB_RATE_KBIT, b.overhead_bytes)
        core_station = hubs.station_settings(plain, b.rate_kbit, b.overhead_bytes)
        host_station = hubs.station_settings(discipline, HUB_RATE_KBIT, b.overhead_bytes) if at == "hosts" else None
        master_subnet = self.config.master[0]
        overrides: dict = {}
        if shaped_at == "router":  # the master's router's port toward the shared segment (the study's)
            overrides[f"r{master_subnet}"] = hubs.station_settings(routers, b.rate_kbit, b.overhead_bytes)
        elif shaped_at == "host":  # the master's own card on its hub
            overrides[self.config.master] = {**hubs.station_settings(routers, HUB_RATE_KBIT, b.overhead_bytes)}
        configs = {"core": (topo.core, hubs.core_hub({f"r{s}": topo.uplinks[s].intf2.name
                                                      for s in self.config.subnets}, core_station, overrides))}
        for subnet in self.config.subnets:
            lan = topo.subnet_lans[subnet]
            stations = {link.intf1.node.name: link.intf1.ip for link in lan.links}
            configs[subnet] = (topo.routers[subnet],
                               hubs.subnet_hub(lan.name, topo.routers[subnet].name, stations, lan_station,
                                               host_station, overrides))
        for name, (_, config) in configs.items():
            emulator.config_from_dict(config, f"the 2002 network's hub {name}")
        for name, (node, config) in configs.items():
            old = self.emulators.pop(name, None)
            if old is not None:
                old.stop()
            _stop_stray_emulators(node)
            self.emulators[name] = emulator.launch(node.namespace, config,
                                                   workdir=STATE_DIR / f"testbed-{self.tag}-emulator-{name}")
        self.hub_discipline = dict(discipline)
        if at != self.strategy_at:
            self._configure_cards(at)
        self.strategy_at = at

    def _configure_lans(self) -> None:
        """FIFO at `lan_rate_kbit` on both ends of every host's LAN link (none when 0)."""
        for lan in self.topology.lans:
            for link in lan.links:
                for intf in (link.intf1, link.intf2):
                    if self.config.lan_rate_kbit:
                        kernel.install(intf.node, intf.name,
                                       kernel.fifo(self.config.lan_rate_kbit * 1000, ROUTER_QUEUE_PACKETS))
                    else:
                        kernel.clear(intf.node, intf.name)

    def down(self) -> list[str]:
        """Stop emulators and processes and remove every namespace of this tag (idempotent)."""
        for emu in self.emulators.values():
            try:
                emu.stop()
            except Exception:  # its namespace goes anyway; a failed stop must not block teardown
                pass
        self.emulators.clear()
        self.disciplines.clear()
        return teardown(self.tag)

    def __enter__(self) -> "Testbed":
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc) -> None:
        self.down()

    # -- nodes ----------------------------------------------------------------------------------

    def host(self, name: str) -> Node:
        """A node by name: "A1" ... "C3", "rA" ... "rC", "core"."""
        return self.topology.node(name)

    @property
    def master(self) -> Node:
        return self.topology.master

    def ip(self, name: str) -> str:
        return self.host(name).ip

    # -- the bottleneck -----------------------------------------------------------------------

    def set_strategy(self, discipline: dict, subnets: list[str] | None = None,
                     backend: str | None = None, at: str = "routers") -> None:
        """Install `discipline` (a [bottleneck.discipline]-shaped table) on the uplinks of
        `subnets` (default all), both directions, with `backend` (default: as configured).

        On the 2002 network the discipline runs on every router's hub ports, in the emulator
        (`subnets` must be all of them; `backend` may only be None or "emulator"), or with
        `at` = "hosts" on every host's own outgoing queue (its card on the hub) instead, the
        routers then IOS FIFO: the same scheduling, placed where the host controls it."""
        if self.config.network == "2002":
            if subnets and set(subnets) != set(self.config.subnets):
                raise ValueError("the 2002 network runs one strategy on every router; give no subnets")
            if backend not in (None, "emulator"):
                raise ValueError(f"the 2002 network's hubs run in the emulator, not backend {backend!r}")
            self._configure_hubs(discipline, at)
            self._write_state()
            return
        if at != "routers":
            raise ValueError('a strategy at the hosts needs network = "2002" (on "lan" the hosts\' links '
                             "are unshaped veths: no queue forms there)")
        for subnet in subnets or self.config.subnets:
            settings = self.config.link_settings(subnet)
            settings["discipline"] = dict(discipline)
            if backend:
                settings["backend"] = backend
            self._configure_uplink(subnet, settings)
        self._write_state()

    # -- the end hosts' TCP ----------------------------------------------------------------------

    def set_rto_min(self, hosts: list[str], rto_min_ms: int | None) -> None:
        """Give each of `hosts` a minimum TCP retransmission timeout of `rto_min_ms` ms on its
        paths to the others (None: take it away, Linux's 200 ms again).

        A host route to each peer with the route metric `rto_min` (locked), the kernel's
        first source for it (before TCP_RTO_MIN_US / TCP_BPF_RTO_MIN and the per-namespace
        sysctl net.ipv4.tcp_rto_min_us): unlike the sysctl, which a socket reads once when it
        is made (and an accepted one inherits from its listener), the route reaches the
        connections already open, so a bench switches it between runs without restarting its
        processes. Traffic to any other host (the competing downloads) keeps the default.
        """
        names = sorted(set(hosts))
        for name in names:
            node = self.host(name)
            for peer in names:
                if peer == name:
                    continue
                ip = self.ip(peer)
                if rto_min_ms is None:
                    if json.loads(node.cmd("ip", "-j", "route", "show", "exact", f"{ip}/32") or "[]"):
                        node.cmd("ip", "route", "del", f"{ip}/32")
                    continue
                via = json.loads(node.cmd("ip", "-j", "route", "get", ip))[0]
                gateway = ["via", via["gateway"]] if via.get("gateway") else []
                node.cmd("ip", "route", "replace", f"{ip}/32", *gateway, "dev", via["dev"],
                         "rto_min", f"{int(rto_min_ms)}ms")

    def rto_min_ms(self, host: str, peer: str) -> int | None:
        """The minimum retransmission timeout `host`'s route to `peer` sets, ms (None: none,
        the namespace's net.ipv4.tcp_rto_min_us applies)."""
        route = json.loads(self.host(host).cmd("ip", "-j", "route", "get", self.ip(peer)))[0]
        metrics = {k: v for item in route.get("metrics", []) for k, v in item.items()}
        return metrics.get("rto_min")

    def _configure_uplink(self, subnet: str, settings: dict) -> None:
        """Replace subnet `subnet`'s bottleneck discipline. The new one is checked first, so a
        bad table raises (naming the problem) and leaves the link as it was."""
        rate = settings["rate_kbit"] * 1000  # bit/s
        spec = {"overhead_bytes": settings.get("overhead_bytes", kernel.ETHERNET_HEADER_BYTES),
                **settings.get("discipline", {})}
        backend = settings.get("backend", "kernel")
        uplink_ends = self.topology.bottleneck_interfaces(subnet)
        if backend == "kernel":
            discipline = kernel.from_config(spec, rate, self.classes)
        elif backend == "emulator":
            from qos import emulator  # the other backend; imported only when a link uses it

            emulator.config_from_dict(emulator.interface_config([uplink_ends[0].name], {"rate_kbit": rate / 1000, **spec}),
                                      f"subnet {subnet} emulator settings")
        else:
            raise ValueError(f"subnet {subnet}: unknown backend {backend!r}")

        old = self.emulators.pop(subnet, None)
        if old is not None:
            old.stop()
        _stop_stray_emulators(self.topology.routers[subnet])
        for intf in uplink_ends:
            kernel.clear(intf.node, intf.name)
            self.disciplines.pop(_key(intf), None)
        if backend == "kernel":
            for intf in uplink_ends:
                kernel.install(intf.node, intf.name, discipline)
                self.disciplines[_key(intf)] = discipline
        else:
            self.emulators[subnet] = self._launch_emulator(subnet, rate, spec)

    def _launch_emulator(self, subnet: str, rate_bps: float, spec: dict):
        """Start the user-space emulator in router rX on both directions of its uplink
        (packets leaving the subnet and packets entering it); see `qos.emulator.launch`."""
        from qos import emulator

        router = self.topology.routers[subnet]
        uplink = self.topology.uplinks[subnet]
        return emulator.launch(router.namespace, {"rate_kbit": rate_bps / 1000, **spec},
                               interfaces=[uplink.intf1.name],
                               workdir=STATE_DIR / f"testbed-{self.tag}-emulator-{subnet}")

    def bottleneck_stats(self) -> dict[str, dict]:
        """Per-class counters {bytes, packets, drops, backlog, qlen} of every bottleneck queue.

        Kernel queues are keyed "node:interface" and read live. Emulated ones are keyed
        "router:<direction>" (on the 2002 network "rA:hub", "core:core", one per medium) and are as of the emulator's last statistics write (every few
        seconds and when it stops); bytes and packets count what it sent on.
        """
        out = {}
        for subnet in self.config.subnets:
            for intf in self.topology.bottleneck_interfaces(subnet):
                discipline = self.disciplines.get(_key(intf))
                if discipline is not None:
                    out[_key(intf)] = kernel.stats(intf.node, intf.name, discipline)
        for lan in self.topology.lans:  # the 2002 network's host cards (kernel FIFOs)
            for link in lan.links:
                discipline = self.disciplines.get(_key(link.intf1))
                if discipline is not None and _key(link.intf1) not in out:
                    out[_key(link.intf1)] = kernel.stats(link.intf1.node, link.intf1.name, discipline)
        for key, emu in self.emulators.items():
            router = self.topology.routers[key].name if key in self.topology.routers else key
            try:
                directions = emu.stats().get("directions", {})
            except (OSError, ValueError):
                directions = {}  # not written yet
            out |= _emulated_counters(router, directions)
        return out

    def emulator_snapshots(self, newer_than: float = 0.0, timeout: float = 2.0) -> dict[str, dict]:
        """Every emulator's last statistics snapshot, waiting (at most `timeout` s) until each was
        written after the epoch `newer_than` (so a window's end is counted); {name: snapshot}."""
        deadline = time.monotonic() + timeout
        out: dict[str, dict] = {}
        for name, emu in self.emulators.items():
            while True:
                try:
                    snap = emu.stats()
                except (OSError, ValueError):
                    snap = {}
                if snap.get("written_unix_s", 0) >= newer_than or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            out[name] = snap
        return out

    # -- state ----------------------------------------------------------------------------------

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {
            "tag": self.tag,
            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": self.config.to_dict(),
            "namespaces": sorted(n.namespace for n in self.topology.nodes.values()),
            "disciplines": {k: d.strategy for k, d in self.disciplines.items()},
            "emulators": {s: p.pid for s, p in self.emulators.items()},
            "network": self.config.network,
            "hub_discipline": self.hub_discipline,
            "strategy_at": self.strategy_at,
        }
        tmp = state_path(self.tag).with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_path(self.tag))

    def status(self) -> dict:
        """What is up: expected vs present namespaces, the installed qdiscs, running processes."""
        return status(self.tag, self.topology)


def _stop_stray_emulators(router: Node, timeout: float = 10.0) -> None:
    """Stop emulators an earlier session left in `router` (e.g. a previous `testbed up`):
    they hold the NFQUEUE numbers a new one needs. On SIGTERM an emulator removes its own
    rules; any NFQUEUE rule still in FORWARD afterwards is removed here."""
    stray = netns.pids_running(router.namespace, "qos.emulator")
    if not stray:
        return
    netns.kill_pids(stray)
    deadline = time.monotonic() + timeout
    while netns.pids_running(router.namespace, "qos.emulator") and time.monotonic() < deadline:
        time.sleep(0.05)
    netns.kill_pids(netns.pids_running(router.namespace, "qos.emulator"), signal.SIGKILL)
    for rule in router.cmd("iptables", "-S", "FORWARD").splitlines():
        if "NFQUEUE" in rule and rule.startswith("-A "):
            router.run("iptables", "-D", *rule.split()[1:], check=False)


def _emulated_counters(router: str, directions: dict) -> dict[str, dict]:
    """An emulator's per-class counters, keyed "router:direction"; on a shared medium once for the
    medium ("rA:hub") and once per station ("rA:hub/A1", the master's card; "rA:hub/rA", the
    router's port toward its hosts; "core:core/rA", rA's port toward the shared segment), the
    stations' with sent packets and bytes and drops by reason."""
    out: dict[str, dict] = {}
    for name, d in directions.items():
        medium = d.get("medium")
        key = f"{router}:{medium or name}"
        if key not in out:  # a medium's directions share its counters
            out[key] = {cls: {"bytes": c["sent_bytes"], "packets": c["sent_packets"],
                              "drops": c["dropped_packets"],
                              "backlog": c["enqueued_bytes"] - c["sent_bytes"],
                              "qlen": c["enqueued_packets"] - c["sent_packets"]}
                        for cls, c in d.get("classes", {}).items()}
        if medium:
            for station, by_class in d.get("stations", {}).items():
                out[f"{key}/{station.split('.')[0]}"] = {  # "rA.forward" -> "rA"
                    cls: {"bytes": c.get("sent_bytes", 0), "packets": c.get("sent_packets", 0),
                          "drops": sum(v for k, v in c.items() if not k.startswith("sent_")),
                          "drops_by_reason": {k: v for k, v in c.items() if not k.startswith("sent_")}}
                    for cls, c in by_class.items()}
    return out


def _key(intf: Interface) -> str:
    return f"{intf.node.name}:{intf.name}"


def status(tag: str, topology: PathMaster2002 | None = None) -> dict:
    """The state of testbed `tag` as found on the machine (not just as recorded)."""
    path = state_path(tag)
    recorded = json.loads(path.read_text()) if path.exists() else None
    present = netns.list_namespaces(netns.tag_prefix(tag))
    if topology is None and recorded is not None:
        from qos.testbed.config import from_dict
        topology = PathMaster2002(from_dict(recorded["config"], str(path)))
    expected = sorted(n.namespace for n in topology.nodes.values()) if topology else present
    qdiscs = {}
    if topology is not None:
        for subnet in topology.config.subnets:
            for intf in topology.bottleneck_interfaces(subnet):
                if intf.node.exists():
                    shown = intf.node.run("tc", "qdisc", "show", "dev", intf.name, check=False).stdout
                    qdiscs[_key(intf)] = shown.split()[1] if shown.split() else "none"
    processes = {name: len(netns.pids(name)) for name in present}
    missing = sorted(set(expected) - set(present))
    return {
        "tag": tag,
        "up": bool(present) and not missing,
        "namespaces_present": len(present),
        "namespaces_missing": missing,
        "state_file": str(path) if recorded else None,
        "disciplines": recorded.get("disciplines", {}) if recorded else {},
        "emulators": recorded.get("emulators", {}) if recorded else {},
        "root_qdiscs": qdiscs,
        "processes": {k: v for k, v in processes.items() if v},
    }
