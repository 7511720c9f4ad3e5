"""One testbed experiment at a time: the machine lock, held by experiments and by every testbed.

The testbed's hubs and routers are a user-space process sharing the machine's cores with
whatever else runs, so an experiment measures the network only while nothing else builds
testbeds. One lock file (`LOCK_PATH`) says who has the machine:

* an experiment holds it exclusively (`experiment_lock`) for as long as it runs;
* every process that makes a network namespace (`qos.netns.add`: the testbeds of tests, of
  the CLI, of benchmarks) holds it shared (`share`) from its first namespace until it exits.

So an experiment refuses to start beside a test session's testbeds, and a testbed waits at
most `wait_s()` seconds for an experiment to end before it is refused (the test suite's
namespace fixture turns that refusal into a skip that names the holder). `fcntl.flock`, not
a pid file: the kernel drops a lock when its process ends, however it ends. The holders are
named from the file (the experiment writes its label there) and from /proc/locks (the pids of
the shared holders), so a refusal says who to wait for.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import subprocess
import time
from pathlib import Path

from pathmaster.records import InvalidInput

# The project's runtime state (testbed state files, emulator work folders, this lock).
STATE_DIR = Path(os.environ.get("PATHMASTER_TESTBED_STATE", "/run/pathmaster"))
LOCK_PATH = Path(os.environ.get("PATHMASTER_MACHINE_LOCK", STATE_DIR / "experiment.lock"))
# How long a process making namespaces waits for a running experiment (seconds; unset: 0,
# refused at once). The test suite sets it (tests/conftest.py).
WAIT_ENV = "PATHMASTER_MACHINE_WAIT_S"
MAX_WAIT_S = 3600.0
POLL_S = 0.25  # how often a waiting testbed tries the lock again
NAMESPACE_PREFIX = "pm-"

_held: dict[Path, tuple[int, str]] = {}  # lock path -> (fd, "exclusive" | "shared"), this process's


class MachineBusy(InvalidInput):
    """The machine is held by another process.

    `code`: "experiment_running" (an experiment holds it), "testbed_running" (testbeds of other
    processes hold it, or their namespaces exist); `holders`: who, as `holders()` gives them.
    """

    def __init__(self, problem: str, source, code: str, holders: list[dict] | None = None):
        super().__init__(problem, source)
        self.code = code
        self.holders = holders or []


def wait_s() -> float:
    """How long `share` waits for an experiment by default: `WAIT_ENV`, bounded to [0, MAX_WAIT_S]."""
    try:
        value = float(os.environ.get(WAIT_ENV, "0") or 0)
    except ValueError:
        raise InvalidInput(f"{WAIT_ENV} must be a number of seconds, got {os.environ[WAIT_ENV]!r}", WAIT_ENV) from None
    return min(max(value, 0.0), MAX_WAIT_S)


def holders(path: str | Path | None = None) -> list[dict]:
    """Who holds the lock at `path`: [{"pid", "mode": "exclusive" | "shared", "command", "label"?}].

    From /proc/locks (the kernel's table of granted locks, waiters excluded); the exclusive
    holder's label is what it wrote into the file.
    """
    path = Path(path or LOCK_PATH)
    try:
        st = os.stat(path)
        table = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    found = []
    for line in table:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or fields[5] != device:
            continue
        pid = int(fields[4])
        entry = {"pid": pid, "mode": "exclusive" if fields[3] == "WRITE" else "shared", "command": _command(pid)}
        if entry["mode"] == "exclusive":
            try:
                entry["label"] = json.loads(Path(path).read_text() or "{}").get("label")
            except (OSError, ValueError):
                entry["label"] = None
        found.append(entry)
    return found


def describe(found: list[dict]) -> str:
    """`holders()` in a few words: "pid 123 (experiment smoke --out x)", "pids 4, 5 (pytest ...)"."""
    words = []
    for h in found[:4]:
        what = h.get("label") or h.get("command") or "?"
        words.append(f"pid {h['pid']} ({what})")
    return ", ".join(words) + (" ..." if len(found) > 4 else "") if words else "unknown"


def _command(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""
    return raw[:120]


def other_testbeds(own_prefix: str | None = None) -> list[str]:
    """Network namespaces of testbeds (`pm-<tag>-<node>`) other than `own_prefix`'s, by name."""
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(NAMESPACE_PREFIX)
                  and not (own_prefix and n.startswith(own_prefix)))


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def experiment_lock(label: str, path: str | Path | None = None, check_namespaces: bool = True):
    """Hold the machine for one experiment: an exclusive, non-blocking flock on `path`.

    Parameters
    ----------
    label : str
        What holds it (the experiment's name and output folder), written into the lock file
        with the process id and start time, so a refusal names the holder.
    path : path, optional
        The lock file (created; default LOCK_PATH).
    check_namespaces : bool
        Also refuse while any testbed's namespaces exist (one left up by `pathmaster testbed up`).

    Raises
    ------
    MachineBusy
        Another experiment holds the lock, testbeds of other processes hold it shared, or other
        testbeds' namespaces exist.
    """
    path = Path(path or LOCK_PATH)
    fd = _open(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            found = [h for h in holders(path) if h["pid"] != os.getpid()]
            running = any(h["mode"] == "exclusive" for h in found)
            what = "another experiment" if running else "testbeds of other processes (a test session?)"
            raise MachineBusy(f"{what} hold the machine: {describe(found)}; wait for them to finish", path,
                              "experiment_running" if running else "testbed_running", found) from None
        if check_namespaces:
            others = other_testbeds()
            if others:
                raise MachineBusy(f"another testbed runs on this machine (namespaces {', '.join(others[:6])}"
                                  f"{' ...' if len(others) > 6 else ''}); take it down first "
                                  f"(`pathmaster testbed down --tag TAG`)", path, "testbed_running")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "label": label,
                                  "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(), 0)
        _held[path] = (fd, "exclusive")
        yield
    finally:
        if _held.get(path, (None,))[0] == fd:
            del _held[path]
        os.close(fd)  # releases the lock


def share(path: str | Path | None = None, wait: float | None = None) -> None:
    """Hold the machine shared for the rest of this process (idempotent; a no-op in the
    process that holds it exclusively, an experiment building its own testbed).

    Waits at most `wait` seconds (default `wait_s()`) while an experiment holds it, trying
    again every POLL_S; then raises MachineBusy("experiment_running") naming the experiment.
    """
    path = Path(path or LOCK_PATH)
    if path in _held:
        return
    limit = wait_s() if wait is None else min(max(wait, 0.0), MAX_WAIT_S)
    fd = _open(path)
    deadline = time.monotonic() + limit
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= deadline:
                found = holders(path)
                os.close(fd)
                raise MachineBusy(f"an experiment holds the machine: {describe(found)} (waited {limit:g} s)",
                                  path, "experiment_running", found) from None
            time.sleep(POLL_S)
    _held[path] = (fd, "shared")


def release(path: str | Path | None = None) -> None:
    """Give up this process's shared hold on `path` (for tests of the lock; testbeds keep theirs)."""
    path = Path(path or LOCK_PATH)
    entry = _held.get(path)
    if entry and entry[1] == "shared":
        del _held[path]
        os.close(entry[0])
