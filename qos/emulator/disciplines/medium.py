"""A shared medium (a hub, half-duplex Ethernet): several senders, one transmitter for all.

On a 10 Mbit/s hub every station, whichever way its frames go, takes turns on one wire:
upload and reply bytes add up against one rate. Each sender (a "station": a host's card,
or a router's interface with its own queueing discipline) keeps its own queue; when the
medium falls idle the stations with something to send take turns, one frame each, which
is how CSMA/CD shares a busy segment among backlogged stations in the long run (the
capture effect and collision back-off are not modelled: a best approximation, not a
simulation of the MAC).
"""

from __future__ import annotations

from qos.emulator.disciplines.base import Discipline, Drops
from qos.emulator.disciplines.fifo import Fifo
from qos.emulator.packet import Packet
from qos.network import HOST_CARD_QUEUE_PACKETS


class SharedMedium(Discipline):
    """Round robin, one packet per turn, over the stations' own disciplines.

    Parameters
    ----------
    stations : dict
        Station name -> its queueing discipline. A packet joins the queue of the station
        named by its `station` attribute; an unknown or empty name joins `default`.
    default : str, optional
        The station of packets that name none (default: the first station).
    """

    name = "medium"

    def __init__(self, stations: dict[str, Discipline], default: str | None = None):
        if not stations:
            raise ValueError("a shared medium needs at least one station")
        self.stations = dict(stations)
        self.default = default if default is not None else next(iter(self.stations))
        if self.default not in self.stations:
            raise ValueError(f"default station {self.default!r} is not one of {', '.join(self.stations)}")
        self._order = list(self.stations)
        self._next = 0

    @classmethod
    def of_cards(cls, names: list[str], limit: int = HOST_CARD_QUEUE_PACKETS) -> "SharedMedium":
        """A medium whose stations are plain cards: a FIFO of `limit` packets each."""
        return cls({name: Fifo(limit) for name in names})

    def add_station(self, name: str, discipline: Discipline) -> None:
        """Another sender on the medium, with its own queue (it joins the end of the turn order)."""
        if name in self.stations:
            raise ValueError(f"medium already has a station {name!r}")
        self.stations[name] = discipline
        self._order.append(name)

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        station = self.stations.get(pkt.station)  # (not `or`: an empty discipline is falsy)
        if station is None:
            station = self.stations[self.default]
        return station.enqueue(pkt, now)

    def dequeue(self, now: float) -> Packet | None:
        n = len(self._order)
        for i in range(n):
            name = self._order[(self._next + i) % n]
            station = self.stations[name]
            if len(station):
                pkt = station.dequeue(now)
                if pkt is not None:  # (None: an AQM station dropped all it held; the next one goes)
                    self._next = (self._next + i + 1) % n
                    return pkt
        return None

    def take_dropped(self) -> Drops:
        return [drop for station in self.stations.values() for drop in station.take_dropped()]

    def __len__(self) -> int:
        return sum(len(s) for s in self.stations.values())

    def backlog_bytes(self) -> int:
        return sum(s.backlog_bytes() for s in self.stations.values())

    def snapshot(self) -> dict:
        out = {}
        for name, station in self.stations.items():
            out.update({f"{name}.{k}": v for k, v in station.snapshot().items()})
        return out
