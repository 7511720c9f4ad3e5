"""The emulator's configuration: a TOML file describing each link and direction.

    seed = 1                       # randomness of loss, jitter and WRED (omit: random)
    # classes = "classes.toml"     # a request-class table (qos.classes format); default: the product's
    sample_interval_s = 0.1        # statistics' time series step

    [link.wan]                     # keys here apply to both directions...
    rate_kbit = 10000              # kbit/s
    delay_ms = 20                  # one way, ms
    jitter_ms = 0
    loss = 0.0                     # probability 0-1
    overhead_bytes = 14            # bytes per packet on top of the IP length
    discipline = "fifo"            # fifo | priority | wfq | fq | flow_wfq | wred | codel | class_codel
    limit_packets = 100            # the FIFO, WRED's buffer, FQ's cap, WFQ per class,
                                   # every priority band (default there: Cisco's 20/40/60/80)

    [link.wan.priority]            # discipline = "priority"
    bands = { urgent = "high", bulk = "low" }   # default: from the classes' priority order
    default = "normal"
    [link.wan.wfq]                 # discipline = "wfq"
    weights = { urgent = 5, bulk = 1 }
    [link.wan.flow_wfq]            # discipline = "flow_wfq": IOS `fair-queue`, per flow
    congestive_discard = 64        # packets one conversation may hold (IOS default)
    dynamic_queues = 256
    hold_limit = 1000              # packets in the whole system
    [link.wan.wred]                # discipline = "wred"
    defaults = "cisco"             # cisco (DSCP-based) | cisco-precedence (IOS's interface
                                   # default) | seed003 (AF11/12/13 from seed 003 over Cisco's)
    weight_exponent = 9
    dscp = { AF11 = [50, 70, 40] } # DSCP name or number -> [min, max, mark denominator]
    [link.wan.codel]               # discipline = "codel" (RFC 8289); default limit 1000 packets
    target_ms = 5                  # acceptable standing queue delay
    interval_ms = 100              # the window a queue must stay above target in to be "bad"
    [link.wan.class_codel]         # discipline = "class_codel": each class its own CoDel queue,
    weights = { urgent = 5, bulk = 1 }  # served by weight as wfq; target_ms, interval_ms too
    [link.wan.shape.bulk]          # token-bucket shaping of a class, with any discipline
    rate_kbit = 1000
    burst_bytes = 3028

    [link.wan.forward]             # ...and each direction says where its packets come from
    queue = 10                     # NFQUEUE number
    in = "r1-eth0"                 # iptables -i
    out = "r1-eth1"                # iptables -o
    [link.wan.reverse]             # may override any key above, e.g. discipline = "wfq"
    queue = 11
    in = "r1-eth1"
    out = "r1-eth0"

    # A shared medium (a hub): directions naming the same `medium` share one transmitter at
    # their (equal) rate_kbit, each keeping its own queue and discipline as a station; the
    # stations take turns one packet each (qos.emulator.disciplines.medium).
    # [link.hub.forward]  medium = "hubA"  ...   [link.hub.reverse]  medium = "hubA"  ...

Units are in the key names, as in every file of the qos layer (rates kbit/s, times ms);
the former spellings (`rate = "10mbit"`, `delay = "20ms"`, `overhead`, `limit`, `burst`)
are refused with the new one. `load_config(path)` checks everything up front and raises
`ConfigError` naming the file, the link/direction and the key; `Direction.build()` makes
the `EmulatedLink`.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from pathmaster.records import ConfigError
from qos.cisco import (CONGESTIVE_DISCARD_PACKETS, WFQ_DYNAMIC_QUEUES, WFQ_HOLD_QUEUE_PACKETS,
                       WRED_WEIGHT_EXPONENT)
from qos.classes import DEFAULT_CLASSES, DSCP_NAMES, ClassTable, load_classes
from qos.config import FileModel, Seq, key_path, old_rate, old_time, read_toml, renamed, validate
from qos.emulator.classify import dscp_classifier
from qos.emulator.disciplines import (BANDS, CISCO_DSCP_DEFAULTS, CISCO_PRECEDENCE_DEFAULTS, SEED003_AF1,
                                      ClassCodel, ClassWfq, Codel, Fifo, FlowFq, FlowWfq, Priority, SharedMedium,
                                      TokenBucketShaper, Wred, WredProfile)
from qos.emulator.disciplines.base import Discipline
from qos.emulator.disciplines.codel import CODEL_INTERVAL_MS, CODEL_LIMIT_PACKETS, CODEL_TARGET_MS
from qos.emulator.disciplines.wred import CISCO_DEFAULT_PROFILE
from qos.emulator.link import EmulatedLink
from qos.emulator.stats import LinkStats
from qos.network import ROUTER_QUEUE_PACKETS, SHAPER_BURST_BYTES

DISCIPLINES = ("fifo", "priority", "wfq", "fq", "flow_wfq", "wred", "codel", "class_codel")
WRED_DEFAULTS = ("cisco", "cisco-precedence", "seed003")
DIRECTIONS = ("forward", "reverse")
_DISCIPLINE_TABLES = ("priority", "wfq", "wred", "fq", "flow_wfq", "codel", "class_codel")

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_DSCP_BY_NAME = {name.lower(): value for value, name in DSCP_NAMES.items()}


def parse_rate(value, where: str = "rate") -> float:
    """'10mbit' / '500kbit' / 1e7 -> bits per second (float > 0)."""
    return _parse_unit(value, _RATE_UNITS, where, "a rate such as '10mbit'")


def parse_time(value, where: str = "time") -> float:
    """'20ms' / '1s' / '250us' / 0.02 -> seconds (float >= 0)."""
    return _parse_unit(value, _TIME_UNITS, where, "a time such as '20ms'", allow_zero=True)


def _parse_unit(value, units: dict, where: str, example: str, allow_zero: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"expected {example}, got {value!r}", None, where)
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]+)\s*", str(value).lower())
        if not m or m.group(2) not in units:
            raise ConfigError(f"expected {example} (units {', '.join(units)}), got {value!r}", None, where)
        number = float(m.group(1)) * units[m.group(2)]
    if number < 0 or (number == 0 and not allow_zero):
        raise ConfigError(f"must be {'>= 0' if allow_zero else '> 0'}, got {value!r}", None, where)
    return number


def parse_dscp(value, where: str) -> int:
    """A DSCP as a number 0-63 or a name ('AF11', 'ef', 'le')."""
    if isinstance(value, str) and value.lower() in _DSCP_BY_NAME:
        return _DSCP_BY_NAME[value.lower()]
    try:
        dscp = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{value!r} is neither a DSCP number nor a known name", None, where) from None
    if not 0 <= dscp <= 63:
        raise ConfigError(f"DSCP {dscp} is outside 0-63", None, where)
    return dscp


def _check(test, message: str):
    def check(value):
        if not test(value):
            raise ValueError(message.format(value=value))
        return value
    return AfterValidator(check)


PositiveInt = Annotated[int, _check(lambda v: v >= 1, "expected a positive integer, got {value!r}")]
PositiveNumber = Annotated[int | float, _check(lambda v: v > 0, "expected a positive number, got {value!r}")]
Millis = Annotated[int | float, _check(lambda v: v >= 0, "expected milliseconds >= 0, got {value!r}")]
Band = Annotated[str, _check(lambda v: v in BANDS, "unknown priority band {value!r}; bands are "
                             + ", ".join(BANDS)), Field(json_schema_extra={"enum": list(BANDS)})]
DisciplineName = Annotated[str, _check(lambda v: v in DISCIPLINES, "{value!r} is not one of " + ", ".join(DISCIPLINES)),
                           Field(json_schema_extra={"enum": list(DISCIPLINES)})]


class PriorityTable(FileModel):
    """`[link.NAME.priority]`: Cisco priority queuing's four bands."""

    bands: dict[str, Band] | None = Field(None, description="class -> band; default: the classes' order")
    default: Band = Field("normal", description="the band of unclassified packets")
    limits: dict[Band, PositiveInt] | None = Field(None, description="band -> packets; default 20/40/60/80")


class WfqTable(FileModel):
    """`[link.NAME.wfq]`: class-based weighted fair queuing."""

    weights: dict[str, PositiveNumber] | None = Field(None, description="class -> weight; default: all 1")


class WredTable(FileModel):
    """`[link.NAME.wred]`: weighted random early detection by DSCP."""

    weight_exponent: int = Field(WRED_WEIGHT_EXPONENT, description="0-16")
    defaults: str = Field("cisco", json_schema_extra={"enum": list(WRED_DEFAULTS)})  # (shadows the module below)
    dscp: dict[str, Seq[int | float]] = Field(default_factory=dict,
                                              description="DSCP name or number -> [min, max, mark denominator]")
    default_profile: Seq[int | float] | None = None

    @field_validator("defaults")
    @classmethod
    def _defaults(cls, base: str) -> str:
        if base not in WRED_DEFAULTS:
            raise ValueError(f"expected one of {', '.join(WRED_DEFAULTS)}, got {base!r}")
        return base

    @field_validator("weight_exponent")
    @classmethod
    def _exponent(cls, n: int) -> int:
        if not 0 <= n <= 16:
            raise ValueError(f"expected an integer 0-16, got {n!r}")
        return n


class FlowWfqTable(FileModel):
    """`[link.NAME.flow_wfq]`: Cisco IOS per-flow WFQ (`fair-queue`), IOS's defaults."""

    congestive_discard: PositiveInt = Field(CONGESTIVE_DISCARD_PACKETS,
                                            description="packets one conversation may hold")
    dynamic_queues: PositiveInt = Field(WFQ_DYNAMIC_QUEUES, description="conversation queues")
    hold_limit: PositiveInt = Field(WFQ_HOLD_QUEUE_PACKETS, description="packets in the whole system")


class CodelTable(FileModel):
    """`[link.NAME.codel]`: CoDel (RFC 8289) on one FIFO; its published constants by default."""

    target_ms: PositiveNumber = Field(CODEL_TARGET_MS, description="acceptable standing queue delay, ms")
    interval_ms: PositiveNumber = Field(CODEL_INTERVAL_MS,
                                        description="how long the delay must stay above target before a drop, ms")

    @model_validator(mode="after")
    def _target_below_interval(self):
        if self.target_ms >= self.interval_ms:
            raise ValueError(f"target_ms ({self.target_ms:g}) must be below interval_ms ({self.interval_ms:g})")
        return self


class ClassCodelTable(CodelTable):
    """`[link.NAME.class_codel]`: a CoDel queue per class, served by weight (as wfq)."""

    weights: dict[str, PositiveNumber] | None = Field(None, description="class -> weight; default: all 1")


class FqTable(FileModel):
    """`[link.NAME.fq]`: flow fair queuing (no settings of its own)."""


class ShapeTable(FileModel):
    """`[link.NAME.shape.CLASS]`: a token bucket in front of the scheduler."""

    rate_kbit: PositiveNumber = Field(description="kbit/s")
    burst_bytes: PositiveInt = SHAPER_BURST_BYTES
    limit_packets: PositiveInt = CONGESTIVE_DISCARD_PACKETS
    rate: old_rate()
    burst: renamed("burst_bytes")
    limit: renamed("limit_packets")


class LinkSettings(FileModel):
    """The keys that describe how a link treats packets (a link's table, or one direction's)."""

    rate_kbit: PositiveNumber | None = Field(None, description="kbit/s (required, on the link or each direction)")
    delay_ms: Millis = Field(0, description="one way")
    jitter_ms: Millis = Field(0, description="at most delay_ms")
    loss: int | float = Field(0.0, description="probability 0-1")
    overhead_bytes: Annotated[int, _check(lambda v: v >= 0, "expected bytes >= 0, got {value!r}")] = 0
    discipline: DisciplineName = "fifo"
    limit_packets: PositiveInt = Field(ROUTER_QUEUE_PACKETS,
                                       description="the FIFO, WRED's buffer, FQ's cap, WFQ per class, each band")
    priority: PriorityTable | None = None
    wfq: WfqTable | None = None
    wred: WredTable | None = None
    fq: FqTable | None = None
    flow_wfq: FlowWfqTable | None = None
    codel: CodelTable | None = None
    class_codel: ClassCodelTable | None = None
    shape: dict[str, ShapeTable] = Field(default_factory=dict)
    rate: old_rate()
    delay: old_time("delay_ms")
    jitter: old_time("jitter_ms")
    overhead: renamed("overhead_bytes")
    limit: renamed("limit_packets")

    @field_validator("loss")
    @classmethod
    def _loss(cls, loss: float) -> float:
        if not 0 <= loss < 1:
            raise ValueError(f"expected a probability in [0, 1), got {loss!r}")
        return loss


class DirectionTable(LinkSettings):
    """`[link.NAME.forward]` / `.reverse`: where the packets come from, and any key of the link."""

    queue: int = Field(description="NFQUEUE number, 0-65535")
    in_: str | None = Field(None, alias="in", description="iptables -i")
    out: str | None = Field(None, description="iptables -o")
    match: Seq[str] = Field((), description="more iptables arguments")
    chain: str = Field("FORWARD", json_schema_extra={"enum": ["FORWARD", "OUTPUT", "INPUT"]})
    medium: str | None = Field(None, description="directions naming the same medium share one transmitter "
                                                 "(a hub), each its own queue")

    @field_validator("queue")
    @classmethod
    def _queue(cls, queue: int) -> int:
        if not 0 <= queue <= 65535:
            raise ValueError(f"expected an integer 0-65535, got {queue!r}")
        return queue

    @field_validator("chain")
    @classmethod
    def _chain(cls, chain: str) -> str:
        if chain not in ("FORWARD", "OUTPUT", "INPUT"):
            raise ValueError(f"{chain!r} is not an iptables filter chain")
        return chain

    @model_validator(mode="after")
    def _says_which_packets(self) -> "DirectionTable":
        if not (self.in_ or self.out or self.match):
            raise ValueError("says nothing about which packets to take; give 'in', 'out' or 'match' "
                             "(iptables arguments)")
        return self


class LinkTable(LinkSettings):
    """`[link.NAME]`: keys for both directions, and the directions."""

    forward: DirectionTable | None = None
    reverse: DirectionTable | None = None

    @model_validator(mode="after")
    def _has_a_direction(self) -> "LinkTable":
        if self.forward is None and self.reverse is None:
            raise ValueError("needs a forward and/or reverse table")
        return self


class EmulatorConfig(FileModel):
    """An emulator file: its links, each with one or two directions (see the module docstring)."""

    seed: int | None = Field(None, description="randomness of loss, jitter and WRED; omit: random")
    classes: str | None = Field(None, description="a request-class table file, relative to this one")
    sample_interval_s: PositiveNumber = Field(0.1, description="statistics' time series step, s")
    link: dict[str, LinkTable] = Field(min_length=1)
    sample_interval: renamed("sample_interval_s", scale=1.0)

    _path: Path = PrivateAttr(Path("<dict>"))
    _directions: list["Direction"] = PrivateAttr(default_factory=list)

    @model_validator(mode="after")
    def _queues_differ(self) -> "EmulatorConfig":
        queues = [d.queue for link in self.link.values() for d in (link.forward, link.reverse) if d]
        if len(set(queues)) != len(queues):
            raise ValueError(f"NFQUEUE numbers must differ between directions, got {queues}")
        return self

    @property
    def path(self) -> Path:
        return self._path

    @property
    def directions(self) -> list["Direction"]:
        return self._directions


@dataclass
class Direction:
    """One direction of one link: where its packets come from and how the link treats them."""

    link: str
    direction: str
    queue: int
    match: list[str]
    settings: dict
    classes: ClassTable = field(default=DEFAULT_CLASSES, repr=False)
    chain: str = "FORWARD"
    source: str = "<dict>"
    medium: str | None = None

    @property
    def name(self) -> str:
        return f"{self.link}.{self.direction}"

    def build(self, rng: random.Random, stats: LinkStats | None = None) -> EmulatedLink:
        """Make the `EmulatedLink` this direction describes (checked already by `load_config`)."""
        return _build_link(self, rng, stats)


def load_config(path: str | Path) -> EmulatorConfig:
    """Read and check an emulator TOML file (or the same structure as .json, as `launch` writes)."""
    return config_from_dict(read_toml(path, "emulator configuration"), path)


def config_from_dict(data: dict, path: str | Path = "<dict>") -> EmulatorConfig:
    """The same as `load_config` for an already parsed dictionary (used by the testbed)."""
    config = validate(EmulatorConfig, data, path)
    config._path = Path(path)
    classes = DEFAULT_CLASSES
    if config.classes is not None:
        try:
            classes = load_classes(Path(path).parent / config.classes)
        except ConfigError as e:
            raise ConfigError(f"{config.classes!r}: {e}", path, "classes") from None
    for link_name, link in data["link"].items():
        shared = {k: v for k, v in link.items() if k not in DIRECTIONS}
        for direction in DIRECTIONS:
            if direction not in link:
                continue
            own = link[direction]
            checked = getattr(config.link[link_name], direction)
            inherited = shared
            if "discipline" in own:  # a direction with its own discipline drops the link's tables for others
                inherited = {k: v for k, v in shared.items()
                             if k not in _DISCIPLINE_TABLES or k == own["discipline"]}
            settings = _merge(inherited, {k: v for k, v in own.items() if k in LinkSettings.model_fields})
            match = (["-i", checked.in_] if checked.in_ else []) + (["-o", checked.out] if checked.out else [])
            d = Direction(link_name, direction, checked.queue, match + list(checked.match), settings,
                              classes, checked.chain, str(path), checked.medium)
            _build_link(d, random.Random(0))  # check now, fail early
            config._directions.append(d)
    build_links(config._directions, 0)  # media: their directions must agree on the rate
    return config


def build_links(directions: list[Direction], seed: int, stats=None) -> list[EmulatedLink]:
    """The `EmulatedLink` of each direction; directions naming the same medium share one.

    Parameters
    ----------
    directions : list of Direction
        As `load_config` checked them.
    seed : int
        Direction i's randomness is ``random.Random(seed + i)`` (a medium's: its first direction's).
    stats : callable, optional
        Makes each link's `LinkStats` (default: the link's own).

    Returns
    -------
    list of EmulatedLink
        In the order of `directions`; the same object for directions on one medium, its
        scheduler a `SharedMedium` whose stations are the directions' names.

    Raises
    ------
    ConfigError
        Directions on one medium with different rates.
    """
    links: list[EmulatedLink] = []
    media: dict[str, EmulatedLink] = {}
    for i, d in enumerate(directions):
        link = _build_link(d, random.Random(seed + i), stats() if stats else None)
        if d.medium is None:
            links.append(link)
            continue
        shared = media.get(d.medium)
        if shared is None:
            shared = media[d.medium] = link
            link.name = d.medium
            link.scheduler = SharedMedium({d.name: link.scheduler})
            link.shapers = {(d.name, klass): shaper for klass, shaper in link.shapers.items()}
        elif shared.rate_bps != link.rate_bps:
            raise ConfigError(f"medium {d.medium!r} runs at {shared.rate_bps / 1000:g} kbit/s; one medium has "
                              f"one rate", d.source, key_path(("link", d.link, d.direction, "rate_kbit")))
        else:
            shared.scheduler.add_station(d.name, link.scheduler)
            for klass, shaper in link.shapers.items():  # a station shapes its own packets only
                shared.shapers[(d.name, klass)] = shaper
        links.append(shared)
    return links


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _build_link(d: Direction, rng: random.Random, stats: LinkStats | None = None) -> EmulatedLink:
    where = ("link", d.link, d.direction)
    s = validate(LinkSettings, d.settings, d.source, where)

    def fail(problem: str, *key) -> ConfigError:
        return ConfigError(problem, d.source, key_path(where + key))

    if s.rate_kbit is None:
        raise fail("missing (required, on the link or the direction)", "rate_kbit")
    rate = s.rate_kbit * 1000.0  # bit/s from here on
    if s.jitter_ms > s.delay_ms:
        raise fail(f"{s.jitter_ms:g} is larger than the delay ({s.delay_ms:g} ms)", "jitter_ms")
    for other in _DISCIPLINE_TABLES:
        if getattr(s, other) is not None and other != s.discipline:
            raise fail(f"a [{other}] table but discipline = {s.discipline!r}", other)
    scheduler = _build_discipline(s, rate, d.classes, rng, fail)
    shapers = {}
    for klass, shape in s.shape.items():
        if klass not in d.classes and klass != "default":
            raise fail(f"unknown class {klass!r}; classes are {', '.join(d.classes.names())}, default",
                       "shape", klass)
        try:
            shapers[klass] = TokenBucketShaper(shape.rate_kbit * 1000.0, shape.burst_bytes, shape.limit_packets,
                                               s.overhead_bytes)
        except ValueError as e:
            raise fail(str(e), "shape", klass) from None
    try:
        return EmulatedLink(rate, scheduler, dscp_classifier(d.classes), delay=s.delay_ms / 1000,
                            jitter=s.jitter_ms / 1000, loss=float(s.loss), overhead=s.overhead_bytes,
                            shapers=shapers, rng=rng, stats=stats, name=d.name)
    except ValueError as e:
        raise fail(str(e)) from None


def _build_discipline(s: LinkSettings, rate: float, classes: ClassTable, rng: random.Random, fail) -> Discipline:
    kind, limit = s.discipline, s.limit_packets

    def check_class(klass, *key):
        if klass not in classes and klass != "default":
            raise fail(f"unknown class {klass!r}; classes are {', '.join(classes.names())}, default", *key)

    if kind == "fifo":
        return Fifo(limit)
    if kind == "fq":
        return FlowFq(limit)
    if kind == "flow_wfq":
        opts = s.flow_wfq or FlowWfqTable()
        return FlowWfq(opts.congestive_discard, opts.dynamic_queues, opts.hold_limit)
    if kind == "priority":
        opts = s.priority or PriorityTable()
        bands = opts.bands
        if bands is None:  # the class table's order: most favoured class -> high
            bands = {c.name: BANDS[min(i, len(BANDS) - 1)] for i, c in enumerate(classes)}
        for klass in bands:
            check_class(klass, "priority", "bands")
        limits = opts.limits
        if limits is None and "limit_packets" in s.model_fields_set:  # one explicit buffer for every band
            limits = {band: limit for band in BANDS}
        try:
            return Priority(bands, opts.default, limits)
        except ValueError as e:
            raise fail(str(e), "priority") from None
    if kind == "wfq":
        weights = (s.wfq.weights if s.wfq else None) or {c.name: 1.0 for c in classes}
        for klass in weights:
            check_class(klass, "wfq", "weights")
        return ClassWfq({k: float(v) for k, v in weights.items()}, limit)
    if kind in ("codel", "class_codel"):
        if "limit_packets" not in s.model_fields_set:
            limit = CODEL_LIMIT_PACKETS  # Linux codel's; the table's common default is a FIFO's
        if kind == "codel":
            opts = s.codel or CodelTable()
            return Codel(limit, opts.target_ms, opts.interval_ms)
        opts = s.class_codel or ClassCodelTable()
        weights = opts.weights or {c.name: 1.0 for c in classes}
        for klass in weights:
            check_class(klass, "class_codel", "weights")
        return ClassCodel({k: float(v) for k, v in weights.items()}, limit, opts.target_ms, opts.interval_ms)
    opts = s.wred or WredTable()  # wred
    profiles = dict(CISCO_PRECEDENCE_DEFAULTS if opts.defaults == "cisco-precedence" else CISCO_DSCP_DEFAULTS)
    if opts.defaults == "seed003":
        profiles.update(SEED003_AF1)
    default_profile = CISCO_DEFAULT_PROFILE
    try:
        for key, values in opts.dscp.items():
            profiles[parse_dscp(key, "dscp")] = WredProfile(*values)
        if opts.default_profile is not None:
            default_profile = WredProfile(*opts.default_profile)
    except ConfigError as e:
        raise fail(e.problem, "wred", "dscp") from None
    except (TypeError, ValueError) as e:
        raise fail(f"a profile is [min, max, mark denominator]: {e}", "wred") from None
    return Wred(profiles, default_profile, limit, opts.weight_exponent, packet_time=1500 * 8 / rate, rng=rng)
