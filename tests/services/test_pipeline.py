"""The case pipeline with fakes for the sites, the analysers and the clock (as Ray Serve tests
its router): plan, analyse, fan out, collect, conclude and record, each checked by its codes
and numbers; the coordinator's servicer as thin glue around it; and one pipeline for the
coordinator and the testbed's master alike (a change in it reaches both)."""

from __future__ import annotations

import concurrent.futures
import itertools
import threading

import grpc
import pytest

from pathmaster.records import Why
from qos.admission import Turns
from qos.classes import DEFAULT_CLASSES
from qos.predict import Predictor
from services.coordinator.directory import SiteDirectory
from services.coordinator.pipeline import Case, CasePipeline, Settings, Trial
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.reasons import codes
from tests.services.conftest import CallFailed
from tests.services.test_coordinator import poll_until

SCHEMA = "fs1-test"




class FakeSites:
    """Channels to fake sites: each call answers at once (a settled future) with `k` matches
    per cell, after `seconds` on the injected clock; `refuse` maps a site to the status it
    answers features with. Records every request (site, class, lane, message)."""

    def __init__(self, clock, seconds: dict[str, float] | None = None, refuse: dict | None = None):
        self.clock, self.seconds, self.refuse = clock, seconds or {}, refuse or {}
        self.requests: list[tuple[str, str, int, pb.AnalyseRequest]] = []
        self.refreshed = 0

    # ClassChannels' part the pipeline and the directory use
    def channel(self, site, class_name=None, lane=0, busy_until=None):
        return FakeChannel(self, site, class_name, lane)

    def has_class_ports(self, site):
        return True

    def set_class_ports(self, site, ports):
        pass

    def connect(self, site, classes, lanes):
        pass

    def refresh(self):
        self.refreshed += 1

    def address(self, site, class_name=None):
        return f"{site}.test:1"

    def answer(self, site, class_name, lane, request) -> concurrent.futures.Future:
        self.requests.append((site, class_name, lane, request))
        self.clock.advance(self.seconds.get(site, 0.0))
        future: concurrent.futures.Future = concurrent.futures.Future()
        if request.features and site in self.refuse:
            future.set_exception(CallFailed(*self.refuse[site]))
            return future
        ids = [f.cell_id for f in request.features] or [c.cell_id for c in request.cells]
        future.set_result(pb.AnalyseReply(site=site, algorithm="fake", cells=[
            pb.CellResult(query_cell_id=i, matches=[pb.Match(cell_id=f"{site}-{j}", diagnosis="normal_superficial",
                                                             bethesda="NILM", distance=float(j))
                                                    for j in range(request.k)])
            for i in ids], timing=pb.SiteTiming(site_wall_s=self.seconds.get(site, 0.0) / 2)))
        return future


class FakeChannel:
    """What a SiteStub needs of a channel: Analyse.future answers from FakeSites."""

    def __init__(self, sites: FakeSites, site, class_name, lane):
        self.sites, self.site, self.class_name, self.lane = sites, site, class_name, lane

    def unary_unary(self, method, *args, **kwargs):
        sites, site, class_name, lane = self.sites, self.site, self.class_name, self.lane

        class Method:
            @staticmethod
            def future(request, timeout=None, metadata=None):
                return sites.answer(site, class_name, lane, request)

        return Method


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeAnalysers:
    """Analyses each cell into a 4-value vector in `seconds` of the clock (or fails)."""

    def __init__(self, clock, seconds: float = 0.5, fail: bool = False):
        self.clock, self.seconds, self.fail = clock, seconds, fail
        self.calls = 0
        self.estimated: list[tuple[int, int]] = []  # (cells, priority) of each estimate asked

    def estimate_s(self, cells, priority):
        self.estimated.append((cells, priority))
        return self.seconds

    def analyse(self, cells, timeout_s, priority=0):
        self.calls += 1
        self.priority = priority
        if self.fail:
            raise TimeoutError("analysers too slow")
        self.clock.advance(self.seconds)
        return [pb.CellFeatures(cell_id=c.cell_id, values=[0.1, 0.2, 0.3, 0.4]) for c in cells]


class Lines(list):
    def write(self, record):
        self.append(record)


def pipeline_with(sites: FakeSites, clock: Clock, analysers=None, schemas=None, copies: int = 1):
    directory = SiteDirectory(["alpha", "beta"], sites, Predictor(clock=clock))
    directory.schemas.update(schemas or {"alpha": SCHEMA, "beta": "fs1-other"})
    log = Lines()
    pipeline = CasePipeline(DEFAULT_CLASSES, directory, directory.predictor, analysers=analysers,
                            schema=SCHEMA if analysers else "", clock=clock, case_log=log, feature_count=4,
                            settings=Settings(small_request_copies=copies, copy_gap_s=0.0))
    return pipeline, log


def a_case(clock: Clock, cells: int = 2, request_class: str = "routine", **kwargs) -> Case:
    cls = DEFAULT_CLASSES[request_class]
    return Case("c1", cls, cls, ["alpha", "beta"],
                [pb.CellImage(cell_id=f"cell{i}", image=b"png") for i in range(cells)], 3, 30.0, clock(), **kwargs)


def events(steps):
    return [s.event for s in steps]


def test_features_go_to_the_site_of_the_same_schema_the_cells_analysed_once_and_all_recorded():
    clock = Clock()
    sites = FakeSites(clock, seconds={"alpha": 1.0, "beta": 2.0})
    analysers = FakeAnalysers(clock, seconds=0.5)
    pipeline, log = pipeline_with(sites, clock, analysers)
    plan, *results, summary = events(pipeline.run(a_case(clock)))
    modes = {p.site: p.mode for p in plan.plan.sites}
    assert modes == {"alpha": "features", "beta": "images"}
    assert {p.site: codes(p.why)[0] for p in plan.plan.sites} == {"alpha": "features_same_schema",
                                                                 "beta": "images_other_schema"}
    assert analysers.calls == 1 and analysers.priority == DEFAULT_CLASSES["routine"].priority
    # Planned with the analysis time of this case's cells at its class's priority.
    assert analysers.estimated == [(2, DEFAULT_CLASSES["routine"].priority)]
    sent = {site: request for site, _, _, request in sites.requests}
    assert len(sent["alpha"].features) == 2 and not sent["alpha"].cells
    assert len(sent["beta"].cells) == 2 and not sent["beta"].features
    assert sent["alpha"].send_id == sent["beta"].send_id != ""   # one send to every site
    # Collect: each result in the order it was final, timed on the injected clock.
    assert [r.site_result.site for r in results] == ["alpha", "beta"]
    assert [r.site_result.timing.total_s for r in results] == [1.0, 2.0]
    # Conclude: every cell's vote over both sites; the summary's time is the clock's.
    s = summary.summary
    assert s.sites_ok == 2 and s.total_s == pytest.approx(3.5) and s.analysis_s == pytest.approx(0.5)
    assert [(v.query_cell_id, v.votes, v.total) for v in s.votes] == [("cell0", 6, 6), ("cell1", 6, 6)]
    assert s.conclusion.bethesda == "NILM" and codes(s.why) == ["analysed_once"]
    # Record: the case log's line, with the codes beside the words.
    (line,) = log
    assert line["outcome"] == "ok" and [w["code"] for w in line["why"]] == ["analysed_once"]
    assert line["sites"]["alpha"]["why"][0]["code"] == "features_same_schema"


def test_a_second_case_is_predicted_from_the_first_and_its_error_logged():
    clock = Clock()
    pipeline, _ = pipeline_with(FakeSites(clock, seconds={"alpha": 1.0, "beta": 1.0}), clock)
    first = events(pipeline.run(a_case(clock)))[0].plan
    second = events(pipeline.run(a_case(clock)))[0].plan
    assert first.predicted_s == 0 and all(p.predicted_s == 0 for p in first.sites)
    assert second.predicted_s > 0 and all(p.predicted_s > 0 for p in second.sites)
    assert len(pipeline.predictions) == 1 and pipeline.cases_running == 0  # the first had no prediction


def test_a_testbed_trial_sends_the_images_as_asked_and_a_warm_up_learns_nothing():
    clock = Clock()
    pipeline, _ = pipeline_with(FakeSites(clock, seconds={"alpha": 1.0, "beta": 1.0}), clock,
                                FakeAnalysers(clock))
    warm_up = Trial(static=True, learn=False)
    plan = events(pipeline.run(a_case(clock, trial=warm_up)))[0].plan
    events(pipeline.run(a_case(clock, trial=warm_up)))
    assert [(p.mode, codes(p.why)) for p in plan.sites] == [("images", ["images_as_sent"])] * 2
    assert len(pipeline.predictions) == 0  # as the product, the second case would add one


def test_a_features_request_carries_the_sites_columns_unless_the_trial_sends_full_vectors():
    clock = Clock()
    sites = FakeSites(clock)
    pipeline, _ = pipeline_with(sites, clock, FakeAnalysers(clock))
    pipeline.directory.columns["alpha"] = (0, 2)
    for trial, values in ((Trial(), [0.1, 0.3]), (Trial(subset=False), [0.1, 0.2, 0.3, 0.4])):
        sites.requests.clear()
        events(pipeline.run(a_case(clock, trial=trial)))
        (features,) = [request.features for site, _, _, request in sites.requests if site == "alpha"]
        assert [list(f.values) for f in features] == [pytest.approx(values)] * 2


class RecordingTurns(Turns):
    """Turns that note the priority of every turn taken."""

    def __init__(self):
        super().__init__()
        self.taken: list[int] = []

    def turn(self, priority):
        self.taken.append(priority)
        return super().turn(priority)


def test_a_case_computes_only_in_its_turns_taken_at_its_class_priority():
    clock = Clock()
    sites = FakeSites(clock, seconds={"alpha": 1.0, "beta": 1.0})
    pipeline, log = pipeline_with(sites, clock)
    pipeline.turns = turns = RecordingTurns()
    steps: list = []
    with turns.turn(DEFAULT_CLASSES["urgent"].priority):  # a more favoured case's turn
        runner = threading.Thread(target=lambda: steps.extend(pipeline.run(a_case(clock, request_class="bulk"))))
        runner.start()
        poll_until(lambda: turns.waiting() == 1, 10, "the bulk case waiting for its turn")
        assert steps == [] and sites.requests == [] and log == []  # not planned, nothing sent
    runner.join(10)
    assert [s.event.WhichOneof("event") for s in steps] == ["plan", "site_result", "site_result", "summary"]
    bulk = DEFAULT_CLASSES["bulk"].priority
    # plan, send, each site's result, conclude and record: each in a turn of the case's class
    assert turns.taken == [0, bulk, bulk, bulk, bulk, bulk] and turns.waiting() == 0


def test_when_the_analysers_fail_every_site_gets_the_images_and_the_summary_says_why():
    clock = Clock()
    sites = FakeSites(clock)
    pipeline, _ = pipeline_with(sites, clock, FakeAnalysers(clock, fail=True))
    *_, summary = events(pipeline.run(a_case(clock)))
    assert all(request.cells and not request.features for _, _, _, request in sites.requests)
    assert codes(summary.summary.why) == ["analysis_failed"]
    assert summary.summary.why[0].params["error"] == "TimeoutError"


def test_a_refused_features_request_falls_back_to_the_images_in_one_send_of_its_own():
    clock = Clock()
    sites = FakeSites(clock, refuse={"alpha": (grpc.StatusCode.INTERNAL, "search failed")})
    pipeline, _ = pipeline_with(sites, clock, FakeAnalysers(clock))
    results = {e.site_result.site: e.site_result for e in events(pipeline.run(a_case(clock)))
               if e.HasField("site_result")}
    assert results["alpha"].status_code == 0 and results["alpha"].mode == "images"
    assert "images_after_features_failed" in codes(results["alpha"].why)
    first, fallback = [request for site, _, _, request in sites.requests if site == "alpha"]
    assert first.features and fallback.cells and fallback.send_id != first.send_id


def test_copies_of_a_small_request_share_one_send_id_over_their_own_lanes():
    clock = Clock()
    sites = FakeSites(clock)
    pipeline, _ = pipeline_with(sites, clock, FakeAnalysers(clock), copies=3)
    events(pipeline.run(a_case(clock)))
    alpha = [(lane, request.send_id) for site, _, lane, request in sites.requests if site == "alpha"]
    # The first copy answered at once: the others are not needed (or were sent on their own lanes).
    assert alpha[0][0] == 0 and len({send for _, send in alpha}) == 1
    assert [lane for lane, _ in alpha] == list(range(len(alpha)))


def test_a_client_gone_after_the_first_answer_ends_the_case_without_a_summary_and_records_it_cancelled():
    clock = Clock()
    sites = FakeSites(clock, seconds={"alpha": 1.0, "beta": 1.0})
    pipeline, log = pipeline_with(sites, clock)
    answered = itertools.count()
    steps = pipeline.run(a_case(clock), is_active=lambda: next(answered) < 1)
    kinds = [e.WhichOneof("event") for e in events(steps)]
    assert kinds == ["plan", "site_result"]
    assert pipeline.cases_cancelled == 1 and log[0]["outcome"] == "cancelled"
    assert len(pipeline.predictions) == 0  # a cancelled case teaches nothing


def test_a_stream_closed_by_grpc_cancels_the_case_and_records_it():
    clock = Clock()
    pipeline, log = pipeline_with(FakeSites(clock), clock)
    cancels = []
    steps = pipeline.run(a_case(clock), on_cancel=cancels.append)
    assert next(steps).event.HasField("plan") and next(steps).event.HasField("site_result")
    steps.close()  # as gRPC closes the servicer's generator when the client cancels
    assert pipeline.cases_cancelled == 1 and log[0]["outcome"] == "cancelled" and len(cancels) == 1


# ---------------------------------------------------------------- the servicer, with fakes

class FakeContext:
    """What SubmitCase uses of a grpc.ServicerContext."""

    def __init__(self):
        self.callbacks = []

    def time_remaining(self):
        return None

    def is_active(self):
        return True

    def add_callback(self, callback):
        self.callbacks.append(callback)

    def auth_context(self):
        return {}

    def peer(self):
        return "ipv4:127.0.0.1:5000"

    def set_trailing_metadata(self, metadata):
        self.trailing = metadata

    def abort(self, code, details):
        raise CallFailed(code, details)


def png() -> bytes:
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 180, 190)).save(out, format="PNG")
    return out.getvalue()


def fake_servicer(clock=None):
    from services.config import CoordinatorConfig, SiteEndpoint
    from services.coordinator.server import CoordinatorServicer
    from services.coordinator.stats import CaseLog, ClassStats

    config = CoordinatorConfig(sites=[SiteEndpoint(name="alpha", address="alpha.test:1"),
                                      SiteEndpoint(name="beta", address="beta.test:1")], analysis_workers=0)
    sites = FakeSites(clock or Clock())
    return CoordinatorServicer(config, sites, ClassStats(config.classes), CaseLog(None)), sites


def test_the_servicer_streams_the_pipelines_events_and_frees_its_admission():
    servicer, sites = fake_servicer()
    request = pb.CaseRequest(case_id="S26-01234", request_class="urgent", deadline_s=20,
                             cells=[pb.CellImage(cell_id="cell0", image=png())])
    kinds = [e.WhichOneof("event") for e in servicer.SubmitCase(request, FakeContext())]
    assert kinds == ["plan", "site_result", "site_result", "summary"]
    assert {site for site, _, _, _ in sites.requests} == {"alpha", "beta"}
    assert servicer.admission.in_use() == 0 and servicer.cases_running == 0
    with pytest.raises(CallFailed) as refused:
        list(servicer.SubmitCase(pb.CaseRequest(request_class="urgent", cells=request.cells, sites=["nowhere"]),
                                 FakeContext()))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_change_in_the_pipeline_reaches_the_coordinator_and_the_testbed_alike(monkeypatch):
    """The coordinator's servicer and the testbed's master run one CasePipeline: a reason
    added to its plan shows in both (here against the real transfer sites of the testbed)."""
    from services.experiment.workload import Master, make_cells, serve_transfer_site

    plan = CasePipeline.plan

    def marked(self, case):
        planned = plan(self, case)
        for site, site_plan in planned.plans.items():
            planned.plans[site] = type(site_plan)(**{**site_plan.__dict__,
                                                     "why": (*site_plan.why, Why("changed_in_the_pipeline"))})
        return planned

    monkeypatch.setattr(CasePipeline, "plan", marked)
    servicer, _ = fake_servicer()
    request = pb.CaseRequest(request_class="routine", cells=[pb.CellImage(cell_id="cell0", image=png())])
    coordinator = [e.site_result for e in servicer.SubmitCase(request, FakeContext()) if e.HasField("site_result")]
    assert all("changed_in_the_pipeline" in codes(r.why) for r in coordinator)
    server = serve_transfer_site("A", "127.0.0.1", 0, 300, DEFAULT_CLASSES, 100)
    master = Master({"A": f"127.0.0.1:{server.port}"}, DEFAULT_CLASSES)
    try:
        master.discover()
        testbed = master.case("routine", make_cells(1, 100, False, False, seed=1), k=1, deadline_s=20)
    finally:
        master.close()
        server.stop(0)
    assert testbed["ok"] and all("changed_in_the_pipeline" in s["decisions"] for s in testbed["sites"])
