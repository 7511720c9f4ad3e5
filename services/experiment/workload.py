"""The measured workload of a run: one PathMaster case fanned out to every site over gRPC.

Two halves, each a process inside a testbed namespace:

- `serve_transfer_site` (on each site's server host): the `pathmaster.v1.Site` service
  that answers `Analyse` with k matches per cell, each carrying a `match_bytes` thumbnail,
  without analysing anything. It isolates the network part of a case: the study's
  question is what the routers do to the transfer, and a 2-core machine running the
  image analysis for 3 sites would add its own noise. Replies are marked per class by
  `qos.transport.MarkedServer` (one port per class), exactly as the real site does.
- `Master` (on the master host): submits one case to all sites in parallel on
  per-(site, class) channels (`qos.transport.ClassChannels`, DSCP per class) and
  measures the total completion time, each site's time, and the bytes each way.

The runner talks to the master through `agent_main` (JSON lines on stdin/stdout), so the
channels, and their TCP connections, stay warm across the runs of an experiment.

There is no coordinator to ask for the request classes: the experiment file's table
(`Experiment.classes`, its `[classes]` or the default one) is the run's one source, given
to the agent and to every site as `--classes JSON` (`ClassTable.to_table()`'s shape).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent import futures

import grpc
import numpy as np

from qos.classes import ClassTable
from qos.transport import ClassChannels, MarkedServer
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

SITE_SERVICE = pb.DESCRIPTOR.services_by_name["Site"].full_name


def make_cells(count: int, image_bytes: int, with_background: bool, with_mask: bool,
               seed: int) -> list[pb.CellImage]:
    """`count` cells of random (incompressible, like PNG) bytes; the same seed gives the same case."""
    rng = np.random.default_rng(seed)

    def blob(n: int) -> bytes:
        return rng.integers(0, 256, n, dtype=np.uint8).tobytes()

    return [
        pb.CellImage(cell_id=f"cell{i}", image=blob(image_bytes),
                     background=blob(image_bytes) if with_background else b"",
                     mask=blob(image_bytes) if with_mask else b"")
        for i in range(count)
    ]


class TransferSite(pb_grpc.SiteServicer):
    """Answers Analyse with k matches of `match_bytes` each per cell; no analysis."""

    def __init__(self, name: str, match_bytes: int):
        self.name = name
        self.thumbnail = np.random.default_rng(0).integers(0, 256, match_bytes, dtype=np.uint8).tobytes()
        self.class_ports: dict[str, int] = {}
        self.class_dscp: dict[str, int] = {}

    def Analyse(self, request, context):
        started = time.perf_counter()
        if not request.cells:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request has no cells")
        k = request.k or 5
        cells = [
            pb.CellResult(query_cell_id=cell.cell_id, matches=[
                pb.Match(cell_id=f"{self.name}-{j}", diagnosis="normal_superficial", distance=float(j),
                         thumbnail=self.thumbnail, source_id="transfer-workload")
                for j in range(k)])
            for cell in request.cells
        ]
        wall = time.perf_counter() - started
        return pb.AnalyseReply(site=self.name, algorithm="transfer-only", cells=cells,
                               timing=pb.SiteTiming(site_wall_s=wall))

    def Info(self, request, context):
        return pb.SiteInfo(site=self.name, algorithm="transfer-only", class_ports=self.class_ports,
                           class_dscp=self.class_dscp)


def serve_transfer_site(name: str, host: str, port: int, match_bytes: int, classes: ClassTable) -> MarkedServer:
    """Start a transfer-only site on host:port with one port per class of `classes`, each
    marking its replies with that class's DSCP; returns the server."""
    servicer = TransferSite(name, match_bytes)
    server = MarkedServer(lambda s: pb_grpc.add_SiteServicer_to_server(servicer, s), [SITE_SERVICE],
                          host, port, class_ports={c.name: 0 for c in classes}, classes=classes)
    servicer.class_ports, servicer.class_dscp = dict(server.class_ports), server.class_dscp
    return server.start()


class Master:
    """Submits cases to every site in parallel and times them.

    Every case opens its own connections (new per-class channels, closed afterwards), as
    every run of the study was a fresh transfer: no congestion window, loss history or
    back-off carries over from one run to the next.
    """

    def __init__(self, sites: dict[str, str], classes: ClassTable):
        self.sites = dict(sites)
        self.classes = classes  # the run's table: each case is marked with its class's DSCP from it
        self.class_ports: dict[str, dict[str, int]] = {}
        self.channels = self._channels()
        self.pool = futures.ThreadPoolExecutor(max_workers=len(sites))

    def _channels(self) -> ClassChannels:
        channels = ClassChannels(self.sites, self.classes)
        for name, ports in self.class_ports.items():
            channels.set_class_ports(name, ports)
        return channels

    def discover(self, timeout: float = 20.0) -> None:
        """Ask every site for its class ports (so replies come back marked); waits for readiness."""
        for name in self.sites:
            stub = pb_grpc.SiteStub(self.channels.channel(name))
            info = stub.Info(pb.SiteInfoRequest(), timeout=timeout, wait_for_ready=True)
            self.class_ports[name] = dict(info.class_ports)
            self.channels.set_class_ports(name, self.class_ports[name])

    def warm(self, request_class: str, timeout: float = 20.0) -> None:
        """Check the whole path for a class once before timing anything (a case of one tiny cell)."""
        cells = make_cells(1, 16, False, False, seed=0)
        self.case(request_class, cells, k=1, deadline_s=timeout)

    def _site_call(self, channels: ClassChannels, name: str, request: pb.AnalyseRequest, request_class: str,
                   deadline_s: float) -> dict:
        stub = pb_grpc.SiteStub(channels.channel(name, request_class))
        started = time.perf_counter()
        try:
            reply = stub.Analyse(request, timeout=deadline_s)
        except grpc.RpcError as exc:
            return {"site": name, "status": exc.code().name, "error": exc.details(),
                    "total_s": time.perf_counter() - started, "bytes_up": request.ByteSize(), "bytes_down": 0}
        total = time.perf_counter() - started
        return {"site": name, "status": "OK", "total_s": total, "compute_s": reply.timing.site_wall_s,
                "transfer_s": total - reply.timing.site_wall_s, "bytes_up": request.ByteSize(),
                "bytes_down": reply.ByteSize(), "address": channels.address(name, request_class)}

    def case(self, request_class: str, cells: list[pb.CellImage], k: int, deadline_s: float,
             case_id: str = "") -> dict:
        """One case to every site at once; the completion time is when the last site has answered."""
        request = pb.AnalyseRequest(case_id=case_id, request_class=request_class, cells=cells, k=k)
        channels = self._channels()
        try:
            started = time.perf_counter()
            pending = [self.pool.submit(self._site_call, channels, name, request, request_class, deadline_s)
                       for name in self.sites]
            sites = [f.result() for f in pending]
            total = time.perf_counter() - started
        finally:
            channels.close()
        return {"completion_s": total, "ok": all(s["status"] == "OK" for s in sites), "sites": sites,
                "dscp": self.classes[request_class].dscp,
                "bytes_up": sum(s["bytes_up"] for s in sites), "bytes_down": sum(s["bytes_down"] for s in sites)}

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.channels.close()


def classes_argv(classes: ClassTable) -> list[str]:
    """The arguments that give the agent or a site the run's class table."""
    return ["--classes", json.dumps(classes.to_table())]


def add_classes_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--classes", type=lambda text: ClassTable(json.loads(text)), required=True,
                        metavar="JSON", help="the run's request classes ({name: {dscp, priority, description}})")


def agent_main(argv: list[str] | None = None) -> int:
    """The process the runner keeps on the master: one JSON command per line in, one JSON reply out.

    Commands: {"op": "warm", "class": C} and
    {"op": "case", "class": C, "cells": N, "image_bytes": B, "background": bool, "mask": bool,
     "k": K, "seed": S, "deadline_s": D, "case_id": ID}.
    """
    parser = argparse.ArgumentParser(prog="services.experiment.workload agent")
    parser.add_argument("--site", action="append", required=True, help="NAME=HOST:PORT (control port)")
    add_classes_argument(parser)
    args = parser.parse_args(argv)
    master = Master(dict(s.split("=", 1) for s in args.site), args.classes)
    try:
        master.discover()
        print(json.dumps({"ready": True}), flush=True)
        for line in sys.stdin:
            cmd = json.loads(line)
            try:
                if cmd["op"] == "warm":
                    master.warm(cmd["class"])
                    reply = {"ok": True}
                else:
                    cells = make_cells(cmd["cells"], cmd["image_bytes"], cmd["background"], cmd["mask"], cmd["seed"])
                    reply = master.case(cmd["class"], cells, cmd["k"], cmd["deadline_s"], cmd.get("case_id", ""))
            except Exception as exc:  # noqa: BLE001 - reported to the runner, which records the failed run
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(reply), flush=True)
    finally:
        master.close()
    return 0


def site_main(argv: list[str] | None = None) -> int:
    """A transfer-only site until stdin closes or it is signalled."""
    parser = argparse.ArgumentParser(prog="services.experiment.workload site")
    parser.add_argument("--name", required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--match-bytes", type=int, default=5000)
    add_classes_argument(parser)
    args = parser.parse_args(argv)
    server = serve_transfer_site(args.name, args.host, args.port, args.match_bytes, args.classes)
    print(json.dumps({"ready": True, "port": server.port, "class_ports": server.class_ports}), flush=True)
    try:
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(0)
    return 0


if __name__ == "__main__":
    role, rest = sys.argv[1], sys.argv[2:]
    sys.exit({"agent": agent_main, "site": site_main}[role](rest))
