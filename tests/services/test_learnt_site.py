"""A site that compares a learnt embedding: features mode gives the same matches as images
(the coordinator fetches the site's network once, by hash, and sends embeddings), the
site's abnormality score comes back with each cell, and the network is served by hash."""

from __future__ import annotations

import hashlib
import shutil

import grpc
import pytest

from services.client import CoordinatorClient
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

learn = pytest.importorskip("pathmaster.learn")
pytest.importorskip("jax", reason="the trainer (extra [learn]) is not installed")

OK = 0


@pytest.fixture(scope="module")
def learnt_db(tmp_path_factory):
    """The services' 70-cell synthetic site, indexed again to compare fused vectors (a tiny
    training budget: these tests check the plumbing, not what the network learns)."""
    from pathmaster.site import build_search_index
    from pathmaster.sitedb import SiteDB
    from tests.services.conftest import SITE_CELLS, cached_synthetic_site

    path = shutil.copytree(cached_synthetic_site(SITE_CELLS, seed=1), tmp_path_factory.mktemp("learnt") / "site")
    mp = pytest.MonkeyPatch()
    train = learn.train_embedder
    mp.setattr(learn, "MIN_CELLS_TO_LEARN", 60)
    mp.setattr(learn, "train_embedder",
               lambda *a, **kw: train(*a, **{**kw, "seconds": 0.5, "max_epochs": 2, "min_epochs": 1}))
    try:
        with SiteDB(path) as db:
            build_search_index(db, features="lda", similarity_choice="fused", learn_seconds=2)
    finally:
        mp.undo()
    return path


@pytest.fixture(scope="module")
def learnt_deployment(ray_session, learnt_db, site_db, tmp_path_factory):
    from services.demo import LoopbackDeployment

    plain = shutil.copytree(site_db, tmp_path_factory.mktemp("plain") / "site")
    with LoopbackDeployment({"learnt": learnt_db, "plain": plain}, {"learnt": "flat", "plain": "flat"}) as running:
        yield running


def by_site(address, cells, ship):
    with CoordinatorClient(address) as client:
        events = list(client.submit(cells, "routine", deadline_s=120, ship=ship))
    return {e.site_result.site: e.site_result for e in events if e.HasField("site_result")}


def site_stub(deployment, name):
    return pb_grpc.SiteStub(grpc.insecure_channel(deployment.sites[name].address))


@pytest.mark.parametrize("with_parts", [True, False], ids=["image+background+mask", "image only"])
def test_features_give_the_same_matches_as_images_at_a_learnt_site(learnt_deployment, case_cells, with_parts):
    from tests.services.conftest import as_case

    cells = as_case(case_cells, with_parts)
    address = learnt_deployment.coordinator.address
    images, features = by_site(address, cells, "images"), by_site(address, cells, "features")
    for site in ("learnt", "plain"):
        a, b = images[site], features[site]
        assert a.status_code == b.status_code == OK
        assert (a.mode, b.mode) == ("images", "features")
        for ca, cb in zip(a.cells, b.cells, strict=True):
            assert [m.cell_id for m in ca.matches] == [m.cell_id for m in cb.matches]
            for ma, mb in zip(ca.matches, cb.matches):
                assert mb.distance == pytest.approx(ma.distance, rel=1e-5, abs=1e-5)
            assert ca.HasField("abnormal_score") and cb.HasField("abnormal_score")
            assert cb.abnormal_score == pytest.approx(ca.abnormal_score, abs=1e-6)
            assert ca.abnormal == cb.abnormal
        assert b.bytes_sent < 16 * 1024  # features and 64-float embeddings, not the pixels


def test_a_learnt_site_says_what_it_compares_and_serves_its_network_by_hash(learnt_deployment):
    stub = site_stub(learnt_deployment, "learnt")
    info = stub.Info(pb.SiteInfoRequest(), timeout=30)
    assert info.similarity == "fused" and "fused chosen" in info.similarity_note
    assert len(info.model_sha256) == 64 and 0.0 <= info.abnormal_threshold <= 1.0
    reply = stub.GetModel(pb.ModelRequest(sha256=info.model_sha256), timeout=30)
    assert hashlib.sha256(reply.npz).hexdigest() == info.model_sha256
    with pytest.raises(grpc.RpcError) as refused:
        stub.GetModel(pb.ModelRequest(sha256="0" * 64), timeout=30)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    plain = site_stub(learnt_deployment, "plain").Info(pb.SiteInfoRequest(), timeout=30)
    assert plain.similarity == "features" and plain.model_sha256 == ""


def test_a_learnt_site_refuses_features_without_its_embedding(learnt_deployment, case_cells):
    from services.client import analyse_locally
    from tests.services.conftest import as_case

    _, vectors, schema = analyse_locally(as_case(case_cells[:1]))
    request = pb.AnalyseRequest(case_id="no-embedding", request_class="routine", k=5, feature_schema=schema,
                                features=vectors)
    with pytest.raises(grpc.RpcError) as refused:
        site_stub(learnt_deployment, "learnt").Analyse(request, timeout=60)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
