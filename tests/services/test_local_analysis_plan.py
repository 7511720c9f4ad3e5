"""A case analysed by the client: which sites get the cells' eye vectors, and which their images."""

from __future__ import annotations

import json

from pathmaster.eye._vectors import eye_id
from pathmaster.eye import open_eye
from services.client import images_without_network_why, local_analysis_plan
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.reasons import as_json


def status(site, similarity="features", score="neighbours", eye=None):
    described = "" if eye is None else json.dumps(eye)
    return pb.SiteStatus(site=site, info=pb.SiteInfo(similarity=similarity, abnormal_score=score,
                                                     model_sha256="" if eye is None else eye_id(eye), eye=described))


def test_sites_whose_eye_the_client_opens_get_its_vectors_and_the_others_the_images():
    eye = open_eye().describe()
    other = dict(eye, sha256="f" * 64)  # another install's weights under the same name
    statuses = [status("given", "fused", "ensemble", eye), status("withheld", "fused", "ensemble"),
                status("scored", "features", "network"), status("plain"), status("plain-ensemble", score="ensemble"),
                status("also", "embedding", "mean", eye), status("another", "fused", "mean", other)]
    eyed, images, (identity, description) = local_analysis_plan(statuses)
    assert eyed == ["also", "given"] and images == ["another", "scored", "withheld"]
    assert identity == eye_id(eye) and json.loads(description) == eye
    assert local_analysis_plan(statuses, ["given", "plain"])[:2] == (["given"], [])
    assert local_analysis_plan([status("plain")]) == ([], [], ("", ""))
    [reason] = as_json([images_without_network_why(images)])
    assert reason["code"] == "images_without_network" and reason["params"]["sites"] == "another, scored, withheld"
