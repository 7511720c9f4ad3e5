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
| `shaping` | traffic shaping of the competing class + CBWFQ | `cbwfq` with a token bucket on `shaped_class` |

Sources, as cited where each value is defined in `pathmaster.defaults`: the `hold-queue`,
`fair-queue`, `queue-limit` and `priority-list` command references ("Cisco IOS in a
Nutshell", O'Reilly; Cisco's command reference for `hold-queue`), Cisco's WRED
configuration guide (precedence-based by default; "half the max-threshold for precedence 0,
the rest evenly spaced"). Recollections not confirmed by a source found: the exact minimum
thresholds table 20/22/24/26/28/31/33/35 (it matches the documented rule), the PQ limits
20/40/60/80 (the command exists and its defaults are not in the pages found), and WFQ's
modified tail drop (see `FlowWfq`).
"""

from __future__ import annotations

from pathmaster import defaults
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


def ios_link_settings(strategy: str, shaped_class: str = "bulk", shaped_rate_kbit: float | None = None,
                      classes: ClassTable = DEFAULT_CLASSES) -> dict:
    """Emulator link settings (`qos.emulator.config.LinkSettings` keys) of one IOS strategy.

    Parameters
    ----------
    strategy : str
        One of `IOS_STRATEGIES`.
    shaped_class, shaped_rate_kbit : str, float
        For "shaping": the class held to `shaped_rate_kbit` kbit/s (required there).
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
        return {"discipline": "fifo", "limit_packets": defaults.HOLD_QUEUE_PACKETS}
    if strategy == "priority":
        return {"discipline": "priority"}  # the bands' own limits, 20/40/60/80
    if strategy == "wfq":
        return {"discipline": "flow_wfq"}
    if strategy in ("cbwfq", "shaping"):
        out = {"discipline": "wfq", "wfq": {"weights": precedence_weights(classes)},
               "limit_packets": defaults.CONGESTIVE_DISCARD_PACKETS}
        if strategy == "shaping":
            if shaped_rate_kbit is None:
                raise ValueError("strategy 'ios-shaping' needs shaped_rate_kbit")
            out["shape"] = {shaped_class: {"rate_kbit": shaped_rate_kbit,
                                           "burst_bytes": defaults.SHAPER_BURST_BYTES}}
        return out
    if strategy == "wred":
        return {"discipline": "wred", "limit_packets": defaults.HOLD_QUEUE_PACKETS,
                "wred": {"defaults": "cisco-precedence", "weight_exponent": defaults.WRED_WEIGHT_EXPONENT}}
    raise ValueError(f"unknown IOS strategy {strategy!r}; known: {', '.join(IOS_STRATEGIES)}")
