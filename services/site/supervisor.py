"""A site's Ray workers, kept alive: each dead worker is replaced, with backoff.

Ray restarts nothing here (the actors have max_restarts=0): the site supervises its own
workers so that it knows, and says, when it cannot serve. The supervisor asks each live
worker whether it is alive (`ready`, every `ping_s`; the question waits behind a running
cell, so a busy worker is never mistaken for a dead one: only Ray's RayActorError is
death, and not its ActorUnavailableError, which says Ray lost touch for a moment). A dead worker leaves the dispatcher at once and a replacement is started after
`restart_min_s`; a replacement that fails to start (its database unreadable, Ray out of
CPUs) is tried again after twice the wait, up to `restart_max_s`. `on_change(alive,
total, event)` is called after every event ("started", "died", "replaced", "failed": a
replacement did not start): the site server turns it into gRPC health (NOT_SERVING while
no worker is alive) and metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import ray

from services.config import WORKER_RESTART_MAX_S, WORKER_RESTART_MIN_S
from services.dispatch import PriorityDispatcher

WORKER_PING_S = 1.0              # how often a site asks each Ray worker whether it is alive
WORKER_START_S = 120.0           # a replacement not ready by then is given up and tried again

log = logging.getLogger("pathmaster.site")


class Supervisor:
    """Keeps the dispatcher's workers alive (see the module docstring).

    `start_worker()` makes one new actor (without waiting for it); `name` names the site in
    logs. `restarts` counts replacements that became ready, `failed_starts` those that did
    not, `last_recovery_s` the time from the last death noticed to its replacement ready.
    """

    def __init__(self, name: str, dispatcher: PriorityDispatcher, start_worker: Callable[[], object],
                 on_change: Callable[[int, int, str], None] = lambda alive, total, event: None,
                 ping_s: float = WORKER_PING_S, restart_min_s: float = WORKER_RESTART_MIN_S,
                 restart_max_s: float = WORKER_RESTART_MAX_S, start_s: float = WORKER_START_S):
        self.name = name
        self.dispatcher = dispatcher
        self._start_worker = start_worker
        self._on_change = on_change
        self.ping_s, self.restart_min_s, self.restart_max_s, self.start_s = ping_s, restart_min_s, restart_max_s, start_s
        self.total = len(dispatcher.workers)
        self._alive = set(range(self.total))
        self._pings: dict = {}             # ObjectRef -> worker index
        self._next_ping = dict.fromkeys(range(self.total), 0.0)
        self._starting: dict = {}          # ObjectRef of `ready` -> (index, actor, started)
        self._retry_at: dict[int, float] = {}
        self._delay = dict.fromkeys(range(self.total), restart_min_s)
        self._died_at: dict[int, float] = {}
        self.restarts = 0
        self.failed_starts = 0
        self.last_recovery_s: float | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="site-supervisor")

    def start(self) -> "Supervisor":
        self._on_change(self.alive(), self.total, "started")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for _, actor, _ in self._starting.values():
            ray.kill(actor, no_restart=True)
        self._starting.clear()

    def alive(self) -> int:
        """Workers alive now."""
        with self._lock:
            return len(self._alive)

    # ------------------------------------------------------------------ the loop

    def _run(self) -> None:
        while not self._stop.is_set():
            now = time.monotonic()
            self._send_pings(now)
            self._start_replacements(now)
            self._give_up_slow_starts(now)
            refs = [*self._pings, *self._starting]
            wait_s = self._wait_s(now)
            if not refs:
                self._stop.wait(wait_s)
                continue
            ready, _ = ray.wait(refs, num_returns=1, timeout=wait_s)
            for ref in ready:
                if ref in self._pings:
                    self._pinged(ref)
                else:
                    self._started(ref)

    def _wait_s(self, now: float) -> float:
        """Until the next ping or restart is due (at most ping_s): the loop never spins."""
        due = [self._next_ping[i] for i in self._alive if i not in self._pings.values()]
        due += list(self._retry_at.values())
        return max(0.01, min([self.ping_s, *(t - now for t in due)]))

    def _send_pings(self, now: float) -> None:
        pinged = set(self._pings.values())
        for i in sorted(self._alive - pinged):
            if now >= self._next_ping[i]:
                self._pings[self.dispatcher.workers[i].ready.remote()] = i

    def _pinged(self, ref) -> None:
        i = self._pings.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.ActorUnavailableError as exc:
            # Not death: Ray could not reach the worker for a moment (a loaded host). Replacing
            # it left the site with no worker for as long as a new one took to load (tens of
            # seconds there), and every call failed meanwhile. Ask again at the next ping.
            log.info("site %s: worker %d did not answer a ping (%s); asking again", self.name, i,
                     type(exc).__name__)
        except ray.exceptions.RayActorError as exc:
            self._died(i, exc)
            return
        self._next_ping[i] = time.monotonic() + self.ping_s

    def _died(self, i: int, exc: BaseException) -> None:
        now = time.monotonic()
        with self._lock:
            self._alive.discard(i)
            alive = len(self._alive)
        self.dispatcher.worker_down(i)
        self._died_at[i] = now
        self._retry_at[i] = now + self._delay[i]
        log.warning("site %s: worker %d died (%s); %d of %d alive, replacing it in %.1f s", self.name, i,
                    type(exc).__name__, alive, self.total, self._delay[i])
        self._on_change(alive, self.total, "died")

    def _start_replacements(self, now: float) -> None:
        for i, at in list(self._retry_at.items()):
            if now >= at:
                del self._retry_at[i]
                try:
                    actor = self._start_worker()
                except Exception as exc:  # noqa: BLE001 - Ray refused to even create it: try later
                    self._failed(i, None, exc)
                    continue
                self._starting[actor.ready.remote()] = (i, actor, now)

    def _give_up_slow_starts(self, now: float) -> None:
        for ref, (i, actor, started) in list(self._starting.items()):
            if now - started > self.start_s:
                del self._starting[ref]
                self._failed(i, actor, TimeoutError(f"not ready after {self.start_s:.0f} s"))

    def _started(self, ref) -> None:
        i, actor, _ = self._starting.pop(ref)
        try:
            ray.get(ref)
        except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError) as exc:
            self._failed(i, actor, exc)
            return
        self.dispatcher.replace(i, actor)
        now = time.monotonic()
        with self._lock:
            self._alive.add(i)
            alive = len(self._alive)
            self.restarts += 1
            self.last_recovery_s = now - self._died_at.pop(i, now)
        self._delay[i] = self.restart_min_s
        self._next_ping[i] = now + self.ping_s
        log.info("site %s: worker %d replaced after %.1f s; %d of %d alive", self.name, i,
                 self.last_recovery_s, alive, self.total)
        self._on_change(alive, self.total, "replaced")

    def _failed(self, i: int, actor, exc: BaseException) -> None:
        if actor is not None:
            ray.kill(actor, no_restart=True)
        with self._lock:
            self.failed_starts += 1
        self._delay[i] = min(self._delay[i] * 2, self.restart_max_s)
        self._retry_at[i] = time.monotonic() + self._delay[i]
        cause = getattr(exc, "cause", None) or exc
        log.warning("site %s: worker %d could not be replaced (%s: %s); next attempt in %.1f s", self.name, i,
                    type(cause).__name__, str(cause).splitlines()[0][:200] if str(cause) else "", self._delay[i])
        self._on_change(self.alive(), self.total, "failed")
