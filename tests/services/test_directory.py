"""The site directory: what a site's Info gives the channels and the predictor, when a site
is asked again, and a recheck after a refusal (fake sites); and closing under look-ups still
waiting: they end quietly, nothing starts or is learnt afterwards, and the channels can then
be closed (what the coordinator's stop does while its thread learning the sites' class
ports is still asking)."""

from __future__ import annotations

import concurrent.futures
import socket
import threading
import time

import grpc
import pytest

from qos.channels import ClassChannels
from qos.classes import DEFAULT_CLASSES
from qos.predict import Predictor
from services.coordinator.directory import RETRY_LOOKUP_S, SiteDirectory, site_load
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from tests.services.conftest import CallFailed

WAIT_S = 20.0  # far less than the look-up's own timeout below


@pytest.fixture
def nobody():
    """A loopback address on which nothing listens (bound, never listening: refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{sock.getsockname()[1]}"


def test_closing_ends_a_look_up_that_waits_and_nothing_starts_after_it(nobody):
    channels = ClassChannels({"nowhere": nobody}, DEFAULT_CLASSES)
    directory = SiteDirectory(["nowhere"], channels, predictor=None)
    errors: list[BaseException] = []

    def look_up():
        try:
            directory.resolve(["nowhere"], timeout_s=120.0)  # waits for a site that never comes
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    thread = threading.Thread(target=look_up, daemon=True)
    thread.start()
    deadline = time.monotonic() + WAIT_S
    while "nowhere" not in directory._lookups and time.monotonic() < deadline:
        time.sleep(0.01)  # until the Info call is in flight
    assert "nowhere" in directory._lookups, "the look-up never started"

    directory.close()
    thread.join(WAIT_S)
    assert not thread.is_alive(), "closing the directory left its look-up waiting"
    assert errors == []

    channels.close()
    directory.resolve(["nowhere"], timeout_s=120.0)  # returns at once: no call on the closed channels
    directory.learn("nowhere", pb.SiteInfo(class_ports={"urgent": 1}, feature_schema="s"))
    assert not directory.knows("nowhere") and "nowhere" not in directory.schemas
    assert channels._channels == {}, "a closed directory opened a connection"
    assert directory.recheck("nowhere", "s", time.monotonic() + 5).result(timeout=0) is None


# ---------------------------------------------------------------- with fake sites


class InfoSites:
    """ClassChannels' part the directory uses, over fake sites: each Info call is answered
    at once from `infos` (a settled future), or fails UNAVAILABLE for a site not in it.
    Records the sites asked, the ports given and the connections opened."""

    def __init__(self, infos: dict[str, pb.SiteInfo]):
        self.infos = infos
        self.asked: list[str] = []
        self.ports: dict[str, dict[str, int]] = {}
        self.connected: list[tuple[str, list[str], int]] = []

    def set_class_ports(self, site, ports):
        self.ports[site] = dict(ports)

    def has_class_ports(self, site):
        return site in self.ports

    def connect(self, site, classes, lanes):
        self.connected.append((site, list(classes), lanes))

    def channel(self, site, class_name=None, lane=0):
        sites = self

        class Channel:
            def unary_unary(self, method, *args, **kwargs):
                class Method:
                    @staticmethod
                    def future(request, timeout=None, wait_for_ready=None, metadata=None):
                        sites.asked.append(site)
                        future = concurrent.futures.Future()
                        if site in sites.infos:
                            future.set_result(sites.infos[site])
                        else:
                            future.set_exception(CallFailed(grpc.StatusCode.UNAVAILABLE, "down"))
                        return future
                return Method

        return Channel()


def site_info(schema: str = "fs1", columns=(0, 2), **load) -> pb.SiteInfo:
    return pb.SiteInfo(class_ports={"urgent": 5001, "routine": 5002}, feature_schema=schema,
                       feature_columns=list(columns), load=pb.SiteLoad(**load))


def test_a_sites_info_gives_the_channels_its_ports_and_lanes_and_the_predictor_its_load():
    sites = InfoSites({"alpha": site_info(waiting_cells=4, workers=0, waiting_s=2.0)})
    predictor = Predictor()
    directory = SiteDirectory(["alpha"], sites, predictor, lanes=3)
    directory.resolve(["alpha"])
    assert sites.ports == {"alpha": {"urgent": 5001, "routine": 5002}}
    # every class's lanes, opened now (a map's order is not the protocol's to keep)
    assert [(site, sorted(classes), lanes) for site, classes, lanes in sites.connected] == [
        ("alpha", ["routine", "urgent"], 3)]
    assert (directory.schemas, directory.columns, directory.models) == ({"alpha": "fs1"}, {"alpha": (0, 2)},
                                                                       {"alpha": ""})
    assert directory.knows("alpha") and directory.network("alpha") is None  # no eye to open
    load = predictor.site("alpha").load
    # workers at least one; no per-class wait reported: the one total stands for every class
    assert (load.waiting_cells, load.workers, load.waiting_s, load.waiting_s_by_class) == (4, 1, 2.0, None)
    assert site_load(pb.SiteLoad(workers=2, waiting_s_by_class={"urgent": 0.5})).waiting_s_by_class == {"urgent": 0.5}


def test_before_a_case_a_known_site_is_not_asked_and_a_failed_one_not_again_within_the_retry_gap():
    sites = InfoSites({"alpha": site_info()})
    directory = SiteDirectory(["alpha", "down"], sites, predictor=None)
    directory.before_case(["alpha", "down"], 30.0)
    directory.before_case(["alpha", "down"], 30.0)
    assert sorted(sites.asked) == ["alpha", "down"]  # each once
    assert directory.knows("alpha") and not directory.knows("down")
    directory._last_lookup["down"] -= RETRY_LOOKUP_S  # the gap has passed
    directory.before_case(["alpha", "down"], 30.0)
    assert sorted(sites.asked) == ["alpha", "down", "down"]


def test_a_recheck_after_a_refusal_learns_the_site_anew_and_says_whether_features_may_go_again():
    sites = InfoSites({"alpha": site_info()})
    directory = SiteDirectory(["alpha", "down"], sites, predictor=None)
    directory.resolve(["alpha"])
    sites.infos["alpha"] = site_info("fs2", columns=(1,))  # re-indexed
    deadline = time.monotonic() + 5
    assert directory.recheck("alpha", "fs1", deadline).result(timeout=0) is None  # not the schema sent
    assert (directory.schemas["alpha"], directory.columns["alpha"]) == ("fs2", (1,))
    assert directory.recheck("alpha", "fs2", deadline).result(timeout=0) is not None
    assert directory.recheck("down", "fs1", deadline).result(timeout=0) is None  # no Info: the images go
