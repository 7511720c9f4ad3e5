"""Extract once, ship features: the same matches as images, a fraction of the bytes, and
images whenever features cannot be used (another schema, a failure on features)."""

from __future__ import annotations

import grpc
import pytest

from services.client import CoordinatorClient, analyse_locally
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from services.reasons import codes

OK = 0


def run(address, cells, **kwargs):
    with CoordinatorClient(address) as client:
        return list(client.submit(cells, "routine", deadline_s=120, **kwargs))


def by_site(events):
    return {e.site_result.site: e.site_result for e in events if e.HasField("site_result")}


@pytest.mark.parametrize("with_parts", [True, False], ids=["image+background+mask", "image only"])
def test_features_give_the_same_matches_as_images(deployment, case_cells, with_parts):
    from tests.services.conftest import as_case

    cells = as_case(case_cells, with_parts)
    address = deployment.coordinator.address
    images = by_site(run(address, cells, ship="images"))
    features = by_site(run(address, cells, ship="features"))
    assert set(images) == set(features) == {"alpha", "beta", "gamma"}
    for site in images:
        a, b = images[site], features[site]
        assert a.status_code == b.status_code == OK
        assert a.mode == "images" and b.mode == "features"
        for ca, cb in zip(a.cells, b.cells, strict=True):
            assert ca.query_cell_id == cb.query_cell_id
            assert (ca.mask_estimated, ca.background_estimated) == (cb.mask_estimated, cb.background_estimated)
            assert [m.cell_id for m in ca.matches] == [m.cell_id for m in cb.matches]
            for ma, mb in zip(ca.matches, cb.matches):
                assert mb.distance == pytest.approx(ma.distance, rel=1e-6)
        # Each site was sent kilobytes instead of the images.
        assert b.bytes_sent * 10 < a.bytes_sent


def test_a_site_of_another_schema_gets_images_and_a_site_failing_on_features_falls_back(deployment, case_cells):
    from tests.services.conftest import as_case

    coordinator = deployment.coordinator.servicer
    cells = as_case(case_cells[:2])
    saved = dict(coordinator.site_schemas)
    try:
        # beta now says it was indexed with other features: it must get the images.
        coordinator.site_schemas["beta"] = "fs1-0000000000000000"
        events = run(deployment.coordinator.address, cells)
        plan = next(e.plan for e in events if e.HasField("plan"))
        modes = {s.site: s.mode for s in plan.sites}
        assert modes == {"alpha": "features", "beta": "images", "gamma": "features"}
        assert codes(next(s for s in plan.sites if s.site == "beta").why)[0] == "images_other_schema"
        # gamma claims our schema but its index has another: it refuses the features, and
        # the coordinator sends it the images instead, saying so.
        deployment.sites["gamma"].servicer.info["feature_schema"] = "fs1-1111111111111111"
        results = by_site(run(deployment.coordinator.address, cells))
        assert results["gamma"].status_code == OK and results["gamma"].mode == "images"
        assert "images_after_features_failed" in codes(results["gamma"].why)
        assert results["alpha"].mode == "features"
    finally:
        coordinator.site_schemas.clear()
        coordinator.site_schemas.update(saved)
        deployment.sites["gamma"].servicer.info["feature_schema"] = coordinator.site_schemas["gamma"]


def test_a_site_refuses_features_of_another_schema_and_mixed_requests(deployment, case_cells):
    from tests.services.conftest import as_case

    site = deployment.sites["alpha"]
    cells = as_case(case_cells[:1])
    _, vectors, schema = analyse_locally(cells)
    with grpc.insecure_channel(site.address) as channel:
        stub = pb_grpc.SiteStub(channel)
        with pytest.raises(grpc.RpcError) as other:
            stub.Analyse(pb.AnalyseRequest(case_id="x", request_class="routine", feature_schema="fs1-nope",
                                           features=vectors), timeout=30)
        assert other.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "send the images" in other.value.details()
        with pytest.raises(grpc.RpcError) as both:
            stub.Analyse(pb.AnalyseRequest(case_id="x", request_class="routine", feature_schema=schema,
                                           features=vectors, cells=cells), timeout=30)
        assert both.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        reply = stub.Analyse(pb.AnalyseRequest(case_id="x", request_class="routine", feature_schema=schema,
                                               features=vectors), timeout=30)
        assert len(reply.cells[0].matches) == 5 and reply.load.workers >= 1
        assert reply.load.seconds_per_cell["features"] > 0
        assert 0 <= reply.timing.queue_s <= reply.timing.site_wall_s  # the wait is a part of the site's time


@pytest.mark.parametrize("deadline", [float("nan"), float("inf"), -1.0])
def test_a_deadline_that_is_not_a_positive_number_is_refused(deployment, case_cells, deadline):
    from tests.services.conftest import as_case

    request = pb.CaseRequest(request_class="routine", cells=as_case(case_cells[:1]), deadline_s=deadline)
    with grpc.insecure_channel(deployment.coordinator.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            list(pb_grpc.CoordinatorStub(channel).SubmitCase(request, timeout=30))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "deadline" in refused.value.details()


def test_features_of_another_schema_from_a_client_are_refused_with_what_to_do(deployment, case_cells):
    from tests.services.conftest import as_case

    ids, vectors, _ = analyse_locally(as_case(case_cells[:1]))
    with CoordinatorClient(deployment.coordinator.address) as client:
        with pytest.raises(grpc.RpcError) as refused:
            list(client.submit(ids, "routine", features=vectors, feature_schema="fs1-old"))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "send the images" in refused.value.details()


def test_a_features_request_is_searched_in_the_site_server_with_the_workers_matches(deployment, case_cells):
    """SiteConfig.search_in_server (off by default): the site searches vectors itself, in
    the handler's thread, and finds what its workers find."""
    from services.site.worker import SiteWorker
    from tests.services.conftest import as_case

    site = deployment.sites["alpha"]
    servicer = site.servicer
    assert servicer.local is None  # the default: searched on the site's Ray workers
    servicer.local = SiteWorker(site.config.db, budget=None)  # as search_in_server = true makes it
    _, vectors, schema = analyse_locally(as_case(case_cells[:2]))
    submitted = []
    submit = servicer.dispatcher.submit

    def recording(priority, work, **kwargs):
        submitted.append(work.method)
        return submit(priority, work, **kwargs)

    servicer.dispatcher.submit = recording
    try:
        with grpc.insecure_channel(deployment.sites["alpha"].address) as channel:
            stub = pb_grpc.SiteStub(channel)

            def ask(case_id):
                return stub.Analyse(pb.AnalyseRequest(case_id=case_id, request_class="routine", feature_schema=schema,
                                                      features=vectors), timeout=60)

            here = ask("searched-here")
            assert submitted == []  # no worker was given the search
            servicer.local = None
            on_worker = ask("searched-on-a-worker")
            assert submitted == ["search_many"]
    finally:
        servicer.local = None
        servicer.dispatcher.submit = submit
    assert [[m.cell_id for m in c.matches] for c in here.cells] == \
        [[m.cell_id for m in c.matches] for c in on_worker.cells]
    assert all(len(c.matches) == 5 for c in here.cells)
    assert 0 < here.timing.service_s <= here.timing.site_wall_s
