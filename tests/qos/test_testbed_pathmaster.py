"""A 6-cell PathMaster case end to end across the testbed, under competing downloads.

The product's own processes run inside the nodes: sites on A1, B1, C1, each with a Ray
cluster over its server X1 and worker X2 and a site worker on each; the coordinator and
`pathmaster query` on the master A1. They run with only the system's folders on the PATH,
as on a fresh machine where nothing activates the project's environment. Routers run
priority queuing; the competing downloads are marked bulk. The test checks the case
completes with every site's matches, and that the routers saw its bytes in the urgent class
both ways: uploads leaving subnet A (rA's uplink) and replies entering it (core -> rA).
"""

from __future__ import annotations

import pytest

from qos import netns
from qos.testbed import Testbed, load_config
from services.experiment.deployment import deploy, ray_temp_dir, run_case
from qos.traffic import BulkDownloads

pytestmark = [pytest.mark.netns, pytest.mark.slow]
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"   # a fresh machine's: no virtual environment on it


def log_monitors(node, temp_dir: str) -> int:
    """How many log monitors of the Ray whose folder is `temp_dir` run in `node`."""
    return len(set(netns.pids_running(node.namespace, "log_monitor.py")) & set(netns.pids_running(node.namespace, temp_dir)))


def test_six_cell_case_runs_across_the_testbed_with_its_dscp_honoured(netns_ok, tmp_path, monkeypatch):
    """Nothing activates the project's environment on a fresh machine: `ray start` on X1 and
    X2, the sites, the coordinator and `pathmaster query` must all come from it by themselves."""
    pytest.importorskip("ray")
    monkeypatch.setenv("PATH", SYSTEM_PATH)
    with Testbed(load_config().with_tag(netns.new_tag("pm"))) as tb:
        tb.set_strategy({"strategy": "priority"})
        with deploy(tb, tmp_path, cells_per_site=24) as pm:
            before = tb.bottleneck_stats()
            with BulkDownloads(tb, streams=2) as bulk:
                case = run_case(pm, "urgent", cells=6)
            after = tb.bottleneck_stats()
            nodes = {name: tb.host(name) for name in ("A1", "A2", "B1", "B2", "C1", "C2")}
            workers = {name: len(netns.pids_running(node.namespace, "ray::SiteWorker")) for name, node in nodes.items()}
            monitors = {name: log_monitors(node, ray_temp_dir(tb.tag, node)) for name, node in nodes.items()}

    # Each worker node's `ray start` joined its head: one site worker on every node.
    assert all(count == 1 for count in workers.values()), workers
    # Their `ray start` left no log monitor: no driver asks for workers' output. (The
    # coordinator's own local Ray on A1 has one: ray.init cannot leave it out.)
    assert not any(monitors.values()), monitors

    assert case.ok, case.sites
    assert sorted(case.sites) == ["site-A1", "site-B1", "site-C1"]
    for site in case.sites.values():
        assert len(site["cells"]) == 6
        assert all(len(cell["matches"]) == 5 for cell in site["cells"])

    def grew(key: str, cls: str) -> int:
        return after[key][cls]["bytes"] - before[key][cls]["bytes"]

    # The case's images went to B1 and C1 as urgent; the ~1.8 MB of the study is per site.
    uploads = case.sites["site-B1"]["bytes_sent"] + case.sites["site-C1"]["bytes_sent"]
    assert uploads > 0
    assert grew("rA:rA-eth4", "urgent") >= uploads
    # Their replies came back marked urgent too (the sites' per-class reply ports).
    replies = case.sites["site-B1"]["bytes_received"] + case.sites["site-C1"]["bytes_received"]
    assert grew("core:core-eth0", "urgent") >= replies
    # And the downloads really competed, as bulk, on the same queue.
    assert bulk.result.bytes > 0
    assert grew("rA:rA-eth4", "bulk") >= bulk.result.bytes
