"""The page's users, their sessions and one-time sign-in links, in one SQLite file (0600).

Passwords are argon2id hashes (argon2-cffi's RFC 9106 defaults). Session tokens and link
tokens are random (`secrets.token_urlsafe`) and only their SHA-256 is stored, so a copy of
the file signs nobody in. Each session has its own CSRF token, which every state-changing
request must carry.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import sqlite3
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError


SESSION_S = 8 * 3600           # a signed-in session at the page lasts one working day
LOGIN_LINK_S = 15 * 60         # a one-time sign-in link (the demo prints one) is good this long
LOGIN_ATTEMPTS = 5             # failed sign-ins per name, and per client address, ...
LOGIN_WINDOW_S = 60.0          # ... within this window; more are refused until it passes
MAX_PASSWORD_CHARS = 1024      # a longer password is refused before it is hashed
# Roles of the page's users, and the request classes each may NOT send (a deny-list, so a
# coordinator's own extra classes stay usable): bulk is machine traffic, never a person's;
# a teacher's cases are not intra-operative.
ROLE_REFUSED_CLASSES = {"pathologist": ("bulk",), "teacher": ("urgent", "bulk"), "admin": ()}

ROLES = tuple(ROLE_REFUSED_CLASSES)
NAME_PATTERN = re.compile(r"[A-Za-z0-9._@-]{1,64}")
SCHEMA = """
CREATE TABLE IF NOT EXISTS users (name TEXT PRIMARY KEY, role TEXT NOT NULL, hash TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (token TEXT PRIMARY KEY, name TEXT NOT NULL, csrf TEXT NOT NULL,
                                     expires REAL NOT NULL);
CREATE TABLE IF NOT EXISTS links (token TEXT PRIMARY KEY, name TEXT NOT NULL, expires REAL NOT NULL);
"""


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def may_send(role: str, request_class: str) -> bool:
    """Whether a user of `role` may send a case of `request_class`."""
    return role in ROLE_REFUSED_CLASSES and \
        request_class not in ROLE_REFUSED_CLASSES[role]


@dataclass(frozen=True)
class Session:
    """A signed-in user: `name`, `role`, the session's `csrf` token, `expires` (epoch s)."""

    name: str
    role: str
    csrf: str
    expires: float

    def csrf_ok(self, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(token.encode(), self.csrf.encode())


class Accounts:
    """Users, sessions and links in the SQLite file at `path` (made 0600 when created)."""

    def __init__(self, path: str | Path, session_s: float = SESSION_S):
        self.path = Path(path)
        self.session_s = session_s
        self.hasher = PasswordHasher()
        self._dummy = self.hasher.hash(secrets.token_urlsafe(16))  # unknown names cost a verify too
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
        with self._db() as db:
            # Write-ahead log: reading a session (every request, on the gateway's event loop)
            # never waits for a writer. SQLite gives the -wal and -shm files the file's mode.
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=10)

    # ------------------------------------------------------------------ users
    def add_user(self, name: str, role: str, password: str | None = None) -> None:
        """Add (or replace) user `name` with `role`. password None: the user can sign in
        only by a one-time link."""
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError("a user name is 1-64 letters, digits or . _ @ -")
        if role not in ROLES:
            raise ValueError(f"role {role!r} is not one of {', '.join(ROLES)}")
        if password is not None and not 8 <= len(password) <= MAX_PASSWORD_CHARS:
            raise ValueError(f"a password is 8 to {MAX_PASSWORD_CHARS} characters")
        digest = self.hasher.hash(password if password is not None else secrets.token_urlsafe(32))
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO users VALUES (?, ?, ?)", (name, role, digest))

    def role(self, name: str) -> str | None:
        with self._db() as db:
            row = db.execute("SELECT role FROM users WHERE name = ?", (name,)).fetchone()
        return row[0] if row else None

    def check_password(self, name: str, password: str) -> bool:
        """Whether `password` is `name`'s (same work whether or not the user exists)."""
        if len(password) > MAX_PASSWORD_CHARS:
            return False
        with self._db() as db:
            row = db.execute("SELECT hash FROM users WHERE name = ?", (name,)).fetchone()
        try:
            self.hasher.verify(row[0] if row else self._dummy, password)
        except (VerificationError, InvalidHashError):
            return False
        if row and self.hasher.check_needs_rehash(row[0]):
            with self._db() as db:
                db.execute("UPDATE users SET hash = ? WHERE name = ?", (self.hasher.hash(password), name))
        return row is not None

    # ------------------------------------------------------------------ sessions
    def start_session(self, name: str) -> tuple[str, Session]:
        """A new session for `name`: (the cookie's token, the Session)."""
        role = self.role(name)
        if role is None:
            raise KeyError(name)
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        expires = time.time() + self.session_s
        with self._db() as db:
            db.execute("DELETE FROM sessions WHERE expires < ?", (time.time(),))
            db.execute("INSERT INTO sessions VALUES (?, ?, ?, ?)", (_digest(token), name, csrf, expires))
        return token, Session(name, role, csrf, expires)

    def session(self, token: str | None) -> Session | None:
        """The live session of a cookie's token; None when unknown, forged or expired."""
        if not token or len(token) > 128:
            return None
        with self._db() as db:
            row = db.execute("SELECT s.name, u.role, s.csrf, s.expires FROM sessions s "
                             "JOIN users u ON u.name = s.name WHERE s.token = ?",
                             (_digest(token),)).fetchone()
        if row is None or row[3] < time.time():
            return None
        return Session(*row)

    def end_session(self, token: str | None) -> None:
        if token:
            with self._db() as db:
                db.execute("DELETE FROM sessions WHERE token = ?", (_digest(token),))

    # ------------------------------------------------------------------ one-time links
    def login_link_token(self, name: str, valid_s: float = LOGIN_LINK_S) -> str:
        """A token that signs `name` in once, within `valid_s` seconds."""
        if self.role(name) is None:
            raise KeyError(name)
        token = secrets.token_urlsafe(32)
        with self._db() as db:
            db.execute("INSERT INTO links VALUES (?, ?, ?)", (_digest(token), name, time.time() + valid_s))
        return token

    def redeem_link(self, token: str | None) -> str | None:
        """The user a link's token signs in, used up now; None when unknown, used or expired."""
        if not token or len(token) > 128:
            return None
        with self._db() as db:
            row = db.execute("DELETE FROM links WHERE token = ? RETURNING name, expires",
                             (_digest(token),)).fetchone()
        return row[0] if row and row[1] >= time.time() else None


class LoginThrottle:
    """At most `attempts` failed sign-ins per key (a name, a client address) in a sliding
    `window_s`; thread-safe; remembers at most `max_keys` keys (the oldest are forgotten)."""

    def __init__(self, attempts: int = LOGIN_ATTEMPTS,
                 window_s: float = LOGIN_WINDOW_S, max_keys: int = 10_000):
        self.attempts, self.window_s, self.max_keys = attempts, window_s, max_keys
        self._failures: dict[str, deque] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque:
        failures = self._failures.get(key, deque())
        while failures and failures[0] < now - self.window_s:
            failures.popleft()
        return failures

    def blocked(self, *keys: str) -> bool:
        now = time.monotonic()
        with self._lock:
            return any(len(self._recent(k, now)) >= self.attempts for k in keys)

    def failed(self, *keys: str) -> None:
        now = time.monotonic()
        with self._lock:
            for key in keys:
                failures = self._recent(key, now)
                failures.append(now)
                self._failures.pop(key, None)
                self._failures[key] = failures  # newest last
            while len(self._failures) > self.max_keys:
                self._failures.pop(next(iter(self._failures)))
