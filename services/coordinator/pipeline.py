"""One case, start to end: plan -> analyse -> fan out -> collect -> conclude -> record.

`CasePipeline` is the coordinator's whole handling of a case after it was admitted; the
coordinator's servicer is gRPC glue around it, and the testbed's workload (the master of
the QoS experiment) runs the same pipeline, so what the testbed measures is what the
product does; the few ways the testbed departs from it are one record, `Trial`.
Everything it talks to is injected: the sites' directory and channels, the analysers,
the predictor and case model, the clock, the case log and metrics (either may be
absent), so unit tests run it with fakes.

- **plan**: per site, the mode, class, hedge and copies (`qos.policy.plan_site`, or images
  as asked in a testbed's static `Trial`), each predicted (`qos.predict`), and the case's
  prediction;
- **analyse**: the cells once, here, when any site takes features (the analysers), else
  nothing; when that fails every site gets the images;
- **fan out**: every site at once (`FanOut`: copies, hedges, fallbacks), each request as
  that site compares (its feature columns), in the class planned;
- **collect**: each site's outcome as a SiteResult the moment it is final; an answer feeds
  the predictor;
- **conclude**: the summary of the case (`conclude`: votes per cell and the case's
  Bethesda term);
- **record**: the case model, the case log and the metrics.

Each step yields a `Step`: the protocol's CaseEvent, and for a site its outcome as the
fan-out saw it (the testbed reads its copies and bytes).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import grpc

from pathmaster.ids import log_tag
from pathmaster.records import Why
from pathmaster.vocabulary import BETHESDA_TERMS, majority, severity_order
from qos.admission import Turns
from qos.classes import ClassTable, RequestClass
from qos.policy import COPY_GAP_S, SMALL_REQUEST_BYTES, SMALL_REQUEST_COPIES, SitePlan, plan_site
from qos.predict import CaseModel, PredictionLog, Predictor
from qos.transport import STALE_PORT_CODES
from services import reasons
from services.coordinator.conclusion import case_conclusion
from services.coordinator.directory import SiteDirectory, site_load
from services.coordinator.learnt import with_embeddings
from services.coordinator.fanout import (FanOut, SiteOutcome, as_sent, features_request, features_request_bytes,
                                         new_send_id)
from services.metrics import case_outcome
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from services.tracing import analysis_span

log = logging.getLogger("pathmaster.coordinator")

# Of the time left, keep this share (at most MAX_RESERVE_S) to stream the last results
# and the summary before the client's own deadline.
RESERVE_SHARE, MAX_RESERVE_S = 0.05, 0.25


def site_deadline(now: float, case_deadline: float, share: float = RESERVE_SHARE,
                  most_s: float = MAX_RESERVE_S) -> float:
    """Seconds a site call may take, from `now`, to leave the coordinator time to report."""
    left = case_deadline - now
    return max(0.0, left - min(most_s, share * left))


@dataclass(frozen=True)
class Trial:
    """How the testbed's driver (services/experiment) runs a case the product never does.

    `static`: images in the class asked for, no policy (the 2002 study's case); `learn`:
    False for a warm-up case (nothing learnt of the whole case); `subset`: False sends every
    site the full feature vectors, not only its columns (a what-if); `plan_deadline_s`: the
    deadline planned against when it is not the cut-off (the class's deadline; None: the
    case's own).
    """

    static: bool = False
    learn: bool = True
    subset: bool = True
    plan_deadline_s: float | None = None


PRODUCT = Trial()  # the product's own way: policy, learning, each site's columns, its deadline


@dataclass
class Case:
    """One admitted case, as the pipeline runs it.

    `features` (with `feature_schema`) are the cells analysed by the client; `metadata`: of
    every site call; `concept_weights`: each site's request carries them (refine by concept);
    `trial`: the testbed's switches (`Trial`), the product's way unless its driver sets them.
    """

    case_id: str
    asked: RequestClass
    served: RequestClass
    sites: list[str]
    cells: list[pb.CellImage]
    k: int
    deadline_s: float
    started: float
    features: list[pb.CellFeatures] = field(default_factory=list)
    feature_schema: str = ""
    ship: str = "auto"
    why: list[Why] = field(default_factory=list)
    metadata: tuple = ()
    concept_weights: dict[str, float] = field(default_factory=dict)  # refine by concept: every site re-ranks
    trial: Trial = PRODUCT

    @property
    def deadline(self) -> float:
        return self.started + self.deadline_s

    @property
    def cell_ids(self) -> list[str]:
        return [f.cell_id for f in self.features] or [c.cell_id for c in self.cells]


@dataclass(frozen=True)
class Settings:
    """How requests go out: copies of a small one, and the share of the time left kept to report."""

    small_request_bytes: int = SMALL_REQUEST_BYTES
    small_request_copies: int = SMALL_REQUEST_COPIES
    copy_gap_s: float = COPY_GAP_S
    reserve_share: float = RESERVE_SHARE
    max_reserve_s: float = MAX_RESERVE_S


@dataclass
class Planned:
    """The plan of a case: each site's, and the case's prediction."""

    plans: dict[str, SitePlan]
    predicted_s: float | None
    modelled_s: float | None
    sharing: int
    schema: str             # the feature schema of the features sent ("" none)
    analysis_s: float = 0.0  # predicted seconds of the analysis here, before features go out (0: none)

    @property
    def modes(self) -> list[str]:
        return [p.mode for p in self.plans.values()]


@dataclass
class Analysed:
    """The cells' feature vectors (None: every site gets the images), per-cell errors, seconds."""

    features: list[pb.CellFeatures] | None = None
    errors: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass
class Step:
    """What the pipeline yields: the event, and for a site its outcome as the fan-out saw it."""

    event: pb.CaseEvent
    outcome: SiteOutcome | None = None
    fan: FanOut | None = None
    at_s: float = 0.0         # seconds since the case started


class CasePipeline:
    """Runs admitted cases (see the module docstring).

    Parameters
    ----------
    classes : ClassTable
        The request classes.
    directory : SiteDirectory
        What is known of the sites, and their channels.
    predictor : Predictor
        Each site call's prediction, fed by every answer.
    analysers : object, optional
        ``analyse(cells, timeout_s, priority) -> [CellFeatures | str]`` (the most favoured
        class's cells first: priority 0) and ``estimate_s(cells, priority)``;
        set later (`analysers`, `schema`) when they become ready. None: images only.
    schema : str
        The analysers' feature schema ("": none ready; every site gets the images).
    settings : Settings
    case_model : CaseModel, optional
    clock : callable
        Monotonic seconds.
    case_log, metrics : optional
        `stats.CaseLog` and `stats.CoordinatorMetrics`; None: not recorded.
    feature_count : int
        Values in a full feature vector (for planning a features request's bytes).
    turns : Turns, optional
        Where the cases' own computing (plan, send, collect, conclude and record; never a
        wait) takes turns, the most favoured class first: one at a time by default, as this
        process's interpreter runs them anyway.
    """

    def __init__(self, classes: ClassTable, directory: SiteDirectory, predictor: Predictor, *,
                 analysers=None, schema: str = "", settings: Settings = Settings(),
                 case_model: CaseModel | None = None, clock: Callable[[], float] = time.monotonic,
                 case_log=None, metrics=None, feature_count: int = 0, turns: Turns | None = None):
        self.classes = classes
        self.directory = directory
        self.predictor = predictor
        self.analysers, self.schema = analysers, schema
        self.settings = settings
        self.case_model = case_model or CaseModel()
        self.clock = clock
        self.case_log, self.metrics = case_log, metrics
        self.feature_count = feature_count
        self.turns = turns or Turns()
        self.predictions = PredictionLog()       # case-level predicted vs actual
        self.site_predictions = PredictionLog()  # per site
        self.cases_running = 0   # cases in flight: they share the paths to the sites
        self.cases_cancelled = 0
        self._lock = threading.Lock()

    # ------------------------------------------------------------ the whole case

    def run(self, case: Case, is_active: Callable[[], bool] = lambda: True,
            on_cancel: Callable[[Callable], object] | None = None, channels=None) -> Iterator[Step]:
        """Run `case`, yielding its plan, each site's result as it is final, and the summary
        (none when the client went away: `is_active` false, or the stream closed).
        `on_cancel(f)`: call f when the client cancels; `channels`: this case's own
        (default the directory's)."""
        with self._lock:
            self.cases_running += 1
        try:
            yield from self._run(case, is_active, on_cancel, channels or self.directory.channels)
        finally:
            with self._lock:
                self.cases_running -= 1

    def _run(self, case: Case, is_active, on_cancel, channels) -> Iterator[Step]:
        self.directory.before_case(case.sites, case.deadline_s)
        with self._turn(case):
            planned = self.plan(case)
            plan = pb.CaseEvent(plan=self.plan_message(case, planned))
        yield Step(plan)
        analysed = self.analyse(case, planned)
        with self._turn(case):
            fan = self.fan_out(case, planned, analysed, channels)
            if on_cancel is not None:
                on_cancel(fan.cancel)
            unsendable = fan.start()
        results: list[pb.SiteResult] = []
        closed = False
        try:
            for outcome in itertools.chain(unsendable, fan.outcomes()):
                if not is_active():
                    break
                with self._turn(case):
                    results.append(self.collect(case, planned, analysed, outcome))
                yield Step(pb.CaseEvent(site_result=results[-1]), outcome, fan, self.clock() - case.started)
        except GeneratorExit:  # gRPC closes the stream when the client cancels
            closed = True
        fan.cancel()  # only copies still running, i.e. after a cancel or a lost deadline
        channels.refresh()  # with renew_connections: fresh connections for the next case, opened now
        total_s = self.clock() - case.started
        if closed or not is_active():
            with self._lock:
                self.cases_cancelled += 1
            log.info("case %s: cancelled by the client after %.3f s", log_tag(case.case_id), total_s)
            with self._turn(case):
                self.record(case, planned, analysed, results, total_s, "cancelled")
            return
        with self._turn(case):
            summary = self.conclude(case, planned, analysed, results, total_s)
            self.record(case, planned, analysed, results, total_s,
                        case_outcome(summary.sites_ok, summary.sites_failed))
        yield Step(pb.CaseEvent(summary=summary), at_s=total_s)

    def _turn(self, case: Case):
        """The case's turn to compute, at its class's priority (`Turns.turn`)."""
        return self.turns.turn(case.served.priority)

    # ------------------------------------------------------------ plan

    def plan(self, case: Case) -> Planned:
        """Each site's plan and the case's prediction."""
        served, cells = case.served, len(case.cell_ids)
        entitled = [c.name for c in self.classes if c.priority >= served.priority]
        if case.asked.name != served.name:
            entitled = [case.asked.name, *entitled]
        schema = self.schema
        sharing = max(1, self.cases_running)  # cases in flight now, this one included
        images_bytes = pb.AnalyseRequest(case_id=case.case_id, request_class=served.name, cells=case.cells,
                                         k=case.k, send_id=new_send_id()).ByteSize()
        plans = {}
        for site in case.sites:
            site_schema = self.directory.schemas.get(site, "")
            mode_bytes = {"features": self._features_bytes(case, site, schema), "images": images_bytes}

            def predict(cls, mode, site=site, mode_bytes=mode_bytes):
                return self.predictor.predict(site, cls, mode, mode_bytes[mode], cells, sharing)

            if case.trial.static:
                plans[site] = SitePlan(site, "images", served.name, predict(served.name, "images"), None, None,
                                       why=(Why("images_as_sent"),))
                continue
            plans[site] = plan_site(
                site, requested=served.name, entitled=entitled,
                deadline_s=case.trial.plan_deadline_s or case.deadline_s, ship=case.ship,
                schema_matches=(bool(schema) and site_schema == schema) or (
                    bool(case.features) and site_schema == case.feature_schema),
                predict=predict, mode_bytes=mode_bytes, small_request_bytes=self.settings.small_request_bytes,
                small_request_copies=self.settings.small_request_copies, copy_gap_s=self.settings.copy_gap_s)
        analysis_s = self._analysis_estimate(cells, served.priority) if any(
            p.mode == "features" for p in plans.values()) and not case.features else 0.0
        # The recent median of like cases, else the modelled case calibrated (qos.predict.CaseModel).
        predicted, modelled = self.case_model.predict([p.mode for p in plans.values()], cells, analysis_s,
                                                      [p.predicted_s for p in plans.values()], sharing,
                                                      served.name)
        # Case ids may be accession numbers: INFO names a case by its keyed tag only.
        log.debug("case %s is %s", log_tag(case.case_id), case.case_id)
        log.info("case %s (%s as %s): %d cells to %s, deadline %.1f s, predicted %s", log_tag(case.case_id),
                 case.asked.name, served.name, cells, ", ".join(case.sites), case.deadline_s,
                 "-" if predicted is None else f"{predicted:.2f} s")
        return Planned(plans, predicted, modelled, sharing, case.feature_schema or schema, analysis_s)

    def _features_bytes(self, case: Case, site: str, schema: str) -> int:
        """The bytes of `site`'s features request, before the values are known."""
        columns = self.directory.columns.get(site, ()) if case.trial.subset else ()
        return features_request_bytes(case.cell_ids, self.feature_count, columns,
                                      case_id=case.case_id, request_class=case.served.name, k=case.k,
                                      feature_schema=case.feature_schema or schema)

    def _analysis_estimate(self, cells: int, priority: int) -> float:
        """Predicted seconds of the analysis here of `cells` cells of `priority` (0 before any)."""
        return (self.analysers.estimate_s(cells, priority) if self.analysers else None) or 0.0

    @staticmethod
    def plan_message(case: Case, planned: Planned) -> pb.CasePlan:
        return pb.CasePlan(
            case_id=case.case_id, request_class=case.asked.name, served_class=case.served.name,
            deadline_s=case.deadline_s, predicted_s=planned.predicted_s or 0.0, analysis_s=planned.analysis_s,
            decisions=reasons.decisions(case.why), why=reasons.reasons(case.why),
            sites=[pb.SitePlan(site=s, mode=p.mode, request_class=p.request_class,
                               predicted_s=p.predicted_s or 0.0, hedge_after_s=p.hedge_after_s or 0.0,
                               reasons=reasons.decisions(p.why), why=reasons.reasons(p.why))
                   for s, p in planned.plans.items()])

    # ------------------------------------------------------------ analyse

    def analyse(self, case: Case, planned: Planned) -> Analysed:
        """The case's feature vectors when any site takes features (the client's, or the
        analysers'); sites planned for features get the images when there are none, or when
        the eye they look through cannot be opened here (the case has images)."""
        plans = planned.plans
        wanted = [s for s, p in plans.items() if p.mode == "features"]
        if wanted and all(cell.image for cell in case.cells):
            # a site whose eye cannot be opened here would refuse features without their eye vectors
            lacking = [s for s in wanted if self.directory.models.get(s) and self.directory.network(s) is None]
            for site in lacking:
                plans[site] = replace(plans[site], mode="images")
            if lacking:
                case.why.append(Why("images_without_network", {"sites": ", ".join(lacking)}))
                wanted = [s for s in wanted if s not in lacking]
        if not wanted:
            return Analysed()
        if case.features:
            return Analysed(list(case.features))
        t0 = self.clock()
        try:
            with analysis_span(len(case.cells)):
                analysed = self.analysers.analyse(list(case.cells), max(0.1, case.deadline - t0),
                                                  priority=case.served.priority)
        except Exception as exc:  # noqa: BLE001 - analysers gone or too slow: every site takes the images
            case.why.append(Why("analysis_failed", {"error": type(exc).__name__}))
            analysed = []
        spent = self.clock() - t0
        features = [r for r in analysed if not isinstance(r, str)]
        if not features:  # nothing to search with: the sites report each cell's problem themselves
            for site in wanted:
                plans[site] = replace(plans[site], mode="images")
            return Analysed()
        case.why.append(Why("analysed_once", {"cells": len(case.cells), "seconds": spent, "sites": ", ".join(wanted)}))
        errors = {cell.cell_id: r for cell, r in zip(case.cells, analysed) if isinstance(r, str)}
        return Analysed(features, errors, spent)

    # ------------------------------------------------------------ fan out

    def fan_out(self, case: Case, planned: Planned, analysed: Analysed, channels) -> FanOut:
        """The case's FanOut, each site's request as it compares (its columns)."""
        send_id = new_send_id()  # the first send to every site, and its copies
        images = pb.AnalyseRequest(case_id=case.case_id, request_class=case.served.name, cells=case.cells,
                                   k=case.k, send_id=send_id, concept_weights=case.concept_weights)
        by_kind: dict[tuple, pb.AnalyseRequest] = {}   # by the columns and eye a site compares
        by_eye: dict[str, list[pb.CellFeatures]] = {}  # the cells with their vectors, once per eye
        have_images = all(cell.image for cell in case.cells)

        def site_features(site: str) -> pb.AnalyseRequest | None:
            """The features request for `site`: only the values it compares (sites differ),
            with the cells' vectors by its pretrained eye when it looks through one."""
            if analysed.features is None:
                return None
            columns = self.directory.columns.get(site, ()) if case.trial.subset else ()
            model = self.directory.models.get(site, "")
            if (columns, model) not in by_kind:
                if model not in by_eye:  # the eye is the costly part: ~17 ms a cell, whatever the columns
                    by_eye[model] = with_embeddings(analysed.features, self.directory.network(site), model)
                cells = by_eye[model]
                by_kind[(columns, model)] = features_request(case.case_id, case.served.name, case.k, planned.schema,
                                                             cells, columns, send_id)
                by_kind[(columns, model)].concept_weights.update(case.concept_weights)
            return by_kind[(columns, model)]

        def send(site: str, class_name: str, mode: str, lane: int, send: str):
            message = site_features(site) if mode == "features" else images if have_images else None
            if message is None:
                return None
            # A class the site does not serve (this coordinator's table re-maps the classes) goes
            # as the site's default class, on its control port: a site refuses names it lacks.
            served = self.directory.ports.get(site)
            message = as_sent(message, class_name if not served or class_name in served else "", send)
            stub = pb_grpc.SiteStub(channels.channel(site, class_name, lane, busy_until=case.deadline))
            timeout = site_deadline(self.clock(), case.deadline, self.settings.reserve_share,
                                    self.settings.max_reserve_s)
            return stub.Analyse.future(message, timeout=timeout, metadata=case.metadata), message.ByteSize()

        recheck = None if analysed.features is None else (
            lambda site: self.directory.recheck(site, planned.schema, case.deadline))
        return FanOut(planned.plans, send, case.deadline, recheck=recheck, send_id=send_id, clock=self.clock)

    # ------------------------------------------------------------ collect

    def collect(self, case: Case, planned: Planned, analysed: Analysed, outcome: SiteOutcome) -> pb.SiteResult:
        """A site's final outcome as its SiteResult; an answer also feeds the predictor."""
        site, plan, attempt = outcome.site, outcome.plan, outcome.attempt
        why = [*plan.why, *outcome.why]
        base = dict(site=site, status_code=outcome.code.value[0], bytes_sent=outcome.bytes_sent,
                    mode=attempt.mode if attempt else plan.mode,
                    request_class=attempt.request_class if attempt else plan.request_class,
                    predicted_s=plan.predicted_s or 0.0, decisions=reasons.decisions(why), why=reasons.reasons(why))
        if self.metrics is not None:
            self.metrics.site_call(site, base["request_class"], outcome.reply is not None, outcome.elapsed_s)
        if outcome.reply is None:
            if outcome.code in STALE_PORT_CODES and self.directory.knows(site):
                self.directory.refresh_later(site)  # it may have restarted on other ports
            log.warning("%s", outcome.message)
            return pb.SiteResult(status_message=outcome.message, timing=pb.SiteTiming(total_s=outcome.elapsed_s),
                                 **base)
        reply = outcome.reply
        if not self.directory.knows(site):  # it answers: learn its ports for the next cases
            self.directory.refresh_later(site)
        timing = pb.SiteTiming()
        timing.CopyFrom(reply.timing)
        timing.total_s = outcome.elapsed_s
        timing.transfer_s = max(0.0, outcome.elapsed_s - reply.timing.site_wall_s)
        reply_bytes = reply.ByteSize()
        cells = list(reply.cells)
        if attempt.mode == "features" and analysed.errors:  # cells the analysers could not analyse
            by_id = {c.query_cell_id: c for c in cells}
            cells = [by_id.get(c.cell_id) or pb.CellResult(query_cell_id=c.cell_id, error=analysed.errors.get(c.cell_id, ""))
                     for c in case.cells]
        self.predictor.observe(site, request_class=attempt.request_class, mode=attempt.mode,
                               request_bytes=attempt.request_bytes, reply_bytes=reply_bytes,
                               elapsed_s=outcome.elapsed_s, cells=max(1, len(reply.cells)),
                               site_wall_s=reply.timing.site_wall_s, load=site_load(reply.load),
                               queue_s=reply.timing.queue_s, sharing=planned.sharing)
        if plan.predicted_s:
            self.site_predictions.add(plan.predicted_s, outcome.elapsed_s)
        return pb.SiteResult(status_message="OK", algorithm=reply.algorithm, cells=cells, timing=timing,
                             bytes_received=reply_bytes, **base)

    # ------------------------------------------------------------ conclude

    def conclude(self, case: Case, planned: Planned, analysed: Analysed, results: list[pb.SiteResult],
                 total_s: float) -> pb.CaseSummary:
        """The case's summary from every site's result."""
        answered = [list(r.cells) for r in results if r.status_code == 0]
        summary = pb.CaseSummary(
            case_id=case.case_id, request_class=case.asked.name, total_s=total_s,
            sites_ok=sum(r.status_code == 0 for r in results),
            sites_failed=sum(r.status_code != 0 for r in results),
            bytes_sent=sum(r.bytes_sent for r in results),
            bytes_received=sum(r.bytes_received for r in results),
            predicted_s=planned.predicted_s or 0.0, served_class=case.served.name,
            decisions=reasons.decisions(case.why), why=reasons.reasons(case.why),
            analysis_s=analysed.seconds,
        )
        # The case conclusion (pathmaster.conclusion's case rule) and the cells' votes, from
        # every answer.
        summary.votes.extend(vote(answered))
        summary.conclusion.CopyFrom(case_conclusion(results, case.cell_ids))
        return summary

    # ------------------------------------------------------------ record

    def record(self, case: Case, planned: Planned, analysed: Analysed, results: list[pb.SiteResult],
               total_s: float, outcome: str) -> None:
        """Learn from the case (completed as planned, every site answered) and record it."""
        error = None
        if outcome != "cancelled" and case.trial.learn:
            error = self.predictions.add(planned.predicted_s, total_s)
            if all(r.status_code == 0 for r in results):
                self.case_model.observe(planned.modes, [r.mode for r in results], len(case.cell_ids), total_s,
                                        planned.modelled_s, planned.sharing, case.served.name)
        if self.metrics is not None:
            self.metrics.case(case.asked.name, outcome, total_s)
        if self.case_log is not None:
            self.case_log.write(case_record(case, planned, analysed, results, total_s, outcome, error))


def case_record(case: Case, planned: Planned, analysed: Analysed, results: list[pb.SiteResult], total_s: float,
                outcome: str, prediction_error: float | None) -> dict:
    """The case log's line for one case (no cell images; the case id also as its keyed tag)."""
    predicted_s = planned.predicted_s
    return {
        "case_id": case.case_id, "tag": log_tag(case.case_id), "class": case.asked.name, "dscp": case.asked.dscp,
        "outcome": outcome, "served_class": case.served.name, "cells": len(case.cell_ids),
        "total_s": round(total_s, 6), "predicted_s": None if predicted_s is None else round(predicted_s, 6),
        "prediction_error": None if prediction_error is None else round(prediction_error, 4),
        "analysis_s": round(analysed.seconds, 6),
        "decisions": reasons.decisions(case.why), "why": reasons.as_json(case.why),
        "bytes_sent": sum(r.bytes_sent for r in results),
        "bytes_received": sum(r.bytes_received for r in results),
        "sites": {r.site: site_record(r) for r in results},
    }


def site_record(r: pb.SiteResult) -> dict:
    """A site's part of the case log's line."""
    t = r.timing
    return {"status": _code_name(r.status_code), "mode": r.mode, "class": r.request_class,
            "predicted_s": round(r.predicted_s, 6), "total_s": round(t.total_s, 6),
            "transfer_s": round(t.transfer_s, 6), "extraction_s": round(t.extraction_s, 6),
            "search_s": round(t.search_s, 6), "site_wall_s": round(t.site_wall_s, 6),
            "queue_s": round(t.queue_s, 6), "service_s": round(t.service_s, 6),
            "bytes_sent": r.bytes_sent, "bytes_received": r.bytes_received,
            "decisions": list(r.decisions), "why": reasons.as_json(r.why)}


def _code_name(code: int) -> str:
    return next((c.name for c in grpc.StatusCode if c.value[0] == code), str(code))


# ---------------------------------------------------------------- the case's votes

def vote(cells_by_site: list[list[pb.CellResult]]) -> list[pb.CellVote]:
    """Per test cell, the diagnosis most often among every site's matches, and the Bethesda
    term most often (sites with different vocabularies vote together in those); a tie goes to
    the more severe (``pathmaster.vocabulary.majority``, ``severity_order``)."""
    matches: dict[str, list[pb.Match]] = {}
    for cells in cells_by_site:
        for cell in cells:
            matches.setdefault(cell.query_cell_id, []).extend(cell.matches)
    votes = []
    for cell_id, found in matches.items():
        by_label = majority((m.diagnosis for m in found), severity_order((m.diagnosis, m.bethesda) for m in found))
        if by_label is None:
            continue
        cell_vote = pb.CellVote(query_cell_id=cell_id, diagnosis=by_label.label, votes=by_label.votes,
                                total=by_label.total)
        _set_bethesda(cell_vote, majority((m.bethesda for m in found), BETHESDA_TERMS))
        votes.append(cell_vote)
    return votes


def _set_bethesda(cell_vote: pb.CellVote, winner) -> None:
    if winner is not None:
        cell_vote.bethesda = winner.label
        cell_vote.bethesda_votes, cell_vote.bethesda_total = winner.votes, winner.total
