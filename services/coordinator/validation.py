"""Checking a submitted case before any site sees it.

A case that would fail at every site is refused once, at the coordinator, with a status a
client can act on: INVALID_ARGUMENT for an unknown class or a cell whose parts do not check
(naming the cell and the part: image, background or mask), RESOURCE_EXHAUSTED with the
limit for too many cells or bytes.
"""

from __future__ import annotations

import math

import grpc
import numpy as np

from pathmaster.records import InvalidInput
from qos.classes import ClassTable, RequestClass, UnknownClass
from services.cells import probe_cell
from services.shared import DEFAULT_CLASS, MAX_K
from services.coordinator.bounds import check_bounds
from services.pb.pathmaster.v1 import pathmaster_pb2 as pb


class CaseRejected(Exception):
    """A case refused before fan-out: `code` is the gRPC status, `message` says why."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def cell_name(cell: pb.CellImage, index: int) -> str:
    """How errors name a cell: its id, or its position when it has none."""
    return repr(cell.cell_id) if cell.cell_id else f"#{index + 1}"


SHIP_MODES = ("", "auto", "features", "images")


def check_case_request(request: pb.CaseRequest, classes: ClassTable, max_cells: int,
                       max_case_bytes: int, feature_schema: str = "") -> RequestClass:
    """Validate `request`; return its request class (empty means "routine").

    Raises CaseRejected with INVALID_ARGUMENT, FAILED_PRECONDITION or RESOURCE_EXHAUSTED.
    Checks every cell's parts from their headers and decodes only its mask
    (services/cells.py `probe_cell`), so a part that is not an image, too large, cut
    short or of the wrong size is reported here, naming its cell; damage inside compressed
    pixels is reported by the sites, per cell. A case sent as features (`request.features`)
    must be in `feature_schema`, the coordinator's own, with one finite vector per cell id.
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
    if not (math.isfinite(request.deadline_s) and request.deadline_s >= 0):
        raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                           f"deadline_s must be positive seconds (or 0 for the default), got {request.deadline_s}")
    if request.ship not in SHIP_MODES:
        raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                           f"ship must be auto, features or images, got {request.ship!r}")
    if request.features:
        check_features(request, feature_schema)
    seen: set[str] = set()
    for i, cell in enumerate(request.cells):
        name = cell_name(cell, i)
        if not cell.cell_id:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT, f"cell {name} has no cell_id")
        if cell.cell_id in seen:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                               f"cell id {name} appears twice; give each cell its own id")
        seen.add(cell.cell_id)
        if request.features:
            continue  # the client analysed its cells; only their ids travel
        try:
            probe_cell(cell.cell_id, cell.image, cell.background, cell.mask)
        except InvalidInput as exc:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from None
    return rclass


# The most values a cell's eye vector may carry (a site checks its eye's exact width).
MAX_EYE_VALUES = 4096


def _eye_vector_ok(data: bytes) -> bool:
    """Whether `data` (CellFeatures.embedding) is an eye vector a site could read, or none."""
    from pathmaster.eye._vectors import unpack_eye_vector

    if len(data) > 2 * MAX_EYE_VALUES or len(data) % 2:
        return False
    return bool(np.isfinite(unpack_eye_vector(data)).all())


def check_features(request: pb.CaseRequest, feature_schema: str) -> None:
    """A case the client analysed itself: same schema as ours, a finite vector per cell."""
    if not feature_schema:
        raise CaseRejected(grpc.StatusCode.FAILED_PRECONDITION,
                           "this coordinator is not analysing cells yet: send the images")
    if request.feature_schema != feature_schema:
        raise CaseRejected(grpc.StatusCode.FAILED_PRECONDITION,
                           f"features of schema {request.feature_schema or 'unnamed'} cannot be compared "
                           f"here (the coordinator's schema is {feature_schema}): send the images")
    ids = [c.cell_id for c in request.cells]
    if sorted(ids) != sorted(f.cell_id for f in request.features):
        raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT, "give exactly one feature vector per cell id")
    from pathmaster.features import feature_names

    from pathmaster.analysis.cell import PATCH_PX

    n = len(feature_names())
    patch_bytes = PATCH_PX * PATCH_PX * 3
    for f in request.features:
        if len(f.values) != n or not all(math.isfinite(v) for v in f.values):
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                               f"cell {f.cell_id!r}: a feature vector has {n} finite values")
        if f.patch and len(f.patch) != patch_bytes:
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                               f"cell {f.cell_id!r}: a patch is {PATCH_PX} x {PATCH_PX} RGB ({patch_bytes} bytes), "
                               f"not {len(f.patch)} bytes")
        if not _eye_vector_ok(f.embedding):
            raise CaseRejected(grpc.StatusCode.INVALID_ARGUMENT,
                               f"cell {f.cell_id!r}: an eye vector is at most {MAX_EYE_VALUES} finite half floats "
                               "(2 bytes each)")
