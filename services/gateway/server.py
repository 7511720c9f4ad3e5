"""The HTTP gateway: serves the pathologist's page and relays it to the coordinator.

A FastAPI application on uvicorn. Routes (JSON unless said otherwise; the OpenAPI
description is at /api/openapi.json):

    GET  /                      the page (static/index.html; app.js and style.css beside it)
    GET  /api/config            the coordinator's request classes (its Info), file-size limit,
                                coordinator address
    GET  /api/sites             the coordinator's sites and whether each is serving
    GET  /api/stats?class=NAME  recent completion times for one request class
    POST /api/pair              {"names": [...]} -> how those files pair into cells
    POST /api/upload            multipart/form-data: one file (field "file"), as soon as the user
                                picks it -> {"id", "name", "role", "bytes", "width", "height"}
                                once it is checked (decoded) and staged (staging.py), or an
                                error naming the file
    DELETE /api/upload          drop the user's staged files (the page's "Clear")
    POST /api/case              JSON {"request_class", "case_id", "files": [{"name", "id"}]}: a
                                case of staged files (409 with "missing": [names] for ids this
                                user has not staged or that expired: upload those again); or
                                multipart/form-data: request_class, case_id, and the files
                                themselves (field "files"; scripts, batch)
                                -> a stream of newline-delimited JSON events:
                                   "accepted" (cells sent, files rejected), "plan", one "site"
                                   per site as it answers, then "summary" (or "error")
    GET  /api/image?site=S&cell_id=C[&sha=H]   the full database image (image/png); with its
                                content hash H the browser keeps it
    POST /api/refine            JSON {"site", "cell_id", "request_class", "case_id"}: "more like
                                this", that database cell sent as a new case; events as /api/case
    POST /api/login             {"name", "password"} -> sets the session cookie
    GET  /login/once?token=T    a one-time sign-in link -> sets the cookie, back to the page
    GET  /api/session           who is signed in, and the session's CSRF token
    POST /api/logout
    GET  /metrics               Prometheus metrics (metrics.py): loopback callers and admins only

Everything but the page, its static files and signing in needs a session; every POST
carries the session's CSRF token (header X-CSRF-Token) and comes from the page's origin.
Errors are {"error": message} and, where the page shows something else, "words".

What one client can hold is bounded (`limits.py`, `pathmaster/defaults.py`): the time to
send a request's head and its body, the body's size, JSON size and depth, files per case,
idle keep-alive time and the number of connections; staged files, per user and in all
(`staging.StagingLimits`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import tempfile
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import grpc
import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect

from pathmaster import defaults
from pathmaster.defaults import CASE_DEADLINE_S, MAX_FILE_BYTES
from pathmaster.ids import check_id
from pathmaster.records import InvalidInput
from qos.classes import UnknownClass
from qos.transport import TLSFiles, is_loopback
from services.client import AsyncCases, CoordinatorClient, tls_hint, unknown_class_message
from services.coordinator.validation import DEFAULT_CLASS  # what the coordinator takes for no class
from services.gateway import events
from services.gateway.accounts import Accounts, LoginThrottle, Session, may_send
from services.gateway.audit import AuditLog
from services.gateway.limits import BodyLimits, check_json_depth, with_head_timeout
from services.gateway.metrics import UNKNOWN_CLASS, GatewayMetrics, RequestMetrics
from services.gateway.security import SAFE_METHODS, SameOrigin, SecurityHeaders, https_redirect
from services.metrics import case_outcome
from services.gateway.pairing import extension_problem, pair_files
from services.gateway.staging import StagedFiles, StagingFull, StagingLimits, content_id
from services.gateway.upload import check_file, check_upload, file_role

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
                ".webmanifest": "application/manifest+json"}  # the manifest: Chromium offers to install
# MAX_REQUEST_BYTES: a 6-cell case with backgrounds and masks is ~2 MB. The page leaves
# oversize files out before it sends, so the limit only stops runaway API clients.


# The request classes in a pathologist's words; a coordinator's other classes show their
# own description. Bulk is never offered on the page (see ROLE_REFUSED_CLASSES).
CLASS_LABELS = {"urgent": "Intra-operative — fastest", "routine": "Diagnostic", "teaching": "Teaching"}
CLASS_HINTS = {"urgent": "A frozen section during surgery: answered before anything else.",
               "routine": "A case for diagnosis: answered in turn.",
               "teaching": "Teaching and review: answered when the network has room."}
SESSION_COOKIE = "pathmaster_session"
CSRF_HEADER = "X-CSRF-Token"


def class_label(name: str) -> str:
    """The words the page uses for request class `name`."""
    return CLASS_LABELS.get(name, name.replace("-", " ").capitalize())


class HttpError(Exception):
    """An error to answer with `status` and a JSON {"error": message}; `words`: what the
    page shows a person instead, when the message is for scripts and logs."""

    def __init__(self, status: HTTPStatus, message: str, words: str | None = None,
                 extra: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.words = words
        self.extra = extra or {}  # more fields of the JSON reply


def grpc_http_error(exc: grpc.RpcError, what: str, hint: str = "") -> HttpError:
    """Map a failed coordinator call to an HTTP error that says what failed and why
    (`hint`: what to check, appended)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    detail = exc.details() if hasattr(exc, "details") else str(exc)
    status = {grpc.StatusCode.NOT_FOUND: HTTPStatus.NOT_FOUND,
              grpc.StatusCode.INVALID_ARGUMENT: HTTPStatus.BAD_REQUEST,
              grpc.StatusCode.DEADLINE_EXCEEDED: HTTPStatus.GATEWAY_TIMEOUT,
              }.get(code, HTTPStatus.BAD_GATEWAY)
    return HttpError(status, f"{what}: {code.name}: {detail}{hint}", events.coordinator_words(code.name))


class Gateway:
    """What the request handlers share: the coordinator's client."""

    def __init__(self, coordinator_address: str, accounts: Accounts, audit: AuditLog,
                 case_deadline_s: float = CASE_DEADLINE_S, tls: TLSFiles | None = None,
                 https: bool = False, staging: StagingLimits = StagingLimits()):
        self.coordinator_address = coordinator_address
        self.case_deadline_s = case_deadline_s
        self.client = CoordinatorClient(coordinator_address, tls)
        self.cases = AsyncCases(self.client)  # cases stream on the event loop, no thread each
        self.accounts = accounts
        self.audit = audit
        self.throttle = LoginThrottle()
        self.https = https
        self.metrics = GatewayMetrics()
        self.staged = StagedFiles(staging)
        self.staged.start_sweeping()

    def close(self) -> None:
        self.staged.close()
        self.client.close()
        self.audit.close()

    def _failed(self, exc: grpc.RpcError, what: str) -> HttpError:
        return grpc_http_error(exc, what, tls_hint(exc, self.client.tls))

    def config(self, role: str) -> dict:
        """What the page needs to start: the coordinator's request classes, most favoured
        first, each with its label in words and whether `role` may send it (empty, with
        "classes_error" saying why, while the coordinator cannot be asked: the page still
        loads, and a case then reports the same failure)."""
        config = {"coordinator": self.coordinator_address, "max_file_bytes": MAX_FILE_BYTES,
                  "default_class": DEFAULT_CLASS, "classes": []}
        try:
            classes = self.client.classes
        except grpc.RpcError as exc:
            failed = self._failed(exc, f"the request classes of the coordinator at {self.coordinator_address}")
            return config | {"classes_error": failed.message, "classes_words": failed.words}
        config["classes"] = [{"name": c.name, "dscp": c.dscp, "priority": c.priority,
                              "description": c.description, "label": class_label(c.name),
                              "hint": CLASS_HINTS.get(c.name, c.description),
                              "allowed": may_send(role, c.name)} for c in classes]
        allowed = [c.name for c in classes if may_send(role, c.name)]
        if DEFAULT_CLASS not in allowed and allowed:
            config["default_class"] = allowed[0]
        return config

    async def check_class_async(self, name: str) -> str:
        """`check_class`, on the event loop when the coordinator's classes are known (a
        lookup), else in a worker thread (it asks the coordinator)."""
        if self.client.learnt_classes() is None:
            return await run_in_threadpool(self.check_class, name)
        return self.check_class(name)

    def check_class(self, name: str) -> str:
        """`name` if the coordinator has that request class; HttpError 400 naming its
        classes if not. Unchecked while the coordinator cannot be asked (the call that
        follows reports why)."""
        try:
            self.client.request_class(name)
        except UnknownClass as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, unknown_class_message(exc, self.coordinator_address))
        except grpc.RpcError:
            pass
        return name

    def sites(self) -> dict:
        try:
            sites = self.client.sites()
        except grpc.RpcError as exc:
            raise self._failed(exc, f"listing the sites at {self.coordinator_address}")
        return {"sites": [{"site": s.site, "address": s.address, "serving": s.serving,
                           "algorithm": s.info.algorithm,
                           "database_cells": s.info.database_cells,
                           "database_origins": dict(s.info.database_origins)} for s in sites]}

    def stats(self, request_class: str) -> dict:
        try:
            found = self.client.class_stats(request_class)
        except grpc.RpcError as exc:
            raise self._failed(exc, f"completion times of class {request_class!r}")
        found = [s for s in found if s.request_class == request_class]
        if not found:
            return {"request_class": request_class, "cases": 0, "recent_s": []}
        return events.class_stats_json(found[0])

    def image(self, site: str, cell_id: str) -> bytes:
        try:
            return self.client.image(site, cell_id).image
        except grpc.RpcError as exc:
            raise self._failed(exc, f"image {cell_id!r} from site {site!r}")

    def example_files(self, site: str, cell_id: str) -> dict[str, bytes]:
        """A database cell as a case's files ("more like this"): its image and, when the
        site has one, its mask, named like-CELL.png and like-CELL-mask.png."""
        try:
            reply = self.client.image(site, cell_id)
        except grpc.RpcError as exc:
            raise self._failed(exc, f"image {cell_id!r} from site {site!r}")
        stem = f"like-{cell_id[:24]}"
        return {f"{stem}.png": reply.image} | ({f"{stem}-mask.png": reply.mask} if reply.mask else {})

    async def submit(self, request_class: str, files: dict[str, bytes], session: Session,
                     client: str | None, case_id: str = "", headers: dict | None = None):
        """Yield the case's events as dicts: "accepted", then the coordinator's ("plan",
        "site"s, "summary"), or an "error". Closing the generator (the browser went away)
        cancels the coordinator's call, which frees the sites. Audited: who sent how many
        cells of which class, and the case id the coordinator gave it. headers: {file name:
        header} of staged files, checked when staged (not probed again)."""
        # Headers only (~0.5 ms a file on a loaded host; none for staged files, checked
        # when they arrived): the sites decode.
        checked = check_upload(files, headers=headers)
        self.audit.record("case", session.name, session.role, client, request_class=request_class,
                          case_id=case_id, cells=len(checked.cells), files_refused=len(checked.rejected))
        yield {"type": "accepted", "request_class": request_class,
               "cells": [c.cell_id for c in checked.cells],
               "pairing": checked.pairing.as_dict(),
               "rejected": [{"name": n, "problem": p} for n, p in checked.rejected]}
        if not checked.cells:
            yield {"type": "error", "status": "INVALID_ARGUMENT",
                   "message": "no usable cell images in this case: nothing was sent"}
            return
        started, outcome = time.perf_counter(), "cancelled"  # unless it ends otherwise
        label = self.class_label(request_class)  # now: the classes were just learnt (check_class)
        case = self.cases.submit(checked.cells, request_class, deadline_s=self.case_deadline_s,
                                 case_id=case_id)
        try:
            async for event in case:
                reply = events.case_event_json(event)
                if reply["type"] == "summary":
                    outcome = case_outcome(reply["sites_ok"], reply["sites_failed"])
                    self.audit.record("case-done", session.name, session.role, client,
                                      case_id=reply["case_id"], request_class=request_class,
                                      sites_ok=reply["sites_ok"], sites_failed=reply["sites_failed"])
                yield reply
        except grpc.RpcError as exc:
            outcome = "failed"
            yield {"type": "error", "status": exc.code().name,
                   "words": events.coordinator_words(exc.code().name),
                   "message": f"the coordinator at {self.coordinator_address} did not run the "
                              f"case: {self.client.describe(exc)}"}
        finally:
            await case.aclose()  # cancels the coordinator's call if it is still going
            self.metrics.case_seconds.labels(label, outcome).observe(
                time.perf_counter() - started)

    def class_label(self, request_class: str) -> str:
        """The `class` label of a case: its class if the coordinator has it, else "unknown"
        (a label set users cannot grow). From the classes already learnt: never calls the
        coordinator (it runs on the event loop); "unknown" while they are not known."""
        table = self.client.learnt_classes()
        return request_class if table is not None and request_class in table else UNKNOWN_CLASS


class LoginRequest(BaseModel):
    """A user's name and password."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=64)
    password: str = Field(max_length=defaults.MAX_PASSWORD_CHARS)


class PairRequest(BaseModel):
    """The names of a case's files, to be paired into cells."""

    model_config = ConfigDict(extra="forbid")
    names: list[str] = Field(max_length=defaults.MAX_CASE_FILES,
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
    name: str = Field(min_length=1, max_length=defaults.MAX_FILE_NAME_CHARS)
    id: str = Field(pattern=FILE_ID_PATTERN, description="the id POST /api/upload gave the file")


class StagedCase(BaseModel):
    """A case whose files were uploaded when they were chosen (POST /api/upload)."""

    model_config = ConfigDict(extra="forbid")
    request_class: str = Field("", max_length=defaults.MAX_NAME_CHARS)
    case_id: str = Field("", max_length=defaults.MAX_CASE_ID_CHARS,
                         description="the case or accession number (optional)")
    files: list[StagedRef] = Field(min_length=1, max_length=defaults.MAX_CASE_FILES)


def check_file_name(name, what: str) -> str:
    """`name` if it is a plain file name (no folder part); HttpError 400 if not."""
    if not isinstance(name, str) or not name or "/" in name or "\\" in name \
            or len(name) > defaults.MAX_FILE_NAME_CHARS:
        raise HttpError(HTTPStatus.BAD_REQUEST, f"{what}: needs a plain file name")
    return name


def checked_case_id(case_id: str) -> str:
    """A case's id (the accession number) stripped; "" when none; HttpError 400 if invalid."""
    case_id = case_id.strip()
    if case_id:
        try:
            check_id(case_id, "case id", "case number")
        except InvalidInput as exc:
            raise HttpError(HTTPStatus.BAD_REQUEST, str(exc))
    return case_id


def error_response(status: int, message: str, words: str | None = None,
                   extra: dict | None = None) -> JSONResponse:
    body = {"error": message} | ({"words": words} if words else {}) | (extra or {})
    return JSONResponse(body, status_code=status, headers={"Cache-Control": "no-store"})


async def read_json(request: Request, model: type[BaseModel]) -> BaseModel:
    """The request's JSON body as `model`, after checking its size and depth before parsing."""
    body = await request.body()  # BodyLimits has bounded it by MAX_REQUEST_BYTES already
    if len(body) > defaults.MAX_JSON_BYTES:
        raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                        f"JSON request of {len(body)} bytes is over the limit of "
                        f"{defaults.MAX_JSON_BYTES} bytes")
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
        async with request.form(max_files=defaults.MAX_CASE_FILES, max_fields=16,
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
    if int(length) > MAX_FILE_BYTES + defaults.STAGED_UPLOAD_OVERHEAD_BYTES:  # h11 has checked it is a number
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


def create_app(gateway: Gateway) -> FastAPI:
    """The gateway's ASGI application (routes in the module docstring)."""
    app = FastAPI(title="PathMaster gateway", version="1",
                  description="The pathologist's page and its API in front of a coordinator.",
                  openapi_url="/api/openapi.json", docs_url=None, redoc_url=None)

    @app.exception_handler(HttpError)
    async def _http_error(_request, exc: HttpError):
        return error_response(exc.status, exc.message, exc.words, exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _starlette_error(_request, exc: StarletteHTTPException):
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request, exc: RequestValidationError):
        where = ", ".join(".".join(str(p) for p in e["loc"]) + f": {e['msg']}" for e in exc.errors()[:3])
        return error_response(400, f"bad request: {where}")

    @app.exception_handler(ClientDisconnect)
    async def _gone(_request, _exc):
        return Response(status_code=400)  # nobody is listening; BodyLimits may have answered

    async def signed_in(request: Request) -> Session:
        """The request's session (401 without one); a state-changing request must also
        carry the session's CSRF token (403). On the event loop: one indexed read of the
        users file, which never waits for a writer (WAL), and no hop to a worker thread."""
        token = request.cookies.get(SESSION_COOKIE)
        session = gateway.accounts.session(token)
        if session is None:
            raise HttpError(HTTPStatus.UNAUTHORIZED, "Your session has ended; please sign in again."
                            if token else "Please sign in.")
        if request.method not in SAFE_METHODS and not session.csrf_ok(request.headers.get(CSRF_HEADER)):
            raise HttpError(HTTPStatus.FORBIDDEN, "This request did not carry the page's security "
                                                  "token; reload the page and try again.")
        return session

    def client_of(request: Request) -> str | None:
        return request.client.host if request.client else None

    def session_json(session: Session) -> dict:
        return {"user": session.name, "role": session.role, "csrf": session.csrf,
                "expires": session.expires}

    def with_cookie(response: Response, token: str) -> Response:
        response.set_cookie(SESSION_COOKIE, token, max_age=int(gateway.accounts.session_s), path="/",
                            httponly=True, samesite="strict", secure=gateway.https)
        return response

    @app.post("/api/login", summary="Sign in with a name and password (sets the session cookie)",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": LoginRequest.model_json_schema()}}}})
    async def login(request: Request):
        body = await read_json(request, LoginRequest)
        keys = (f"name:{body.name}", f"from:{client_of(request)}")
        if gateway.throttle.blocked(*keys):
            gateway.metrics.login_failures.labels("throttled").inc()
            gateway.audit.record("sign-in-throttled", body.name, None, client_of(request))
            raise HttpError(HTTPStatus.TOO_MANY_REQUESTS, "Too many failed sign-ins; wait a minute "
                                                          "and try again.")
        if not await run_in_threadpool(gateway.accounts.check_password, body.name, body.password):
            gateway.throttle.failed(*keys)
            gateway.metrics.login_failures.labels("password").inc()
            gateway.audit.record("sign-in-refused", body.name, None, client_of(request))
            raise HttpError(HTTPStatus.UNAUTHORIZED, "That name and password do not match.")
        token, session = await run_in_threadpool(gateway.accounts.start_session, body.name)
        gateway.audit.record("sign-in", session.name, session.role, client_of(request), how="password")
        return with_cookie(JSONResponse(session_json(session)), token)

    @app.get("/login/once", include_in_schema=False)
    def login_once(request: Request, token: str = Query("", max_length=128)):
        name = gateway.accounts.redeem_link(token)
        if name is None:
            gateway.metrics.login_failures.labels("link").inc()
            gateway.audit.record("sign-in-refused", None, None, client_of(request), how="link")
            return HTMLResponse("<!doctype html><title>PathMaster</title><p>This sign-in link has "
                                "been used or has expired. Ask for a new one, or "
                                "<a href=\"/\">sign in with your password</a>.</p>", status_code=400)
        token, session = gateway.accounts.start_session(name)
        gateway.audit.record("sign-in", session.name, session.role, client_of(request), how="link")
        return with_cookie(RedirectResponse("/", status_code=303), token)

    @app.get("/api/session", summary="Who is signed in, and the session's CSRF token")
    def session_info(session: Session = Depends(signed_in)):
        return session_json(session)

    @app.post("/api/logout", summary="Sign out")
    def logout(request: Request, session: Session = Depends(signed_in)):
        gateway.accounts.end_session(request.cookies.get(SESSION_COOKIE))
        gateway.staged.discard(session.name)  # the page's files go with the user
        gateway.audit.record("sign-out", session.name, session.role, client_of(request))
        response = JSONResponse({"signed_out": True})
        response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict",
                               secure=gateway.https)
        return response

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request):
        """Prometheus metrics: for callers on this host (a scraper beside the gateway) and
        signed-in admins; 403 for anyone else."""
        if not is_loopback(client_of(request) or ""):
            session = gateway.accounts.session(request.cookies.get(SESSION_COOKIE))
            if session is None or session.role != "admin":
                raise HttpError(HTTPStatus.FORBIDDEN, "The gateway's metrics are for its host and for "
                                                      "administrators; sign in as an admin to see them.")
        return Response(generate_latest(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST,
                        headers={"Cache-Control": "no-store"})

    @app.get("/", include_in_schema=False)
    def page():
        return Response((STATIC_DIR / "index.html").read_bytes(), media_type=STATIC_TYPES[".html"],
                        headers={"Cache-Control": "no-store"})

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        file = STATIC_DIR / name
        if "/" in name or file.suffix not in STATIC_TYPES or not file.is_file():
            raise HttpError(HTTPStatus.NOT_FOUND, f"no such file: /static/{name}")
        return Response(file.read_bytes(), media_type=STATIC_TYPES[file.suffix],
                        headers={"Cache-Control": "no-cache"})

    @app.get("/api/config", summary="The coordinator's request classes and the upload limits")
    def config(session: Session = Depends(signed_in)):
        return gateway.config(session.role)

    @app.get("/api/sites", summary="The coordinator's sites and whether each is serving")
    def sites(_session: Session = Depends(signed_in)):
        return gateway.sites()

    @app.get("/api/stats", summary="Recent completion times of one request class")
    def stats(request_class: str = Query("", alias="class", max_length=defaults.MAX_NAME_CHARS),
              _session: Session = Depends(signed_in)):
        return gateway.stats(gateway.check_class(request_class))

    @app.get("/api/image", summary="A database cell's full image (PNG)",
             response_class=Response, responses={200: {"content": {"image/png": {}}}})
    def image(request: Request, site: str = Query("", max_length=defaults.MAX_NAME_CHARS),
              cell_id: str = Query("", max_length=defaults.MAX_CELL_ID_CHARS),
              sha: str = Query("", pattern=r"^([0-9a-f]{64})?$"),
              session: Session = Depends(signed_in)):
        if not site or not cell_id:
            raise HttpError(HTTPStatus.BAD_REQUEST, "give both ?site= and ?cell_id=")
        gateway.audit.record("image", session.name, session.role, client_of(request),
                             site=site, cell_id=cell_id)
        # Named by its content hash, an image never changes: the browser keeps it.
        cache = "private, max-age=86400, immutable" if sha else "no-store"
        return Response(gateway.image(site, cell_id), media_type="image/png", headers={"Cache-Control": cache})

    @app.post("/api/pair", summary="How files pair into cells, by name",
              openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                  "schema": PairRequest.model_json_schema()}}}})
    async def pair(request: Request, _session: Session = Depends(signed_in)):
        names = (await read_json(request, PairRequest)).names
        return pair_files(names).as_dict()

    def may_stage(session: Session) -> None:
        """403 unless `session`'s role may send cases at all (the class is checked when the
        case is sent)."""
        if not any(may_send(session.role, name) for name in
                   (*(gateway.client.learnt_classes() or ()), DEFAULT_CLASS)):
            raise HttpError(HTTPStatus.FORBIDDEN, f"As a {session.role} you cannot send cases.")

    @app.post("/api/upload", summary="Stage one file of a case as soon as it is chosen",
              openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {
                  "schema": {"type": "object", "required": ["file"], "properties": {
                      "file": {"type": "string", "format": "binary"}}}}}}})
    async def upload(request: Request, session: Session = Depends(signed_in)):
        """Check one file (decoded as what its name says: image, background or mask) and
        hold it for this user; its id goes in the case (POST /api/case as JSON). The same
        bytes staged again are not checked again. Refused, naming the file: a file that is
        not a usable image (400), over a file's or this user's limits (413), or while the
        gateway holds all it may (503)."""
        may_stage(session)
        name, data = await read_one_file(request)
        client = client_of(request)
        role = file_role(name)
        file_id = content_id(data)
        try:
            problem = extension_problem(name)  # by name: whether or not the bytes are held
            if problem:
                raise InvalidInput(problem, name)
            staged = gateway.staged.known(session.name, file_id, role)
            if staged is None:
                gateway.staged.check_room(session.name, len(data))
                role, header = await run_in_threadpool(check_file, name, data)
                file_id = gateway.staged.put(session.name, data, header, role)
            else:
                header = staged.header
        except InvalidInput as exc:
            gateway.audit.record("upload-refused", session.name, session.role, client, bytes=len(data))
            raise HttpError(HTTPStatus.BAD_REQUEST, f"{name}: {exc.problem}",
                            extra={"file": name, "problem": exc.problem})
        except StagingFull as exc:
            gateway.audit.record("upload-refused", session.name, session.role, client, bytes=len(data))
            raise HttpError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE if exc.per_user
                            else HTTPStatus.SERVICE_UNAVAILABLE, f"{name}: {exc}",
                            extra={"file": name, "problem": str(exc)})
        gateway.audit.record("upload", session.name, session.role, client, bytes=len(data))
        return {"id": file_id, "name": name, "role": role, "bytes": len(data),
                "width": header.width, "height": header.height}

    @app.delete("/api/upload", summary="Drop this user's staged files")
    def drop_uploads(session: Session = Depends(signed_in)):
        return {"dropped": gateway.staged.discard(session.name)}

    async def read_staged_case(request: Request, session: Session):
        """(request class, case id, {name: bytes}, {name: header}) of a case of staged files."""
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
        return body.request_class, checked_case_id(body.case_id), files, headers

    @app.post("/api/case", summary="Run a case: its files in, each site's matches streamed out",
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
        headers = None
        body_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if body_type == "application/json":
            request_class, case_id, files, headers = await read_staged_case(request, session)
        else:
            request_class, case_id, files = await read_case_form(request)
        request_class = await gateway.check_class_async(request_class)
        if not may_send(session.role, request_class):
            gateway.audit.record("case-refused", session.name, session.role, client_of(request),
                                 request_class=request_class)
            raise HttpError(HTTPStatus.FORBIDDEN, f"As a {session.role} you cannot send "
                                                  f"{class_label(request_class)} cases; choose another "
                                                  "kind of case.")
        return case_stream(gateway.submit(request_class, files, session, client_of(request), case_id, headers))

    def case_stream(stream) -> StreamingResponse:
        lines = (json.dumps(event) + "\n" async for event in stream)
        return StreamingResponse(lines, media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store"},
                                 background=None)

    @app.post("/api/refine", summary="More like this: a database cell sent as a new case",
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

    return app


@dataclass
class GatewayHandle:
    """A running gateway: open `url` in a browser; `stop()` shuts it down."""

    url: str
    server: uvicorn.Server
    thread: threading.Thread
    gateway: Gateway
    state_dir: Path
    temporary: tempfile.TemporaryDirectory | None = None
    redirect: tuple[uvicorn.Server, threading.Thread] | None = None  # plain HTTP -> HTTPS
    http_url: str | None = None  # where the redirect listens, when it does

    @property
    def accounts(self) -> Accounts:
        return self.gateway.accounts

    @property
    def audit_path(self) -> Path:
        return self.gateway.audit.path

    def login_link(self, name: str) -> str:
        """A one-time sign-in link for user `name` (see `Accounts.login_link_token`)."""
        return f"{self.url}login/once?token={self.accounts.login_link_token(name)}"

    def stop(self) -> None:
        servers = [(self.server, self.thread), *([self.redirect] if self.redirect else [])]
        for server, _ in servers:
            server.should_exit = True
        for _, thread in servers:
            thread.join(timeout=defaults.GATEWAY_SHUTDOWN_S + 10)
        self.gateway.close()
        if self.temporary is not None:
            self.temporary.cleanup()


USERS_FILE = "users.sqlite"
AUDIT_FILE = "audit.log"
LOOPBACK_NAMES = ("127.0.0.1", "localhost")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def allowed_host_names(host: str, extra=()) -> list[str]:
    """The Host header values the gateway answers: the address it listens on (unless a
    wildcard), this host's loopback names, and `extra` (the names users reach it by)."""
    names = [] if host in WILDCARD_HOSTS else [host]
    return list(dict.fromkeys([*names, *LOOPBACK_NAMES, *extra]))


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket listening on host:port (port 0: a free one), so connections queue from
    now on until uvicorn's loop accepts them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def serve_in_thread(config: uvicorn.Config, sock: socket.socket, name: str, after=None):
    """(server, thread): uvicorn serving `config` on `sock` from a daemon thread; then
    `after()` (a coroutine function, e.g. closing the loop's gRPC channels), on its loop."""
    server = uvicorn.Server(config)

    async def serve():
        try:
            await server.serve(sockets=[sock])
        finally:
            if after is not None:
                await after()

    thread = threading.Thread(target=lambda: asyncio.run(serve()), name=name, daemon=True)
    thread.start()
    return server, thread


def shown_url(scheme: str, sock: socket.socket) -> str:
    """The URL a browser on this host uses for listening socket `sock`."""
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if sock.family == socket.AF_INET6 else bound_host
    if bound_host in WILDCARD_HOSTS:
        shown = "127.0.0.1"
    return f"{scheme}://{shown}:{bound_port}/"


def start_gateway(coordinator_address: str, host: str = "127.0.0.1", port: int = 0,
                  case_deadline_s: float = CASE_DEADLINE_S, tls: TLSFiles | None = None,
                  https: TLSFiles | None = None, http_redirect_port: int | None = None,
                  allowed_hosts=(), state_dir: str | Path | None = None,
                  head_timeout_s: float = defaults.GATEWAY_HEAD_TIMEOUT_S,
                  body_timeout_s: float = defaults.GATEWAY_BODY_TIMEOUT_S,
                  max_connections: int = defaults.GATEWAY_MAX_CONNECTIONS,
                  staging: StagingLimits = StagingLimits()) -> GatewayHandle:
    """Serve the page for the coordinator at `coordinator_address` ("host:port"), calling
    it over TLS when `tls` is given.

    https: serve the page over HTTPS with this certificate and key (`cert`, `key`; e.g.
    from deploy/make-certs.sh), with HSTS. http_redirect_port: with `https`, also listen
    for plain HTTP on this port (0: a free one) and redirect every request there to the
    HTTPS page (308; the handle's `http_url`). allowed_hosts: names (besides the listening
    address and this host's loopback names) that browsers may use in the Host header;
    any other Host is refused (DNS rebinding). state_dir: where the users and sessions
    (users.sqlite) and the audit log (audit.log), both 0600, are kept; None: a private
    temporary folder, removed on stop (add users through the handle's `accounts`).
    staging: what the files users stage (upload as they choose them) may hold.

    Listens on host:port (port 0 picks a free one) before returning, so the URL can be
    used at once; uvicorn serves it from a background thread. Returns a `GatewayHandle`
    (`.url`, `.stop()`).
    """
    if https is not None and (https.cert is None or https.key is None):
        raise ValueError("HTTPS needs both a certificate and its key")
    if http_redirect_port is not None and https is None:
        raise ValueError("a redirect to HTTPS needs HTTPS: give its certificate and key")
    temporary = None
    if state_dir is None:
        temporary = tempfile.TemporaryDirectory(prefix="pathmaster-gateway-")
        state_dir = temporary.name
    state_dir = Path(state_dir)
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    gateway = Gateway(coordinator_address, Accounts(state_dir / USERS_FILE), AuditLog(state_dir / AUDIT_FILE),
                      case_deadline_s, tls, https=https is not None, staging=staging)
    app = SameOrigin(create_app(gateway))
    app = BodyLimits(app, max_bytes=defaults.MAX_REQUEST_BYTES, timeout_s=body_timeout_s)
    hosts = allowed_host_names(host, allowed_hosts)
    app = TrustedHostMiddleware(app, allowed_hosts=hosts)
    app = SecurityHeaders(app)
    app = RequestMetrics(app, gateway.metrics)  # outermost: every request, refused ones too

    def config_for(asgi_app, certificate: TLSFiles | None) -> uvicorn.Config:
        return uvicorn.Config(asgi_app, http=with_head_timeout(head_timeout_s), lifespan="off",
                              timeout_keep_alive=defaults.GATEWAY_KEEP_ALIVE_S,
                              limit_concurrency=max_connections,
                              timeout_graceful_shutdown=defaults.GATEWAY_SHUTDOWN_S,
                              h11_max_incomplete_event_size=64 * 1024,
                              ssl_certfile=certificate.cert if certificate else None,
                              ssl_keyfile=certificate.key if certificate else None,
                              proxy_headers=False,  # no proxy in front: X-Forwarded-* is not believed
                              server_header=False, access_log=False, log_config=None)

    sockets = []
    try:
        sockets.append(sock := listening_socket(host, port))
        config = config_for(app, https)
        config.load()  # reads the certificate now: a bad file is an error here, not in the thread
        redirect_config = None
        if http_redirect_port is not None:
            sockets.append(plain := listening_socket(host, http_redirect_port))
            redirect_app = TrustedHostMiddleware(https_redirect(sock.getsockname()[1]), allowed_hosts=hosts)
            redirect_config = config_for(redirect_app, None)
            redirect_config.load()
    except BaseException:
        for opened in sockets:
            opened.close()
        gateway.close()
        if temporary is not None:
            temporary.cleanup()
        raise
    server, thread = serve_in_thread(config, sock, "pathmaster-gateway", after=gateway.cases.close)
    redirect = http_url = None
    if redirect_config is not None:
        redirect = serve_in_thread(redirect_config, plain, "pathmaster-gateway-redirect")
        http_url = shown_url("http", plain)
    return GatewayHandle(url=shown_url("https" if https else "http", sock), server=server,
                         thread=thread, gateway=gateway, state_dir=state_dir, temporary=temporary,
                         redirect=redirect, http_url=http_url)
