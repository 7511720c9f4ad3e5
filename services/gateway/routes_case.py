"""A case: sent from its staged files (or refined by concept or by example), and its
events streamed back as the sites answer."""

from __future__ import annotations

import json
from http import HTTPStatus

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from services.shared import DEFAULT_CLASS  # what the coordinator takes for no class
from services.gateway.accounts import Session, may_send
from services.gateway.errors import HttpError
from services.gateway.facade import Gateway, class_label
from services.gateway.requests import (ExampleCase, StagedCase, check_file_name, checked_case_id, client_of,
                                       read_case_form, read_json)


def case_stream(stream) -> StreamingResponse:
    """A case's events (an async generator of dicts) as newline-delimited JSON."""
    lines = (json.dumps(event) + "\n" async for event in stream)
    return StreamingResponse(lines, media_type="application/x-ndjson", headers={"Cache-Control": "no-store"},
                             background=None)


def case_router(gateway: Gateway, signed_in) -> APIRouter:
    """The routes of a case (`signed_in`: the session dependency)."""
    router = APIRouter()

    async def read_staged_case(request: Request, session: Session):
        """(request class, case id, {name: bytes}, {name: header}, concept weights) of a case
        of staged files."""
        body = await read_json(request, StagedCase)
        names = [check_file_name(ref.name, f"file {ref.name!r}") for ref in body.files]
        if len(set(names)) != len(names):
            raise HttpError(HTTPStatus.BAD_REQUEST, "a file name is listed twice")
        found, missing = gateway.staged.take(session.name, [(ref.name, ref.id) for ref in body.files])
        if missing:
            raise HttpError(HTTPStatus.CONFLICT, f"{len(missing)} of the case's files are not held by "
                            "the gateway (never uploaded, expired, or another user's): upload them again",
                            words="Some of the case's files have to be added again.",
                            extra={"missing": missing})
        files = {name: staged.data for name, staged in found.items()}
        headers = {name: staged.header for name, staged in found.items()}
        return body.request_class, checked_case_id(body.case_id), files, headers, body.concept_weights

    @router.post("/api/case", summary="Run a case: its files in, each site's matches streamed out",
              response_class=StreamingResponse,
              responses={200: {"content": {"application/x-ndjson": {}},
                               "description": "one JSON event per line"},
                         409: {"description": "files not staged (or expired): 'missing' names them"}},
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": StagedCase.model_json_schema()},
                  "multipart/form-data": {
                      "schema": {"type": "object", "required": ["files"], "properties": {
                          "request_class": {"type": "string"}, "case_id": {"type": "string"},
                          "files": {"type": "array", "items": {"type": "string", "format": "binary"}}}}}}}})
    async def case(request: Request, session: Session = Depends(signed_in)):
        headers, weights = None, {}
        body_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if body_type == "application/json":
            request_class, case_id, files, headers, weights = await read_staged_case(request, session)
        else:
            request_class, case_id, files = await read_case_form(request)
        request_class = await gateway.check_class_async(request_class)
        if not may_send(session.role, request_class):
            gateway.audit.record("case-refused", session.name, session.role, client_of(request),
                                 request_class=request_class)
            raise HttpError(HTTPStatus.FORBIDDEN, f"As a {session.role} you cannot send "
                                                  f"{class_label(request_class)} cases; choose another "
                                                  "kind of case.")
        return case_stream(gateway.submit(request_class, files, session, client_of(request), case_id, headers,
                                          weights))

    @router.post("/api/refine", summary="More like this: a database cell sent as a new case",
              response_class=StreamingResponse,
              responses={200: {"content": {"application/x-ndjson": {}}, "description": "as /api/case"}},
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": ExampleCase.model_json_schema()}}}})
    async def refine(request: Request, session: Session = Depends(signed_in)):
        body = await read_json(request, ExampleCase)
        request_class = await gateway.check_class_async(body.request_class or DEFAULT_CLASS)
        if not may_send(session.role, request_class):
            raise HttpError(HTTPStatus.FORBIDDEN, f"As a {session.role} you cannot send "
                                                  f"{class_label(request_class)} cases; choose another kind of case.")
        files = await run_in_threadpool(gateway.example_files, body.site, body.cell_id)
        return case_stream(gateway.submit(request_class, files, session, client_of(request),
                                          checked_case_id(body.case_id)))

    return router
