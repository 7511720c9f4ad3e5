"""The measured workload of a run: one PathMaster case fanned out to every site over gRPC.

Two halves, each a process inside a testbed namespace:

- `serve_transfer_site` (on each site's server host): the `pathmaster.v1.Site` service
  that answers `Analyse` with k matches per cell, each carrying a `match_bytes` thumbnail,
  without analysing anything (the study's analysis time, `[workload] analysis_s` per image
  pipelined over `site_nodes`, is a wait). It isolates the network part of a case: the study's
  question is what the routers do to the transfer, and a 2-core machine running the
  image analysis for 3 sites would add its own noise. Replies are marked per class by
  `qos.transport.MarkedServer` (one port per class), exactly as the real site does.
- `Master` (on the master host): submits one case to all sites in parallel on
  per-(site, class) channels (`qos.transport.ClassChannels`, DSCP per class) and
  measures the total completion time, each site's time, and the bytes each way.
  Before sending it predicts each site's time with the coordinator's passive model
  (`qos.predict.Predictor`, fed by its own earlier calls), so every run records its
  predicted and actual time. Calls go through the coordinator's `FanOut`.

A strategy with `adaptive` runs the coordinator's policy (`qos.policy.plan_site`) as the
product does: features instead of images where the site's schema matches (the transfer
sites advertise the one the bench gives them, the installation's), the class within the
user's entitlement (step-down), hedging when a site runs past its prediction, each against
its class's deadline; replies are sized for the wire (`thumbnail_bytes` a match). As the
coordinator does, it opens its connections before the first case (one per copy lane), replaces
those a case used by fresh ones opened after it (`renew_connections`, `ClassChannels.refresh`),
and sends a small features request as several copies at once.
Without `adaptive` a case is today's: images (with background and mask) in the class asked
for, `match_bytes` thumbnails. Feature vectors are random float64s of the catalogue's
length, sent as the coordinator sends them (`fanout.features_request`): only the columns
each site advertises, and the transfer sites advertise a selection as large as a real
site's forward selection keeps at most (`selection_stand_in`). Nothing is analysed: the
study's analysis (`[workload] analysis_s` an image, pipelined over `site_nodes`,
`qos.experiment.spec.pipelined_analysis_s`) is a wait, taken where the product spends it. In
images mode each site waits before it answers. In features mode the coordinator analyses
each cell once, on its own nodes, before any features leave: when a case sends features to
any site, the master waits that long first (the study's master has a site's nodes, so the
same `site_nodes`), once for all sites, and the sites that get features only search (which
takes them no modelled time). The case records the wait (`analysis_s`) and each site's share
of it (`prior_s`: the wait its request could not leave before), which the run's bound counts.

The runner talks to the master through `agent_main` (JSON lines on stdin/stdout), so the
channels, and their TCP connections, stay warm across the runs of an experiment.

There is no coordinator to ask for the request classes: the experiment file's table
(`Experiment.classes`, its `[classes]` or the default one) is the run's one source, given
to the agent and to every site as `--classes JSON` (`ClassTable.to_table()`'s shape).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import sys
import time

import grpc
import numpy as np

from pathmaster import defaults
from qos.channels import RENEW_CONNECTIONS
from qos.classes import ClassTable
from qos.experiment.spec import MAX_WIRE_THUMBNAIL_BYTES, SITE_NODES, WIRE_THUMBNAIL_BYTES, pipelined_analysis_s
from qos.policy import COPY_GAP_S, SMALL_REQUEST_COPIES
from qos.predict import Predictor, RecentMedian  # scipy.stats loads with the first Predictor
from qos.transport import ClassChannels, CopyFilter, MarkedServer
from services import reasons
from services.coordinator.directory import SiteDirectory
from services.coordinator.pipeline import Case, CasePipeline, Settings, Trial
from services.shared import MAX_K
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

SITE_SERVICE = pb.DESCRIPTOR.services_by_name["Site"].full_name
# Call metadata by which the master asks a transfer site for wire-sized replies: the bytes of
# each match's thumbnail (decimal; "" or not a number: the site's own `wire_match_bytes`).
WIRE_REPLY_KEY = "x-transfer-wire-reply"


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


def make_features(count: int, values: int, seed: int) -> list[pb.CellFeatures]:
    """`count` feature vectors of `values` random float64s (incompressible, like real ones);
    the same seed gives the same case."""
    rng = np.random.default_rng(seed)
    return [pb.CellFeatures(cell_id=f"cell{i}", values=rng.standard_normal(values).tolist()) for i in range(count)]


def selection_stand_in(feature_count: int) -> list[int]:
    """The feature columns a transfer site advertises (SiteInfo.feature_columns): as many as
    a real site's forward selection keeps at most (defaults.MAX_SELECTED_FEATURES), spread
    over the catalogue's `feature_count` columns (so indices past 127 take their two bytes
    on the wire as real ones do). The transfer sites read no values, so which columns they
    are changes nothing but the request's bytes; [] when `feature_count` is 0."""
    if feature_count <= 0:
        return []
    keep = min(defaults.MAX_SELECTED_FEATURES, feature_count)
    return sorted({int(c) for c in np.linspace(0, feature_count - 1, keep).round()})


def _blob(n: int) -> bytes:
    return np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8).tobytes()


class TransferSite(pb_grpc.SiteServicer):
    """Answers Analyse with k matches per cell, each with a `match_bytes` thumbnail (or, when
    the call asks for wire-sized replies, one of the bytes it asks for, default
    `wire_match_bytes`, and the full image's SHA-256 as the real site's); no analysis. Takes
    features of `feature_schema` as the real site does (another schema: FAILED_PRECONDITION),
    and advertises `feature_columns` as the columns it compares (a subset request naming
    others: INVALID_ARGUMENT, as the real site)."""

    def __init__(self, name: str, match_bytes: int, wire_match_bytes: int = WIRE_THUMBNAIL_BYTES,
                 feature_schema: str = "", analysis_s: float = 0.0, site_nodes: int = SITE_NODES,
                 feature_columns: list[int] | None = None):
        self.name = name
        self.analysis_s, self.site_nodes = analysis_s, site_nodes
        self.thumbnail = _blob(match_bytes)
        self.wire_match_bytes = wire_match_bytes
        self.wire_thumbnails: dict[int, bytes] = {}
        self.feature_schema = feature_schema
        self.feature_columns = list(feature_columns or [])
        self.class_ports: dict[str, int] = {}
        self.class_dscp: dict[str, int] = {}
        self.copies = CopyFilter()  # as the real site: a copy of a request taken is refused

    def Analyse(self, request, context):
        started = time.perf_counter()
        if request.features:
            if not self.feature_schema or request.feature_schema != self.feature_schema:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, "features of another schema: send the images")
            if request.feature_columns and list(request.feature_columns) != self.feature_columns:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"site {self.name} compares feature columns "
                                                                f"{self.feature_columns or 'all'}: send those")
            ids = [f.cell_id for f in request.features]
        else:
            ids = [cell.cell_id for cell in request.cells]
        if not ids:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request has no cells")
        self.copies.refuse_copy(context, request.send_id)
        if request.cells and self.analysis_s:
            # The study's analysis (~5 s an image) pipelined over the site's nodes: a wait, so that
            # three sites' analysis costs this machine no CPU. Features arrive analysed already.
            delay = pipelined_analysis_s(len(ids), self.analysis_s, self.site_nodes)
            remaining = context.time_remaining()
            time.sleep(min(delay, remaining) if remaining is not None else delay)
        wire = dict(context.invocation_metadata()).get(WIRE_REPLY_KEY)
        thumbnail = self.thumbnail if wire is None else self.wire_thumbnail(wire)
        sha = "" if wire is None else hashlib.sha256(thumbnail).hexdigest()  # as the real site's wire reply
        k = min(request.k or defaults.K, MAX_K)
        cells = [
            pb.CellResult(query_cell_id=cell_id, matches=[
                pb.Match(cell_id=f"{self.name}-{j}", diagnosis="normal_superficial", distance=float(j),
                         thumbnail=thumbnail, source_id="transfer-workload", image_sha256=sha)
                for j in range(k)])
            for cell_id in ids
        ]
        wall = time.perf_counter() - started
        return pb.AnalyseReply(site=self.name, algorithm="transfer-only", cells=cells,
                               timing=pb.SiteTiming(site_wall_s=wall))

    def wire_thumbnail(self, asked: str) -> bytes:
        """The thumbnail of a wire-sized reply: `asked` bytes (a decimal string, at most
        MAX_WIRE_THUMBNAIL_BYTES), or `wire_match_bytes` when it is not a number."""
        size = min(int(asked), MAX_WIRE_THUMBNAIL_BYTES) if asked.isdigit() else self.wire_match_bytes
        if size not in self.wire_thumbnails:
            self.wire_thumbnails[size] = _blob(size)
        return self.wire_thumbnails[size]

    def Info(self, request, context):
        return pb.SiteInfo(site=self.name, algorithm="transfer-only", class_ports=self.class_ports,
                           class_dscp=self.class_dscp, feature_schema=self.feature_schema,
                           feature_columns=self.feature_columns)


def serve_transfer_site(name: str, host: str, port: int, match_bytes: int, classes: ClassTable,
                        wire_match_bytes: int = WIRE_THUMBNAIL_BYTES,
                        feature_schema: str = "", analysis_s: float = 0.0,
                        site_nodes: int = SITE_NODES, feature_count: int = 0) -> MarkedServer:
    """Start a transfer-only site on host:port with one port per class of `classes`, each
    marking its replies with that class's DSCP; returns the server. With a `feature_schema`
    it takes features of that schema, and with the catalogue's `feature_count` it advertises
    a selection of them (`selection_stand_in`), so features requests carry only those values
    as the coordinator's do. Images take `analysis_s` seconds each to analyse,
    pipelined over `site_nodes` nodes (`qos.experiment.spec.pipelined_analysis_s`)."""
    servicer = TransferSite(name, match_bytes, wire_match_bytes, feature_schema, analysis_s, site_nodes,
                            selection_stand_in(feature_count) if feature_schema else [])
    server = MarkedServer(lambda s: pb_grpc.add_SiteServicer_to_server(servicer, s), [SITE_SERVICE],
                          host, port, class_ports={c.name: 0 for c in classes}, classes=classes)
    servicer.class_ports, servicer.class_dscp = dict(server.class_ports), server.class_dscp
    return server.start()


class WaitingAnalysers:
    """The master's analysis as the case pipeline's analysers: the study's analysis time
    (`analysis_s` an image, pipelined over `nodes`) as a wait, no CPU, then the cells'
    feature vectors (`values` random float64s each, as `make_features`). A warm-up does not
    wait (`waiting` False); the wait of the last case is `last_s`."""

    def __init__(self, analysis_s: float, nodes: int, values: int):
        self.analysis_s, self.nodes, self.values = analysis_s, nodes, values
        self.per_cell_wall_s = RecentMedian()  # the wait, per pipelined cell
        self.waiting, self.seed, self.last_s = True, 0, 0.0

    def estimate_s(self, cells: int, priority: int = 0) -> float:
        """Seconds of the analysis of `cells` cells, learnt from the last ones (0 before any);
        a wait of the study's analysis time, whatever the case's `priority`."""
        return (self.per_cell_wall_s.value() or 0.0) * pipelined_analysis_s(cells, 1.0, self.nodes)

    def analyse(self, cells: list[pb.CellImage], timeout_s: float, priority: int = 0) -> list[pb.CellFeatures]:
        self.last_s = 0.0
        if self.waiting and self.analysis_s > 0:
            started = time.monotonic()
            time.sleep(min(pipelined_analysis_s(len(cells), self.analysis_s, self.nodes), timeout_s))
            self.last_s = time.monotonic() - started
            self.per_cell_wall_s.add(self.last_s / pipelined_analysis_s(len(cells), 1.0, self.nodes))
        return make_features(len(cells), self.values, seed=self.seed)


class Master:
    """Submits cases to every site in parallel and times them, with the coordinator's case
    pipeline (services.coordinator.pipeline): one per strategy, since a coordinator sees
    one network and each strategy is a network of its own (its own predictor, case model
    and analysis time).

    Today's (non-adaptive) case opens its own connections (new per-class channels, closed
    afterwards), as every run of the study was a fresh transfer: no congestion window, loss
    history or back-off carries over from one run to the next. An adaptive case uses its
    strategy's channels, opened before the first case and (with `renew_connections`) renewed
    after each, as the coordinator's are.

    Parameters
    ----------
    sites : dict
        site name -> control address.
    classes : ClassTable
        The run's request classes.
    feature_schema : str
        The schema of the features the master sends in features mode ("": none).
    feature_values : int
        Values per feature vector (the catalogue's length).
    analysis_s : float
        The coordinator's analysis per image, seconds (a wait, as a site's): charged once per
        case, before the fan-out, when any site is sent features.
    nodes : int
        The master's nodes that analysis is pipelined over (the study's master has a site's).
    """

    def __init__(self, sites: dict[str, str], classes: ClassTable, feature_schema: str = "",
                 feature_values: int = 0, analysis_s: float = 0.0, nodes: int = SITE_NODES):
        self.sites = dict(sites)
        self.analysis_s, self.nodes = analysis_s, nodes
        self.classes = classes  # the run's table: each case is marked with its class's DSCP from it
        self.feature_schema = feature_schema
        self.feature_values = feature_values
        self.channels = ClassChannels(self.sites, self.classes)
        self.directory = SiteDirectory(list(self.sites), self.channels, predictor=None)
        self.pipelines: dict[str, CasePipeline] = {}
        self.strategy_channels: dict[str, ClassChannels] = {}

    @property
    def site_columns(self) -> dict[str, tuple[int, ...]]:
        """What each site compares, as the coordinator knows it."""
        return self.directory.columns

    def _channels(self, renew: bool = False) -> ClassChannels:
        channels = ClassChannels(self.sites, self.classes, renew=renew)
        for name, ports in self.directory.ports.items():
            channels.set_class_ports(name, ports)
        return channels

    def discover(self, timeout: float = 20.0) -> None:
        """Ask every site's Info (class ports, so replies come back marked; feature schema and
        columns) into the directory; waits for readiness."""
        for name in self.sites:
            self.directory.learn(name, self.directory.stub(name).Info(pb.SiteInfoRequest(), timeout=timeout,
                                                                      wait_for_ready=True))

    def entitled(self, request_class: str) -> list[str]:
        """The classes a user of `request_class` may use, most favoured first (as the coordinator's)."""
        asked = self.classes[request_class]
        return [c.name for c in self.classes if c.priority >= asked.priority]

    def warm(self, request_class: str, timeout: float = 20.0, strategy: str = "", adaptive: dict | None = None) -> None:
        """Check the whole path for a class once before timing anything (a case of one tiny
        cell); for an adaptive strategy, every class and mode its policy may choose, so its
        predictor has seen each path once."""
        cells = make_cells(1, 16, False, False, seed=0)
        if adaptive is None:
            self.case(request_class, cells, k=1, deadline_s=timeout, strategy=strategy)
            return
        modes = ["images"] + (["features"] if adaptive.get("analyse", True) and adaptive.get("ship") != "images" else [])
        for cls in self.entitled(request_class):
            for mode in modes:
                self.case(cls, cells, k=1, deadline_s=timeout, strategy=strategy,
                          adaptive=adaptive | {"ship": mode}, warming=True)

    def _pipeline(self, strategy: str, adaptive: dict | None) -> CasePipeline:
        """The strategy's case pipeline, made with its first case's table."""
        if strategy not in self.pipelines:
            adaptive = adaptive or {}
            values = adaptive.get("feature_values") or self.feature_values
            analyse = bool(adaptive) and adaptive.get("analyse", True) and self.feature_values > 0
            settings = Settings(small_request_copies=adaptive.get("small_request_copies", SMALL_REQUEST_COPIES),
                                copy_gap_s=adaptive.get("copy_gap_s", COPY_GAP_S),
                                reserve_share=0.0, max_reserve_s=0.0)
            self.pipelines[strategy] = CasePipeline(
                self.classes, self.directory, Predictor(), settings=settings, feature_count=values,
                analysers=WaitingAnalysers(self.analysis_s, self.nodes, values) if analyse else None,
                schema=self.feature_schema if analyse else "")
        return self.pipelines[strategy]

    def case(self, request_class: str, cells: list[pb.CellImage], k: int, deadline_s: float,
             case_id: str = "", strategy: str = "", adaptive: dict | None = None, warming: bool = False,
             seed: int = 0) -> dict:
        """One case to every site at once; the completion time is when the last site has answered.

        `strategy` names the network the case meets (its own pipeline); `adaptive` (the
        strategy's `Adaptive` table as a dict, or None) runs the coordinator's policy, planned
        against its class's deadline; every call is cut off at `deadline_s`.
        """
        if adaptive is not None and strategy not in self.pipelines and not warming:
            self._pipeline(strategy, adaptive)
            # Each strategy is a network of its own, seen by a coordinator of its own: its own connections.
            self.strategy_channels[strategy] = self._channels(
                renew=adaptive.get("renew_connections", RENEW_CONNECTIONS))
            for site in self.sites:  # the coordinator opens these when it learns a site's ports
                self.strategy_channels[strategy].connect(
                    site, self.entitled(request_class),
                    lanes=adaptive.get("small_request_copies", SMALL_REQUEST_COPIES))
            self.warm(request_class, strategy=strategy, adaptive=adaptive)
        pipeline = self._pipeline(strategy, adaptive)
        if pipeline.analysers is not None:
            pipeline.analysers.waiting, pipeline.analysers.seed = not warming, seed
        own = self._channels() if adaptive is None else None  # today's case: connections of its own
        channels = own or self.strategy_channels.get(strategy) or self.channels
        asked = self.classes[request_class]
        plan_deadline = (adaptive or {}).get("deadlines_s", {}).get(request_class, deadline_s)
        metadata = (((WIRE_REPLY_KEY, str(adaptive.get("thumbnail_bytes", WIRE_THUMBNAIL_BYTES))),)
                    if adaptive is not None else ())
        case = Case(case_id, asked, asked, list(self.sites), cells, k, deadline_s, time.monotonic(),
                    ship=(adaptive or {}).get("ship", "auto"), metadata=metadata,
                    trial=Trial(static=adaptive is None, learn=not warming,
                                subset=not (adaptive or {}).get("feature_values"), plan_deadline_s=plan_deadline))
        try:
            steps = list(pipeline.run(case, channels=channels))
        finally:
            if own is not None:
                own.close()
        total = time.monotonic() - case.started
        return self._record(steps, channels, pipeline, asked, total, plan_deadline, adaptive is not None)

    def _record(self, steps: list, channels: ClassChannels, pipeline: CasePipeline, asked, total: float,
                plan_deadline: float, adaptive: bool) -> dict:
        """The run's record of one case, from the pipeline's steps."""
        plan = steps[0].event.plan
        summary = steps[-1].event.summary
        analysis_s = summary.analysis_s if pipeline.analysers is not None and pipeline.analysers.last_s else 0.0
        sites = [self._site_entry(step, channels, analysis_s) for step in steps if step.outcome is not None]
        return {"completion_s": total, "ok": all(s["status"] == "OK" for s in sites), "sites": sites,
                "analysis_s": analysis_s, "dscp": asked.dscp, "policy": "adaptive" if adaptive else "static",
                "predicted_s": plan.predicted_s or None, "deadline_s": plan_deadline,
                "met_deadline": total <= plan_deadline, "modes": sorted({s["mode"] for s in sites}),
                "bytes_up": sum(s["bytes_up"] for s in sites), "bytes_down": sum(s["bytes_down"] for s in sites)}

    @staticmethod
    def _site_entry(step, channels: ClassChannels, analysis_s: float) -> dict:
        """A site's part of the record: its time since the case began, its copies and bytes."""
        outcome, result = step.outcome, step.event.site_result
        run, plan, reply = step.fan.runs[outcome.site], outcome.plan, outcome.reply
        entry = {"site": outcome.site, "status": outcome.code.name, "total_s": step.at_s,
                 "bytes_up": sum(a.request_bytes for a in run.attempts), "mode": result.mode,
                 "prior_s": analysis_s if result.mode == "features" else 0.0,
                 "request_class": result.request_class, "predicted_s": plan.predicted_s,
                 "hedge_after_s": plan.hedge_after_s, "copies": len(run.attempts),
                 "decisions": list(result.decisions), "why": reasons.as_json(result.why)}
        if reply is None:
            return entry | {"error": outcome.message, "bytes_down": 0}
        wall = reply.timing.site_wall_s
        return entry | {"compute_s": wall, "transfer_s": step.at_s - entry["prior_s"] - wall,
                        "bytes_down": reply.ByteSize(),
                        "address": channels.address(outcome.site, outcome.attempt.request_class)}

    def close(self) -> None:
        for channels in [self.channels, *self.strategy_channels.values()]:
            channels.close()


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
     "k": K, "seed": S, "deadline_s": D, "case_id": ID, "strategy": NAME, "adaptive": {...} or null}.
    """
    parser = argparse.ArgumentParser(prog="services.experiment.workload agent")
    parser.add_argument("--site", action="append", required=True, help="NAME=HOST:PORT (control port)")
    parser.add_argument("--feature-schema", default="", help="the schema of the features sent in features mode")
    parser.add_argument("--feature-values", type=int, default=0, help="values per feature vector")
    parser.add_argument("--analysis-s", type=float, default=0.0,
                        help="the coordinator's analysis time per image, seconds (a wait, features mode only)")
    parser.add_argument("--site-nodes", type=int, default=SITE_NODES,
                        help="the master's nodes that analysis is pipelined over (a site's)")
    add_classes_argument(parser)
    args = parser.parse_args(argv)
    # The predictor's scipy.stats is loaded now, not in a timed case (each strategy's first
    # case makes its Predictor); the transfer sites never load it (2 s of CPU each).
    from qos.predict import theilslopes
    theilslopes()
    master = Master(dict(s.split("=", 1) for s in args.site), args.classes, args.feature_schema,
                    args.feature_values, args.analysis_s, args.site_nodes)
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
                    reply = master.case(cmd["class"], cells, cmd["k"], cmd["deadline_s"], cmd.get("case_id", ""),
                                        strategy=cmd.get("strategy", ""), adaptive=cmd.get("adaptive"),
                                        seed=cmd["seed"])
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
    parser.add_argument("--wire-match-bytes", type=int, default=WIRE_THUMBNAIL_BYTES,
                        help="thumbnail bytes per match when a call asks for wire-sized replies")
    parser.add_argument("--feature-schema", default="", help="takes features of this schema (none: images only)")
    parser.add_argument("--analysis-s", type=float, default=0.0, help="analysis time per image, seconds (a wait)")
    parser.add_argument("--feature-count", type=int, default=0,
                        help="the catalogue's feature count: the site advertises a selection of them (0: none)")
    parser.add_argument("--site-nodes", type=int, default=SITE_NODES,
                        help="the nodes the images' analysis is pipelined over")
    add_classes_argument(parser)
    args = parser.parse_args(argv)
    server = serve_transfer_site(args.name, args.host, args.port, args.match_bytes, args.classes,
                                 args.wire_match_bytes, args.feature_schema, args.analysis_s, args.site_nodes,
                                 args.feature_count)
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
