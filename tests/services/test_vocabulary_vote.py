"""Sites with different vocabularies vote together through the coordinator, in Bethesda
terms. Stand-in sites (no Ray) answer with fixed matches, as real sites label them."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from pathmaster.vocabulary import BUILTIN
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.pb.pathmaster.v1 import pathmaster_pb2_grpc as pb_grpc

# What each site's 5 nearest matches are called, in its own words.
ANSWERS = {
    "herlev-site": ("herlev", ["carcinoma_in_situ", "severe_dysplasia", "mild_dysplasia",
                               "normal_columnar", "moderate_dysplasia"]),
    "tbs-site": ("bethesda", ["NILM", "NILM", "NILM", "HSIL", "HSIL"]),
}


class StandInSite(pb_grpc.SiteServicer):
    def __init__(self, name: str):
        self.name = name
        self.vocabulary = BUILTIN[ANSWERS[name][0]]

    def Info(self, request, context):
        return pb.SiteInfo(site=self.name)

    def Analyse(self, request, context):
        labels = ANSWERS[self.name][1]
        return pb.AnalyseReply(site=self.name, algorithm="stand-in", cells=[
            pb.CellResult(query_cell_id=c.cell_id, matches=[
                pb.Match(cell_id=f"{i}", diagnosis=x, bethesda=self.vocabulary.to_bethesda(x), distance=i)
                for i, x in enumerate(labels)])
            for c in request.cells])


@pytest.fixture
def coordinator():
    from services.config import CoordinatorConfig, SiteEndpoint
    from services.coordinator.server import CoordinatorServer

    servers, endpoints = [], []
    for name in ANSWERS:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_SiteServicer_to_server(StandInSite(name), server)
        endpoints.append(SiteEndpoint(name=name, address=f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"))
        server.start()
        servers.append(server)
    running = CoordinatorServer(CoordinatorConfig(sites=endpoints, analysis_workers=0)).start()  # stand-ins take images
    yield running
    running.stop(0)
    for server in servers:
        server.stop(0)


def test_herlev_and_bethesda_sites_vote_in_bethesda_terms(coordinator, case):
    with grpc.insecure_channel(coordinator.address) as channel:
        events = list(pb_grpc.CoordinatorStub(channel).SubmitCase(pb.CaseRequest(cells=case[:2]), timeout=30))
    summary = events[-1].summary
    assert summary.sites_ok == 2 and len(summary.votes) == 2
    for v in summary.votes:
        # By label the TBS site's NILM wins with 3 of 10 (Herlev splits its five over five
        # words); in Bethesda terms HSIL has 5 (Herlev's moderate, severe and CIS, and the
        # TBS site's two), NILM 4 (Herlev's columnar), LSIL 1. No ties: either site may
        # answer first.
        assert (v.diagnosis, v.votes, v.total) == ("NILM", 3, 10)
        assert (v.bethesda, v.bethesda_votes, v.bethesda_total) == ("HSIL", 5, 10)
    # The case has one reading, its conclusion: no majority of every match beside it.
    assert "bethesda" not in pb.CaseSummary.DESCRIPTOR.fields_by_name
    # The case as a cytologist reports it: each cell has 6 of its 10 matches abnormal (Herlev's
    # 4, the TBS site's 2), so each supports HSIL, the median severity of those 6. The Herlev
    # site reads the cell abnormal on its own (4/5), the TBS site NILM (2/5).
    conclusion = summary.conclusion
    assert (conclusion.outcome, conclusion.bethesda, conclusion.cells_with, conclusion.cells_total) == \
        ("abnormal", "HSIL", 2, 2)
    assert [r.code for r in conclusion.why] == ["most_significant_abnormality", "decision_support_not_a_specimen"]
    for cell in conclusion.cells:
        assert (cell.bethesda, cell.support, cell.total, cell.abnormal, cell.abnormal_term) == ("HSIL", 5, 10, True, "HSIL")
        assert [(t.bethesda, t.count) for t in cell.spread] == [("HSIL", 5), ("LSIL", 1), ("NILM", 4)]
        assert cell.abnormal_score == pytest.approx(0.6)
        assert (list(cell.abnormal_sites), list(cell.nilm_sites)) == (["herlev-site"], ["tbs-site"])
    assert {c.query_cell_id for c in conclusion.cells} == {v.query_cell_id for v in summary.votes}
