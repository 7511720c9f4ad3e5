"""A process running the project's gRPC can fork while its gRPC threads are busy.

grpcio's fork handlers (on by default) run at every fork; with other threads inside gRPC
they are skipped with a warning, and now and then the process aborts in abseil's mutex
code instead: the coordinator did when its analysers started a local Ray beside its
running server. The project turns them off before grpc is imported (qos/__init__.py);
these tests run in fresh interpreters, so the import order is the one a user's process has.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A server, three threads calling it, and 200 fork+exec's from the main thread meanwhile.
FORK_UNDER_LOAD = """
import subprocess, threading
import services.client  # what the coordinator, sites and clients import first
import grpc
from concurrent import futures
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
server = grpc.server(futures.ThreadPoolExecutor(4))
health_pb2_grpc.add_HealthServicer_to_server(health.HealthServicer(), server)
port = server.add_insecure_port("127.0.0.1:0")
server.start()
done = threading.Event()
def call():
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while not done.is_set():
            stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
threads = [threading.Thread(target=call) for _ in range(3)]
for t in threads:
    t.start()
for _ in range(200):
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)  # preexec_fn: a real fork
done.set()
for t in threads:
    t.join()
server.stop(0)
print("forked 200 times")
"""


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_importing_the_services_turns_grpcs_fork_handlers_off_before_grpc_loads():
    done = run("import services.client\nfrom grpc._cython import cygrpc\nprint(cygrpc.is_fork_support_enabled())")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_forks_beside_busy_grpc_threads_run_no_grpc_fork_handlers():
    done = run(FORK_UNDER_LOAD)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "forked 200 times" in done.stdout
    assert "fork() handlers" not in done.stderr  # grpc's handlers would have run (and been skipped)
