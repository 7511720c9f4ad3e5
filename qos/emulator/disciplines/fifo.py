"""First in, first out with tail drop: the study's baseline router behaviour."""

from __future__ import annotations

from qos.cisco import HOLD_QUEUE_PACKETS
from qos.emulator.disciplines.base import TAIL, Discipline, Drops, PacketQueue
from qos.emulator.packet import Packet


class Fifo(Discipline):
    """One queue of at most `limit` packets; an arrival finding it full is dropped.

    The default is Cisco IOS's output hold queue, 40 packets (`hold-queue` command reference:
    "the default output hold-queue limit is 40 packets").
    """

    name = "fifo"

    def __init__(self, limit: int = HOLD_QUEUE_PACKETS):
        self.queue = PacketQueue(limit)

    def enqueue(self, pkt: Packet, now: float) -> Drops:
        if self.queue.full():
            return [(pkt, TAIL)]
        self.queue.push(pkt)
        return []

    def dequeue(self, now: float) -> Packet | None:
        return self.queue.pop() if self.queue else None

    def __len__(self) -> int:
        return len(self.queue)

    def backlog_bytes(self) -> int:
        return self.queue.bytes
