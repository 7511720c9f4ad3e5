"""First in, first out with tail drop: the study's baseline router behaviour."""

from __future__ import annotations

from qos.emulator.disciplines.base import TAIL, Discipline, Drops, PacketQueue
from qos.emulator.packet import Packet


class Fifo(Discipline):
    """One queue of at most `limit` packets; an arrival finding it full is dropped."""

    name = "fifo"

    def __init__(self, limit: int = 100):
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
