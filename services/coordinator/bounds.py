"""Bounds on every value a client chooses in a case, checked before anything else reads it.

Ids and names are checked with ``pathmaster.ids.check_id`` (length and characters, limits
in ``pathmaster.defaults``), so that nothing a client sends is stored in the case log, kept
in memory, logged or echoed in an error beyond those bounds; a refused value is shown
only by a short prefix. The case's own deadline must be finite and at most
``MAX_CASE_DEADLINE_S``. Counts and sizes of cells are checked by validation.py.
"""

from __future__ import annotations

import math

import grpc

from pathmaster.ids import check_id
from pathmaster.records import InvalidInput
from qos.policy import MAX_CASE_DEADLINE_S
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb

MAX_CASE_SITES = 256            # site names one case may list


def check_bounds(request: pb.CaseRequest, rejected) -> None:
    """Raise ``rejected(grpc.StatusCode.INVALID_ARGUMENT, message)`` for the first value
    of `request` out of bounds; the message says the limit. Empty optional values pass."""
    try:
        if request.case_id:
            check_id(request.case_id, "case id")
        if request.request_class:
            check_id(request.request_class, "name", "request class")
        if len(request.sites) > MAX_CASE_SITES:
            raise InvalidInput(f"the case names {len(request.sites)} sites; at most {MAX_CASE_SITES}")
        for site in request.sites:
            check_id(site, "name", "site name")
        for cell in request.cells:
            if cell.cell_id:
                check_id(cell.cell_id, "cell id")
        if not math.isfinite(request.deadline_s) or request.deadline_s > MAX_CASE_DEADLINE_S:
            raise InvalidInput(f"deadline_s must be at most {MAX_CASE_DEADLINE_S:g} s, got {request.deadline_s:g}")
    except InvalidInput as exc:
        raise rejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
