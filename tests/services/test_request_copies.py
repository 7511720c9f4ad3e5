"""Small site requests travel as copies over separate connections ("predictable
completion"): the policy decides and says why, the copies go over distinct TCP connections
("lanes"), the first answer wins, the other copies are cancelled, and the answer is the one a
single copy gets. On loopback with real gRPC servers; a site that holds one copy until it is
cancelled stands in for a packet lost behind a full router queue."""

from __future__ import annotations

import itertools
import threading
import time
from concurrent import futures

import grpc
import pytest

from pathmaster.records import ConfigError
from qos.classes import DEFAULT_CLASSES
from qos.policy import MAX_REQUEST_COPIES, SMALL_REQUEST_COPIES, SitePlan, plan_site
from qos.transport import ClassChannels
from services.coordinator.fanout import FanOut, as_sent
from services.experiment.workload import TransferSite, make_features
from services.reasons import codes
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from tests.services.conftest import CallFailed

CLASSES = ["urgent", "routine", "teaching", "bulk"]
SCHEMA = "fs1-test"
LANE_KEY = "x-test-lane"


def predict_none(_cls, _mode):
    return None


# ---------------------------------------------------------------- the policy

def test_a_small_features_request_is_planned_as_copies_and_says_why():
    plan = plan_site("a", requested="routine", entitled=CLASSES, deadline_s=10, predict=predict_none,
                     schema_matches=True, mode_bytes={"features": 5_600, "images": 890_000})
    assert plan.mode == "features" and plan.copies == SMALL_REQUEST_COPIES > 1
    why = next(w for w in plan.why if w.code.startswith("small_request_copies"))
    assert why.params["copies"] == SMALL_REQUEST_COPIES and why.params["kilobytes"] == pytest.approx(5.6)


@pytest.mark.parametrize("schema_matches, features_bytes, copies_asked", [
    (False, 5_600, 3),     # images: the site would analyse every copy
    (True, 40_000, 3),     # features, but not small
    (True, 5_600, 1),      # copies switched off
])
def test_images_large_requests_and_copies_off_go_as_one(schema_matches, features_bytes, copies_asked):
    plan = plan_site("a", requested="routine", entitled=CLASSES, deadline_s=10, predict=predict_none,
                     schema_matches=schema_matches, mode_bytes={"features": features_bytes, "images": 5_000},
                     small_request_copies=copies_asked)
    assert plan.copies == 1
    assert not any(w.code.startswith("small_request_copies") for w in plan.why)


def test_without_request_sizes_a_plan_is_one_copy():
    plan = plan_site("a", requested="routine", entitled=CLASSES, deadline_s=10, predict=predict_none,
                     schema_matches=True)
    assert plan.copies == 1


@pytest.mark.parametrize("value", [0, MAX_REQUEST_COPIES + 1])
def test_the_coordinator_config_bounds_the_copies(tmp_path, value):
    from services.config import load_coordinator_config

    path = tmp_path / "c.toml"
    path.write_text(f'[coordinator]\nsmall_request_copies = {value}\n[[sites]]\nname = "a"\naddress = "h:1"\n')
    with pytest.raises(ConfigError) as err:
        load_coordinator_config(path)
    assert "small_request_copies" in str(err.value)
    path.write_text('[coordinator]\nsmall_request_copies = 2\n[[sites]]\nname = "a"\naddress = "h:1"\n')
    assert load_coordinator_config(path).small_request_copies == 2


# ---------------------------------------------------------------- copies on the wire

class HoldingSite(TransferSite):
    """A transfer site that holds the first copy of a case whose id starts with "hold" until
    the caller cancels it (a copy whose packet was lost), and records every call's peer
    (address:port of the caller's connection) and lane."""

    def __init__(self):
        super().__init__("s", match_bytes=200, wire_match_bytes=200, feature_schema=SCHEMA)
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str]] = []   # (peer, lane)
        self.held: dict[str, str] = {}            # case id -> lane of the held copy
        self.held_cancelled = threading.Event()

    def Analyse(self, request, context):
        lane = dict(context.invocation_metadata()).get(LANE_KEY, "?")
        with self.lock:
            self.calls.append((context.peer(), lane))
            hold = request.case_id.startswith("hold") and request.case_id not in self.held
            if hold:
                self.held[request.case_id] = lane
        if hold:
            cancelled = threading.Event()
            context.add_callback(cancelled.set)
            if cancelled.wait(30):  # bounded: a copy never cancelled fails the test below
                self.held_cancelled.set()
            context.abort(grpc.StatusCode.CANCELLED, "held copy")
        return super().Analyse(request, context)


@pytest.fixture
def holding_site():
    site = HoldingSite()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    pb_grpc.add_SiteServicer_to_server(site, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channels = ClassChannels({"s": f"127.0.0.1:{port}"}, DEFAULT_CLASSES)
    yield site, channels
    channels.close()
    server.stop(0)


def run_case(channels: ClassChannels, case_id: str, copies: int):
    request = pb.AnalyseRequest(case_id=case_id, request_class="routine", k=3, feature_schema=SCHEMA,
                                features=make_features(2, 115, seed=1))

    def send(site, class_name, mode, lane=0, send_id=""):
        sent = as_sent(request, class_name, send_id)
        stub = pb_grpc.SiteStub(channels.channel(site, class_name, lane))
        return stub.Analyse.future(sent, timeout=60, metadata=((LANE_KEY, str(lane)),)), sent.ByteSize()

    plan = SitePlan("s", "features", "routine", None, None, None, copies=copies)
    fan = FanOut({"s": plan}, send, time.monotonic() + 60)
    try:
        outcomes = list(itertools.chain(fan.start(), fan.outcomes()))
    finally:
        fan.cancel()
    assert len(outcomes) == 1
    return outcomes[0], fan.runs["s"]


def test_copies_go_over_separate_connections_the_first_answer_wins_and_the_rest_are_cancelled(holding_site):
    site, channels = holding_site
    outcome, run = run_case(channels, "hold-1", copies=3)
    assert outcome.code == grpc.StatusCode.OK and outcome.reply is not None
    assert [a.label for a in run.attempts] == ["first", "copy 2", "copy 3"]
    # The held copy never answers; the case's answer came from another one, and the held one
    # was cancelled (its site saw the cancellation).
    held_lane = site.held["hold-1"]
    assert outcome.attempt.label != run.attempts[int(held_lane)].label
    assert site.held_cancelled.wait(30)
    (answered,) = [w for w in outcome.why if w.code.startswith("answered_")]
    assert answered.params["copy"] == outcome.attempt.label
    # Each lane is its own TCP connection: every copy that reached the site (at least the held
    # one and the winner; the third may be cancelled before it starts) came from its own port.
    peers = {peer for peer, lane in site.calls}
    assert len(peers) == len(site.calls) >= 2, site.calls
    # The answer is the one a single copy gets.
    single, _ = run_case(channels, "plain-1", copies=1)
    assert single.code == grpc.StatusCode.OK
    assert list(single.reply.cells) == list(outcome.reply.cells)
    assert not any(code.startswith("answered_") for code in codes(single.why))


def test_a_lane_keeps_its_connection_from_one_case_to_the_next(holding_site):
    site, channels = holding_site
    request = pb.AnalyseRequest(case_id="", request_class="routine", k=1, feature_schema=SCHEMA,
                                features=make_features(1, 115, seed=1))
    for _case in range(2):
        for lane in (0, 1):
            stub = pb_grpc.SiteStub(channels.channel("s", "routine", lane))
            stub.Analyse(request, timeout=60, metadata=((LANE_KEY, str(lane)),))
    peers = {lane: {peer for peer, seen in site.calls if seen == lane} for lane in ("0", "1")}
    # One connection per lane, the same for both cases (no new SYN at case time), two in all.
    assert all(len(p) == 1 for p in peers.values()) and peers["0"] != peers["1"], peers


def test_a_site_answers_a_send_once_and_refuses_its_copies(holding_site):
    """One reply per send crosses the network: a copy that reaches the site after the send
    was taken is refused (ALREADY_EXISTS, saying why); a hedge (a send of its own) and calls
    without a send id are answered, and so is a new send under the same case id."""
    _site, channels = holding_site

    def call(case_id, class_name, lane, send_id):
        request = pb.AnalyseRequest(case_id=case_id, request_class=class_name, k=1, feature_schema=SCHEMA,
                                    features=make_features(1, 115, seed=1), send_id=send_id)
        return pb_grpc.SiteStub(channels.channel("s", class_name, lane)).Analyse(request, timeout=60)

    assert call("once", "routine", 0, "send-1").cells
    with pytest.raises(grpc.RpcError) as err:
        call("once", "routine", 1, "send-1")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert "already answered on another connection" in err.value.details()
    assert call("once", "urgent", 0, "hedge-1").cells     # a hedge in another class
    assert call("once", "routine", 0, "hedge-2").cells    # a hedge in the same class
    assert call("once", "routine", 1, "send-2").cells     # the case sent again
    assert call("", "routine", 0, "").cells and call("", "routine", 1, "").cells  # no send id: no copies
    assert call("once", "routine", 0, "").cells and call("once", "routine", 1, "").cells
    with pytest.raises(grpc.RpcError) as err:
        call("once", "routine", 0, "x" * 65)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class Settled(grpc.Future):
    """A call that has already ended (with `reply` or a status) but whose done callbacks run
    only at `release()`: gRPC runs them on its own threads, so the events of two copies can
    reach FanOut in either order."""

    def __init__(self, reply=None, code=None, details=""):
        self.reply, self.error = reply, (CallFailed(code, details) if code else None)
        self.callbacks = []

    def release(self):
        for callback in self.callbacks:
            callback(self)

    def cancel(self):
        return False

    def cancelled(self):
        return False

    def running(self):
        return False

    def done(self):
        return True

    def result(self, timeout=None):
        if self.error:
            raise self.error
        return self.reply

    def exception(self, timeout=None):
        return self.error

    def traceback(self, timeout=None):
        return None

    def add_done_callback(self, fn):
        self.callbacks.append(fn)


def test_a_refused_copy_heard_before_the_answer_does_not_fail_the_site():
    """The site answered the first copy and refused the second; the refusal's event is handled
    first: the site's outcome is still the answer (a case once failed so in the testbed)."""
    answer = Settled(reply=pb.AnalyseReply(site="s", algorithm="transfer-only"))
    refused = Settled(code=grpc.StatusCode.ALREADY_EXISTS, details="already answered on another connection")
    calls = {0: answer, 1: refused}
    plan = SitePlan("s", "features", "routine", None, None, None, copies=2)
    fan = FanOut({"s": plan}, lambda site, cls, mode, lane=0, send_id="": (calls[lane], 100), time.monotonic() + 60)
    assert fan.start() == []
    refused.release()
    answer.release()
    outcomes = list(fan.outcomes())
    assert len(outcomes) == 1 and outcomes[0].code == grpc.StatusCode.OK
    assert outcomes[0].reply.site == "s" and outcomes[0].attempt.label == "first"


def test_a_sites_time_ends_when_its_answer_arrives_not_when_the_fan_out_gets_to_it(monkeypatch):
    """Three sites answer at once; the fan-out thread handles them in turn (each streamed to
    the client): the later ones' times must not include that wait."""
    from types import SimpleNamespace

    from services.coordinator import fanout

    now = [100.0]
    monkeypatch.setattr(fanout, "time", SimpleNamespace(monotonic=lambda: now[0]))
    answer = Settled(reply=pb.AnalyseReply(site="s", algorithm="transfer-only"))
    plan = SitePlan("s", "features", "routine", None, None, None, copies=1)
    fan = FanOut({"s": plan}, lambda site, cls, mode, lane=0, send_id="": (answer, 100), now[0] + 60)
    assert fan.start() == []
    now[0] = 100.5
    answer.release()  # gRPC's callback: the answer is here
    now[0] = 103.0    # the fan-out thread was busy with other sites' answers meanwhile
    (outcome,) = list(fan.outcomes())
    assert outcome.code == grpc.StatusCode.OK and outcome.elapsed_s == pytest.approx(0.5)


def test_connect_opens_every_lane_before_any_call(holding_site):
    _site, channels = holding_site
    channels.connect("s", ["routine", "urgent"], lanes=2)
    for class_name, lane in itertools.product(["routine", "urgent"], range(2)):
        grpc.channel_ready_future(channels.channel("s", class_name, lane)).result(timeout=30)


# ---------------------------------------------------------------- through the coordinator

def test_the_coordinator_sends_a_features_case_as_copies_and_explains_it(deployment, case_cells):
    """A real coordinator and real sites on loopback: each site's plan says the features go as
    copies, the site's result says which copy answered, and the matches are the images'."""
    from services.client import CoordinatorClient
    from tests.services.conftest import as_case

    cells = as_case(case_cells[:2])
    with CoordinatorClient(deployment.coordinator.address) as client:
        events = list(client.submit(cells, "routine", deadline_s=120, ship="features"))
        images = list(client.submit(cells, "routine", deadline_s=120, ship="images"))
    plan = next(e.plan for e in events if e.HasField("plan"))
    results = {e.site_result.site: e.site_result for e in events if e.HasField("site_result")}
    single = {e.site_result.site: e.site_result for e in images if e.HasField("site_result")}
    copies = SMALL_REQUEST_COPIES
    for site_plan in plan.sites:
        assert site_plan.mode == "features"
        (planned,) = [w for w in site_plan.why if w.code.startswith("small_request_copies")]
        assert planned.params["copies"] == str(copies), site_plan.why
    for site, result in results.items():
        assert result.status_code == 0
        assert any(code.startswith("answered_") for code in codes(result.why)), result.why
        assert [m.cell_id for c in result.cells for m in c.matches] == \
            [m.cell_id for c in single[site].cells for m in c.matches]


@pytest.mark.parametrize("ship", ["features", "images"])
def test_a_case_sent_again_under_the_same_case_id_is_answered_by_every_site(deployment, case_cells, ship):
    """A pathologist adds a cell and sends the same accession again at once: a new send, not
    a copy of the first one, so every site answers both, each with the cells it was sent."""
    from services.client import CoordinatorClient
    from tests.services.conftest import as_case

    case_id = f"S26-01234-{ship}"
    sends = [as_case(case_cells[:1]), as_case(case_cells[:2])]
    with CoordinatorClient(deployment.coordinator.address) as client:
        answers = [list(client.submit(cells, "routine", deadline_s=120, ship=ship, case_id=case_id))
                   for cells in sends]
    for cells, events in zip(sends, answers):
        results = [e.site_result for e in events if e.HasField("site_result")]
        assert sorted(r.site for r in results) == sorted(deployment.sites), results
        for result in results:
            assert result.status_code == 0, result.status_message
            assert [c.query_cell_id for c in result.cells] == [c.cell_id for c in cells]
            assert all(c.matches for c in result.cells)


class Now(Settled):
    """A call that has ended and says so at once (its done callback runs as it is added)."""

    def add_done_callback(self, fn):
        fn(self)


def test_copies_leave_a_gap_apart_and_one_not_needed_is_not_sent():
    """With `copy_gap_s` copy k leaves k gaps after the first (so that copies do not meet a full
    queue together); a site that has answered before a copy's time gets no more copies."""
    sent = []
    never = {}  # "spread": copies 1 and 2 never answer (their packets were lost)

    def send(site, cls, mode, lane=0, send_id=""):
        sent.append((site, lane, time.monotonic()))
        if site == "spread" and lane < 2:
            never[lane] = Settled(reply=pb.AnalyseReply(site=site))  # done callbacks never run
            return never[lane], 100
        return Now(reply=pb.AnalyseReply(site=site, algorithm="transfer-only")), 100

    plans = {"quick": SitePlan("quick", "features", "routine", None, None, None, copies=3, copy_gap_s=30.0),
             "spread": SitePlan("spread", "features", "routine", None, None, None, copies=3, copy_gap_s=0.02)}
    fan = FanOut(plans, send, time.monotonic() + 60)
    try:
        assert fan.start() == []
        assert [(site, lane) for site, lane, _ in sent] == [("quick", 0), ("spread", 0)]  # first copies only
        outcomes = {o.site: o for o in fan.outcomes()}
    finally:
        fan.cancel()
    assert outcomes["quick"].code == grpc.StatusCode.OK
    assert [a.label for a in fan.runs["quick"].attempts] == ["first"]  # answered: its copies never left
    assert outcomes["spread"].code == grpc.StatusCode.OK and outcomes["spread"].attempt.label == "copy 3"
    assert [a.label for a in fan.runs["spread"].attempts] == ["first", "copy 2", "copy 3"]
    times = [t for site, _, t in sent if site == "spread"]
    assert times[1] - times[0] >= 0.02 and times[2] - times[0] >= 0.04


def test_a_failed_first_copy_waits_for_the_copies_still_to_be_sent():
    """The first copy fails before the others have left: the site's outcome is not final until
    they have had their chance, and a later copy's answer is the site's."""
    calls = {0: Now(code=grpc.StatusCode.UNAVAILABLE, details="connection reset"),
             1: Now(reply=pb.AnalyseReply(site="s", algorithm="transfer-only"))}
    plan = SitePlan("s", "features", "routine", None, None, None, copies=2, copy_gap_s=0.05)
    fan = FanOut({"s": plan}, lambda site, cls, mode, lane=0, send_id="": (calls[lane], 100), time.monotonic() + 60)
    try:
        assert fan.start() == []
        outcomes = list(fan.outcomes())
    finally:
        fan.cancel()
    assert len(outcomes) == 1 and outcomes[0].code == grpc.StatusCode.OK
    assert outcomes[0].attempt.label == "copy 2"
    assert "first copy (routine, features): UNAVAILABLE: connection reset" in fan.runs["s"].errors


def test_a_refused_copy_heard_after_the_features_went_again_does_not_send_the_images():
    """Both copies of a features request are refused (the coordinator's columns were stale); the
    first refusal asks the site's Info again and the features go once more; the second copy's
    refusal is heard only then (a busy machine): it is a copy of the refused request, so the
    images are not sent, and the features sent again answer."""
    from concurrent.futures import Future

    stale = "the request's columns are not the site's"
    refusals = {0: Settled(code=grpc.StatusCode.INVALID_ARGUMENT, details=stale),
                1: Settled(code=grpc.StatusCode.INVALID_ARGUMENT, details=stale)}
    sent = []

    def send(site, cls, mode, lane=0, send_id=""):
        sent.append(mode)
        if len(sent) <= 2:
            return refusals[lane], 100
        refusals[1].release()  # the second copy's refusal arrives as the features go again
        return Now(reply=pb.AnalyseReply(site=site, algorithm="transfer-only")), 100

    def recheck(site):
        info = Future()
        info.set_result("24 feature columns")
        return info

    plan = SitePlan("s", "features", "routine", None, None, None, copies=2)
    fan = FanOut({"s": plan}, send, time.monotonic() + 60, recheck=recheck)
    try:
        assert fan.start() == []
        refusals[0].release()
        (outcome,) = list(fan.outcomes())
    finally:
        fan.cancel()
    assert outcome.code == grpc.StatusCode.OK and outcome.attempt.label == "features retry"
    assert sent == ["features", "features", "features"]  # no images
    why = codes(fan.runs["s"].why)
    assert "features_sent_again" in why and "images_after_features_failed" not in why


def test_copies_still_due_when_the_site_refuses_the_features_are_not_sent():
    """A refused features request is asked about again at once; its spaced copies still to go
    would be refused too (they were sent as images instead on a busy machine): they stay unsent."""
    from concurrent.futures import Future

    sent = []

    def send(site, cls, mode, lane=0, send_id=""):
        sent.append((mode, lane))
        if len(sent) == 1:
            return Now(code=grpc.StatusCode.INVALID_ARGUMENT, details="the request's columns are not the site's"), 100
        return Now(reply=pb.AnalyseReply(site=site, algorithm="transfer-only")), 100

    def recheck(site):
        info = Future()
        info.set_result("24 feature columns")
        return info

    plan = SitePlan("s", "features", "routine", None, None, None, copies=3, copy_gap_s=0.05)
    fan = FanOut({"s": plan}, send, time.monotonic() + 60, recheck=recheck)
    try:
        assert fan.start() == []
        (outcome,) = list(fan.outcomes())
    finally:
        fan.cancel()
    assert outcome.code == grpc.StatusCode.OK and outcome.attempt.label == "features retry"
    assert sent == [("features", 0), ("features", 0)] and not fan.runs["s"].copies_due
