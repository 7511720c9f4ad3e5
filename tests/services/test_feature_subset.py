"""Features mode sends each site only the values it compares: a site whose
distance reads a selection of the features (forward selection, at most
defaults.MAX_SELECTED_FEATURES) advertises it in its Info, the coordinator sends it those
values alone, and the matches are those of image mode and of the full vector."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import pytest

from pathmaster import defaults
from services.client import CoordinatorClient, analyse_locally
from services.coordinator.fanout import features_request
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc
from services.reasons import codes

OK = 0


@pytest.fixture(scope="module")
def selecting(deployment, site_db, tmp_path_factory):
    """Three sites that compare differently: alpha and beta by their own forward selections
    (from different databases), gamma by every feature (the default projection here), and a
    coordinator (with its analyser: features mode) over the three.

    gamma is the session deployment's own (flat, over a copy of the same database, no
    selection advertised), so only alpha and beta are started here; the tests only read
    from it. `sites` and `coordinator` as in a LoopbackDeployment."""
    from types import SimpleNamespace

    from services.coordinator.analysis import ANALYSIS_READY_S
    from pathmaster.site.index import build_search_index
    from pathmaster.site.database import SiteDB
    from services.config import CoordinatorConfig, SiteConfig, SiteEndpoint
    from services.coordinator.server import CoordinatorServer
    from services.site.server import SiteServer
    from tests.services.conftest import SITE_CELLS, cached_synthetic_site

    root = tmp_path_factory.mktemp("selecting")
    other = cached_synthetic_site(SITE_CELLS, seed=7)  # built once per machine, copied below
    dbs = {"alpha": Path(shutil.copytree(site_db, root / "alpha")),
           "beta": Path(shutil.copytree(other, root / "beta"))}
    sites, coordinator = {}, None
    try:
        for name, db in dbs.items():
            with SiteDB(db) as index:
                build_search_index(index, features="forward")
            sites[name] = SiteServer(SiteConfig(name=name, db=db, algorithm="flat", workers=1,
                                                worker_cpus=0.25)).start()
        sites["gamma"] = deployment.sites["gamma"]
        coordinator = CoordinatorServer(CoordinatorConfig(
            sites=[SiteEndpoint(name=name, address=site.address) for name, site in sites.items()],
            listen="127.0.0.1:0", analysis_workers=1)).start()
        assert coordinator.wait_analysers(ANALYSIS_READY_S), "the coordinator's analyser did not start"
        yield SimpleNamespace(sites=sites, coordinator=coordinator)
    finally:
        if coordinator is not None:
            coordinator.stop(0.5)
        for name in dbs:
            if name in sites:
                sites[name].stop(0.5)


def run(address, cells, **kwargs):
    with CoordinatorClient(address) as client:
        return list(client.submit(cells, "routine", deadline_s=120, **kwargs))


def by_site(events):
    return {e.site_result.site: e.site_result for e in events if e.HasField("site_result")}


def site_info(deployment, site) -> pb.SiteInfo:
    with grpc.insecure_channel(deployment.sites[site].address) as channel:
        return pb_grpc.SiteStub(channel).Info(pb.SiteInfoRequest(), timeout=30)


def same_matches(a: pb.CellResult, b: pb.CellResult) -> None:
    assert a.query_cell_id == b.query_cell_id
    assert [m.cell_id for m in a.matches] == [m.cell_id for m in b.matches]
    assert len(a.matches) == defaults.K
    for ma, mb in zip(a.matches, b.matches):
        assert mb.distance == pytest.approx(ma.distance, rel=1e-6)


def test_sites_advertise_the_columns_they_compare(selecting):
    from pathmaster.features import feature_names

    names = feature_names()
    alpha, beta, gamma = (site_info(selecting, s) for s in ("alpha", "beta", "gamma"))
    for info in (alpha, beta):
        columns = list(info.feature_columns)
        assert 0 < len(columns) <= defaults.MAX_SELECTED_FEATURES
        assert columns == sorted(set(columns))
        assert list(info.feature_column_names) == [names[c] for c in columns]
        assert "forward" in info.algorithm
    assert list(alpha.feature_columns) != list(beta.feature_columns)  # sites differ in their selection
    assert not gamma.feature_columns and not gamma.feature_column_names  # it reads every feature


def test_sites_name_the_representation_they_fitted_and_its_cells(selecting):
    alpha, beta, gamma = (site_info(selecting, s) for s in ("alpha", "beta", "gamma"))
    for info in (alpha, beta, gamma):
        assert len(info.representation) == 16 and int(info.representation, 16) >= 0
        assert info.representation_cells == info.database_cells   # fitted to every cell it holds
    assert len({alpha.representation, beta.representation, gamma.representation}) == 3


@pytest.mark.parametrize("with_parts", [True, False], ids=["image+background+mask", "image only"])
def test_each_site_gets_only_its_values_and_finds_what_images_and_full_vectors_find(selecting, case_cells, with_parts):
    from tests.services.conftest import as_case

    cells = as_case(case_cells, with_parts)
    address = selecting.coordinator.address
    images = by_site(run(address, cells, ship="images"))
    features = by_site(run(address, cells, ship="features"))
    _, vectors, schema = analyse_locally(cells)
    assert set(images) == set(features) == {"alpha", "beta", "gamma"}
    for site in images:
        a, b = images[site], features[site]
        assert a.status_code == b.status_code == OK, (a.status_message, b.status_message)
        assert a.mode == "images" and b.mode == "features"
        # The full vector straight to the site: the matches of a subset are the same.
        with grpc.insecure_channel(selecting.sites[site].address) as channel:
            full = pb_grpc.SiteStub(channel).Analyse(pb.AnalyseRequest(
                case_id=f"full-{site}-{with_parts}", request_class="routine", feature_schema=schema, features=vectors), timeout=60)
        for ca, cb, cf in zip(a.cells, b.cells, full.cells, strict=True):
            same_matches(ca, cb)
            same_matches(cf, cb)
            assert (ca.mask_estimated, ca.background_estimated) == (cb.mask_estimated, cb.background_estimated)
    columns = {s: tuple(site_info(selecting, s).feature_columns) for s in images}
    for site in ("alpha", "beta"):
        # Exactly the request with the site's columns: 6 cells' values and pixel hashes (32
        # bytes a cell, for the same-cell flag) within two segments of one round trip.
        expected = features_request("", "routine", defaults.K, schema, vectors, columns[site])
        assert features[site].bytes_sent <= expected.ByteSize() + 64  # + the case id
        assert features[site].bytes_sent * 3 < features["gamma"].bytes_sent
        assert features[site].bytes_sent < 2 * 1448
    assert features["gamma"].bytes_sent > 6 * 8 * 130  # no selection advertised: the full vectors


def test_features_from_the_desktop_client_reach_each_site_as_its_subset(selecting, case_cells):
    from tests.services.conftest import as_case

    cells = as_case(case_cells)
    ids, vectors, schema = analyse_locally(cells)
    local = by_site(run(selecting.coordinator.address, ids, features=vectors, feature_schema=schema))
    images = by_site(run(selecting.coordinator.address, cells, ship="images"))
    for site in ("alpha", "beta", "gamma"):
        assert local[site].status_code == OK and local[site].mode == "features"
        for ca, cb in zip(images[site].cells, local[site].cells, strict=True):
            same_matches(ca, cb)
    assert local["alpha"].bytes_sent * 3 < local["gamma"].bytes_sent


def test_a_site_refuses_a_subset_that_is_not_its_selection(selecting, case_cells):
    from tests.services.conftest import as_case

    _, vectors, schema = analyse_locally(as_case(case_cells[:2]))
    alpha = list(site_info(selecting, "alpha").feature_columns)
    beta = list(site_info(selecting, "beta").feature_columns)
    with grpc.insecure_channel(selecting.sites["alpha"].address) as channel:
        stub = pb_grpc.SiteStub(channel)

        def ask(request):
            with pytest.raises(grpc.RpcError) as refused:
                stub.Analyse(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            return refused.value.details()

        # another site's selection
        message = ask(features_request("x", "routine", 5, schema, vectors, beta))
        assert f"compares {len(alpha)} feature columns {alpha}" in message and "full vector" in message
        # its own columns named, but the values of another count
        wrong = features_request("y", "routine", 5, schema, vectors, alpha)
        del wrong.features[1].values[-1]
        message = ask(wrong)
        assert f"has {len(alpha) - 1} feature values" in message and f"names {len(alpha)} columns" in message
    # a subset to a site that compares every feature
    with grpc.insecure_channel(selecting.sites["gamma"].address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.SiteStub(channel).Analyse(features_request("z", "routine", 5, schema, vectors, alpha), timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "compares every feature" in refused.value.details()


def stale_columns(deployment, site: str, columns: tuple[int, ...]):
    """The coordinator's idea of `site`'s columns made stale, as if the site had been re-indexed
    (another forward selection) since the coordinator read its Info; restored after."""
    import contextlib

    @contextlib.contextmanager
    def stale():
        coordinator = deployment.coordinator.servicer
        saved = dict(coordinator.site_columns)
        try:
            coordinator.site_columns[site] = columns
            yield coordinator
        finally:
            coordinator.site_columns.clear()
            coordinator.site_columns.update(saved)

    return stale()


@pytest.mark.parametrize("sent_as", ["images", "features only"])
def test_a_site_that_changed_its_selection_is_asked_again_and_gets_its_columns(selecting, case_cells, sent_as):
    """The coordinator's idea of a site's columns is stale: the site refuses the subset, the
    coordinator asks its Info again and sends the features once more, with the columns the site
    now compares; the case does not fail and does not fall back to the images, also when it
    came as features only (from the desktop client: no images to fall back to)."""
    from tests.services.conftest import as_case

    cells = as_case(case_cells[:2])
    if sent_as == "images":
        kwargs = {"ship": "features"}
    else:
        cells, vectors, schema = analyse_locally(cells)
        kwargs = {"features": vectors, "feature_schema": schema}
    alpha = tuple(site_info(selecting, "alpha").feature_columns)
    with stale_columns(selecting, "alpha", tuple(site_info(selecting, "beta").feature_columns)) as coordinator:
        results = by_site(run(selecting.coordinator.address, cells, **kwargs))
        assert coordinator.site_columns["alpha"] == alpha  # taken in from the Info asked again
    assert results["alpha"].status_code == OK, results["alpha"].status_message
    assert results["alpha"].mode == "features"
    again = next(w for w in results["alpha"].why if w.code == "features_sent_again")
    assert again.params["refusal"].startswith("INVALID_ARGUMENT:")
    assert again.params["compares"].startswith(f"{len(alpha)} feature columns {list(alpha)}")
    assert "images_after_features_failed" not in codes(results["alpha"].why)
    assert results["beta"].mode == "features" and results["beta"].status_code == OK


def test_a_site_refused_again_after_its_info_gets_the_images(selecting, case_cells, monkeypatch):
    """The features retry is once: a site that refuses the corrected request too (here its Info
    says columns it then refuses) gets the images, and the decisions say both."""
    from tests.services.conftest import as_case

    coordinator = selecting.coordinator.servicer
    learn = coordinator.directory.learn
    beta = tuple(site_info(selecting, "beta").feature_columns)

    def learn_wrong(site, info):  # the Info taken in, but alpha's columns as stale as before
        learn(site, info)
        if site == "alpha":
            coordinator.site_columns["alpha"] = beta

    monkeypatch.setattr(coordinator.directory, "learn", learn_wrong)
    with stale_columns(selecting, "alpha", beta):
        results = by_site(run(selecting.coordinator.address, as_case(case_cells[:2]), ship="features"))
    assert results["alpha"].status_code == OK and results["alpha"].mode == "images"
    why = {w.code: w for w in results["alpha"].why}
    assert "features_sent_again" in why
    assert why["images_after_features_failed"].params["error"].startswith("INVALID_ARGUMENT:")
