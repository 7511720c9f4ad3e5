"""The physical lower bound on one run's completion time (BRIEF §6).

No schedule can beat the time the bytes need at the links' rates, plus the propagation
delay they cross, plus the work that cannot overlap the transfer (a site can only
analyse cells it has received; its reply can only leave once analysed; a features request
can only leave once the coordinator has analysed the cells, `prior_s`). From the bytes a
run actually moved and the link settings, the bound is the largest of:

1. per site: the master's work its request waits for, its upload over its path's slowest
   link, its own work, its reply over the same path, and one round trip of the core's delay
   if the site lies behind the core;
2. the core link: every byte to the sites behind the core crosses it one after another,
   then at least the quickest of those sites still has to work and reply; and, for each
   site's `prior_s` = p, the same for the sites that wait at least p, begun at p;
3. the master's own link: the same over every site.

Bytes are application payload, so protocol headers, the TCP handshake and slow start are
left out: the bound is optimistic, which is what a lower bound must be. A measured time
over its bound is >= 1; how far above 1 says how much the network, not physics, cost.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SiteTransfer:
    """What one site's part of a run moved and spent."""

    site: str
    bytes_up: int  # master -> site (cells, backgrounds, masks)
    bytes_down: int  # site -> master (matches, thumbnails)
    compute_s: float = 0.0  # the site's own work (analysis + search), measured at the site
    behind_core: bool = True  # whether the path crosses the core (bottleneck) link
    # The master's work the site's request cannot leave before, seconds: in features mode the
    # coordinator's analysis of the case's cells (a features request carries them all); else 0.
    prior_s: float = 0.0


@dataclass(frozen=True)
class Bound:
    """The lower bound in seconds and the term that set it."""

    total_s: float
    per_site_s: float
    core_s: float
    master_link_s: float

    @property
    def limited_by(self) -> str:
        terms = {"site path": self.per_site_s, "core link": self.core_s, "master link": self.master_link_s}
        return max(terms, key=terms.get)

    def to_dict(self) -> dict:
        return {"total_s": self.total_s, "per_site_s": self.per_site_s, "core_s": self.core_s,
                "master_link_s": self.master_link_s, "limited_by": self.limited_by}


def lower_bound(sites: list[SiteTransfer], core_kbit: float, access_kbit: float,
                core_delay_ms: float = 0.0, shared_medium: bool = False) -> Bound:
    """The physical lower bound of one run, in seconds.

    sites: what each site moved (bytes), spent (compute_s, seconds) and waited for at the
        master before its request could leave (prior_s, seconds).
    core_kbit, access_kbit: core (bottleneck) and host-link rates in kbit/s (1000 bit/s).
    core_delay_ms: one-way propagation delay added on the core link, in milliseconds.
    shared_medium: the links are hubs (the 2002 network): one medium for both directions, so
        every remote site's upload and reply bytes add up on the master's hub and the routers'
        hub; a site not behind the core is the master itself and moves nothing over a wire.
    """
    if not sites:
        raise ValueError("a run with no sites has no bound")
    if core_kbit <= 0 or access_kbit <= 0:
        raise ValueError(f"link rates must be > 0 (core {core_kbit}, access {access_kbit} kbit/s)")
    core_bps = core_kbit * 1000 / 8  # bytes per second
    access_bps = access_kbit * 1000 / 8
    one_way = core_delay_ms / 1000

    def path_rate(s: SiteTransfer) -> float:
        return min(core_bps, access_bps) if s.behind_core else access_bps

    def tail(s: SiteTransfer) -> float:
        """What is left for a site once its last request byte has crossed: work, reply, way back."""
        delay = one_way if s.behind_core else 0.0
        return delay + s.compute_s + s.bytes_down / path_rate(s) + delay

    if shared_medium:
        return _shared_medium_bound(sites, min(core_bps, access_bps), one_way)
    per_site = max(s.prior_s + s.bytes_up / path_rate(s) + tail(s) for s in sites)
    core = _queued([s for s in sites if s.behind_core], min(core_bps, access_bps), tail)
    master_link = _queued(sites, access_bps, tail)
    return Bound(max(per_site, core, master_link), per_site, core, master_link)


def _waiting(sites: list[SiteTransfer]) -> list[tuple[float, list[SiteTransfer]]]:
    """For each distinct `prior_s` p of `sites`: (p, the sites whose requests wait at least p).
    None of those sites' bytes can cross a link before p."""
    return [(p, [s for s in sites if s.prior_s >= p]) for p in sorted({s.prior_s for s in sites})]


def _queued(sites: list[SiteTransfer], rate: float, tail) -> float:
    """One link of `rate` bytes/s carrying `sites`' uploads one after another: for each wait p,
    p + the uploads of the sites that wait at least p + the quickest of those sites' `tail`
    (its work and reply after its last request byte); 0 with no sites."""
    return max((p + sum(s.bytes_up for s in later) / rate + min(tail(s) for s in later)
                for p, later in _waiting(sites)), default=0.0)


def _shared_medium_bound(sites: list[SiteTransfer], rate: float, one_way: float) -> Bound:
    """`lower_bound` on hubs: `rate` bytes/s is the one medium both directions share."""
    remote = [s for s in sites if s.behind_core]
    delay = 2 * one_way

    def alone(s: SiteTransfer) -> float:
        if not s.behind_core:
            return s.prior_s + s.compute_s  # the master's own site: no wire
        return s.prior_s + s.bytes_up / rate + s.compute_s + s.bytes_down / rate + delay

    per_site = max(alone(s) for s in sites)
    # The medium carries every byte both ways; and once the last upload has crossed it, at
    # least the quickest site still works and replies over it. Sites whose requests wait for
    # the master's work (prior_s) put none of their bytes on it before then.
    both_ways = max((p + sum(s.bytes_up + s.bytes_down for s in later) / rate + delay
                     for p, later in _waiting(remote)), default=0.0)
    media = max(both_ways, _queued(remote, rate, lambda s: s.compute_s + s.bytes_down / rate + delay))
    # The master's hub and the routers' hub carry the same bytes: one term for both.
    return Bound(max(per_site, media), per_site, media, media)
