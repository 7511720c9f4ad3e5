"""The 2002 study's routers (Cisco 1600 series, IOS 12.x) as emulator link settings.

Every strategy the study compared, each with IOS's own defaults, all on the one user-space
backend so that comparisons differ only in the discipline:

| strategy | IOS command | what the emulator runs |
|---|---|---|
| `fifo` | none (FIFO) | `fifo`, the output hold queue: 40 packets |
| `priority` | `priority-list` / `priority-group` | `priority`: high, medium, normal, low; limits 20/40/60/80 |
| `wfq` | `fair-queue` | `flow_wfq`: per conversation, weight 32384 / (precedence + 1), congestive discard 64, 256 queues, hold queue 1000 |
| `cbwfq` | `policy-map` with `bandwidth` per class | `wfq` (class-based DRR), weights by precedence + 1, `queue-limit` 64 per class |
| `wred` | `random-detect` | `wred`: precedence profiles (min 20..35, max 40, 1/10), exponential weighting constant 9, hold queue 40 |
| `shaping` | `traffic-shape` of the competing class + WFQ (or CBWFQ) | `flow_wfq` (or `cbwfq`'s) with a token bucket on `shaped_class`, burst Bc = CIR x 125 ms |

Sources, as cited where each value is defined in `qos.cisco`: the `hold-queue`,
`fair-queue`, `queue-limit` and `priority-list` command references ("Cisco IOS in a
Nutshell", O'Reilly; Cisco's command reference for `hold-queue`), Cisco's WRED
configuration guide (precedence-based by default; "half the max-threshold for precedence 0,
the rest evenly spaced"). Recollections not confirmed by a source found: the exact minimum
thresholds table 20/22/24/26/28/31/33/35 (it matches the documented rule), the PQ limits
20/40/60/80 (the command exists and its defaults are not in the pages found), and WFQ's
modified tail drop (see `FlowWfq`).
"""

from __future__ import annotations

from qos.cisco import (CONGESTIVE_DISCARD_PACKETS, HOLD_QUEUE_PACKETS, IOS_SHAPING_INTERVAL_S,
                       WRED_WEIGHT_EXPONENT)
from qos.classes import DEFAULT_CLASSES, ClassTable

IOS_STRATEGIES = ("fifo", "priority", "wfq", "cbwfq", "wred", "shaping")
PREFIX = "ios-"  # the testbed's discipline tables name these "ios-fifo", "ios-wfq", ...


def precedence_weights(classes: ClassTable = DEFAULT_CLASSES) -> dict[str, int]:
    """Class -> IP precedence + 1: IOS's relative share per class (AF41 5, AF21 3, AF11 2, LE 1).

    Parameters
    ----------
    classes : ClassTable
        The run's request classes; each weighs as its DSCP's precedence.

    Returns
    -------
    dict
        Class name -> weight, the unmarked "default" class included (precedence 0 -> 1).
    """
    return {**{c.name: (c.dscp >> 3) + 1 for c in classes}, "default": 1}


def shaping_burst_bytes(rate_kbit: float) -> int:
    """IOS traffic shaping's default committed burst Bc = CIR x 125 ms, in bytes (at least one
    full frame, 1600 B, the shaper's own minimum)."""
    return max(1600, int(rate_kbit * 1000 * IOS_SHAPING_INTERVAL_S / 8))


def ios_link_settings(strategy: str, shaped_class: str = "bulk", shaped_rate_kbit: float | None = None,
                      classes: ClassTable = DEFAULT_CLASSES, shaped_base: str = "cbwfq",
                      shaped_burst_bytes: int | None = None) -> dict:
    """Emulator link settings (`qos.emulator.config.LinkSettings` keys) of one IOS strategy.

    Parameters
    ----------
    strategy : str
        One of `IOS_STRATEGIES`.
    shaped_class, shaped_rate_kbit : str, float
        For "shaping": the class held to `shaped_rate_kbit` kbit/s (required there).
    shaped_base : str
        For "shaping": the queueing behind the shaper, "wfq" (IOS fair-queue, the study's
        "traffic shaping ... combined with WFQ") or "cbwfq".
    shaped_burst_bytes : int, optional
        For "shaping": the token bucket; default IOS's Bc = CIR x 125 ms (`shaping_burst_bytes`).
    classes : ClassTable
        The run's request classes (CBWFQ weighs them by precedence).

    Returns
    -------
    dict
        Settings without rate (the link's); `config_from_dict` checks them.

    Raises
    ------
    ValueError
        An unknown strategy, or "shaping" without a rate.
    """
    if strategy == "fifo":
        return {"discipline": "fifo", "limit_packets": HOLD_QUEUE_PACKETS}
    if strategy == "priority":
        return {"discipline": "priority"}  # the bands' own limits, 20/40/60/80
    if strategy == "wfq":
        return {"discipline": "flow_wfq"}
    if strategy == "shaping":
        if shaped_rate_kbit is None:
            raise ValueError("strategy 'ios-shaping' needs shaped_rate_kbit")
        if shaped_base not in ("wfq", "cbwfq"):
            raise ValueError(f"strategy 'ios-shaping' shapes in front of wfq or cbwfq, not {shaped_base!r}")
        out = ios_link_settings(shaped_base, classes=classes)
        burst = shaping_burst_bytes(shaped_rate_kbit) if shaped_burst_bytes is None else int(shaped_burst_bytes)
        out["shape"] = {shaped_class: {"rate_kbit": shaped_rate_kbit, "burst_bytes": burst}}
        return out
    if strategy == "cbwfq":
        return {"discipline": "wfq", "wfq": {"weights": precedence_weights(classes)},
                "limit_packets": CONGESTIVE_DISCARD_PACKETS}
    if strategy == "wred":
        return {"discipline": "wred", "limit_packets": HOLD_QUEUE_PACKETS,
                "wred": {"defaults": "cisco-precedence", "weight_exponent": WRED_WEIGHT_EXPONENT}}
    raise ValueError(f"unknown IOS strategy {strategy!r}; known: {', '.join(IOS_STRATEGIES)}")
