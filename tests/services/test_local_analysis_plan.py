"""A case analysed by the client: which sites get the cells' patches, and which their images."""

from __future__ import annotations

from services.client import images_without_network_why, local_analysis_plan
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.reasons import as_json


def status(site, similarity="features", score="neighbours", model=""):
    return pb.SiteStatus(site=site, info=pb.SiteInfo(similarity=similarity, abnormal_score=score,
                                                     model_sha256=model))


def test_a_site_whose_network_the_coordinator_cannot_give_gets_the_images():
    statuses = [status("given", "fused", "ensemble", "a" * 64), status("withheld", "fused", "ensemble"),
                status("scored", "features", "network"), status("plain"), status("plain-ensemble", score="ensemble")]
    patches, images = local_analysis_plan(statuses)
    assert patches == ["given"] and images == ["scored", "withheld"]
    assert local_analysis_plan(statuses, ["given", "plain"]) == (["given"], [])
    [reason] = as_json([images_without_network_why(images)])
    assert reason["code"] == "images_without_network" and reason["params"]["sites"] == "scored, withheld"
