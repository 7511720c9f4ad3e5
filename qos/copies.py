"""A server's memory of the sends it has taken, so that a copy of one is refused.

A client sends a small request as several copies over separate connections
(`qos.policy.plan_site`); the server answers the first to arrive and refuses the others
(ALREADY_EXISTS), so one reply crosses the network, not one per copy.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

import grpc
from cachetools import TTLCache

from qos.authz import caller_identity

# A site remembers the requests it has taken for COPY_MEMORY_S seconds (at most
# COPY_MEMORY_ENTRIES of them) and refuses a copy of one (qos.transport.CopyFilter): the
# copies cost the way there a few KB each, the way back one reply, not one per copy.
COPY_MEMORY_S = 120.0
COPY_MEMORY_ENTRIES = 4096

MAX_SEND_ID_CHARS = 64  # AnalyseRequest.send_id: a client-chosen value, bounded


class CopyFilter:
    """A server's memory of the sends it has taken, so that a copy of one that arrives over
    another connection (a client sends a small request as several copies at once,
    `qos.policy.plan_site`) is refused instead of answered again: one reply crosses the
    network, not one per copy.

    A send is known by its caller and its send id (AnalyseRequest.send_id), never by the
    client's case id: a case sent again under the same id, a retry and a hedge are new
    sends with ids of their own. An id is remembered for `memory_s` seconds, at most
    `entries` of them (the oldest forgotten first).
    """

    def __init__(self, memory_s: float = COPY_MEMORY_S, entries: int = COPY_MEMORY_ENTRIES,
                 clock: Callable[[], float] = time.monotonic):
        self.memory_s = memory_s
        self.entries = entries
        self._seen: TTLCache = TTLCache(maxsize=entries, ttl=memory_s, timer=clock)
        self._lock = threading.Lock()

    def first(self, key: tuple) -> bool:
        """True the first time `key` is seen (within the memory), False for a copy."""
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = True  # a full memory forgets its oldest first (TTLCache's LRU order)
            return True

    def refuse_copy(self, context: grpc.ServicerContext, send_id: str) -> None:
        """Abort the call with ALREADY_EXISTS when it is a copy of a send already taken
        (calls without a send id are never copies); a send id longer than MAX_SEND_ID_CHARS
        is INVALID_ARGUMENT."""
        if len(send_id) > MAX_SEND_ID_CHARS:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"the send id is too long: at most {MAX_SEND_ID_CHARS} characters")
        # The caller, not its connection: the copies of one send come over several.
        if send_id and not self.first((caller_identity(context), send_id)):
            context.abort(grpc.StatusCode.ALREADY_EXISTS,
                          "this send is already answered on another connection: this copy is not needed")
