"""Benchmark: how long a site cannot serve after its worker dies.

    python benchmarks/bench_recovery.py [--kills 5] [--cells 70]

Starts a local Ray and one site (a synthetic database, one worker) in this process, and
follows its gRPC health (Watch). Each round kills the worker (`ray.kill`) and times, from
the kill: NOT_SERVING reported (death noticed), then SERVING again (a replacement has
loaded the database and started its analysis pool). Prints the median, minimum and
maximum of each over the rounds, and the supervisor's own recovery time.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402
import ray  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from services.config import SiteConfig  # noqa: E402
from services.ray_local import ensure_ray  # noqa: E402
from services.site.server import SITE_SERVICE, SiteServer  # noqa: E402
from services.synthetic import build_synthetic_site  # noqa: E402

SERVING = health_pb2.HealthCheckResponse.SERVING


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--cells", type=int, default=70)
    args = parser.parse_args()
    ensure_ray(num_cpus=2)
    with tempfile.TemporaryDirectory() as tmp:
        db = build_synthetic_site(Path(tmp) / "site", args.cells, seed=1)
        site = SiteServer(SiteConfig(name="bench", db=db, workers=1)).start()
        channel = grpc.insecure_channel(site.address)
        statuses: queue.Queue = queue.Queue()
        stream = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=SITE_SERVICE))

        def follow():
            try:
                for reply in stream:
                    statuses.put((time.monotonic(), reply.status))
            except grpc.RpcError:
                pass

        threading.Thread(target=follow, daemon=True).start()
        assert statuses.get(timeout=60)[1] == SERVING
        down, back, supervisor = [], [], []
        try:
            for _ in range(args.kills):
                killed = time.monotonic()
                ray.kill(site.workers[0], no_restart=True)
                t_down, status = statuses.get(timeout=120)
                assert status != SERVING, status
                t_up, status = statuses.get(timeout=300)
                assert status == SERVING, status
                down.append(t_down - killed)
                back.append(t_up - killed)
                supervisor.append(site.supervisor.last_recovery_s)
        finally:
            stream.cancel()
            channel.close()
            site.stop(0)
            ray.shutdown()

    def line(name, values):
        print(f"{name:<38} median {statistics.median(values):6.2f} s   min {min(values):6.2f}   "
              f"max {max(values):6.2f}   (n={len(values)})")

    line("kill -> NOT_SERVING", down)
    line("kill -> SERVING again", back)
    line("supervisor: death noticed -> ready", supervisor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
