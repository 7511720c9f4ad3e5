"""Files the page uploads as soon as the user picks them ("staged"), so that sending a case
carries only their ids and the case reaches the coordinator without an upload first.

A staged file is held in the gateway's memory, per user, under the SHA-256 of its bytes
(its id; the same file picked twice, or a background shared by several cells, is held
once). It is dropped `ttl_s` after it was staged or last used in a case, when its user
signs out or clears the page, and by a sweep every `sweep_s` when nobody asks. What a user
and all users together may hold is bounded (`StagingLimits`).

Only the user who staged a file can use its id: a lookup is in that user's own files, so
another user's id, an expired one and one never staged are alike unknown. Nothing here
logs: no bytes, no file names, no ids.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field

from pathmaster.image.io import ImageHeader
from services.config import MAX_CASE_BYTES
from services.gateway.upload import MAX_CASE_FILES

# Files the page uploads as soon as they are chosen ("staged"), so that sending a case
# carries only their ids. Held in the gateway's memory, per user, keyed by content hash;
# each file is bounded by MAX_FILE_BYTES and MAX_PIXELS (MAX_ANALYSIS_PIXELS for a cell image).
STAGED_TTL_S = 30 * 60         # a staged file not used in a case for this long is dropped
STAGED_USER_FILES = MAX_CASE_FILES          # files one user may have staged at once
STAGED_USER_BYTES = MAX_CASE_BYTES          # bytes one user may have staged at once
STAGED_TOTAL_BYTES = 256 * 1024 * 1024      # bytes staged by all users together (gateway memory)
STAGED_SWEEP_S = 60.0          # how often expired staged files are dropped when nobody asks


@dataclass(frozen=True)
class StagingLimits:
    """What staged files may hold: `ttl_s` seconds unused; per user `user_files` files and
    `user_bytes` bytes; `total_bytes` for all users; expired files swept every `sweep_s`."""

    ttl_s: float = STAGED_TTL_S
    user_files: int = STAGED_USER_FILES
    user_bytes: int = STAGED_USER_BYTES
    total_bytes: int = STAGED_TOTAL_BYTES
    sweep_s: float = STAGED_SWEEP_S


class StagingFull(Exception):
    """A file that would take a user, or the gateway, over its limit. `per_user`: the user's
    own limit (they can clear files), not the gateway's (others' files fill it)."""

    def __init__(self, message: str, per_user: bool):
        super().__init__(message)
        self.per_user = per_user


@dataclass
class StagedFile:
    """One staged file: its bytes, its header (checked when staged), the checks it passed
    (`roles`: "image", "background", "mask", as the names it was staged under say) and
    when it expires (on the store's clock)."""

    data: bytes
    header: ImageHeader
    expires: float
    roles: set[str] = field(default_factory=set)


def content_id(data: bytes) -> str:
    """A staged file's id: the SHA-256 of its bytes, as 64 hex digits."""
    return hashlib.sha256(data).hexdigest()


class StagedFiles:
    """The staged files of every user (thread-safe). `clock`: seconds, monotonic (a test
    may replace it to make files expire)."""

    def __init__(self, limits: StagingLimits = StagingLimits(), clock=time.monotonic):
        self.limits = limits
        self.clock = clock
        self._users: dict[str, dict[str, StagedFile]] = {}
        self._total = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sweeper: threading.Thread | None = None

    # ------------------------------------------------------------------ upkeep
    def start_sweeping(self) -> None:
        """Drop expired files every `limits.sweep_s` from a daemon thread, until `close()`."""
        if self._sweeper is None:
            self._sweeper = threading.Thread(target=self._sweep_loop, name="pathmaster-staged-sweep",
                                             daemon=True)
            self._sweeper.start()

    def _sweep_loop(self) -> None:
        while not self._stop.wait(self.limits.sweep_s):
            self.purge()

    def close(self) -> None:
        """Stop the sweep and drop every staged file."""
        self._stop.set()
        if self._sweeper is not None:
            self._sweeper.join(timeout=5)
        with self._lock:
            self._users.clear()
            self._total = 0

    def purge(self) -> int:
        """Drop the files that have expired; how many were dropped."""
        with self._lock:
            return self._purge_locked(self.clock())

    def _purge_locked(self, now: float) -> int:
        dropped = 0
        for user in list(self._users):
            files = self._users[user]
            for key in [k for k, f in files.items() if f.expires <= now]:
                self._total -= len(files.pop(key).data)
                dropped += 1
            if not files:
                del self._users[user]
        return dropped

    # ------------------------------------------------------------------ use
    @property
    def total_bytes(self) -> int:
        with self._lock:
            return self._total

    def usage(self, user: str) -> tuple[int, int]:
        """(files, bytes) `user` has staged and not expired."""
        with self._lock:
            self._purge_locked(self.clock())
            files = self._users.get(user, {})
            return len(files), sum(len(f.data) for f in files.values())

    def known(self, user: str, file_id: str, role: str) -> StagedFile | None:
        """`user`'s staged file `file_id` if it has passed the checks of `role` (its expiry
        renewed), else None: a file staged again needs no second check."""
        with self._lock:
            now = self.clock()
            self._purge_locked(now)
            staged = self._users.get(user, {}).get(file_id)
            if staged is None or role not in staged.roles:
                return None
            staged.expires = now + self.limits.ttl_s
            return staged

    def check_room(self, user: str, size: int) -> None:
        """Raise StagingFull if `user` could not stage another file of `size` bytes (before
        the work of checking it; `put` decides)."""
        with self._lock:
            self._check_room_locked(user, size, self.clock())

    def _check_room_locked(self, user: str, size: int, now: float) -> None:
        self._purge_locked(now)
        files = self._users.get(user, {})
        held = sum(len(f.data) for f in files.values())
        limits = self.limits
        if len(files) + 1 > limits.user_files:
            raise StagingFull(f"you have {len(files)} files waiting to be sent, the most one person "
                              f"may have; send or clear the case before adding more", per_user=True)
        if held + size > limits.user_bytes:
            raise StagingFull(f"this file would make {(held + size) / 1e6:.1f} MB waiting to be sent, "
                              f"over the {limits.user_bytes / 1e6:.0f} MB one person may have; send "
                              "or clear the case before adding more", per_user=True)
        if self._total + size > limits.total_bytes:
            raise StagingFull("the gateway is holding as many files as it can for all its users; "
                              "try again in a few minutes", per_user=False)

    def put(self, user: str, data: bytes, header: ImageHeader, role: str) -> str:
        """Stage `data` (checked as `role`, with `header`) for `user`; its id. Raises
        StagingFull when over a limit (a file already staged only gains `role`)."""
        file_id = content_id(data)
        with self._lock:
            now = self.clock()
            staged = self._users.get(user, {}).get(file_id)
            if staged is None:
                self._check_room_locked(user, len(data), now)
                staged = StagedFile(data, header, now + self.limits.ttl_s)
                self._users.setdefault(user, {})[file_id] = staged
                self._total += len(data)
            staged.roles.add(role)
            staged.expires = now + self.limits.ttl_s
        return file_id

    def take(self, user: str, refs: list[tuple[str, str]]) -> tuple[dict[str, StagedFile], list[str]]:
        """The files of (name, id) `refs` of `user`'s: ({name: StagedFile}, [names whose id
        `user` has not staged or that expired]). Each file found is renewed for `ttl_s`: a
        case sent again soon (another kind of case) needs no new upload."""
        found: dict[str, StagedFile] = {}
        missing: list[str] = []
        with self._lock:
            now = self.clock()
            self._purge_locked(now)
            files = self._users.get(user, {})
            for name, file_id in refs:
                staged = files.get(file_id)
                if staged is None:
                    missing.append(name)
                    continue
                staged.expires = now + self.limits.ttl_s
                found[name] = staged
        return found, missing

    def discard(self, user: str) -> int:
        """Drop all of `user`'s staged files; how many."""
        with self._lock:
            files = self._users.pop(user, {})
            self._total -= sum(len(f.data) for f in files.values())
            return len(files)
