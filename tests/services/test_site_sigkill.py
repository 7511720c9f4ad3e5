"""A site process SIGKILLed (only it, not its group) leaves no Ray process behind.

The site is the real command with a local Ray of its own. Its processes are the ones in
its session (it is started as a session leader), each known by pid and start time; Ray's
raylet, GCS and agents must be among them, and all must be gone after the kill
(services/fate.py's watchdog).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from services.ray_local import RAY_START_ATTEMPTS


ROOT = Path(__file__).resolve().parents[2]


def processes_in_session(sid: int) -> dict[int, tuple[int, str]]:
    """{pid: (start time, command line)} of the processes in session `sid` (from /proc)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.getsid(pid) != sid:
                continue
            with open(f"/proc/{pid}/stat") as f:
                started = int(f.read().rpartition(")")[2].split()[19])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue  # gone meanwhile
        found[pid] = (started, command)
    return found


def still_running(known: dict[int, tuple[int, str]]) -> dict[int, str]:
    """The processes of `known` still running (same pid and start time)."""
    alive = {}
    for pid, (started, command) in known.items():
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[19]) == started and fields[0] != "Z":
            alive[pid] = command
    return alive


def test_sigkilled_site_takes_its_ray_processes_with_it(site_db, tmp_path):
    (tmp_path / "site.toml").write_text(
        f'[site]\nname = "lone"\ndb = "{site_db}"\nlisten = "127.0.0.1:0"\nworkers = 1\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # its own Ray, not the tests'
    env["PYTHONPATH"] = str(ROOT)
    log = tmp_path / "site.log"
    with open(log, "wb") as out:
        site = subprocess.Popen(
            [sys.executable, "-m", "pathmaster", "serve", "site", "--config", str(tmp_path / "site.toml")],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    known: dict = {}
    try:
        deadline = time.monotonic() + 240
        while not re.search(r"site lone serving on ", log.read_text(errors="replace")):
            if site.poll() is not None and "timed out during startup" in log.read_text(errors="replace"):
                pytest.skip("the site's local Ray did not register within Ray 2.60's fixed 30 s in "
                            f"{RAY_START_ATTEMPTS} tries: this host is too busy for it now")
            assert site.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(0.2)
        known = processes_in_session(site.pid)
        commands = " ".join(command for _, command in known.values())
        assert "raylet" in commands and "gcs_server" in commands and "ray::SiteWorker" in commands, commands
        assert "ray::DashboardAgent" in commands or "ray::RuntimeEnvAgent" in commands, commands

        os.kill(site.pid, signal.SIGKILL)  # the site alone, as the OOM killer or `kill -9 PID` would
        site.wait(10)
        deadline = time.monotonic() + 60
        while still_running(known) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert still_running(known) == {}
    finally:
        if site.poll() is None:
            site.kill()
            site.wait(10)
        for pid in still_running(known):  # never leave anything behind, even on failure
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
