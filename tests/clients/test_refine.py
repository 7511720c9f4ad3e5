"""Refining a case by concept, answered by the real sites (Ray workers, gRPC) of the
package's deployment: the coordinator passes the weights to every site in either mode, each
site re-ranks its nearest cells by its measure with the concepts weighed, and a concept
it does not know is refused by name."""

from __future__ import annotations

import grpc
import pytest

from services.client import CoordinatorClient
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

ONLY_NUCLEUS = {"chromatin": 0.0, "nucleus_shape": 0.0, "cytoplasm": 0.0, "nc_ratio": 0.0, "nucleus_size": 4.0}


def site_distances(events) -> dict[tuple[str, str], list[float]]:
    return {(e.site_result.site, c.query_cell_id): [m.distance for m in c.matches]
            for e in events if e.WhichOneof("event") == "site_result" for c in e.site_result.cells}


@pytest.mark.parametrize("ship", ["features", "images"])
def test_sites_rerank_by_concept(stack, case_dir, ship):
    cells = [pb.CellImage(cell_id=f"cell{n}", image=(case_dir / f"cell{n}.png").read_bytes(),
                          background=(case_dir / f"cell{n}-background.png").read_bytes(),
                          mask=(case_dir / f"cell{n}-mask.png").read_bytes()) for n in (1, 2)]
    with CoordinatorClient(stack.coordinator.address) as client:
        plain = list(client.submit(cells, "routine", ship=ship))
        refined = list(client.submit(cells, "routine", ship=ship, concept_weights=ONLY_NUCLEUS))
    assert all(e.site_result.status_code == 0 for e in refined if e.WhichOneof("event") == "site_result")
    before, after = site_distances(plain), site_distances(refined)
    assert before.keys() == after.keys() and len(after) == 2 * len(stack.sites)
    for distances in after.values():
        assert len(distances) == 5 and distances == sorted(distances)
    assert after != before  # the refined measure is another measure


def test_a_concept_the_sites_do_not_know_is_refused_by_name(stack, case_dir):
    cells = [pb.CellImage(cell_id="cell4", image=(case_dir / "cell4.png").read_bytes())]
    with CoordinatorClient(stack.coordinator.address) as client:
        events = list(client.submit(cells, "routine", ship="images", concept_weights={"eyes": 2.0}))
    results = [e.site_result for e in events if e.WhichOneof("event") == "site_result"]
    assert results and all(r.status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0] for r in results)
    assert all("eyes" in r.status_message for r in results)
