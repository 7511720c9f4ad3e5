"""A service that dies takes the Ray processes it started with it, even when SIGKILLed.

Ray's own fate sharing (PR_SET_PDEATHSIG on what `ray.init` starts) ends the GCS and the
raylet when the process that started them dies, but not the raylet's agents
(DashboardAgent and RuntimeEnvAgent: ~180 MB left behind per SIGKILLed site), nor the
processes those start.

The choice here is a watchdog. `watch_me()` starts a small watchdog process (in a session
of its own, so a signal to the service's process group does not stop it first) that
waits for the service to end (a pidfd: no polling) and then SIGKILLs what the service
started: (1) every process of the same user whose environment carries the service's
token (`FATE_VARIABLE`, set before Ray starts: Ray's workers and what they start inherit
it, whoever their parent later becomes); (2) the processes the service told it about
(`remember_descendants()`, called once Ray is up: the raylet's agents, which Ray starts
with an environment of their own), each known by pid and start time, so that a pid
reused since is left alone. Why not a process group: only a
signal sent to the whole group would work (`kill -9 PID` or the OOM killer signal one
process), and moving a service out of its terminal's group would stop Ctrl-C reaching it.
Why not PR_SET_PDEATHSIG alone: the agents are the raylet's children, not the service's.
Under systemd, KillMode=control-group does the same for the whole unit; the watchdog
covers every other way of running a site or the coordinator.
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import threading
import time

FATE_VARIABLE = "PATHMASTER_FATE"
KILL_ROUNDS = 5          # processes may start while the first ones die: look again, this often
ROUND_PAUSE_S = 0.2
PARENT_POLL_S = 1.0      # only where pidfds are missing (Linux < 5.3)


_watchdog: subprocess.Popen | None = None
_tell = threading.Lock()  # sites starting side by side tell the watchdog one at a time


def watch_me() -> str:
    """Mark this process's environment (and so every process started from now on) with a
    new token, and start the watchdog that kills them all when this process ends.

    Returns
    -------
    str
        The token. Only on Linux (/proc); elsewhere nothing is done and "" is returned.
    """
    global _watchdog
    if not sys.platform.startswith("linux"):
        return ""
    token = secrets.token_hex(16)
    os.environ[FATE_VARIABLE] = token
    env = {k: v for k, v in os.environ.items() if k != FATE_VARIABLE}
    _watchdog = subprocess.Popen(
        [sys.executable, "-m", "services.fate", str(os.getpid()), token],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True, env=env, text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return token


def remember_descendants() -> list[int]:
    """Tell the watchdog (when there is one) of every process below this one now; their pids."""
    if _watchdog is None or _watchdog.poll() is not None:
        return []
    with _tell:
        found = [pid for pid in descendants(os.getpid()) if pid != _watchdog.pid]
        lines = [f"{pid} {started}\n" for pid in found if (started := _started(pid)) is not None]
        _watchdog.stdin.write("".join(lines))
        _watchdog.stdin.flush()
    return found


def descendants(root: int) -> list[int]:
    """Every process below `root` now (children, their children, ...), from /proc; not `root`."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None:
            children.setdefault(stat[0], []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks since boot) of a process; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
    except OSError:
        return None
    return int(fields[1]), int(fields[19])


def _started(pid: int) -> int | None:
    stat = _stat(pid)
    return None if stat is None else stat[1]


def marked(token: str) -> list[int]:
    """The processes of this user whose environment carries `token` (this one excepted)."""
    needle = f"{FATE_VARIABLE}={token}".encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    found.append(int(name))
        except OSError:
            continue  # gone, or another user's
    return found


def kill_marked(token: str, known: dict[int, int] | None = None) -> int:
    """SIGKILL every process marked with `token`, and each of `known` (pid: start time)
    still running with that start time, looking again a few times; how many."""
    killed = 0
    known = known or {}
    for _ in range(KILL_ROUNDS):
        pids = set(marked(token)) | {pid for pid, started in known.items() if _started(pid) == started}
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
        time.sleep(ROUND_PAUSE_S)
    return killed


def wait_for_exit(pid: int, known: dict[int, int]) -> None:
    """Return when process `pid` (this process's parent) has ended; meanwhile read the
    "PID START" lines it sends on standard input into `known`."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfds here: watch the parent
        while os.getppid() == pid:
            time.sleep(PARENT_POLL_S)
        return
    inputs = [fd, sys.stdin.fileno()]
    try:
        if os.getppid() != pid:  # it ended before the pidfd was open (its pid may be reused)
            return
        while True:
            ready, _, _ = select.select(inputs, [], [])
            if fd in ready:
                return
            data = os.read(sys.stdin.fileno(), 65536)
            if not data:  # the pipe closed: the parent is ending; the pidfd says when
                inputs = [fd]
            for line in data.decode().splitlines():
                child, started = line.split()
                known[int(child)] = int(started)
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    watched, token = int(argv[0]), argv[1]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is for the service
    known: dict[int, int] = {}
    wait_for_exit(watched, known)
    kill_marked(token, known)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
