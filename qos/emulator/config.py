"""The emulator's configuration: a TOML file describing each link and direction.

    seed = 1                       # randomness of loss, jitter and WRED (omit: random)
    # classes = "classes.toml"     # a request-class table (qos.classes format); default: the product's

    [link.wan]                     # keys here apply to both directions...
    rate = "10mbit"                # bit, kbit, mbit, gbit (SI, as tc) or a number in bit/s
    delay = "20ms"                 # s, ms, us or a number in seconds
    jitter = "0ms"
    loss = 0.0                     # probability 0-1
    overhead = 14                  # bytes per packet on top of the IP length
    discipline = "fifo"            # fifo | priority | wfq | fq | wred
    limit = 100                    # packets: the FIFO, WRED's buffer, FQ's cap, WFQ per class,
                                   # every priority band (default there: Cisco's 20/40/60/80)

    [link.wan.priority]            # discipline = "priority"
    bands = { urgent = "high", bulk = "low" }   # default: from the classes' priority order
    default = "normal"
    [link.wan.wfq]                 # discipline = "wfq"
    weights = { urgent = 3, bulk = 1 }
    [link.wan.wred]                # discipline = "wred"
    defaults = "cisco"             # cisco | seed003 (AF11/12/13 from seed 003 over Cisco's)
    weight_exponent = 9
    dscp = { AF11 = [50, 70, 40] } # DSCP name or number -> [min, max, mark denominator]
    [link.wan.shape.bulk]          # token-bucket shaping of a class, with any discipline
    rate = "1mbit"
    burst = 3000                   # bytes

    [link.wan.forward]             # ...and each direction says where its packets come from
    queue = 10                     # NFQUEUE number
    in = "r1-eth0"                 # iptables -i
    out = "r1-eth1"                # iptables -o
    [link.wan.reverse]             # may override any key above, e.g. discipline = "wfq"
    queue = 11
    in = "r1-eth1"
    out = "r1-eth0"

`load_config(path)` checks everything up front and raises `ConfigError` naming the file,
the link/direction and the key; `Direction.build()` makes the `EmulatedLink`.
"""

from __future__ import annotations

import json
import random
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from qos.classes import DEFAULT_CLASSES, DSCP_NAMES, ClassTable, load_classes
from qos.emulator.classify import dscp_classifier
from qos.emulator.disciplines import (BANDS, CISCO_DSCP_DEFAULTS, SEED003_AF1, ClassWfq, Fifo, FlowFq,
                                      Priority, TokenBucketShaper, Wred, WredProfile)
from qos.emulator.disciplines.base import Discipline
from qos.emulator.disciplines.wred import CISCO_DEFAULT_PROFILE, CISCO_WEIGHT_EXPONENT
from qos.emulator.link import EmulatedLink
from qos.emulator.stats import LinkStats

DISCIPLINES = ("fifo", "priority", "wfq", "fq", "wred")
DIRECTIONS = ("forward", "reverse")
_DISCIPLINE_TABLES = ("priority", "wfq", "wred", "fq")
_LINK_KEYS = {"rate", "delay", "jitter", "loss", "overhead", "discipline", "limit",
              "priority", "wfq", "wred", "shape", "fq"}
_DIRECTION_KEYS = _LINK_KEYS | {"queue", "in", "out", "match", "chain"}

_RATE_UNITS = {"bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_DSCP_BY_NAME = {name.lower(): value for value, name in DSCP_NAMES.items()}


class ConfigError(ValueError):
    """A configuration file that cannot be used; the message names the file and the key."""


def parse_rate(value, where: str = "rate") -> float:
    """'10mbit' / '500kbit' / 1e7 -> bits per second (float > 0)."""
    return _parse_unit(value, _RATE_UNITS, where, "a rate such as '10mbit'")


def parse_time(value, where: str = "time") -> float:
    """'20ms' / '1s' / '250us' / 0.02 -> seconds (float >= 0)."""
    return _parse_unit(value, _TIME_UNITS, where, "a time such as '20ms'", allow_zero=True)


def _parse_unit(value, units: dict, where: str, example: str, allow_zero: bool = False) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{where}: expected {example}, got {value!r}")
    if isinstance(value, (int, float)):
        number = float(value)
    else:
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*([a-z]+)\s*", str(value).lower())
        if not m or m.group(2) not in units:
            raise ConfigError(f"{where}: expected {example} (units {', '.join(units)}), got {value!r}")
        number = float(m.group(1)) * units[m.group(2)]
    if number < 0 or (number == 0 and not allow_zero):
        raise ConfigError(f"{where}: must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return number


def parse_dscp(value, where: str) -> int:
    """A DSCP as a number 0-63 or a name ('AF11', 'ef', 'le')."""
    if isinstance(value, str) and value.lower() in _DSCP_BY_NAME:
        return _DSCP_BY_NAME[value.lower()]
    try:
        dscp = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: {value!r} is neither a DSCP number nor a known name") from None
    if not 0 <= dscp <= 63:
        raise ConfigError(f"{where}: DSCP {dscp} is outside 0-63")
    return dscp


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

    @property
    def name(self) -> str:
        return f"{self.link}.{self.direction}"

    def build(self, rng: random.Random, stats: LinkStats | None = None) -> EmulatedLink:
        """Make the `EmulatedLink` this direction describes (checked already by `load_config`)."""
        return _build_link(self.name, self.settings, self.classes, rng, stats)


@dataclass
class EmulatorConfig:
    path: Path
    directions: list[Direction]
    seed: int | None
    sample_interval: float = 0.1


def load_config(path: str | Path) -> EmulatorConfig:
    """Read and check an emulator TOML file (or the same structure as .json, as `launch` writes)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = json.load(f) if path.suffix == ".json" else tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not valid {'JSON' if path.suffix == '.json' else 'TOML'}: {e}") from None
    try:
        return _from_dict(data, path)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def config_from_dict(data: dict, path: str | Path = "<dict>") -> EmulatorConfig:
    """The same as `load_config` for an already parsed dictionary (used by the testbed)."""
    try:
        return _from_dict(data, Path(path))
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None


def _from_dict(data: dict, path: Path) -> EmulatorConfig:
    unknown = set(data) - {"seed", "classes", "link", "sample_interval"}
    if unknown:
        raise ConfigError(f"unknown top-level keys {sorted(unknown)}")
    classes = DEFAULT_CLASSES
    if "classes" in data:
        table_path = path.parent / data["classes"]
        try:
            classes = load_classes(table_path)
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"classes = {data['classes']!r}: {e}") from None
    links = data.get("link")
    if not isinstance(links, dict) or not links:
        raise ConfigError("no [link.NAME] table")
    seed = data.get("seed")
    directions: list[Direction] = []
    for link_name, link in links.items():
        if not isinstance(link, dict):
            raise ConfigError(f"link.{link_name}: expected a table")
        unknown = set(link) - _LINK_KEYS - set(DIRECTIONS)
        if unknown:
            raise ConfigError(f"link.{link_name}: unknown keys {sorted(unknown)}")
        shared = {k: v for k, v in link.items() if k not in DIRECTIONS}
        present = [d for d in DIRECTIONS if d in link]
        if not present:
            raise ConfigError(f"link.{link_name}: needs a [link.{link_name}.forward] and/or .reverse table")
        for direction in present:
            where = f"link.{link_name}.{direction}"
            own = link[direction]
            unknown = set(own) - _DIRECTION_KEYS
            if unknown:
                raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
            inherited = shared
            if "discipline" in own:  # a direction with its own discipline drops the link's tables for others
                inherited = {k: v for k, v in shared.items()
                             if k not in _DISCIPLINE_TABLES or k == own["discipline"]}
            settings = _merge(inherited, {k: v for k, v in own.items() if k in _LINK_KEYS})
            if "queue" not in own:
                raise ConfigError(f"{where}: missing 'queue' (the NFQUEUE number)")
            queue = own["queue"]
            if not isinstance(queue, int) or not 0 <= queue <= 65535:
                raise ConfigError(f"{where}.queue: expected an integer 0-65535, got {queue!r}")
            match = []
            if "in" in own:
                match += ["-i", str(own["in"])]
            if "out" in own:
                match += ["-o", str(own["out"])]
            match += [str(a) for a in own.get("match", [])]
            if not match:
                raise ConfigError(f"{where}: says nothing about which packets to take; give 'in', 'out' "
                                  "or 'match' (iptables arguments)")
            chain = own.get("chain", "FORWARD")
            if chain not in ("FORWARD", "OUTPUT", "INPUT"):
                raise ConfigError(f"{where}.chain: {chain!r} is not an iptables filter chain")
            d = Direction(link_name, direction, queue, match, settings, classes, chain)
            _build_link(d.name, settings, classes, random.Random(0))  # check now, fail early
            directions.append(d)
    queues = [d.queue for d in directions]
    if len(set(queues)) != len(queues):
        raise ConfigError(f"NFQUEUE numbers must differ between directions, got {queues}")
    interval = parse_time(data.get("sample_interval", 0.1), "sample_interval")
    return EmulatorConfig(path, directions, seed, interval)


def _merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _positive_int(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: expected a positive integer, got {value!r}")
    return value


def _build_link(name: str, s: dict, classes: ClassTable, rng: random.Random,
                stats: LinkStats | None = None) -> EmulatedLink:
    where = f"link.{name}"
    if "rate" not in s:
        raise ConfigError(f"{where}: missing 'rate'")
    rate = parse_rate(s["rate"], f"{where}.rate")
    delay = parse_time(s.get("delay", 0), f"{where}.delay")
    jitter = parse_time(s.get("jitter", 0), f"{where}.jitter")
    if jitter > delay:
        raise ConfigError(f"{where}.jitter: {s['jitter']!r} is larger than the delay {s.get('delay', 0)!r}")
    loss = s.get("loss", 0.0)
    if isinstance(loss, bool) or not isinstance(loss, (int, float)) or not 0 <= loss < 1:
        raise ConfigError(f"{where}.loss: expected a probability in [0, 1), got {loss!r}")
    overhead = s.get("overhead", 0)
    if isinstance(overhead, bool) or not isinstance(overhead, int) or overhead < 0:
        raise ConfigError(f"{where}.overhead: expected bytes >= 0, got {overhead!r}")
    limit = _positive_int(s.get("limit", 100), f"{where}.limit")
    kind = s.get("discipline", "fifo")
    if kind not in DISCIPLINES:
        raise ConfigError(f"{where}.discipline: {kind!r} is not one of {', '.join(DISCIPLINES)}")
    for other in ("priority", "wfq", "wred", "fq"):
        if other in s and other != kind:
            raise ConfigError(f"{where}: a [{other}] table but discipline = {kind!r}")
    scheduler = _build_discipline(kind, s.get(kind, {}), limit, rate, classes, rng, f"{where}.{kind}",
                                  limit_given="limit" in s)
    shapers = {}
    for klass, shape in s.get("shape", {}).items():
        w = f"{where}.shape.{klass}"
        if klass not in classes and klass != "default":
            raise ConfigError(f"{w}: unknown class {klass!r}; classes are {', '.join(classes.names())}, default")
        unknown = set(shape) - {"rate", "burst", "limit"}
        if unknown:
            raise ConfigError(f"{w}: unknown keys {sorted(unknown)}")
        try:
            shapers[klass] = TokenBucketShaper(parse_rate(shape.get("rate"), f"{w}.rate"),
                                               _positive_int(shape.get("burst", 3000), f"{w}.burst"),
                                               _positive_int(shape.get("limit", 64), f"{w}.limit"), overhead)
        except ValueError as e:
            raise ConfigError(f"{w}: {e}") from None
    try:
        return EmulatedLink(rate, scheduler, dscp_classifier(classes), delay=delay, jitter=jitter, loss=float(loss),
                    overhead=overhead, shapers=shapers, rng=rng, stats=stats, name=name)
    except ValueError as e:
        raise ConfigError(f"{where}: {e}") from None


def _build_discipline(kind: str, opts: dict, limit: int, rate: float, classes: ClassTable,
                      rng: random.Random, where: str, limit_given: bool = False) -> Discipline:
    if not isinstance(opts, dict):
        raise ConfigError(f"{where}: expected a table")

    def check_keys(allowed):
        unknown = set(opts) - set(allowed)
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")

    def check_class(klass, w):
        if klass not in classes and klass != "default":
            raise ConfigError(f"{w}: unknown class {klass!r}; classes are {', '.join(classes.names())}, default")

    if kind == "fifo":
        check_keys([])
        return Fifo(limit)
    if kind == "fq":
        check_keys([])
        return FlowFq(limit)
    if kind == "priority":
        check_keys(["bands", "default", "limits"])
        bands = opts.get("bands")
        if bands is None:  # the class table's order: most favoured class -> high
            bands = {c.name: BANDS[min(i, len(BANDS) - 1)] for i, c in enumerate(classes)}
        for klass in bands:
            check_class(klass, f"{where}.bands")
        limits = opts.get("limits")
        if limits is None and limit_given:  # one explicit buffer size for every band
            limits = {band: limit for band in BANDS}
        try:
            return Priority(bands, opts.get("default", "normal"), limits)
        except ValueError as e:
            raise ConfigError(f"{where}: {e}") from None
    if kind == "wfq":
        check_keys(["weights"])
        weights = opts.get("weights") or {c.name: 1.0 for c in classes}
        for klass, weight in weights.items():
            check_class(klass, f"{where}.weights")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
                raise ConfigError(f"{where}.weights.{klass}: expected a positive number, got {weight!r}")
        return ClassWfq({k: float(v) for k, v in weights.items()}, limit)
    # wred
    check_keys(["defaults", "weight_exponent", "dscp", "default_profile"])
    base = opts.get("defaults", "cisco")
    if base not in ("cisco", "seed003"):
        raise ConfigError(f"{where}.defaults: expected 'cisco' or 'seed003', got {base!r}")
    profiles = dict(CISCO_DSCP_DEFAULTS)
    if base == "seed003":
        profiles.update(SEED003_AF1)
    default_profile = CISCO_DEFAULT_PROFILE
    try:
        for key, values in opts.get("dscp", {}).items():
            profiles[parse_dscp(key, f"{where}.dscp")] = WredProfile(*values)
        if "default_profile" in opts:
            default_profile = WredProfile(*opts["default_profile"])
    except (TypeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"{where}: a profile is [min, max, mark denominator]: {e}") from None
    exponent = opts.get("weight_exponent", CISCO_WEIGHT_EXPONENT)
    if isinstance(exponent, bool) or not isinstance(exponent, int) or not 0 <= exponent <= 16:
        raise ConfigError(f"{where}.weight_exponent: expected an integer 0-16, got {exponent!r}")
    return Wred(profiles, default_profile, limit, exponent, packet_time=1500 * 8 / rate, rng=rng)
