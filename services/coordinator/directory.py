"""Everything the coordinator knows of its sites, in one place, learnt from their Info.

A site's Info says which port serves each request class (so replies come back marked),
which feature schema its index was built with, which feature columns it compares, and
its load. `SiteDirectory.learn` takes all of it in at once; the directory's channels, the
predictor's view of the site's load and the case pipeline read it from here. Whether a
site serves is followed live from its health (`watch`, sitewatch.py). Info is
asked once at start (until every site answered), before a case for sites not yet known
(sharing a look-up in flight, not again soon after one failed), in the background after a
site failed on a port that may be stale, and again when a site refuses features as not its
own (it may have been re-indexed). Once `close`d it starts no call and learns nothing, so
that the coordinator can close the sites' channels under look-ups still running.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time

import grpc

from qos.predict import Predictor, SiteLoad
from qos.transport import ClassChannels
from services.coordinator.sitewatch import SiteWatch
from services.coordinator.learnt import SiteEyes
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

log = logging.getLogger("pathmaster.coordinator")

INFO_TIMEOUT_S = 2.0
RETRY_LOOKUP_S = 10.0    # a site whose Info failed is not waited for again sooner
REFRESH_TIMEOUT_S = 30.0  # background look-up after a failure


def site_load(load: pb.SiteLoad) -> SiteLoad:
    """A site's reported load as the predictor's SiteLoad (a site that reports no work
    ahead by class has its one total stand for every class)."""
    return SiteLoad(waiting_cells=load.waiting_cells, workers=max(1, load.workers),
                    seconds_per_cell=dict(load.seconds_per_cell), waiting_s=load.waiting_s,
                    waiting_s_by_class=dict(load.waiting_s_by_class) or None)


class SiteDirectory:
    """The sites' class ports (also given to `channels`), feature schemas, feature columns
    and load (given to `predictor`), learnt from their Info by `learn`; whether each serves
    (`serving`, by `watch`).

    Parameters
    ----------
    names : list of str
        The configured sites.
    channels : ClassChannels
        Their channels; `learn` gives them each site's class ports.
    predictor : Predictor, optional
        Takes each site's reported load (None: a directory shared by several predictors,
        each learning the load from the replies).
    lanes : int
        Connections per class opened when a site's ports are learnt (one per copy).
    """

    def __init__(self, names: list[str], channels: ClassChannels, predictor: Predictor | None, lanes: int = 1):
        self.names = list(names)
        self.channels = channels
        self.predictor = predictor
        self.lanes = lanes
        self.ports: dict[str, dict[str, int]] = {}   # class -> port, by site
        self.schemas: dict[str, str] = {}
        # The columns each site compares (SiteInfo.feature_columns); none known: full vectors.
        self.columns: dict[str, tuple[int, ...]] = {}
        # The pretrained eye each site looks through (SiteInfo.model_sha256, its id; "" none;
        # SiteInfo.eye, its description), and the eyes opened here, by id
        # (services/coordinator/learnt.py).
        self.models: dict[str, str] = {}
        self.eye_descriptions: dict[str, str] = {}
        self.eyes = SiteEyes()
        self.serving: dict[str, bool] = {name: False for name in self.names}  # its health, followed by `watch`
        self._watch = None
        self._last_lookup: dict[str, float] = {}
        self._lookups: dict[str, grpc.Future] = {}
        self._refreshing: set[str] = set()
        self._closed = False
        self._lock = threading.Lock()  # also held while learning, so `close` waits for it

    def learn(self, site: str, info: pb.SiteInfo) -> None:
        """Take in what a site's Info says of it: class ports, feature schema and columns, load
        (nothing once closed: it would open connections to the site again)."""
        with self._lock:
            if self._closed:
                return
            self.ports[site] = dict(info.class_ports)
            self.channels.set_class_ports(site, self.ports[site])
            # Every class's connections (one per copy lane) open now, not at a case's time.
            self.channels.connect(site, list(info.class_ports), lanes=self.lanes)
            self.schemas[site] = info.feature_schema
            self.columns[site] = tuple(info.feature_columns)
            self.models[site] = info.model_sha256
            self.eye_descriptions[site] = info.eye
            if self.predictor is not None:
                self.predictor.site(site).load = site_load(info.load)

    def watch(self, gauge) -> "SiteDirectory":
        """Follow each site's health (into `serving` and `gauge`, labelled by site) until
        `close`."""
        self._watch = SiteWatch(self.channels, self.names, gauge, on_status=self.serving.__setitem__).start()
        return self

    def close(self) -> None:
        """Stop following the sites' health and asking their Info: the look-ups in flight are
        cancelled and no call starts after this returns (the channels can then be closed)."""
        with self._lock:
            self._closed = True
            lookups = list(self._lookups.values())
        for call in lookups:
            call.cancel()
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

    def network(self, site: str):
        """The pretrained eye `site` looks through (a ``pathmaster.eye.Eye``), opened once;
        None when it needs none or this coordinator cannot open it (the site then refuses
        the features and the fan-out falls back to its images)."""
        model = self.models.get(site, "")
        return self.eye_of(site, model, self.eye_descriptions.get(site, "")) if model else None

    def eye_of(self, site: str, identity: str, description: str):
        """The eye `identity` that `site` describes (SiteInfo.eye), from the cache or opened
        now; None when it cannot be opened here or the description does not match (logged)."""
        from pathmaster.records import InvalidInput

        try:
            return self.eyes.get(identity, description)
        except (InvalidInput, ValueError) as exc:
            log.warning("site %s: its eye %s cannot be opened here (%s)", site, identity[:16], exc)
            return None

    def knows(self, site: str) -> bool:
        """True once the site's class ports are known."""
        return self.channels.has_class_ports(site)

    def stub(self, site: str, class_name: str | None = None, lane: int = 0) -> pb_grpc.SiteStub:
        return pb_grpc.SiteStub(self.channels.channel(site, class_name, lane))

    def _lookup(self, site: str, timeout_s: float) -> grpc.Future | None:
        """The site's Info call in flight, or a new one: concurrent look-ups share one (None
        once closed)."""
        with self._lock:
            if self._closed:
                return None
            call = self._lookups.get(site)
            if call is None or call.done():
                # wait_for_ready: a site that was down when its channel was first used may be up now.
                call = self.stub(site).Info.future(pb.SiteInfoRequest(), timeout=timeout_s, wait_for_ready=True)
                self._lookups[site] = call
                self._last_lookup[site] = time.monotonic()
            return call

    def resolve(self, sites: list[str], timeout_s: float = INFO_TIMEOUT_S) -> None:
        """Ask the sites' Info (in parallel, waiting up to `timeout_s` for a site that is
        still starting) and learn each answer."""
        calls = {s: self._lookup(s, timeout_s) for s in sites}
        for site, call in calls.items():
            if call is None:
                return  # closed
            try:
                info = call.result(timeout=timeout_s)
            except (grpc.FutureTimeoutError, grpc.FutureCancelledError):
                continue  # a longer look-up started by someone else is still running; or closed
            except grpc.RpcError as exc:
                if not self._closed:
                    log.warning("site %s: no Info (%s); its replies are unmarked until it answers",
                                site, exc.code().name)
                continue
            self.learn(site, info)
            log.info("site %s: class ports %s (its replies are marked per class)", site, dict(info.class_ports))

    def before_case(self, sites: list[str], budget_s: float) -> None:
        """Learn the sites not known yet: join a look-up in flight, or start one unless one
        failed recently (a site that is down must not delay every case)."""
        now = time.monotonic()
        with self._lock:
            unknown = [s for s in sites if not self.knows(s) and (
                (s in self._lookups and not self._lookups[s].done())
                or now - self._last_lookup.get(s, float("-inf")) >= RETRY_LOOKUP_S)]
        if unknown:
            self.resolve(unknown, timeout_s=min(INFO_TIMEOUT_S, budget_s / 4))

    def refresh_later(self, site: str) -> None:
        """Look a site up in the background (after it failed: it may have restarted on other
        ports; or when it first answered); one look-up per site at a time."""
        with self._lock:
            if site in self._refreshing:
                return
            self._refreshing.add(site)

        def refresh():
            try:
                self.resolve([site], timeout_s=REFRESH_TIMEOUT_S)
            finally:
                with self._lock:
                    self._refreshing.discard(site)

        threading.Thread(target=refresh, daemon=True, name=f"refresh-{site}").start()

    def recheck(self, site: str, feature_schema: str, deadline: float) -> concurrent.futures.Future:
        """Ask a site's Info again after it refused a features request (it may have been
        re-indexed) and learn it. The future's result: what it compares now, in words, when a
        features request of `feature_schema` can go to it again; else None (FanOut `recheck`)."""
        answer: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if self._closed:
                answer.set_result(None)
                return answer
            call = self.stub(site).Info.future(
                pb.SiteInfoRequest(), timeout=max(0.0, min(INFO_TIMEOUT_S, deadline - time.monotonic())))

        def taken_in(call: grpc.Future) -> None:
            now = None  # whatever goes wrong, the fan-out hears (and falls back to the images)
            try:
                info = call.result()
                self.learn(site, info)
                columns = tuple(info.feature_columns)
                if info.feature_schema == feature_schema:
                    now = (f"{len(columns)} feature columns {list(columns)}" if columns
                           else "every feature (the full vectors)")
            except grpc.FutureCancelledError:
                pass  # closed
            except grpc.RpcError as exc:
                log.warning("site %s: no Info after it refused features (%s)", site, exc.code().name)
            finally:
                answer.set_result(now)

        call.add_done_callback(taken_in)
        return answer
