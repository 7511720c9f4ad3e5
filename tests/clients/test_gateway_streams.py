"""A case streaming through the gateway holds no worker thread: more cases stream at once
than AnyIO's worker threads (40), and a browser that goes away cancels its case at the
coordinator. Against a stand-in coordinator that holds each case open after its plan until
the test lets it finish (no Ray, no sites)."""

from __future__ import annotations

import http.client
import io
import json
import threading
from concurrent import futures
from urllib.parse import urlsplit

import grpc
import pytest
from PIL import Image

from qos.classes import DEFAULT_CLASSES
from services.classinfo import class_messages
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from tests.clients.web import login_link, multipart

WAIT_S = 60  # for any one reply at the client
HOLD_S = 3 * WAIT_S  # a held case ends by itself after this (longer than any wait for a reply)
ANYIO_THREADS = 40  # AnyIO's default worker-thread limit, which Starlette's run_in_threadpool uses
CASES = ANYIO_THREADS + 20


class HeldCoordinator(pb_grpc.CoordinatorServicer):
    """Answers Info with the default classes (no class ports); each case gets its plan at
    once, then is held until `release()` (then its summary) or until the caller cancels."""

    def __init__(self):
        self.lock = threading.Lock()
        self.held: list[threading.Event] = []
        self.released = False
        self.cancelled = 0
        self.cancelled_event = threading.Condition(self.lock)

    def Info(self, request, context):
        return pb.CoordinatorInfo(classes=class_messages(DEFAULT_CLASSES))

    def SubmitCase(self, request, context):
        ended, summarised = threading.Event(), threading.Event()

        def on_end():  # the call is over: its summary sent, or cancelled by the caller
            ended.set()
            if not summarised.is_set():
                with self.lock:
                    self.cancelled += 1
                    self.cancelled_event.notify_all()

        # Registered before the plan goes: a caller that cancels while the plan is on its way
        # ends the call before this generator is resumed, and gRPC then never resumes it.
        context.add_callback(on_end)
        with self.lock:
            self.held.append(ended)
            if self.released:
                ended.set()
        yield pb.CaseEvent(plan=pb.CasePlan(case_id=request.case_id or "held",
                                            request_class=request.request_class))
        ended.wait(HOLD_S)
        if not context.is_active():
            return
        summarised.set()
        yield pb.CaseEvent(summary=pb.CaseSummary(case_id=request.case_id or "held",
                                                  request_class=request.request_class))

    def release(self) -> None:
        with self.lock:
            self.released = True
            for ended in self.held:
                ended.set()

    def wait_cancelled(self, count: int) -> bool:
        with self.lock:
            return self.cancelled_event.wait_for(lambda: self.cancelled >= count, timeout=WAIT_S)


@pytest.fixture
def held():
    servicer = HeldCoordinator()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=CASES + 20))
    pb_grpc.add_CoordinatorServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    servicer.release()
    server.stop(0)


@pytest.fixture
def held_gateway(held):
    from services.gateway import start_gateway

    servicer, address = held
    handle = start_gateway(address)
    yield servicer, handle
    handle.stop()


def png(side: int = 8) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (side, side), (200, 150, 180)).save(out, format="PNG")
    return out.getvalue()


class Page:
    """A signed-in page's cookie and CSRF token, to send cases on connections of its own."""

    def __init__(self, handle):
        parts = urlsplit(handle.url)
        self.host, self.port = parts.hostname, parts.port
        self.origin = f"{parts.scheme}://{parts.netloc}"
        link = urlsplit(login_link(handle))
        conn = http.client.HTTPConnection(self.host, self.port, timeout=WAIT_S)
        conn.request("GET", f"{link.path}?{link.query}")
        reply = conn.getresponse()
        assert reply.status == 303
        self.cookie = reply.getheader("Set-Cookie").split(";")[0]
        reply.read()
        conn.request("GET", "/api/session", headers={"Cookie": self.cookie})
        self.csrf = json.loads(conn.getresponse().read())["csrf"]
        conn.close()
        self.body, self.kind = multipart({"request_class": "urgent"}, {"cell1.png": png()})

    def send_case(self) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """A case sent on a new connection: (the connection, its streaming reply)."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=WAIT_S)
        conn.request("POST", "/api/case", body=self.body,
                     headers={"Content-Type": self.kind, "Cookie": self.cookie,
                              "X-CSRF-Token": self.csrf, "Origin": self.origin})
        reply = conn.getresponse()
        assert reply.status == 200, reply.read()
        return conn, reply


def next_event(reply: http.client.HTTPResponse) -> dict:
    line = reply.readline()
    assert line, "the stream ended"
    return json.loads(line)


def test_more_cases_stream_at_once_than_there_are_worker_threads(held_gateway):
    servicer, handle = held_gateway
    page = Page(handle)
    streams = []
    try:
        for _ in range(CASES):  # each is held open at the coordinator after its plan
            conn, reply = page.send_case()
            streams.append((conn, reply))
            assert next_event(reply)["type"] == "accepted"
            assert next_event(reply)["type"] == "plan"  # times out if the gateway ran out of threads
        servicer.release()
        for _, reply in streams:
            assert next_event(reply)["type"] == "summary"
    finally:
        for conn, _ in streams:
            conn.close()


def test_a_page_that_goes_away_cancels_its_case_at_the_coordinator(held_gateway):
    servicer, handle = held_gateway
    page = Page(handle)
    conn, reply = page.send_case()
    assert [next_event(reply)["type"], next_event(reply)["type"]] == ["accepted", "plan"]
    conn.close()  # the browser's tab is closed while the sites work
    assert servicer.wait_cancelled(1)
