"""Decide, per site, how to send a case so that it meets its deadline.

The coordinator asks `plan_site` once per site before fan-out. The plan says:

- the **mode**: "features" when the site's index was built with the coordinator's feature
  schema (a few KB per cell on the wire, no analysis at the site), else "images";
- the **class** to travel in, within the user's entitlement: never a class the user may not
  use (a teacher cannot escalate to urgent); an urgent case *steps down* to the next class
  when that class's prediction still meets the deadline with room to spare, leaving urgent
  capacity to cases that need it;
- when to **hedge**: a site that runs past its prediction by a margin is re-issued on a
  more favoured class the user may use (or to a replica, where configured) and the slower
  copy is cancelled;
- **why**, as reason codes (`pathmaster.records.Why`; services/reasons.py has their words).

Predictions come from `qos.predict`; with none yet (a site that has not answered in that
mode or class), the plan keeps the requested class and hedges after a fixed share of the
deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pathmaster.records import Why

# A site request of at most SMALL_REQUEST_BYTES (a features-mode case: ~1 KB a cell) is sent
# as SMALL_REQUEST_COPIES copies at once, each over its own already-open TCP connection to the
# site (a "lane"); the first answer wins and the other copies are cancelled. Behind a full
# drop-tail queue a lost segment stalls its connection for a retransmission timeout (>= 200 ms,
# Linux's minimum) or a tail-loss probe (2 RTT); an independent copy is stalled only if it is
# lost too. Connections are opened before the first case (no SYN, whose first retry waits 1 s,
# is sent at case time). Ours, measured in the testbed (qos/experiment/results/adaptive).
SMALL_REQUEST_BYTES = 16 * 1024
SMALL_REQUEST_COPIES = 3
# ... one after the other, COPY_GAP_S apart (copy k leaves k gaps after the first): a full
# drop-tail queue has a slot or two free at a time, so copies burst into it together meet the
# same full queue and are dropped together; a few ms apart each meets the queue afresh (it
# serves a 1500 B packet in 1.2 ms at 10 Mbit/s). Well under a round trip (~100 ms behind the
# testbed's full queue), the price when the first copy gets through.
COPY_GAP_S = 0.02
MAX_REQUEST_COPIES = 4         # more copies than this are refused in a configuration
MAX_CASE_DEADLINE_S = 3600.0    # a case's own deadline_s above this is refused

STEP_DOWN_HEADROOM = 0.5   # step down only if the lower class is predicted within half the deadline
HEDGE_MARGIN = 0.5         # hedge when a site runs 50% past its prediction ...
HEDGE_MIN_SLACK_S = 0.25   # ... and at least this many seconds past it
HEDGE_UNPREDICTED_SHARE = 0.5  # without a prediction: hedge at half the deadline


@dataclass(frozen=True)
class SitePlan:
    """How one site gets the case; `why` gives each choice's reason code."""

    site: str
    mode: str                    # "features" | "images"
    request_class: str           # the class the case travels in to this site
    predicted_s: float | None    # None: not predictable yet
    hedge_after_s: float | None  # seconds after sending; None: no hedge possible
    hedge_class: str | None      # the class (or replica) a hedge uses
    hedge_site: str | None = None
    why: tuple[Why, ...] = field(default_factory=tuple)
    copies: int = 1              # copies sent, each over its own connection (lane) ...
    copy_gap_s: float = 0.0      # ... copy k this many seconds times k after the first


def choose_mode(schema_matches: bool, ship: str) -> tuple[str, Why]:
    """The shipping mode and why.

    Parameters
    ----------
    schema_matches : bool
        The site's index was built with the coordinator's feature schema.
    ship : str
        The user's choice: "auto", "features" or "images".

    Returns
    -------
    (mode, why)
    """
    if ship == "images":
        return "images", Why("images_requested")
    if schema_matches:
        return "features", Why("features_same_schema")
    if ship == "features":
        return "images", Why("images_other_schema_asked_features")
    return "images", Why("images_other_schema")


def plan_site(site: str, *, requested: str, entitled: list[str], deadline_s: float,
              predict: Callable[[str, str], float | None], schema_matches: bool,
              ship: str = "auto", replica: str | None = None, mode_bytes: dict[str, int] | None = None,
              small_request_bytes: int = SMALL_REQUEST_BYTES,
              small_request_copies: int = SMALL_REQUEST_COPIES,
              copy_gap_s: float = COPY_GAP_S) -> SitePlan:
    """Plan one site's part of a case.

    Parameters
    ----------
    site : str
        The site's name.
    requested : str
        The class the user asked for; must be in `entitled`.
    entitled : list of str
        Classes this user may use, most favoured first (the class table's order).
    deadline_s : float
        Seconds from now by which the case should be complete (> 0).
    predict : callable
        ``predict(request_class, mode) -> seconds or None``.
    schema_matches : bool
        Whether features can be sent to this site.
    ship : str
        "auto", "features" or "images".
    replica : str, optional
        Another site holding the same database, to hedge to when no more favoured class
        is left.
    mode_bytes : dict, optional
        Request bytes per mode ("features", "images"); without it every request is one copy.
    small_request_bytes : int
        A features request of at most this many bytes is small ...
    small_request_copies : int
        ... and is sent as this many copies at once, each over its own connection, the
        first answer winning (1: no copies). Images are never copied (the site would
        analyse them once per copy).
    copy_gap_s : float
        Seconds between one copy and the next (0: all at once).

    Returns
    -------
    SitePlan
    """
    if requested not in entitled:
        raise ValueError(f"class {requested!r} is not among the user's classes {entitled}")
    if not deadline_s > 0:
        raise ValueError(f"deadline must be positive seconds, got {deadline_s!r}")
    mode, why_mode = choose_mode(schema_matches, ship)
    why = [why_mode]
    chosen = requested
    predicted = predict(requested, mode)
    rank = entitled.index(requested)
    if rank == 0 and len(entitled) > 1:
        lower = entitled[1]
        lower_predicted = predict(lower, mode)
        if lower_predicted is not None and lower_predicted <= STEP_DOWN_HEADROOM * deadline_s:
            chosen, predicted = lower, lower_predicted
            why.append(Why("class_stepped_down_within_deadline", {
                "asked": requested, "served": lower, "predicted_s": lower_predicted, "deadline_s": deadline_s}))
    why.append(Why("predicted", {"predicted_s": predicted}) if predicted is not None else Why("no_prediction_yet"))
    favoured = entitled[:entitled.index(chosen)]
    hedge_class, hedge_site = (favoured[-1], None) if favoured else (None, replica)
    hedge_after, why_hedge = _hedge(chosen, predicted, deadline_s, hedge_class, hedge_site)
    why.append(why_hedge)
    copies = 1
    request_bytes = (mode_bytes or {}).get(mode)
    # Only features: a copy of images would make the site analyse them once per copy.
    if mode == "features" and request_bytes is not None and request_bytes <= small_request_bytes \
            and small_request_copies > 1:
        copies = small_request_copies
        params = {"kilobytes": request_bytes / 1000, "copies": copies}
        why.append(Why("small_request_copies", params | {"gap_ms": copy_gap_s * 1000}) if copy_gap_s > 0
                   else Why("small_request_copies_at_once", params))
    return SitePlan(site=site, mode=mode, request_class=chosen, predicted_s=predicted,
                    hedge_after_s=hedge_after, hedge_class=hedge_class, hedge_site=hedge_site,
                    why=tuple(why), copies=copies, copy_gap_s=copy_gap_s if copies > 1 else 0.0)


def _hedge(chosen: str, predicted: float | None, deadline_s: float, hedge_class: str | None,
           hedge_site: str | None) -> tuple[float | None, Why]:
    """Seconds after sending to hedge (None: no hedge) and why."""
    if hedge_class is None and hedge_site is None:
        return None, Why("no_hedge_most_favoured", {"served": chosen})
    if predicted is not None:
        hedge_after = predicted + max(HEDGE_MARGIN * predicted, HEDGE_MIN_SLACK_S)
    else:
        hedge_after = HEDGE_UNPREDICTED_SHARE * deadline_s
    if hedge_after >= deadline_s:
        return None, Why("no_hedge_no_time")
    if hedge_class:
        return hedge_after, Why("hedge_planned_class", {"hedge_class": hedge_class, "after_s": hedge_after})
    return hedge_after, Why("hedge_planned_replica", {"replica": hedge_site, "after_s": hedge_after})
