"""The client sends each case to the coordinator's port for its class (replies marked there),
and falls back to the control port for a coordinator that has none.

The marks themselves are checked on the wire in test_dscp_wire.py; here, on loopback, that
the client learns the ports, uses them, and copes with coordinators old and restarted.
"""

from __future__ import annotations

import grpc
import pytest

from qos.classes import DEFAULT_CLASSES
from qos.transport import ClassChannels, MarkedServer, connect_address
from services.classinfo import table_from_info
from services.client import CoordinatorClient
from services.config import CoordinatorConfig, SiteEndpoint
from services.coordinator.server import COORDINATOR_SERVICE, CoordinatorServer, CoordinatorServicer
from services.coordinator.stats import CaseLog, ClassStats
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def summary_of(events) -> pb.CaseSummary:
    events = list(events)
    results = [e.site_result for e in events if e.HasField("site_result")]
    assert results and all(r.status_code == 0 for r in results), [r.status_message for r in results]
    assert events[-1].HasField("summary")
    return events[-1].summary


def site_endpoints(deployment) -> list[SiteEndpoint]:
    return [SiteEndpoint(name=name, address=site.address) for name, site in deployment.sites.items()]


def test_coordinator_advertises_a_marked_port_per_class(deployment):
    coordinator = deployment.coordinator
    with grpc.insecure_channel(coordinator.address) as channel:
        info = pb_grpc.CoordinatorStub(channel).Info(pb.CoordinatorInfoRequest(), timeout=10)
    assert dict(info.class_ports) == coordinator.class_ports
    assert set(info.class_ports) == set(DEFAULT_CLASSES.names())
    assert len({*info.class_ports.values(), port_of(coordinator.address)}) == len(DEFAULT_CLASSES.names()) + 1
    assert dict(info.class_dscp) == {c.name: c.dscp for c in DEFAULT_CLASSES}


def test_coordinator_info_carries_its_class_table(deployment):
    with grpc.insecure_channel(deployment.coordinator.address) as channel:
        info = pb_grpc.CoordinatorStub(channel).Info(pb.CoordinatorInfoRequest(), timeout=10)
    assert [(c.name, c.dscp, c.priority, c.description) for c in info.classes] == \
        [(c.name, c.dscp, c.priority, c.description) for c in DEFAULT_CLASSES]
    assert table_from_info(info) == DEFAULT_CLASSES


def test_the_table_of_an_older_coordinator():
    # Before Info.classes: names and DSCPs from class_dscp, the higher DSCP taken as more favoured.
    older = pb.CoordinatorInfo(class_ports={"urgent": 50071, "teaching": 50072},
                               class_dscp={"teaching": 10, "urgent": 40})
    table = table_from_info(older)
    assert table.names() == ["urgent", "teaching"] and table["urgent"].dscp == 40
    # Before Info (None), or an Info that lists no class: the default table, all such a coordinator had.
    assert table_from_info(None) == DEFAULT_CLASSES == table_from_info(pb.CoordinatorInfo())


def test_client_sends_each_class_to_its_port(deployment, case):
    coordinator = deployment.coordinator
    with CoordinatorClient(coordinator.address) as client:
        assert client.class_address("urgent") == coordinator.address  # nothing asked yet
        for request_class in ("urgent", "bulk"):
            summary = summary_of(client.submit(case[:1], request_class, deadline_s=60, sites=["alpha"]))
            assert summary.request_class == request_class
            assert port_of(client.class_address(request_class)) == coordinator.class_ports[request_class]
        # An unknown class still reaches the control port, which names the known ones.
        with pytest.raises(grpc.RpcError) as err:
            list(client.submit(case[:1], "express", deadline_s=10))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "urgent" in err.value.details()


class OlderCoordinator(CoordinatorServicer):
    """The coordinator as it was before class ports: no Info RPC (UNIMPLEMENTED)."""

    Info = pb_grpc.CoordinatorServicer.Info


@pytest.mark.parametrize("older", ["no Info RPC", "no class ports"])
def test_client_uses_the_control_port_of_a_coordinator_without_class_ports(deployment, case, older):
    config = CoordinatorConfig(sites=site_endpoints(deployment), class_ports={})
    channels = ClassChannels({s.name: s.address for s in config.sites})
    servicer_class = OlderCoordinator if older == "no Info RPC" else CoordinatorServicer
    servicer = servicer_class(config, channels, ClassStats(config.classes), CaseLog(None))
    server = MarkedServer(lambda s: pb_grpc.add_CoordinatorServicer_to_server(servicer, s),
                          [COORDINATOR_SERVICE], "127.0.0.1", 0, config.class_ports).start()
    address = connect_address("127.0.0.1", server.port)
    try:
        with CoordinatorClient(address) as client:
            summary = summary_of(client.submit(case[:1], "urgent", deadline_s=60, sites=["alpha"]))
            assert summary.request_class == "urgent"
            assert client.learn_class_ports() == {} and client.class_address("urgent") == address
    finally:
        server.stop(0)
        channels.close()


def test_client_relearns_the_ports_of_a_restarted_coordinator(deployment, case):
    # No analysers (images to the sites): each of these coordinators would start two Ray actors.
    first = CoordinatorServer(CoordinatorConfig(sites=site_endpoints(deployment), analysis_workers=0)).start()
    control, old_ports = first.address, first.class_ports
    client = CoordinatorClient(control)
    second = None
    try:
        summary_of(client.submit(case[:1], "teaching", deadline_s=60, sites=["alpha"]))
        first.stop(0)
        # Same control port, new free class ports; the old ones all gone (the kernel may hand
        # a freed port out again: then try again, a bounded number of times).
        for _ in range(5):
            second = CoordinatorServer(CoordinatorConfig(sites=site_endpoints(deployment),
                                                         listen=control, analysis_workers=0)).start()
            if not set(second.class_ports.values()) & set(old_ports.values()):
                break
            second.stop(0)
            second = None
        assert second is not None, "no fresh class ports in 5 restarts"
        with pytest.raises(grpc.RpcError) as err:
            list(client.submit(case[:1], "teaching", deadline_s=10, sites=["alpha"]))
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        summary_of(client.submit(case[:1], "teaching", deadline_s=60, sites=["alpha"]))
        assert port_of(client.class_address("teaching")) == second.class_ports["teaching"]
    finally:
        client.close()
        first.stop(0)  # a second stop is harmless
        if second is not None:
            second.stop(0)


def test_a_class_port_refuses_other_classes_and_a_stale_client_recovers(deployment, case):
    coordinator = deployment.coordinator
    host = coordinator.address.rpartition(":")[0]
    urgent_port = f"{host}:{coordinator.class_ports['urgent']}"
    # A bulk case on the urgent port would get urgent's DSCP on its replies: refused by name.
    with grpc.insecure_channel(urgent_port) as channel:
        request = pb.CaseRequest(request_class="bulk", cells=case[:1], sites=["alpha"], deadline_s=10)
        with pytest.raises(grpc.RpcError) as err:
            list(pb_grpc.CoordinatorStub(channel).SubmitCase(request, timeout=15))
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "'urgent'" in err.value.details() and "'bulk'" in err.value.details()
    # A client whose port map is stale (classes swapped, as after a restart on reused free
    # ports) fails once with that message, asks Info again, and the next case goes right.
    with CoordinatorClient(coordinator.address) as client:
        client.learn_class_ports()
        swapped = dict(coordinator.class_ports, urgent=coordinator.class_ports["bulk"],
                       bulk=coordinator.class_ports["urgent"])
        client._channels.set_class_ports("coordinator", swapped)
        with pytest.raises(grpc.RpcError) as err:
            list(client.submit(case[:1], "bulk", deadline_s=10, sites=["alpha"]))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        summary = summary_of(client.submit(case[:1], "bulk", deadline_s=60, sites=["alpha"]))
        assert summary.request_class == "bulk"
        assert port_of(client.class_address("bulk")) == coordinator.class_ports["bulk"]
