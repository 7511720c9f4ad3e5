"""Tasks for tests/core/analysis/test_budget.py, run in the analysis pool's worker processes (so
they live in a module the workers can import by name)."""

from __future__ import annotations

import os
import signal
import time


def double(x):
    return 2 * x


def worker_pid() -> int:
    return os.getpid()


def burn_cpu():
    """Never returns: only the CPU budget stops it."""
    n = 0
    while True:
        n += 1


def exit_now(code: int = 3):
    os._exit(code)


def kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def allocate(step_bytes: int = 64 * 2**20):
    """Touches ever more memory until the worker's limit stops it."""
    held = []
    while True:
        held.append(bytearray(step_bytes))  # bytearray(n) writes its zeros: resident


def block(seconds: float):
    time.sleep(seconds)  # uses no CPU: only the wall-clock limit stops it
    return seconds


def refuse(message: str):
    raise ValueError(message)


def thread_settings() -> dict:
    return {name: os.environ.get(name) for name in
            ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def announce_and_block(path: str, seconds: float) -> float:
    """Writes this worker's pid to `path` (the task has started), then blocks."""
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(seconds)
    return seconds


def mapped_bytes_holding(n_bytes: int) -> int:
    """Bytes glibc holds in separately mapped chunks while an n_bytes buffer is alive
    (mallinfo2's hblkhd): the buffer's size when it got its own mapping, ~0 when it came
    from the heap (an analysis worker keeps freed memory: pathmaster.analysis.budget.keep_freed_memory)."""
    import ctypes
    import ctypes.util

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                          "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.mallinfo2.restype = MallInfo2
    held = bytearray(n_bytes)
    mapped = libc.mallinfo2().hblkhd
    del held
    return int(mapped)


def sigterm_is_default() -> bool:
    """Whether SIGTERM ends this worker at once (its default action), whatever handler the
    fork server had."""
    return signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
