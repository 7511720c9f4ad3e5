"""What the gateway reads from requests: the JSON bodies as pydantic models (bounded in
size and depth before parsing), a case as multipart form data, one staged file, and the
case or accession number."""

from __future__ import annotations

import re
from http import HTTPStatus

from fastapi import Request
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from pathmaster import defaults
from pathmaster.ids import check_id
from pathmaster.records import InvalidInput
from services.gateway.accounts import MAX_PASSWORD_CHARS
from services.gateway.errors import HttpError
from services.gateway.limits import check_json_depth
from services.gateway.upload import MAX_CASE_FILES, MAX_FILE_BYTES
from services.shared import CONCEPTS, MAX_WEIGHT, check_weights

MAX_JSON_BYTES = 256 * 1024        # one JSON request body at the gateway (e.g. a case's file names)
STAGED_UPLOAD_OVERHEAD_BYTES = 16 * 1024  # a one-file upload's multipart boundaries and headers
MAX_FILE_NAME_CHARS = 255      # a file's name in a case (as file systems allow)


class LoginRequest(BaseModel):
    """A user's name and password."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=64)
    password: str = Field(max_length=MAX_PASSWORD_CHARS)


class PairRequest(BaseModel):
    """The names of a case's files, to be paired into cells."""

    model_config = ConfigDict(extra="forbid")
    names: list[str] = Field(max_length=MAX_CASE_FILES,
                             description="file names as the user chose them, e.g. cell1.png, "
                                         "cell1-background.png, cell1-mask.png")


FILE_ID_PATTERN = r"^[0-9a-f]{64}$"  # a staged file's id: the SHA-256 of its bytes


class ExampleCase(BaseModel):
    """A database cell sent as a new case's test cell ("more like this")."""

    model_config = ConfigDict(extra="forbid")
    site: str = Field(min_length=1, max_length=defaults.MAX_NAME_CHARS)
    cell_id: str = Field(min_length=1, max_length=defaults.MAX_CELL_ID_CHARS)
    request_class: str = Field("", max_length=defaults.MAX_NAME_CHARS)
    case_id: str = Field("", max_length=defaults.MAX_CELL_ID_CHARS)


class StagedRef(BaseModel):
    """One file of a case: its name (pairs it into cells) and its staged id."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=MAX_FILE_NAME_CHARS)
    id: str = Field(pattern=FILE_ID_PATTERN, description="the id POST /api/upload gave the file")


class StagedCase(BaseModel):
    """A case whose files were uploaded when they were chosen (POST /api/upload)."""

    model_config = ConfigDict(extra="forbid")
    request_class: str = Field("", max_length=defaults.MAX_NAME_CHARS)
    case_id: str = Field("", max_length=defaults.MAX_CASE_ID_CHARS,
                         description="the case or accession number (optional)")
    files: list[StagedRef] = Field(min_length=1, max_length=MAX_CASE_FILES)
    concept_weights: dict[str, float] = Field(
        default_factory=dict, max_length=len(CONCEPTS),
        description=f"refine by concept: {', '.join(CONCEPTS)} -> weight 0-{MAX_WEIGHT:g} (1: as usual)")

    @field_validator("concept_weights")
    @classmethod
    def _known_concepts(cls, weights: dict[str, float]) -> dict[str, float]:
        return check_weights(weights)


ACCESSION_SEPARATORS = re.compile(r"[/\s]+")  # in accession numbers as labs write them


def client_of(request: Request) -> str | None:
    """The caller's address (what the audit log records)."""
    return request.client.host if request.client else None


def check_file_name(name, what: str) -> str:
    """`name` if it is a plain file name (no folder part); HttpError 400 if not."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name \
            or len(name) > MAX_FILE_NAME_CHARS:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"{what}: needs a plain file name")
    return name


def checked_case_id(case_id: str) -> str:
    """A case's id (the accession number) stripped, with '/' and spaces as '-' (S26/01234,
    "S26 01234" -> S26-01234: the page shows the same mapping); "" when none; HttpError 400
    if still invalid."""
    case_id = ACCESSION_SEPARATORS.sub("-", case_id.strip())
    if case_id:
        try:
            check_id(case_id, "case id", "case number")
        except InvalidInput as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, str(exc))
    return case_id


async def read_json(request: Request, model: type[BaseModel]) -> BaseModel:
    """The request's JSON body as `model`, after checking its size and depth before parsing."""
    body = await request.body()  # BodyLimits has bounded it by MAX_REQUEST_BYTES already
    if len(body) > MAX_JSON_BYTES:
        raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"JSON request of {len(body)} bytes is over the limit of "
                        f"{MAX_JSON_BYTES} bytes")
    try:
        check_json_depth(body)
        return model.model_validate_json(body)
    except ValueError as exc:  # ValidationError is a ValueError
        detail = "; ".join(e["msg"] for e in exc.errors()[:3]) if isinstance(exc, ValidationError) else str(exc)
        raise HttpError(HTTPStatus.BAD_REQUEST, f"the request body is not what this call takes: {detail}")


async def read_case_form(request: Request) -> tuple[str, str, dict[str, bytes]]:
    """(request class, case id, {file name: bytes}) of a multipart case: fields
    request_class, case_id (optional: the case or accession number) and files. A file over the size limit
    is kept as its first MAX_FILE_BYTES + 1 bytes: enough for `check_upload` to refuse it
    by name, never the whole file in memory."""
    try:
        async with request.form(max_files=MAX_CASE_FILES, max_fields=16,
                                max_part_size=64 * 1024) as form:
            request_class, case_id = form.get("request_class", ""), form.get("case_id", "")
            if not isinstance(request_class, str) or not isinstance(case_id, str):
                raise HttpError(HTTPStatus.BAD_REQUEST, "request_class and case_id are text fields")
            case_id = checked_case_id(case_id)
            files: dict[str, bytes] = {}
            for n, item in enumerate(form.getlist("files")):
                name = check_file_name(getattr(item, "filename", None), f"file #{n + 1}")
                if name in files:
                    raise HttpError(HTTPStatus.BAD_REQUEST, f"{name}: sent twice")
                files[name] = await item.read(MAX_FILE_BYTES + 1)
    except StarletteHTTPException as exc:  # the multipart parser's own limits
        raise HttpError(HTTPStatus(exc.status_code), f"the upload was refused: {exc.detail}")
    if not files:
        raise HttpError(HTTPStatus.BAD_REQUEST, 'send the case as multipart/form-data with its '
                                                'images in "files"')
    return request_class, case_id, files


async def read_one_file(request: Request) -> tuple[str, bytes]:
    """(name, bytes) of a one-file multipart upload (field "file"). Its Content-Length must
    say its size (as browsers send it), no more than one file's limit: a larger upload is
    refused before its body is read."""
    length = request.headers.get("content-length")
    if length is None:
        raise HttpError(HTTPStatus.LENGTH_REQUIRED, "send the file with its Content-Length")
    if int(length) > MAX_FILE_BYTES + STAGED_UPLOAD_OVERHEAD_BYTES:  # h11 has checked it is a number
        raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"the file is {int(length) / 1e6:.1f} MB, over the limit of "
                        f"{MAX_FILE_BYTES / 1e6:.1f} MB per file")
    try:
        async with request.form(max_files=1, max_fields=1, max_part_size=1024) as form:
            item = form.get("file")
            if item is None or isinstance(item, str):
                raise HttpError(HTTPStatus.BAD_REQUEST, 'send one file as multipart/form-data, field "file"')
            name = check_file_name(getattr(item, "filename", None), "the file")
            return name, await item.read(MAX_FILE_BYTES + 1)
    except StarletteHTTPException as exc:  # the multipart parser's own limits
        raise HttpError(HTTPStatus(exc.status_code), f"the upload was refused: {exc.detail}")
