"""The coordinator over three real sites (Ray actors, FAISS, SQLite) on loopback."""

from __future__ import annotations

import io
import json
import threading
import time
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from PIL import Image

from pathmaster.vocabulary import BUILTIN, severity
from qos.network import GRPC_REPLY_FRAMING_BYTES, TCP_INITIAL_WINDOW_BYTES
from services.client import CoordinatorClient
from services.config import CoordinatorConfig, SiteEndpoint
from services.coordinator.server import CoordinatorServer
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.reasons import codes

OK = 0
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]


def run_case(address, cells, request_class="routine", **kwargs):
    """[(seconds since submit, event)] of one case."""
    with CoordinatorClient(address) as client:
        started = time.monotonic()
        return [(time.monotonic() - started, e) for e in client.submit(cells, request_class, **kwargs)]


def site_results(events):
    return {e.site_result.site: e.site_result for _, e in events if e.HasField("site_result")}


def assert_serving(address, case, sites=("alpha", "beta", "gamma")):
    """The coordinator still answers a good case from every (named) site."""
    events = run_case(address, case[:2], deadline_s=60, sites=list(sites))
    results = site_results(events)
    assert set(results) == set(sites) and all(r.status_code == OK for r in results.values())
    assert events[-1][1].HasField("summary")


def test_case_streams_every_site_then_summary(deployment, case, case_cells):
    events = run_case(deployment.coordinator.address, case, "urgent", deadline_s=60)
    results = site_results(events)
    assert set(results) == {"alpha", "beta", "gamma"}
    assert [e.WhichOneof("event") for _, e in events] == ["plan", *["site_result"] * 3, "summary"]
    planned = {p.site: p for p in events[0][1].plan.sites}
    truth = {c["cell_id"]: c["diagnosis"] for c in case_cells}
    for site, result in results.items():
        assert result.status_code == OK, result.status_message
        assert [c.query_cell_id for c in result.cells] == [c.cell_id for c in case]
        assert ("hnsw" in result.algorithm) == (site == "beta")
        for cell in result.cells:
            assert cell.error == ""
            assert not cell.mask_estimated and not cell.background_estimated  # both were sent
            assert len(cell.matches) == 5
            distances = [m.distance for m in cell.matches]
            assert distances == sorted(distances)
            thumbnail = Image.open(io.BytesIO(cell.matches[0].thumbnail))  # sized for the wire
            assert thumbnail.format == "WEBP" and max(thumbnail.size) <= 48
        # The answer (30 matches, their hashes and thumbnails) is one initial congestion window.
        assert result.bytes_received <= TCP_INITIAL_WINDOW_BYTES - GRPC_REPLY_FRAMING_BYTES
        # Every site shares the coordinator's feature schema: the cells were analysed once,
        # at the coordinator, and only their feature vectors travelled.
        # ...in the class the plan chose for the site: urgent, or a lower class when the
        # prediction said it would still meet urgent's deadline (qos.policy's step-down).
        assert result.mode == "features" and result.request_class == planned[site].request_class
        assert planned[site].request_class == "urgent" or \
            "class_stepped_down_within_deadline" in codes(planned[site].why)
        t = result.timing
        assert t.extraction_s == 0 and 0 < t.site_wall_s <= t.total_s
        assert 0 < result.bytes_sent < sum(len(c.image) for c in case) / 10 and result.bytes_received > 0
    summary = events[-1][1].summary
    assert summary.sites_ok == 3 and summary.sites_failed == 0 and summary.request_class == "urgent"
    assert summary.bytes_sent == sum(r.bytes_sent for r in results.values())
    # Synthetic classes are well separated: most votes name the true diagnosis.
    correct = sum(v.diagnosis == truth[v.query_cell_id] for v in summary.votes)
    assert len(summary.votes) == 6 and correct >= 4
    # Every match carries its Bethesda term (the sites' vocabulary is herlev); votes too.
    herlev = BUILTIN["herlev"]
    assert all(m.bethesda == herlev.to_bethesda(m.diagnosis)
               for r in results.values() for c in r.cells for m in c.matches)
    assert all(v.bethesda and v.bethesda_votes >= v.votes for v in summary.votes)
    assert all(v.bethesda_total == 15 for v in summary.votes)
    # The case is concluded by its most significant abnormality (3 normal cells, mild,
    # moderate and severe dysplasia: HSIL in 2 of 6 cells), from every cell's 15 matches.
    conclusion = summary.conclusion
    true_terms = [herlev.to_bethesda(truth[c.query_cell_id]) for c in conclusion.cells]
    worst = max(true_terms, key=severity)
    assert (conclusion.outcome, conclusion.bethesda) == ("abnormal", worst)
    assert (conclusion.cells_with, conclusion.cells_total) == (true_terms.count(worst), 6)
    assert [c.total for c in conclusion.cells] == [15] * 6
    assert [c.abnormal for c in conclusion.cells] == [t != "NILM" for t in true_terms]


def test_cells_without_mask_or_background_are_estimated(deployment, case_cells):
    cells = [pb.CellImage(cell_id=c["cell_id"], image=c["image"]) for c in case_cells[:2]]
    events = run_case(deployment.coordinator.address, cells, sites=["alpha"])
    (result,) = site_results(events).values()
    assert all(c.mask_estimated and c.background_estimated and len(c.matches) == 5 for c in result.cells)


def test_completion_record_stats_and_metrics(deployment, case):
    address = deployment.coordinator.address
    with CoordinatorClient(address) as client:
        before = client.class_stats("teaching")[0].cases
    for _ in range(2):
        run_case(address, case[:1], "teaching")
    with CoordinatorClient(address) as client:
        (stats,) = client.class_stats("teaching")
        every = client.class_stats()
    assert stats.request_class == "teaching" and stats.dscp == 10
    assert stats.cases == before + 2
    recent = list(stats.recent_s)
    assert stats.mean_s == pytest.approx(sum(recent) / len(recent))
    assert stats.p50_s <= stats.p95_s and stats.cv == pytest.approx(stats.std_s / stats.mean_s)
    assert [s.request_class for s in every] == ["urgent", "routine", "teaching", "bulk"]

    records = [json.loads(line) for line in deployment.coordinator.config.case_log.read_text().splitlines()]
    last = records[-1]
    assert last["class"] == "teaching" and last["dscp"] == 10 and last["outcome"] == "ok"
    assert set(last["sites"]) == {"alpha", "beta", "gamma"}
    assert all(s["status"] == "OK" and s["bytes_sent"] > 0 and s["bytes_received"] > 0 and s["total_s"] > 0
               for s in last["sites"].values())
    assert last["bytes_sent"] == sum(s["bytes_sent"] for s in last["sites"].values())
    assert last["total_s"] == pytest.approx(stats.recent_s[-1], abs=1e-5)

    text = urllib.request.urlopen(deployment.coordinator.metrics_url, timeout=10).read().decode()
    assert f'pathmaster_cases_total{{class="teaching",outcome="ok"}} {float(stats.cases)}' in text
    assert 'pathmaster_case_p95_seconds{class="teaching"}' in text
    assert 'pathmaster_case_seconds_count{class="teaching",outcome="ok"}' in text
    # A site call is counted in the class it was sent in: the policy may have stepped the
    # case down for that site (the case log says which).
    alpha_class = last["sites"]["alpha"]["class"]
    assert f'pathmaster_site_call_seconds_count{{class="{alpha_class}",outcome="ok",site="alpha"}}' in text
    assert 'pathmaster_cases_in_flight{class="teaching"} 0.0' in text
    assert 'pathmaster_build_info{' in text and 'process_resident_memory_bytes' in text


def test_unknown_class_is_invalid_argument_listing_known(deployment, case):
    with pytest.raises(grpc.RpcError) as err:
        run_case(deployment.coordinator.address, case, "express")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'express'" in err.value.details()
    for name in ("urgent", "routine", "teaching", "bulk"):
        assert name in err.value.details()
    assert_serving(deployment.coordinator.address, case)


def test_corrupt_image_names_the_cell(deployment, case):
    broken = pb.CellImage(cell_id="broken-cell.png", image=case[1].image[: len(case[1].image) // 2])
    with pytest.raises(grpc.RpcError) as err:
        run_case(deployment.coordinator.address, [case[0], broken])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "broken-cell.png" in err.value.details() and "image" in err.value.details()

    bad_mask = pb.CellImage(cell_id="c7.png", image=case[0].image, mask=case[0].image)  # RGB, not labels
    with pytest.raises(grpc.RpcError) as err:
        run_case(deployment.coordinator.address, [bad_mask])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "c7.png" in err.value.details() and "mask" in err.value.details()
    assert_serving(deployment.coordinator.address, case)


def test_unknown_site_is_invalid_argument(deployment, case):
    with pytest.raises(grpc.RpcError) as err:
        run_case(deployment.coordinator.address, case, sites=["atlantis"])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "atlantis" in err.value.details() and "alpha" in err.value.details()


@pytest.fixture(scope="module")
def small_limits(deployment):
    """A second coordinator over the same sites with small case limits."""
    sites = [SiteEndpoint(name=name, address=site.address) for name, site in deployment.sites.items()]
    server = CoordinatorServer(CoordinatorConfig(sites=sites, max_cells=4, max_case_mb=4,
                                                  analysis_workers=0)).start()  # limits: no analysers needed
    yield server
    server.stop(0)


def test_too_many_cells_is_resource_exhausted_with_the_limit(small_limits, case):
    with pytest.raises(grpc.RpcError) as err:
        run_case(small_limits.address, case)  # 6 cells, limit 4
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "6 cells" in err.value.details() and "limit is 4" in err.value.details()
    assert_serving(small_limits.address, case)


def test_too_many_bytes_is_resource_exhausted_with_the_limit(small_limits, case, ten_mb_png):
    with pytest.raises(grpc.RpcError) as err:
        run_case(small_limits.address, [pb.CellImage(cell_id="huge.png", image=ten_mb_png)])
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert str(4 * 2**20) in err.value.details()
    assert_serving(small_limits.address, case)


def test_ten_megabyte_image_works(deployment, ten_mb_png):
    assert len(ten_mb_png) >= 10 * 2**20
    # Shipped as images: the 10 MB file itself crosses to the site (features mode would send ~1 KB).
    events = run_case(deployment.coordinator.address, [pb.CellImage(cell_id="ten-mb.png", image=ten_mb_png)],
                      sites=["alpha"], deadline_s=60, ship="images")
    result = site_results(events)["alpha"]
    assert result.status_code == OK, result.status_message
    assert result.bytes_sent > 10 * 2**20
    assert len(result.cells[0].matches) == 5 and result.cells[0].error == ""


def test_site_down_gives_unavailable_first_and_partial_results(deployment, case):
    sites = [SiteEndpoint(name=name, address=site.address) for name, site in deployment.sites.items()]
    sites.append(SiteEndpoint(name="down", address="127.0.0.1:9"))  # nothing listens on the discard port
    server = CoordinatorServer(CoordinatorConfig(sites=sites, analysis_workers=0)).start()  # images to every site
    try:
        events = run_case(server.address, case, deadline_s=60)
        results = site_results(events)
        assert results["down"].status_code == UNAVAILABLE and "down" in results["down"].status_message
        assert all(results[s].status_code == OK for s in ("alpha", "beta", "gamma"))
        # Streamed as each site answers: the dead site's result comes first, well before the others.
        assert events[0][1].HasField("plan")
        first_time, first = events[1]
        assert first.site_result.site == "down"
        assert first_time < min(t for t, e in events[2:])
        summary = events[-1][1].summary
        assert summary.sites_ok == 3 and summary.sites_failed == 1
        assert_serving(server.address, case)
    finally:
        server.stop(0)


def test_deadline_gives_deadline_exceeded_in_time(deployment, slow_case, case):
    deadline = 0.5
    # slow_case: ~1.8 s of analysis per site, over the deadline however idle the machine.
    events = run_case(deployment.coordinator.address, slow_case, deadline_s=deadline, ship="images")
    results = site_results(events)
    assert {r.status_code for r in results.values()} == {DEADLINE_EXCEEDED}
    assert events[-1][1].HasField("summary") and events[-1][1].summary.sites_failed == 3
    assert events[-1][0] < deadline + 1.0  # tolerance for a loaded machine
    assert_serving(deployment.coordinator.address, case)


def pool_events(site, prefix: str) -> list[tuple[str, str]]:
    """(cell, outcome) of the site's first worker's analysis-pool events whose cell id
    starts with `prefix` (pathmaster/analysis/budget.py PoolStats.events)."""
    import ray

    stats = ray.get(site.workers[0].budget_stats.remote(), timeout=60)
    return [(name, outcome) for _, name, outcome in stats["events"] if name.startswith(f"cell '{prefix}")]


@pytest.fixture(scope="module")
def slower_case(case_cells) -> list[pb.CellImage]:
    """Twelve 800 x 800-pixel cells: seconds of analysis per site (~0.3 s of CPU a cell), so
    that a case cancelled after a site's first cell has eleven still to do."""
    from tests.services.conftest import large_cell

    png = large_cell(case_cells, 800)
    return [pb.CellImage(cell_id=f"larger-{i}.png", image=png) for i in range(12)]


def test_client_cancel_cancels_every_site_call(deployment, slower_case, case):
    """A cancelled case's calls end at every site, its cells there are stopped (the running
    one's analysis process killed, the queued ones never started) and the next case is served."""
    sites = [site.servicer for site in deployment.sites.values()]
    coordinator_cancelled = deployment.coordinator.servicer.cases_cancelled
    cells = [pb.CellImage(cell_id=f"cancel-me-{i}.png", image=c.image) for i, c in enumerate(slower_case)]
    with CoordinatorClient(deployment.coordinator.address) as client:
        call = client.submit(cells, "routine", deadline_s=60, case_id="cancel-me", ship="images")
        poll_until(lambda: all("cancel-me" in s.cases_started for s in sites), 20, "every site to start the case")
        # Cancel once every site is analysing (its first cell done, eleven to go), not merely
        # once the case arrived: on a busy machine a site can take seconds to reach its pool.
        for name, site in deployment.sites.items():
            poll_until(lambda: ("completed" in {o for _, o in pool_events(site, "cancel-me-")}), 60,
                       f"site {name} to finish its first cell", every_s=0.25)
        call.cancel()
        with pytest.raises(grpc.RpcError) as err:
            list(call)
        assert err.value.code() == grpc.StatusCode.CANCELLED
    poll_until(lambda: all("cancel-me" in s.cases_cancelled for s in sites), 60,
               "every site to see the cancellation")
    poll_until(lambda: deployment.coordinator.servicer.cases_cancelled > coordinator_cancelled, 60,
               "the coordinator to record the cancellation")
    # Each site's worker falls idle: the running cell stopped (or, when the cancellation came
    # between two cells, the one that was ending answered) and the queued ones dropped.
    for name, site in deployment.sites.items():
        dispatcher = site.servicer.dispatcher
        poll_until(lambda: dispatcher.running() == 0 and dispatcher.waiting() == 0, 60,
                   f"site {name}'s worker to fall idle", every_s=0.25)
    events = {name: pool_events(site, "cancel-me-") for name, site in deployment.sites.items()}
    stopped = {name: e for name, e in events.items() if "cancelled" in {o for _, o in e}}
    # Which sites had a cell running at that moment depends on the machine's load; with
    # twelve cells of ~0.3 s or more each and a few ms between them, at least one had.
    assert stopped, f"no site stopped a running cell of the cancelled case: {events}"
    assert_serving(deployment.coordinator.address, case)
    for name, events in stopped.items():  # the case's queued cells there were never analysed
        assert [o for _, o in events].count("completed") < len(cells), (name, events)


def poll_until(condition, timeout_s: float, what: str, every_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(every_s)


def test_get_image_and_list_sites(deployment, case):
    with CoordinatorClient(deployment.coordinator.address) as client:
        sites = {s.site: s for s in client.sites()}
        assert set(sites) == {"alpha", "beta", "gamma"} and all(s.serving for s in sites.values())
        info = sites["beta"].info
        assert info.database_cells == 70 and "hnsw" in info.algorithm and info.workers == 1
        assert set(info.class_ports) == {"urgent", "routine", "teaching", "bulk"}
        assert info.class_dscp["urgent"] == 34
        assert info.vocabulary.name == "herlev" and info.vocabulary.bethesda["carcinoma_in_situ"] == "HSIL"
        assert list(info.vocabulary.labels) == list(BUILTIN["herlev"].labels)
        match = site_results(run_case(deployment.coordinator.address, case[:1]))["alpha"].cells[0].matches[0]
        reply = client.image("alpha", match.cell_id)
        assert reply.diagnosis == match.diagnosis
        full = Image.open(io.BytesIO(reply.image))
        thumb = Image.open(io.BytesIO(match.thumbnail))
        assert full.format == "PNG" and full.size[0] >= thumb.size[0]
        with pytest.raises(grpc.RpcError) as err:
            client.image("alpha", "no-such-cell")
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "no-such-cell" in err.value.details()


@pytest.mark.parametrize("which", ["coordinator", "site"])
def test_health_and_reflection(deployment, which):
    address = deployment.coordinator.address if which == "coordinator" else deployment.sites["alpha"].address
    service = "pathmaster.v1.Coordinator" if which == "coordinator" else "pathmaster.v1.Site"
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as err:
            health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                                            timeout=5)
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert {service, "grpc.health.v1.Health"} <= names


def test_urgent_cells_overtake_queued_bulk_cells(deployment, slow_case, case):
    """At a site, a waiting urgent cell is the next to start, ahead of queued bulk cells."""
    address = deployment.coordinator.address
    dispatcher = deployment.sites["alpha"].servicer.dispatcher
    finished = {}

    def submit(request_class, cells):  # images: the work queues at the site, as tested here
        events = run_case(address, cells, request_class, sites=["alpha"], deadline_s=120, ship="images")
        assert site_results(events)["alpha"].status_code == OK
        finished[request_class] = time.monotonic()

    bulk = threading.Thread(target=submit, args=("bulk", slow_case))
    bulk.start()
    try:
        poll_until(lambda: dispatcher.waiting() >= 4, 30, "the bulk cells to queue at the site")
        submit("urgent", case[:1])
    finally:
        bulk.join(120)
    assert finished["urgent"] < finished["bulk"]
