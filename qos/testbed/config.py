"""Testbed configuration: a TOML file shaped like `default.toml`, read into a `TestbedConfig`.

    config = load_config("my.toml")          # None -> the packaged default.toml
    config = config.with_tag("t123")         # a separate, parallel testbed

Keys a file leaves out take the model's defaults (which default.toml spells out). Rates
are kbit/s (`rate_kbit`, `lan_rate_kbit`, the discipline's `shaped_rate_kbit`); the old
`rate_bps` spellings are refused with the new one.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, PrivateAttr, field_validator, model_validator

from pathmaster.records import ConfigError
from qos import netns
from qos.cisco import HOLD_QUEUE_PACKETS
from qos.config import FileModel, Seq, old_rate, read_toml, validate
from qos.network import BOTTLENECK_RATE_KBIT
from qos.testbed.kernel import ETHERNET_HEADER_BYTES

DEFAULT_CONFIG = Path(__file__).with_name("default.toml")
BACKENDS = ("kernel", "emulator")
STRATEGY_PLACES = ("routers", "hosts")  # where the 2002 network's strategy runs (Testbed.set_strategy)
NETWORKS = ("lan", "2002")  # today's (unshaped LANs, full-duplex core) | the study's hubs (qos/testbed/hubs.py)

Rate = Annotated[int | float, Field(gt=0)]
_DEFAULT_DISCIPLINE = {"strategy": "fifo", "limit_packets": HOLD_QUEUE_PACKETS}


def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


Backend = Annotated[str, AfterValidator(_check_backend), Field(json_schema_extra={"enum": list(BACKENDS)})]


class BottleneckOverride(FileModel):
    """`[bottleneck.subnet.X]`: any [bottleneck] key, for subnet X's uplink only."""

    rate_kbit: Rate | None = Field(None, description="kbit/s")
    backend: Backend | None = None
    overhead_bytes: int | None = Field(None, ge=ETHERNET_HEADER_BYTES)
    discipline: dict[str, Any] | None = None
    rate_bps: old_rate()


class Bottleneck(FileModel):
    """`[bottleneck]`: every router-core link, each direction (see default.toml)."""

    rate_kbit: Rate = Field(BOTTLENECK_RATE_KBIT, description="the shared segment, kbit/s")
    backend: Backend = Field("kernel", description="kernel (htb/pfifo) or emulator (qos.emulator, user space)")
    overhead_bytes: int = Field(ETHERNET_HEADER_BYTES, ge=ETHERNET_HEADER_BYTES,
                                description="per packet beyond the IP packet; 14 = Ethernet header")
    discipline: dict[str, Any] = Field(default_factory=lambda: dict(_DEFAULT_DISCIPLINE),
                                       description="kernel: see qos/testbed/kernel.py (fifo | priority "
                                                   "| shares | shaping); emulator: its link keys too")
    subnet: dict[str, BottleneckOverride] = Field(default_factory=dict)
    rate_bps: old_rate()


class TestbedConfig(FileModel):
    """The testbed's settings (see default.toml for what each means)."""

    __test__ = False  # not a pytest test class, despite the name

    tag: str = Field("main", description="namespaces are pm-<tag>-<node>; 1-12 of a-z, 0-9")
    address_range: Annotated[ipaddress.IPv4Network, Field(strict=False)] = Field(
        ipaddress.IPv4Network("10.42.0.0/16"), description="a private /16 or larger")
    subnets: Seq[str] = ("A", "B", "C")
    hosts_per_subnet: int = Field(3, description="1-9")
    master: str = "A1"
    network: str = Field("lan", json_schema_extra={"enum": list(NETWORKS)},
                         description='"lan": veth LANs, the router-core links are the bottleneck; "2002": the '
                                     "study's 10 Mbit/s cards on half-duplex hubs (the discipline runs on the "
                                     "routers' hub ports, user space)")
    tcp_congestion: str = Field("reno", description='every node\'s TCP congestion control; "" keeps the machine\'s')
    lan_rate_kbit: int | float = Field(0, ge=0, description="every host's LAN link, kbit/s; 0 = unshaped")
    bottleneck: Bottleneck = Field(default_factory=Bottleneck)
    lan_rate_bps: old_rate("lan_rate_kbit")

    _source: str = PrivateAttr("<default>")

    @property
    def source(self) -> str:
        """The file this configuration came from."""
        return self._source

    @field_validator("tag")
    @classmethod
    def _tag(cls, tag: str) -> str:
        return netns.check_tag(tag)

    @field_validator("address_range")
    @classmethod
    def _range(cls, network: ipaddress.IPv4Network) -> ipaddress.IPv4Network:
        if not network.is_private or network.prefixlen > 16:
            raise ValueError(f"{network} must be a private /16 or larger")
        return network

    @field_validator("subnets")
    @classmethod
    def _subnets(cls, subnets: tuple[str, ...]) -> tuple[str, ...]:
        if not subnets or len(subnets) > 250 or any(not (s.isalpha() and s.isupper() and len(s) == 1)
                                                    for s in subnets):
            raise ValueError(f"subnets must be single capital letters, got {list(subnets)}")
        return subnets

    @field_validator("hosts_per_subnet")
    @classmethod
    def _hosts(cls, hosts: int) -> int:
        if not 1 <= hosts <= 9:
            raise ValueError(f"hosts_per_subnet must be 1-9, got {hosts!r}")
        return hosts

    @field_validator("network")
    @classmethod
    def _network(cls, network: str) -> str:
        if network not in NETWORKS:
            raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {network!r}")
        return network

    @field_validator("tcp_congestion")
    @classmethod
    def _congestion(cls, name: str) -> str:
        if not (name == "" or name.isalnum()):
            raise ValueError(f'tcp_congestion must be an algorithm name or "", got {name!r}')
        return name

    @model_validator(mode="after")
    def _topology(self) -> "TestbedConfig":
        master = self.master
        if master[:1] not in self.subnets or not master[1:].isdigit() \
                or not 1 <= int(master[1:]) <= self.hosts_per_subnet:
            raise ValueError(f"master {master!r} is not a host of the topology")
        for name in self.bottleneck.subnet:
            if name not in self.subnets:
                raise ValueError(f"[bottleneck.subnet.{name}]: no subnet {name!r} in {list(self.subnets)}")
        if self.network == "2002":
            if self.lan_rate_kbit:
                raise ValueError("lan_rate_kbit: the 2002 network's host links are its 10 Mbit/s cards on hubs; "
                                 'leave lan_rate_kbit out (it applies to network = "lan")')
            if self.bottleneck.subnet:
                raise ValueError("[bottleneck.subnet]: the 2002 network runs one strategy on every router's hub "
                                 "ports; per-subnet overrides apply to network = \"lan\"")
        return self

    def with_network(self, network: str) -> "TestbedConfig":
        """A copy on another network profile ("lan" or "2002")."""
        return self._remade(network=network)

    def with_tag(self, tag: str) -> "TestbedConfig":
        return self._remade(tag=netns.check_tag(tag))

    def with_bottleneck(self, **changes) -> "TestbedConfig":
        """A copy with [bottleneck] keys replaced (e.g. ``discipline={"strategy": "priority"}``)."""
        return self._remade(bottleneck={**self.bottleneck.model_dump(exclude_unset=True), **changes})

    def _remade(self, **changes) -> "TestbedConfig":
        return from_dict({**self.model_dump(exclude_unset=True, mode="json"), **changes}, self.source)

    def link_settings(self, subnet: str) -> dict:
        """[bottleneck] merged with [bottleneck.subnet.<subnet>] for subnet `subnet`'s uplink:
        {rate_kbit, backend, overhead_bytes, discipline}."""
        merged = self.bottleneck.model_dump(exclude={"subnet"})
        if subnet in self.bottleneck.subnet:
            merged.update(self.bottleneck.subnet[subnet].model_dump(exclude_none=True))
        return merged

    def to_dict(self) -> dict:
        """The whole configuration, JSON-ready, in the file's form (`from_dict` reads it back)."""
        return self.model_dump(mode="json")


def check_uplinks(config: TestbedConfig) -> None:
    """Build each uplink's discipline once (kernel) or check its emulator settings, so a bad
    [bottleneck] discipline table fails at load, naming the file and the table."""
    from qos.testbed import kernel

    if config.network == "2002":
        _check_hub_discipline(config)
        return
    for subnet in config.subnets:
        settings = config.link_settings(subnet)
        where = f"[bottleneck.subnet.{subnet}]" if subnet in config.bottleneck.subnet else "[bottleneck]"
        spec = {"overhead_bytes": settings["overhead_bytes"], **settings["discipline"]}
        try:
            if settings["backend"] == "kernel":
                kernel.from_config(spec, settings["rate_kbit"] * 1000)
            else:
                from qos.emulator.config import config_from_dict
                from qos.emulator.launch import interface_config

                config_from_dict(interface_config(["uplink"], {"rate_kbit": settings["rate_kbit"], **spec}))
        except (KeyError, ValueError) as exc:
            problem = exc.problem if isinstance(exc, ConfigError) else (exc.args[0] if exc.args else str(exc))
            raise ConfigError(f"discipline of subnet {subnet}: {problem}", config.source,
                              where) from None


def _check_hub_discipline(config: TestbedConfig) -> None:
    """The 2002 network's strategy runs in the emulator on the routers' hub ports: check it there."""
    from qos.emulator.config import config_from_dict
    from qos.testbed import hubs

    b = config.bottleneck
    try:
        config_from_dict(hubs.core_hub({"r": "eth"}, hubs.station_settings(b.discipline, b.rate_kbit, b.overhead_bytes)))
    except (KeyError, ValueError) as exc:
        problem = exc.problem if isinstance(exc, ConfigError) else (exc.args[0] if exc.args else str(exc))
        raise ConfigError(f"discipline on the 2002 network: {problem}", config.source, "[bottleneck]") from None


def from_dict(data: dict, source: str = "<dict>") -> TestbedConfig:
    """Validate a parsed configuration; missing keys take the defaults (default.toml's values)."""
    config = validate(TestbedConfig, data, source)
    config._source = str(source)
    check_uplinks(config)
    return config


def load_config(path: str | Path | None = None) -> TestbedConfig:
    """Read a testbed TOML file (None: the packaged default.toml); raise ConfigError naming the problem."""
    path = Path(path) if path else DEFAULT_CONFIG
    return from_dict(read_toml(path, "testbed configuration"), str(path))
