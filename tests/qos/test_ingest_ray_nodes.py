"""`pathmaster index --ray-address` on a Ray cluster of two testbed nodes (namespaces, one CPU
each) makes the same database as ingest in one process, cell for cell."""

from __future__ import annotations

import json

import pytest

from pathmaster.site.ingest import ingest
from pathmaster.image.synth import write_dataset
from tests.core.site.test_ingest import site_rows
from qos import netns

pytestmark = [pytest.mark.netns, pytest.mark.slow]

NODES = """
import json, sys
import ray
ray.init(address=sys.argv[1], logging_level="warning", log_to_driver=False)
print(json.dumps(sorted((n["NodeManagerAddress"], n["Resources"].get("CPU", 0)) for n in ray.nodes() if n["Alive"])))
"""


def test_ingest_on_two_ray_nodes_in_namespaces_equals_ingest_in_one_process(netns_ok, tmp_path):
    pytest.importorskip("ray")
    from services.experiment.ingest_nodes import ingest_clusters, usable_cpus

    if len(usable_cpus()) < 2:
        pytest.skip("needs two CPUs to pin the two Ray nodes to")
    dataset = write_dataset(tmp_path / "data", 24, seed=12)
    tag = netns.new_tag("arc")
    with ingest_clusters(tag, which=("two",)) as clusters:
        two = clusters["two"]
        worker_node = two.nodes[1]
        nodes = two.driver(["-c", NODES, two.address], timeout=120)
        jobs_before = two.worker_jobs(worker_node)
        indexed = two.index(dataset, tmp_path / "two-nodes")
        jobs_after = two.worker_jobs(worker_node)
    assert not netns.list_namespaces(netns.tag_prefix(tag))   # nothing left behind
    assert nodes.returncode == 0, nodes.stderr[-3000:]
    assert [cpu for _, cpu in json.loads(nodes.stdout.splitlines()[-1])] == [1.0, 1.0]
    assert indexed.returncode == 0, indexed.stderr[-3000:]
    assert len(jobs_after - jobs_before) == 1   # the index job's tasks ran on the worker node too
    serial = ingest(dataset, tmp_path / "serial", build_index=False)
    assert serial.added == 24 and not serial.problems
    assert site_rows(tmp_path / "two-nodes") == site_rows(tmp_path / "serial")
