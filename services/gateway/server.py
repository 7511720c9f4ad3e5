"""The HTTP gateway: serves the pathologist's page and relays it to the coordinator.

A FastAPI application on uvicorn, assembled here (error handlers, the session dependency,
middleware, the listening sockets) from routers by concept: signing in (routes_session.py),
the page and what it reads (routes_page.py), a case's files (routes_upload.py) and a case
(routes_case.py), over what they
share (facade.py: the coordinator's client, accounts, audit, staged files), the request
readers (requests.py) and the error replies (errors.py). Routes (JSON unless said otherwise; the OpenAPI
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
    POST /api/case              JSON {"request_class", "case_id", "files": [{"name", "id"}],
                                "concept_weights" (optional: refine by concept)}: a
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

What one client can hold is bounded (`limits.py`, `upload.py`, the constants below): the time to
send a request's head and its body, the body's size, JSON size and depth, files per case,
idle keep-alive time and the number of connections; staged files, per user and in all
(`staging.StagingLimits`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import tempfile
import threading
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import ClientDisconnect

from qos.transport import TLSFiles
from services.gateway.accounts import Accounts, Session
from services.gateway.audit import AuditLog
from services.shared import CASE_DEADLINE_S
from services.gateway.errors import HttpError, error_response
from services.gateway.facade import Gateway
from services.gateway.limits import (GATEWAY_BODY_TIMEOUT_S, GATEWAY_HEAD_TIMEOUT_S, MAX_REQUEST_BYTES, BodyLimits,
                                     with_head_timeout)
from services.gateway.routes_case import case_router
from services.gateway.routes_page import STATIC_DIR, PageFiles, page_router
from services.gateway.routes_session import SESSION_COOKIE, session_router
from services.gateway.routes_upload import upload_router
from services.gateway.security import SAFE_METHODS, SameOrigin, SecurityHeaders, https_redirect
from services.gateway.metrics import RequestMetrics
from services.gateway.staging import StagingLimits

GATEWAY_KEEP_ALIVE_S = 5       # an idle keep-alive connection is closed after this (uvicorn's default)
GATEWAY_MAX_CONNECTIONS = 512  # connections at once; past it requests are answered 503
GATEWAY_SHUTDOWN_S = 2         # on stop, cases still streaming get this long, then are cut

log = logging.getLogger(__name__)

CSRF_HEADER = "X-CSRF-Token"
# MAX_REQUEST_BYTES: a 6-cell case with backgrounds and masks is ~2 MB. The page leaves
# oversize files out before it sends, so the limit only stops runaway API clients.


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

    for router in (session_router, page_router, upload_router, case_router):
        app.include_router(router(gateway, signed_in))
    app.mount("/static", PageFiles(directory=STATIC_DIR), name="static")
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
            thread.join(timeout=GATEWAY_SHUTDOWN_S + 10)
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


def _guarded_app(gateway: Gateway, hosts: list[str], body_timeout_s: float):
    """The page's app inside its guards: same origin, body limits, Host check, security
    headers, and request metrics outermost (every request, refused ones too)."""
    app = SameOrigin(create_app(gateway))
    app = BodyLimits(app, max_bytes=MAX_REQUEST_BYTES, timeout_s=body_timeout_s)
    app = TrustedHostMiddleware(app, allowed_hosts=hosts)
    app = SecurityHeaders(app)
    return RequestMetrics(app, gateway.metrics)


def _uvicorn_config(asgi_app, certificate: TLSFiles | None, head_timeout_s: float,
                    max_connections: int) -> uvicorn.Config:
    """uvicorn's settings for the gateway (HTTPS with `certificate` when given)."""
    return uvicorn.Config(asgi_app, http=with_head_timeout(head_timeout_s), lifespan="off",
                          timeout_keep_alive=GATEWAY_KEEP_ALIVE_S,
                          limit_concurrency=max_connections,
                          timeout_graceful_shutdown=GATEWAY_SHUTDOWN_S,
                          h11_max_incomplete_event_size=64 * 1024,
                          ssl_certfile=certificate.cert if certificate else None,
                          ssl_keyfile=certificate.key if certificate else None,
                          proxy_headers=False,  # no proxy in front: X-Forwarded-* is not believed
                          server_header=False, access_log=False, log_config=None)


def start_gateway(coordinator_address: str, host: str = "127.0.0.1", port: int = 0,
                  case_deadline_s: float = CASE_DEADLINE_S, tls: TLSFiles | None = None,
                  https: TLSFiles | None = None, http_redirect_port: int | None = None,
                  allowed_hosts=(), state_dir: str | Path | None = None,
                  head_timeout_s: float = GATEWAY_HEAD_TIMEOUT_S,
                  body_timeout_s: float = GATEWAY_BODY_TIMEOUT_S,
                  max_connections: int = GATEWAY_MAX_CONNECTIONS,
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
    hosts = allowed_host_names(host, allowed_hosts)
    app = _guarded_app(gateway, hosts, body_timeout_s)

    def config_for(asgi_app, certificate: TLSFiles | None) -> uvicorn.Config:
        return _uvicorn_config(asgi_app, certificate, head_timeout_s, max_connections)

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
