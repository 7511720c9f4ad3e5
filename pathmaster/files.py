"""Files written so that a reader sees them absent, old or complete, never half-written."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that ``path`` is either absent, old, or complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def remove_orphan_temporaries(site_dir: Path) -> int:
    """Delete temporary files left by ``write_atomic`` in processes that no longer run
    (an ingest killed mid-write); returns how many were removed."""
    removed = 0
    for tmp in Path(site_dir).rglob(".*.tmp"):
        try:
            pid = int(tmp.name.rsplit(".", 2)[-2])
            os.kill(pid, 0)  # raises if no such process
            continue
        except ProcessLookupError:
            pass
        except (ValueError, PermissionError):
            continue  # not ours, or a live process of another user
        tmp.unlink(missing_ok=True)
        removed += 1
    return removed
