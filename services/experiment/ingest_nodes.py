"""Ingest on Ray nodes in testbed namespaces: a cluster of one node of one core, and of two.

    with ingest_clusters(netns.new_tag("arc")) as clusters:    # both, or which=("two",)
        two = clusters["two"]                                   # head H1, worker node H2
        two.index(dataset, site)                                # `pathmaster index --ray-address`
        two.driver(["-c", SCRIPT, two.address])                 # any Python driver on the head

The hosts are the testbed's own objects (`qos.testbed.topology.Topology`): namespaces on one
LAN, a bridge in router ``r`` that also routes between them, so Ray's control messages and
object transfers (each task's analysed cells, ~160 KiB a cell, go back to the driver) cross
real veths between namespaces. Cluster ``one`` is a head alone on S1; cluster ``two`` a head
on H1 and a worker node on H2. Every node is ``ray start --num-cpus 1`` pinned by ``taskset``
to one CPU: S1 and H1 to the first CPU this process may use, H2 to the second; a driver runs
in its head's namespace on its head's CPU. Both clusters can stand side by side, so one
benchmark run compares them on the same cells and load. Everything (daemons, drivers,
namespaces, Ray's temporary folders) is removed on leaving, also on failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from qos import netns
from qos.testbed.node import Node
from qos.testbed.topology import Topology
from services.experiment.deployment import ray_cluster, ray_driver_environment, ray_temp_dir

LAN = "10.42.1"   # the LAN's /24: router .254, hosts .1, .2, ... (inside the namespaces only)
# Cluster name -> its nodes' hosts, head first, and each node's CPU (index into usable_cpus).
CLUSTERS = {"one": (("S1", 0),), "two": (("H1", 0), ("H2", 1))}


def usable_cpus() -> list[int]:
    """The CPUs this process may run on, in order (its affinity)."""
    return sorted(os.sched_getaffinity(0))


@dataclass
class IngestCluster:
    """A running Ray cluster over testbed hosts: where a driver connects and runs."""

    name: str
    head: Node
    address: str     # ip:port of the head, reachable from the cluster's namespaces
    cpu: int         # the head's CPU, where drivers run too
    nodes: list[Node]

    def worker_jobs(self, node: Node) -> set[str]:
        """The Ray jobs (hex ids) that started a worker process on `node`: a job's tasks ran
        there. Read from the names of Ray's worker logs (``worker-ID-JOB-PID.out``); workers
        started ahead of any job (``ffffffff``) are left out."""
        logs = Path(ray_temp_dir(node.tag, node)) / "session_latest" / "logs"
        jobs = {p.name.split("-")[2] for p in logs.glob("worker-*-*-*.out")} if logs.is_dir() else set()
        return jobs - {"ffffffff"}

    def driver(self, argv: list[str], timeout: float) -> subprocess.CompletedProcess:
        """`python ARGV` in the head's namespace on the head's CPU, waited for (its output
        captured); a process still running at `timeout` is stopped and TimeoutExpired raised."""
        proc = self.head.popen(["taskset", "--cpu-list", str(self.cpu), sys.executable, *argv],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=ray_driver_environment())
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            netns.stop_process(proc)
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def index(self, dataset: Path, site: Path, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """``pathmaster index DATASET --db SITE --ray-address ADDRESS --quiet`` from the head."""
        return self.driver(["-m", "pathmaster", "index", str(dataset), "--db", str(site),
                            "--ray-address", self.address, "--quiet"], timeout)


def lan_topology(tag: str, hosts: list[str]) -> Topology:
    """`hosts` on one LAN (router ``r``), not built yet."""
    topology = Topology(tag)
    lan = topology.add_lan(topology.add_router("r"), f"{LAN}.254/24")
    for number, name in enumerate(hosts, start=1):
        lan.attach(topology.add_host(name), f"{LAN}.{number}/24")
    return topology


@contextmanager
def ingest_clusters(tag: str, which: tuple[str, ...] = ("one", "two")):
    """Build the LAN of tag `tag` and start the clusters named in `which` (see `CLUSTERS`);
    yield {name: IngestCluster}. Needs root, ``ip``, ``taskset``, Ray, and two usable CPUs."""
    cpus = usable_cpus()
    if len(cpus) < 2:
        raise RuntimeError(f"two CPUs are needed, this process may use {len(cpus)}")
    hosts = [host for name in which for host, _ in CLUSTERS[name]]
    topology = lan_topology(tag, hosts)
    with ExitStack() as stack:
        stack.callback(topology.destroy)   # last: kills whatever is left in the namespaces
        topology.build()
        gateway = topology.lans[0].gateway
        for host in hosts:
            topology.node(host).set_default_route(gateway)
        clusters = {}
        for name in which:
            (head, head_cpu), *workers = CLUSTERS[name]
            cores = {host: cpus[index] for host, index in CLUSTERS[name]}
            address = stack.enter_context(ray_cluster(topology.node(head), [topology.node(w) for w, _ in workers],
                                                      tag, cores))
            clusters[name] = IngestCluster(name, topology.node(head), address, cpus[head_cpu],
                                           [topology.node(host) for host, _ in CLUSTERS[name]])
        yield clusters
