"""Kernel queueing backend: the Linux qdiscs this kernel has (htb, tbf, pfifo; u32 on the DSCP).

A `KernelQdisc` is data: the link rate and a list of `QueueClass`es, each with the DSCPs it
takes, its htb priority, assured rate, ceiling and pfifo buffer. `install` turns it into

    root htb 1:  (unclassified packets -> the default class)
      class 1:1   rate = ceil = link rate            # the link
        class 1:1N  rate, ceil, prio, quantum         # one per queue class
          qdisc N: pfifo limit <packets>              # tail-drop buffer
    filters: u32 match ip dsfield <DSCP << 2> 0xfc -> 1:1N

The four strategies of the study that this kernel can do:

- ``fifo``: one class, one tail-drop buffer;
- ``priority``: one class per request class, htb ``prio`` 0-3 and a token assured rate, so
  spare capacity goes to the most favoured backlogged class first (strict priority);
- ``shares``: class-based fair queuing: assured rates in proportion to weights, spare
  capacity shared in the same proportion (htb quantum proportional to the weight);
- ``shaping``: ``shares`` with the ceiling of one class (the competing traffic) cut to a rate.

Rates are in bit/s of the IP packet plus `overhead_bytes` per packet (the emulator's
convention). The default, 14, is the Ethernet header, which htb counts by itself on a
veth; 38 adds preamble, FCS and inter-frame gap, counting the wire as a real 10 Mbit/s
Ethernet does (htb gets ``overhead`` = overhead_bytes - 14).

The kernel has no prio, red or netem qdisc: WRED, delay and loss come from the user-space
emulator (`qos.emulator`).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field

from qos import netns
from qos.cisco import HOLD_QUEUE_PACKETS
from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.testbed.node import Node

STRATEGIES = ("fifo", "priority", "shares", "shaping")
ETHERNET_HEADER_BYTES = 14
MTU_FRAME_BYTES = 1500 + ETHERNET_HEADER_BYTES


@dataclass(frozen=True)
class QueueClass:
    """One htb class with its own tail-drop buffer.

    name: label used in statistics (a request class name, or "all" for FIFO).
    dscps: the DSCP values (0-63) classified into it.
    prio: htb priority, 0 = offered spare capacity first.
    rate_bps / ceil_bps: assured and maximum rate, bit/s.
    limit_packets: pfifo buffer in packets.
    weight: share of spare capacity relative to the other classes (sets the htb quantum).
    """

    name: str
    dscps: tuple[int, ...]
    prio: int
    rate_bps: int
    ceil_bps: int
    limit_packets: int = HOLD_QUEUE_PACKETS
    weight: float = 1.0


@dataclass(frozen=True)
class KernelQdisc:
    """A link's egress discipline: its rate, its classes, where unclassified packets go."""

    strategy: str
    rate_bps: int
    classes: tuple[QueueClass, ...]
    default: str
    overhead_bytes: int = ETHERNET_HEADER_BYTES
    params: dict = field(default_factory=dict, compare=False)

    def minor(self, name: str) -> int:
        """The htb class minor (and leaf qdisc major) of class `name`: 0x10, 0x11, ..."""
        for i, qc in enumerate(self.classes):
            if qc.name == name:
                return 0x10 + i
        raise KeyError(f"discipline {self.strategy!r} has no class {name!r}")


def _check_rate(what: str, bps: float) -> int:
    if not bps or bps <= 0:
        raise ValueError(f"{what} must be a positive rate in bit/s, got {bps!r}")
    return int(bps)


def fifo(rate_bps: float, limit_packets: int = HOLD_QUEUE_PACKETS, overhead_bytes: int = ETHERNET_HEADER_BYTES) -> KernelQdisc:
    """First come, first served at `rate_bps` with a `limit_packets` tail-drop buffer."""
    rate = _check_rate("link rate", rate_bps)
    only = QueueClass("all", (), 0, rate, rate, int(limit_packets))
    return KernelQdisc("fifo", rate, (only,), "all", overhead_bytes)


def _default_class(table: ClassTable, default: str | None) -> str:
    # Unmarked traffic goes to the third queue, like Cisco priority queuing's "normal".
    ordered = table.names()
    name = default or ordered[min(2, len(ordered) - 1)]
    table[name]  # raises UnknownClass with the known names
    return name


def priority(rate_bps: float, classes: ClassTable = DEFAULT_CLASSES,
             limit_packets: int = HOLD_QUEUE_PACKETS, default: str | None = None,
             overhead_bytes: int = ETHERNET_HEADER_BYTES) -> KernelQdisc:
    """Strict priority by request class: htb prio = the class's priority, each may use the whole link.

    Each class is assured 1% of the link (htb needs a rate) and borrows the rest in priority
    order, so a backlogged favoured class leaves the others only their 1%.
    """
    rate = _check_rate("link rate", rate_bps)
    token = max(rate // 100, 8000)
    queues = tuple(
        QueueClass(c.name, (c.dscp,), min(c.priority, 7), token, rate, int(limit_packets))
        for c in classes
    )
    return KernelQdisc("priority", rate, queues, _default_class(classes, default), overhead_bytes)


def shares(rate_bps: float, weights: dict[str, float], classes: ClassTable = DEFAULT_CLASSES,
           limit_packets: int = HOLD_QUEUE_PACKETS, default: str | None = None,
           overhead_bytes: int = ETHERNET_HEADER_BYTES, ceilings: dict[str, float] | None = None) -> KernelQdisc:
    """Class-based fair queuing: class i is assured rate x w_i / sum(w) and shares spare capacity by weight.

    `weights` maps request class names to positive weights; classes not named get weight 1.
    `ceilings` optionally caps classes (bit/s), which is how `shaping` is built.
    """
    rate = _check_rate("link rate", rate_bps)
    for name in weights:
        classes[name]
    ceilings = ceilings or {}
    for name in ceilings:
        classes[name]
    w = {c.name: float(weights.get(c.name, 1.0)) for c in classes}
    if any(v <= 0 for v in w.values()):
        raise ValueError(f"class weights must be positive, got {w}")
    total = sum(w.values())
    queues = []
    for c in classes:
        ceil = min(rate, _check_rate(f"ceiling of class {c.name!r}", ceilings[c.name])) if c.name in ceilings else rate
        assured = min(max(int(rate * w[c.name] / total), 8000), ceil)
        queues.append(QueueClass(c.name, (c.dscp,), 0, assured, ceil, int(limit_packets), w[c.name]))
    return KernelQdisc("shares", rate, tuple(queues), _default_class(classes, default), overhead_bytes,
                      {"weights": w})


def shaping(rate_bps: float, shaped_class: str, shaped_rate_bps: float,
            weights: dict[str, float] | None = None, classes: ClassTable = DEFAULT_CLASSES,
            limit_packets: int = HOLD_QUEUE_PACKETS, default: str | None = None,
            overhead_bytes: int = ETHERNET_HEADER_BYTES) -> KernelQdisc:
    """`shares` with class `shaped_class` (the competing traffic) held to at most `shaped_rate_bps`."""
    base = shares(rate_bps, weights or {}, classes, limit_packets, default, overhead_bytes,
                  ceilings={shaped_class: shaped_rate_bps})
    return KernelQdisc("shaping", base.rate_bps, base.classes, base.default, overhead_bytes,
                      {**base.params, "shaped_class": shaped_class, "shaped_rate_bps": int(shaped_rate_bps)})


def from_config(spec: dict, rate_bps: float, classes: ClassTable = DEFAULT_CLASSES) -> KernelQdisc:
    """Build a KernelQdisc from a config table, e.g. ``{strategy = "shaping", shaped_class = "bulk",
    shaped_rate_kbit = 4000, weights = {urgent = 5, routine = 3}, limit_packets = 40}``
    (rates in files are kbit/s; `rate_bps` here is the link's, in bit/s)."""
    spec = dict(spec)
    if "shaped_rate_bps" in spec:
        raise ValueError("shaped_rate_bps: old spelling; use shaped_rate_kbit "
                         f"= {spec['shaped_rate_bps'] / 1000:g} (kbit/s)")
    strategy = spec.pop("strategy", "fifo")
    common = {"limit_packets": spec.pop("limit_packets", HOLD_QUEUE_PACKETS),
              "overhead_bytes": spec.pop("overhead_bytes", ETHERNET_HEADER_BYTES)}
    if strategy == "fifo":
        made = fifo(rate_bps, **common)
    elif strategy == "priority":
        made = priority(rate_bps, classes, default=spec.pop("default", None), **common)
    elif strategy == "shares":
        made = shares(rate_bps, spec.pop("weights", {}), classes, default=spec.pop("default", None), **common)
    elif strategy == "shaping":
        try:
            shaped_class, shaped_rate = spec.pop("shaped_class"), spec.pop("shaped_rate_kbit") * 1000
        except KeyError as exc:
            raise ValueError(f"strategy 'shaping' needs {exc.args[0]}") from None
        made = shaping(rate_bps, shaped_class, shaped_rate, spec.pop("weights", {}), classes,
                       default=spec.pop("default", None), **common)
    else:
        raise ValueError(f"unknown kernel strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    if spec:
        raise ValueError(f"strategy {strategy!r}: unknown settings {', '.join(sorted(spec))}")
    return made


def _tc_commands(dev: str, d: KernelQdisc) -> list[list[str]]:
    """The tc command lines that install `d` on `dev` (after any old root qdisc is removed)."""
    extra = d.overhead_bytes - ETHERNET_HEADER_BYTES
    if extra < 0:
        raise ValueError(f"overhead_bytes {d.overhead_bytes} is below the {ETHERNET_HEADER_BYTES}-byte "
                         "Ethernet header that htb always counts on a veth")
    over = ["overhead", str(extra)] if extra else []
    cmds = [
        ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", f"{d.minor(d.default):x}"],
        ["class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
         "rate", f"{d.rate_bps}bit", "ceil", f"{d.rate_bps}bit", "quantum", str(MTU_FRAME_BYTES), *over],
    ]
    min_weight = min(qc.weight for qc in d.classes)
    for qc in d.classes:
        minor = f"{d.minor(qc.name):x}"
        quantum = int(MTU_FRAME_BYTES * qc.weight / min_weight)
        cmds.append(["class", "add", "dev", dev, "parent", "1:1", "classid", f"1:{minor}", "htb",
                     "rate", f"{qc.rate_bps}bit", "ceil", f"{qc.ceil_bps}bit", "prio", str(qc.prio),
                     "quantum", str(quantum), *over])
        cmds.append(["qdisc", "add", "dev", dev, "parent", f"1:{minor}", "handle", f"{minor}:",
                     "pfifo", "limit", str(qc.limit_packets)])
        for dscp in qc.dscps:
            cmds.append(["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1",
                         "u32", "match", "ip", "dsfield", f"{dscp << 2:#04x}", "0xfc", "flowid", f"1:{minor}"])
    return cmds


def install(node: Node, dev: str, discipline: KernelQdisc) -> None:
    """Replace the egress discipline of interface `dev` on `node` with `discipline`."""
    clear(node, dev)
    batch = "\n".join(" ".join(c) for c in _tc_commands(dev, discipline)) + "\n"
    # One `tc -batch` per interface: a dozen commands in one process instead of a dozen processes.
    netns.run(node.namespace, ["tc", "-batch", "-"], input=batch)


def clear(node: Node, dev: str) -> None:
    """Remove any root qdisc from `dev` (back to the default, unshaped)."""
    node.run("tc", "qdisc", "del", "dev", dev, "root", check=False)


def stats(node: Node, dev: str, discipline: KernelQdisc) -> dict[str, dict[str, int]]:
    """Per-class counters of `dev`'s leaf queues: {class: {bytes, packets, drops, backlog, qlen}}."""
    qdiscs = json.loads(node.cmd("tc", "-s", "-j", "qdisc", "show", "dev", dev) or "[]")
    by_handle = {q["handle"]: q for q in qdiscs}
    out = {}
    for qc in discipline.classes:
        q = by_handle.get(f"{discipline.minor(qc.name):x}:")
        if q is None:
            raise RuntimeError(f"{node.name}:{dev} has no leaf queue for class {qc.name!r}; "
                               "was the discipline installed?")
        out[qc.name] = {k: int(q.get(k, 0)) for k in ("bytes", "packets", "drops", "backlog", "qlen")}
    return out


@functools.lru_cache(maxsize=1)
def available_qdiscs(candidates: tuple[str, ...] = ("htb", "tbf", "pfifo", "prio", "red", "netem",
                                                    "sfq", "fq_codel", "hfsc", "drr")) -> frozenset[str]:
    """Which of `candidates` this kernel can install, probed on a veth in a scratch namespace."""
    scratch = netns.namespace_name(netns.new_tag("k"), "probe")
    netns.add(scratch)
    try:
        netns.run(scratch, ["ip", "link", "add", "name", "pa", "type", "veth", "peer", "name", "pb"])
        found = set()
        for kind in candidates:
            if netns.run(scratch, ["tc", "qdisc", "replace", "dev", "pa", "root", kind], check=False).returncode == 0:
                found.add(kind)
        return frozenset(found)
    finally:
        netns.delete(scratch)


def missing_for_kernel_backend() -> list[str]:
    """The qdiscs this backend needs that the kernel lacks (empty when it can run)."""
    return sorted({"htb", "pfifo"} - available_qdiscs())
