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

import logging
import queue
import threading
import time
import uuid

import grpc
from prometheus_client import start_http_server

from pathmaster.ids import check_id, log_tag, shown
from pathmaster.records import InvalidInput
from pathmaster.vocabulary import majority
from qos.transport import STALE_PORT_CODES, ClassChannels, MarkedServer, connect_address, split_address
from services.config import CoordinatorConfig, DEFAULT_K
from services.coordinator.stats import CaseLog, ClassStats, metrics_registry
from services.coordinator.validation import CaseRejected, check_case
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

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
                 case_log: CaseLog, histogram=None):
        self.config = config
        self.channels = channels
        self.stats = stats
        self.case_log = case_log
        self.histogram = histogram
        self.site_names = [s.name for s in config.sites]
        # Filled in by CoordinatorServer once its ports are bound; advertised by Info.
        self.class_ports: dict[str, int] = {}
        self.class_dscp: dict[str, int] = {}
        self.cases_cancelled = 0
        self._last_lookup: dict[str, float] = {}
        self._lookups: dict[str, grpc.Future] = {}
        self._refreshing: set[str] = set()
        self._lock = threading.Lock()

    # ------------------------------------------------------------ routing to sites

    def _site_stub(self, site: str, class_name: str | None = None) -> pb_grpc.SiteStub:
        return pb_grpc.SiteStub(self.channels.channel(site, class_name))

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
            self.channels.set_class_ports(site, dict(info.class_ports))
            log.info("site %s: class ports %s (its replies are marked per class)", site,
                     dict(info.class_ports))

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
            rclass = check_case(request, self.config.classes, self.config.max_cells,
                                self.config.max_case_bytes)
            sites = self._chosen_sites(request)
        except CaseRejected as exc:
            context.abort(exc.code, exc.message)
        budget = request.deadline_s or self.config.default_deadline_s
        grpc_left = context.time_remaining()
        if grpc_left is not None:
            budget = min(budget, grpc_left)
        case_deadline = started + budget
        case_id = request.case_id or uuid.uuid4().hex[:12]
        self._class_ports_for_case(sites, budget)

        site_request = pb.AnalyseRequest(case_id=case_id, request_class=rclass.name,
                                         cells=request.cells, k=request.k or DEFAULT_K)
        request_bytes = site_request.ByteSize()
        # Case ids may be accession numbers: INFO names a case by its keyed tag only.
        log.debug("case %s is %s", log_tag(case_id), case_id)
        log.info("case %s (%s, DSCP %d): %d cells to %s, deadline %.1f s", log_tag(case_id), rclass.name,
                 rclass.dscp, len(request.cells), ", ".join(sites), budget)

        answers: queue.Queue = queue.Queue()
        calls = {}
        for site in sites:
            sent_at = time.monotonic()
            call = self._site_stub(site, rclass.name).Analyse.future(
                site_request, timeout=site_deadline(sent_at, case_deadline))
            call.add_done_callback(lambda c, s=site, t=sent_at: answers.put((s, c, time.monotonic() - t)))
            calls[site] = call

        def cancel_sites():
            for call in calls.values():
                call.cancel()  # a no-op for calls already done

        context.add_callback(cancel_sites)

        results: list[pb.SiteResult] = []
        closed = False
        try:
            for result in self._site_results(sites, answers, case_deadline, request_bytes):
                if not context.is_active():
                    break
                results.append(result)
                yield pb.CaseEvent(site_result=result)
        except GeneratorExit:  # gRPC closes the stream when the client cancels
            closed = True
        cancel_sites()  # only calls still running, i.e. after a cancel or a lost deadline
        cancelled = closed or not context.is_active()
        total_s = time.monotonic() - started
        if cancelled:
            with self._lock:
                self.cases_cancelled += 1
            log.info("case %s: cancelled by the client after %.3f s", log_tag(case_id), total_s)
            self._record(case_id, rclass, results, total_s, len(request.cells), "cancelled")
            return
        summary = pb.CaseSummary(
            case_id=case_id, request_class=rclass.name, total_s=total_s,
            sites_ok=sum(r.status_code == 0 for r in results),
            sites_failed=sum(r.status_code != 0 for r in results),
            bytes_sent=sum(r.bytes_sent for r in results),
            bytes_received=sum(r.bytes_received for r in results),
            votes=vote([list(r.cells) for r in results if r.status_code == 0]),
            bethesda=case_bethesda([list(r.cells) for r in results if r.status_code == 0]),
        )
        self.stats.add(rclass.name, total_s)
        if self.histogram is not None:
            self.histogram.labels(rclass.name).observe(total_s)
        self._record(case_id, rclass, results, total_s, len(request.cells), "done")
        yield pb.CaseEvent(summary=summary)

    def _site_results(self, sites: list[str], answers: queue.Queue, case_deadline: float, request_bytes: int):
        """Yield each site's SiteResult in the order the sites answer."""
        waiting = set(sites)
        while waiting:
            try:
                # Every site call ends by its own deadline; the extra second only guards
                # against a bug leaving this stream open for ever.
                site, call, elapsed = answers.get(timeout=max(0.0, case_deadline - time.monotonic()) + 1.0)
            except queue.Empty:
                log.error("sites %s outlived their deadline; reporting them late", sorted(waiting))
                for site in sorted(waiting):
                    yield pb.SiteResult(site=site, status_code=grpc.StatusCode.DEADLINE_EXCEEDED.value[0],
                                        status_message=f"site {site}: no answer by the deadline",
                                        bytes_sent=request_bytes)
                return
            waiting.discard(site)
            yield self._site_result(site, call, elapsed, request_bytes)

    def _chosen_sites(self, request: pb.CaseRequest) -> list[str]:
        if not request.sites:
            return list(self.site_names)
        unknown = [s for s in request.sites if s not in self.site_names]
        if unknown:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                               f"unknown site(s) {', '.join(map(repr, unknown))}; known sites: "
                               f"{', '.join(self.site_names)}")
        return list(dict.fromkeys(request.sites))

    def _site_result(self, site: str, call: grpc.Future, elapsed: float, request_bytes: int) -> pb.SiteResult:
        """A finished site call -> SiteResult (its status when it failed)."""
        if call.cancelled():
            return pb.SiteResult(site=site, status_code=grpc.StatusCode.CANCELLED.value[0],
                                 status_message="cancelled", bytes_sent=request_bytes)
        error = call.exception()
        if error is not None:
            code = error.code()
            if code in STALE_PORT_CODES:
                if self.channels.has_class_ports(site):  # else _class_ports_for_case retries
                    self._refresh_later(site)
            log.warning("site %s: %s: %s", site, code.name, error.details())
            return pb.SiteResult(site=site, status_code=code.value[0],
                                 status_message=f"site {site}: {code.name}: {error.details()}",
                                 timing=pb.SiteTiming(total_s=elapsed), bytes_sent=request_bytes)
        reply: pb.AnalyseReply = call.result()
        if not self.channels.has_class_ports(site):  # it answers: learn its ports for the next cases
            self._refresh_later(site)
        timing = pb.SiteTiming()
        timing.CopyFrom(reply.timing)
        timing.total_s = elapsed
        timing.transfer_s = max(0.0, elapsed - reply.timing.site_wall_s)
        return pb.SiteResult(site=site, status_code=0, status_message="OK", algorithm=reply.algorithm,
                             cells=reply.cells, timing=timing, bytes_sent=request_bytes,
                             bytes_received=reply.ByteSize())

    def _record(self, case_id: str, rclass, results: list[pb.SiteResult], total_s: float,
                cells: int, outcome: str) -> None:
        self.case_log.write({
            "case_id": case_id, "tag": log_tag(case_id), "class": rclass.name, "dscp": rclass.dscp,
            "outcome": outcome,
            "cells": cells, "total_s": round(total_s, 6),
            "bytes_sent": sum(r.bytes_sent for r in results),
            "bytes_received": sum(r.bytes_received for r in results),
            "sites": {
                r.site: {"status": _code_name(r.status_code),
                         "total_s": round(r.timing.total_s, 6), "transfer_s": round(r.timing.transfer_s, 6),
                         "extraction_s": round(r.timing.extraction_s, 6), "search_s": round(r.timing.search_s, 6),
                         "site_wall_s": round(r.timing.site_wall_s, 6),
                         "bytes_sent": r.bytes_sent, "bytes_received": r.bytes_received}
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
        return pb.CoordinatorInfo(class_ports=self.class_ports, class_dscp=self.class_dscp)

    def ListSites(self, request, context) -> pb.SitesReply:
        calls = {s.name: self._site_stub(s.name).Info.future(pb.SiteInfoRequest(), timeout=INFO_TIMEOUT_S)
                 for s in self.config.sites}
        statuses = []
        for site in self.config.sites:
            status = pb.SiteStatus(site=site.name, address=site.address)
            try:
                status.info.CopyFrom(calls[site.name].result())
                status.serving = True
            except grpc.RpcError:
                status.serving = False
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
        self.channels = ClassChannels({s.name: s.address for s in cfg.sites}, cfg.classes, cfg.site_tls,
                                      max_message_bytes=max(cfg.max_case_bytes * 2, 64 * 2**20))
        self.stats = ClassStats(cfg.classes, cfg.stats_window)
        registry, histogram = metrics_registry(self.stats)
        self.servicer = CoordinatorServicer(cfg, self.channels, self.stats, CaseLog(cfg.case_log), histogram)
        host, port = split_address(cfg.listen)
        self.server = MarkedServer(
            lambda server: pb_grpc.add_CoordinatorServicer_to_server(self.servicer, server),
            [COORDINATOR_SERVICE], host, port, cfg.class_ports, cfg.classes, cfg.tls, max_workers=64,
            max_message_bytes=max(cfg.max_case_bytes * 2, 64 * 2**20),
        )
        self.servicer.class_ports = dict(self.server.class_ports)
        self.servicer.class_dscp = self.server.class_dscp
        self.server.start()
        self.address = connect_address(host, self.server.port)
        if cfg.metrics:
            m_host, m_port = split_address(cfg.metrics)
            self._metrics_server, _ = start_http_server(m_port, addr=m_host.strip("[]"), registry=registry)
            self.metrics_url = f"http://{connect_address(m_host, self._metrics_server.server_port)}/metrics"
        # Learn the sites' class ports now, so the first case's replies are marked too.
        self._stopping = threading.Event()
        threading.Thread(target=self._learn_class_ports, daemon=True, name="class-ports").start()
        log.info("coordinator on %s (%s; classes on ports %s), %d sites%s", self.address,
                 "TLS" if cfg.tls else "no TLS", self.server.class_ports, len(cfg.sites),
                 f", metrics {self.metrics_url}" if self.metrics_url else "")
        return self

    @property
    def class_ports(self) -> dict[str, int]:
        """class -> the port that serves it and marks its replies."""
        return dict(self.server.class_ports)

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
        self.server.stop(grace)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
            self._metrics_server = None
        self.channels.close()
        self.servicer.case_log.close()
