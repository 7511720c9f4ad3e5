"""The gateway's audit log: who did what at the page, when, and from where.

One JSON object per line, appended (O_APPEND) to a file made with mode 0600: "at" (UTC,
ISO 8601), "user", "role", "from" (the client's address), "action" (sign-in,
sign-in-refused, sign-out, case, case-refused, case-done, image) and what the action was
about: a case's class, its number of cells and the coordinator's case id; an image's site
and database cell id. Never image bytes and never file names (they can name a patient).
"""

from __future__ import annotations

import json
import os
import threading
from datetime import datetime, timezone
from pathlib import Path

AUDIT_LOG_MODE = 0o600


class AuditLog:
    """Append-only JSON lines at `path` (created 0600; an existing file keeps its mode)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, AUDIT_LOG_MODE)
        self._lock = threading.Lock()

    def record(self, action: str, user: str | None, role: str | None, client: str | None,
               **about) -> None:
        """Append one line. `about`: plain values (numbers, short names), never file contents."""
        entry = {"at": datetime.now(timezone.utc).isoformat(timespec="milliseconds"),
                 "user": user, "role": role, "from": client, "action": action, **about}
        line = (json.dumps(entry, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)  # one write per line: whole lines even with other writers

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
