"""Site and coordinator settings, read from TOML files (see deploy/*.example.toml).

Relative paths in a file are taken relative to that file's folder. A mistake names the
file and the key: `ConfigError("deploy/site.toml: [site] workers: expected an integer")`.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from pathmaster.budget import CellBudget
from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.transport import TLSFiles, split_address

DEFAULT_K = 5    # matches per test cell when the request says 0
MAX_K = 100      # more matches per cell than this is refused


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and key."""


@dataclass
class SiteConfig:
    """One site server.

    name: the site's name in results. db: its site database folder (`pathmaster index`).
    listen: control address (Info, health, reflection). class_ports: class -> port of the
    server that marks replies with that class's DSCP (0: any free port; the site
    advertises the ports it got; see `read_class_ports`). algorithm: the site's
    comparison algorithm, passed to `SiteIndex.open` ("" keeps the database's own). workers: Ray actors, each holding the
    index once. worker_cpus: Ray CPUs reserved per actor (fractions let several sites share
    a small machine). ray_address: "" starts a local Ray; "auto" or "HOST:PORT" joins one.
    """

    name: str
    db: Path
    listen: str = "127.0.0.1:0"
    class_ports: dict[str, int] = field(default_factory=lambda: free_class_ports(DEFAULT_CLASSES))
    algorithm: str = ""
    workers: int = 1
    worker_cpus: float = 0.5
    ray_address: str = ""
    tls: TLSFiles | None = None
    classes: ClassTable = DEFAULT_CLASSES
    # What one cell may cost (pathmaster/budget.py; issue 10 item 5); None analyses in the
    # Ray actor's own process, unbounded (benchmarks' "before").
    cell_budget: CellBudget | None = CellBudget()


@dataclass
class SiteEndpoint:
    """A site as the coordinator knows it: its name and control address."""

    name: str
    address: str


@dataclass
class CoordinatorConfig:
    """The coordinator.

    listen: client-facing control address (Info, stats, sites, images; a client learns the
    class ports there). class_ports: class -> port of the server that marks the replies to
    clients with that class's DSCP, as a site's (0: any free port; advertised by the
    coordinator's Info, on the same host as `listen`). sites: where the sites are.
    metrics: "HOST:PORT" of the Prometheus endpoint ("" for none). case_log: JSON-lines file of completion records
    (None for none). max_cells / max_case_bytes: per-case limits (RESOURCE_EXHAUSTED
    beyond). default_deadline_s: used when the client sets no deadline. tls: this server's
    certificate (and client-certificate check when mutual). site_tls: what the coordinator
    presents to sites and trusts from them.
    """

    sites: list[SiteEndpoint]
    listen: str = "127.0.0.1:0"
    class_ports: dict[str, int] = field(default_factory=lambda: free_class_ports(DEFAULT_CLASSES))
    metrics: str = ""
    case_log: Path | None = None
    max_cells: int = 64
    max_case_bytes: int = 64 * 1024 * 1024
    default_deadline_s: float = 60.0
    tls: TLSFiles | None = None
    site_tls: TLSFiles | None = None
    classes: ClassTable = DEFAULT_CLASSES
    stats_window: int = 1000  # completion times kept per class for mean/std/percentiles


# ------------------------------------------------------------------ reading TOML


class _Section:
    """Typed access to one TOML table with errors naming file, section and key."""

    def __init__(self, path: Path, name: str, data: dict):
        self.path, self.name, self.data = path, name, data

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: [{self.name}] {key}: {problem}")

    def get(self, key: str, kind: type, default=None, required: bool = False):
        if key not in self.data:
            if required:
                raise self.fail(key, "missing (required)")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.fail(key, f"expected {kind.__name__}, got {value!r}")
        return value

    def path_value(self, key: str, required: bool = False) -> Path | None:
        value = self.get(key, str, required=required)
        if not value:
            return None
        p = Path(value).expanduser()
        return p if p.is_absolute() else (self.path.parent / p)

    def address(self, key: str, default: str) -> str:
        value = self.get(key, str, default)
        try:
            split_address(value)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None
        return value


def _read(path: str | Path) -> tuple[Path, dict]:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return path, tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def _tls(path: Path, data: dict, name: str = "tls") -> TLSFiles | None:
    if name not in data:
        return None
    s = _Section(path, name, data[name])
    return TLSFiles(
        cert=s.path_value("cert"),
        key=s.path_value("key"),
        ca=s.path_value("ca"),
        mutual=s.get("mutual", bool, False),
        server_name=s.get("server_name", str, ""),
    )


def _classes(path: Path, data: dict) -> ClassTable:
    if "classes" in data:  # inline [classes.NAME] tables
        try:
            return ClassTable(data["classes"])
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError(f"{path}: [classes]: {exc}") from None
    return DEFAULT_CLASSES


def free_class_ports(classes: ClassTable) -> dict[str, int]:
    """Every class on a free port (0), which the server picks and then advertises."""
    return {c.name: 0 for c in classes}


def read_class_ports(s: _Section, classes: ClassTable) -> dict[str, int]:
    """The per-class reply-marking ports of a [site] or [coordinator] table.

    Either `class_ports = { urgent = 50061, ... }` (0: any free port; `{}`: none, replies
    unmarked), or `class_port_base = N` for N, N+1, ... in the class table's order (handy
    behind a firewall). Neither: every class on a free port, which the server advertises.
    """
    if "class_ports" in s.data and "class_port_base" in s.data:
        raise s.fail("class_port_base", "give either class_ports or class_port_base, not both")
    names = classes.names()
    base = s.get("class_port_base", int)
    if base is not None:
        if not 1 <= base <= 65536 - len(names):
            raise s.fail("class_port_base", f"expected a port 1-{65536 - len(names)}, got {base}")
        return {name: base + i for i, name in enumerate(names)}
    ports = s.get("class_ports", dict, free_class_ports(classes))
    for class_name, port in ports.items():
        if class_name not in classes:
            raise s.fail("class_ports", f"unknown class {class_name!r}; known: {', '.join(names)}")
        if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
            raise s.fail("class_ports", f"{class_name}: expected a port number, got {port!r}")
    return dict(ports)


def load_site_config(path: str | Path) -> SiteConfig:
    """Read a site's TOML file: a [site] table, optional [tls] and [classes]."""
    path, data = _read(path)
    if "site" not in data:
        raise ConfigError(f"{path}: no [site] table")
    s = _Section(path, "site", data["site"])
    classes = _classes(path, data)
    ports = read_class_ports(s, classes)
    workers = s.get("workers", int, 1)
    if workers < 1:
        raise s.fail("workers", f"must be at least 1, got {workers}")
    return SiteConfig(
        name=s.get("name", str, required=True),
        db=s.path_value("db", required=True),
        listen=s.address("listen", "127.0.0.1:0"),
        class_ports=ports,
        algorithm=s.get("algorithm", str, ""),
        workers=workers,
        worker_cpus=s.get("worker_cpus", float, 0.5),
        ray_address=s.get("ray_address", str, ""),
        tls=_tls(path, data),
        classes=classes,
    )


def load_coordinator_config(path: str | Path) -> CoordinatorConfig:
    """Read a coordinator's TOML file: [coordinator], [[sites]], optional [tls], [site_tls], [classes]."""
    path, data = _read(path)
    s = _Section(path, "coordinator", data.get("coordinator", {}))
    sites = []
    for i, entry in enumerate(data.get("sites", [])):
        e = _Section(path, f"sites #{i + 1}", entry)
        sites.append(SiteEndpoint(e.get("name", str, required=True), e.address("address", "")))
    if not sites:
        raise ConfigError(f"{path}: no [[sites]] entries; list each site's name and address")
    names = [site.name for site in sites]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: [[sites]]: duplicate site names in {names}")
    max_mb = s.get("max_case_mb", float, 64.0)
    classes = _classes(path, data)
    return CoordinatorConfig(
        sites=sites,
        listen=s.address("listen", "127.0.0.1:0"),
        class_ports=read_class_ports(s, classes),
        metrics=s.get("metrics", str, ""),
        case_log=s.path_value("case_log"),
        max_cells=s.get("max_cells", int, 64),
        max_case_bytes=int(max_mb * 1024 * 1024),
        default_deadline_s=s.get("default_deadline_s", float, 60.0),
        tls=_tls(path, data),
        site_tls=_tls(path, data, "site_tls"),
        classes=classes,
    )
