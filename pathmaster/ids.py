"""Identifiers chosen by clients: bounded, checked, shown short, logged as keyed tags.

A case id (possibly an accession number) and a cell id (a file name) travel from a client
through the coordinator to every site and into the case log. Each is bounded in length
and characters (`check_id`), a refused one is shown in messages only by a short prefix
(`shown`), and log lines at INFO name a case by `log_tag`, a keyed digest that tells cases
apart within one process but cannot be turned back into the id. Records kept longer (the
coordinator's case log) name it by `keyed_id`, an HMAC-SHA256 under the deployment's own
secret (`private_secret`: a 0600 file made once), the same for one case across restarts.
Clients make valid cell ids from arbitrary file names with `id_from_name`. The limits live
in ``pathmaster.defaults``.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from pathmaster import defaults
from pathmaster.records import InvalidInput

# A fresh key per process: tags correlate log lines of one run and nothing more.
_TAG_KEY = secrets.token_bytes(16)

ID_RULES = {
    # kind: (maximum characters, regular-expression character class)
    "case id": (defaults.MAX_CASE_ID_CHARS, defaults.CASE_ID_CHARACTERS),
    "cell id": (defaults.MAX_CELL_ID_CHARS, defaults.CELL_ID_CHARACTERS),
    "name": (defaults.MAX_NAME_CHARS, defaults.CASE_ID_CHARACTERS),
}
_PATTERNS = {kind: re.compile(f"[{chars}]+") for kind, (_, chars) in ID_RULES.items()}


def shown(value: str, limit: int = defaults.ECHO_CHARS) -> str:
    """`value` for an error message: its repr when short, else a prefix and its length.

    >>> shown("A" * 4_000_000)
    "'AAAAAAAAAAAAAAAA'... (4000000 characters)"
    """
    if len(value) <= limit:
        return repr(value)
    return f"{value[:limit]!r}... ({len(value)} characters)"


def check_id(value: str, kind: str = "case id", what: str | None = None) -> str:
    """Return `value` when it is a valid identifier of `kind`, else raise InvalidInput.

    Parameters
    ----------
    value : str
        The identifier as the client sent it (non-empty).
    kind : str
        "case id", "cell id" or "name" (a request class or site name); see ``ID_RULES``.
    what : str, optional
        What to call it in messages (default: `kind`), e.g. "request class".

    Raises
    ------
    InvalidInput
        Saying the limit (length or characters) and showing only ``shown(value)``.
    """
    limit, chars = ID_RULES[kind]
    what = what or kind
    if not value:
        raise InvalidInput(f"the {what} is empty")
    if len(value) > limit:
        raise InvalidInput(f"the {what} {shown(value)} is too long: at most {limit} characters")
    if not _PATTERNS[kind].fullmatch(value):
        bad = next(c for c in value if not _PATTERNS[kind].fullmatch(c))
        raise InvalidInput(f"the {what} {shown(value)} has the character {bad!r}; allowed: [{chars}]")
    return value


def id_from_name(name: str, kind: str = "cell id") -> str:
    """A valid identifier of `kind` made from any name (a file name, a path).

    Characters outside the allowed set become '_'; a result over the length limit keeps
    its beginning and ends with '.' and 8 hex digits of the name's SHA-1, so different
    long names stay different. Valid names come back unchanged.
    """
    limit, chars = ID_RULES[kind]
    cleaned = re.sub(f"[^{chars}]", "_", name) or "_"
    if len(cleaned) <= limit and cleaned == name:
        return name
    if len(cleaned) > limit:
        digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        cleaned = f"{cleaned[:limit - 9]}.{digest}"
    return cleaned


def log_tag(identifier: str) -> str:
    """A short keyed digest of `identifier` for log lines at INFO ("c-" + 10 hex digits).

    The same identifier gives the same tag within this process; the key is random per
    process, so a tag cannot be matched against a list of likely accession numbers.
    """
    return "c-" + hmac.new(_TAG_KEY, identifier.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:10]


def keyed_id(identifier: str, key: bytes) -> str:
    """`identifier` as an HMAC-SHA256 under `key` ("h-" + 64 hex digits): the same id gives
    the same name wherever the key is the same, and without the key it cannot be matched
    against a list of likely accession numbers."""
    return "h-" + hmac.new(key, identifier.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()


SECRET_MODE = 0o600


def private_secret(path: Path, nbytes: int = 32) -> str:
    """The secret in the file `path` (hex text), made on first use from `nbytes` random
    bytes, mode 0600 (an existing file is made so). Atomic: processes starting together
    all get the one secret (the first link wins)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        temp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, SECRET_MODE)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(nbytes))
        try:
            os.link(temp, path)  # fails if another process made it first: theirs is kept
        except FileExistsError:
            pass
        finally:
            temp.unlink()
    os.chmod(path, SECRET_MODE)
    return path.read_text().strip()
