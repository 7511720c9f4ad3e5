"""The 2002 network (`network = "2002"`): 10 Mbit/s cards on hubs, as seed 000 describes it.

"Nine Pentium III workstations on a local ethernet at 10 Mbps"; each subcluster's three
"linked to a Cisco 1600 series router via a hub"; "the three routers are in turn linked via a
hub". A hub is one half-duplex medium: one frame at a time, whichever way it goes. So:

* every host's link is its card: a 10 Mbit/s FIFO (kernel htb + pfifo, Linux 2.4's 100
  packets) on the host's end of its veth;
* each subnet's hub is one user-space shared medium (`qos.emulator`, `medium`) in router rX
  on what rX forwards to or from its LAN: one station per host (its card's frames, by source
  address) and one for the router (its Ethernet interface's queue, where the strategy runs);
* the routers' hub is one shared medium in `core` on everything `core` forwards, one station
  per router (each router's interface toward the segment, running the strategy).

Where QoS lives (`Testbed.set_strategy(..., at="hosts")`): the same strategy can run on every
host's own outgoing queue instead (host-side scheduling, as Q-Pod does), the routers then
plain IOS FIFO. A host's card is then its hub station alone, running the strategy (its end of
the veth unshaped: one queue per card, where the router-side runs have the card's kernel FIFO
and then its FIFO station).

Why the emulator and not the kernel: a medium shared by both directions needs one queue fed
by two interfaces' egress; the kernel here has no IFB to join them, and tc cannot share one
htb between two devices. NFQUEUE in the router's FORWARD chain sees both directions of its
LAN in one process, and `core` sees every inter-subnet frame exactly once. What this leaves
out: frames between two hosts of one subnet are bridged inside rX and never reach FORWARD
(the study's workload sends none over the wire: the master's local site is the master
itself); collisions and back-off are not modelled (stations take turns, one frame each); a
host's frames wait first in its card (kernel, 100 packets) and then, while the hub is busy, in
its station (another 100). A shaped class (strategy "ios-shaping") is shaped at one station:
`shaped_at = "router"`, the study's, at the master's router's port toward the shared segment
(rA's station on the routers' hub), where IOS's `traffic-shape` on that interface would hold
the competing downloads; `"host"`, at the master's own card (its station on hub A), the
host-side variant. Every other station runs the same discipline unshaped.
"""

from __future__ import annotations

from qos.emulator.launch import settings_from_strategy
from qos.network import HOST_CARD_QUEUE_PACKETS


CARD = {"discipline": "fifo", "limit_packets": HOST_CARD_QUEUE_PACKETS}
ROUTER_FIFO = {"strategy": "ios-fifo"}  # the routers while the hosts run the strategy


def station_settings(discipline: dict, rate_kbit: float, overhead_bytes: int) -> dict:
    """A router's station on a hub: the strategy's emulator link settings at the hub's rate.

    Parameters
    ----------
    discipline : dict
        A testbed discipline table ({"strategy": "ios-wfq"}, {"strategy": "fifo", ...}).
    rate_kbit : float
        The medium's rate, kbit/s.
    overhead_bytes : int
        Bytes counted per packet beyond the IP packet.

    Returns
    -------
    dict
        Emulator link settings (`qos.emulator.config.LinkSettings` keys).
    """
    return settings_from_strategy({"rate_kbit": rate_kbit, "overhead_bytes": overhead_bytes, **discipline})


def split_shaping(discipline: dict) -> tuple[dict, str | None]:
    """(the discipline without its shaper, where the shaper goes: "router", "host" or None).

    An "ios-shaping" table becomes its base strategy ("ios-wfq" or "ios-cbwfq") everywhere
    but at the one station `shaped_at` names (default "router")."""
    if discipline.get("strategy") != "ios-shaping":
        return discipline, None
    base = {k: v for k, v in discipline.items() if not k.startswith("shaped_")}
    base["strategy"] = "ios-" + discipline.get("shaped_base", "cbwfq")
    return base, discipline.get("shaped_at", "router")


def subnet_hub(lan: str, router: str, hosts: dict[str, str], router_settings: dict,
               host_settings: dict | None = None, overrides: dict | None = None) -> dict:
    """The emulator configuration of one subnet's hub, run in its router.

    Parameters
    ----------
    lan : str
        The router's LAN interface (the bridge holding its address).
    router : str
        The router's name (its station).
    hosts : dict
        Host name -> IPv4 address, one station each (their cards' frames, by source address).
    router_settings : dict
        The router's station (`station_settings`); its rate and overhead are the medium's.
    host_settings : dict, optional
        Every host's station (`station_settings`): the strategy on the hosts' own outgoing
        queues. Default: a card's FIFO (`CARD`), behind the card's kernel FIFO.
    overrides : dict, optional
        Station name -> its own settings (a host's card shaping its competing class).

    Returns
    -------
    dict
        An emulator configuration: one link per station, all on medium "hub".
    """
    medium = {"rate_kbit": router_settings["rate_kbit"], "overhead_bytes": router_settings.get("overhead_bytes", 0)}
    card = {**medium, **CARD} if host_settings is None else host_settings
    links = {router: {**router_settings, "forward": {"queue": 0, "out": lan, "medium": "hub"}}}
    for i, (name, ip) in enumerate(hosts.items(), start=1):
        settings = (overrides or {}).get(name, card)
        links[name] = {**settings, "forward": {"queue": i, "in": lan, "match": ["-s", ip], "medium": "hub"}}
    return {"link": links}


def core_hub(uplinks: dict[str, str], router_settings: dict, overrides: dict | None = None) -> dict:
    """The emulator configuration of the routers' hub, run in `core`.

    Parameters
    ----------
    uplinks : dict
        Router name -> core's interface toward it (frames that router put on the segment).
    router_settings : dict
        Each router's station (`station_settings`).
    overrides : dict, optional
        Router name -> its own station settings (the port that shapes the competing class).

    Returns
    -------
    dict
        An emulator configuration: one link per router, all on medium "core".
    """
    return {"link": {router: {**(overrides or {}).get(router, router_settings),
                              "forward": {"queue": i, "in": intf, "medium": "core"}}
                     for i, (router, intf) in enumerate(uplinks.items())}}
