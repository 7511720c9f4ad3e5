"""An experiment is a TOML file: strategies x competing traffic x link settings x request
classes x repetitions (flent's idea: the experiment is data, not code).

    [experiment]
    name = "smoke"
    repetitions = 10            # runs per cell of the matrix (default 10)
    seed = 1                    # shuffles the run order; recorded with every run
    request_classes = ["urgent"]

    [workload]                  # one PathMaster case (BRIEF §3)
    cells = 6                   # test cells per case
    image_bytes = 100000        # bytes per cell image; background and mask are the same size
    k = 5                       # matches returned per cell and site
    match_bytes = 5000          # thumbnail bytes per match
    analysis_s = 5.0            # analysis per image at each site, and at the master once when it sends
                                # features, seconds (a wait, no CPU; default 0)
    site_nodes = 2              # the nodes the cells are pipelined over, a site's or the master's (default 2)

    [competing]
    kind = "downloads"          # "downloads" (parallel bulk TCP), "wget" (the study's: processes
                                # fetching a file from the master again and again), "udp"
                                # (constant rate), "pareto"
    levels = [0, 2, 8]          # downloads: parallel streams; wget: processes per target;
                                # udp/pareto: mean rate in kbit/s
    targets = ["B3", "C3"]      # hosts that pull from the master
    file_bytes = 20000000       # wget only: one fetch (default: the study's 20 MB)

    [strategies.fifo]           # one table per strategy, named freely
    discipline = "fifo"         # "fifo" | "prio" | "wfq" | "wred"
    [strategies.shape-200]
    discipline = "wfq"
    shape_kbit = 200            # shapes the competing (bulk) traffic to this rate
    [strategies.adaptive-fifo]  # the product's policy (qos.policy) over FIFO routers
    discipline = "fifo"
    adaptive = {}               # or {ship = "auto", analyse = true, deadlines_s = {urgent = 2.0}}
    rto_min_ms = 20             # optional, any strategy: the coordinator's and sites' minimum TCP
                                # retransmission timeout on their paths to each other (default Linux's 200)

    [[links]]                   # one entry per link setting; the core link is the bottleneck
    name = "10M"
    core_kbit = 10000
    delay_ms = 0.0              # one-way delay added on the core link
    mtu = 1500
    network = "lan"             # "lan" (today's testbed) | "2002" (the study's 10 Mbit/s cards and
                                # hubs, the routers as Cisco IOS: qos/testbed/hubs.py, qos/emulator/ios.py)

    [[findings]]                # optional: claims declared before the run, each a test
    name = "PQ beats FIFO"      # (qos/experiment/findings.py; Holm-adjusted together)
    claim = "less"              # less | alike (with margin = 0.25)
    statistic = "mean"          # mean | median | p95 | std
    a = { strategy = "prio", level = 8 }
    b = { strategy = "fifo", level = 8 }

    [classes.urgent]            # optional: the run's request-class table (qos/classes.py's
    dscp = 40                   # shape), given to the routers, the transfer workload's master
    priority = 0                # and sites, and the deployed coordinator; default: the
                                # default table (urgent AF41, routine AF21, ...)

Rates are kbit/s (`_kbit`) and times have their unit in the key (`_ms`, `_s`), as in every
file of the qos layer. `load_spec(path)` validates all of it (the pydantic model `Experiment`)
and raises `ConfigError` naming the file and key of anything wrong, e.g.
``experiment.toml: [links[0]] queue_pakets: unknown key``.
"""

from __future__ import annotations

import hashlib
import json
from importlib import resources
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, PrivateAttr, WithJsonSchema, field_validator, model_validator

from pathmaster import defaults
from pathmaster.records import InvalidInput
from qos.channels import RENEW_CONNECTIONS
from qos.classes import DEFAULT_CLASSES, ClassEntry, ClassTable
from qos.config import FileModel, Seq, one_of, read_toml, validate
from qos.experiment import fidelity
from qos.experiment.findings import Finding, Sequential
from qos.network import HOST_CARD_RATE_KBIT, ROUTER_QUEUE_PACKETS, SHAPER_BURST_BYTES
from qos.policy import COPY_GAP_S, MAX_CASE_DEADLINE_S, MAX_REQUEST_COPIES, SMALL_REQUEST_COPIES
from qos.testbed.config import STRATEGY_PLACES
from qos.traffic.competing import FETCH_FILE_BYTES

# The study's workload (seed 000, BRIEF §2-3): the original C program analysed one image in ~5 s,
# on each site's two workstations (server X1 and worker X2); the competing wget processes
# fetched 20 MB files from the master in a loop.
STUDY_ANALYSIS_S = 5.0         # analysis time per image at a site, seconds
SITE_NODES = 2                 # a site's analysing nodes (its server and its worker)
EXPERIMENT_REPETITIONS = 10    # runs per cell of an experiment's matrix (the study's 10 runs)
# An adaptive experiment strategy (qos.experiment.spec.Adaptive) plans each case against its
# class's deadline (qos.policy.plan_site): step-down, hedging. Ours, not a source's: an
# intra-operative (urgent) answer within seconds; a class not listed plans against the
# workload's deadline_s.
CLASS_DEADLINES_S = {"urgent": 2.0, "routine": 10.0, "teaching": 60.0, "bulk": 120.0}
# The transfer workload's stand-in for a match's wire thumbnail (WIRE_THUMBNAIL_PX WebP: median
# 286 B, p90 384 B on the real Herlev cells, 236 B on the demo's; benchmarks/bench_wire_reply.py):
# the bytes each match carries back in an adaptive strategy's cases, unless the strategy says
# otherwise (its `thumbnail_bytes`; a strategy may ask 1000, the size before replies fitted one window).
WIRE_THUMBNAIL_BYTES = 300
MAX_WIRE_THUMBNAIL_BYTES = 65536  # the most a strategy may ask a transfer site for
# The end hosts' minimum TCP retransmission timeout (a strategy's `rto_min_ms`):
# Linux's is 200 ms (net.ipv4.tcp_rto_min_us = 200000), so a lost last segment of a tiny
# request waits >= 200 ms plus a round trip. An experiment may lower it on the coordinator's
# and the sites' hosts within these bounds, ms (the kernel accepts 1 us up; it recommends
# <= 200 ms; under ~4 ms a jiffy rounds it).
LINUX_RTO_MIN_MS = 200
RTO_MIN_MS_RANGE = (5, 200)

DISCIPLINES = ("fifo", "prio", "wfq", "cbwfq", "wred", "codel", "class-codel")
NETWORKS = ("lan", "2002")
SHIP_MODES = ("auto", "features", "images")
# On the 2002 network each discipline is the IOS one (qos/emulator/ios.py): wfq is IOS's per-flow
# fair-queue, cbwfq its class-based WFQ, each with IOS's own queue limits.
IOS_STRATEGY = {"fifo": "ios-fifo", "prio": "ios-priority", "wfq": "ios-wfq", "cbwfq": "ios-cbwfq",
                "wred": "ios-wred"}
# CoDel is not IOS's (RFC 8289, 2018): the emulator's own, on either network.
CODEL_STRATEGY = {"codel": "codel", "class-codel": "class_codel"}
COMPETING_KINDS = ("downloads", "wget", "udp", "pareto")
Number = int | float


class Adaptive(FileModel):
    """`[strategies.NAME.adaptive]`: the product's own policy (qos.policy) drives the case over
    the strategy's routers: features when the coordinator can analyse, the class within the
    user's entitlement (step-down), hedging, each planned against its class's deadline."""

    ship: str = Field("auto", json_schema_extra={"enum": list(SHIP_MODES)},
                      description='as `pathmaster query --ship`: "auto" (features where the schema matches), '
                                  '"features" or "images"')
    analyse: bool = Field(True, description="the coordinator can analyse cells (features mode possible); "
                                            "false: a coordinator without analysers, images to every site")
    deadlines_s: dict[str, float] = Field(
        default_factory=lambda: dict(CLASS_DEADLINES_S),
        description="the deadline each request class plans against, seconds; a class not listed plans "
                    "against [workload] deadline_s. Cases are cut off at deadline_s only, so that their "
                    "times compare with the other strategies'; a run records whether it met its deadline")

    small_request_copies: int = Field(SMALL_REQUEST_COPIES, ge=1, le=MAX_REQUEST_COPIES,
                                      description="as the coordinator's: copies of a small features request "
                                                  "sent at once, each over its own connection (1: none)")

    copy_gap_s: float = Field(COPY_GAP_S, ge=0.0, le=1.0,
                              description="as the coordinator's: seconds between one copy of a small request "
                                          "and the next (0: all at once)")

    feature_values: int | None = Field(None, ge=1, le=10_000,
                                       description="a what-if of the transfer workload: values per cell a features "
                                                   "request carries, no columns named (default: as the coordinator "
                                                   "sends: the full vector, or with [workload] forward_selection only "
                                                   "the 24 columns each site advertises)")

    renew_connections: bool = Field(RENEW_CONNECTIONS,
                                    description="as the coordinator's: after each case its connections to the sites "
                                                "are replaced by fresh ones (initial congestion window), opened "
                                                "between cases; false: the same connections for every case")

    thumbnail_bytes: int = Field(WIRE_THUMBNAIL_BYTES, ge=0, le=MAX_WIRE_THUMBNAIL_BYTES,
                                 description="bytes of each match's inline thumbnail in the transfer workload's "
                                             "replies (the real site's 48 px WebP: ~300 B)")

    @field_validator("ship")
    @classmethod
    def _ship(cls, value: str) -> str:
        return one_of(value, SHIP_MODES)

    @field_validator("deadlines_s")
    @classmethod
    def _deadlines(cls, value: dict[str, float]) -> dict[str, float]:
        bad = {k: v for k, v in value.items() if not (0 < v <= MAX_CASE_DEADLINE_S)}
        if bad:
            raise ValueError(f"deadlines must be > 0 and <= {MAX_CASE_DEADLINE_S:g} s, got {bad}")
        return value


SHAPE_PLACES = ("router", "host")  # where a 2002 strategy shapes the bulk class (Strategy.shape_at)


class Strategy(FileModel):
    """A router configuration: a queueing discipline, optionally with the bulk class shaped,
    optionally with the product's adaptive policy on top. In the file: a `[strategies.NAME]`
    table (`name` is the table's name)."""

    name: str
    discipline: str = Field(json_schema_extra={"enum": list(DISCIPLINES)})
    shape_kbit: float | None = Field(None, description="rate limit for the competing (bulk) traffic, "
                                                        "kbit/s; none = unshaped")
    shape_at: str = Field("router", json_schema_extra={"enum": list(SHAPE_PLACES)},
                          description='network = "2002": where the bulk class is shaped: "router" (the study\'s: '
                                      'the master\'s router\'s port toward the shared segment, IOS burst CIR x '
                                      '125 ms) or "host" (the master\'s own card, a 3,028 B bucket)')
    params: dict[str, Any] = Field(default_factory=dict, description="discipline-specific extras, passed through")
    adaptive: Adaptive | None = Field(None, description="the product's policy drives each case (features, "
                                                        "step-down, hedging); none = image mode as sent")
    at: str = Field("routers", json_schema_extra={"enum": list(STRATEGY_PLACES)},
                    description='where the discipline runs: "routers", or "hosts" (every host\'s own outgoing '
                                'queue, the routers IOS FIFO; network = "2002" only)')
    rto_min_ms: int | None = Field(None, ge=RTO_MIN_MS_RANGE[0], le=RTO_MIN_MS_RANGE[1],
                                   description="the minimum TCP retransmission timeout of the end hosts (the "
                                               "coordinator's and the sites'), ms, on their paths to each other; "
                                               f"routers and competing traffic unchanged; none = Linux's "
                                               f"{LINUX_RTO_MIN_MS} ms (Testbed.set_rto_min)")

    @field_validator("at")
    @classmethod
    def _at(cls, value: str) -> str:
        return one_of(value, STRATEGY_PLACES)

    @field_validator("discipline")
    @classmethod
    def _discipline(cls, value: str) -> str:
        return one_of(value, DISCIPLINES)

    @field_validator("shape_at")
    @classmethod
    def _shape_at(cls, value: str) -> str:
        return one_of(value, SHAPE_PLACES)

    @field_validator("shape_kbit")
    @classmethod
    def _shape(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError(f"shape_kbit must be > 0, got {value:g}")
        return value

    def ios_table(self) -> dict:
        """The testbed's discipline table of this strategy on the 2002 network (Cisco IOS's defaults).

        Returns
        -------
        dict
            {"strategy": "ios-..."}; with `shape_kbit`, "ios-shaping": the strategy's WFQ
            (fair-queue, or class-based) with the competing class, bulk, held to that rate
            where `shape_at` says (`Testbed.set_strategy`), as the study's shaping + WFQ.

        Raises
        ------
        ValueError
            Shaping with a discipline other than wfq or cbwfq.
        """
        if self.shape_kbit is not None:
            if self.discipline not in ("wfq", "cbwfq"):
                raise ValueError(f"strategy {self.name!r}: shaping combines with wfq or cbwfq only")
            table = {"strategy": "ios-shaping", "shaped_class": "bulk", "shaped_rate_kbit": self.shape_kbit,
                     "shaped_base": self.discipline, "shaped_at": self.shape_at}
            if self.shape_at == "host":
                table["shaped_burst_bytes"] = SHAPER_BURST_BYTES
            return table
        if self.discipline in CODEL_STRATEGY:
            return {"strategy": CODEL_STRATEGY[self.discipline], **self.params}
        return {"strategy": IOS_STRATEGY[self.discipline], **self.params}


class LinkProfile(FileModel):
    """One setting of the core (bottleneck) link: a `[[links]]` entry."""

    name: str
    core_kbit: float = Field(gt=0, description="the core link's rate, kbit/s")
    delay_ms: float = Field(0.0, ge=0, description="one-way, added on the core link")
    mtu: int = Field(1500, ge=576, le=9000)
    access_kbit: Number | None = Field(None, gt=0, description="refused: host links follow the network "
                                                                "(lan: unshaped; 2002: 10 Mbit/s cards)")
    queue_packets: int = Field(ROUTER_QUEUE_PACKETS, ge=1, description="router queue on the core link "
                                                                              "(lan; 2002: IOS's own limits)")
    network: str = Field("lan", json_schema_extra={"enum": list(NETWORKS)},
                         description='"lan": today\'s testbed; "2002": the study\'s 10 Mbit/s cards on '
                                     "half-duplex hubs, the routers with Cisco IOS's disciplines and defaults")

    @field_validator("network")
    @classmethod
    def _network(cls, value: str) -> str:
        return one_of(value, NETWORKS)

    @model_validator(mode="after")
    def _what_the_network_applies(self) -> "LinkProfile":
        if self.access_kbit is not None:
            # Refused, not ignored: the bound would count a rate the testbed never applies.
            raise ValueError("access_kbit: the testbed does not apply it; the host links follow the network "
                             '(network = "lan": unshaped; "2002": 10 Mbit/s cards on hubs); leave it out')
        if self.network == "2002":
            if "queue_packets" in self.model_fields_set:
                raise ValueError("queue_packets: the 2002 routers use Cisco IOS's own queue limits "
                                 "(qos/emulator/ios.py); leave it out")
            if self.delay_ms:
                raise ValueError("delay_ms: the 2002 network's hubs add no propagation delay; leave it out")
        return self

    @property
    def shared_medium(self) -> bool:
        """Whether upload and reply bytes share one medium (the 2002 network's hubs)."""
        return self.network == "2002"

    @property
    def access_rate_kbit(self) -> float:
        """The hosts' own links, kbit/s: the 2002 cards' 10 Mbit/s, or unlimited (lan's veths)."""
        return float(HOST_CARD_RATE_KBIT) if self.network == "2002" else float("inf")


def pipelined_analysis_s(cells: int, analysis_s: float, nodes: int) -> float:
    """The wall time of analysing `cells` images at one site, seconds: pipelined over its `nodes`
    nodes, each one cell at a time for `analysis_s` seconds (so ceil(cells / nodes) x analysis_s)."""
    if nodes < 1 or analysis_s < 0:
        raise ValueError(f"need nodes >= 1 and analysis_s >= 0, got {nodes} and {analysis_s:g}")
    return -(-cells // nodes) * analysis_s


class Workload(FileModel):
    """`[workload]`: one PathMaster case, what goes to every site, what comes back."""

    cells: int = Field(6, ge=1, description="test cells per case")
    image_bytes: int = Field(100_000, ge=1, description="bytes per cell image; background and mask the same")
    with_background: bool = True
    with_mask: bool = True
    k: int = Field(defaults.K, ge=1, description="matches returned per cell and site")
    match_bytes: int = Field(5000, ge=0, description="thumbnail bytes per returned match")
    mode: str = Field("transfer", json_schema_extra={"enum": ["transfer", "service"]},
                      description='"transfer": sites answer without analysing (workload.py); "service": the '
                                  "product itself (services.experiment.deployment) with synthetic cells")
    workers_on_x2: bool = Field(False, description="service mode: each site's second Ray worker on its X2 host")
    sites: Seq[str] = Field(("A1", "B1", "C1"), description="the server of each subnet")
    deadline_s: float = Field(120.0, gt=0, description="every site call is cut off after this, seconds")
    analysis_s: float = Field(0.0, ge=0, description="transfer mode: analysis time per image at each site "
                                                     "given images, and at the master (the coordinator's, once "
                                                     "per case) when it sends features, seconds (the study's C "
                                                     "program: ~5 s); a wait, no CPU")
    site_nodes: int = Field(SITE_NODES, ge=1, description="transfer mode: the nodes a site's analysis "
                                                                   "is pipelined over, one cell at a time each "
                                                                   "(the master's too: the study's has a site's)")
    forward_selection: bool = Field(False, description="transfer mode: each site advertises a forward-selected "
                                                      "index (at most 24 compared features, as `--features forward`) "
                                                      "and the coordinator sends it only those values; false: the "
                                                      "site compares every feature and gets full vectors, as the "
                                                      "default `auto` index (it chose lda on every database here)")

    @field_validator("mode")
    @classmethod
    def _mode(cls, value: str) -> str:
        return one_of(value, ("transfer", "service"))

    @property
    def analysis_wall_s(self) -> float:
        """A case's analysis at one site, seconds: its cells pipelined over the site's nodes,
        each node one cell at a time (ceil(cells / site_nodes) x analysis_s)."""
        return pipelined_analysis_s(self.cells, self.analysis_s, self.site_nodes)

    @model_validator(mode="after")
    def _analysis_fits(self) -> "Workload":
        if self.mode == "service" and (self.analysis_s or "site_nodes" in self.model_fields_set):
            raise ValueError('analysis_s and site_nodes are for mode = "transfer": in "service" mode the '
                             "product analyses the cells itself; leave them out")
        if self.analysis_wall_s >= self.deadline_s:
            raise ValueError(f"analysis_s: {self.cells} cells over {self.site_nodes} node(s) at "
                             f"{self.analysis_s:g} s each take {self.analysis_wall_s:g} s, not less than "
                             f"deadline_s = {self.deadline_s:g} s; raise deadline_s or lower analysis_s")
        return self


def competing_unit(kind: str) -> str:
    """What a competing level counts for `kind`: "streams" (downloads, per target), "processes"
    (wget, per target) or "kbit/s" (udp, pareto: the mean rate)."""
    return {"downloads": "streams", "wget": "processes"}.get(kind, "kbit/s")


class Competing(FileModel):
    """`[competing]`: competing traffic, what kind and the levels swept."""

    kind: str = Field("downloads", json_schema_extra={"enum": list(COMPETING_KINDS)})
    levels: Seq[Number] = Field((0,), description="downloads: parallel streams; wget: processes per target; "
                                                  "udp/pareto: mean kbit/s")
    targets: Seq[str] = ("B3", "C3")
    params: dict[str, Any] = Field(default_factory=dict, description="e.g. pareto alpha, dscp")
    file_bytes: int | None = Field(None, ge=1, description='kind = "wget": bytes of the file each process '
                                                            "fetches again and again (default: the study's 20 MB)")

    @field_validator("kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        return one_of(value, COMPETING_KINDS)

    @model_validator(mode="after")
    def _per_kind(self) -> "Competing":
        if self.file_bytes is not None and self.kind != "wget":
            raise ValueError(f'file_bytes is for kind = "wget" (fetches of a file), not {self.kind!r}; leave it out')
        if self.kind in ("downloads", "wget") and any(v != int(v) for v in self.levels):
            raise ValueError(f"levels: {self.kind} counts {self.unit} per target, whole numbers; "
                             f"got {list(self.levels)!r}")
        return self

    @property
    def fetch_bytes(self) -> int:
        """kind = "wget": the bytes of one fetch."""
        return self.file_bytes or FETCH_FILE_BYTES

    @field_validator("levels")
    @classmethod
    def _levels(cls, levels: tuple) -> tuple:
        if not levels or any(v < 0 for v in levels):
            raise ValueError(f"levels must be a non-empty list of numbers >= 0, got {list(levels)!r}")
        if len(set(levels)) != len(levels):
            raise ValueError(f"levels repeat a value: {list(levels)!r}")
        return levels

    @property
    def unit(self) -> str:
        return competing_unit(self.kind)


ORDERS = ("shuffled", "blocked", "rounds")


class Head(FileModel):
    """`[experiment]`: what the experiment is and how its runs are ordered."""

    name: str
    description: str = ""
    repetitions: int = Field(EXPERIMENT_REPETITIONS, ge=1, description="runs per cell of the matrix")
    seed: int = Field(0, description="shuffles the run order; recorded with every run")
    request_classes: Seq[str] = ("urgent",)
    settle_s: float = Field(1.0, ge=0, le=600, description="competing traffic runs at least this long before a case "
                                                            "is submitted")
    settle_fraction: float = Field(0.6, ge=0, le=1,
                                   description="TCP competing traffic (downloads, wget): after settle_s a case also "
                                               "waits until the targets received, over the last second, this "
                                               "share of the rate the path allows it (the link's, or the "
                                               "strategy's shaped rate); 0: settle_s only")
    settle_limit_s: float = Field(20.0, gt=0, le=600,
                                  description="the longest wait for settle_fraction; a run whose traffic never "
                                              "got there is invalid (reason 'unsettled') and run again")
    order: str = Field("shuffled", json_schema_extra={"enum": list(ORDERS)},
                       description="blocked: by competing level; rounds: one block per level in every "
                                   "repetition round, levels and strategies shuffled anew each round "
                                   "(see matrix.expand)")

    @field_validator("request_classes")
    @classmethod
    def _classes(cls, classes: tuple[str, ...]) -> tuple[str, ...]:
        if not classes:
            raise ValueError("request_classes is empty")
        return classes  # checked against the file's [classes] table by Experiment

    @field_validator("order")
    @classmethod
    def _order(cls, value: str) -> str:
        if value not in ORDERS:
            raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {value!r}")
        return value


def _named(tables: Any) -> Any:
    """`[strategies.NAME]` tables -> Strategy entries carrying their NAME."""
    if not isinstance(tables, dict):
        return tables
    return [{**table, "name": name} if isinstance(table, dict) and "name" not in table else table
            for name, table in tables.items()]


def _inline_refs(schema: Any, defs: dict) -> Any:
    """`schema` with every "$ref" to one of `defs` replaced by its definition (the strategy
    table's schema is embedded in the experiment's, where its own $defs do not exist)."""
    if isinstance(schema, dict):
        ref = schema.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inline_refs(defs[ref.rsplit("/", 1)[1]], defs)
        return {k: _inline_refs(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline_refs(v, defs) for v in schema]
    return schema


_STRATEGY_SCHEMA = Strategy.model_json_schema()
_STRATEGY_TABLE = {k: _inline_refs(v, _STRATEGY_SCHEMA.get("$defs", {}))
                   for k, v in _STRATEGY_SCHEMA.items() if k not in ("required", "$defs")}
_STRATEGY_TABLE["properties"] = {k: v for k, v in _STRATEGY_TABLE["properties"].items() if k != "name"}
_STRATEGY_TABLE["required"] = ["discipline"]
Strategies = Annotated[Seq[Strategy], BeforeValidator(_named),
                       WithJsonSchema({"type": "object", "minProperties": 1, "additionalProperties": _STRATEGY_TABLE,
                                       "description": "one [strategies.NAME] table per strategy"})]


class FidelityTable(FileModel):
    """`[fidelity]`: this experiment's own bounds for a valid run (qos/experiment/fidelity.py's
    FidelityBound; each key defaults to its default there)."""

    p99_lateness_s: float = Field(fidelity.P99_BOUND_S, gt=0, le=1.0,
                                  description="the emulators' 99th-percentile release lateness over a case, s")
    max_lateness_s: float = Field(fidelity.DEFAULT_BOUND.max_lateness_s, gt=0, le=10.0,
                                  description="the emulators' worst release lateness over a case, s")
    nfqueue_drops: int = Field(0, ge=0, le=1_000_000, description="packets the kernel's NFQUEUE dropped")
    runnable_median: float | None = Field(None, gt=0, le=1000,
                                          description="the median of the machine's runnable tasks during a case "
                                                      "(none: recorded, not judged)")
    steal_median: float | None = Field(None, ge=0, le=1,
                                       description="the median share of CPU time the hypervisor took during a case "
                                                   "(none: recorded, not judged)")

    def bound(self) -> fidelity.FidelityBound:
        return fidelity.FidelityBound(**self.model_dump())


class Experiment(FileModel):
    """A whole experiment file, validated (its tables as in the module docstring)."""

    experiment: Head
    workload: Workload = Field(default_factory=Workload)
    competing: Competing = Field(default_factory=Competing)
    strategies: Strategies = Field(min_length=1)
    links: Seq[LinkProfile] = Field(min_length=1, description="one [[links]] entry per link setting")
    findings: Seq[Finding] = Field((), description="[[findings]]: claims declared before the run, each a "
                                                    "test (qos/experiment/findings.py), Holm-adjusted together")
    fidelity_table: FidelityTable | None = Field(None, alias="fidelity",
                                                 description="[fidelity]: this experiment's bounds for a valid run "
                                                             "(default: qos/experiment/fidelity.py's)")
    sequential: Sequential | None = Field(None, description="[sequential]: the findings tested at declared looks "
                                                             "as the runs accrue (qos/experiment/findings.py)")
    classes_table: dict[str, ClassEntry] | None = Field(
        None, alias="classes", min_length=1,
        description="the run's request classes ([classes.NAME] tables); default: the default table")

    _source: str = PrivateAttr("")

    @model_validator(mode="after")
    def _unique_links(self) -> "Experiment":
        if len({item.name for item in self.links}) != len(self.links):
            raise ValueError("[[links]] names must be unique")
        for strategy in self.strategies:
            unknown = sorted(set(strategy.adaptive.deadlines_s) - set(self.classes.names())) if strategy.adaptive else []
            if unknown:
                raise ValueError(f"[strategies.{strategy.name}.adaptive] deadlines_s: unknown request class(es) "
                                 f"{', '.join(map(repr, unknown))}; known: {', '.join(self.classes.names())}")
        if len({item.network for item in self.links}) > 1:
            raise ValueError("[[links]]: one network per experiment (the testbed is built once)")
        for i, finding in enumerate(self.findings):
            for side in finding.cells():
                where = f"[[findings]] {finding.name!r}"
                if side.strategy not in {s.name for s in self.strategies}:
                    raise ValueError(f"{where}: no strategy {side.strategy!r}")
                if side.level not in self.competing.levels:
                    raise ValueError(f"{where}: level {side.level:g} is not one of the competing levels")
                if side.link is not None and side.link not in {item.name for item in self.links}:
                    raise ValueError(f"{where}: no link {side.link!r}")
                if side.request_class is not None and side.request_class not in self.request_classes:
                    raise ValueError(f"{where}: {side.request_class!r} is not one of the request classes")
        if self.sequential is not None:
            if not self.findings:
                raise ValueError("[sequential] needs [[findings]] to test at its looks")
            if self.sequential.looks[-1] != self.repetitions:
                raise ValueError(f"[sequential] looks end at {self.sequential.looks[-1]} runs per cell; "
                                 f"[experiment] repetitions is {self.repetitions}: make them the same")
            if self.order != "rounds":
                raise ValueError('[sequential] needs order = "rounds" (every cell at the same n whenever runs stop)')
        hosts = [s.name for s in self.strategies if s.at == "hosts"]
        if self.links[0].network == "lan" and hosts:
            raise ValueError(f"strategies {', '.join(hosts)}: at = \"hosts\" needs network = \"2002\" (on \"lan\" "
                             "the hosts' links are unshaped veths: no queue forms there)")
        if self.links[0].network == "lan" and any(s.discipline == "cbwfq" for s in self.strategies):
            raise ValueError('cbwfq runs on network = "2002" (IOS class-based WFQ); on "lan", wfq is '
                             "class-based already")
        for name in self.request_classes:
            if name not in self.classes:
                raise ValueError(f"[experiment] request_classes: unknown request class {name!r}; "
                                 f"known: {', '.join(self.classes.names())}")
        return self

    @property
    def classes(self) -> ClassTable:
        """The run's one request-class table: the file's [classes], or the default table."""
        if self.classes_table is None:
            return DEFAULT_CLASSES
        return ClassTable({name: entry.model_dump() for name, entry in self.classes_table.items()})

    # The [experiment] table's values, as the experiment's own.
    name = property(lambda self: self.experiment.name)
    description = property(lambda self: self.experiment.description)
    repetitions = property(lambda self: self.experiment.repetitions)
    seed = property(lambda self: self.experiment.seed)
    request_classes = property(lambda self: self.experiment.request_classes)
    settle_s = property(lambda self: self.experiment.settle_s)
    settle_fraction = property(lambda self: self.experiment.settle_fraction)
    settle_limit_s = property(lambda self: self.experiment.settle_limit_s)
    order = property(lambda self: self.experiment.order)

    @property
    def fidelity_bound(self) -> fidelity.FidelityBound:
        """The bound a run must keep to: the file's [fidelity], or fidelity.DEFAULT_BOUND."""
        return self.fidelity_table.bound() if self.fidelity_table else fidelity.DEFAULT_BOUND

    @property
    def source(self) -> str:
        """The file it came from."""
        return self._source

    def to_dict(self) -> dict:
        """A JSON-ready form, recorded in every run's metadata (flat: the [experiment] keys at the top)."""
        data = self.experiment.model_dump()
        # (the study's workload keys only when used, so that older experiments keep their fingerprint)
        workload = self.workload.model_dump(exclude=set() if self.workload.analysis_s else {"analysis_s", "site_nodes"})
        competing = self.competing.model_dump(exclude=set() if self.competing.kind == "wget" else {"file_bytes"})
        data.update(workload=workload, competing=competing,
                    # (rto_min_ms only when set: older experiments keep their fingerprint)
                    strategies=[s.model_dump(exclude=set() if s.rto_min_ms else {"rto_min_ms"})
                                for s in self.strategies],
                    links=[item.model_dump(exclude={"network"} if item.network == "lan" else set())
                           for item in self.links],  # (lan: as before, so older runs still resume)
                    classes=self.classes.to_table())
        if self.findings:  # (only when declared: older experiments keep their fingerprint)
            data["findings"] = [f.model_dump() for f in self.findings]
        if self.fidelity_table:
            data["fidelity"] = self.fidelity_table.model_dump()
        if self.sequential:
            data["sequential"] = self.sequential.model_dump(by_alias=True)
        return data

    def fingerprint(self) -> str:
        """A short hash of the configuration: a resumed run must match it."""
        text = json.dumps(self.to_dict(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def strategy(self, name: str) -> Strategy:
        return next(s for s in self.strategies if s.name == name)

    def link(self, name: str) -> LinkProfile:
        return next(item for item in self.links if item.name == name)


def builtin_names() -> list[str]:
    """The experiments shipped in qos/experiment/builtin/."""
    folder = resources.files("qos.experiment") / "builtin"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".toml"))


def resolve(file_or_name: str | Path) -> Path:
    """A path to an experiment file, or the name of a built-in one."""
    path = Path(file_or_name)
    if path.is_file():
        return path
    if str(file_or_name) in builtin_names():
        return Path(str(resources.files("qos.experiment") / "builtin" / f"{file_or_name}.toml"))
    raise InvalidInput(
        f"no such experiment file, and not a built-in experiment (built-in: {', '.join(builtin_names())})",
        file_or_name,
    )


def load_spec(file_or_name: str | Path) -> Experiment:
    """Read and validate an experiment file (or built-in name); raises `ConfigError` (an
    `InvalidInput`) naming the file and key of any problem."""
    path = resolve(file_or_name)
    return parse_spec(read_toml(path, "experiment"), source=str(path))


def parse_spec(data: dict, source: str = "<experiment>") -> Experiment:
    """Validate an already-parsed TOML document; see the module docstring for the format."""
    names = list(data.get("strategies", {})) if isinstance(data.get("strategies"), dict) else []

    def by_name(loc: tuple) -> tuple:  # ("strategies", 0, ...) -> ("strategies", "fifo", ...)
        if len(loc) > 1 and loc[0] == "strategies" and isinstance(loc[1], int) and loc[1] < len(names):
            return ("strategies", names[loc[1]], *loc[2:])
        return loc

    experiment = validate(Experiment, data, source, rename=by_name)
    experiment._source = str(source)
    return experiment
