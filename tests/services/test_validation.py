"""Case validation at the coordinator, without any site."""

from __future__ import annotations

import grpc
import pytest

from qos.classes import DEFAULT_CLASSES
from services.coordinator.validation import CaseRejected, check_case_request
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

LIMITS = dict(classes=DEFAULT_CLASSES, max_cells=8, max_case_bytes=16 * 2**20)


def rejected(request) -> CaseRejected:
    with pytest.raises(CaseRejected) as err:
        check_case_request(request, **LIMITS)
    return err.value


def test_a_good_case_gets_its_class(case):
    assert check_case_request(pb.CaseRequest(request_class="urgent", cells=case), **LIMITS).dscp == 34
    assert check_case_request(pb.CaseRequest(cells=case), **LIMITS).name == "routine"  # the default


@pytest.mark.parametrize("change, code, words", [
    (dict(request_class="Urgent"), "INVALID_ARGUMENT", ["'Urgent'", "urgent, routine, teaching, bulk"]),
    (dict(k=101), "INVALID_ARGUMENT", ["k must be 0-100"]),
    (dict(deadline_s=-1), "INVALID_ARGUMENT", ["deadline_s"]),
])
def test_bad_fields(case, change, code, words):
    err = rejected(pb.CaseRequest(cells=case, **change))
    assert err.code == getattr(grpc.StatusCode, code) and all(w in err.message for w in words)


def test_cells_problems_name_the_cell(case):
    assert "no cells" in rejected(pb.CaseRequest()).message
    twice = rejected(pb.CaseRequest(cells=[case[0], case[0]]))
    assert twice.code == grpc.StatusCode.INVALID_ARGUMENT and case[0].cell_id in twice.message
    nameless = rejected(pb.CaseRequest(cells=[pb.CellImage(image=case[0].image)]))
    assert "#1" in nameless.message and "cell_id" in nameless.message
    empty = rejected(pb.CaseRequest(cells=[pb.CellImage(cell_id="e.png")]))
    assert "'e.png'" in empty.message and "no image" in empty.message
    wrong_bg = pb.CellImage(cell_id="b.png", image=case[0].image, background=case[1].image)
    assert "'b.png'" in rejected(pb.CaseRequest(cells=[wrong_bg])).message  # sizes differ
    too_many = rejected(pb.CaseRequest(cells=[pb.CellImage(cell_id=str(i), image=case[0].image) for i in range(9)]))
    assert too_many.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "limit is 8" in too_many.message


def test_features_with_a_patch_of_the_wrong_size_are_refused_naming_the_cell():
    from pathmaster.analysis.cell import PATCH_PX
    from pathmaster.features import feature_names

    values = [0.0] * len(feature_names())

    def case(patch: bytes) -> pb.CaseRequest:
        return pb.CaseRequest(cells=[pb.CellImage(cell_id="p.png")], feature_schema="s",
                              features=[pb.CellFeatures(cell_id="p.png", values=values, patch=patch)])

    assert check_case_request(case(bytes(PATCH_PX * PATCH_PX * 3)), **LIMITS, feature_schema="s").name == "routine"
    assert check_case_request(case(b""), **LIMITS, feature_schema="s").name == "routine"  # no patch: features alone
    with pytest.raises(CaseRejected) as err:
        check_case_request(case(bytes(100)), **LIMITS, feature_schema="s")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "'p.png'" in err.value.message
