"""Decide, per site, how to send a case so that it meets its deadline (issue 10 §4).

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
- **why**, in words, for the case summary.

Predictions come from `qos.predict`; with none yet (a site that has not answered in that
mode or class), the plan keeps the requested class and hedges after a fixed share of the
deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from pathmaster import defaults

STEP_DOWN_HEADROOM = 0.5   # step down only if the lower class is predicted within half the deadline
HEDGE_MARGIN = 0.5         # hedge when a site runs 50% past its prediction ...
HEDGE_MIN_SLACK_S = 0.25   # ... and at least this many seconds past it
HEDGE_UNPREDICTED_SHARE = 0.5  # without a prediction: hedge at half the deadline


@dataclass(frozen=True)
class SitePlan:
    """How one site gets the case; `reasons` explain each choice in words."""

    site: str
    mode: str                    # "features" | "images"
    request_class: str           # the class the case travels in to this site
    predicted_s: float | None    # None: not predictable yet
    hedge_after_s: float | None  # seconds after sending; None: no hedge possible
    hedge_class: str | None      # the class (or replica) a hedge uses
    hedge_site: str | None = None
    reasons: tuple[str, ...] = field(default_factory=tuple)
    copies: int = 1              # copies sent, each over its own connection (lane) ...
    copy_gap_s: float = 0.0      # ... copy k this many seconds times k after the first


def choose_mode(schema_matches: bool, ship: str) -> tuple[str, str]:
    """The shipping mode and why.

    Parameters
    ----------
    schema_matches : bool
        The site's index was built with the coordinator's feature schema.
    ship : str
        The user's choice: "auto", "features" or "images".

    Returns
    -------
    (mode, reason)
    """
    if ship == "images":
        return "images", "images requested"
    if schema_matches:
        return "features", "same feature schema: features sent, analysed once"
    if ship == "features":
        return "images", "site has another feature schema: images sent instead"
    return "images", "site has another feature schema: images sent"


def plan_site(site: str, *, requested: str, entitled: list[str], deadline_s: float,
              predict: Callable[[str, str], float | None], schema_matches: bool,
              ship: str = "auto", replica: str | None = None, mode_bytes: dict[str, int] | None = None,
              small_request_bytes: int = defaults.SMALL_REQUEST_BYTES,
              small_request_copies: int = defaults.SMALL_REQUEST_COPIES,
              copy_gap_s: float = defaults.COPY_GAP_S) -> SitePlan:
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
    reasons = [why_mode]
    chosen = requested
    predicted = predict(requested, mode)
    rank = entitled.index(requested)
    if rank == 0 and len(entitled) > 1:
        lower = entitled[1]
        lower_predicted = predict(lower, mode)
        if lower_predicted is not None and lower_predicted <= STEP_DOWN_HEADROOM * deadline_s:
            chosen, predicted = lower, lower_predicted
            reasons.append(f"stepped down to {lower}: predicted {lower_predicted:.2f} s meets the "
                           f"{deadline_s:.1f} s deadline, leaving {requested} capacity to others")
    if predicted is not None:
        reasons.append(f"predicted {predicted:.2f} s")
        hedge_after = predicted + max(HEDGE_MARGIN * predicted, HEDGE_MIN_SLACK_S)
    else:
        reasons.append("no prediction yet")
        hedge_after = HEDGE_UNPREDICTED_SHARE * deadline_s
    favoured = entitled[:entitled.index(chosen)]
    hedge_class, hedge_site = (favoured[-1], None) if favoured else (None, replica)
    if hedge_class is None and hedge_site is None:
        hedge_after = None
        reasons.append(f"no hedge: {chosen} is the most favoured class allowed and no replica")
    elif hedge_after >= deadline_s:
        hedge_after = None
        reasons.append("no hedge: the prediction leaves no time for one before the deadline")
    else:
        target = f"class {hedge_class}" if hedge_class else f"replica {hedge_site}"
        reasons.append(f"hedged on {target} if no answer after {hedge_after:.2f} s")
    copies = 1
    request_bytes = (mode_bytes or {}).get(mode)
    # Only features: a copy of images would make the site analyse them once per copy.
    if mode == "features" and request_bytes is not None and request_bytes <= small_request_bytes \
            and small_request_copies > 1:
        copies = small_request_copies
        when = f"{copy_gap_s * 1000:.0f} ms apart" if copy_gap_s > 0 else "at once"
        reasons.append(f"small request ({request_bytes / 1000:.1f} kB): sent as {copies} copies {when} over "
                       "separate connections, so that one lost packet does not hold the answer up; "
                       "the first answer is used and the other copies are cancelled")
    return SitePlan(site=site, mode=mode, request_class=chosen, predicted_s=predicted,
                    hedge_after_s=hedge_after, hedge_class=hedge_class, hedge_site=hedge_site,
                    reasons=tuple(reasons), copies=copies, copy_gap_s=copy_gap_s if copies > 1 else 0.0)
