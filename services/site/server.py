"""A site's gRPC server: the `Site` service over one site database, work on Ray actors.

The gRPC handler only routes: each cell of a case goes to the site's Ray actors, which
already hold the FAISS index, most-favoured request class first (dispatch.py). The
handler waits for the cells with the call's own deadline, and as soon as the coordinator
cancels the call (or its deadline passes) stops the case's cells: queued ones are dropped,
running ones cancelled (the worker kills their analysis process), so the next case does
not wait behind work nobody will read.

The site is truthful about itself: dead workers are replaced with backoff
(supervisor.py), and while none is alive gRPC health says NOT_SERVING and Analyse is
refused at once with UNAVAILABLE; SERVING again once a replacement is ready.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque

import grpc
import ray

from pathmaster import defaults
from pathmaster.records import InvalidInput
from pathmaster.ids import log_tag, shown
from qos.classes import DEFAULT_CLASSES, ClassTable
from qos.predict import RecentMedian
from qos.transport import CopyFilter, MarkedServer, connect_address
from services.cells import check_cell_size
from services.config import SiteConfig
from services.shared import MAX_K, check_weights, pack
from services.dispatch import Job, PriorityDispatcher, WorkersDown
from services.fate import remember_descendants
from services.metrics import serve_metrics, stop_metrics
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from services.ray_local import ensure_ray
from services.site.metrics import SiteMetrics
from services.site.supervisor import Supervisor
from services.site.worker import (AnalyseCell, CellOutcome, FeatureCell, FetchImage, SearchFeatures, SiteWorker,
                                  start_worker, start_workers, stop_workers)
from services.tracing import server_interceptors, start_tracing

log = logging.getLogger("pathmaster.site")

SITE_SERVICE = pb.DESCRIPTOR.services_by_name["Site"].full_name
POLL_S = 0.1  # how often a waiting handler checks whether its caller has gone
METHOD_OF_MODE = {"images": AnalyseCell.method, "features": SearchFeatures.method}  # the worker method of each mode
# What a site learnt, as the worker's info names it and SiteInfo carries it.
LEARNT_INFO = ("similarity", "similarity_note", "model_sha256", "eye", "abnormal_score", "abnormal_threshold",
               "abnormal_sensitivity", "abnormal_specificity")


def cell_result(outcome: CellOutcome) -> pb.CellResult:
    """A worker's CellOutcome -> the wire's CellResult (core Match + thumbnail -> pb.Match),
    with each match's similarity and packed measures when the worker explained it, and the
    cell's abnormality score by the site's own model."""
    matches = []
    for i, (m, thumbnail, sha, bethesda) in enumerate(zip(outcome.matches, outcome.thumbnails, outcome.image_sha256,
                                                          outcome.bethesda, strict=True)):
        match = pb.Match(cell_id=m.cell_id, diagnosis=m.diagnosis or "", distance=m.distance,
                         thumbnail=thumbnail, source_id=m.source_id, image_sha256=sha, bethesda=bethesda)
        if outcome.similarity:
            match.similarity = outcome.similarity[i]
        if outcome.same_cell:
            match.same_cell = outcome.same_cell[i]
        if outcome.measures:
            ratios, shares = pack(outcome.measures[i])
            match.measure_log2_ratio.extend(ratios)
            match.measure_share.extend(shares)
        matches.append(match)
    return pb.CellResult(query_cell_id=outcome.query_cell_id, matches=matches,
                         background_estimated=outcome.background_estimated,
                         mask_estimated=outcome.mask_estimated, error=outcome.error,
                         abnormal_score=outcome.abnormal_score, abnormal=outcome.abnormal)


class _CallerGone(Exception):
    """The coordinator cancelled the call (or went away)."""


class SiteServicer(pb_grpc.SiteServicer):
    """The Site service over a list of Ray actor handles (see worker.py)."""

    def __init__(self, name: str, workers: list, info: dict, classes: ClassTable = DEFAULT_CLASSES,
                 metrics: SiteMetrics | None = None):
        self.name = name
        self.metrics = metrics or SiteMetrics(classes)
        self.workers = workers
        self.classes = classes
        self.dispatcher = PriorityDispatcher(workers)
        self.info = info
        self.class_ports: dict[str, int] = {}
        self.class_dscp: dict[str, int] = {}
        self._lock = threading.Lock()
        # Recent case ids, for operators and tests: taken here (past every check), and abandoned by their caller.
        self.cases_started: deque[str] = deque(maxlen=1000)
        self.copies = CopyFilter()  # copies of one request (qos.policy): answered once
        self.cases_cancelled: deque[str] = deque(maxlen=1000)
        self.seconds_per_cell: dict[str, RecentMedian] = {}  # by mode, over recent calls
        # A SiteWorker in this process that searches features-mode requests in the handler's
        # own thread (SiteConfig.search_in_server); None: they go to the Ray workers.
        self.local = None

    def load(self) -> pb.SiteLoad:
        """What the coordinator's predictor needs: the queue (cells, and seconds of work
        ahead of a new cell, in all and for each class as the dispatch orders it), the
        workers, the service time per cell by mode."""
        with self._lock:
            per_cell = {mode: recent.value() for mode, recent in self.seconds_per_cell.items()}
        by_method = {METHOD_OF_MODE[mode]: s for mode, s in per_cell.items()}
        by_class = {name: self.dispatcher.work_ahead_s(by_method, self._priority(name))
                    for name in self.classes.names()}
        return pb.SiteLoad(waiting_cells=self.dispatcher.waiting(), workers=self.dispatcher.alive(),
                           seconds_per_cell=per_cell, waiting_s=self.dispatcher.work_ahead_s(by_method),
                           waiting_s_by_class=by_class)

    def _note_service(self, mode: str, jobs: list) -> None:
        """Add the call's service time per cell (its jobs' wall time on a worker,
        dispatch to result, Ray's round trip included) to the mode's recent median."""
        timed = [(job.service_s(), job.cells) for job in jobs]
        timed = [(s, n) for s, n in timed if s is not None]
        if not timed:
            return
        seconds = sum(s for s, _ in timed) / sum(n for _, n in timed)
        with self._lock:
            self.seconds_per_cell.setdefault(mode, RecentMedian()).add(seconds)

    def _jobs(self, request: pb.AnalyseRequest, context: grpc.ServicerContext, k: int) -> tuple[str, list]:
        """Queue the request's cells: analysed images, or (features mode) search only."""
        priority = self._priority(request.request_class)
        try:
            weights = check_weights(request.concept_weights) or None
        except ValueError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"site {self.name}: {exc}")
        if not request.features:
            # A field of view instead of a cell is refused from its header, before any work;
            # each cell's analysis stops at the call's deadline (pathmaster/analysis/budget.py).
            try:
                for cell in request.cells:
                    check_cell_size(cell.cell_id, cell.image, cell.background, cell.mask)
            except InvalidInput as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"site {self.name}: {exc}")
            self._refuse_copy(request, context)
            remaining = context.time_remaining()
            deadline = None if remaining is None else time.time() + remaining
            return "images", [self.dispatcher.submit(priority, AnalyseCell(c.cell_id, c.image, c.background, c.mask,
                                                                           k, deadline, weights))
                              for c in request.cells]
        if request.cells:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "send cells as images or as features, not both")
        schema = self.info.get("feature_schema", "unknown")
        if request.feature_schema != schema:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"site {self.name} compares features of schema {schema}, not "
                          f"{request.feature_schema or 'unnamed'}: send the images instead")
        columns = self._check_columns(request, context)
        model = self.info.get("model_sha256", "")
        if model and any(f.model_sha256 != model for f in request.features):
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"site {self.name} looks through its pretrained eye: send each cell's vector by the eye "
                          f"{model[:16]} (SiteInfo.eye), or the images")
        self._refuse_copy(request, context)
        # One job for the whole request: a search is ~1 ms, a Ray task per cell costs more.
        cells = [FeatureCell(f.cell_id, list(f.values), f.background_estimated, f.mask_estimated,
                             _eye_vector(f.embedding), f.image_sha256.hex()) for f in request.features]
        work = SearchFeatures(cells, k, columns, weights)
        if self.local is not None:
            return "features", [self._search_here(work)]
        return "features", [self.dispatcher.submit(priority, work, cells=len(cells))]

    def _check_columns(self, request: pb.AnalyseRequest, context: grpc.ServicerContext) -> list[int] | None:
        """The columns a subset request carries (None: full vectors, checked cell by cell
        by the search), refused with INVALID_ARGUMENT unless they are this site's
        selection and every cell has that many values."""
        selected = list(self.info.get("feature_columns", []))
        columns = list(request.feature_columns)
        if columns and columns != selected:
            names = self.info.get("feature_column_names", [])
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"site {self.name} compares " + (
                              f"{len(selected)} feature columns {selected} ({', '.join(names)})" if selected
                              else "every feature") +
                          f", not the {len(columns)} columns {columns} of this request: send those, or the full vector")
        for f in request.features:
            if columns and len(f.values) != len(columns):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"site {self.name}: cell {shown(f.cell_id)} has {len(f.values)} feature values; "
                              f"the request names {len(columns)} columns and must carry one value for each")
        return columns or None

    def _search_here(self, work: SearchFeatures) -> Job:
        """A features request searched here, in the handler's thread, as a finished Job
        (its result, or the error a worker would have raised): no queue, no hand-off."""
        job = Job(work, cells=len(work.cells))
        job.started = time.perf_counter()
        try:
            job.result = self.local.search_many(*work)
        except Exception as exc:  # noqa: BLE001 - the handler turns it into a gRPC status, as for a worker's
            job.error = exc
        job.finished = time.perf_counter()
        job.done.set()
        return job

    def _refuse_copy(self, request: pb.AnalyseRequest, context: grpc.ServicerContext) -> None:
        """A copy of a request already taken (the coordinator sends small ones as several):
        refused, so that one reply goes back and the cells are searched once. Asked once the
        request has passed every check: a refused request is not taken, and its caller's
        corrected request is answered."""
        self.copies.refuse_copy(context, request.send_id)

    def _priority(self, class_name: str) -> int:
        """The class's priority (0 most favoured); no class ("") waits behind all (an
        unknown one is refused at the port, qos.server)."""
        return self.classes[class_name].priority if class_name in self.classes else len(self.classes.names())

    def _least_favoured(self) -> int:
        """The priority of the least favoured class (the largest number)."""
        return max(self.classes[name].priority for name in self.classes.names())

    def _wait_s(self, context: grpc.ServicerContext, request: pb.AnalyseRequest, jobs: list) -> float:
        """How long to wait for the next cell before looking at the caller again; aborts
        with DEADLINE_EXCEEDED when the call's deadline has passed, raises _CallerGone
        when the caller cancelled."""
        if not context.is_active():
            raise _CallerGone()
        remaining = context.time_remaining()
        if remaining is not None and remaining <= 0:
            unfinished = [job for job in jobs if not job.done.is_set()]
            cells = sum(job.cells for job in unfinished)
            context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, f"site {self.name}: deadline passed with "
                          + (f"{cells} cells unfinished" if cells else f"{len(unfinished)} jobs unfinished"))
        return POLL_S if remaining is None else max(0.0, min(POLL_S, remaining))

    def Analyse(self, request: pb.AnalyseRequest, context: grpc.ServicerContext) -> pb.AnalyseReply:
        started = time.perf_counter()
        label = self.metrics.label(request.request_class)
        outcome = "failed"  # unless it returns
        in_flight = self.metrics.in_flight.labels(label)
        in_flight.inc()
        try:
            reply, outcome = self._analyse(request, context, started)
            return reply
        finally:
            in_flight.dec()
            self.metrics.analyse_seconds.labels(label, outcome).observe(time.perf_counter() - started)

    def _analyse(self, request: pb.AnalyseRequest, context: grpc.ServicerContext,
                 started: float) -> tuple[pb.AnalyseReply, str]:
        """Analyse's work: (the reply, its outcome "ok" or "cancelled"); aborts otherwise."""
        if self.dispatcher.alive() == 0:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"site {self.name} cannot serve now: no worker is alive "
                                                       f"(replacements are being started)")
        if not request.cells and not request.features:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the request has no cells")
        if request.k < 0 or request.k > MAX_K:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"k must be 0-{MAX_K}, got {request.k}")
        k = request.k or defaults.K
        mode, jobs = self._jobs(request, context, k)
        self.cases_started.append(request.case_id)  # once taken: a refused request leaves nothing here
        log.info("site %s: case %s (%s): %s %d cells", self.name, log_tag(request.case_id), request.request_class,
                 "analysing" if mode == "images" else "searching with the features of", len(jobs))
        try:
            for job in jobs:
                while not job.done.wait(self._wait_s(context, request, jobs)):
                    pass
                if isinstance(job.error, WorkersDown):
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"site {self.name} cannot serve now: {job.error}")
                if isinstance(job.error, ray.exceptions.RayActorError):
                    context.abort(grpc.StatusCode.UNAVAILABLE, f"site {self.name}: a worker died: "
                                                               f"{type(job.error).__name__}")
                if job.error is not None:
                    log.error("site %s: case %s failed: %s", self.name, log_tag(request.case_id), job.error)
                    cause = getattr(job.error, "cause", job.error)
                    context.abort(grpc.StatusCode.INTERNAL,
                                  f"site {self.name}: analysis failed: {type(cause).__name__}: {cause}")
        except _CallerGone:
            self.cases_cancelled.append(request.case_id)
            log.info("site %s: case %s cancelled by the caller", self.name, log_tag(request.case_id))
            return pb.AnalyseReply(), "cancelled"  # nobody is listening any more
        finally:
            for job in jobs:
                if not job.done.is_set():
                    self.dispatcher.cancel(job)
        results: list[CellOutcome] = [r for job in jobs for r in (job.result if isinstance(job.result, list) else [job.result])]
        self._note_service(mode, jobs)
        begun = [job.started for job in jobs if job.started is not None]
        ended = [job.finished for job in jobs if job.finished is not None]
        return pb.AnalyseReply(
            site=self.name,
            algorithm=self.info["algorithm"],
            cells=[cell_result(r) for r in results],
            timing=pb.SiteTiming(
                extraction_s=sum(r.extraction_s for r in results),
                search_s=sum(r.search_s for r in results),
                site_wall_s=time.perf_counter() - started,
                queue_s=max(0.0, min(begun) - started) if begun else 0.0,
                service_s=max(0.0, max(ended) - min(begun)) if begun and ended else 0.0,
            ),
            database_cells=self.info["database_cells"],
            load=self.load(),
        ), "ok"

    def GetImage(self, request: pb.ImageRequest, context: grpc.ServicerContext) -> pb.ImageReply:
        """A database cell's image, read by a worker in its turn at the least favoured
        priority: it is fetched after the answer, so every queued cell of a case goes first."""
        if not request.cell_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "cell_id is empty")
        if self.dispatcher.alive() == 0:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"site {self.name} cannot serve now: no worker is alive")
        job = self.dispatcher.submit(self._least_favoured(), FetchImage(request.cell_id), cells=0)
        try:
            while not job.done.wait(self._wait_s(context, request, [job])):
                pass
        except _CallerGone:
            return pb.ImageReply()  # nobody is listening any more
        finally:
            if not job.done.is_set():
                self.dispatcher.cancel(job)
        if isinstance(job.error, WorkersDown | ray.exceptions.RayActorError):
            context.abort(grpc.StatusCode.UNAVAILABLE, f"site {self.name} cannot serve now: "
                                                       f"{type(job.error).__name__}")
        if isinstance(job.error, LookupError) or isinstance(getattr(job.error, "cause", None), LookupError):
            context.abort(grpc.StatusCode.NOT_FOUND, f"site {self.name} has no cell {shown(request.cell_id)}")
        if job.error is not None:
            raise job.error
        found = job.result
        return pb.ImageReply(cell_id=request.cell_id, image=found["image"],
                             diagnosis=found["diagnosis"], mask=found["mask"])

    def Info(self, request: pb.SiteInfoRequest, context: grpc.ServicerContext) -> pb.SiteInfo:
        return pb.SiteInfo(
            site=self.name,
            algorithm=self.info["algorithm"],
            database_cells=self.info["database_cells"],
            diagnoses=self.info["diagnoses"],
            workers=self.dispatcher.alive(),
            class_ports=self.class_ports,
            class_dscp=self.class_dscp,
            feature_schema=self.info.get("feature_schema", "unknown"),
            load=self.load(),
            vocabulary=vocabulary_message(self.info["vocabulary"]),
            feature_columns=self.info.get("feature_columns", []),
            feature_column_names=self.info.get("feature_column_names", []),
            database_origins=self.info.get("database_origins", {}),
            pixel_um=self.info.get("pixel_um", 0.0),
            representation=self.info.get("representation", ""),
            representation_cells=self.info.get("representation_cells", 0),
            **{key: self.info[key] for key in LEARNT_INFO if key in self.info},
        )


def _eye_vector(data: bytes) -> list[float]:
    """A features request's eye vector (CellFeatures.embedding, half floats) as floats; []
    when none was sent. An odd length is refused by the coordinator and by the site's own
    shape check (the vector is one value short)."""
    from pathmaster.eye._vectors import unpack_eye_vector

    return unpack_eye_vector(data[:len(data) - len(data) % 2]).tolist()


def vocabulary_message(vocabulary: dict) -> pb.Vocabulary:
    """A ``Vocabulary.as_dict`` as the Vocabulary message (aliases stay at the site)."""
    return pb.Vocabulary(name=vocabulary["name"], labels=vocabulary["labels"],
                         abnormal=vocabulary["abnormal"], bethesda=vocabulary["bethesda"])


class SiteServer:
    """A running site: Ray actors over `config.db` behind a control port and class ports.

    `start()` connects to Ray (local by default), starts the actors, and serves.
    `.address` is the control address; `.class_ports` the per-class ports; `stop()` ends it.
    """

    def __init__(self, config: SiteConfig):
        self.config = config
        self.workers: list = []
        self.server: MarkedServer | None = None
        self.servicer: SiteServicer | None = None
        self.supervisor: Supervisor | None = None
        self.metrics = SiteMetrics(config.classes)
        self.metrics_url = ""
        self._metrics_server = None

    def start(self) -> "SiteServer":
        cfg = self.config
        # with ray_resource the database lives on the Ray nodes that offer it, maybe not here:
        # a worker that cannot open it there fails start_workers, naming the folder
        if not cfg.ray_resource and not cfg.db.is_dir():
            raise FileNotFoundError(f"site {cfg.name}: database folder {cfg.db} not found "
                                    f"(build one with `pathmaster synth` and `pathmaster index`)")
        ensure_ray(cfg.ray_address)
        self.workers = start_workers(cfg.db, cfg.algorithm, cfg.workers, cfg.worker_cpus,
                                     budget=cfg.cell_budget,  # what one cell may cost (pathmaster/analysis/budget.py)
                                     resource=cfg.ray_resource)  # on the nodes holding cfg.db
        info = ray.get(self.workers[0].info.remote())
        remember_descendants()  # what Ray started meanwhile goes when this process goes (services/fate.py)
        self.servicer = SiteServicer(cfg.name, self.workers, info, cfg.classes, self.metrics)
        if cfg.search_in_server and not cfg.ray_resource:
            self.servicer.local = SiteWorker(cfg.db, budget=None)  # the index the workers use, built above
        host, _, port = cfg.listen.rpartition(":")
        start_tracing(cfg.tracing, "pathmaster-site")
        self.server = MarkedServer(
            lambda server: pb_grpc.add_SiteServicer_to_server(self.servicer, server),
            [SITE_SERVICE], host, int(port), cfg.class_ports, cfg.classes, cfg.tls, max_workers=32,
            interceptors=server_interceptors(),  # a span per call, in its case's trace
        )
        self.servicer.class_ports = dict(self.server.class_ports)
        self.servicer.class_dscp = self.server.class_dscp
        self.server.start()
        self.address = connect_address(host, self.server.port)
        self.metrics.cells_waiting.set_function(self.servicer.dispatcher.waiting)
        self.metrics.workers.labels("configured").set(len(self.workers))
        self.supervisor = Supervisor(
            cfg.name, self.servicer.dispatcher, lambda: start_worker(cfg.db, cfg.worker_cpus, cfg.cell_budget, cfg.ray_resource),
            self._workers_changed, restart_min_s=cfg.worker_restart_min_s,
            restart_max_s=cfg.worker_restart_max_s).start()
        if cfg.metrics:
            self._metrics_server, self.metrics_url = serve_metrics(cfg.metrics, self.metrics.registry)
        log.info("site %s: serving %s on %s (classes on ports %s), %d Ray worker(s), algorithm %s%s",
                 cfg.name, cfg.db, self.address, self.server.class_ports, len(self.workers), info["algorithm"],
                 f", metrics {self.metrics_url}" if self.metrics_url else "")
        return self

    def _workers_changed(self, alive: int, total: int, event: str) -> None:
        """The supervisor's news: health (NOT_SERVING while no worker is alive) and metrics."""
        self.metrics.workers.labels("alive").set(alive)
        if event == "replaced":
            self.metrics.restarts.inc()
        elif event == "failed":
            self.metrics.failed_starts.inc()
        if self.server is not None:
            self.server.set_serving(alive > 0)

    @property
    def class_ports(self) -> dict[str, int]:
        return dict(self.server.class_ports) if self.server else {}

    def stop(self, grace: float = 1.0) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        stop_metrics(self._metrics_server)
        self._metrics_server = None
        if self.server is not None:
            self.server.stop(grace)
            self.server = None
        if self.servicer is not None:
            self.servicer.dispatcher.stop()
        if self.workers:
            stop_workers(self.workers)
            self.workers = []
