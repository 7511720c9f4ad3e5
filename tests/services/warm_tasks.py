"""Tasks for tests/services/test_warm_worker.py, run in analysis worker processes (a
module the workers import by name)."""

from __future__ import annotations

import os
import signal
import sys


def kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def imports_during_analysis(image: bytes, background: bytes = b"", mask: bytes = b"") -> tuple[int, list[str]]:
    """(this worker's pid, the modules one `analyse_encoded` of the cell imported)."""
    from services.analysis import analyse_encoded

    before = set(sys.modules)
    analyse_encoded("first.png", image, background, mask)
    return os.getpid(), sorted(set(sys.modules) - before)
