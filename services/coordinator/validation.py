"""Checking a submitted case before any site sees it.

A case that would fail at every site is refused once, at the coordinator, with a status a
client can act on: INVALID_ARGUMENT for an unknown class or a cell that does not decode
(naming the cell and the part: image, background or mask), RESOURCE_EXHAUSTED with the
limit for too many cells or bytes.
"""

from __future__ import annotations

import grpc

from pathmaster.records import InvalidInput
from qos.classes import ClassTable, RequestClass, UnknownClass
from services.config import MAX_K
from services.coordinator.bounds import check_bounds
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb
from services.site.cells import decode_cell

DEFAULT_CLASS = "routine"


class CaseRejected(Exception):
    """A case refused before fan-out: `code` is the gRPC status, `message` says why."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def cell_name(cell: pb.CellImage, index: int) -> str:
    """How errors name a cell: its id, or its position when it has none."""
    return repr(cell.cell_id) if cell.cell_id else f"#{index + 1}"


def check_case(request: pb.CaseRequest, classes: ClassTable, max_cells: int,
               max_case_bytes: int) -> RequestClass:
    """Validate `request`; return its request class (empty means "routine").

    Raises CaseRejected with INVALID_ARGUMENT or RESOURCE_EXHAUSTED. Decodes every image,
    background and mask, so a corrupt one is reported here, naming its cell.
    """
    check_bounds(request, CaseRejected)  # ids and names first: messages below echo them
    try:
        rclass = classes[request.request_class or DEFAULT_CLASS]
    except UnknownClass as exc:
        raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
    if not request.cells:
        raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT, "the case has no cells")
    if len(request.cells) > max_cells:
        raise CaseRejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the case has {len(request.cells)} cells; the limit is {max_cells} "
                           "cells per case (split it into several cases)")
    size = request.ByteSize()
    if size > max_case_bytes:
        raise CaseRejected(grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the case is {size} bytes; the limit is {max_case_bytes} bytes "
                           f"({max_case_bytes / 2**20:.1f} MiB) per case")
    if not 0 <= request.k <= MAX_K:
        raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT, f"k must be 0-{MAX_K}, got {request.k}")
    if request.deadline_s < 0:
        raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                           f"deadline_s must be positive (or 0 for the default), got {request.deadline_s}")
    seen: set[str] = set()
    for i, cell in enumerate(request.cells):
        name = cell_name(cell, i)
        if not cell.cell_id:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT, f"cell {name} has no cell_id")
        if cell.cell_id in seen:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                               f"cell id {name} appears twice; give each cell its own id")
        seen.add(cell.cell_id)
        try:
            decode_cell(cell.cell_id, cell.image, cell.background, cell.mask)
        except InvalidInput as exc:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
    return rclass
