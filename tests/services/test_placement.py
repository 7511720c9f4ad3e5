"""Site actors pinned to the nodes that hold their data.

A two-node Ray cluster on this machine, started the way an operator starts one (`ray start`,
token authentication on, the token in a file): a head on 127.0.0.2 without the site's resource and a second node
on 127.0.0.3 that offers `site_db_placement`. A site whose `ray_resource` names it must have
every worker (and its index build) on the second node; a resource that no node offers must
fail the start with a message naming it, not hang. Each `ray start` runs in a session of its
own, and every process of those sessions is killed at the end.
"""

from __future__ import annotations

import errno
import json
import os
import random
import secrets
import signal
import socket
import subprocess
import shutil
import sys
import time
from pathlib import Path

import pytest

from pathmaster.environment import environment_program
from services.ray_local import cluster_environment

REPO = Path(__file__).resolve().parents[2]
HEAD_IP, NODE_IP = "127.0.0.2", "127.0.0.3"   # two loopback addresses: two nodes, never off the host
RESOURCE = "site_db_placement"
START_S = 240    # one `ray start` on a busy 2-core machine; bounds the test, not a measurement
DRIVER_S = 300
ATTEMPTS = 2
# How long a start waits for a resource no node offers before refusing: the whole wait is
# spent (nothing can satisfy it), so it is short; the refusal does not depend on its length.
REFUSE_S = 1.0


FIRST_PORT = 20000   # above Ray's worker ports (10002-19999 by default)


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports, each free on every address of the host now, between FIRST_PORT
    and the kernel's ephemeral range. Ray on a routable node IP binds its GCS, raylet and
    workers on all interfaces: a port probed free on the node's own address alone can be
    another process's on 127.0.0.1 (a raylet that cannot bind aborts, and `ray start` waits
    for it until the test's deadline), and a port from the ephemeral range can be handed to
    any connection's local end before Ray binds it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert low > FIRST_PORT + 100, f"the ephemeral ports start at {low}: no room below them"
    choices = random.Random()
    ports: list[int] = []
    for _ in range(1000):
        port = choices.randrange(FIRST_PORT, low)
        if port not in ports and _free_everywhere(port):
            ports.append(port)
            if len(ports) == count:
                return ports
    pytest.fail(f"no {count} free ports between {FIRST_PORT} and {low}")


def _free_everywhere(port: int) -> bool:
    """True when `port` can be bound on the wildcard address (IPv6 and IPv4, or IPv4 alone)."""
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family) as probe:
                probe.bind((address, port))
                return True
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return False   # else: no IPv6 here, try IPv4
    return False


def _session_pids(sid: int) -> list[int]:
    """Every live (not zombie) process of session `sid` (what one `ray start` left running)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            state, _ppid, _pgrp, session = stat.rsplit(")", 1)[1].split()[:4]
            if int(session) == sid and state != "Z":
                pids.append(int(entry))
    return pids


def _kill_sessions(sessions: list[int]) -> list[int]:
    """SIGKILL every process of these sessions; the pids still alive after a bounded wait."""
    for sid in sessions:
        for pid in _session_pids(sid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    left: list[int] = []
    for _ in range(100):   # a SIGKILLed process is gone once the kernel has reaped it
        left = [pid for sid in sessions for pid in _session_pids(sid)]
        if not left:
            break
        time.sleep(0.1)
    return left


class AgentTooSlow(Exception):
    """Ray 2.60's raylet waits a fixed ~15 s for its dashboard agent to report its ports and
    aborts when the agent is slower (a starved host: its imports took 11-17 s of wall time
    for 2 s of CPU here); `ray start` then hangs instead of failing."""


def _raylet_fatal(temp: Path) -> str:
    """A raylet's fatal line ("Check failed": it aborted, e.g. a port it could not bind or
    an agent's port file it waited for in vain), else ""."""
    for log in temp.glob("session_*/logs/raylet*.err"):
        for line in log.read_text(errors="replace").splitlines():
            if "Check failed" in line:
                return f"{log.name}: {line.split('Check failed', 1)[1].lstrip(': ')[:300]}"
    return ""


def _logs_tail(temp: Path, lines: int = 3) -> str:
    """The last `lines` lines of each non-empty log of the nodes under `temp` (the temp
    directory is removed when the test ends)."""
    tails = []
    for log in sorted(temp.glob("session_*/logs/*")):
        if log.is_file() and log.suffix in (".err", ".out", ".log") and log.stat().st_size:
            text = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"{log.name}: " + " | ".join(line[:300] for line in text))
    return "\n".join(tails) or "(none)"


NODE_PORTS = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")
HEAD_PORTS = ("port", "dashboard-port", "ray-client-server-port")


def _ray_start(ip: str, extra: list[str], ports: dict[str, int], env: dict, temp: Path, log: Path,
               sessions: list[int]) -> None:
    """`ray start` one node on `ip` with `ports` ({flag: port}: every port it opens)."""
    args = [environment_program("ray"), "start", f"--node-ip-address={ip}", "--num-cpus=1", "--disable-usage-stats",
            *(f"--{flag}={port}" for flag, port in ports.items()), *extra]
    with log.open("w") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    sessions.append(proc.pid)  # its session id: the node's processes stay in it
    deadline = time.monotonic() + START_S
    while proc.poll() is None:
        fatal = _raylet_fatal(temp)
        if "Timed out waiting for file" in fatal:
            raise AgentTooSlow(f"ray start on {ip}: a raylet gave up waiting for its agent ({fatal})")
        if fatal:   # `ray start` would wait for it until the deadline
            pytest.fail(f"ray start on {ip}: a raylet aborted ({fatal}); ports {ports}; log: {log}")
        if time.monotonic() > deadline:
            pytest.fail(f"ray start on {ip} did not finish in {START_S} s; ports {ports}; its output:\n"
                        f"{log.read_text()[-2000:]}\nthe node's logs, last lines:\n{_logs_tail(temp)}")
        time.sleep(0.5)   # polling `ray start`'s exit and the raylet's log, not waiting out a guess
    assert proc.returncode == 0, f"ray start on {ip} failed ({proc.returncode}):\n{log.read_text()[-3000:]}"


def _start_cluster(env: dict, temp: Path, logs: Path, sessions: list[int]) -> str:
    free = iter(_free_ports(len(HEAD_PORTS) + 2 * len(NODE_PORTS)))   # one cluster: no port twice
    head = {flag: next(free) for flag in (*HEAD_PORTS, *NODE_PORTS)}
    node = {flag: next(free) for flag in NODE_PORTS}
    _ray_start(HEAD_IP, ["--head", f"--temp-dir={temp}", "--include-dashboard=false", f"--dashboard-host={HEAD_IP}"],
               head, env, temp, logs / "head.log", sessions)
    gcs = f"{HEAD_IP}:{head['port']}"
    _ray_start(NODE_IP, [f"--address={gcs}", f"--resources={json.dumps({RESOURCE: 1})}"],
               node, env, temp, logs / "node.log", sessions)
    return gcs


@pytest.fixture
def two_nodes(tmp_path):
    """(GCS address, env with the cluster's token) of a head and a node offering RESOURCE."""
    try:
        environment_program("ray")
    except FileNotFoundError as exc:
        pytest.skip(f"Ray's command line: {exc}")
    token = tmp_path / "ray-token"   # as the units give it: a 0600 file
    token.touch(mode=0o600)
    token.write_text(secrets.token_hex(32))
    env = dict(cluster_environment(), RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token),
               RAY_USAGE_STATS_ENABLED="0", RAY_raylet_start_wait_time_s=str(START_S),
               PYTHONUNBUFFERED="1")  # `ray start`'s progress reaches its log as it goes
    sessions: list[int] = []
    temps: list[Path] = []
    try:
        for attempt in range(ATTEMPTS):   # a second try finds Ray's modules in the page cache
            temp = Path(f"/tmp/pmq-place-{secrets.token_hex(3)}")  # Ray's socket paths must stay short
            temp.mkdir()
            temps.append(temp)
            try:
                gcs = _start_cluster(env, temp, tmp_path, sessions)
                break
            except AgentTooSlow as exc:
                assert not _kill_sessions(sessions)
                if attempt == ATTEMPTS - 1:
                    pytest.skip(f"{exc} ({ATTEMPTS} tries): this host is too busy for Ray 2.60's fixed wait")
        yield gcs, env
    finally:
        left = _kill_sessions(sessions)
        for temp in temps:
            shutil.rmtree(temp, ignore_errors=True)
        assert not left, f"Ray processes left running: {left}"


DRIVER = """
import json, sys
import ray
from services.ray_local import ensure_ray
from services.site.worker import start_workers, stop_workers

gcs, db, resource = sys.argv[1:4]
REFUSE_S = float(sys.argv[4])
ensure_ray(gcs)
nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
workers = start_workers(db, "flat", 3, 0.25, timeout_s=240, budget=None, resource=resource)
where = ray.get([w.__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id()) for w in workers])
cells = ray.get(workers[0].info.remote())["database_cells"]
stop_workers(workers)
try:
    start_workers(db, "flat", 1, 0.25, timeout_s=REFUSE_S, budget=None, resource="site_db_nowhere")
    refused = ""
except RuntimeError as exc:
    refused = str(exc)
print(json.dumps({"nodes": nodes, "workers": [nodes[n] for n in where], "cells": cells, "refused": refused}))
"""


@pytest.mark.slow
def test_site_workers_run_only_on_the_node_with_the_site_resource(two_nodes, site_db):
    gcs, env = two_nodes
    run = subprocess.run([sys.executable, "-c", DRIVER, gcs, str(site_db), RESOURCE, str(REFUSE_S)],
                         env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=DRIVER_S)
    assert run.returncode == 0, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert sorted(seen["nodes"].values()) == [HEAD_IP, NODE_IP]   # two nodes, the head has no resource
    assert seen["workers"] == [NODE_IP] * 3                        # every worker where the database is
    assert seen["cells"] > 0                                       # and it opened the database there
    assert "site_db_nowhere" in seen["refused"]                    # no node offers it: a clear refusal


def test_ray_resource_is_a_site_option(tmp_path):
    from pathmaster.records import ConfigError
    from services.config import load_site_config

    site = tmp_path / "site.toml"
    site.write_text('[site]\nname = "ct"\ndb = "db"\nray_resource = "site_db_ct"\n')
    assert load_site_config(site).ray_resource == "site_db_ct"
    site.write_text('[site]\nname = "ct"\ndb = "db"\n')
    assert load_site_config(site).ray_resource == ""          # default: any node
    site.write_text('[site]\nname = "ct"\ndb = "db"\nray_resource = "site db; rm"\n')
    with pytest.raises(ConfigError, match="ray_resource"):
        load_site_config(site)


@pytest.mark.parametrize("algorithm", ["flat", ""], ids=["with-index-build", "workers-only"])
def test_a_resource_no_node_offers_is_refused_by_name(ray_session, site_db, algorithm):
    """On the services tests' one-node Ray (no custom resources): a clear refusal, nothing left queued."""
    from services.site.worker import start_workers

    with pytest.raises(RuntimeError, match="no live node offers the resource 'site_db_nowhere'"):
        start_workers(site_db, algorithm, 1, 0.25, timeout_s=REFUSE_S, budget=None, resource="site_db_nowhere")
