"""Testbed configuration: a TOML file shaped like `default.toml`, read into a `TestbedConfig`.

    config = load_config("my.toml")          # None -> the packaged default.toml
    config = config.with_tag("t123")         # a separate, parallel testbed
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import tomllib
from dataclasses import dataclass
from pathlib import Path

from qos.testbed import netns

DEFAULT_CONFIG = Path(__file__).with_name("default.toml")
BACKENDS = ("kernel", "emulator")


class ConfigError(ValueError):
    """A testbed configuration file with a bad or missing setting; the message names file and key."""


@dataclass(frozen=True)
class TestbedConfig:
    """The testbed's settings (see default.toml for what each means)."""

    __test__ = False  # not a pytest test class, despite the name

    tag: str
    address_range: ipaddress.IPv4Network
    subnets: tuple[str, ...]
    hosts_per_subnet: int
    master: str
    bottleneck: dict
    tcp_congestion: str = "reno"
    lan_rate_bps: int = 0
    source: str = "<default>"

    def with_tag(self, tag: str) -> "TestbedConfig":
        return dataclasses.replace(self, tag=netns.check_tag(tag))

    def with_bottleneck(self, **changes) -> "TestbedConfig":
        """A copy with [bottleneck] keys replaced (e.g. ``discipline={"strategy": "priority"}``)."""
        bottleneck = {**copy.deepcopy(self.bottleneck), **changes}
        _check_bottleneck(bottleneck, self.source, "bottleneck")
        return dataclasses.replace(self, bottleneck=bottleneck)

    def link_settings(self, subnet: str) -> dict:
        """[bottleneck] merged with [bottleneck.subnet.<subnet>] for subnet `subnet`'s uplink."""
        merged = {k: v for k, v in self.bottleneck.items() if k != "subnet"}
        merged.update(self.bottleneck.get("subnet", {}).get(subnet, {}))
        return merged

    def to_dict(self) -> dict:
        return {"tag": self.tag, "address_range": str(self.address_range), "subnets": list(self.subnets),
                "hosts_per_subnet": self.hosts_per_subnet, "master": self.master,
                "tcp_congestion": self.tcp_congestion, "lan_rate_bps": self.lan_rate_bps,
                "bottleneck": copy.deepcopy(self.bottleneck)}


BOTTLENECK_KEYS = {"rate_bps", "backend", "overhead_bytes", "discipline", "subnet"}


def _check_bottleneck(b: dict, source: str, where: str) -> None:
    unknown = set(b) - BOTTLENECK_KEYS - ({"subnet"} if where != "bottleneck" else set())
    if unknown or (where != "bottleneck" and "subnet" in b):
        raise ConfigError(f"{source}: [{where}] unknown settings {', '.join(sorted(unknown or {'subnet'}))}; "
                          f"known: {', '.join(sorted(BOTTLENECK_KEYS - {'subnet'}))}")
    if "rate_bps" in b and (not isinstance(b["rate_bps"], (int, float)) or b["rate_bps"] <= 0):
        raise ConfigError(f"{source}: [{where}] rate_bps must be a positive number of bit/s, got {b['rate_bps']!r}")
    if "backend" in b and b["backend"] not in BACKENDS:
        raise ConfigError(f"{source}: [{where}] backend must be one of {', '.join(BACKENDS)}, got {b['backend']!r}")
    if "overhead_bytes" in b and not (isinstance(b["overhead_bytes"], int) and b["overhead_bytes"] >= 14):
        raise ConfigError(f"{source}: [{where}] overhead_bytes must be an integer >= 14 (the Ethernet header)")
    if "discipline" in b and not isinstance(b["discipline"], dict):
        raise ConfigError(f"{source}: [{where}.discipline] must be a table")
    for name, sub in b.get("subnet", {}).items():
        _check_bottleneck(sub, source, f"{where}.subnet.{name}")


def from_dict(data: dict, source: str = "<dict>") -> TestbedConfig:
    """Validate a parsed configuration; missing keys take default.toml's values."""
    base = tomllib.loads(DEFAULT_CONFIG.read_text()) if source != str(DEFAULT_CONFIG) else {}
    merged = {**base, **data}
    merged["bottleneck"] = {**base.get("bottleneck", {}), **data.get("bottleneck", {})}
    unknown = set(merged) - {"tag", "address_range", "subnets", "hosts_per_subnet", "master", "bottleneck",
                                "tcp_congestion", "lan_rate_bps"}
    if unknown:
        raise ConfigError(f"{source}: unknown settings {', '.join(sorted(unknown))}")
    try:
        tag = netns.check_tag(str(merged["tag"]))
    except ValueError as exc:
        raise ConfigError(f"{source}: tag: {exc}") from None
    try:
        network = ipaddress.IPv4Network(merged["address_range"])
    except ValueError as exc:
        raise ConfigError(f"{source}: address_range: {exc}") from None
    if not network.is_private or network.prefixlen > 16:
        raise ConfigError(f"{source}: address_range {network} must be a private /16 or larger")
    subnets = tuple(merged["subnets"])
    if not subnets or len(subnets) > 250 or any(not (isinstance(s, str) and s.isalpha() and s.isupper() and len(s) == 1) for s in subnets):
        raise ConfigError(f"{source}: subnets must be single capital letters, got {list(subnets)}")
    hosts = merged["hosts_per_subnet"]
    if not isinstance(hosts, int) or not 1 <= hosts <= 9:
        raise ConfigError(f"{source}: hosts_per_subnet must be 1-9, got {hosts!r}")
    master = merged["master"]
    if master[:1] not in subnets or not master[1:].isdigit() or not 1 <= int(master[1:]) <= hosts:
        raise ConfigError(f"{source}: master {master!r} is not a host of the topology")
    _check_bottleneck(merged["bottleneck"], source, "bottleneck")
    for name in merged["bottleneck"].get("subnet", {}):
        if name not in subnets:
            raise ConfigError(f"{source}: [bottleneck.subnet.{name}]: no subnet {name!r} in {list(subnets)}")
    congestion = merged.get("tcp_congestion", "reno")
    if not isinstance(congestion, str) or not (congestion == "" or congestion.isalnum()):
        raise ConfigError(f"{source}: tcp_congestion must be an algorithm name or \"\", got {congestion!r}")
    lan_rate = merged.get("lan_rate_bps", 0)
    if not isinstance(lan_rate, int) or lan_rate < 0:
        raise ConfigError(f"{source}: lan_rate_bps must be 0 (unshaped) or a rate in bit/s, got {lan_rate!r}")
    config = TestbedConfig(tag, network, subnets, hosts, master, merged["bottleneck"], congestion,
                           lan_rate, source)
    _check_kernel_disciplines(config)
    return config


def _check_kernel_disciplines(config: TestbedConfig) -> None:
    """Build each kernel-backed uplink's discipline once, so a bad table fails at load, naming the file.
    (Emulator settings are checked by the emulator when it starts.)"""
    from qos.testbed import kernel

    for subnet in config.subnets:
        settings = config.link_settings(subnet)
        if settings.get("backend", "kernel") != "kernel":
            continue
        spec = {"overhead_bytes": settings.get("overhead_bytes", kernel.ETHERNET_HEADER_BYTES),
                **settings.get("discipline", {})}
        try:
            kernel.from_config(spec, settings["rate_bps"])
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"{config.source}: [bottleneck] discipline of subnet {subnet}: "
                              f"{exc.args[0] if exc.args else exc}") from None


def load_config(path: str | Path | None = None) -> TestbedConfig:
    """Read a testbed TOML file (None: the packaged default.toml); raise ConfigError naming the problem."""
    path = Path(path) if path else DEFAULT_CONFIG
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such testbed configuration file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return from_dict(data, str(path))
