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

    [competing]
    kind = "downloads"          # "downloads" (parallel bulk TCP), "udp" (constant rate), "pareto"
    levels = [0, 2, 8]          # downloads: parallel streams; udp/pareto: mean rate in kbit/s
    targets = ["B3", "C3"]      # hosts that pull from the master

    [strategies.fifo]           # one table per strategy, named freely
    discipline = "fifo"         # "fifo" | "prio" | "wfq" | "wred"
    [strategies.shape-200]
    discipline = "wfq"
    shape_kbit = 200            # shapes the competing (bulk) traffic to this rate

    [[links]]                   # one entry per link setting; the core link is the bottleneck
    name = "10M"
    core_kbit = 10000
    delay_ms = 0.0              # one-way delay added on the core link
    mtu = 1500

`load_spec(path)` validates all of it and names the file and key of anything wrong.
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from pathmaster.records import InvalidInput
from qos.classes import DEFAULT_CLASSES

DISCIPLINES = ("fifo", "prio", "wfq", "wred")
COMPETING_KINDS = ("downloads", "udp", "pareto")
DEFAULT_REPETITIONS = 10


@dataclass(frozen=True)
class Strategy:
    """A router configuration: a queueing discipline, optionally with the bulk class shaped."""

    name: str
    discipline: str
    shape_kbit: float | None = None  # rate limit for the competing traffic, None = unshaped
    params: dict = field(default_factory=dict)  # discipline-specific extras, passed through


@dataclass(frozen=True)
class LinkProfile:
    """One setting of the core (bottleneck) link."""

    name: str
    core_kbit: float
    delay_ms: float = 0.0  # one-way, added on the core link
    mtu: int = 1500
    access_kbit: float | None = None  # host-router LAN links; None = not rate-limited
    queue_packets: int = 100  # router queue length (packets) on the core link

    @property
    def access_rate_kbit(self) -> float:
        return self.access_kbit if self.access_kbit is not None else float("inf")


@dataclass(frozen=True)
class Workload:
    """One PathMaster case: what goes to every site, what comes back."""

    cells: int = 6
    image_bytes: int = 100_000
    with_background: bool = True
    with_mask: bool = True
    k: int = 5
    match_bytes: int = 5000  # thumbnail bytes per returned match
    mode: str = "transfer"  # "transfer": sites answer without analysing (workload.py);
    # "service": the product itself (services.experiment.deployment: sites with Ray on X1/X2, coordinator
    # and `pathmaster query` on the master) with synthetic cells; image_bytes/match_bytes unused
    workers_on_x2: bool = False  # service mode: each site's second Ray worker on its X2 host
    sites: tuple[str, ...] = ("A1", "B1", "C1")  # the server of each subnet; master is A1's peer
    deadline_s: float = 120.0


@dataclass(frozen=True)
class Competing:
    """Competing traffic: what kind and the levels swept."""

    kind: str = "downloads"
    levels: tuple[float, ...] = (0,)
    targets: tuple[str, ...] = ("B3", "C3")
    params: dict = field(default_factory=dict)  # e.g. pareto alpha, on/off periods

    @property
    def unit(self) -> str:
        return "streams" if self.kind == "downloads" else "kbit/s"


@dataclass(frozen=True)
class Experiment:
    """A whole experiment file, validated."""

    name: str
    description: str
    repetitions: int
    seed: int
    request_classes: tuple[str, ...]
    workload: Workload
    competing: Competing
    strategies: tuple[Strategy, ...]
    links: tuple[LinkProfile, ...]
    settle_s: float = 1.0  # competing traffic runs this long before a case is submitted
    order: str = "shuffled"  # "shuffled" or "blocked" (by competing level; see matrix.expand)
    source: str = ""  # the file it came from

    def to_dict(self) -> dict:
        """A JSON-ready form, recorded in every run's metadata."""
        data = asdict(self)
        data.pop("source")
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
    """Read and validate an experiment file (or built-in name); raises InvalidInput on any problem."""
    path = resolve(file_or_name)
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidInput(f"not valid TOML: {exc}", path) from None
    return parse_spec(data, source=str(path))


def _take(table: dict, key: str, kind, where: str, source: str, default=None, required=False):
    """One typed value from a TOML table, with an error naming file and key."""
    if key not in table:
        if required:
            raise InvalidInput(f"[{where}] needs '{key}'", source)
        return default
    value = table[key]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
        names = " or ".join(k.__name__ for k in kinds)
        raise InvalidInput(f"[{where}] '{key}' must be {names}, got {value!r}", source)
    return value


def _unknown_keys(table: dict, known: set[str], where: str, source: str) -> None:
    extra = sorted(set(table) - known)
    if extra:
        raise InvalidInput(
            f"[{where}] unknown key(s) {', '.join(extra)}; known: {', '.join(sorted(known))}", source
        )


def parse_spec(data: dict, source: str = "<experiment>") -> Experiment:
    """Validate an already-parsed TOML document; see the module docstring for the format."""
    _unknown_keys(data, {"experiment", "workload", "competing", "strategies", "links"}, "top level", source)
    head = data.get("experiment")
    if not isinstance(head, dict):
        raise InvalidInput("needs an [experiment] table", source)
    _unknown_keys(
        head, {"name", "description", "repetitions", "seed", "request_classes", "settle_s", "order"}, "experiment", source
    )
    name = _take(head, "name", str, "experiment", source, required=True)
    repetitions = _take(head, "repetitions", int, "experiment", source, DEFAULT_REPETITIONS)
    if repetitions < 1:
        raise InvalidInput(f"[experiment] repetitions must be >= 1, got {repetitions}", source)
    classes = tuple(_take(head, "request_classes", list, "experiment", source, ["urgent"]))
    for cls in classes:
        if cls not in DEFAULT_CLASSES:
            raise InvalidInput(
                f"[experiment] unknown request class {cls!r}; known: {', '.join(DEFAULT_CLASSES.names())}", source
            )
    if not classes:
        raise InvalidInput("[experiment] request_classes is empty", source)

    order = _take(head, "order", str, "experiment", source, "shuffled")
    if order not in ("shuffled", "blocked"):
        raise InvalidInput(f"[experiment] order must be 'shuffled' or 'blocked', got {order!r}", source)

    wl = data.get("workload", {})
    known_wl = {"cells", "image_bytes", "with_background", "with_mask", "k", "match_bytes", "mode", "sites",
                "deadline_s", "workers_on_x2"}
    _unknown_keys(wl, known_wl, "workload", source)
    workload = Workload(
        cells=_take(wl, "cells", int, "workload", source, 6),
        image_bytes=_take(wl, "image_bytes", int, "workload", source, 100_000),
        with_background=_take(wl, "with_background", bool, "workload", source, True),
        with_mask=_take(wl, "with_mask", bool, "workload", source, True),
        k=_take(wl, "k", int, "workload", source, 5),
        match_bytes=_take(wl, "match_bytes", int, "workload", source, 5000),
        mode=_take(wl, "mode", str, "workload", source, "transfer"),
        workers_on_x2=_take(wl, "workers_on_x2", bool, "workload", source, False),
        sites=tuple(_take(wl, "sites", list, "workload", source, ["A1", "B1", "C1"])),
        deadline_s=float(_take(wl, "deadline_s", (int, float), "workload", source, 120.0)),
    )
    if workload.cells < 1 or workload.image_bytes < 1 or workload.k < 1 or workload.match_bytes < 0:
        raise InvalidInput("[workload] cells, image_bytes and k must be >= 1, match_bytes >= 0", source)
    if workload.mode not in ("transfer", "service"):
        raise InvalidInput(f"[workload] mode {workload.mode!r} is not 'transfer' or 'service'", source)

    comp = data.get("competing", {})
    _unknown_keys(comp, {"kind", "levels", "targets", "params"}, "competing", source)
    kind = _take(comp, "kind", str, "competing", source, "downloads")
    if kind not in COMPETING_KINDS:
        raise InvalidInput(f"[competing] kind {kind!r} is not one of {', '.join(COMPETING_KINDS)}", source)
    levels = _take(comp, "levels", list, "competing", source, [0])
    if not levels or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 for v in levels):
        raise InvalidInput(f"[competing] levels must be a non-empty list of numbers >= 0, got {levels!r}", source)
    if len(set(levels)) != len(levels):
        raise InvalidInput(f"[competing] levels repeat a value: {levels!r}", source)
    competing = Competing(
        kind=kind,
        levels=tuple(levels),
        targets=tuple(_take(comp, "targets", list, "competing", source, ["B3", "C3"])),
        params=dict(_take(comp, "params", dict, "competing", source, {})),
    )

    strategies_table = data.get("strategies")
    if not isinstance(strategies_table, dict) or not strategies_table:
        raise InvalidInput("needs at least one [strategies.NAME] table", source)
    strategies = []
    for sname, entry in strategies_table.items():
        where = f"strategies.{sname}"
        if not isinstance(entry, dict):
            raise InvalidInput(f"[{where}] must be a table", source)
        _unknown_keys(entry, {"discipline", "shape_kbit", "params"}, where, source)
        discipline = _take(entry, "discipline", str, where, source, required=True)
        if discipline not in DISCIPLINES:
            raise InvalidInput(f"[{where}] discipline {discipline!r} is not one of {', '.join(DISCIPLINES)}", source)
        shape = _take(entry, "shape_kbit", (int, float), where, source, None)
        if shape is not None and shape <= 0:
            raise InvalidInput(f"[{where}] shape_kbit must be > 0, got {shape}", source)
        strategies.append(
            Strategy(sname, discipline, None if shape is None else float(shape),
                     dict(_take(entry, "params", dict, where, source, {})))
        )

    links_list = data.get("links")
    if not isinstance(links_list, list) or not links_list:
        raise InvalidInput("needs at least one [[links]] entry", source)
    links = []
    for i, entry in enumerate(links_list):
        where = f"links[{i}]"
        _unknown_keys(entry, {"name", "core_kbit", "delay_ms", "mtu", "access_kbit", "queue_packets"}, where, source)
        link = LinkProfile(
            name=_take(entry, "name", str, where, source, required=True),
            core_kbit=float(_take(entry, "core_kbit", (int, float), where, source, required=True)),
            delay_ms=float(_take(entry, "delay_ms", (int, float), where, source, 0.0)),
            mtu=_take(entry, "mtu", int, where, source, 1500),
            access_kbit=_take(entry, "access_kbit", (int, float), where, source, None),
            queue_packets=_take(entry, "queue_packets", int, where, source, 100),
        )
        if link.core_kbit <= 0 or link.delay_ms < 0 or not 576 <= link.mtu <= 9000:
            raise InvalidInput(f"[{where}] needs core_kbit > 0, delay_ms >= 0 and 576 <= mtu <= 9000", source)
        links.append(link)
    if len({item.name for item in links}) != len(links):
        raise InvalidInput("[[links]] names must be unique", source)

    return Experiment(
        name=name,
        description=_take(head, "description", str, "experiment", source, ""),
        repetitions=repetitions,
        seed=_take(head, "seed", int, "experiment", source, 0),
        request_classes=classes,
        workload=workload,
        competing=competing,
        strategies=tuple(strategies),
        links=tuple(links),
        settle_s=float(_take(head, "settle_s", (int, float), "experiment", source, 1.0)),
        order=order,
        source=source,
    )
