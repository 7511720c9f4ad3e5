"""Every port of a MarkedServer (a site's and the coordinator's control port and class
ports) refuses what it cannot serve before the servicer sees it: an unknown request class
and request bytes that do not parse are INVALID_ARGUMENT, another class on a class port
FAILED_PRECONDITION; an empty class and the port's own class are served."""

from __future__ import annotations

import grpc
import pytest

from qos.classes import DEFAULT_CLASSES
from qos.transport import MarkedServer
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

ANALYSE = "/pathmaster.v1.Site/Analyse"
INFO = "/pathmaster.v1.Site/Info"


class CountingSite(pb_grpc.SiteServicer):
    """A site whose Analyse and Info answer at once and count the requests that reached them."""

    def __init__(self):
        self.reached = []

    def Analyse(self, request, context):
        self.reached.append(request.request_class)
        return pb.AnalyseReply(site="counting")

    def Info(self, request, context):
        self.reached.append("info")
        return pb.SiteInfo(site="counting")


@pytest.fixture(scope="module")
def site():
    """(servicer, {port name: channel}): the control port and the urgent and bulk ports."""
    servicer = CountingSite()
    server = MarkedServer(lambda s: pb_grpc.add_SiteServicer_to_server(servicer, s), ["pathmaster.v1.Site"],
                          "127.0.0.1", 0, {"urgent": 0, "bulk": 0}).start()
    ports = {"control": server.port, **server.class_ports}
    channels = {name: grpc.insecure_channel(f"127.0.0.1:{port}") for name, port in ports.items()}
    yield servicer, channels
    for channel in channels.values():
        channel.close()
    server.stop(0)


def call(channel, method: str, data: bytes):
    """The status code of a unary call sending raw `data` (its reply left unparsed)."""
    try:
        channel.unary_unary(method)(data, timeout=10)
        return grpc.StatusCode.OK
    except grpc.RpcError as exc:
        return exc.code()


def analyse(request_class: str) -> bytes:
    return pb.AnalyseRequest(case_id="c1", request_class=request_class).SerializeToString()


@pytest.mark.parametrize("port", ["control", "urgent", "bulk"])
def test_an_unknown_class_is_refused_on_every_port(site, port):
    servicer, channels = site
    before = len(servicer.reached)
    assert call(channels[port], ANALYSE, analyse("no-such-class")) == grpc.StatusCode.INVALID_ARGUMENT
    assert len(servicer.reached) == before


@pytest.mark.parametrize("port", ["control", "urgent", "bulk"])
@pytest.mark.parametrize("method", [ANALYSE, INFO])
def test_bytes_that_do_not_parse_are_invalid_argument_not_internal(site, port, method):
    servicer, channels = site
    before = len(servicer.reached)
    # field 1 as a length-delimited field running past the end; a wire type that does not
    # exist; for Analyse, its case_id (field 1) not UTF-8 (proto3 refuses it; SiteInfoRequest
    # has no field 1 and keeps it as an unknown field, which parses)
    junks = [b"\x0a\x05ab", b"\x0f"] + ([b"\x0a\x02\xff\xfe"] if method == ANALYSE else [])
    for junk in junks:
        assert call(channels[port], method, junk) == grpc.StatusCode.INVALID_ARGUMENT, junk
    assert len(servicer.reached) == before


def test_a_class_port_serves_its_own_class_and_refuses_another_known_one(site):
    servicer, channels = site
    assert call(channels["urgent"], ANALYSE, analyse("urgent")) == grpc.StatusCode.OK
    assert call(channels["urgent"], ANALYSE, analyse("bulk")) == grpc.StatusCode.FAILED_PRECONDITION
    assert servicer.reached[-1] == "urgent"


@pytest.mark.parametrize("request_class", ["", *DEFAULT_CLASSES.names()])
def test_the_control_port_serves_every_known_class_and_the_default(site, request_class):
    servicer, channels = site
    assert call(channels["control"], ANALYSE, analyse(request_class)) == grpc.StatusCode.OK
    assert servicer.reached[-1] == request_class


def test_health_and_reflection_still_answer_on_a_class_port(site):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    _, channels = site
    reply = health_pb2_grpc.HealthStub(channels["bulk"]).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert call(channels["bulk"], "/grpc.health.v1.Health/Check", b"\x0f") == grpc.StatusCode.INVALID_ARGUMENT
