"""The coordinator: one case in, every site at once, each site's answer out as it arrives.

SubmitCase, step by step:
1. validate the case (validation.py) and pick its request class;
2. send the same AnalyseRequest to every chosen site at once, on that (site, class)'s
   channel (qos/transport.py: marked with the class's DSCP both ways), each call with
   the time left of the case's deadline, less a small reserve to report in time;
3. stream a SiteResult the moment each site answers, or fails (UNAVAILABLE,
   DEADLINE_EXCEEDED, ...: partial results, never a hang);
4. send the summary (votes per test cell), record the case (JSON line + per-class stats).
A client that cancels cancels every site call still running.

Towards clients the coordinator marks its replies the way sites do towards it
(qos/transport.py's `MarkedServer`): next to its control port it serves one port per
request class, whose socket carries that class's DSCP, and advertises them with the Info
RPC. services/client.py learns them once and sends each case to its class's port, so the
streamed SiteResults and the summary go back with the class's DSCP.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
import uuid
from dataclasses import replace

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pathmaster import defaults
from pathmaster.ids import check_id, log_tag, shown
from pathmaster.records import InvalidInput
from pathmaster.vocabulary import majority
from qos.admission import Admission, Refused
from qos.policy import plan_site
from qos.predict import CaseModel, PredictionLog, Predictor, SiteLoad
from qos.transport import (STALE_PORT_CODES, ClassChannels, MarkedServer, client_identity, connect_address,
                           split_address)
from services.classinfo import class_messages
from services.metrics import case_outcome, serve_metrics, stop_metrics
from services.config import CoordinatorConfig
from services.coordinator.fanout import (FanOut, SiteOutcome, as_sent, features_request, features_request_bytes,
                                         new_send_id)
from services.coordinator.learnt import SiteModels, with_embeddings
from services.coordinator.sitewatch import SITE_SERVICE, SiteWatch
from services.coordinator.stats import CaseLog, ClassStats, CoordinatorMetrics
from services.coordinator.validation import CaseRejected, check_case_request
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from services.tracing import analysis_span, server_interceptors, start_tracing, traced_channel

log = logging.getLogger("pathmaster.coordinator")

COORDINATOR_SERVICE = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
INFO_TIMEOUT_S = 2.0
RETRY_LOOKUP_S = 10.0    # a site whose Info failed is not waited for again sooner
REFRESH_TIMEOUT_S = 30.0  # background look-up after a failure
# Of the time left, keep this share (at most MAX_RESERVE_S) to stream the last results
# and the summary before the client's own deadline.
RESERVE_SHARE, MAX_RESERVE_S = 0.05, 0.25


def site_deadline(now: float, case_deadline: float) -> float:
    """Seconds a site call may take, from `now`, to leave the coordinator time to report."""
    left = case_deadline - now
    return max(0.0, left - min(MAX_RESERVE_S, RESERVE_SHARE * left))


def site_load(load: pb.SiteLoad) -> SiteLoad:
    """A site's reported load as the predictor's SiteLoad."""
    return SiteLoad(waiting_cells=load.waiting_cells, workers=max(1, load.workers),
                    seconds_per_cell=dict(load.seconds_per_cell), waiting_s=load.waiting_s)


def vote(cells_by_site: list[list[pb.CellResult]]) -> list[pb.CellVote]:
    """Per test cell, the diagnosis most often among every site's matches, and the Bethesda
    term most often (sites with different vocabularies vote together in those; ties: first
    seen; ``pathmaster.vocabulary.majority``)."""
    matches: dict[str, list[pb.Match]] = {}
    for cells in cells_by_site:
        for cell in cells:
            matches.setdefault(cell.query_cell_id, []).extend(cell.matches)
    votes = []
    for cell_id, found in matches.items():
        by_label = majority(m.diagnosis for m in found)
        if by_label is None:
            continue
        cell_vote = pb.CellVote(query_cell_id=cell_id, diagnosis=by_label.label, votes=by_label.votes,
                                total=by_label.total)
        _set_bethesda(cell_vote, majority(m.bethesda for m in found))
        votes.append(cell_vote)
    return votes


def case_bethesda(cells_by_site: list[list[pb.CellResult]]) -> pb.CellVote:
    """The case's majority in Bethesda terms over every match of every cell and site."""
    case_vote = pb.CellVote()
    _set_bethesda(case_vote, majority(m.bethesda for cells in cells_by_site for c in cells for m in c.matches))
    return case_vote


def _set_bethesda(cell_vote: pb.CellVote, winner) -> None:
    if winner is not None:
        cell_vote.bethesda = winner.label
        cell_vote.bethesda_votes, cell_vote.bethesda_total = winner.votes, winner.total


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """The Coordinator service (see the module docstring)."""

    def __init__(self, config: CoordinatorConfig, channels: ClassChannels, stats: ClassStats,
                 case_log: CaseLog, metrics: CoordinatorMetrics | None = None):
        self.config = config
        self.channels = channels
        self.stats = stats
        self.case_log = case_log
        self.metrics = metrics or CoordinatorMetrics(stats)
        self.site_names = [s.name for s in config.sites]
        # Filled in by CoordinatorServer once its ports are bound; advertised by Info.
        self.class_ports: dict[str, int] = {}
        self.class_dscp: dict[str, int] = {}
        self.cases_cancelled = 0
        self.cases_running = 0  # SubmitCase calls in flight: they share the paths to the sites
        self._last_lookup: dict[str, float] = {}
        self._lookups: dict[str, grpc.Future] = {}
        self._refreshing: set[str] = set()
        self._lock = threading.Lock()
        # Predictable completion (issue 10): what each site says of itself, the predictor
        # fed by every answer, and the admission that keeps urgent capacity.
        self.site_schemas: dict[str, str] = {}
        # The feature columns each site compares (SiteInfo.feature_columns): a features
        # request carries only those values; none known: the full vectors.
        self.site_columns: dict[str, tuple[int, ...]] = {}
        # The learnt network each site compares ("" none), and the networks fetched (learnt.py)
        self.site_models: dict[str, str] = {}
        self.models = SiteModels()
        self.analysers = None            # services.coordinator.analysis.Analysers, once ready
        self.analysers_schema = ""       # their feature schema; "" while none are ready
        self.predictor = Predictor()
        self.predictions = PredictionLog()       # case-level predicted vs actual
        self.case_model = CaseModel()
        self.site_predictions = PredictionLog()  # per site
        from pathmaster.features import feature_names

        self.feature_count = len(feature_names())
        names = config.classes.names()
        self.admission = Admission(names, capacity=config.case_slots, reserved=config.urgent_reserved_slots,
                                   class_share=dict(config.class_share), per_client=config.per_client_cases)

    # ------------------------------------------------------------ routing to sites

    def _site_stub(self, site: str, class_name: str | None = None, lane: int = 0) -> pb_grpc.SiteStub:
        return pb_grpc.SiteStub(self.channels.channel(site, class_name, lane))

    def _lookup(self, site: str, timeout_s: float) -> grpc.Future:
        """The site's Info call in flight, or a new one: concurrent look-ups share one."""
        with self._lock:
            call = self._lookups.get(site)
            if call is None or call.done():
                # wait_for_ready: a site that was down when its channel was first used may be up now.
                call = self._site_stub(site).Info.future(pb.SiteInfoRequest(), timeout=timeout_s,
                                                         wait_for_ready=True)
                self._lookups[site] = call
                self._last_lookup[site] = time.monotonic()
            return call

    def resolve_class_ports(self, sites: list[str], timeout_s: float = INFO_TIMEOUT_S) -> None:
        """Learn which port of each site serves which class (in parallel, waiting up to
        `timeout_s` for a site that is still starting)."""
        calls = {s: self._lookup(s, timeout_s) for s in sites}
        for site, call in calls.items():
            try:
                info = call.result(timeout=timeout_s)
            except grpc.FutureTimeoutError:
                continue  # a longer look-up started by someone else is still running
            except grpc.RpcError as exc:
                log.warning("site %s: no Info (%s); its replies are unmarked until it answers",
                            site, exc.code().name)
                continue
            self._learn(site, info)
            log.info("site %s: class ports %s (its replies are marked per class)", site,
                     dict(info.class_ports))

    def _learn(self, site: str, info: pb.SiteInfo) -> None:
        """Take in what a site's Info says of it: class ports, feature schema and columns, load."""
        self.channels.set_class_ports(site, dict(info.class_ports))
        # Every class's connections (one per copy lane) open now, not at a case's time.
        self.channels.connect(site, list(info.class_ports), lanes=self.config.small_request_copies)
        self.site_schemas[site] = info.feature_schema
        self.site_columns[site] = tuple(info.feature_columns)
        self.site_models[site] = info.model_sha256
        self.predictor.site(site).load = site_load(info.load)

    def _site_cells(self, site: str, model: str, features: list[pb.CellFeatures]) -> list[pb.CellFeatures]:
        """The case's CellFeatures as `site` reads them (learnt.with_embeddings); without
        embeddings when its network cannot be had (the site then refuses, and the fan-out
        falls back to its images)."""
        embedder = None
        if model:
            try:
                embedder = self.models.get(model, self._site_stub(site))
            except (grpc.RpcError, ValueError) as exc:
                log.warning("site %s: its network %s not fetched (%s)", site, model[:16], exc)
        return with_embeddings(features, embedder, model)

    def _recheck(self, site: str, feature_schema: str, case_deadline: float) -> concurrent.futures.Future:
        """After `site` refused a features request: its Info again (it may have been
        re-indexed since it was read), taken in; the future's result is what it compares now,
        in words, when a features request of `feature_schema` can go to it again (its
        schema), else None (FanOut `recheck`)."""
        answer: concurrent.futures.Future = concurrent.futures.Future()
        call = self._site_stub(site).Info.future(
            pb.SiteInfoRequest(), timeout=max(0.0, min(INFO_TIMEOUT_S, case_deadline - time.monotonic())))

        def taken_in(call: grpc.Future) -> None:
            now = None  # whatever goes wrong, the fan-out hears (and falls back to the images)
            try:
                info = call.result()
                self._learn(site, info)
                columns = tuple(info.feature_columns)
                if info.feature_schema == feature_schema:
                    now = (f"{len(columns)} feature columns {list(columns)}" if columns
                           else "every feature (the full vectors)")
            except grpc.RpcError as exc:
                log.warning("site %s: no Info after it refused features (%s)", site, exc.code().name)
            finally:
                answer.set_result(now)

        call.add_done_callback(taken_in)
        return answer

    def _class_ports_for_case(self, sites: list[str], budget_s: float) -> None:
        """Before fan-out, learn the class ports of sites not yet known: join a look-up in
        flight, or start one unless one failed recently (a site that is down must not
        delay every case)."""
        now = time.monotonic()
        with self._lock:
            unknown = [s for s in sites if not self.channels.has_class_ports(s) and (
                (s in self._lookups and not self._lookups[s].done())
                or now - self._last_lookup.get(s, float("-inf")) >= RETRY_LOOKUP_S)]
        if unknown:
            self.resolve_class_ports(unknown, timeout_s=min(INFO_TIMEOUT_S, budget_s / 4))

    def _refresh_later(self, site: str) -> None:
        """Look a site's class ports up in the background: after it failed (it may have
        restarted on other ports) or first answered; one look-up per site at a time."""
        with self._lock:
            if site in self._refreshing:
                return
            self._refreshing.add(site)

        def refresh():
            try:
                self.resolve_class_ports([site], timeout_s=REFRESH_TIMEOUT_S)
            finally:
                with self._lock:
                    self._refreshing.discard(site)

        threading.Thread(target=refresh, daemon=True, name=f"refresh-{site}").start()

    # ------------------------------------------------------------ SubmitCase

    def SubmitCase(self, request: pb.CaseRequest, context: grpc.ServicerContext):
        started = time.monotonic()
        try:
            rclass = check_case_request(request, self.config.classes, self.config.max_cells,
                                        self.config.max_case_bytes, self.analysers_schema)
            sites = self._chosen_sites(request)
        except CaseRejected as exc:
            context.abort(exc.code, exc.message)
        budget = request.deadline_s or self.config.default_deadline_s
        grpc_left = context.time_remaining()
        if grpc_left is not None:
            budget = min(budget, grpc_left)
        case_deadline = started + budget
        case_id = request.case_id or uuid.uuid4().hex[:12]
        try:
            ticket = self.admission.admit(rclass.name, client_identity(context))
        except Refused as exc:
            context.set_trailing_metadata((("retry-after", f"{exc.retry_after_s:g}"),))
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{exc} (retry after {exc.retry_after_s:g} s)")
        in_flight = self.metrics.in_flight.labels(rclass.name)
        in_flight.inc()
        with self._lock:
            self.cases_running += 1
        try:
            yield from self._run_case(request, context, rclass, ticket, sites, case_id, started, budget, case_deadline)
        finally:
            with self._lock:
                self.cases_running -= 1
            in_flight.dec()
            self.admission.release(ticket)

    def _run_case(self, request, context, rclass, ticket, sites, case_id, started, budget, case_deadline):
        self._class_ports_for_case(sites, budget)
        served = self.config.classes[ticket.served_as]
        decisions = []
        if ticket.reclassified:
            decisions.append(f"urgent capacity is fully used: served as {served.name} (reclassified, not dropped)")
        k = request.k or defaults.K
        ship = request.ship or "auto"
        cells = len(request.features) or len(request.cells)
        send_id = new_send_id()  # the first send to every site, and its copies
        images_request = pb.AnalyseRequest(case_id=case_id, request_class=served.name, cells=request.cells, k=k,
                                           send_id=send_id)
        cell_ids = [f.cell_id for f in request.features] or [c.cell_id for c in request.cells]
        entitled = [c.name for c in self.config.classes if c.priority >= served.priority]
        if rclass.name != served.name:
            entitled = [rclass.name, *entitled]
        schema = self.analysers_schema
        sharing = max(1, self.cases_running)  # cases in flight now, this one included
        plans = {}
        for site in sites:
            site_schema = self.site_schemas.get(site, "")
            matches = bool(schema) and site_schema == schema
            features_bytes = features_request_bytes(cell_ids, self.feature_count, self.site_columns.get(site, ()),
                                                    case_id=case_id, request_class=served.name, k=k,
                                                    feature_schema=request.feature_schema or schema)
            mode_bytes = {"features": features_bytes, "images": images_request.ByteSize()}
            plans[site] = plan_site(
                site, requested=served.name, entitled=entitled, deadline_s=budget, ship=ship,
                schema_matches=matches or (bool(request.features) and site_schema == request.feature_schema),
                predict=lambda cls, mode, s=site: self._predict(s, cls, mode, mode_bytes[mode], cells, sharing),
                mode_bytes=mode_bytes, small_request_bytes=self.config.small_request_bytes,
                small_request_copies=self.config.small_request_copies, copy_gap_s=self.config.copy_gap_s)
        analysis_s = self._analysis_estimate(cells) if any(
            p.mode == "features" for p in plans.values()) and not request.features else 0.0
        # The recent median of like cases, else the modelled case calibrated (qos.predict.CaseModel).
        planned_modes = [p.mode for p in plans.values()]
        case_predicted, modelled_case = self.case_model.predict(
            planned_modes, cells, analysis_s, [p.predicted_s for p in plans.values()], sharing)
        # Case ids may be accession numbers: INFO names a case by its keyed tag only.
        log.debug("case %s is %s", log_tag(case_id), case_id)
        log.info("case %s (%s as %s): %d cells to %s, deadline %.1f s, predicted %s", log_tag(case_id), rclass.name,
                 served.name, cells, ", ".join(sites), budget,
                 "-" if case_predicted is None else f"{case_predicted:.2f} s")
        yield pb.CaseEvent(plan=pb.CasePlan(
            case_id=case_id, request_class=rclass.name, served_class=served.name, deadline_s=budget,
            predicted_s=case_predicted or 0.0, decisions=decisions,
            sites=[pb.SitePlan(site=s, mode=p.mode, request_class=p.request_class,
                               predicted_s=p.predicted_s or 0.0, hedge_after_s=p.hedge_after_s or 0.0,
                               reasons=list(p.reasons)) for s, p in plans.items()]))

        analysis_started = time.monotonic()
        features, cell_errors = self._features_for_case(request, plans, case_deadline, decisions)
        analysed_s = time.monotonic() - analysis_started if features is not None and not request.features else 0.0
        features_requests: dict[tuple, pb.AnalyseRequest] = {}  # by the columns and network a site compares

        def site_features(site: str) -> pb.AnalyseRequest | None:
            """The features request for `site`: only the values it compares (sites differ),
            with the cells' embeddings by its learnt network when it has one."""
            if features is None:
                return None
            columns, model = self.site_columns.get(site, ()), self.site_models.get(site, "")
            if (columns, model) not in features_requests:
                features_requests[(columns, model)] = features_request(
                    case_id, served.name, k, request.feature_schema or schema,
                    self._site_cells(site, model, features), columns, send_id)
            return features_requests[(columns, model)]

        have_images = all(cell.image for cell in request.cells)

        def send(site: str, class_name: str, mode: str, lane: int, send: str):
            message = site_features(site) if mode == "features" else images_request if have_images else None
            if message is None:
                return None
            message = as_sent(message, class_name, send)
            stub = pb_grpc.SiteStub(self.channels.channel(site, class_name, lane, busy_until=case_deadline))
            call = stub.Analyse.future(message, timeout=site_deadline(time.monotonic(), case_deadline))
            return call, message.ByteSize()

        fan = FanOut(plans, send, case_deadline, recheck=None if features is None else
                     lambda site: self._recheck(site, request.feature_schema or schema, case_deadline),
                     send_id=send_id)
        context.add_callback(fan.cancel)
        results: list[pb.SiteResult] = []
        closed = False
        try:
            for outcome in itertools.chain(fan.start(), fan.outcomes()):
                if not context.is_active():
                    break
                results.append(self._site_result(outcome, request, cell_errors, sharing))
                yield pb.CaseEvent(site_result=results[-1])
        except GeneratorExit:  # gRPC closes the stream when the client cancels
            closed = True
        fan.cancel()  # only copies still running, i.e. after a cancel or a lost deadline
        self.channels.refresh()  # with renew_connections: fresh connections for the next case, opened now
        cancelled = closed or not context.is_active()
        total_s = time.monotonic() - started
        if cancelled:
            with self._lock:
                self.cases_cancelled += 1
            log.info("case %s: cancelled by the client after %.3f s", log_tag(case_id), total_s)
            self.metrics.case(rclass.name, "cancelled", total_s)
            self._record(case_id, rclass, served, results, total_s, cells, "cancelled", case_predicted, decisions,
                         analysis_s=analysed_s)
            return
        error = self.predictions.add(case_predicted, total_s)
        if all(r.status_code == 0 for r in results):
            self.case_model.observe(planned_modes, [r.mode for r in results], cells, total_s, modelled_case, sharing)
        summary = pb.CaseSummary(
            case_id=case_id, request_class=rclass.name, total_s=total_s,
            sites_ok=sum(r.status_code == 0 for r in results),
            sites_failed=sum(r.status_code != 0 for r in results),
            bytes_sent=sum(r.bytes_sent for r in results),
            bytes_received=sum(r.bytes_received for r in results),
            votes=vote([list(r.cells) for r in results if r.status_code == 0]),
            predicted_s=case_predicted or 0.0, served_class=served.name, decisions=decisions,
            bethesda=case_bethesda([list(r.cells) for r in results if r.status_code == 0]),
            analysis_s=analysed_s,
        )
        outcome = case_outcome(summary.sites_ok, summary.sites_failed)  # failed: never a completion time
        self.metrics.case(rclass.name, outcome, total_s)
        self._record(case_id, rclass, served, results, total_s, cells, outcome, case_predicted, decisions,
                     prediction_error=error, analysis_s=analysed_s)
        yield pb.CaseEvent(summary=summary)

    # ------------------------------------------------------------ analysis and prediction

    def _predict(self, site: str, request_class: str, mode: str, request_bytes: int, cells: int,
                 sharing: int) -> float | None:
        return self.predictor.predict(site, request_class, mode, request_bytes, cells, sharing)

    def _analysis_estimate(self, cells: int) -> float:
        """Predicted seconds of the coordinator's own analysis of `cells` cells (0 before
        its analysers have analysed any)."""
        return (self.analysers.estimate_s(cells) if self.analysers else None) or 0.0

    def _features_for_case(self, request, plans, case_deadline, decisions):
        """The case's feature vectors (None when no site takes features) and per-cell errors."""
        wanted = [s for s, p in plans.items() if p.mode == "features"]
        if not wanted:
            return None, {}
        if request.features:
            return list(request.features), {}
        t0 = time.monotonic()
        try:
            with analysis_span(len(request.cells)):
                analysed = self.analysers.analyse(list(request.cells), max(0.1, case_deadline - t0))
        except Exception as exc:  # analysers gone or too slow: every site takes the images
            decisions.append(f"the coordinator could not analyse the cells ({type(exc).__name__}): "
                             "images sent to every site")
            for site in wanted:
                plans[site] = replace(plans[site], mode="images")
            return None, {}
        spent = time.monotonic() - t0
        errors = {cell.cell_id: r for cell, r in zip(request.cells, analysed) if isinstance(r, str)}
        features = [r for r in analysed if not isinstance(r, str)]
        if not features:  # nothing to search with: the sites report each cell's problem themselves
            for site in wanted:
                plans[site] = replace(plans[site], mode="images")
            return None, {}
        decisions.append(f"analysed {len(request.cells)} cells once at the coordinator in {spent:.2f} s; "
                         f"features sent to {', '.join(wanted)}")
        return features, errors

    def _chosen_sites(self, request: pb.CaseRequest) -> list[str]:
        if not request.sites:
            return list(self.site_names)
        unknown = [s for s in request.sites if s not in self.site_names]
        if unknown:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                               f"unknown site(s) {', '.join(map(repr, unknown))}; known sites: "
                               f"{', '.join(self.site_names)}")
        return list(dict.fromkeys(request.sites))

    def _site_result(self, outcome: SiteOutcome, request: pb.CaseRequest, cell_errors: dict,
                     sharing: int = 1) -> pb.SiteResult:
        """A site's final outcome -> SiteResult; an answer also feeds the predictor."""
        site, plan = outcome.site, outcome.plan
        attempt = outcome.attempt
        base = dict(site=site, status_code=outcome.code.value[0], bytes_sent=outcome.bytes_sent,
                    mode=attempt.mode if attempt else plan.mode,
                    request_class=attempt.request_class if attempt else plan.request_class,
                    predicted_s=plan.predicted_s or 0.0, decisions=[*plan.reasons, *outcome.decisions])
        self.metrics.site_call(site, base["request_class"], outcome.reply is not None, outcome.elapsed_s)
        if outcome.reply is None:
            if outcome.code in STALE_PORT_CODES and self.channels.has_class_ports(site):
                self._refresh_later(site)  # it may have restarted on other ports
            log.warning("%s", outcome.message)
            return pb.SiteResult(status_message=outcome.message,
                                 timing=pb.SiteTiming(total_s=outcome.elapsed_s), **base)
        reply = outcome.reply
        if not self.channels.has_class_ports(site):  # it answers: learn its ports for the next cases
            self._refresh_later(site)
        timing = pb.SiteTiming()
        timing.CopyFrom(reply.timing)
        timing.total_s = outcome.elapsed_s
        timing.transfer_s = max(0.0, outcome.elapsed_s - reply.timing.site_wall_s)
        reply_bytes = reply.ByteSize()
        cells = list(reply.cells)
        if attempt.mode == "features" and cell_errors:  # cells the coordinator could not analyse
            by_id = {c.query_cell_id: c for c in cells}
            cells = [by_id.get(c.cell_id) or pb.CellResult(query_cell_id=c.cell_id, error=cell_errors.get(c.cell_id, ""))
                     for c in request.cells]
        n_cells = max(1, len(reply.cells))
        self.predictor.observe(site, request_class=attempt.request_class, mode=attempt.mode,
                               request_bytes=attempt.request_bytes, reply_bytes=reply_bytes,
                               elapsed_s=outcome.elapsed_s, cells=n_cells, site_wall_s=reply.timing.site_wall_s,
                               load=site_load(reply.load), queue_s=reply.timing.queue_s, sharing=sharing)
        if plan.predicted_s:
            self.site_predictions.add(plan.predicted_s, outcome.elapsed_s)
        return pb.SiteResult(status_message="OK", algorithm=reply.algorithm, cells=cells, timing=timing,
                             bytes_received=reply_bytes, **base)

    def _record(self, case_id: str, rclass, served, results: list[pb.SiteResult], total_s: float,
                cells: int, outcome: str, predicted_s: float | None, decisions: list[str],
                prediction_error: float | None = None, analysis_s: float = 0.0) -> None:
        self.case_log.write({
            "case_id": case_id, "tag": log_tag(case_id), "class": rclass.name, "dscp": rclass.dscp, "outcome": outcome,
            "served_class": served.name, "cells": cells, "total_s": round(total_s, 6),
            "predicted_s": None if predicted_s is None else round(predicted_s, 6),
            "prediction_error": None if prediction_error is None else round(prediction_error, 4),
            "analysis_s": round(analysis_s, 6),
            "decisions": decisions,
            "bytes_sent": sum(r.bytes_sent for r in results),
            "bytes_received": sum(r.bytes_received for r in results),
            "sites": {
                r.site: {"status": _code_name(r.status_code), "mode": r.mode, "class": r.request_class,
                         "predicted_s": round(r.predicted_s, 6),
                         "total_s": round(r.timing.total_s, 6), "transfer_s": round(r.timing.transfer_s, 6),
                         "extraction_s": round(r.timing.extraction_s, 6), "search_s": round(r.timing.search_s, 6),
                         "site_wall_s": round(r.timing.site_wall_s, 6), "queue_s": round(r.timing.queue_s, 6),
                         "service_s": round(r.timing.service_s, 6),
                         "bytes_sent": r.bytes_sent, "bytes_received": r.bytes_received,
                         "decisions": list(r.decisions)}
                for r in results
            },
        })

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
            return self._site_stub(request.site).GetImage(
                request, timeout=context.time_remaining() or self.config.default_deadline_s)
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details())

    def Info(self, request: pb.CoordinatorInfoRequest, context) -> pb.CoordinatorInfo:
        return pb.CoordinatorInfo(class_ports=self.class_ports, class_dscp=self.class_dscp,
                                  classes=class_messages(self.config.classes),
                                  feature_schema=self.analysers_schema)

    def ListSites(self, request, context) -> pb.SitesReply:
        """Every site with its Info; serving only while it answers and its health says SERVING
        (a site with no live worker says NOT_SERVING until its workers are replaced)."""
        calls = {s.name: self._site_stub(s.name).Info.future(pb.SiteInfoRequest(), timeout=INFO_TIMEOUT_S)
                 for s in self.config.sites}
        checks = {s.name: health_pb2_grpc.HealthStub(self.channels.channel(s.name)).Check.future(
                      health_pb2.HealthCheckRequest(service=SITE_SERVICE), timeout=INFO_TIMEOUT_S)
                  for s in self.config.sites}
        statuses = []
        for site in self.config.sites:
            status = pb.SiteStatus(site=site.name, address=site.address)
            try:
                status.info.CopyFrom(calls[site.name].result())
                status.serving = checks[site.name].result().status == health_pb2.HealthCheckResponse.SERVING
            except grpc.RpcError:
                status.serving = False
            self.metrics.sites_up.labels(site.name).set(int(status.serving))
            statuses.append(status)
        return pb.SitesReply(sites=statuses)


def _code_name(code: int) -> str:
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))


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
        self.servicer = CoordinatorServicer(cfg, self.channels, self.stats, CaseLog(cfg.case_log), self.metrics)
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
        self._site_watch = SiteWatch(self.channels, self.servicer.site_names, self.metrics.sites_up).start()
        # Learn the sites' class ports now, so the first case's replies are marked too.
        self._stopping = threading.Event()
        threading.Thread(target=self._learn_class_ports, daemon=True, name="class-ports").start()
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
        from services.site.worker import ensure_ray

        try:
            ensure_ray(self.config.ray_address)
            self._analysers = Analysers(self.config.analysis_workers, self.config.analysis_cpus,
                                        self.config.cell_budget)
            schema = self._analysers.wait_ready(defaults.ANALYSIS_READY_S)
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
            self.servicer.resolve_class_ports(unknown(), timeout_s=REFRESH_TIMEOUT_S)
            if unknown():
                self._stopping.wait(RETRY_LOOKUP_S)

    def stop(self, grace: float = 1.0) -> None:
        self._stopping.set()
        self._site_watch.stop()
        self.server.stop(grace)
        if self._analysers is not None:
            self._analysers.stop()
            self._analysers = None
        stop_metrics(self._metrics_server)
        self._metrics_server = None
        self.channels.close()
        self.servicer.case_log.close()
