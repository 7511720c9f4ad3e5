"""The coordinator: one case in, every site at once, each site's answer out as it arrives.

`CoordinatorServicer` is the gRPC glue: SubmitCase checks the case (validation.py), admits
it in its request class (qos.admission: urgent capacity kept, per-client caps) and streams
what the case pipeline (pipeline.py: plan, analyse, fan out, collect, conclude, record)
yields: the plan, a SiteResult the moment each site answers or fails (partial results,
never a hang), then the summary. A client that cancels cancels every site call still
running. What is known of each site lives in the site directory (directory.py).

Towards clients the coordinator marks its replies the way sites do towards it
(qos/transport.py's `MarkedServer`): next to its control port it serves one port per
request class, whose socket carries that class's DSCP, and advertises them with the Info
RPC. services/client.py learns them once and sends each case to its class's port, so the
streamed SiteResults and the summary go back with the class's DSCP.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pathmaster import defaults
from pathmaster.ids import check_id, shown
from pathmaster.records import InvalidInput, Why
from qos.admission import Admission, Refused
from qos.predict import Predictor
from qos.transport import ClassChannels, MarkedServer, client_identity, connect_address, split_address
from services.classinfo import class_messages
from services.config import CoordinatorConfig
from services.coordinator.analysis import ANALYSIS_READY_S
from services.coordinator.directory import INFO_TIMEOUT_S, REFRESH_TIMEOUT_S, RETRY_LOOKUP_S, SiteDirectory
from services.coordinator.pipeline import Case, CasePipeline, Settings
from services.coordinator.sitewatch import SITE_SERVICE
from services.coordinator.stats import CaseLog, ClassStats, CoordinatorMetrics
from services.coordinator.validation import CaseRejected, check_case_request
from services.metrics import serve_metrics, stop_metrics
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from services.tracing import server_interceptors, start_tracing, traced_channel

log = logging.getLogger("pathmaster.coordinator")

COORDINATOR_SERVICE = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
STOP_JOIN_S = 5.0  # how long `stop` waits for the thread learning the sites' class ports


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """The Coordinator service: gRPC glue around the case pipeline (pipeline.py) and the
    site directory (directory.py). SubmitCase checks and admits a case, then streams what
    the pipeline yields."""

    def __init__(self, config: CoordinatorConfig, channels: ClassChannels, stats: ClassStats,
                 case_log: CaseLog, metrics: CoordinatorMetrics | None = None):
        from pathmaster.features import feature_names

        self.config = config
        self.channels = channels
        self.stats = stats
        self.case_log = case_log
        self.metrics = metrics or CoordinatorMetrics(stats)
        self.site_names = [s.name for s in config.sites]
        # Filled in by CoordinatorServer once its ports are bound; advertised by Info.
        self.class_ports: dict[str, int] = {}
        self.class_dscp: dict[str, int] = {}
        predictor = Predictor()
        self.directory = SiteDirectory(self.site_names, channels, predictor, lanes=config.small_request_copies)
        self.pipeline = CasePipeline(
            config.classes, self.directory, predictor, case_log=case_log, metrics=self.metrics,
            settings=Settings(small_request_bytes=config.small_request_bytes,
                              small_request_copies=config.small_request_copies, copy_gap_s=config.copy_gap_s),
            feature_count=len(feature_names()))
        self.admission = Admission(config.classes.names(), capacity=config.case_slots,
                                   reserved=config.urgent_reserved_slots, class_share=dict(config.class_share),
                                   per_client=config.per_client_cases)

    @property
    def analysers(self):
        """The pipeline's analysers (None until they are ready)."""
        return self.pipeline.analysers

    @analysers.setter
    def analysers(self, analysers) -> None:
        self.pipeline.analysers = analysers

    @property
    def analysers_schema(self) -> str:
        """Their feature schema; "" while none are ready."""
        return self.pipeline.schema

    @analysers_schema.setter
    def analysers_schema(self, schema: str) -> None:
        self.pipeline.schema = schema

    @property
    def cases_cancelled(self) -> int:
        return self.pipeline.cases_cancelled

    @property
    def cases_running(self) -> int:
        return self.pipeline.cases_running

    @property
    def site_schemas(self) -> dict[str, str]:
        return self.directory.schemas

    @property
    def site_columns(self) -> dict[str, tuple[int, ...]]:
        return self.directory.columns

    def SubmitCase(self, request: pb.CaseRequest, context: grpc.ServicerContext):
        started = time.monotonic()
        try:
            rclass = check_case_request(request, self.config.classes, self.config.max_cells,
                                        self.config.max_case_bytes, self.pipeline.schema)
            sites = self._chosen_sites(request)
        except CaseRejected as exc:
            context.abort(exc.code, exc.message)
        budget = request.deadline_s or self.config.default_deadline_s
        grpc_left = context.time_remaining()
        if grpc_left is not None:
            budget = min(budget, grpc_left)
        try:
            ticket = self.admission.admit(rclass.name, client_identity(context))
        except Refused as exc:
            context.set_trailing_metadata((("retry-after", f"{exc.retry_after_s:g}"),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc} (retry after {exc.retry_after_s:g} s)")
        served = self.config.classes[ticket.served_as]
        case = Case(request.case_id or uuid.uuid4().hex[:12], rclass, served, sites, list(request.cells),
                    request.k or defaults.K, budget, started, features=list(request.features),
                    feature_schema=request.feature_schema, ship=request.ship or "auto",
                    concept_weights=dict(request.concept_weights),
                    why=[Why("class_reclassified_capacity", {"asked": rclass.name, "served": served.name})]
                    if ticket.reclassified else [])
        in_flight = self.metrics.in_flight.labels(rclass.name)
        in_flight.inc()
        steps = self.pipeline.run(case, context.is_active, context.add_callback)
        try:
            for step in steps:
                yield step.event
        finally:
            steps.close()  # a client that went away: the pipeline cancels the sites' calls and records
            in_flight.dec()
            self.admission.release(ticket)

    def _chosen_sites(self, request: pb.CaseRequest) -> list[str]:
        if not request.sites:
            return list(self.site_names)
        unknown = [s for s in request.sites if s not in self.site_names]
        if unknown:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                               f"unknown site(s) {', '.join(map(repr, unknown))}; known sites: "
                               f"{', '.join(self.site_names)}")
        return list(dict.fromkeys(request.sites))

    # ------------------------------------------------------------ the other RPCs

    def GetClassStats(self, request: pb.ClassStatsRequest, context) -> pb.ClassStatsReply:
        if request.request_class and request.request_class not in self.config.classes:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown request class {shown(request.request_class)}; known classes: "
                          f"{', '.join(self.config.classes.names())}")
        names = [request.request_class] if request.request_class else self.config.classes.names()
        return pb.ClassStatsReply(classes=[pb.ClassStats(**self.stats.summary(n)) for n in names])

    def GetImage(self, request: pb.ImageRequest, context) -> pb.ImageReply:
        if request.site not in self.site_names:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"unknown site {shown(request.site)}; known sites: {', '.join(self.site_names)}")
        try:
            check_id(request.cell_id, "cell id")
        except InvalidInput as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            return self.directory.stub(request.site).GetImage(
                request, timeout=context.time_remaining() or self.config.default_deadline_s)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details())

    def Info(self, request: pb.CoordinatorInfoRequest, context) -> pb.CoordinatorInfo:
        return pb.CoordinatorInfo(class_ports=self.class_ports, class_dscp=self.class_dscp,
                                  classes=class_messages(self.config.classes),
                                  feature_schema=self.pipeline.schema)

    def ListSites(self, request, context) -> pb.SitesReply:
        """Every site with its Info; serving only while it answers and its health says SERVING
        (a site with no live worker says NOT_SERVING until its workers are replaced). A site's
        eye (``model_sha256``) only when the coordinator can open that eye: a client analysing
        cells itself sends patches for it, else the images (services.client)."""
        calls = {s.name: self.directory.stub(s.name).Info.future(pb.SiteInfoRequest(), timeout=INFO_TIMEOUT_S)
                 for s in self.config.sites}
        checks = {s.name: health_pb2_grpc.HealthStub(self.channels.channel(s.name)).Check.future(
                      health_pb2.HealthCheckRequest(service=SITE_SERVICE), timeout=INFO_TIMEOUT_S)
                  for s in self.config.sites}
        statuses = []
        for site in self.config.sites:
            status = pb.SiteStatus(site=site.name, address=site.address)
            try:
                status.info.CopyFrom(calls[site.name].result())
                model = status.info.model_sha256
                if model and self.directory.eye_of(site.name, model, status.info.eye) is None:
                    status.info.model_sha256 = ""
                status.serving = checks[site.name].result().status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                status.serving = False
            self.metrics.sites_up.labels(site.name).set(int(status.serving))
            statuses.append(status)
        return pb.SitesReply(sites=statuses)


CASE_ID_KEY_FILE = "case-id-key"  # the default secret's name, beside the Ray token (cache_root())


def case_log(cfg: CoordinatorConfig) -> CaseLog:
    """The coordinator's case log (`cfg.case_log`; None: none kept): case ids as sent when
    the operator keeps them (`cfg.keep_case_ids`), else keyed by the deployment's secret in
    `cfg.case_id_key` (default cache_root()/CASE_ID_KEY_FILE), a 0600 file made on first start."""
    if not cfg.case_log or cfg.keep_case_ids:
        if cfg.case_log:
            log.warning("case log %s: case ids kept as the clients sent them (keep_case_ids)", cfg.case_log)
        return CaseLog(cfg.case_log)
    from pathmaster.ids import private_secret
    from services.synthetic import cache_root

    key_file = cfg.case_id_key or cache_root() / CASE_ID_KEY_FILE
    log.info("case log %s: case ids as their HMAC-SHA256 under the secret in %s", cfg.case_log, key_file)
    return CaseLog(cfg.case_log, key=bytes.fromhex(private_secret(key_file)))


class CoordinatorServer:
    """A running coordinator: gRPC (plus health, reflection) on a control port and one
    port per class (`config.class_ports`), and, when configured, a Prometheus endpoint.
    `.address` (control), `.class_ports`, `.metrics_url`; `stop()` ends them all."""

    def __init__(self, config: CoordinatorConfig):
        self.config = config
        self.metrics_url = ""
        self._metrics_server = None

    def start(self) -> "CoordinatorServer":
        cfg = self.config
        start_tracing(cfg.tracing, "pathmaster-coordinator")
        self.channels = ClassChannels({s.name: s.address for s in cfg.sites}, cfg.classes, cfg.site_tls,
                                      max_message_bytes=max(cfg.max_case_bytes * 2, 64 * 2**20),
                                      wrap=traced_channel,  # a span per site call, in the case's trace
                                      renew=cfg.renew_connections)
        self.stats = ClassStats(cfg.classes, cfg.stats_window)
        self.metrics = CoordinatorMetrics(self.stats)
        self.servicer = CoordinatorServicer(cfg, self.channels, self.stats, case_log(cfg), self.metrics)
        host, port = split_address(cfg.listen)
        self.server = MarkedServer(
            lambda server: pb_grpc.add_CoordinatorServicer_to_server(self.servicer, server),
            [COORDINATOR_SERVICE], host, port, cfg.class_ports, cfg.classes, cfg.tls, max_workers=64,
            max_message_bytes=max(cfg.max_case_bytes * 2, 64 * 2**20), interceptors=server_interceptors(),
        )
        self.servicer.class_ports = dict(self.server.class_ports)
        self.servicer.class_dscp = self.server.class_dscp
        self.server.start()
        self.address = connect_address(host, self.server.port)
        if cfg.metrics:
            self._metrics_server, self.metrics_url = serve_metrics(cfg.metrics, self.metrics.registry)
        self.servicer.directory.watch(self.metrics.sites_up)
        # Learn the sites' class ports now, so the first case's replies are marked too.
        self._stopping = threading.Event()
        self._learning = threading.Thread(target=self._learn_class_ports, daemon=True, name="class-ports")
        self._learning.start()
        self._analysers = None
        self._analysers_settled = threading.Event()  # ready, failed or not configured
        if cfg.analysis_workers <= 0:
            self._analysers_settled.set()
        else:
            threading.Thread(target=self._start_analysers, daemon=True, name="analysers").start()
        log.info("coordinator on %s (%s; classes on ports %s), %d sites%s", self.address,
                 "TLS" if cfg.tls else "no TLS", self.server.class_ports, len(cfg.sites),
                 f", metrics {self.metrics_url}" if self.metrics_url else "")
        return self

    @property
    def class_ports(self) -> dict[str, int]:
        """class -> the port that serves it and marks its replies."""
        return dict(self.server.class_ports)

    def _start_analysers(self) -> None:
        """Start the Ray actors that analyse each case once; until they are ready (or if
        they cannot start) every site gets the images."""
        from services.coordinator.analysis import Analysers
        from services.ray_local import ensure_ray

        try:
            ensure_ray(self.config.ray_address)
            self._analysers = Analysers(self.config.analysis_workers, self.config.analysis_cpus,
                                        self.config.cell_budget)
            schema = self._analysers.wait_ready(ANALYSIS_READY_S)
        except Exception as exc:  # noqa: BLE001 - the coordinator serves images-only instead
            log.warning("coordinator analysers did not start (%s: %s): images go to every site",
                        type(exc).__name__, exc)
            self._analysers_settled.set()
            return
        if self._stopping.is_set():
            self._analysers.stop()
            return
        self.servicer.analysers = self._analysers
        self.servicer.analysers_schema = schema
        self._analysers_settled.set()
        log.info("coordinator: %d analysers ready, feature schema %s", len(self._analysers.actors), schema)

    def wait_analysers(self, timeout_s: float) -> bool:
        """Wait until the analysers are ready (tests, the demo); True when they are."""
        self._analysers_settled.wait(timeout_s)
        return bool(self.servicer.analysers_schema)

    def _learn_class_ports(self) -> None:
        """Keep asking sites that have not answered Info yet (they may still be starting,
        Ray and all) until each has, or the coordinator stops."""
        def unknown() -> list[str]:
            return [s for s in self.servicer.site_names if not self.channels.has_class_ports(s)]

        while unknown() and not self._stopping.is_set():
            self.servicer.directory.resolve(unknown(), timeout_s=REFRESH_TIMEOUT_S)
            if unknown():
                self._stopping.wait(RETRY_LOOKUP_S)

    def stop(self, grace: float = 1.0) -> None:
        self._stopping.set()
        self.servicer.directory.close()  # its look-ups end: the channels they use can be closed
        self._learning.join(STOP_JOIN_S)
        self.server.stop(grace)
        if self._analysers is not None:
            self._analysers.stop()
            self._analysers = None
        stop_metrics(self._metrics_server)
        self._metrics_server = None
        self.channels.close()
        self.servicer.case_log.close()
