"""What every queueing discipline shares: a bounded packet FIFO and the scheduler interface.

A discipline decides two things on the link's virtual clock: whether an arriving packet
is admitted (`enqueue` returns the packets it dropped, each with a reason) and which
packet the transmitter sends next (`dequeue`; one that drops at the head, as CoDel does,
hands those packets over by `take_dropped`). Time never advances inside a discipline;
the link passes `now` (seconds) in.
"""

from __future__ import annotations

from collections import deque

from qos.emulator.packet import Packet

# Drop reasons, as they appear in the statistics.
TAIL = "tail"              # the queue's buffer limit was reached
OVERFLOW = "overflow"      # flow fair queuing pushed out a packet of the longest flow
WRED_EARLY = "wred_early"  # WRED random drop between the thresholds
WRED_FORCED = "wred_forced"  # WRED average above the maximum threshold
SHAPER = "shaper"          # the shaper's own buffer was full
LOSS = "loss"              # the link's configured random loss

Drops = list[tuple[Packet, str]]


class PacketQueue:
    """A FIFO of packets that knows its length in packets and bytes and its limit (packets)."""

    __slots__ = ("packets", "bytes", "limit")

    def __init__(self, limit: int):
        if limit < 1:
            raise ValueError(f"queue limit must be at least 1 packet, got {limit}")
        self.packets: deque[Packet] = deque()
        self.bytes = 0
        self.limit = int(limit)

    def __len__(self) -> int:
        return len(self.packets)

    def full(self) -> bool:
        return len(self.packets) >= self.limit

    def push(self, pkt: Packet) -> None:
        self.packets.append(pkt)
        self.bytes += pkt.length

    def pop(self) -> Packet:
        pkt = self.packets.popleft()
        self.bytes -= pkt.length
        return pkt

    def pop_tail(self) -> Packet:
        pkt = self.packets.pop()
        self.bytes -= pkt.length
        return pkt

    def head(self) -> Packet:
        return self.packets[0]


class Discipline:
    """Interface of a scheduler; subclasses implement `enqueue`, `dequeue` and `__len__`."""

    name = "discipline"

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        """Admit `pkt` at time `now`; return the packets dropped (maybe `pkt`) with reasons."""
        raise NotImplementedError

    def dequeue(self, now: float) -> Packet | None:
        """The packet to transmit at `now`, or None when nothing is queued."""
        raise NotImplementedError

    def take_dropped(self) -> Drops:
        """Packets dropped inside `dequeue` since the last call (an AQM that drops at the
        head, e.g. CoDel), with reasons; the link calls it after every `dequeue`."""
        return []

    def __len__(self) -> int:
        raise NotImplementedError

    def backlog_bytes(self) -> int:
        """Bytes queued (for statistics)."""
        raise NotImplementedError

    def snapshot(self) -> dict:
        """Discipline-specific state worth sampling over time (e.g. WRED's average)."""
        return {}
