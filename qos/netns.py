"""Network namespaces: create, run commands inside, find by name prefix, remove with their processes.

Every namespace of a testbed is named ``pm-<tag>-<node>`` (see `namespace_name`), so the
namespaces of one testbed can be found again from the tag alone, also after a crash that
lost the state file. Everything a testbed creates (interfaces, qdiscs, iptables rules,
processes) lives inside its namespaces; deleting a namespace deletes its interfaces and
rules with it, and `delete` kills the processes first (the kernel would not).

A leaf module (beside qos.machine, whose lock every namespace maker holds): the testbed builds its nodes on it and the emulator's launcher runs its
process and iptables rules through it, so neither package has to import the other's.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import time
from pathlib import Path

from qos import machine

PREFIX = "pm"
NETNS_DIR = Path("/run/netns")
TAG_PATTERN = re.compile(r"^[a-z0-9]{1,12}$")


class CommandError(RuntimeError):
    """A command run for the testbed failed; the message names the namespace, command and error."""

    def __init__(self, namespace: str | None, argv: list[str], returncode: int, stderr: str):
        self.namespace = namespace
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr
        where = f"in namespace {namespace}" if namespace else "in the root namespace"
        super().__init__(
            f"{' '.join(argv)!r} {where} failed with exit status {returncode}: {stderr.strip()}"
        )


def check_tag(tag: str) -> str:
    """Return `tag` if it is 1-12 lower-case letters/digits, else raise ValueError.

    The tag must not contain '-' so that the prefix ``pm-<tag>-`` of one testbed is never
    the prefix of another's.
    """
    if not TAG_PATTERN.match(tag):
        raise ValueError(f"testbed tag {tag!r} must be 1-12 characters of a-z and 0-9")
    return tag


def new_tag(prefix: str = "t") -> str:
    """A fresh tag, unique per run (`prefix` + pid + random), for tests and parallel testbeds."""
    return check_tag(f"{prefix}{os.getpid() % 100000}{secrets.token_hex(2)}"[:12])


def namespace_name(tag: str, node: str) -> str:
    """The namespace name of node `node` in the testbed tagged `tag`: ``pm-<tag>-<node>``."""
    return f"{PREFIX}-{check_tag(tag)}-{node}"


def tag_prefix(tag: str) -> str:
    """The name prefix shared by all namespaces of testbed `tag`."""
    return f"{PREFIX}-{check_tag(tag)}-"


def _run(argv: list[str], namespace: str | None, check: bool, timeout: float,
         input: str | None = None) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as exc:
        raise CommandError(namespace, argv, -1, f"timed out after {timeout} s") from exc
    if check and done.returncode != 0:
        raise CommandError(namespace, argv, done.returncode, done.stderr or done.stdout)
    return done


def host_run(argv: list[str], check: bool = True, timeout: float = 30.0,
             input: str | None = None) -> subprocess.CompletedProcess:
    """Run a management command (``ip netns ...``) in the root namespace."""
    return _run(list(argv), None, check, timeout, input)


def exec_argv(namespace: str, argv: list[str]) -> list[str]:
    """The argv that runs `argv` inside `namespace` (``ip netns exec``)."""
    return ["ip", "netns", "exec", namespace, *argv]


def run(namespace: str, argv: list[str], check: bool = True, timeout: float = 30.0,
        input: str | None = None) -> subprocess.CompletedProcess:
    """Run `argv` inside `namespace` and wait for it; raise CommandError on failure if `check`."""
    return _run(exec_argv(namespace, list(argv)), namespace, check, timeout, input)


def popen(namespace: str, argv: list[str], enter_timeout: float = 10.0, **kwargs) -> subprocess.Popen:
    """Start `argv` inside `namespace` without waiting; keyword arguments go to `subprocess.Popen`.

    The process gets its own session so that `stop_process` can signal its whole group
    (``ip netns exec`` execs the command, so the pid is the command's own). Returns once the
    process is inside the namespace (or has already exited): until ``ip netns exec`` has
    switched, `pids` cannot see it and a `delete` right after would leave it running.
    """
    kwargs.setdefault("start_new_session", True)
    proc = subprocess.Popen(exec_argv(namespace, list(argv)), **kwargs)
    try:
        _wait_entered(proc, namespace, enter_timeout)
    except BaseException:
        stop_process(proc, timeout=1)
        raise
    return proc


def _wait_entered(proc: subprocess.Popen, namespace: str, timeout: float) -> None:
    """Poll until `proc`'s network namespace is `namespace` (same nsfs inode, as `ip netns
    identify` compares) or it has exited; TimeoutError after `timeout` s."""
    target = os.stat(NETNS_DIR / namespace)
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        try:
            current = os.stat(f"/proc/{proc.pid}/ns/net")
        except FileNotFoundError:  # exited between poll and stat
            return
        if (current.st_dev, current.st_ino) == (target.st_dev, target.st_ino):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{proc.args!r} did not enter namespace {namespace} within {timeout} s")
        time.sleep(0.001)


def stop_process(proc: subprocess.Popen, timeout: float = 5.0, sig: int = signal.SIGTERM) -> int | None:
    """Signal a process group started by `popen`, wait up to `timeout` s, then kill it; return its exit code."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout)
    return proc.returncode


def exists(namespace: str) -> bool:
    """Whether a named network namespace `namespace` exists."""
    return (NETNS_DIR / namespace).exists()


def list_namespaces(prefix: str = PREFIX + "-") -> list[str]:
    """Names of the existing named network namespaces starting with `prefix`, sorted."""
    out = host_run(["ip", "netns", "list"]).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix))


def add(namespace: str) -> None:
    """Create `namespace` (if missing) with its loopback up.

    This process first holds the machine shared (`qos.machine.share`): a testbed is not built
    beside a running experiment (MachineBusy after the bounded wait)."""
    machine.share()
    if not exists(namespace):
        host_run(["ip", "netns", "add", namespace])
    host_run(["ip", "-n", namespace, "link", "set", "lo", "up"])


def pids(namespace: str) -> list[int]:
    """Process ids running inside `namespace`."""
    done = host_run(["ip", "netns", "pids", namespace], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def pids_running(namespace: str, text: str) -> list[int]:
    """Process ids inside `namespace` whose command line contains `text`."""
    found = []
    for pid in pids(namespace):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # exited meanwhile
            continue
        if text in cmdline:
            found.append(pid)
    return found


def kill_pids(pid_list: list[int], sig: int = signal.SIGTERM) -> None:
    """Send `sig` to each of `pid_list`, ignoring those already gone."""
    for pid in pid_list:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def kill_all(namespace: str, timeout: float = 5.0) -> int:
    """Stop every process inside `namespace` (TERM, then KILL after `timeout` s); return how many there were."""
    victims = pids(namespace)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        kill_pids(victims, sig)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and pids(namespace):
            time.sleep(0.05)
        if not pids(namespace):
            break
    return len(victims)


def delete(namespace: str) -> None:
    """Kill the processes of `namespace`, then delete it (its interfaces and iptables rules go with it)."""
    if not exists(namespace):
        return
    kill_all(namespace)
    host_run(["ip", "netns", "del", namespace], check=False)
    if exists(namespace):
        raise CommandError(None, ["ip", "netns", "del", namespace], 1, "namespace still present")
