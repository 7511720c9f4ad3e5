"""PathMaster in the testbed: site services on X1, the coordinator and the pathologist on A1.

    with Testbed(config) as tb:
        with deploy(tb, workdir) as pm:                  # sites on A1, B1, C1; coordinator on A1
            case = run_case(pm, "urgent")                # `pathmaster query` run on the master
            case.total_s, case.sites                     # what the coordinator reported

Every part is the product's own command run inside a node: ``pathmaster serve site`` on
each subnet's server X1, ``pathmaster serve coordinator`` and ``pathmaster query --json``
on the master. Each site has its own Ray cluster: the head on X1 and a worker node on the
worker host X2, one CPU each, and two site workers of one CPU, so one analyses on X1 and
one on X2, as the study's server and worker did (`workers_on_x2=False`: one worker in a
local Ray on X1, quicker to start). So a case's bytes cross the
bottleneck queues exactly as the product sends them, each class on its DSCP: requests by
the coordinator's per-class channels, replies by the sites' per-class ports (and
client<->coordinator likewise, by the coordinator's class ports).

Site databases are synthetic (`services.synthetic`), built once and cached.

The run's request classes (`deploy(classes=...)`: the experiment file's table) go into every
site's and the coordinator's configuration as `[classes]`; `pathmaster query` learns them
from the coordinator, as every client does.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pathmaster.environment import environment_program
from qos import netns
from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.testbed.node import Node
from services.shared import SITE_PORT
from services.ray_local import cluster_environment

CLASS_PORT_BASE = 50061    # a site's fixed per-class reply ports: this one, +1, ... by priority
DEPLOY_TIMEOUT_S = 300.0   # deploying PathMaster in the testbed (Ray, sites, coordinator) must end by then

# The master (A1) serves subnet A's site on SITE_PORT too, so the coordinator there cannot
# have the product's COORDINATOR_PORT (the same number, 50051) and listens one below.
MASTER_COORDINATOR_PORT = 50050
RAY_PORT = 6379
# The sites' Ray clusters are reachable only inside the testbed's namespaces; Ray's token
# authentication would need the token copied to every node for nothing.
RAY_ENV = {"RAY_AUTH_MODE": "disabled"}
# Fixed per-class reply ports, so that a capture or a filter can name them: the classes'
# ports are CLASS_PORT_BASE, +1, ... in the order of the table (services/config.py).
CASE_SEED = 2026


class DeploymentError(RuntimeError):
    """A PathMaster process in the testbed did not come up; the message carries its log."""


@dataclass
class Deployment:
    """The running PathMaster processes of one testbed."""

    testbed: object
    workdir: Path
    sites: dict[str, subprocess.Popen] = field(default_factory=dict)   # host name -> site server
    coordinator: subprocess.Popen | None = None
    ray_nodes: list[str] = field(default_factory=list)                 # hosts running `ray start` daemons

    @property
    def coordinator_address(self) -> str:
        return f"{self.testbed.master.ip}:{MASTER_COORDINATOR_PORT}"

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the coordinator and the sites together (each site takes its Ray down with it)."""
        procs = ([self.coordinator] if self.coordinator else []) + list(self.sites.values())
        for proc in procs:  # signal all first: their shutdowns overlap instead of queueing
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in procs:
            netns.stop_process(proc, timeout=timeout)
        for name in self.ray_nodes:
            _stop_ray(self.testbed.host(name), self.testbed.tag)
        self.coordinator, self.sites, self.ray_nodes = None, {}, []

    def __enter__(self) -> "Deployment":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def site_hosts(testbed) -> list[str]:
    """The server X1 of every subnet: where the sites run."""
    return [f"{subnet}1" for subnet in testbed.config.subnets]


def _classes_toml(classes: ClassTable) -> str:
    """`classes` as a configuration's [classes] tables."""
    return "".join(f"\n[classes.{json.dumps(name)}]\ndscp = {c['dscp']}\npriority = {c['priority']}\n"
                   f"description = {json.dumps(c['description'])}\n"
                   for name, c in classes.to_table().items())


def _write_site_config(path: Path, name: str, db: Path, ip: str, ray_address: str, classes: ClassTable) -> None:
    workers = "workers = 2\nworker_cpus = 1.0\n" if ray_address else "workers = 1\nworker_cpus = 0.5\n"
    path.write_text(
        "[site]\n"
        f'name = "{name}"\n'
        f'db = "{db}"\n'
        f'listen = "{ip}:{SITE_PORT}"\n'
        f"class_port_base = {CLASS_PORT_BASE}\n"
        f'ray_address = "{ray_address}"\n'
        + workers + _classes_toml(classes))


def ray_temp_dir(tag: str, node: Node) -> str:
    # Short and outside /tmp/ray: Ray's socket paths must fit in 107 bytes, and /tmp/ray
    # belongs to whoever else runs Ray on the machine.
    return f"/tmp/pmray-{tag}-{node.name}"


def _start_ray(node: Node, tag: str, head: Node | None, core: int | None = None) -> subprocess.Popen:
    """`ray start` on `node`: a head (head=None) or a worker node joining `head`; one CPU.
    core: pin the node's daemons and workers to this CPU (``taskset``), or None.

    No log monitor: it forwards workers' output to drivers that ask for it, and ours never
    do (``log_to_driver=False``); it would cost each node a Python process (~1 s of CPU to
    start, then ~0.5 % of a core) on the hosts whose CPU the experiment measures."""
    pin = ["taskset", "--cpu-list", str(core)] if core is not None else []
    argv = [*pin, environment_program("ray"), "start", "--node-ip-address", node.ip, "--num-cpus", "1", "--disable-usage-stats",
            "--include-log-monitor=false", "--temp-dir", ray_temp_dir(tag, node)]
    argv += (["--head", "--port", str(RAY_PORT), "--include-dashboard=false"] if head is None
             else ["--address", f"{head.ip}:{RAY_PORT}"])
    return node.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                      env=ray_driver_environment())


def _ray_start_all(pairs: list[tuple[Node, Node | None]], tag: str, deadline: float, attempts: int = 3,
                   cores: dict[str, int] | None = None) -> None:
    """`ray start` on every (node, head) pair in parallel; retry the ones that failed.
    cores: node name -> the CPU its Ray is pinned to (none: not pinned).

    Ray gives a new node 30 s to register (fixed in ray/_private/node.py, not configurable in
    2.60 whatever its message says), which a loaded 2-core machine can miss; a later try
    usually finds the machine calmer (two tries both missed it once at load average ~26).
    All tries together stay within `deadline`.
    """
    pending = pairs
    for attempt in range(1, attempts + 1):
        running = [(node, head, _start_ray(node, tag, head, (cores or {}).get(node.name))) for node, head in pending]
        failed = []
        for node, head, proc in running:
            try:
                out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                netns.stop_process(proc)
                raise DeploymentError(f"{node.name}: ray start did not finish in time") from None
            if proc.returncode != 0:
                failed.append((node, head, out))
        if not failed:
            return
        if attempt == attempts or deadline - time.monotonic() < 35.0:
            node, _, out = failed[0]
            raise DeploymentError(f"{node.name}: ray start failed {attempt} times: {out[-2000:]}")
        for node, _, _ in failed:
            _stop_ray(node, tag)
        pending = [(node, head) for node, head, _ in failed]


def _stop_ray(node: Node, tag: str) -> None:
    """Kill the Ray daemons `ray start` left in `node` (never `ray stop`: it stops every Ray
    on the machine), and remove their temporary folder."""
    netns.kill_pids(netns.pids_running(node.namespace, "ray"), signal.SIGKILL)
    shutil.rmtree(ray_temp_dir(tag, node), ignore_errors=True)


@contextmanager
def ray_cluster(head: Node, workers: list[Node], tag: str, cores: dict[str, int] | None = None,
                timeout_s: float = DEPLOY_TIMEOUT_S):
    """A Ray cluster of one CPU a node over testbed nodes: its head on `head`, `workers`
    joining it; yields the address (``ip:port``) a driver in one of the nodes connects to.

    cores: node name -> the CPU that node's Ray runs on (``taskset``; none: not pinned).
    Every daemon is killed and its temporary folder removed on leaving, also on failure.
    Raises DeploymentError when a node's ``ray start`` fails (with its output).
    """
    deadline = time.monotonic() + timeout_s
    started = [head]
    try:
        _ray_start_all([(head, None)], tag, deadline, cores=cores)
        started += workers
        if workers:
            _ray_start_all([(w, head) for w in workers], tag, deadline, cores=cores)
        yield f"{head.ip}:{RAY_PORT}"
    finally:
        for node in started:
            _stop_ray(node, tag)


def ray_driver_environment() -> dict:
    """The environment of a process that runs or joins a testbed Ray cluster."""
    return {**cluster_environment(), **RAY_ENV}


def _write_coordinator_config(path: Path, ip: str, sites: dict[str, str], classes: ClassTable) -> None:
    entries = "".join(f'\n[[sites]]\nname = "{n}"\naddress = "{a}"\n' for n, a in sites.items())
    path.write_text(f'[coordinator]\nlisten = "{ip}:{MASTER_COORDINATOR_PORT}"\n'
                    f'case_log = "{path.parent / "cases.jsonl"}"\n{entries}{_classes_toml(classes)}')


def _start(node: Node, argv: list[str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return node.popen([sys.executable, "-m", "pathmaster", *argv], stdout=out, stderr=subprocess.STDOUT,
                          env=ray_driver_environment())


def _wait_serving(node: Node, proc: subprocess.Popen, port: int, log: Path, deadline: float) -> None:
    """Poll until `proc` listens on `port` in `node`; DeploymentError with its log if it dies or is late."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DeploymentError(f"{node.name}: exited with status {proc.returncode}: "
                                  f"{log.read_text(errors='replace')[-2000:]}")
        if node.cmd("ss", "-Hltn", f"sport = :{port}").strip():
            return
        time.sleep(0.2)
    raise DeploymentError(f"{node.name}: not listening on port {port} in time: "
                          f"{log.read_text(errors='replace')[-2000:]}")


def deploy(testbed, workdir: str | Path, cells_per_site: int = 40, workers_on_x2: bool = True,
           timeout_s: float = DEPLOY_TIMEOUT_S, classes: ClassTable = DEFAULT_CLASSES) -> Deployment:
    """Start a site on X1 of every subnet (its Ray over X1 and X2) and the coordinator on the
    master, all with the request classes `classes`; return when all serve.

    `cells_per_site` sizes each site's synthetic database (seed = subnet number; cached).
    Raises DeploymentError (with the failing process's log) and stops what it started.
    """
    from services.synthetic import build_synthetic_site, cache_root

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    deployment = Deployment(testbed, workdir)
    deadline = time.monotonic() + timeout_s
    try:
        if workers_on_x2:
            # Heads first (in parallel), then each site's worker node joins its head.
            heads = [testbed.host(h) for h in site_hosts(testbed)]
            deployment.ray_nodes += [h.name for h in heads]
            _ray_start_all([(h, None) for h in heads], testbed.tag, deadline)
            workers = [(testbed.host(h.name[0] + "2"), h) for h in heads]
            deployment.ray_nodes += [w.name for w, _ in workers]
            _ray_start_all(workers, testbed.tag, deadline)
        endpoints = {}
        for n, host_name in enumerate(site_hosts(testbed), start=1):
            node = testbed.host(host_name)
            db = build_synthetic_site(cache_root() / "testbed" / f"site{n}-{cells_per_site}cells",
                                      cells_per_site, seed=n)
            config = workdir / f"site-{host_name}.toml"
            _write_site_config(config, f"site-{host_name}", db, node.ip,
                               f"{node.ip}:{RAY_PORT}" if workers_on_x2 else "", classes)
            deployment.sites[host_name] = _start(node, ["serve", "site", "--config", str(config)],
                                                 workdir / f"site-{host_name}.log")
            endpoints[f"site-{host_name}"] = f"{node.ip}:{SITE_PORT}"
        for host_name, proc in deployment.sites.items():
            _wait_serving(testbed.host(host_name), proc, SITE_PORT, workdir / f"site-{host_name}.log", deadline)
        config = workdir / "coordinator.toml"
        _write_coordinator_config(config, testbed.master.ip, endpoints, classes)
        log = workdir / "coordinator.log"
        deployment.coordinator = _start(testbed.master, ["serve", "coordinator", "--config", str(config)], log)
        _wait_serving(testbed.master, deployment.coordinator, MASTER_COORDINATOR_PORT, log, deadline)
    except BaseException:
        deployment.stop()
        raise
    return deployment


@dataclass
class CaseResult:
    """One case as `pathmaster query --json` reported it on the master."""

    request_class: str
    ok: bool                  # every site answered OK
    total_s: float            # the coordinator's completion time of the whole case
    wall_s: float             # the query command's wall time on the master (process start included)
    sites: dict[str, dict]    # site name -> its result event
    summary: dict
    returncode: int


def write_case_files(folder: Path, cells: int = 6, seed: int = CASE_SEED) -> list[Path]:
    """`cells` synthetic test cells as NAME.png, NAME-background.png, NAME-mask.png in `folder`."""
    from services.synthetic import synthetic_case_cells

    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, cell in enumerate(synthetic_case_cells(cells, seed)):
        for role, suffix in (("image", ""), ("background", "-background"), ("mask", "-mask")):
            path = folder / f"cell{i}{suffix}.png"
            path.write_bytes(cell[role])
            paths.append(path)
    return paths


def run_case(deployment: Deployment, request_class: str = "urgent", cells: int = 6, seed: int = CASE_SEED,
             deadline_s: float = 120.0, ship: str = "auto") -> CaseResult:
    """Submit one case of `cells` synthetic cells from the master with `pathmaster query --ship
    SHIP`; wait for it. A class the coordinator does not have: DeploymentError with query's
    message naming its classes."""
    files = write_case_files(deployment.workdir / f"case-{seed}-{cells}", cells, seed)
    started = time.monotonic()
    done = deployment.testbed.master.run(
        sys.executable, "-m", "pathmaster", "query", "--coordinator", deployment.coordinator_address,
        "--class", request_class, "--deadline", str(deadline_s), "--ship", ship, "--json", *map(str, files),
        check=False, timeout=deadline_s + 60)
    wall = time.monotonic() - started
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    summary = next((e for e in events if e.get("type") == "summary"), None)
    if summary is None:
        raise DeploymentError(f"pathmaster query on {deployment.testbed.master.name} gave no summary "
                              f"(exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    sites = {e["site"]: e for e in events if e.get("type") == "site"}
    return CaseResult(request_class, done.returncode == 0 and all(s["ok"] for s in sites.values()),
                      float(summary["total_s"]), wall, sites, summary, done.returncode)
