"""Urgent admission: a reserved share of capacity for urgent work.

This is IntServ's guaranteed service applied to compute: of `capacity` slots (cases in
flight at the coordinator, or cells in flight at a site), `reserved` are kept for the most
favoured class. The rest are shared, with a cap per class so that a burst of teaching or
bulk work cannot take them all, and a cap per client so that one client cannot fill a class.

- The most favoured class (urgent) takes a reserved slot, else a shared one. When its burst
  exceeds both, the excess is **reclassified** as the next class (routine), not dropped:
  the ticket says so, and the case summary tells the user.
- Another class over its cap (or with no shared slot free) is **refused** with a
  retry-after: the class's recent holding time, which is when a slot is likely to free.
- A client over its own cap is refused the same way.

Admitted work then takes `Turns` where it runs on a shared processor: at most `width` at
once, the most favoured class's first. Under overload a coordinator's own Python work (one
interpreter) is where cases queue; without turns every case in flight shares it alike.

The counting is small enough to write here (a lock and a few counters); no library admits
by class with reservations and reclassification, and the standard library has no
semaphore that serves its waiters by priority.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from contextlib import contextmanager
from dataclasses import dataclass

CASE_SLOTS = 64                 # cases in progress at once at one coordinator
URGENT_RESERVED_SLOTS = 16      # of those, kept for the most favoured class (its guarantee)
CLASS_SHARE = {"teaching": 0.5, "bulk": 0.25}  # most of the shared slots one class may hold
PER_CLIENT_CASES = 16           # cases one client may have in progress at once

HOLD_EWMA_ALPHA = 0.2      # weight of the newest holding time in the retry-after estimate
DEFAULT_RETRY_AFTER_S = 1.0


class Refused(Exception):
    """Not admitted now; `retry_after_s` says when to try again, the message why."""

    def __init__(self, message: str, retry_after_s: float):
        self.retry_after_s = retry_after_s
        super().__init__(message)


@dataclass
class Ticket:
    """An admitted unit of work. `served_as` differs from `requested` when reclassified."""

    requested: str
    served_as: str
    client: str
    reserved: bool
    started: float
    released: bool = False

    @property
    def reclassified(self) -> bool:
        return self.served_as != self.requested


class Admission:
    """Admission by class with a reservation for the most favoured class.

    Parameters
    ----------
    classes : list of str
        Class names, most favoured first (the class table's order).
    capacity : int
        Slots in all (>= 1).
    reserved : int
        Slots only the most favoured class may use (0 <= reserved < capacity).
    class_share : dict, optional
        Class name -> the largest fraction (0-1] of the shared slots it may hold at once.
        Classes not named may use every shared slot.
    per_client : int, optional
        Slots one client may hold at once, over all classes; None: no limit.
    clock : callable, optional
        Monotonic seconds (tests pass a fake).
    """

    def __init__(self, classes: list[str], capacity: int, reserved: int = 0,
                 class_share: dict[str, float] | None = None, per_client: int | None = None,
                 clock=None):
        if capacity < 1 or not 0 <= reserved < capacity:
            raise ValueError(f"need capacity >= 1 and 0 <= reserved < capacity, got {capacity}, {reserved}")
        import time
        self.classes = list(classes)
        self.capacity = capacity
        self.reserved = reserved
        self.shared = capacity - reserved
        self.class_cap = {c: max(1, int(self.shared * share)) for c, share in (class_share or {}).items()}
        self.per_client = per_client
        self._clock = clock or time.monotonic
        self._lock = threading.Lock()
        self._reserved_used = 0
        self._shared_used: dict[str, int] = {}
        self._client_used: dict[str, int] = {}
        self._hold_s: dict[str, float] = {}
        self.reclassified = 0
        self.refused: dict[str, int] = {}

    @property
    def favoured(self) -> str:
        return self.classes[0]

    def in_use(self) -> int:
        with self._lock:
            return self._reserved_used + sum(self._shared_used.values())

    def admit(self, request_class: str, client: str = "") -> Ticket:
        """Admit one unit of work or raise `Refused`."""
        if request_class not in self.classes:
            raise ValueError(f"unknown class {request_class!r}")
        with self._lock:
            if self.per_client is not None and self._client_used.get(client, 0) >= self.per_client:
                self._count_refusal(request_class)
                raise Refused(f"this client already has {self.per_client} cases in progress; "
                              "wait for one to finish", self._retry_after(request_class))
            if request_class == self.favoured and self._reserved_used < self.reserved:
                self._reserved_used += 1
                return self._ticket(request_class, request_class, client, reserved=True)
            served_as = request_class
            if request_class == self.favoured and not self._shared_free(request_class) and len(self.classes) > 1:
                # The burst outgrew the reservation and urgent's shared room: serve it as the
                # next class rather than drop it.
                served_as = self.classes[1]
            if not self._shared_free(served_as):
                self._count_refusal(request_class)
                raise Refused(f"{request_class} work is at its limit here; try again shortly",
                              self._retry_after(served_as))
            self._shared_used[served_as] = self._shared_used.get(served_as, 0) + 1
            if served_as != request_class:
                self.reclassified += 1
            return self._ticket(request_class, served_as, client, reserved=False)

    def release(self, ticket: Ticket) -> None:
        """Give a ticket's slot back (idempotent); its holding time feeds retry-after."""
        with self._lock:
            if ticket.released:
                return
            ticket.released = True
            if ticket.reserved:
                self._reserved_used -= 1
            else:
                self._shared_used[ticket.served_as] -= 1
            self._client_used[ticket.client] -= 1
            held = self._clock() - ticket.started
            old = self._hold_s.get(ticket.served_as)
            self._hold_s[ticket.served_as] = held if old is None else old + HOLD_EWMA_ALPHA * (held - old)

    # ------------------------------------------------------------ inside the lock

    def _shared_free(self, request_class: str) -> bool:
        if sum(self._shared_used.values()) >= self.shared:
            return False
        cap = self.class_cap.get(request_class)
        return cap is None or self._shared_used.get(request_class, 0) < cap

    def _ticket(self, requested: str, served_as: str, client: str, reserved: bool) -> Ticket:
        self._client_used[client] = self._client_used.get(client, 0) + 1
        return Ticket(requested, served_as, client, reserved, self._clock())

    def _retry_after(self, request_class: str) -> float:
        return round(self._hold_s.get(request_class, DEFAULT_RETRY_AFTER_S), 3)

    def _count_refusal(self, request_class: str) -> None:
        self.refused[request_class] = self.refused.get(request_class, 0) + 1


class Turns:
    """At most `width` holders at once; a waiter of a smaller priority number goes first,
    waiters of one priority in the order they came.

    Take a turn only around work that computes: a holder that waits (on the network, on
    another process) keeps every less favoured waiter out for as long.
    """

    def __init__(self, width: int = 1):
        if width < 1:
            raise ValueError(f"need width >= 1, got {width}")
        self._free = width
        self._waiting: list[tuple[int, int]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()

    @contextmanager
    def turn(self, priority: int):
        """Hold a turn for the `with` block, taken at `priority` (0 most favoured)."""
        with self._changed:
            me = (priority, next(self._order))
            heapq.heappush(self._waiting, me)
            while not (self._free and self._waiting[0] == me):
                self._changed.wait()
            heapq.heappop(self._waiting)
            self._free -= 1
            if self._free and self._waiting:
                self._changed.notify_all()
        try:
            yield
        finally:
            with self._changed:
                self._free += 1
                self._changed.notify_all()

    def waiting(self) -> int:
        """Waiters now (for tests and metrics)."""
        with self._changed:
            return len(self._waiting)
