"""A site process killed in the middle of a case: partial results, that site UNAVAILABLE.

The site is the real command (`pathmaster serve site`) in its own process, joining the
tests' Ray cluster with --ray-address (so this also tests joining an existing cluster).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import grpc

from services.client import CoordinatorClient
from services.config import CoordinatorConfig, SiteEndpoint
from services.coordinator.server import CoordinatorServer

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


def wait_for(path, pattern: str, proc: subprocess.Popen, timeout_s: float) -> re.Match:
    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(pattern, path.read_text(errors="replace"))
        if found:
            return found
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {pattern!r} from the site: {path.read_text(errors='replace')[-2000:]}")
        time.sleep(0.05)


def test_site_killed_mid_case(deployment, site_dbs, slow_case, case, tmp_path, ray_session):
    (tmp_path / "site.toml").write_text(
        f'[site]\nname = "kappa"\ndb = "{site_dbs["gamma"]}"\nlisten = "127.0.0.1:0"\nworkers = 1\n')
    log = tmp_path / "site.log"
    with open(log, "wb") as out:
        site = subprocess.Popen(
            [sys.executable, "-m", "pathmaster", "serve", "site", "--config", str(tmp_path / "site.toml"),
             "--ray-address", ray_session.get_runtime_context().gcs_address],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    coordinator = None
    try:
        address = wait_for(log, r"site kappa serving on (\S+);", site, 120).group(1)
        sites = [SiteEndpoint(name="alpha", address=deployment.sites["alpha"].address),
                 SiteEndpoint(name="kappa", address=address)]
        coordinator = CoordinatorServer(CoordinatorConfig(sites=sites, analysis_workers=0)).start()  # images, as sent below
        deadline = 60.0
        with CoordinatorClient(coordinator.address) as client:
            started = time.monotonic()
            events = client.submit(slow_case, "urgent", deadline_s=deadline, ship="images")
            wait_for(log, r"case \S+ \(urgent\): analysing 6 cells", site, 30)
            os.killpg(site.pid, signal.SIGKILL)
            received = list(events)
            elapsed = time.monotonic() - started
        results = {e.site_result.site: e.site_result for e in received if e.HasField("site_result")}
        assert results["kappa"].status_code == UNAVAILABLE, results["kappa"]
        assert results["alpha"].status_code == 0 and len(results["alpha"].cells) == 6
        summary = received[-1].summary
        assert summary.sites_ok == 1 and summary.sites_failed == 1
        assert elapsed < deadline
        # Still serving: the next case gets alpha's answer and kappa's UNAVAILABLE at once.
        with CoordinatorClient(coordinator.address) as client:
            after = [e for e in client.submit(case[:1], "routine", deadline_s=30)]
        statuses = {e.site_result.site: e.site_result.status_code for e in after if e.HasField("site_result")}
        assert statuses == {"alpha": 0, "kappa": UNAVAILABLE}
    finally:
        if coordinator is not None:
            coordinator.stop(0)
        if site.poll() is None:
            os.killpg(site.pid, signal.SIGKILL)
        site.wait(10)
