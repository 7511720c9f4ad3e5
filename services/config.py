"""Site and coordinator settings, read from TOML files (see deploy/*.example.toml).

Each file is a pydantic model of its tables (`SiteFile`, `CoordinatorFile`; their JSON
Schema is in docs/config-schema/, printed by `pathmaster config schema`). The settings a
server runs with are `SiteConfig` and `CoordinatorConfig`: a file's [site] or
[coordinator] table together with its [tls] and [classes] tables, also what a program
builds directly (the demo, tests). Every key must be known and of its TOML type.

Relative paths in a file are taken relative to that file's folder. A mistake names the
file and the key: `ConfigError("deploy/site.toml: [site] workrs: unknown key")`.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer,
                      PlainValidator, ValidationError, ValidationInfo, WithJsonSchema, WrapValidator,
                      field_validator, model_validator)

from pathmaster import defaults
from pathmaster.records import ConfigError
from pathmaster.analysis.budget import CellBudget
from qos.admission import CASE_SLOTS, CLASS_SHARE, PER_CLIENT_CASES, URGENT_RESERVED_SLOTS
from qos.channels import RENEW_CONNECTIONS
from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.policy import COPY_GAP_S, MAX_REQUEST_COPIES, SMALL_REQUEST_BYTES, SMALL_REQUEST_COPIES
from qos.transport import TLSFiles, split_address
from services.shared import OTLP_ENDPOINT, QUERY_DEADLINE_S

STATS_WINDOW_CASES = 1000  # completion times the coordinator keeps per class for its statistics
WORKER_RESTART_MIN_S = 0.5       # a dead worker's replacement starts after this, doubling on
WORKER_RESTART_MAX_S = 30.0      #   each failed attempt up to this (reset once one is ready)

MAX_CASE_CELLS = 64                  # cells per case (coordinator, page); more is a batch
MAX_CASE_BYTES = 64 * 1024 * 1024    # one case's images together, at the coordinator
COORDINATOR_ANALYSERS = 2       # Ray actors analysing each case's cells once at the coordinator

# ------------------------------------------------------------------ value types


def _port(value: Any, handler) -> int:
    try:
        return handler(value)
    except ValidationError:
        raise ValueError(f"expected a port number, got {value!r}") from None


Port = Annotated[int, Field(ge=0, le=65535), WrapValidator(_port)]
# Class name -> port of the server that marks replies with that class's DSCP (0: any free port).
ClassPorts = dict[str, Port]


def _address(value: str) -> str:
    split_address(value)  # ValueError naming the address
    return value


Address = Annotated[str, AfterValidator(_address)]  # "HOST:PORT" or "[v6]:PORT"


def _beside_file(value: Path, info: ValidationInfo) -> Path:
    """A relative path read from a file is relative to that file's folder."""
    value = value.expanduser()
    folder = (info.context or {}).get("folder")
    return value if value.is_absolute() or folder is None else folder / value


FilePath = Annotated[Path, Field(strict=False), AfterValidator(_beside_file)]
OptionalPath = Annotated[FilePath | None, BeforeValidator(lambda value: value or None)]  # "": none


def _class_table(value: Any) -> ClassTable:
    if isinstance(value, ClassTable):
        return value
    if not isinstance(value, dict):
        raise ValueError(f"expected [classes.NAME] tables, got {value!r}")
    try:
        return ClassTable(value)
    except (KeyError, ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None


def _class_dicts(table: ClassTable) -> dict[str, dict]:
    return {c.name: {"dscp": c.dscp, "priority": c.priority, "description": c.description} for c in table}


# The request classes in force (qos.classes.ClassTable), written as [classes.NAME] tables.
Classes = Annotated[
    ClassTable,
    PlainValidator(_class_table),
    PlainSerializer(_class_dicts),
    WithJsonSchema({"type": "object", "additionalProperties": {
        "type": "object", "required": ["dscp"],
        "properties": {"dscp": {"type": "integer", "minimum": 0, "maximum": 63},
                       "priority": {"type": "integer"}, "description": {"type": "string"}}}}),
]


class _Table(BaseModel):
    """A TOML table: every key known, every value of its TOML type ("2" is not 2)."""

    model_config = ConfigDict(extra="forbid", strict=True, arbitrary_types_allowed=True,
                              use_attribute_docstrings=True)


# ------------------------------------------------------------------ the tables


class TLSTable(_Table):
    """[tls] / [site_tls]: PEM files for TLS (see qos.transport.TLSFiles)."""

    cert: OptionalPath = None
    """This end's certificate chain."""
    key: OptionalPath = None
    """This end's private key."""
    ca: OptionalPath = None
    """The CA that signed the other end."""
    mutual: bool = False
    """A server demands client certificates from that CA and checks each caller's role in
    them (sites: coordinators; the coordinator: clients and the gateway)."""
    server_name: str = ""
    """Overrides the name checked in the server's certificate."""

    def files(self) -> TLSFiles:
        return TLSFiles(**dict(self))


class TracingTable(_Table):
    """[tracing]: OpenTelemetry traces of each case (services/tracing.py); off unless an
    exporter is named."""

    exporter: Literal["off", "otlp", "jsonl"] = "off"
    """"otlp": spans to an OpenTelemetry collector at `endpoint` (OTLP over gRPC); "jsonl":
    one span per line appended to `file`; "off": none."""
    endpoint: str = OTLP_ENDPOINT
    """The collector's OTLP/gRPC address ("http://HOST:PORT" plain, "https://HOST:PORT" TLS)."""
    file: OptionalPath = None
    """The JSON-lines file of spans, for exporter = "jsonl"."""

    @model_validator(mode="after")
    def _file_for_jsonl(self):
        if self.exporter == "jsonl" and self.file is None:
            raise ConfigError('exporter "jsonl" needs a file to write the spans to', key="file")
        return self


class _ServerTable(_Table):
    """What a site's and the coordinator's tables share: where they serve, per class."""

    listen: Address = "127.0.0.1:0"
    """Control address, HOST:PORT (Info, health, reflection); port 0: any free port."""
    class_ports: ClassPorts | None = None
    """Class -> port of the server that marks replies with that class's DSCP (0: any free
    port; {}: none, replies unmarked). Omitted (and no class_port_base): every class on a
    free port. The server advertises the ports it got in its Info."""
    class_port_base: Port | None = None
    """Instead of class_ports: N, N+1, ... in the class table's order (handy behind a firewall)."""


class _Budgeted(_ServerTable):
    """What one cell's analysis may cost (pathmaster/analysis/budget.py), for servers that analyse."""

    bounded_analysis: bool = True
    """Analyse each cell in a worker process with a CPU budget and a memory limit
    (pathmaster/analysis/budget.py); false analyses in the Ray actor itself, unbounded."""
    cell_cpu_floor_s: float = Field(defaults.CELL_CPU_FLOOR_S, gt=0)
    """CPU seconds any cell may use, whatever its size."""
    cell_cpu_per_megapixel_s: float = Field(defaults.CELL_CPU_PER_MEGAPIXEL_S, ge=0)
    """Further CPU seconds per megapixel of the cell image."""
    cell_wall_factor: float = Field(defaults.CELL_WALL_FACTOR, gt=0)
    """Wall-clock cap of one cell, as a multiple of its CPU budget (work that blocks)."""
    analysis_memory_mb: int = Field(defaults.ANALYSIS_MEMORY_BYTES // 2**20, ge=256)
    """Address space of one analysis worker process, MiB; a cell needing more gets an error."""

    @property
    def cell_budget(self) -> CellBudget | None:
        """What one cell may cost, or None when analysis is unbounded."""
        if not self.bounded_analysis:
            return None
        return CellBudget(floor_s=self.cell_cpu_floor_s, per_megapixel_s=self.cell_cpu_per_megapixel_s,
                          wall_factor=self.cell_wall_factor, memory_bytes=self.analysis_memory_mb * 2**20)


class SiteTable(_Budgeted):
    """[site]: one site server."""

    name: str
    """The site's name in results."""
    db: FilePath
    """Its site database folder (`pathmaster index`)."""
    algorithm: str = ""
    """Comparison algorithm passed to SiteIndex.open: "flat", "ivf" or "hnsw"; "" keeps the database's own."""
    workers: int = Field(1, ge=1)
    """Ray actors, each holding the index once."""
    worker_cpus: float = Field(0.5, gt=0)
    """Ray CPUs reserved per actor (fractions let several sites share a small machine)."""
    ray_address: str = ""
    """"" starts a local Ray; "auto" or "HOST:PORT" joins one."""
    metrics: str = ""
    """HOST:PORT of the site's Prometheus endpoint; "" for none."""
    worker_restart_min_s: float = Field(WORKER_RESTART_MIN_S, gt=0)
    """Seconds before a dead worker's replacement starts; doubled after each failed attempt."""
    worker_restart_max_s: float = Field(WORKER_RESTART_MAX_S, gt=0)
    """The longest wait between attempts to replace a dead worker."""
    ray_resource: str = Field("", pattern=r"^[A-Za-z0-9_-]*$", max_length=64)
    """Ray custom resource that marks the nodes holding this site's database (e.g.
    "site_db_connecticut", offered there by `ray start --resources '{"site_db_connecticut": 1}'`);
    the site's workers and index builds run only on such nodes. "": any node."""
    search_in_server: bool = False
    """Search features-mode requests (vectors the coordinator analysed) in the site server's
    own process, with a copy of the index loaded there (its memory again), instead of on a
    Ray worker: such a search takes about a millisecond, less than handing it to a worker
    and back (12 vs 23 ms median a site call on loopback), but its time relative to its
    median varied more there (std/mean 0.53 vs 0.33). Off (the default: sites search on
    their Ray workers), or with ray_resource set (the database is on other nodes), they go
    to the workers, most favoured class first."""


class SiteEndpoint(_Table):
    """[[sites]]: a site as the coordinator knows it."""

    name: str
    """The site's name (unique)."""
    address: Address
    """Its control address; the class ports come from its Info."""


class CoordinatorTable(_Budgeted):
    """[coordinator]: the client-facing coordinator (clients learn the class ports at `listen`)."""

    metrics: str = ""
    """HOST:PORT of the Prometheus endpoint; "" for none."""
    case_log: OptionalPath = None
    """JSON-lines file of completion records; omitted or "" for none."""
    keep_case_ids: bool = False
    """Write each case's id into the case log as its client sent it (it may be an accession
    number or an MRN: only where the log is guarded as the patient record is). False: its
    HMAC-SHA256 under the deployment's secret (`case_id_key`), the same for one case across
    restarts. Each record says which ("case_ids": "keyed" or "kept")."""
    case_id_key: OptionalPath = None
    """The file of the deployment's secret for case ids in the case log (made on first
    start, mode 0600); omitted: case-id-key beside the Ray token ($PATHMASTER_CACHE, else
    ~/.cache/pathmaster)."""
    max_cells: int = Field(MAX_CASE_CELLS, ge=1)
    """Cells per case; more is RESOURCE_EXHAUSTED."""
    max_case_mb: float = Field(MAX_CASE_BYTES / 2**20, gt=0)
    """MiB per case, all images together; more is RESOURCE_EXHAUSTED."""
    default_deadline_s: float = Field(QUERY_DEADLINE_S, gt=0)
    """Seconds a case may take when the client sets no deadline."""
    stats_window: int = Field(STATS_WINDOW_CASES, ge=1)
    """Completion times kept per class for mean/std/percentiles."""
    analysis_workers: int = Field(COORDINATOR_ANALYSERS, ge=0)
    """Ray actors that analyse each case's cells once here, so that sites of the same
    feature schema get feature vectors instead of images; 0: images to every site."""
    analysis_cpus: float = Field(0.0, ge=0)
    """Ray CPUs reserved per analyser (0: they share the CPUs of the sites' workers)."""
    ray_address: str = ""
    """"" starts (or reuses) a local Ray for the analysers; "auto" or "HOST:PORT" joins one."""
    case_slots: int = Field(CASE_SLOTS, ge=1)
    """Cases in progress at once; more are refused with RESOURCE_EXHAUSTED and a retry-after."""
    urgent_reserved_slots: int = Field(URGENT_RESERVED_SLOTS, ge=0)
    """Of `case_slots`, kept for the most favoured class; an urgent burst beyond them and its
    share of the rest is served as the next class (reclassified, not dropped)."""
    class_share: dict[str, float] = Field(default_factory=lambda: dict(CLASS_SHARE))
    """Class -> the largest fraction (0-1] of the shared slots it may hold at once."""
    per_client_cases: int = Field(PER_CLIENT_CASES, ge=1)
    """Cases one client (certificate name, else address) may have in progress at once."""
    small_request_bytes: int = Field(SMALL_REQUEST_BYTES, ge=0)
    """A features request to a site of at most this many bytes is small: it is sent as
    `small_request_copies` copies at once."""
    small_request_copies: int = Field(SMALL_REQUEST_COPIES, ge=1, le=MAX_REQUEST_COPIES)
    """Copies of a small request sent at once, each over its own connection to the site
    (opened when the site is first reached); the first answer is used, the rest cancelled.
    1: one copy (no hedging by copies)."""
    copy_gap_s: float = Field(COPY_GAP_S, ge=0.0, le=1.0)
    """Seconds between one copy of a small request and the next (copy k leaves k gaps after
    the first), so that they do not meet a full queue together; 0: all at once."""
    renew_connections: bool = RENEW_CONNECTIONS
    """After each case, replace the connections it used to the sites by fresh ones, opened
    then and used once ready: a connection that met losses behind a full queue keeps a
    congestion window of a few segments for ever after, a new one starts at 10
    (qos.transport.ClassChannels). False: the same connections for every case."""

    @model_validator(mode="after")
    def _check_admission(self):
        if self.urgent_reserved_slots >= self.case_slots:
            raise ConfigError(f"must be below case_slots ({self.case_slots}), got {self.urgent_reserved_slots}",
                              key="urgent_reserved_slots")
        for name, share in self.class_share.items():
            if not 0 < share <= 1:
                raise ConfigError(f"expected a fraction in (0, 1], got {share}", key=f"class_share.{name}")
        return self

    @property
    def max_case_bytes(self) -> int:
        return int(self.max_case_mb * 2**20)


# ------------------------------------------------------------------ the settings in force


def free_class_ports(classes: ClassTable) -> dict[str, int]:
    """Every class on a free port (0), which the server picks and then advertises."""
    return {c.name: 0 for c in classes}


class _Served(_ServerTable):
    """A server's [tls] and [classes], and its class ports resolved against those classes."""

    tls: TLSFiles | None = None
    classes: Classes = Field(default_factory=lambda: DEFAULT_CLASSES)
    tracing: TracingTable = Field(default_factory=TracingTable)

    @model_validator(mode="after")
    def _resolve_class_ports(self):
        if self.class_ports is not None and self.class_port_base is not None:
            raise ConfigError("give either class_ports or class_port_base, not both", key="class_port_base")
        names = self.classes.names()
        if self.class_port_base is not None:
            if not 1 <= self.class_port_base <= 65536 - len(names):
                raise ConfigError(f"expected a port 1-{65536 - len(names)}, got {self.class_port_base}",
                                  key="class_port_base")
            self.class_ports = {name: self.class_port_base + i for i, name in enumerate(names)}
        elif self.class_ports is None:
            self.class_ports = free_class_ports(self.classes)
        for class_name in self.class_ports:
            if class_name not in self.classes:
                raise ConfigError(f"unknown class {class_name!r}; known: {', '.join(names)}", key="class_ports")
        return self


class SiteConfig(SiteTable, _Served):
    """One site server: its [site] table, [tls] (this server's certificate) and [classes]."""


class CoordinatorConfig(CoordinatorTable, _Served):
    """The coordinator: its [coordinator] table, [[sites]], [tls] (this server's certificate,
    and the client-certificate check when mutual), [site_tls] (what it presents to sites and
    trusts from them) and [classes]."""

    sites: list[SiteEndpoint]
    site_tls: TLSFiles | None = None

    @field_validator("sites")
    @classmethod
    def _some_distinct_sites(cls, sites: list[SiteEndpoint]) -> list[SiteEndpoint]:
        if not sites:
            raise ValueError("no [[sites]] entries; list each site's name and address")
        names = [site.name for site in sites]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate site names in {names}")
        return sites


# ------------------------------------------------------------------ the files


class SiteFile(_Table):
    """A site's TOML file (deploy/site.example.toml)."""

    site: SiteTable
    tls: TLSTable | None = None
    """This server's certificate; mutual = true demands client certificates."""
    classes: Classes = Field(default_factory=lambda: DEFAULT_CLASSES)
    """[classes.NAME] tables: a class table of your own replaces the default (qos/classes.py) whole."""
    tracing: TracingTable = Field(default_factory=TracingTable)
    """OpenTelemetry traces (off unless an exporter is named)."""

    def config(self) -> SiteConfig:
        return SiteConfig(**dict(self.site), tls=self.tls and self.tls.files(), classes=self.classes,
                          tracing=self.tracing)


class CoordinatorFile(_Table):
    """The coordinator's TOML file (deploy/coordinator.example.toml)."""

    coordinator: CoordinatorTable = CoordinatorTable()
    sites: list[SiteEndpoint] = []
    tls: TLSTable | None = None
    """This server's certificate; mutual = true demands client certificates."""
    site_tls: TLSTable | None = None
    """What the coordinator presents to the sites and which CA it trusts for them."""
    classes: Classes = Field(default_factory=lambda: DEFAULT_CLASSES)
    """[classes.NAME] tables: a class table of your own replaces the default (qos/classes.py)
    whole; list every class, in the sites' files too."""
    tracing: TracingTable = Field(default_factory=TracingTable)
    """OpenTelemetry traces (off unless an exporter is named)."""

    def config(self) -> CoordinatorConfig:
        return CoordinatorConfig(**dict(self.coordinator), sites=self.sites, classes=self.classes, tracing=self.tracing,
                                 tls=self.tls and self.tls.files(), site_tls=self.site_tls and self.site_tls.files())


# ------------------------------------------------------------------ reading TOML

_FILE_TABLES = {"tls", "site_tls", "classes", "sites", "tracing"}  # a settings field that is a table of the file
_ARRAYS = {"sites"}  # arrays of tables: [[sites]]
_TYPES = {"int": "int", "float": "float", "string": "str", "bool": "bool", "dict": "table",
          "model": "table", "list": "array", "path": "str"}


def _error(error: dict, path: Path, table: str | None) -> ConfigError:
    """A pydantic error as a ConfigError naming the file, the table and the key.

    `table`: the file's table whose keys a settings model's top-level fields are (errors
    from `config()`; its other fields are whole tables of the file).
    """
    loc = list(error["loc"])
    if table and not (loc and loc[0] in _FILE_TABLES):
        loc.insert(0, table)
    cause = (error.get("ctx") or {}).get("error")
    kind = error["type"].removesuffix("_type").removesuffix("_parsing")
    if isinstance(cause, ConfigError):
        loc.append(cause.key)
        problem = str(cause).removeprefix(f"{cause.key}: ")
    elif isinstance(cause, Exception):
        problem = str(cause)
    elif error["type"] == "missing":
        problem = "missing (required)"
    elif error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        problem = "unknown table" if len(loc) == 1 else "unknown key"
    elif kind in _TYPES:
        problem = f"expected {_TYPES[kind]}, got {error['input']!r}"
    else:
        problem = f"{error['msg'][:1].lower()}{error['msg'][1:]}, got {error['input']!r}"
    if not loc:
        return ConfigError(problem, path)
    name, *rest = loc
    if name in _ARRAYS:
        key = f"[[{name}]]" + (f" #{rest.pop(0) + 1}" if rest and isinstance(rest[0], int) else "")
    else:
        key = f"[{name}]"
    key += f" {rest.pop(0)}" if rest else ""
    return ConfigError("".join(f"{part}: " for part in rest) + problem, path, key)


def _read(path: str | Path, file_model: type[SiteFile | CoordinatorFile], table: str):
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError("configuration file not found", path) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML ({exc})", path) from None
    try:
        parsed = file_model.model_validate(data, context={"folder": path.parent})
    except ValidationError as exc:
        raise _error(exc.errors()[0], path, None) from None
    try:
        return parsed.config()
    except ValidationError as exc:
        raise _error(exc.errors()[0], path, table) from None


def load_site_config(path: str | Path) -> SiteConfig:
    """Read a site's TOML file: a [site] table, optional [tls] and [classes]."""
    return _read(path, SiteFile, "site")


def load_coordinator_config(path: str | Path) -> CoordinatorConfig:
    """Read a coordinator's TOML file: [coordinator], [[sites]], optional [tls], [site_tls], [classes]."""
    return _read(path, CoordinatorFile, "coordinator")
